//! A model repository in an object store: S3 or an S3-compatible server (`s3://bucket/prefix`),
//! Google Cloud Storage (`gs://bucket/prefix`) or Azure Blob Storage
//! (`as://account/container/prefix`), through the `object_store` crate ([`clients`] reads the URL
//! and the credentials). The layout under the prefix is Triton's: `<prefix>/<model>/config.pbtxt`,
//! `<prefix>/<model>/<version>/model.onnx`.
//!
//! ONNX Runtime reads files, so [`ModelStore::fetch`] materialises a model into a local cache
//! directory (`<cache>/<bucket>-<hash of the URL>/<model>/`) before the loader sees it: objects
//! whose size and entity tag are unchanged since the last fetch are not downloaded again, new and
//! changed ones are written beside their target and renamed over it (a reader of the old file
//! keeps its inode), and files no longer in the store are deleted. Every object key is checked
//! before it becomes a path: it must be a plain relative path inside the model's directory.
//!
//! The fingerprint that poll mode compares is computed from the listing alone (key, size, entity
//! tag, last modification), per version directory and for the shared files, so a poll costs one
//! LIST per model and downloads nothing.
//!
//! The [`ModelStore`] methods are synchronous and the lifecycle calls them from blocking threads,
//! so the store owns a small tokio runtime for object_store's async client and blocks on it. A
//! call from inside another runtime (the index is listed from an async handler) is moved off that
//! runtime's worker first, so no async worker ever parks on network I/O unannounced.

mod clients;
mod credentials;

pub use clients::{parse_url, Cloud, RemoteUrl};

use super::limits::{too_many_entries, MAX_MODEL_DIR_ENTRIES};
use super::store::{contained, plain_relative, validate_name, Fingerprint, ModelStore, StoreError};
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

/// Environment variable naming the directory remote models are cached in (else Triton's
/// `TRITON_AWS_MOUNT_DIRECTORY`, `TRITON_GCS_MOUNT_DIRECTORY` or `TRITON_AZURE_MOUNT_DIRECTORY`,
/// by cloud). Unset: a fresh private directory (mode 0700, a random name) per store under the
/// system temporary directory, removed when the server stops.
pub const CACHE_DIR_ENV: &str = "KILN_MODEL_CACHE_DIR";

/// What a fetch downloaded a local file from; equal metadata means the file is current.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Downloaded {
    size: u64,
    e_tag: Option<String>,
    last_modified: i64,
}

impl Downloaded {
    fn of(meta: &ObjectMeta) -> Downloaded {
        Downloaded {
            size: meta.size,
            e_tag: meta.e_tag.clone(),
            last_modified: meta.last_modified.timestamp_millis(),
        }
    }
}

/// A model repository in an object store.
pub struct RemoteStore {
    location: String,
    /// The repository's prefix in the bucket (empty: the bucket's root).
    prefix: ObjectPath,
    client: Arc<dyn ObjectStore>,
    /// `Option` only so that `Drop` can shut it down without blocking (see there).
    runtime: Option<Runtime>,
    /// Where this repository's models are materialised.
    cache: PathBuf,
    /// Removed on drop: the per-process default, which nothing else will reuse.
    owns_cache: bool,
    /// Local file → the object it was last downloaded from.
    downloaded: Mutex<HashMap<PathBuf, Downloaded>>,
}

impl RemoteStore {
    /// A store for `location` (an `s3://`, `gs://` or `as://` URL), configured from the
    /// environment (see [`clients`]).
    ///
    /// # Errors
    /// The URL or the client configuration is invalid ([`StoreError::Invalid`]), or the cache or
    /// the client's runtime cannot be created ([`StoreError::Unavailable`]).
    pub fn from_env(location: &str) -> Result<RemoteStore, StoreError> {
        let url = parse_url(location).ok_or_else(|| {
            StoreError::Invalid(format!("'{location}' is not an s3://, gs:// or as:// URL"))
        })??;
        let client = clients::connect(&url, location)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kiln-remote")
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot start the object store client's runtime: {e}"
                ))
            })?;
        // Triton's per-cloud variables name the local copy's directory too.
        let triton_mount = match url.cloud {
            Cloud::S3 => "TRITON_AWS_MOUNT_DIRECTORY",
            Cloud::Gcs => "TRITON_GCS_MOUNT_DIRECTORY",
            Cloud::Azure => "TRITON_AZURE_MOUNT_DIRECTORY",
        };
        let configured = [CACHE_DIR_ENV, triton_mount]
            .iter()
            .find_map(|key| std::env::var_os(key).filter(|dir| !dir.is_empty()));
        // The operator's directory is theirs to protect; the default is a fresh private one
        // that nobody else can have prepared (see `crate::scratch`).
        let (root, owns_cache) = match configured {
            Some(dir) => (PathBuf::from(dir), false),
            None => (
                crate::scratch::private_dir("kiln-model-cache-").map_err(|e| {
                    StoreError::Unavailable(format!("cannot create a model cache: {e}"))
                })?,
                true,
            ),
        };
        // The whole URL: two servers (or accounts) may hold buckets of the same name.
        let mut hasher = DefaultHasher::new();
        location.hash(&mut hasher);
        let cache = root.join(format!("{}-{:016x}", url.cache_name(), hasher.finish()));
        if let Err(e) = std::fs::create_dir_all(&cache) {
            if owns_cache {
                let _ = std::fs::remove_dir_all(&root);
            }
            return Err(StoreError::Unavailable(format!(
                "cannot create model cache {}: {e}",
                cache.display()
            )));
        }
        Ok(RemoteStore {
            location: location.to_string(),
            prefix: ObjectPath::from(url.prefix.as_str()),
            client,
            runtime: Some(runtime),
            cache,
            owns_cache,
            downloaded: Mutex::new(HashMap::new()),
        })
    }

    /// The local directory `name` is materialised in.
    pub fn cache_dir(&self, name: &str) -> PathBuf {
        self.cache.join(name)
    }

    /// Runs `future` to completion on the store's runtime, from any thread: directly on a plain
    /// (blocking) thread; through `block_in_place` on a multi-thread runtime's worker, which hands
    /// that worker's other tasks away first; on a scoped helper thread from a current-thread
    /// runtime, which cannot give its thread up. (A `spawn_blocking` thread also sees the
    /// server's multi-thread handle; `block_in_place` there simply runs the closure.)
    fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let runtime = self.runtime.as_ref().expect("runtime lives until drop");
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Err(_) => runtime.block_on(future),
            Ok(RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| runtime.block_on(future))
            }
            Ok(_) => std::thread::scope(|scope| {
                scope
                    .spawn(|| runtime.block_on(future))
                    .join()
                    .expect("object store helper thread panicked")
            }),
        }
    }

    fn model_prefix(&self, name: &str) -> ObjectPath {
        self.prefix.clone().join(name)
    }

    /// Every object of model `name` with its path relative to the model's directory, sorted.
    /// Directory markers (keys ending in `/`, made by some consoles) are skipped.
    ///
    /// # Errors
    /// Listing failed ([`from_object_store`]), the model has no objects
    /// ([`StoreError::NotFound`]), or a key is not a plain relative path
    /// ([`StoreError::Invalid`]).
    fn objects(&self, name: &str) -> Result<Vec<(String, ObjectMeta)>, StoreError> {
        validate_name(name)?;
        let prefix = self.model_prefix(name);
        let listed: Vec<ObjectMeta> = self
            .block_on(self.client.list(Some(&prefix)).try_collect())
            .map_err(|e| {
                let message = format!("failed to list model '{name}' in {}: {e}", self.location);
                from_object_store(&e, message)
            })?;
        let mut objects = Vec::with_capacity(listed.len());
        for meta in listed {
            let Some(parts) = meta.location.prefix_match(&prefix) else {
                continue;
            };
            let relative = parts
                .map(|p| p.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/");
            if relative.is_empty() || meta.location.as_ref().ends_with('/') {
                continue;
            }
            if !plain_relative(&relative) {
                return Err(StoreError::Invalid(format!(
                    "object '{}' of model '{name}' would leave the model directory",
                    meta.location
                )));
            }
            objects.push((relative, meta));
        }
        if objects.is_empty() {
            return Err(StoreError::NotFound(format!(
                "model '{name}' not found in {}",
                self.location
            )));
        }
        objects.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(objects)
    }

    /// Downloads one object to `target`: streamed into a sibling temporary file, then renamed.
    /// The temporary file is a new one (`O_EXCL|O_NOFOLLOW`): one left by an interrupted
    /// download is removed first (a link, not what it points to), and anything put back in its
    /// place meanwhile fails the download rather than being written through.
    ///
    /// # Errors
    /// As [`from_object_store`] for the object store's error; any local one is
    /// [`StoreError::Unavailable`].
    fn download(&self, meta: &ObjectMeta, target: &Path) -> Result<(), StoreError> {
        let parent = target.parent().unwrap_or(&self.cache);
        std::fs::create_dir_all(parent).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", parent.display()))
        })?;
        let partial = parent.join(format!(
            ".{}.kiln-partial",
            target.file_name().unwrap_or_default().to_string_lossy()
        ));
        let written = self.block_on(async {
            match std::fs::remove_file(&partial) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut file = crate::scratch::create_new_file(&partial)?;
            let result = self
                .client
                .get(&meta.location)
                .await
                .map_err(io::Error::other)?;
            let mut stream = result.into_stream();
            while let Some(chunk) = stream.next().await {
                file.write_all(&chunk.map_err(io::Error::other)?)?;
            }
            file.sync_all()
        });
        let renamed = written.and_then(|()| std::fs::rename(&partial, target));
        renamed.map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            from_download(&e, format!("failed to download {}: {e}", meta.location))
        })
    }
}

/// The store error for a download's error `e`: the client's error travels inside the I/O error
/// (the stream is written as I/O) and is told apart as [`from_object_store`] does; a local
/// failure (the cache) is [`StoreError::Unavailable`].
fn from_download(e: &io::Error, message: String) -> StoreError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<object_store::Error>())
    {
        Some(client) => from_object_store(client, message),
        None => StoreError::Unavailable(message),
    }
}

/// The store error for an object store's error `e`, with `message` (which names it): an object or
/// prefix that is not there is [`StoreError::NotFound`], anything else (the network, credentials,
/// the server's answer) [`StoreError::Unavailable`].
fn from_object_store(e: &object_store::Error, message: String) -> StoreError {
    match e {
        object_store::Error::NotFound { .. } => StoreError::NotFound(message),
        _ => StoreError::Unavailable(message),
    }
}

/// `relative` (an object's path, checked by [`contained`]) in the model's cache directory `dir`,
/// refused when it already exists and resolves outside `dir`: the cache is kiln's, not the
/// operator's, so a link found in it is not followed to write through.
fn in_cache(dir: &Path, relative: &str) -> Result<PathBuf, StoreError> {
    let path = contained(dir, relative)?;
    if let Ok(real) = path.canonicalize() {
        let base = dir.canonicalize().map_err(|e| {
            StoreError::Unavailable(format!("cannot resolve {}: {e}", dir.display()))
        })?;
        if !real.starts_with(&base) {
            return Err(StoreError::Invalid(format!(
                "path '{relative}' resolves to {} outside the model directory",
                real.display()
            )));
        }
    }
    Ok(path)
}

impl ModelStore for RemoteStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let listing = self
            .block_on(self.client.list_with_delimiter(Some(&self.prefix)))
            .map_err(io::Error::other)?;
        let mut names: Vec<String> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .filter(|name| !name.starts_with('.') && validate_name(name).is_ok())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn contains(&self, name: &str) -> bool {
        if validate_name(name).is_err() {
            return false;
        }
        let prefix = self.model_prefix(name);
        self.block_on(async { self.client.list(Some(&prefix)).next().await })
            .is_some_and(|first| first.is_ok())
    }

    fn fetch(&self, name: &str) -> Result<PathBuf, StoreError> {
        let objects = self.objects(name)?;
        // The same bound as a local model directory, before anything is downloaded.
        let entries: BTreeSet<&str> = objects
            .iter()
            .map(|(relative, _)| relative.split('/').next().unwrap_or(relative))
            .collect();
        if entries.len() > MAX_MODEL_DIR_ENTRIES {
            return Err(StoreError::Invalid(too_many_entries(name)));
        }
        let dir = self.cache_dir(name);
        std::fs::create_dir_all(&dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
        })?;
        let mut wanted = BTreeSet::new();
        for (relative, meta) in &objects {
            let target = in_cache(&dir, relative)?;
            let current = Downloaded::of(meta);
            let fresh = {
                let downloaded = self.downloaded.lock().unwrap_or_else(|p| p.into_inner());
                downloaded.get(&target) == Some(&current)
            } && target.metadata().is_ok_and(|m| m.len() == meta.size);
            if !fresh {
                self.download(meta, &target)?;
                let mut downloaded = self.downloaded.lock().unwrap_or_else(|p| p.into_inner());
                downloaded.insert(target.clone(), current);
            }
            wanted.insert(target);
        }
        remove_stale(&dir, &wanted);
        let mut downloaded = self.downloaded.lock().unwrap_or_else(|p| p.into_inner());
        downloaded.retain(|path, _| !path.starts_with(&dir) || wanted.contains(path));
        Ok(dir)
    }

    fn fingerprint(&self, name: &str) -> Result<Fingerprint, StoreError> {
        let objects = self.objects(name)?;
        Ok(fingerprint_of(objects.iter().map(|(relative, meta)| {
            (relative.as_str(), Downloaded::of(meta))
        })))
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks until its workers stop, which panics inside another
        // runtime (the server drops its repository from async code): let it go in the background.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        if self.owns_cache {
            // The private directory made for this store alone.
            if let Some(root) = self.cache.parent() {
                let _ = std::fs::remove_dir_all(root);
            }
        }
    }
}

/// The fingerprint of a model from its objects `(path relative to the model, metadata)`: a
/// numeric first segment with more below it is a version directory, anything else is shared.
fn fingerprint_of<'a>(objects: impl Iterator<Item = (&'a str, Downloaded)>) -> Fingerprint {
    let mut shared = DefaultHasher::new();
    let mut versions: std::collections::BTreeMap<String, DefaultHasher> = Default::default();
    for (relative, meta) in objects {
        let (hasher, key) = match relative.split_once('/') {
            Some((first, rest)) if first.bytes().all(|b| b.is_ascii_digit()) => (
                versions.entry(first.to_string()).or_default(),
                rest.to_string(),
            ),
            _ => (&mut shared, relative.to_string()),
        };
        key.hash(hasher);
        meta.hash_into(hasher);
    }
    Fingerprint {
        shared: shared.finish(),
        versions: versions
            .into_iter()
            .map(|(version, hasher)| (version, hasher.finish()))
            .collect(),
    }
}

impl Downloaded {
    fn hash_into(&self, hasher: &mut impl Hasher) {
        self.size.hash(hasher);
        self.e_tag.hash(hasher);
        self.last_modified.hash(hasher);
    }
}

/// Deletes every file under `dir` that is not in `wanted`, then the directories left empty.
fn remove_stale(dir: &Path, wanted: &BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        // `file_type` does not follow links: a link is removed as a file, never followed.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            remove_stale(&path, wanted);
            let _ = std::fs::remove_dir(&path);
        } else if !wanted.contains(&path) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64, e_tag: &str) -> Downloaded {
        Downloaded {
            size,
            e_tag: Some(e_tag.into()),
            last_modified: 0,
        }
    }

    #[test]
    fn fingerprints_tell_shared_files_from_versions() {
        let base = [
            ("config.pbtxt", meta(10, "c")),
            ("1/model.onnx", meta(100, "one")),
        ];
        let before = fingerprint_of(base.iter().cloned());
        assert_eq!(before.versions.keys().collect::<Vec<_>>(), vec!["1"]);
        let mut added = base.to_vec();
        added.push(("2/model.onnx", meta(100, "two")));
        let added = fingerprint_of(added.into_iter());
        assert_eq!(added.shared, before.shared);
        assert_eq!(added.versions["1"], before.versions["1"]);
        assert!(added.versions.contains_key("2"));
        let changed = fingerprint_of(
            [
                ("config.pbtxt", meta(10, "c2")),
                ("1/model.onnx", meta(100, "one")),
            ]
            .into_iter(),
        );
        assert_ne!(changed.shared, before.shared);
        assert_eq!(changed.versions["1"], before.versions["1"]);
        // A numeric file at the top is shared, not a version.
        let file = fingerprint_of([("7", meta(1, "x"))].into_iter());
        assert!(file.versions.is_empty());
    }

    #[test]
    fn object_store_errors_tell_missing_objects_from_unreachable_stores() {
        let missing = || object_store::Error::NotFound {
            path: "models/m/config.pbtxt".into(),
            source: "404".into(),
        };
        let down = || object_store::Error::Generic {
            store: "S3",
            source: "connection refused".into(),
        };
        assert_eq!(
            from_object_store(&missing(), "gone".into()),
            StoreError::NotFound("gone".into())
        );
        assert_eq!(
            from_object_store(&down(), "down".into()),
            StoreError::Unavailable("down".into())
        );
        // A download's client error arrives inside an I/O error; a local one is the cache's.
        assert_eq!(
            from_download(&io::Error::other(missing()), "gone".into()),
            StoreError::NotFound("gone".into())
        );
        assert_eq!(
            from_download(&io::Error::other(down()), "down".into()),
            StoreError::Unavailable("down".into())
        );
        let local = io::Error::new(io::ErrorKind::StorageFull, "disk full");
        assert_eq!(
            from_download(&local, "full".into()),
            StoreError::Unavailable("full".into())
        );
    }

    #[test]
    fn stale_files_are_removed() {
        let dir = std::env::temp_dir().join(format!("kiln-remote-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::create_dir_all(dir.join("2")).unwrap();
        for file in ["config.pbtxt", "1/model.onnx", "2/model.onnx"] {
            std::fs::write(dir.join(file), "x").unwrap();
        }
        let wanted = [dir.join("config.pbtxt"), dir.join("1/model.onnx")];
        remove_stale(&dir, &wanted.into_iter().collect());
        assert!(dir.join("1/model.onnx").exists() && dir.join("config.pbtxt").exists());
        assert!(!dir.join("2").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
