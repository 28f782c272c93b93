//! The environment a Python stub starts with: a short list of kiln's variables, not all of them.
//!
//! Triton's stubs inherit the server's whole environment (it `fork`s and `exec`s bash). That
//! hands model code every secret the server was given: the bearer token
//! (`KILN_INFERENCE_BEARER_TOKEN`), the object stores' credentials (`AWS_*`, `GOOGLE_*`,
//! `AZURE_*`), tokens for model hubs, proxy settings with passwords in them. A model repository
//! should not be able to read those. So a stub gets only what running Python and its native
//! libraries needs, which holds no secret:
//!
//! - `PATH`, `HOME`, `USER`, `LOGNAME`, `TMPDIR`, `TZ`, `LANG`, `LANGUAGE`, `LC_*`: finding
//!   programs, a home and a scratch directory, the locale and the time zone;
//! - `PYTHON*`: Python's own settings (`PYTHONPATH`, `PYTHONHOME`, `PYTHONUNBUFFERED`, ...);
//! - `LD_LIBRARY_PATH`: where a model's native libraries are (CUDA images set it);
//! - `CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`: which GPUs the server may use and how they
//!   are numbered, so that a `KIND_GPU` instance's device number means the GPU it means to kiln;
//! - `OMP_NUM_THREADS`, `MKL_NUM_THREADS`, `OPENBLAS_NUM_THREADS`: the thread counts numerical
//!   libraries read, which operators set for a whole container so that models do not
//!   oversubscribe its cores.
//!
//! A model's execution environment (`EXECUTION_ENV_PATH`) adds its own variables when its
//! `bin/activate` runs, after this. Anything else a model needs is named with
//! `--python-env-passthrough NAME` (repeatable; `NAME*` passes every variable that starts with
//! `NAME`): e.g. `HF_TOKEN` for a model that downloads from the Hugging Face hub.
//!
//! The stub's user and privileges come with its environment ([`StubPrivileges`]).

use super::privileges::StubPrivileges;
use std::process::Command;
use std::sync::Arc;

/// What every stub gets, when kiln has it: exact names, or prefixes ending in `*`.
const ALWAYS: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "TZ",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "PYTHON*",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
];

/// Which of kiln's environment variables a stub sees: [`ALWAYS`] and the operator's
/// `--python-env-passthrough` names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StubEnvironment {
    /// `--python-env-passthrough`: names, or prefixes ending in `*`.
    passthrough: Arc<[String]>,
    /// `--python-stub-user`, `--python-stub-drop-privileges`.
    privileges: StubPrivileges,
    /// `--python-env-root`: where an `EXECUTION_ENV_PATH` may name the environment a stub
    /// starts in, besides the model's repository (see [`super::environment`]).
    env_roots: Arc<[std::path::PathBuf]>,
}

impl StubEnvironment {
    /// The stub environment with these names passed through too.
    ///
    /// # Errors
    /// A name that no variable can have: empty, holding `=` or NUL, or a `*` anywhere but last.
    pub fn new(passthrough: Vec<String>) -> Result<StubEnvironment, String> {
        for name in &passthrough {
            let stem = name.strip_suffix('*').unwrap_or(name);
            if stem.is_empty() || stem.contains(['=', '\0', '*']) {
                return Err(format!(
                    "--python-env-passthrough '{name}' is not a variable name (or a prefix \
                     ending in '*')"
                ));
            }
        }
        Ok(StubEnvironment {
            passthrough: passthrough.into(),
            privileges: StubPrivileges::default(),
            env_roots: Arc::new([]),
        })
    }

    /// The same environment, the stub started with `privileges`.
    pub fn with_privileges(self, privileges: StubPrivileges) -> StubEnvironment {
        StubEnvironment { privileges, ..self }
    }

    /// This environment, with `roots` (absolute, normal) where environments may be besides the
    /// model's repository (`--python-env-root`).
    pub fn with_env_roots(self, roots: Vec<std::path::PathBuf>) -> StubEnvironment {
        StubEnvironment {
            env_roots: roots.into(),
            ..self
        }
    }

    /// The user and privileges stubs start with.
    pub fn privileges(&self) -> &StubPrivileges {
        &self.privileges
    }

    /// The `--python-env-root` directories.
    pub fn env_roots(&self) -> &[std::path::PathBuf] {
        &self.env_roots
    }

    /// Whether a stub sees kiln's variable `name`.
    fn keeps(&self, name: &str) -> bool {
        ALWAYS
            .iter()
            .copied()
            .chain(self.passthrough.iter().map(String::as_str))
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == pattern,
            })
    }

    /// Gives `command` this environment in place of kiln's whole one, and its privileges.
    pub fn apply(&self, command: &mut Command) {
        self.privileges.apply(command);
        command.env_clear();
        for (name, value) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| self.keeps(name)) {
                command.env(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_behind_and_named_variables_pass() {
        let env = StubEnvironment::new(vec!["HF_TOKEN".into(), "MY_APP_*".into()]).unwrap();
        for kept in [
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "PYTHONPATH",
            "LD_LIBRARY_PATH",
            "CUDA_VISIBLE_DEVICES",
            "HF_TOKEN",
            "MY_APP_SETTING",
        ] {
            assert!(env.keeps(kept), "{kept}");
        }
        for dropped in [
            "KILN_INFERENCE_BEARER_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AZURE_STORAGE_KEY",
            "HTTPS_PROXY",
            "HF_TOKEN_2",
            "PATHS",
            "LD_PRELOAD",
        ] {
            assert!(!env.keeps(dropped), "{dropped}");
        }
        assert!(!StubEnvironment::default().keeps("HF_TOKEN"));
    }

    #[test]
    fn passthrough_names_must_be_names() {
        for bad in ["", "*", "A=B", "A*B", "**", "A\0"] {
            assert!(StubEnvironment::new(vec![bad.into()]).is_err(), "{bad:?}");
        }
    }
}
