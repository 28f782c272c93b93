//! Why a model, or one of its versions, failed to load: what a caller (a retry, a backoff, a
//! cache of names the repository does not hold) branches on. The text of each is the reason the
//! index and the load API report, as it always was.

use crate::repository::store::StoreError;

/// Why a load failed, by where it failed: the store, the model's own files, or the backend that
/// was to run them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The store could not hand the model's files over: no such model, a name it refuses, or a
    /// store it could not reach (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The model's config or files are refused: a config that does not parse or that asks for
    /// what kiln does not do, a path that leaves the model directory, a file that cannot be read
    /// or does not match its config, warmup data that is wrong. Loading the same files again
    /// fails again.
    #[error("{0}")]
    Config(String),
    /// What the config describes failed to start: ONNX Runtime could not load or run the graph,
    /// a Python model's processes or a version's instances did not start. The text is the
    /// backend's.
    #[error("{0}")]
    Backend(String),
}

impl LoadError {
    /// The reason, as [`std::fmt::Display`] writes it.
    pub fn message(&self) -> &str {
        match self {
            LoadError::Store(store) => store.message(),
            LoadError::Config(message) | LoadError::Backend(message) => message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_errors_read_as_their_reason() {
        let missing = LoadError::from(StoreError::NotFound("model 'm' not found in /r".into()));
        assert_eq!(missing.to_string(), "model 'm' not found in /r");
        assert_eq!(missing.message(), "model 'm' not found in /r");
        assert!(matches!(missing, LoadError::Store(StoreError::NotFound(_))));
        for (error, text) in [
            (LoadError::Config("bad dims".into()), "bad dims"),
            (LoadError::Backend("no graph".into()), "no graph"),
        ] {
            assert_eq!((error.to_string().as_str(), error.message()), (text, text));
        }
    }
}
