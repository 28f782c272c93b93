//! Where model directories come from. A [`ModelStore`] lists model names, hands the loader a local
//! directory holding one model's files, and fingerprints them so polling can tell what changed.
//! [`LocalStore`] is a directory on disk in Triton's layout; [`super::remote::RemoteStore`] copies a
//! model from an object store (S3, GCS, Azure) into a local cache in [`ModelStore::fetch`] and fingerprints
//! it from object metadata, and nothing above this module tells them apart. [`open`] picks one
//! from the repository's location.
//!
//! Whose paths are checked: the repository is the operator's, and its links are followed as the
//! kernel follows them, never canonicalised (a model directory linked in from a cache, or a
//! KServe modelcar's `/mnt/models -> /proc/<pid>/root/models`, which only resolves through
//! `/proc`). What a client or a config names (model names, override file names, a config's
//! `default_model_filename`, label and data files) is checked lexically: one directory name, or a
//! plain relative path without `..` or a root, so that it can never leave the model directory
//! whatever links the operator put in it.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

/// What changed between two looks at a model's files: one hash for everything outside the version
/// directories (config, labels...) and one per version directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    /// Files outside the numeric version directories; a change reloads every version.
    pub shared: u64,
    /// Each numeric version directory by name; a change reloads that version only.
    pub versions: BTreeMap<String, u64>,
}

/// Why a store refused or failed a request for a model: what a caller (a retry, a cache of names
/// the repository does not hold) branches on. Every variant carries the whole message, which is
/// its text as it was always reported (the index, load errors, logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store holds no model of that name (no directory, no objects under its prefix).
    #[error("{0}")]
    NotFound(String),
    /// A name, path, URL or object the store refuses whatever it holds: one that would leave the
    /// repository, a model that is not a directory or has too many entries, a location or
    /// credential kiln cannot use. Asking again gets the same answer.
    #[error("{0}")]
    Invalid(String),
    /// The store could not be reached or read (network, credentials, I/O): asking again may
    /// succeed.
    #[error("{0}")]
    Unavailable(String),
}

impl StoreError {
    /// The message, as [`std::fmt::Display`] writes it.
    pub fn message(&self) -> &str {
        match self {
            StoreError::NotFound(message)
            | StoreError::Invalid(message)
            | StoreError::Unavailable(message) => message,
        }
    }
}

/// A source of model directories.
pub trait ModelStore: Send + Sync {
    /// Where the store is, for logs.
    fn location(&self) -> String;

    /// The model names (top-level directory names) in the store, sorted. Hidden entries
    /// (starting with `.`) are not models.
    ///
    /// # Errors
    /// The store cannot be listed.
    fn list(&self) -> io::Result<Vec<String>>;

    /// Whether the store holds model `name` (a name already checked by [`validate_name`]).
    fn contains(&self, name: &str) -> bool;

    /// A local directory with the model's files, ready for ONNX Runtime. It is named after the
    /// model, except where a registered repository serves a directory under another name
    /// ([`super::mapped`]); the loader tells the two apart by that name.
    ///
    /// # Errors
    /// Why the model cannot be read: missing ([`StoreError::NotFound`]), refused (its name or
    /// directory leaves the repository: [`StoreError::Invalid`]) or unreachable
    /// ([`StoreError::Unavailable`]).
    fn fetch(&self, name: &str) -> Result<PathBuf, StoreError>;

    /// The model's current fingerprint.
    ///
    /// # Errors
    /// As [`ModelStore::fetch`].
    fn fingerprint(&self, name: &str) -> Result<Fingerprint, StoreError>;
}

/// The store a `--model-repository` value names: `s3://bucket/prefix`, `gs://bucket/prefix` and
/// `as://account/container/prefix` are object stores configured from the environment (see
/// `remote`); any other `scheme://` is refused rather than taken for a relative directory;
/// everything else is a local directory.
///
/// # Errors
/// An unsupported URL scheme or an object store that cannot be configured
/// ([`StoreError::Invalid`]), or a local cache for it that cannot be made
/// ([`StoreError::Unavailable`]).
pub fn open(location: &Path) -> Result<Box<dyn ModelStore>, StoreError> {
    let text = location.to_string_lossy();
    if super::remote::parse_url(&text).is_some() {
        return Ok(Box::new(super::remote::RemoteStore::from_env(&text)?));
    }
    if let Some((scheme, _)) = text.split_once("://") {
        let url_like = !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if url_like {
            return Err(StoreError::Invalid(format!(
                "unsupported model repository URL '{text}' (local directories, s3://, gs:// and as:// are supported)"
            )));
        }
    }
    Ok(Box::new(LocalStore::new(location.to_path_buf())))
}

/// Longest model name, in bytes: a model is a directory in its repository (and in a remote
/// store's local cache), whose name cannot be longer (NAME_MAX); and names a client asks to load
/// are kept (the index, load locks), so they are bounded before anything else looks at them.
pub const MAX_MODEL_NAME_BYTES: usize = 255;

/// Triton's text for a name that is empty once trimmed (core
/// src/model_repository_manager/model_repository_manager.cc, `ValidateModelName`).
pub const EMPTY_NAME: &str = "Model name cannot be empty. Please enter a valid name to deploy.";

/// Checks a model name as Triton's current release does (core
/// src/model_repository_manager/model_repository_manager.cc, `ValidateModelName`, which trims the
/// name of C's whitespace first): not empty once trimmed, and nothing that could leave the
/// repository once joined to its path: no path separator (`/`, and `\` as on Windows), not `.` or
/// `..` as the whole trimmed name (` ..` included), no NUL. Every other name is valid, dots and
/// spaces included (`...`, `a..b`, `my model`). Also no longer than [`MAX_MODEL_NAME_BYTES`].
/// (Triton refuses `..` and `/` only; `.`, `\` and NUL are kiln's, the length too.) Unlike
/// Triton, no control character either: a newline or an escape sequence in a name would forge
/// log lines and garble terminals (the message escapes it).
///
/// # Errors
/// [`StoreError::Invalid`] with Triton's message for the rule broken (kiln's for the length,
/// which does not repeat the name).
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    // boost::trim_copy in the "C" locale: isspace's six characters, not Unicode's.
    let trimmed = name.trim_matches([' ', '\t', '\n', '\x0B', '\x0C', '\r']);
    if trimmed.is_empty() {
        return Err(StoreError::Invalid(EMPTY_NAME.into()));
    }
    if name.len() > MAX_MODEL_NAME_BYTES {
        return Err(StoreError::Invalid(format!(
            "invalid model name: it is {} bytes, longer than the {MAX_MODEL_NAME_BYTES} a model \
             directory's name may be",
            name.len()
        )));
    }
    let escapes = matches!(trimmed, "." | "..") || name.contains(['/', '\\', '\0']);
    if escapes {
        return Err(StoreError::Invalid(format!(
            "invalid model name '{name}', model name must not contain path traversal characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!(
            "invalid model name '{}', model name must not contain control characters",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// A non-empty relative path made of plain names only: no root, no `..`, no empty segment.
pub fn plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && segment != ".."
                && !segment.contains('\\')
                && !segment.contains('\0')
        })
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// `relative` joined to `dir`, refused unless it is a plain relative path (no root, no `..`, no
/// empty segment, no NUL or `\`): checked lexically, so it names an entry below `dir` whatever
/// links are in it. Used for every path a config or a client names inside a model directory
/// (model file, label files, warmup and state data, override files). The links themselves are
/// the operator's and are followed (see the module doc).
///
/// # Errors
/// [`StoreError::Invalid`], naming the path and why it was refused.
pub fn contained(dir: &Path, relative: &str) -> Result<PathBuf, StoreError> {
    if !plain_relative(relative) {
        return Err(StoreError::Invalid(format!(
            "path '{relative}' must be relative and stay within the model directory"
        )));
    }
    Ok(dir.join(relative))
}

/// A model repository directory on the local file system.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    pub fn new(root: PathBuf) -> LocalStore {
        LocalStore { root }
    }

    /// The model's directory: `<root>/<name>` for a checked name, as it is. A model directory
    /// that is a link (into a cache, another volume, a modelcar's `/proc/<pid>/root/...`) is the
    /// operator's and is followed, not canonicalised: a path through `/proc/<pid>/root` names
    /// another mount namespace's file only as it is written.
    ///
    /// # Errors
    /// A bad name or an entry that is not a directory ([`StoreError::Invalid`]); nothing there
    /// (a dangling link included: [`StoreError::NotFound`]); anything else that stops the lookup,
    /// a permission or an I/O error, is [`StoreError::Unavailable`], with the same text.
    fn model_dir(&self, name: &str) -> Result<PathBuf, StoreError> {
        validate_name(name)?;
        let dir = self.root.join(name);
        match std::fs::metadata(&dir) {
            Ok(metadata) if metadata.is_dir() => Ok(dir),
            Ok(_) => Err(StoreError::Invalid(format!(
                "model '{name}' is not a directory"
            ))),
            Err(e) => {
                let missing = matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                );
                let message = format!("model '{name}' not found in {}", self.root.display());
                Err(if missing {
                    StoreError::NotFound(message)
                } else {
                    StoreError::Unavailable(message)
                })
            }
        }
    }
}

impl ModelStore for LocalStore {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            // Follows symlinks: a linked model directory is a model.
            if !entry.path().is_dir() {
                continue;
            }
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !name.starts_with('.') {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn contains(&self, name: &str) -> bool {
        validate_name(name).is_ok() && self.root.join(name).is_dir()
    }

    fn fetch(&self, name: &str) -> Result<PathBuf, StoreError> {
        self.model_dir(name)
    }

    fn fingerprint(&self, name: &str) -> Result<Fingerprint, StoreError> {
        let dir = self.model_dir(name)?;
        let mut fingerprint = Fingerprint::default();
        let mut shared = std::collections::hash_map::DefaultHasher::new();
        let entries = std::fs::read_dir(&dir).map_err(|e| {
            StoreError::Unavailable(format!("failed to list {}: {e}", dir.display()))
        })?;
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() && file_name.bytes().all(|b| b.is_ascii_digit()) {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                hash_tree(&path, Path::new(""), &mut hasher);
                fingerprint.versions.insert(file_name, hasher.finish());
            } else {
                hash_tree(&path, Path::new(&file_name), &mut shared);
            }
        }
        fingerprint.shared = shared.finish();
        Ok(fingerprint)
    }
}

/// Hashes the relative path, size and modification time of `path` and, for a directory,
/// everything below it (sorted, so the order is stable). A symlink to a file counts as the file;
/// a symlink to a directory counts as its target path and is not walked: links can form cycles
/// (`x -> .`), and two of them in one directory would make the walk exponential.
fn hash_tree(path: &Path, relative: &Path, hasher: &mut impl Hasher) {
    relative.hash(hasher);
    let Ok(metadata) = path.metadata() else {
        return;
    };
    metadata.is_dir().hash(hasher);
    if !metadata.is_dir() {
        metadata.len().hash(hasher);
        let mtime = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        mtime.hash(hasher);
        return;
    }
    if let Ok(target) = std::fs::read_link(path) {
        target.hash(hasher);
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        hash_tree(&entry.path(), &relative.join(entry.file_name()), hasher);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(message: &str) -> StoreError {
        StoreError::Invalid(message.into())
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn names_that_could_leave_the_repository_are_refused() {
        // Empty once trimmed of C's whitespace (Triton's qa/L0_input_validation names these).
        for bad in ["", " ", "   ", "\t", "\n", "\r", "\x0C", "\x0B", " \t \n "] {
            assert_eq!(validate_name(bad), Err(invalid(EMPTY_NAME)), "{bad:?}");
        }
        assert_eq!(
            validate_name(&" ".repeat(MAX_MODEL_NAME_BYTES + 1)),
            Err(invalid(EMPTY_NAME))
        );
        for bad in [
            "..", "../x", "a/b", "a\\b", ".", "a\0b", "/", " ..", ".. ", "\t..\n", " . ", "model/",
        ] {
            assert_eq!(
                validate_name(bad),
                Err(invalid(&format!(
                    "invalid model name '{bad}', model name must not contain path traversal \
                     characters"
                ))),
                "{bad:?}"
            );
        }
        for (bad, shown) in [
            ("a\nE1207 forged", "a\\nE1207 forged"),
            ("x\x1b[2J", "x\\u{1b}[2J"),
            ("tab\there", "tab\\there"),
            ("del\u{7f}", "del\\u{7f}"),
            ("c1\u{9b}", "c1\\u{9b}"),
        ] {
            assert_eq!(
                validate_name(bad),
                Err(invalid(&format!(
                    "invalid model name '{shown}', model name must not contain control characters"
                ))),
                "{bad:?}"
            );
        }
        // Names that cannot leave the repository are Triton's to accept.
        for good in [
            "add_sub", "model-1", "a.b", "ünï", "...", "x..y", "..x", "my model", " a ", "\u{a0}",
            " ...",
        ] {
            assert!(validate_name(good).is_ok(), "{good:?}");
        }
        assert_eq!(
            validate_name("../etc").unwrap_err().to_string(),
            "invalid model name '../etc', model name must not contain path traversal characters"
        );
        assert!(validate_name(&"m".repeat(MAX_MODEL_NAME_BYTES)).is_ok());
        assert_eq!(
            validate_name(&"m".repeat(MAX_MODEL_NAME_BYTES + 1)),
            Err(invalid(
                "invalid model name: it is 256 bytes, longer than the 255 a model directory's \
                 name may be"
            ))
        );
    }

    #[test]
    fn locations_pick_their_store() {
        let local = open(Path::new("model_repository")).unwrap();
        assert_eq!(local.location(), "model_repository");
        for unsupported in ["https://host/models", "abfs://c/models"] {
            let refused = open(Path::new(unsupported)).err().unwrap();
            assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
            assert!(refused.to_string().contains("unsupported"), "{refused}");
        }
        // Object stores are configured, not reached, when they are opened.
        for remote in ["gs://bucket/models", "as://account/container/models"] {
            assert_eq!(open(Path::new(remote)).unwrap().location(), remote);
        }
        assert_eq!(
            open(Path::new("s3:///models")).err(),
            Some(invalid("repository URL 's3:///models' names no bucket"))
        );
        assert_eq!(
            open(Path::new("as://account")).err(),
            Some(invalid(
                "repository URL 'as://account' must name an account and a container \
                 (as://<account>/<container>/<path>)"
            ))
        );
    }

    #[test]
    fn contained_paths_are_checked_lexically_and_links_followed() {
        let dir = scratch("contained");
        std::fs::write(dir.join("labels.txt"), "a").unwrap();
        assert_eq!(
            contained(&dir, "labels.txt").unwrap(),
            dir.join("labels.txt")
        );
        assert!(contained(&dir, "1/model.onnx").is_ok());
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "1/../../x",
            "a//b",
            "a\\b",
            "a\0b",
            "1/..",
        ] {
            assert_eq!(
                contained(&dir, bad),
                Err(invalid(&format!(
                    "path '{bad}' must be relative and stay within the model directory"
                )))
            );
        }
        // The operator's link is followed, as written.
        std::os::unix::fs::symlink("/etc", dir.join("linked")).unwrap();
        assert_eq!(
            contained(&dir, "linked/hostname").unwrap(),
            dir.join("linked/hostname")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn local_store_lists_fetches_and_follows_linked_model_directories() {
        let root = scratch("local");
        std::fs::create_dir_all(root.join("m/1")).unwrap();
        std::fs::create_dir_all(root.join(".hidden")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        let outside = scratch("outside");
        std::os::unix::fs::symlink(&outside, root.join("linked")).unwrap();
        std::os::unix::fs::symlink(root.join("gone"), root.join("dangling")).unwrap();
        let store = LocalStore::new(root.clone());
        assert_eq!(store.list().unwrap(), vec!["linked", "m"]);
        assert!(store.contains("m") && !store.contains("nope") && !store.contains("../m"));
        assert_eq!(store.fetch("m").unwrap(), root.join("m"));
        // Not canonicalised: the link's own path, which the kernel follows.
        assert_eq!(store.fetch("linked").unwrap(), root.join("linked"));
        let missing = format!("model 'nope' not found in {}", root.display());
        assert_eq!(store.fetch("nope"), Err(StoreError::NotFound(missing)));
        assert!(matches!(
            store.fetch("dangling"),
            Err(StoreError::NotFound(message)) if message.contains("not found")
        ));
        assert_eq!(
            store.fetch("file"),
            Err(invalid("model 'file' is not a directory"))
        );
        assert!(matches!(
            store.fetch("../m"),
            Err(StoreError::Invalid(message)) if message.contains("path traversal")
        ));
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn store_errors_tell_missing_models_from_refused_names() {
        let root = scratch("branching");
        std::fs::create_dir_all(root.join("m/1")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        let store = LocalStore::new(root.clone());
        // Missing: the store holds no such model, and a caller may remember that.
        let missing =
            StoreError::NotFound(format!("model 'absent' not found in {}", root.display()));
        assert_eq!(store.fetch("absent"), Err(missing.clone()));
        assert_eq!(store.fingerprint("absent"), Err(missing.clone()));
        // Refused: the same answer whatever the store holds.
        for refused in [
            store.fetch("../m").unwrap_err(),
            store.fingerprint("a/b").unwrap_err(),
            store.fetch(" ").unwrap_err(),
            store.fingerprint("file").unwrap_err(),
            contained(&root, "../m").unwrap_err(),
        ] {
            assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
        }
        // The text is the message, as it always was.
        assert_eq!(missing.to_string(), missing.message());
        assert_eq!(
            store.fetch("../m").unwrap_err().to_string(),
            "invalid model name '../m', model name must not contain path traversal characters"
        );
        assert!(store.fetch("m").is_ok() && store.fingerprint("m").is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn fingerprints_tell_shared_files_from_versions() {
        let root = scratch("fingerprint");
        std::fs::create_dir_all(root.join("m/1")).unwrap();
        std::fs::write(root.join("m/config.pbtxt"), "x").unwrap();
        std::fs::write(root.join("m/1/model.onnx"), "one").unwrap();
        let store = LocalStore::new(root.clone());
        let before = store.fingerprint("m").unwrap();
        assert_eq!(before.versions.keys().collect::<Vec<_>>(), vec!["1"]);
        std::fs::create_dir_all(root.join("m/2")).unwrap();
        std::fs::write(root.join("m/2/model.onnx"), "two").unwrap();
        let added = store.fingerprint("m").unwrap();
        assert_eq!(added.shared, before.shared);
        assert_eq!(added.versions["1"], before.versions["1"]);
        std::fs::write(root.join("m/config.pbtxt"), "changed").unwrap();
        assert_ne!(store.fingerprint("m").unwrap().shared, before.shared);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn fingerprints_do_not_walk_linked_directories() {
        let root = scratch("fingerprint-links");
        std::fs::create_dir_all(root.join("m/1")).unwrap();
        std::fs::write(root.join("m/1/model.onnx"), "one").unwrap();
        // Two links back to their own directory: walking them would visit 2^40 paths (the
        // kernel stops following after 40 links) and never finish.
        std::os::unix::fs::symlink(".", root.join("m/1/x")).unwrap();
        std::os::unix::fs::symlink(".", root.join("m/1/y")).unwrap();
        let store = LocalStore::new(root.clone());
        let before = store.fingerprint("m").unwrap();
        std::fs::write(root.join("m/1/model.onnx"), "changed").unwrap();
        assert_ne!(
            store.fingerprint("m").unwrap().versions["1"],
            before.versions["1"]
        );
        // A link to a file counts as the file.
        std::fs::write(root.join("m/labels.txt"), "a").unwrap();
        std::os::unix::fs::symlink("labels.txt", root.join("m/linked.txt")).unwrap();
        let linked = store.fingerprint("m").unwrap();
        std::fs::write(root.join("m/labels.txt"), "a\nb").unwrap();
        assert_ne!(store.fingerprint("m").unwrap().shared, linked.shared);
        let _ = std::fs::remove_dir_all(&root);
    }
}
