//! Repository agents (`model_repository_agents`): work done on a model's files before it loads.
//! Triton loads agents as shared libraries; kiln has Triton's `checksum` agent built in and
//! refuses any other name, so a config that asks for a check is never loaded unchecked.
//!
//! `checksum` (Triton's checksum repository agent): each parameter `MD5:<path>` → `<hex digest>`
//! names a file relative to the model directory that must have that MD5 digest, or the load
//! fails. Triton's messages are kept; kiln compares digests without regard to case, reads the
//! file in pieces (any size, little memory) and refuses paths that leave the model directory.

use super::store::contained;
use crate::proto::inference::model_repository_agents::Agent;
use crate::proto::inference::ModelConfig;
use md5::{Digest, Md5};
use std::io::Read;
use std::path::Path;

/// Runs the config's agents, in order, on the model directory `dir`.
///
/// # Errors
/// An unknown agent, or the first check that fails.
pub fn run(config: &ModelConfig, dir: &Path) -> Result<(), String> {
    let Some(agents) = &config.model_repository_agents else {
        return Ok(());
    };
    for agent in &agents.agents {
        match agent.name.as_str() {
            "checksum" => checksum(agent, dir)?,
            other => {
                return Err(format!(
                    "repository agent '{other}' is not available: kiln has Triton's 'checksum' \
                     agent built in and loads no agent libraries"
                ))
            }
        }
    }
    Ok(())
}

fn checksum(agent: &Agent, dir: &Path) -> Result<(), String> {
    // The parameters are a map; check in the order of their keys, so failures are repeatable.
    let mut parameters: Vec<_> = agent.parameters.iter().collect();
    parameters.sort();
    for (key, expected) in parameters {
        let (algorithm, file) = key
            .split_once(':')
            .ok_or_else(|| format!("failed to parse key: {key}"))?;
        if !algorithm.eq_ignore_ascii_case("md5") {
            return Err(format!("Unsupported checksum algorithm: {algorithm}"));
        }
        let got = md5_of(dir, file)
            .map_err(|e| format!("failed to open text file for read {file}: {e}"))?;
        if !got.eq_ignore_ascii_case(expected.trim()) {
            return Err(format!(
                "Mismatched MD5 hash for file {file}, expect: {expected}, got: {got}"
            ));
        }
    }
    Ok(())
}

/// The lowercase hex MD5 digest of `dir/relative`, a regular file inside `dir`.
fn md5_of(dir: &Path, relative: &str) -> Result<String, String> {
    let path = contained(dir, relative).map_err(|e| e.to_string())?;
    // Asked before opening: opening a FIFO would wait for a writer.
    let metadata = std::fs::metadata(&path).map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".into());
    }
    let mut file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
    let mut hasher = Md5::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = file.read(&mut buffer).map_err(|e| e.to_string())?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::ModelRepositoryAgents;
    use std::path::PathBuf;

    fn config(agents: &[(&str, &[(&str, &str)])]) -> ModelConfig {
        ModelConfig {
            name: "m".into(),
            model_repository_agents: Some(ModelRepositoryAgents {
                agents: agents
                    .iter()
                    .map(|(name, parameters)| Agent {
                        name: name.to_string(),
                        parameters: parameters
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    })
                    .collect(),
            }),
            ..Default::default()
        }
    }

    struct Dir(PathBuf);

    impl Dir {
        /// A model directory with `1/model.onnx` = "abc" and `labels.txt` = "" and, beside it,
        /// `outside.txt`.
        fn new(tag: &str) -> Dir {
            let root =
                std::env::temp_dir().join(format!("kiln-agents-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("m/1")).unwrap();
            std::fs::write(root.join("m/1/model.onnx"), b"abc").unwrap();
            std::fs::write(root.join("m/labels.txt"), b"").unwrap();
            std::fs::write(root.join("outside.txt"), b"abc").unwrap();
            Dir(root)
        }

        fn model(&self) -> PathBuf {
            self.0.join("m")
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    // RFC 1321's test vectors.
    const ABC: &str = "900150983cd24fb0d6963f7d28e17f72";
    const EMPTY: &str = "d41d8cd98f00b204e9800998ecf8427e";

    #[test]
    fn no_agents_and_matching_checksums_load() {
        let dir = Dir::new("match");
        assert_eq!(run(&ModelConfig::default(), &dir.model()), Ok(()));
        assert_eq!(run(&config(&[("checksum", &[])]), &dir.model()), Ok(()));
        let upper = ABC.to_uppercase();
        let checks = config(&[(
            "checksum",
            &[
                ("MD5:1/model.onnx", ABC),
                ("md5:labels.txt", EMPTY),
                ("Md5:./1/model.onnx", &upper),
            ],
        )]);
        assert_eq!(run(&checks, &dir.model()), Ok(()));
    }

    #[test]
    fn a_mismatch_is_reported_as_triton_reports_it() {
        let dir = Dir::new("mismatch");
        let checks = config(&[("checksum", &[("MD5:1/model.onnx", EMPTY)])]);
        assert_eq!(
            run(&checks, &dir.model()),
            Err(format!(
                "Mismatched MD5 hash for file 1/model.onnx, expect: {EMPTY}, got: {ABC}"
            ))
        );
    }

    #[test]
    fn bad_keys_missing_files_and_escapes_are_refused() {
        let dir = Dir::new("bad");
        let refused =
            |key: &str| run(&config(&[("checksum", &[(key, ABC)])]), &dir.model()).unwrap_err();
        assert_eq!(refused("1/model.onnx"), "failed to parse key: 1/model.onnx");
        assert_eq!(
            refused("SHA256:1/model.onnx"),
            "Unsupported checksum algorithm: SHA256"
        );
        let missing = refused("MD5:2/model.onnx");
        assert!(
            missing.starts_with("failed to open text file for read 2/model.onnx: "),
            "{missing}"
        );
        for escape in ["MD5:../outside.txt", "MD5:/etc/hostname"] {
            let refused = refused(escape);
            assert!(
                refused.contains("must be relative and stay within the model directory"),
                "{refused}"
            );
        }
        let directory = refused("MD5:1");
        assert!(directory.ends_with("not a regular file"), "{directory}");
    }

    #[test]
    fn other_agents_are_refused() {
        let dir = Dir::new("other");
        let refused = run(
            &config(&[("checksum", &[]), ("decrypt", &[])]),
            &dir.model(),
        )
        .unwrap_err();
        assert!(
            refused.starts_with("repository agent 'decrypt' is not available"),
            "{refused}"
        );
    }
}
