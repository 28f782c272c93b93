//! An OpenAI-compatible API for the generation models, the models that take Triton's LLM tensors
//! (see [`llm`]) and the text-embedding models (`--openai-port`), as
//! Triton's OpenAI frontend offers one beside KServe's, so that OpenAI clients and LLM benchmarks
//! (the `openai` package, genai-perf's and vLLM's `completions` endpoints) drive kiln unchanged:
//!
//! - `GET /health` (200 while the server runs, as vLLM's) and `GET /health/ready` (200 while it
//!   is ready, else 503, as Triton's OpenAI frontend), for probes on this port.
//! - `GET /v1/models`, `GET /v1/models/{model}`: the generation and embedding models that serve.
//! - `POST /v1/completions`: `model`, `prompt` (one string, or a list of one), `max_tokens` (16),
//!   `temperature`, `top_p`, `seed`, `stop` (a string or a list), `echo`, `n` (1), `stream` with
//!   `stream_options.include_usage`; the answer is a `text_completion` object with
//!   `finish_reason` (`stop` or `length`) and `usage`, or with `stream` server-sent events of
//!   chunks ended by `data: [DONE]`. Settings kiln does not honour (`logprobs`, `suffix`,
//!   penalties, `logit_bias`, `best_of` > 1, `n` > 1) are refused, not ignored.
//! - `POST /v1/chat/completions`: `messages` (`role` and `content`, text or text parts) laid out
//!   by the model's chat template (see [`crate::generate::chat`]; a model without one is
//!   refused, naming the files it lacks), the same settings (`max_completion_tokens` too; no
//!   limit given: the model's default) and a `chat.completion` answer, or
//!   `chat.completion.chunk`s whose first `delta` carries the assistant's role. Tools, functions
//!   and response formats other than text are refused.
//! - `POST /v1/embeddings`: `model` (a text model: one with a tokenizer), `input` (a string or a
//!   list of up to 2048), `encoding_format` (`float` or `base64`: little-endian `float32`),
//!   `dimensions` (only the model's own); see [`embeddings`].
//!
//! Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}` with the REST API's
//! status codes (404 for an unknown model).

mod completions;
mod embeddings;
mod llm;

use super::route_table::Routes;
use super::routes::AppState;
use super::HttpConfig;
use crate::core::Error;
use crate::engine::{Answers, Engine};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Every route of the OpenAI-compatible API (the OpenAPI document lists the same).
pub fn routes() -> Routes<Arc<AppState>> {
    Routes::new()
        .get("/health", live)
        .get("/health/ready", ready)
        .get("/v1/models", models)
        .get("/v1/models/{model}", model)
        .post("/v1/completions", completions::completions)
        .post("/v1/chat/completions", completions::chat_completions)
        .post("/v1/embeddings", embeddings::embeddings)
}

/// The OpenAI router over `engine`.
pub fn router(engine: Arc<Engine>, http: HttpConfig) -> Router {
    let access = Arc::clone(&http.access);
    let state = Arc::new(AppState {
        engine,
        config: http,
    });
    routes()
        .into_router()
        .fallback(|| async {
            OpenAiError::new(StatusCode::NOT_FOUND, "not found", "invalid_request_error")
        })
        .layer(axum::middleware::from_fn_with_state(
            access,
            crate::protocol::access::http::enforce,
        ))
        .with_state(state)
}

/// An error in OpenAI's shape.
#[derive(Debug)]
struct OpenAiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
}

impl OpenAiError {
    fn new(status: StatusCode, message: impl Into<String>, kind: &'static str) -> OpenAiError {
        OpenAiError {
            status,
            message: message.into(),
            kind,
            param: None,
        }
    }

    /// A request setting kiln refuses.
    fn invalid(param: &'static str, message: impl Into<String>) -> OpenAiError {
        OpenAiError {
            param: Some(param),
            ..OpenAiError::new(StatusCode::BAD_REQUEST, message, "invalid_request_error")
        }
    }
}

impl OpenAiError {
    /// An error the rest of the server answered with `status`.
    fn from_status(status: StatusCode, message: impl Into<String>) -> OpenAiError {
        let kind = if status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        OpenAiError::new(status, message, kind)
    }
}

impl From<Error> for OpenAiError {
    fn from(error: Error) -> OpenAiError {
        OpenAiError::from_status(super::status(&error), error.message())
    }
}

impl From<super::HttpError> for OpenAiError {
    fn from(error: super::HttpError) -> OpenAiError {
        OpenAiError::from_status(error.status(), error.message)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": Value::Null,
        }});
        (self.status, Json(body)).into_response()
    }
}

/// `GET /health` (vLLM's probe): 200 while the server runs.
async fn live(State(state): State<Arc<AppState>>) -> StatusCode {
    if state.engine.is_live() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// `GET /health/ready` (Triton's OpenAI frontend): 200 while the server is ready, else 503.
async fn ready(State(state): State<Arc<AppState>>) -> StatusCode {
    if state.engine.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An answer's id, unique in the process: `<prefix>-<start time><counter>` in hex.
fn completion_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    format!(
        "{prefix}-{start:x}{:08x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn model_object(name: &str) -> Value {
    json!({"id": name, "object": "model", "created": now_secs(), "owned_by": "kiln"})
}

/// Whether model `name` serves on this API: it generates text or makes embeddings of text.
fn serves(engine: &Engine, name: &str) -> bool {
    engine.target(name, "").is_ok_and(|target| {
        target.answers() == Answers::Generation
            || target.takes_llm_tensors()
            || target.makes_embeddings()
    })
}

/// The models that serve on this API.
fn openai_models(engine: &Engine) -> Vec<String> {
    let mut names: Vec<String> = engine
        .repository_index(true)
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    names.dedup();
    names.retain(|name| serves(engine, name));
    names
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = openai_models(&state.engine)
        .iter()
        .map(|name| model_object(name))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    if serves(&state.engine, &name) {
        Json(model_object(&name)).into_response()
    } else {
        OpenAiError::new(
            StatusCode::NOT_FOUND,
            format!("The model `{name}` does not exist or serves no OpenAI endpoint."),
            "invalid_request_error",
        )
        .into_response()
    }
}

/// A request body: a JSON object.
fn read_object(body: &[u8]) -> Result<Map<String, Value>, OpenAiError> {
    let document = super::json::bounded_value(body, super::json::MAX_TREE_BYTES).map_err(|e| {
        OpenAiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {e}"),
            "invalid_request_error",
        )
    })?;
    match document {
        Value::Object(fields) => Ok(fields),
        _ => Err(OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
            "invalid_request_error",
        )),
    }
}

/// A request's `model`.
fn read_model(fields: &Map<String, Value>) -> Result<String, OpenAiError> {
    match fields.get("model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model.clone()),
        _ => Err(OpenAiError::invalid("model", "'model' must name a model")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique() {
        assert_ne!(completion_id("cmpl"), completion_id("cmpl"));
        assert!(completion_id("cmpl").starts_with("cmpl-"));
    }

    #[test]
    fn bodies_are_json_objects_naming_a_model() {
        assert!(read_object(b"[]").is_err() && read_object(b"{").is_err());
        let fields = read_object(br#"{"model": ""}"#).unwrap();
        assert_eq!(read_model(&fields).unwrap_err().param, Some("model"));
        let fields = read_object(br#"{"model": "m"}"#).unwrap();
        assert_eq!(read_model(&fields).unwrap(), "m");
    }
}
