//! A model repository registered while the server runs (Triton's RegisterModelRepository, which
//! SageMaker's multi-model endpoints use): a local directory of models in which one model
//! directory is served under another name. The others keep their directory names (an ensemble's
//! composing models), and the mapped directory is reachable only under its new name.

use super::store::{Fingerprint, LocalStore, ModelStore, StoreError};
use std::io;
use std::path::PathBuf;

/// `root`, with the model directory `directory` served as `name`.
pub struct MappedStore {
    local: LocalStore,
    location: String,
    directory: String,
    name: String,
}

impl MappedStore {
    pub fn new(root: PathBuf, directory: &str, name: &str) -> MappedStore {
        MappedStore {
            location: root.display().to_string(),
            local: LocalStore::new(root),
            directory: directory.to_string(),
            name: name.to_string(),
        }
    }

    /// The directory `name` is served from: not found when this store does not serve it (the
    /// mapped directory under its own name).
    fn served<'a>(&'a self, name: &'a str) -> Result<&'a str, StoreError> {
        self.directory_of(name).ok_or_else(|| {
            StoreError::NotFound(format!("model '{name}' not found in {}", self.location))
        })
    }

    /// The directory `name` is served from, if this store serves it.
    fn directory_of<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if name == self.name {
            Some(&self.directory)
        } else if name == self.directory {
            None
        } else {
            Some(name)
        }
    }
}

impl ModelStore for MappedStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = self
            .local
            .list()?
            .into_iter()
            .map(|n| {
                if n == self.directory {
                    self.name.clone()
                } else {
                    n
                }
            })
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn contains(&self, name: &str) -> bool {
        self.directory_of(name)
            .is_some_and(|directory| self.local.contains(directory))
    }

    fn fetch(&self, name: &str) -> Result<PathBuf, StoreError> {
        self.local.fetch(self.served(name)?)
    }

    fn fingerprint(&self, name: &str) -> Result<Fingerprint, StoreError> {
        self.local.fingerprint(self.served(name)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapped_directory_answers_to_its_new_name_only() {
        let root = std::env::temp_dir().join(format!("kiln-mapped-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for model in ["ensemble", "step"] {
            std::fs::create_dir_all(root.join(model).join("1")).unwrap();
            std::fs::write(root.join(model).join("config.pbtxt"), "").unwrap();
        }
        let store = MappedStore::new(root.clone(), "ensemble", "model.tar.gz");
        assert_eq!(store.list().unwrap(), ["model.tar.gz", "step"]);
        assert!(store.contains("model.tar.gz") && store.contains("step"));
        assert!(!store.contains("ensemble") && !store.contains("other"));
        assert_eq!(store.fetch("model.tar.gz").unwrap(), root.join("ensemble"));
        assert_eq!(store.fetch("step").unwrap(), root.join("step"));
        let hidden = format!("model 'ensemble' not found in {}", root.display());
        assert_eq!(
            store.fetch("ensemble"),
            Err(StoreError::NotFound(hidden.clone()))
        );
        assert_eq!(
            store.fingerprint("ensemble"),
            Err(StoreError::NotFound(hidden))
        );
        assert!(matches!(store.fetch("other"), Err(StoreError::NotFound(_))));
        assert_eq!(
            store.fingerprint("model.tar.gz").unwrap(),
            LocalStore::new(root.clone())
                .fingerprint("ensemble")
                .unwrap()
        );
        assert_eq!(store.location(), root.display().to_string());
        let _ = std::fs::remove_dir_all(&root);
    }
}
