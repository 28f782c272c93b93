//! Custom-operator libraries (`model_operations { op_library_filename: [...] }`): shared
//! libraries that register operators ONNX Runtime does not have (onnxruntime-extensions' string
//! and tokenizer operators, a team's own kernels). Triton's ONNX Runtime backend registers each
//! on every session of the model; kiln does too.
//!
//! A library is native code run inside the server, and kiln does not let a model repository
//! (which may be an S3 bucket, or a directory others write to) choose such code: the operator
//! names the libraries, or the directories holding them, with `--allowed-op-library`, and a model
//! naming any other library fails its load, saying which flag would allow it.
//!
//! Paths are resolved as `dlopen` would resolve them, except that a bare file name is looked up
//! in the allowed directories instead of the system's library path: absolute paths as they are,
//! relative ones against the working directory. What is checked, and handed to ONNX Runtime, is
//! the canonical path (symbolic links followed), so a link inside an allowed directory to a
//! library elsewhere is not allowed by it.

use crate::proto::inference::ModelConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The libraries, and directories of libraries, models may load (`--allowed-op-library`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOpLibraries {
    /// Canonical paths of files and directories.
    entries: Arc<[PathBuf]>,
}

impl AllowedOpLibraries {
    /// Reads the `--allowed-op-library` flags.
    ///
    /// # Errors
    /// A path that does not exist (it is resolved once, at start-up).
    pub fn from_flags(paths: &[PathBuf]) -> Result<AllowedOpLibraries, String> {
        let entries = paths
            .iter()
            .map(|path| {
                path.canonicalize()
                    .map_err(|e| format!("--allowed-op-library {}: {e}", path.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AllowedOpLibraries {
            entries: entries.into(),
        })
    }

    /// The canonical paths of the libraries `config` asks for, in its order.
    ///
    /// # Errors
    /// A library that is missing, or that no `--allowed-op-library` covers.
    pub fn resolve(&self, config: &ModelConfig) -> Result<Vec<PathBuf>, String> {
        let Some(operations) = &config.model_operations else {
            return Ok(Vec::new());
        };
        let model = &config.name;
        operations
            .op_library_filename
            .iter()
            .map(|name| {
                let what = || format!("model_operations of model '{model}': op library '{name}'");
                if name.is_empty() {
                    return Err(format!("{}: the file name is empty", what()));
                }
                let path = self
                    .locate(Path::new(name))
                    .map_err(|e| format!("{}: {e}", what()))?;
                if self.allows(&path) {
                    return Ok(path);
                }
                // Where a link or a relative name led, when that is not what the config says.
                let resolved = if path.as_os_str() == name.as_str() {
                    String::new()
                } else {
                    format!(" ({})", path.display())
                };
                Err(format!(
                    "{}{resolved} is not allowed: a model repository does not choose the native \
                     code kiln runs; start kiln with --allowed-op-library naming the library or \
                     its directory",
                    what()
                ))
            })
            .collect()
    }

    /// Where `name` is: a bare file name in the first allowed directory holding it (or as an
    /// allowed file's name), anything else as `dlopen` reads it.
    fn locate(&self, name: &Path) -> std::io::Result<PathBuf> {
        let bare = name.components().count() == 1 && !name.is_absolute();
        if bare {
            for entry in self.entries.iter() {
                let candidate = if entry.is_dir() {
                    entry.join(name)
                } else if entry.file_name() == Some(name.as_os_str()) {
                    entry.clone()
                } else {
                    continue;
                };
                if let Ok(found) = candidate.canonicalize() {
                    return Ok(found);
                }
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not found in any --allowed-op-library directory",
            ));
        }
        let found = name.canonicalize()?;
        if found.is_file() {
            Ok(found)
        } else {
            Err(std::io::Error::other("not a regular file"))
        }
    }

    fn allows(&self, library: &Path) -> bool {
        self.entries.iter().any(|entry| {
            library == entry.as_path() || (entry.is_dir() && library.starts_with(entry))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::ModelOperations;

    fn config(libraries: &[&str]) -> ModelConfig {
        ModelConfig {
            name: "m".into(),
            model_operations: Some(ModelOperations {
                op_library_filename: libraries.iter().map(|s| s.to_string()).collect(),
            }),
            ..Default::default()
        }
    }

    struct Tree(PathBuf);

    impl Tree {
        /// `ops/libfirst.so`, `ops/sub/libsecond.so`, `other/libthird.so`, and a link
        /// `ops/libescape.so -> ../other/libthird.so`.
        fn new(tag: &str) -> Tree {
            let root =
                std::env::temp_dir().join(format!("kiln-oplib-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("ops/sub")).unwrap();
            std::fs::create_dir_all(root.join("other")).unwrap();
            for file in [
                "ops/libfirst.so",
                "ops/sub/libsecond.so",
                "other/libthird.so",
            ] {
                std::fs::write(root.join(file), b"\x7fELF").unwrap();
            }
            std::os::unix::fs::symlink("../other/libthird.so", root.join("ops/libescape.so"))
                .unwrap();
            Tree(root.canonicalize().unwrap())
        }

        fn path(&self, relative: &str) -> String {
            self.0.join(relative).display().to_string()
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn no_model_operations_needs_nothing() {
        let allowed = AllowedOpLibraries::default();
        assert_eq!(allowed.resolve(&ModelConfig::default()), Ok(Vec::new()));
        assert_eq!(allowed.resolve(&config(&[])), Ok(Vec::new()));
    }

    #[test]
    fn libraries_under_an_allowed_directory_load() {
        let tree = Tree::new("dir");
        let allowed = AllowedOpLibraries::from_flags(&[tree.0.join("ops")]).unwrap();
        let libraries = allowed
            .resolve(&config(&[
                &tree.path("ops/libfirst.so"),
                &tree.path("ops/sub/libsecond.so"),
            ]))
            .unwrap();
        assert_eq!(
            libraries,
            vec![
                tree.0.join("ops/libfirst.so"),
                tree.0.join("ops/sub/libsecond.so")
            ]
        );
        // A bare name is looked up in the allowed directories.
        assert_eq!(
            allowed.resolve(&config(&["libfirst.so"])).unwrap(),
            vec![tree.0.join("ops/libfirst.so")]
        );
    }

    #[test]
    fn an_allowed_file_allows_that_file_only() {
        let tree = Tree::new("file");
        let allowed = AllowedOpLibraries::from_flags(&[tree.0.join("ops/libfirst.so")]).unwrap();
        assert!(allowed
            .resolve(&config(&[&tree.path("ops/libfirst.so")]))
            .is_ok());
        assert!(allowed.resolve(&config(&["libfirst.so"])).is_ok());
        let refused = allowed
            .resolve(&config(&[&tree.path("ops/sub/libsecond.so")]))
            .unwrap_err();
        assert!(refused.contains("is not allowed"), "{refused}");
        assert!(refused.contains("--allowed-op-library"), "{refused}");
    }

    #[test]
    fn libraries_outside_are_refused_even_through_links() {
        let tree = Tree::new("outside");
        let allowed = AllowedOpLibraries::from_flags(&[tree.0.join("ops")]).unwrap();
        for library in [
            tree.path("other/libthird.so"),
            tree.path("ops/libescape.so"),
            tree.path("ops/../other/libthird.so"),
        ] {
            let refused = allowed.resolve(&config(&[&library])).unwrap_err();
            assert!(refused.contains("is not allowed"), "{library}: {refused}");
            assert!(
                refused.contains(&tree.path("other/libthird.so")),
                "{refused}"
            );
        }
        // Nothing allowed at all: the same refusal.
        let refused = AllowedOpLibraries::default()
            .resolve(&config(&[&tree.path("ops/libfirst.so")]))
            .unwrap_err();
        assert!(
            refused.starts_with("model_operations of model 'm': op library '"),
            "{refused}"
        );
    }

    #[test]
    fn missing_libraries_and_flags_are_named() {
        let tree = Tree::new("missing");
        let allowed = AllowedOpLibraries::from_flags(&[tree.0.join("ops")]).unwrap();
        let missing = allowed
            .resolve(&config(&[&tree.path("ops/libnone.so")]))
            .unwrap_err();
        assert!(missing.contains("libnone.so"), "{missing}");
        assert!(missing.contains("No such file"), "{missing}");
        let bare = allowed.resolve(&config(&["libnone.so"])).unwrap_err();
        assert!(
            bare.contains("not found in any --allowed-op-library directory"),
            "{bare}"
        );
        let directory = allowed
            .resolve(&config(&[&tree.path("ops/sub")]))
            .unwrap_err();
        assert!(directory.contains("not a regular file"), "{directory}");
        assert!(allowed
            .resolve(&config(&[""]))
            .unwrap_err()
            .contains("empty"));
        let flag = AllowedOpLibraries::from_flags(&[tree.0.join("nowhere")]).unwrap_err();
        assert!(flag.starts_with("--allowed-op-library "), "{flag}");
    }
}
