//! The Python a model runs under, as Triton's Python backend finds it: the config's
//! `EXECUTION_ENV_PATH` parameter (`$$TRITON_MODEL_DIRECTORY` is the model's directory), else
//! `$KILN_PYTHON`, else `python3` on the `PATH`.
//!
//! `EXECUTION_ENV_PATH` names an environment: a directory, used where it is, or a packed one (a
//! tar archive, gzipped or not, as `conda-pack` and `venv-pack` make them), which kiln unpacks
//! into a private directory of its own (mode 0700, a random name) under the system's temporary
//! directory — once per archive, and again when the archive changes (its modification time or
//! size), into a new directory so that stubs still running from the old one keep their files;
//! kiln removes them when it exits. An environment that has a `bin/activate` script is
//! activated before its `bin/python3` starts, as Triton starts its stubs (`source bin/activate`,
//! the environment's `lib` first on `LD_LIBRARY_PATH`, under bash); one without runs its
//! `bin/python3` directly.
//!
//! An `EXECUTION_ENV_PATH` is code the model's stubs run, so it must be the operator's: inside
//! the model's repository (the model directory's parent) or a `--python-env-root` directory.
//! The path, `$$TRITON_MODEL_DIRECTORY` replaced, is checked as written (made absolute, `.` and
//! `..` folded: [`crate::core::path`]) and then used as checked, so `..` cannot climb out of a
//! linked model directory either; the links inside are the operator's and are followed.

use super::stub_env::StubEnvironment;
use crate::core::path::absolute_lexical;
use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{LazyLock, Mutex};
use std::time::SystemTime;

/// The model config parameter naming a model's environment.
pub const EXECUTION_ENV_PATH: &str = "EXECUTION_ENV_PATH";
/// The variable naming the interpreter of models without an environment.
pub const PYTHON_VARIABLE: &str = "KILN_PYTHON";

/// `named` (an `EXECUTION_ENV_PATH`, its model directory put in) made absolute and normal, when
/// that is inside the repository of `model_dir` or one of `roots`.
///
/// # Errors
/// Where it is, and where it may be.
fn allowed(named: &str, model_dir: &Path, roots: &[PathBuf]) -> Result<PathBuf, String> {
    let path = absolute_lexical(Path::new(named));
    let model_dir = absolute_lexical(model_dir);
    let repository = model_dir.parent().unwrap_or(&model_dir);
    if path.starts_with(repository) || roots.iter().any(|root| path.starts_with(root)) {
        return Ok(path);
    }
    Err(format!(
        "{EXECUTION_ENV_PATH} '{named}' ({}) is outside the model repository {}: kiln runs \
         Python environments from the model's repository and the --python-env-root \
         directories only (--python-env-root=/ allows any, as Triton)",
        path.display(),
        repository.display()
    ))
}

/// What activates an environment: sources the script named first (its output goes to standard
/// error: standard output is the stub's channel), puts the directory named second first on
/// `LD_LIBRARY_PATH`, then becomes the command that follows.
const ACTIVATE: &str = r#"activate=$1 lib=$2
shift 2
command=("$@")
set --
source "$activate" </dev/null >&2 || { echo "kiln: sourcing '$activate' failed" >&2; exit 1; }
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "${command[@]}""#;

/// A model's Python.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    python: PathBuf,
    /// The environment's activation script and its library directory.
    activate: Option<(PathBuf, PathBuf)>,
    /// Which of kiln's environment variables the stub sees.
    variables: StubEnvironment,
}

impl Interpreter {
    /// The interpreter `parameter` (an `EXECUTION_ENV_PATH`, if any) names for the model in
    /// `model_dir`, its environment unpacked when it is packed, its stubs seeing `variables`.
    /// Blocking.
    ///
    /// # Errors
    /// An environment that does not exist, outside the repository and `variables`'
    /// `--python-env-root`s, that cannot be unpacked or has no `bin/python3`.
    pub fn find(
        parameter: Option<&str>,
        model_dir: &Path,
        variables: &StubEnvironment,
    ) -> Result<Interpreter, String> {
        static UNPACKED: LazyLock<Mutex<Unpacked>> =
            LazyLock::new(|| Mutex::new(Unpacked::new(std::env::temp_dir())));
        let group = variables.privileges().user.map(|(_, gid)| gid);
        let found = Interpreter::find_with(
            parameter,
            (model_dir, variables.env_roots()),
            group,
            &UNPACKED,
        )?;
        Ok(found.with_variables(variables.clone()))
    }

    /// [`Interpreter::find`], packed environments unpacked by `unpacked`, readable by `group`
    /// too when one is given (the `--python-stub-user`'s).
    fn find_with(
        parameter: Option<&str>,
        (model_dir, roots): (&Path, &[PathBuf]),
        group: Option<u32>,
        unpacked: &Mutex<Unpacked>,
    ) -> Result<Interpreter, String> {
        let Some(env) = parameter.map(str::trim).filter(|p| !p.is_empty()) else {
            let python = std::env::var_os(PYTHON_VARIABLE)
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from("python3"), PathBuf::from);
            return Ok(Interpreter {
                python,
                activate: None,
                variables: StubEnvironment::default(),
            });
        };
        let named = allowed(
            &env.replace("$$TRITON_MODEL_DIRECTORY", &model_dir.to_string_lossy()),
            model_dir,
            roots,
        )?;
        let metadata = fs::metadata(&named)
            .map_err(|e| format!("{EXECUTION_ENV_PATH} '{}': {e}", named.display()))?;
        let env = if metadata.is_dir() {
            named
        } else {
            unpacked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .unpack(&named, group)?
        };
        let python = env.join("bin").join("python3");
        if !python.is_file() {
            return Err(format!(
                "{EXECUTION_ENV_PATH} '{}' has no bin/python3",
                env.display()
            ));
        }
        let activate = env.join("bin").join("activate");
        let activate = activate.is_file().then(|| (activate, env.join("lib")));
        Ok(Interpreter {
            python,
            activate,
            variables: StubEnvironment::default(),
        })
    }

    /// This interpreter, its stubs seeing `variables` of kiln's environment.
    pub fn with_variables(self, variables: StubEnvironment) -> Interpreter {
        Interpreter { variables, ..self }
    }

    /// The command that starts this Python, with the stub's environment; its arguments follow.
    pub fn command(&self) -> Command {
        let mut command = match &self.activate {
            None => Command::new(&self.python),
            Some((script, lib)) => {
                let mut command = Command::new("bash");
                command
                    .arg("-c")
                    .arg(ACTIVATE)
                    .arg("kiln-python-environment")
                    .arg(script)
                    .arg(lib)
                    .arg(&self.python);
                command
            }
        };
        self.variables.apply(&mut command);
        command
    }

    /// The interpreter's executable.
    pub fn python(&self) -> &Path {
        &self.python
    }
}

impl fmt::Display for Interpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.activate {
            None => write!(f, "'{}'", self.python.display()),
            Some((script, _)) => write!(
                f,
                "'{}' (activated by bash with '{}')",
                self.python.display(),
                script.display()
            ),
        }
    }
}

/// The environments unpacked so far. Loads that ask for environments wait for each other, so
/// that one archive is unpacked once.
struct Unpacked {
    /// The temporary directory.
    temp: PathBuf,
    /// This process's directory in it (made at the first environment).
    base: Option<PathBuf>,
    /// Each archive's directory, by the archive's path (absolute, as checked), modification time and size.
    by_archive: HashMap<(PathBuf, Option<SystemTime>, u64), PathBuf>,
    /// Directories made, for the next one's name.
    made: usize,
}

/// Every `Unpacked` made, for [`remove_unpacked`].
static BASES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

impl Unpacked {
    fn new(temp: PathBuf) -> Unpacked {
        Unpacked {
            temp,
            base: None,
            by_archive: HashMap::new(),
            made: 0,
        }
    }

    /// The directory `archive` is unpacked into, unpacking it if this archive (as it is now)
    /// has not been. With `group`, the stubs' group (`--python-stub-user` runs them as another
    /// user) may read it too: the private directory and the environment's become the group's,
    /// mode 0750; other users still cannot enter.
    fn unpack(&mut self, archive: &Path, group: Option<u32>) -> Result<PathBuf, String> {
        let failed = |e: io::Error| {
            format!(
                "{EXECUTION_ENV_PATH} '{}' could not be unpacked: {e}",
                archive.display()
            )
        };
        // Keyed by the path as checked, not canonicalised: through a modelcar's
        // `/proc/<pid>/root/...` the canonical path does not exist here.
        let path = absolute_lexical(archive);
        let metadata = fs::metadata(&path).map_err(failed)?;
        let key = (path, metadata.modified().ok(), metadata.len());
        if let Some(dir) = self.by_archive.get(&key).filter(|dir| dir.is_dir()) {
            let dir = dir.clone();
            if let (Some(group), Some(base)) = (group, &self.base) {
                share_with(group, &[base, &dir]).map_err(failed)?;
            }
            return Ok(dir);
        }
        let base = match &self.base {
            Some(base) => base.clone(),
            None => {
                let base = make_base(&self.temp).map_err(failed)?;
                BASES
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(base.clone());
                self.base.insert(base).clone()
            }
        };
        let dir = base.join(self.made.to_string());
        self.made += 1;
        tracing::info!(
            "unpacking the Python environment '{}' into '{}'",
            key.0.display(),
            dir.display()
        );
        if let Err(e) = extract(&key.0, &dir) {
            let _ = fs::remove_dir_all(&dir);
            return Err(failed(e));
        }
        if let Some(group) = group {
            share_with(group, &[&base, &dir]).map_err(failed)?;
        }
        self.by_archive.insert(key, dir.clone());
        Ok(dir)
    }
}

/// Makes `dirs` readable and enterable by `group` (their owner unchanged, mode 0750).
fn share_with(group: u32, dirs: &[&Path]) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for dir in dirs {
        std::os::unix::fs::chown(dir, None, Some(group))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o750))?;
    }
    Ok(())
}

/// Makes this process's directory for unpacked environments in `temp`: a fresh one, readable by
/// its owner alone, under a random name (see [`crate::scratch`]), so that nobody can have put
/// anything in its place.
fn make_base(temp: &Path) -> io::Result<PathBuf> {
    crate::scratch::private_dir_in(temp, "kiln_python_env_")
}

/// Removes the environments this process unpacked. Called as kiln exits, when no stub runs.
pub fn remove_unpacked() {
    for base in BASES.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        if let Err(e) = fs::remove_dir_all(&base) {
            tracing::warn!(
                "cannot remove the unpacked Python environments in '{}': {e}",
                base.display()
            );
        }
    }
}

/// Unpacks the tar archive `archive` (gzipped or not) into the new directory `into`. Entries
/// that would land outside it (absolute paths, `..`, paths through links) are not written.
fn extract(archive: &Path, into: &Path) -> io::Result<()> {
    let mut file = File::open(archive)?;
    let mut magic = [0u8; 2];
    let gzipped = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    file.rewind()?;
    let file = BufReader::new(file);
    let reader: Box<dyn Read> = if gzipped {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    fs::create_dir(into)?;
    let mut archive = tar::Archive::new(reader);
    archive.set_overwrite(true);
    archive.set_preserve_mtime(true);
    archive.unpack(into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kiln-environment-test-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The interpreter `parameter` names for a model in `dir`, packed environments unpacked
    /// in `dir` by `unpacked`.
    fn find(
        parameter: Option<&str>,
        dir: &Path,
        unpacked: &Mutex<Unpacked>,
    ) -> Result<Interpreter, String> {
        Interpreter::find_with(parameter, (dir, &[]), None, unpacked)
    }

    /// A tar archive holding an environment: an executable `bin/python3`, a link to it, and a
    /// marker file with `mark` in it; gzipped when asked.
    fn packed(path: &Path, mark: &str, gzipped: bool) {
        let mut tar = tar::Builder::new(Vec::new());
        let mut add = |name: &str, mode: u32, data: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(mode);
            header.set_cksum();
            tar.append_data(&mut header, name, data).unwrap();
        };
        add("bin/python3", 0o755, b"#!/bin/sh\n");
        add("lib/mark", 0o644, mark.as_bytes());
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        link.set_mode(0o777);
        link.set_cksum();
        tar.append_link(&mut link, "bin/python", "python3").unwrap();
        let bytes = tar.into_inner().unwrap();
        let mut file = File::create(path).unwrap();
        if gzipped {
            let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
            gz.write_all(&bytes).unwrap();
            gz.finish().unwrap();
        } else {
            file.write_all(&bytes).unwrap();
        }
    }

    #[test]
    fn a_packed_environment_is_unpacked_once_and_again_when_it_changes() {
        let dir = scratch("packed");
        let unpacked = Mutex::new(Unpacked::new(dir.clone()));
        let archive = dir.join("env.tar.gz");
        packed(&archive, "one", true);
        let first = find(Some("$$TRITON_MODEL_DIRECTORY/env.tar.gz"), &dir, &unpacked).unwrap();
        let env = first
            .python()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        assert!(env.starts_with(&dir), "{}", env.display());
        assert_eq!(fs::read_to_string(env.join("lib/mark")).unwrap(), "one");
        let mode = fs::metadata(first.python()).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "bin/python3 keeps its execute bits");
        assert_eq!(
            fs::read_link(env.join("bin/python")).unwrap(),
            Path::new("python3")
        );
        assert_eq!(
            first.activate, None,
            "no bin/activate: Python runs directly"
        );
        // The same archive again: the same directory.
        let again = find(Some(archive.to_str().unwrap()), &dir, &unpacked).unwrap();
        assert_eq!(again, first);
        // A new archive at the same path: a new directory; the old one stays for its stubs.
        packed(&archive, "two, longer", false);
        let second = find(Some(archive.to_str().unwrap()), &dir, &unpacked).unwrap();
        assert_ne!(second, first);
        let env2 = second.python().parent().unwrap().parent().unwrap();
        assert_eq!(
            fs::read_to_string(env2.join("lib/mark")).unwrap(),
            "two, longer"
        );
        assert!(env.join("lib/mark").is_file());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_environment_for_another_stub_user_is_its_groups_to_read() {
        use std::os::unix::fs::MetadataExt;
        let dir = scratch("shared-group");
        let unpacked = Mutex::new(Unpacked::new(dir.clone()));
        let archive = dir.join("env.tar");
        packed(&archive, "group", false);
        let parameter = Some(archive.to_str().unwrap());
        let env_of = |found: &Interpreter| {
            found
                .python()
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .to_path_buf()
        };
        // Without a stub user: the private directory is its owner's alone.
        let private =
            env_of(&Interpreter::find_with(parameter, (&dir, &[]), None, &unpacked).unwrap());
        let base = private.parent().unwrap().to_path_buf();
        assert_eq!(
            fs::metadata(&base).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // With one, its group may enter and read (a group kiln's user is in, so that the test
        // needs no root), others still may not; the environment already unpacked too.
        let group = fs::metadata(&dir).unwrap().gid();
        let shared = env_of(
            &Interpreter::find_with(parameter, (&dir, &[]), Some(group), &unpacked).unwrap(),
        );
        assert_eq!(shared, private, "the same archive: the same directory");
        for path in [&base, &shared] {
            let metadata = fs::metadata(path).unwrap();
            assert_eq!(
                (metadata.gid(), metadata.permissions().mode() & 0o777),
                (group, 0o750)
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entries_outside_the_environment_are_not_written() {
        let dir = scratch("escape");
        let unpacked = Mutex::new(Unpacked::new(dir.clone()));
        let mut tar = tar::Builder::new(Vec::new());
        let outside = dir.join("outside");
        // Written by hand: the builder refuses such names.
        for (name, data) in [("../outside", &b"x"[..]), ("bin/python3", b"")] {
            let mut header = tar::Header::new_gnu();
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_size(data.len() as u64);
            header.set_mode(0o755);
            header.set_cksum();
            tar.append(&header, data).unwrap();
        }
        let archive = dir.join("env.tar");
        fs::write(&archive, tar.into_inner().unwrap()).unwrap();
        let found = find(Some(archive.to_str().unwrap()), &dir, &unpacked).unwrap();
        assert!(found.python().is_file());
        assert!(!outside.exists(), "an entry named ../outside was written");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_is_not_an_environment_fails_with_the_reason() {
        let dir = scratch("not");
        let unpacked = Mutex::new(Unpacked::new(dir.clone()));
        let missing = find(
            Some("$$TRITON_MODEL_DIRECTORY/no/env.tar.gz"),
            &dir,
            &unpacked,
        );
        let missing = missing.unwrap_err();
        let expected = format!("EXECUTION_ENV_PATH '{}/no/env.tar.gz': ", dir.display());
        assert!(missing.starts_with(&expected), "{missing}");
        fs::write(dir.join("garbage.tar.gz"), [0x1f, 0x8b, 1, 2, 3]).unwrap();
        let garbage = find(
            Some("$$TRITON_MODEL_DIRECTORY/garbage.tar.gz"),
            &dir,
            &unpacked,
        )
        .unwrap_err();
        assert!(garbage.contains("could not be unpacked"), "{garbage}");
        fs::create_dir_all(dir.join("empty")).unwrap();
        let empty = find(Some("$$TRITON_MODEL_DIRECTORY/empty"), &dir, &unpacked).unwrap_err();
        assert!(empty.ends_with("has no bin/python3"), "{empty}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn environments_come_from_the_repository_or_the_roots_named() {
        let base = scratch("roots");
        let (repo, other) = (base.join("repo"), base.join("other"));
        let model = repo.join("m");
        for env in [model.join("env"), repo.join("shared"), other.join("env")] {
            fs::create_dir_all(env.join("bin")).unwrap();
            fs::write(env.join("bin/python3"), "").unwrap();
        }
        let unpacked = Mutex::new(Unpacked::new(base.clone()));
        let find = |parameter: &str, roots: &[PathBuf]| {
            Interpreter::find_with(Some(parameter), (&model, roots), None, &unpacked)
        };
        let python = |parameter: &str, roots: &[PathBuf]| {
            find(parameter, roots).map(|found| found.python().to_path_buf())
        };
        assert_eq!(
            python("$$TRITON_MODEL_DIRECTORY/env", &[]).unwrap(),
            model.join("env/bin/python3")
        );
        // `..` is folded as written, and the folded path is the one used.
        assert_eq!(
            python("$$TRITON_MODEL_DIRECTORY/../shared", &[]).unwrap(),
            repo.join("shared/bin/python3")
        );
        let outside = other.join("env");
        for parameter in [
            outside.display().to_string(),
            "$$TRITON_MODEL_DIRECTORY/../../other/env".to_string(),
            "/usr".to_string(),
        ] {
            let refused = find(&parameter, &[]).unwrap_err();
            assert!(refused.starts_with("EXECUTION_ENV_PATH '"), "{refused}");
            assert!(
                refused.ends_with(&format!(
                    "is outside the model repository {}: kiln runs Python environments from \
                     the model's repository and the --python-env-root directories only \
                     (--python-env-root=/ allows any, as Triton)",
                    repo.display()
                )),
                "{refused}"
            );
        }
        assert_eq!(
            python(
                "$$TRITON_MODEL_DIRECTORY/../../other/env",
                std::slice::from_ref(&other)
            )
            .unwrap(),
            other.join("env/bin/python3")
        );
        assert!(find(&outside.display().to_string(), &[PathBuf::from("/")]).is_ok());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_environment_with_an_activate_script_is_activated_first() {
        let dir = scratch("activate");
        let unpacked = Mutex::new(Unpacked::new(dir.clone()));
        fs::create_dir_all(dir.join("env/bin")).unwrap();
        fs::create_dir_all(dir.join("env/lib")).unwrap();
        // Its `python3` prints what activation set; the script prints to standard output too,
        // which must not reach the stub's channel.
        let python = dir.join("env/bin/python3");
        fs::write(
            &python,
            "#!/bin/sh\necho \"$ACTIVATED|$LD_LIBRARY_PATH|$*\"\n",
        )
        .unwrap();
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(
            dir.join("env/bin/activate"),
            "echo noise; export ACTIVATED=\"yes $#\"\n",
        )
        .unwrap();
        let found = find(Some("$$TRITON_MODEL_DIRECTORY/env"), &dir, &unpacked).unwrap();
        assert!(found.to_string().contains("activated by bash"), "{found}");
        let output = found
            .command()
            .args(["-c", "code with spaces", "model.py"])
            .env("LD_LIBRARY_PATH", "/before")
            .output()
            .unwrap();
        assert!(output.status.success());
        assert_eq!(
            String::from_utf8(output.stdout).unwrap(),
            format!(
                "yes 0|{}:/before|-c code with spaces model.py\n",
                dir.join("env/lib").display()
            )
        );
        assert_eq!(String::from_utf8(output.stderr).unwrap(), "noise\n");
        // A script that fails: the command fails, saying so.
        fs::write(dir.join("env/bin/activate"), "return 3\n").unwrap();
        let output = found.command().output().unwrap();
        assert!(!output.status.success());
        assert!(String::from_utf8(output.stderr)
            .unwrap()
            .contains("sourcing"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
