//! SageMaker's multi-model endpoints, as Triton serves them beside `/invocations` (SageMaker's
//! model manager loads and unloads models by these calls; kiln must run with
//! `--model-control-mode=explicit`, as Triton's SageMaker image does for them):
//!
//! - `POST /models` `{"model_name": "<hash>", "url": "<directory>"}`: the directory (SageMaker's
//!   `/opt/ml/models/<hash>/model`) is registered as a model repository and its model loaded
//!   under the name in the `X-Amzn-SageMaker-Target-Model` header (the archive's name; `<hash>`
//!   without the header). The directory is the model itself when it holds a `config.pbtxt`,
//!   else it holds model directories: its only one, or its ensemble (whose composing models load
//!   under their own names). 200; 409 when the name is taken; 507 when the load ran out of
//!   memory; 400 otherwise, with `{"error": ...}`. A failed load unregisters the directory.
//! - `GET /models`: `{"models": [{"modelName": "<hash>", "modelUrl": "<repository>"}, ...]}` for
//!   the loaded models that are ready; `GET /models/<hash>`: one of them, or 404.
//! - `POST /models/<hash>/invoke`: `/invocations` on that model (404 if it is not loaded; 507
//!   when its error says memory ran out).
//! - `DELETE /models/<hash>`: unloads the model (and an ensemble's composing models) and
//!   unregisters its repository; 404 if it is not loaded.
//!
//! As in Triton, a `url` under `/dev/`, `/proc/` or `/sys/` is refused; and a `url` outside the
//! `--sagemaker-model-root` directories (SageMaker's `/opt/ml/models` by default, where Triton's
//! current release requires `/opt/ml/models/<hash>/model[/<subdir>]`) is refused too: the
//! endpoint loads what SageMaker unpacked, not any directory a caller names. The `url` is checked
//! as written (made absolute, `..` folded), and then used as checked.

use super::{binary_header, sagemaker_response, SageMakerState, BINARY_MIME};
use crate::core::Error;
use crate::protocol::http::routes::{AppState, ModelPath};
use crate::protocol::http::{infer, AnsweredError, HttpError};
use crate::repository::config::parse_config;
use crate::repository::ensemble::is_ensemble;
use crate::repository::mapped::MappedStore;
use crate::repository::MAX_MODEL_DIR_ENTRIES;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// SageMaker's header naming the model archive a call is about.
const TARGET_MODEL: &str = "x-amzn-sagemaker-target-model";

/// Largest load request body (a name and a path).
const MAX_LOAD_BODY: usize = 64 << 10;

/// Error texts that make a failed load or invocation a 507 (SageMaker then unloads other
/// models and tries again), Triton's list. The one place kiln branches on an error's text, as
/// Triton does (SageMakerMMECheckOOMError): the texts come from ONNX Runtime, CUDA and Python
/// models, none of which gives an out-of-memory kind to match on instead.
const OUT_OF_MEMORY: &[&str] = &[
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "OOM",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
    // TensorFlow's, cuDNN's and cuBLAS's words for it, also in Triton's list.
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
];

/// A model loaded through `POST /models`.
#[derive(Debug, Clone)]
struct Loaded {
    /// The name it is served under.
    target: String,
    /// The repository registered for it.
    repository: String,
}

/// The models SageMaker loaded, by the hash it names them with; `None` while one loads, so that
/// two loads of one hash cannot both go ahead.
#[derive(Debug, Default)]
pub(super) struct Models(Mutex<BTreeMap<String, Option<Loaded>>>);

impl Models {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<Loaded>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The model loaded as `hash` (not one still loading).
    fn get(&self, hash: &str) -> Option<Loaded> {
        self.lock().get(hash).cloned().flatten()
    }

    /// Claims `hash` for a load; false when it is loaded or loading.
    fn reserve(&self, hash: &str) -> bool {
        let mut models = self.lock();
        if models.contains_key(hash) {
            return false;
        }
        models.insert(hash.to_string(), None);
        true
    }

    /// Ends the load of `hash`: loaded, or (`None`) failed, freeing the hash.
    fn settle(&self, hash: &str, loaded: Option<Loaded>) {
        let mut models = self.lock();
        match loaded {
            Some(loaded) => models.insert(hash.to_string(), Some(loaded)),
            None => models.remove(hash),
        };
    }

    /// Every loaded model, by hash.
    fn loaded(&self) -> Vec<(String, Loaded)> {
        self.lock()
            .iter()
            .filter_map(|(hash, loaded)| Some((hash.clone(), loaded.clone()?)))
            .collect()
    }

    fn remove(&self, hash: &str) {
        self.lock().remove(hash);
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    HttpError::new(status, message).into_response()
}

/// The status SageMaker expects for a failed load or invocation.
fn failure_status(message: &str) -> StatusCode {
    if OUT_OF_MEMORY.iter().any(|text| message.contains(text)) {
        StatusCode::INSUFFICIENT_STORAGE
    } else {
        StatusCode::BAD_REQUEST
    }
}

/// The name a call is about: the target-model header, else `fallback`.
fn target(headers: &HeaderMap, fallback: &str) -> String {
    headers
        .get(TARGET_MODEL)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map_or_else(|| fallback.to_string(), str::to_string)
}

/// `path` made absolute and without `.` or `..`, as Triton normalises the `url`.
fn normalize(path: &str) -> PathBuf {
    crate::core::path::absolute_lexical(Path::new(path))
}

/// Why `path` (normalised) may not be loaded: a system directory, as in Triton, or outside every
/// one of `roots`.
fn refused(url: &str, path: &Path, roots: &[PathBuf]) -> Option<String> {
    if ["/dev", "/proc", "/sys"]
        .iter()
        .any(|system| path.starts_with(system))
    {
        return Some(format!(
            "Invalid URL: {url}. \"url\" property value cannot start with /dev/, /proc/, or /sys/."
        ));
    }
    if roots.iter().any(|root| path.starts_with(root)) {
        return None;
    }
    let shown: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Some(format!(
        "Invalid URL: {url}. \"url\" must be a directory under {} (kiln's \
         --sagemaker-model-root; --sagemaker-model-root=/ allows any, as Triton before 2.70)",
        shown.join(", ")
    ))
}

/// Where the model in `url` is: `(repository, model directory)`.
///
/// # Errors
/// `url` is not a directory, holds no model directory, or several and no ensemble.
fn locate(url: &Path) -> Result<(PathBuf, String), String> {
    let shown = url.display();
    if !url.is_dir() {
        return Err(format!("'{shown}' is not a directory"));
    }
    if url.join("config.pbtxt").is_file() {
        let parent = url.parent().unwrap_or(Path::new("/")).to_path_buf();
        let directory = url
            .file_name()
            .and_then(|d| d.to_str())
            .ok_or_else(|| format!("'{shown}' has no usable directory name"))?;
        return Ok((parent, directory.to_string()));
    }
    let entries = std::fs::read_dir(url).map_err(|e| format!("cannot read '{shown}': {e}"))?;
    let mut models = Vec::new();
    for entry in entries.flatten().take(MAX_MODEL_DIR_ENTRIES) {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_dir && !name.starts_with('.') {
            models.push(name);
        }
    }
    models.sort();
    match models.as_slice() {
        [] => Err(format!("no model directory in '{shown}'")),
        [only] => Ok((url.to_path_buf(), only.clone())),
        several => {
            let ensembles: Vec<&String> = several
                .iter()
                .filter(|name| {
                    std::fs::read_to_string(url.join(name).join("config.pbtxt"))
                        .ok()
                        .and_then(|text| parse_config(&text).ok())
                        .is_some_and(|config| is_ensemble(&config))
                })
                .collect();
            match ensembles.as_slice() {
                [ensemble] => Ok((url.to_path_buf(), (*ensemble).clone())),
                _ => Err(format!(
                    "'{shown}' holds {} model directories and {} ensembles: it must hold one \
                     model, or one ensemble and its composing models",
                    several.len(),
                    ensembles.len()
                )),
            }
        }
    }
}

/// `POST /models`.
pub(super) async fn load(
    State(state): State<Arc<SageMakerState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let bytes = match axum::body::to_bytes(body, MAX_LOAD_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("failed to read the load request: {e}"),
            )
        }
    };
    let request = match crate::protocol::http::json::bounded_value(
        &bytes,
        crate::protocol::http::json::MAX_DOCUMENT_VALUES
            * crate::protocol::http::json::TREE_VALUE_BYTES,
    ) {
        Ok(value) => value,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("failed to parse the load request as JSON: {e}"),
            )
        }
    };
    let field = |key: &str| {
        request
            .get(key)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let (Some(hash), Some(url)) = (field("model_name"), field("url")) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the load request needs \"model_name\" and \"url\" strings",
        );
    };
    let path = normalize(url);
    if let Some(why) = refused(url, &path, &state.config.model_roots) {
        return error(StatusCode::BAD_REQUEST, why);
    }
    let (repository, directory) = match tokio::task::spawn_blocking({
        let path = path.clone();
        move || locate(&path)
    })
    .await
    {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => return error(StatusCode::BAD_REQUEST, why),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let target = target(&headers, hash);
    if !state.models.reserve(hash) {
        return error(
            StatusCode::CONFLICT,
            format!("model '{hash}' is already loaded"),
        );
    }
    let location = repository.display().to_string();
    let loaded = register_and_load(&state, repository, &directory, &target).await;
    state.models.settle(
        hash,
        loaded.is_ok().then_some(Loaded {
            target,
            repository: location,
        }),
    );
    match loaded {
        Ok(()) => StatusCode::OK.into_response(),
        Err(response) => response,
    }
}

/// Registers `repository` with `directory` served as `target` and loads it; a failed load
/// unregisters the repository again.
async fn register_and_load(
    state: &SageMakerState,
    repository: PathBuf,
    directory: &str,
    target: &str,
) -> Result<(), Response> {
    let engine = &state.app.engine;
    let location = repository.display().to_string();
    let store = MappedStore::new(repository, directory, target);
    match engine.register_repository(Arc::new(store)).await {
        Ok(()) => {}
        Err(Error::AlreadyExists(message)) => return Err(error(StatusCode::CONFLICT, message)),
        Err(e) => return Err(error(StatusCode::BAD_REQUEST, e.message())),
    }
    tracing::info!(model = %target, repository = %location, "Loading SageMaker TargetModel");
    if let Err(e) = engine.load_model(target, BTreeMap::new()).await {
        let _ = engine.unregister_repository(&location);
        let message = e.message();
        let status = match e {
            Error::AlreadyExists(_) => StatusCode::CONFLICT,
            _ => failure_status(message),
        };
        return Err(error(status, message));
    }
    Ok(())
}

/// `GET /models`.
pub(super) async fn list(State(state): State<Arc<SageMakerState>>) -> Response {
    let ready: Vec<serde_json::Value> = state
        .models
        .loaded()
        .into_iter()
        .filter(|(_, loaded)| state.app.engine.model_ready(&loaded.target, ""))
        .map(|(hash, loaded)| json!({"modelName": hash, "modelUrl": loaded.repository}))
        .collect();
    Json(json!({ "models": ready })).into_response()
}

/// `GET /models/<hash>`.
pub(super) async fn describe(
    State(state): State<Arc<SageMakerState>>,
    UrlPath(hash): UrlPath<String>,
) -> Response {
    match state.models.get(&hash) {
        Some(loaded) => {
            Json(json!({"modelName": hash, "modelUrl": loaded.repository})).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `POST /models/<hash>/invoke`.
pub(super) async fn invoke(
    State(state): State<Arc<SageMakerState>>,
    UrlPath(hash): UrlPath<String>,
    mut headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(loaded) = state.models.get(&hash) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if let Err(error) = binary_header(&mut headers, BINARY_MIME) {
        return error.into_response();
    }
    let model = ModelPath {
        name: target(&headers, &loaded.target),
        version: String::new(),
    };
    let app: State<Arc<AppState>> = State(Arc::clone(&state.app));
    let response = infer::handle(app, model, headers, body).await;
    let mut response = sagemaker_response(response);
    if response.status() == StatusCode::BAD_REQUEST {
        // Out-of-memory failures are 507 here too, so that SageMaker makes room.
        let answered = response.extensions().get::<AnsweredError>();
        if let Some(status) = answered.map(|AnsweredError(message)| failure_status(message)) {
            *response.status_mut() = status;
        }
    }
    response
}

/// `DELETE /models/<hash>`.
pub(super) async fn unload(
    State(state): State<Arc<SageMakerState>>,
    UrlPath(hash): UrlPath<String>,
) -> Response {
    let Some(loaded) = state.models.get(&hash) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let engine = &state.app.engine;
    tracing::info!(model = %loaded.target, "Unloading SageMaker TargetModel");
    if let Err(e) = engine.unload_model(&loaded.target, true).await {
        return error(StatusCode::BAD_REQUEST, e.message());
    }
    state.models.remove(&hash);
    match engine.unregister_repository(&loaded.repository) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-mme-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn urls_are_normalised_before_the_system_check() {
        assert_eq!(
            normalize("/opt/ml/models/abc/model/"),
            Path::new("/opt/ml/models/abc/model")
        );
        assert_eq!(
            normalize("/opt/ml/../../proc/self"),
            Path::new("/proc/self")
        );
        assert_eq!(normalize("/a/./b/../c"), Path::new("/a/c"));
    }

    #[test]
    fn urls_outside_the_model_roots_are_refused() {
        let sagemaker = vec![PathBuf::from(super::super::DEFAULT_MODEL_ROOT)];
        let check = |url: &str, roots: &[PathBuf]| refused(url, &normalize(url), roots);
        assert_eq!(check("/opt/ml/models/4a8f/model", &sagemaker), None);
        assert_eq!(check("/opt/ml/models/4a8f/model/sub/", &sagemaker), None);
        for outside in [
            "/etc",
            "/opt/ml/models/../../../etc",
            "/opt/ml/modelsx/a",
            "relative",
        ] {
            let why = check(outside, &sagemaker).unwrap();
            assert_eq!(
                why,
                format!(
                    "Invalid URL: {outside}. \"url\" must be a directory under /opt/ml/models \
                     (kiln's --sagemaker-model-root; --sagemaker-model-root=/ allows any, as \
                     Triton before 2.70)"
                ),
                "{outside}"
            );
        }
        let any = vec![PathBuf::from("/")];
        assert_eq!(check("/etc", &any), None);
        assert!(check("/proc/self/root", &any)
            .unwrap()
            .contains("cannot start with /dev/, /proc/, or /sys/"));
        let two = vec![PathBuf::from("/a"), PathBuf::from("/b/c")];
        assert!(check("/b/c/d", &two).is_none() && check("/b/d", &two).is_some());
        assert!(check("/b/d", &two).unwrap().contains("under /a, /b/c "));
    }

    #[test]
    fn a_model_directory_or_a_repository_of_one_model_or_one_ensemble() {
        let root = scratch("locate");
        // The url is the model itself.
        let model = root.join("single/model");
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::write(model.join("config.pbtxt"), "max_batch_size: 0").unwrap();
        assert_eq!(
            locate(&model),
            Ok((root.join("single"), "model".to_string()))
        );
        // A repository of one model.
        let one = root.join("one/model");
        std::fs::create_dir_all(one.join("resnet/1")).unwrap();
        assert_eq!(locate(&one), Ok((one.clone(), "resnet".to_string())));
        // An ensemble and its steps.
        let ensemble = root.join("ensemble/model");
        for name in ["pipeline", "pre", "post"] {
            std::fs::create_dir_all(ensemble.join(name)).unwrap();
        }
        std::fs::write(
            ensemble.join("pipeline/config.pbtxt"),
            "platform: \"ensemble\" ensemble_scheduling { step [] }",
        )
        .unwrap();
        std::fs::write(
            ensemble.join("pre/config.pbtxt"),
            "backend: \"onnxruntime\"",
        )
        .unwrap();
        assert_eq!(
            locate(&ensemble),
            Ok((ensemble.clone(), "pipeline".to_string()))
        );
        // Several models and no ensemble, nothing, or no directory at all.
        std::fs::remove_file(ensemble.join("pipeline/config.pbtxt")).unwrap();
        assert!(locate(&ensemble)
            .unwrap_err()
            .contains("3 model directories and 0 ensembles"));
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        assert!(locate(&empty)
            .unwrap_err()
            .starts_with("no model directory in"));
        assert!(locate(&root.join("missing"))
            .unwrap_err()
            .ends_with("is not a directory"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn out_of_memory_failures_are_507() {
        assert_eq!(
            failure_status("failed to allocate memory for the arena"),
            StatusCode::INSUFFICIENT_STORAGE
        );
        assert_eq!(
            failure_status("model 'm' not found"),
            StatusCode::BAD_REQUEST
        );
        for text in [
            "CUBLAS_STATUS_ALLOC_FAILED",
            "Dst tensor is not initialized.",
        ] {
            assert_eq!(
                failure_status(text),
                StatusCode::INSUFFICIENT_STORAGE,
                "{text}"
            );
        }
    }
}
