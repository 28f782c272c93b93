//! Amazon SageMaker's serving contract, as Triton serves it with `--allow-sagemaker=true` (its own
//! listener, `--sagemaker-port`, 8080 by default):
//!
//! - `GET /ping`: 200 while the server is ready (400 otherwise, with an empty body), or live with
//!   `SAGEMAKER_TRITON_PING_MODE=live`.
//! - `POST /invocations`: an inference request on one model, the body exactly as
//!   `/v2/models/{m}/infer` takes it (JSON, or JSON then binary tensor data, the JSON's length in
//!   the content type `application/vnd.sagemaker-triton.binary+json;json-header-size=<n>` instead
//!   of the `Inference-Header-Content-Length` header; responses use the same content type). With
//!   `SAGEMAKER_TRITON_INFERENCE_TYPE=generate` or `generate_stream` it is Triton's generate
//!   extension instead. The model is `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`, or the one model
//!   served when that is not set.
//!
//! Errors are 400 `{"error": ...}`, as Triton's SageMaker service answers them (429 stays 429: a
//! full server). Multi-model endpoints (`/models`): see [`mme`].

mod mme;

use super::infer::INFERENCE_HEADER_CONTENT_LENGTH;
use super::routes::{AppState, ModelPath};
use super::{generate, infer, HttpConfig, HttpError};
use crate::engine::Engine;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The SageMaker content type of a body with binary tensor data, before the JSON's length.
const BINARY_MIME: &str = "application/vnd.sagemaker-triton.binary+json;json-header-size=";

/// What `/invocations` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferenceType {
    Infer,
    Generate,
    GenerateStream,
}

/// Where SageMaker's model manager puts the models of a multi-model endpoint
/// (`/opt/ml/models/<hash>/model`): the directory `POST /models` loads from by default.
pub const DEFAULT_MODEL_ROOT: &str = "/opt/ml/models";

/// The SageMaker settings, from the environment variables Triton reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SageMakerConfig {
    /// `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`.
    pub model: Option<String>,
    /// `SAGEMAKER_TRITON_PING_MODE=live`: `/ping` answers liveness rather than readiness.
    pub ping_live: bool,
    /// `SAGEMAKER_TRITON_INFERENCE_TYPE`.
    pub inference: InferenceType,
    /// `--sagemaker-model-root`: the directories `POST /models` may load from, absolute and
    /// normal (SageMaker's `/opt/ml/models` unless the operator says otherwise).
    pub model_roots: Vec<std::path::PathBuf>,
}

impl SageMakerConfig {
    /// Reads the settings through `var` (the process environment in `main`).
    ///
    /// # Errors
    /// A message naming a variable with a value Triton does not accept.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<SageMakerConfig, String> {
        let ping_live = match var("SAGEMAKER_TRITON_PING_MODE").as_deref() {
            None | Some("ready") => false,
            Some("live") => true,
            Some(other) => {
                return Err(format!(
                    "SAGEMAKER_TRITON_PING_MODE must be 'ready' or 'live', got '{other}'"
                ))
            }
        };
        let inference = match var("SAGEMAKER_TRITON_INFERENCE_TYPE").as_deref() {
            None | Some("infer") => InferenceType::Infer,
            Some("generate") => InferenceType::Generate,
            Some("generate_stream") => InferenceType::GenerateStream,
            Some(other) => {
                return Err(format!(
                    "SAGEMAKER_TRITON_INFERENCE_TYPE must be one of: infer, generate, \
                     generate_stream; got '{other}'"
                ))
            }
        };
        Ok(SageMakerConfig {
            model: var("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME").filter(|m| !m.is_empty()),
            ping_live,
            inference,
            model_roots: vec![DEFAULT_MODEL_ROOT.into()],
        })
    }
}

struct SageMakerState {
    app: Arc<AppState>,
    config: SageMakerConfig,
    /// The models loaded through the multi-model endpoints.
    models: mme::Models,
}

/// The SageMaker router over `engine`.
pub fn router(engine: Arc<Engine>, http: HttpConfig, config: SageMakerConfig) -> Router {
    let access = Arc::clone(&http.access);
    let state = Arc::new(SageMakerState {
        app: Arc::new(AppState {
            engine,
            config: http,
        }),
        config,
        models: mme::Models::default(),
    });
    Router::new()
        .route("/ping", get(ping))
        .route("/invocations", post(invocations))
        .route("/models", get(mme::list).post(mme::load))
        .route("/models/{hash}", get(mme::describe).delete(mme::unload))
        .route("/models/{hash}/invoke", post(mme::invoke))
        .method_not_allowed_fallback(|| async {
            HttpError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        })
        .fallback(|| async { HttpError::not_found() })
        .layer(axum::middleware::from_fn_with_state(
            access,
            crate::protocol::access::http::enforce,
        ))
        .with_state(state)
}

async fn ping(State(state): State<Arc<SageMakerState>>) -> StatusCode {
    let engine = &state.app.engine;
    let ok = if state.config.ping_live {
        engine.is_live()
    } else {
        engine.is_ready()
    };
    if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

async fn invocations(
    State(state): State<Arc<SageMakerState>>,
    mut headers: HeaderMap,
    body: Body,
) -> Response {
    let model = match default_model(
        &state.app.engine,
        state.config.model.as_deref(),
        "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME",
    ) {
        Ok(model) => model,
        Err(error) => return error.into_response(),
    };
    if let Err(error) = binary_header(&mut headers, BINARY_MIME) {
        return error.into_response();
    }
    let app = State(Arc::clone(&state.app));
    let response = match state.config.inference {
        InferenceType::Infer => infer::handle(app, model, headers, body).await,
        InferenceType::Generate => generate::handle(app, model, headers, body).await,
        InferenceType::GenerateStream => generate::handle_stream(app, model, headers, body).await,
    };
    sagemaker_response(response)
}

/// The answer as SageMaker's: binary outputs under its content type, and errors as 400.
fn sagemaker_response(response: Response) -> Response {
    let mut response = binary_response(response, BINARY_MIME);
    let status = response.status();
    if (status.is_client_error() || status.is_server_error())
        && status != StatusCode::TOO_MANY_REQUESTS
    {
        *response.status_mut() = StatusCode::BAD_REQUEST;
    }
    response
}

/// `configured`, or the one model served; `setting` names what configures it, for the error.
pub(super) fn default_model(
    engine: &Engine,
    configured: Option<&str>,
    setting: &str,
) -> Result<ModelPath, HttpError> {
    if let Some(name) = configured {
        return Ok(ModelPath {
            name: name.to_string(),
            version: String::new(),
        });
    }
    let served: BTreeSet<String> = engine
        .repository_index(true)
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    match served.len() {
        1 => Ok(ModelPath {
            name: served.into_iter().next().unwrap_or_default(),
            version: String::new(),
        }),
        n => Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            format!("{setting} is not set and {n} models are served: set it to the model to run"),
        )),
    }
}

/// Moves the JSON length of a cloud binary content type (`<mime><length>`) to the header the
/// infer endpoint reads.
pub(super) fn binary_header(headers: &mut HeaderMap, mime: &str) -> Result<(), HttpError> {
    let Some(content_type) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return Ok(());
    };
    let Some(position) = content_type.find(mime) else {
        return Ok(());
    };
    let bad = |why: String| HttpError::new(StatusCode::BAD_REQUEST, why);
    if position != 0 {
        return Err(bad(format!(
            "expect MIME type for binary data starts with '{mime}', got: {content_type}"
        )));
    }
    let length = &content_type[mime.len()..];
    let value = length
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| HeaderValue::from_str(&n.to_string()).ok())
        .ok_or_else(|| {
            bad(format!(
                "Unable to parse inference header size, got: {length}"
            ))
        })?;
    headers.insert(INFERENCE_HEADER_CONTENT_LENGTH, value);
    headers.remove(header::CONTENT_TYPE);
    Ok(())
}

/// The infer endpoint's binary answer under a cloud content type (`<mime><JSON length>`).
pub(super) fn binary_response(mut response: Response, mime: &str) -> Response {
    let headers = response.headers_mut();
    if let Some(length) = headers.remove(INFERENCE_HEADER_CONTENT_LENGTH) {
        let length = length.to_str().unwrap_or_default().to_string();
        if let Ok(value) = HeaderValue::from_str(&format!("{mime}{length}")) {
            headers.insert(header::CONTENT_TYPE, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_tritons_variables() {
        let none = SageMakerConfig::from_env(|_| None).unwrap();
        assert_eq!(
            none,
            SageMakerConfig {
                model: None,
                ping_live: false,
                inference: InferenceType::Infer,
                model_roots: vec!["/opt/ml/models".into()],
            }
        );
        let set = SageMakerConfig::from_env(|name| {
            Some(
                match name {
                    "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" => "add_sub",
                    "SAGEMAKER_TRITON_PING_MODE" => "live",
                    _ => "generate_stream",
                }
                .to_string(),
            )
        })
        .unwrap();
        assert_eq!(set.model.as_deref(), Some("add_sub"));
        assert!(set.ping_live);
        assert_eq!(set.inference, InferenceType::GenerateStream);
        let bad = SageMakerConfig::from_env(|name| {
            (name == "SAGEMAKER_TRITON_INFERENCE_TYPE").then(|| "predict".to_string())
        });
        assert!(bad
            .unwrap_err()
            .contains("infer, generate, generate_stream"));
    }

    #[test]
    fn binary_content_types_become_the_header_length() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(
                "application/vnd.sagemaker-triton.binary+json;json-header-size=42",
            ),
        );
        binary_header(&mut headers, BINARY_MIME).unwrap();
        assert_eq!(headers[INFERENCE_HEADER_CONTENT_LENGTH], "42");
        assert!(headers.get(header::CONTENT_TYPE).is_none());
        let mut json = HeaderMap::new();
        json.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        binary_header(&mut json, BINARY_MIME).unwrap();
        assert!(json.get(INFERENCE_HEADER_CONTENT_LENGTH).is_none());
        for bad in [
            "text/plain;application/vnd.sagemaker-triton.binary+json;json-header-size=4",
            "application/vnd.sagemaker-triton.binary+json;json-header-size=x",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(bad));
            assert!(binary_header(&mut headers, BINARY_MIME).is_err(), "{bad}");
        }
    }

    #[test]
    fn responses_carry_the_binary_content_type_and_errors_are_400() {
        let mut response = StatusCode::OK.into_response();
        response.headers_mut().insert(
            INFERENCE_HEADER_CONTENT_LENGTH,
            HeaderValue::from_static("17"),
        );
        let response = sagemaker_response(response);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/vnd.sagemaker-triton.binary+json;json-header-size=17"
        );
        assert_eq!(
            sagemaker_response(StatusCode::NOT_FOUND.into_response()).status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            sagemaker_response(StatusCode::TOO_MANY_REQUESTS.into_response()).status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}
