//! Every REST endpoint of KServe v2 and Triton (WIRE.md §e.1), and the small handlers: health,
//! metadata, readiness, config, statistics, repository index; system shared memory is in
//! `shared_memory`; log and trace settings in `settings`.
//! `/v2/models/stats` is a static route, so it wins over `/v2/models/{model}`. Unknown paths get
//! Triton's 404 `{"error":"Not Found"}`, wrong methods 405 `{"error":"Method Not Allowed"}`.

use super::route_table::Routes;
use super::{
    body, console, generate, infer, openapi, settings, shared_memory, HttpConfig, HttpError,
};
use crate::core::Error;
use crate::engine::{Engine, LoadParameter, TensorMetadata};
use crate::invalid_arg;
use crate::repository::config::config_to_json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::{request::Parts, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What every handler shares.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub config: HttpConfig,
}

pub(super) type Shared = Arc<AppState>;

/// The REST router over `engine`.
pub fn router(engine: Arc<Engine>, config: HttpConfig) -> Router {
    routes(config.console)
        .into_router()
        .method_not_allowed_fallback(|| async {
            HttpError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        })
        .fallback(|| async { HttpError::not_found() })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&config.access),
            crate::protocol::access::http::enforce,
        ))
        .with_state(Arc::new(AppState { engine, config }))
}

/// Every REST route, the status page's with `console`; the OpenAPI document lists the same
/// (checked in `openapi`'s tests).
pub fn routes(console: bool) -> Routes<Shared> {
    let mut routes = Routes::new()
        .get("/v2", server_metadata)
        .get("/v2/health/live", live)
        .get("/v2/health/ready", ready)
        .get("/v2/models/stats", all_statistics)
        .post("/v2/repository/index", repository_index)
        .post("/v2/repository/{repository}/index", repository_name)
        .post("/v2/repository/models/{model}/load", load)
        .post("/v2/repository/models/{model}/unload", unload)
        .post(
            "/v2/repository/{repository}/models/{model}/load",
            repository_name,
        )
        .post(
            "/v2/repository/{repository}/models/{model}/unload",
            repository_name,
        )
        .get("/v2/trace/setting", settings::get_global_trace)
        .post("/v2/trace/setting", settings::post_global_trace)
        .get("/v2/logging", settings::get_log)
        .post("/v2/logging", settings::post_log);
    for prefix in [
        "/v2/models/{model}",
        "/v2/models/{model}/versions/{version}",
    ] {
        routes = routes
            .get(prefix, model_metadata)
            .get(&format!("{prefix}/ready"), model_ready)
            .get(&format!("{prefix}/config"), model_config)
            .post(&format!("{prefix}/infer"), infer::handle)
            .get(&format!("{prefix}/stats"), model_statistics)
            .post(&format!("{prefix}/generate"), generate::handle)
            .post(
                &format!("{prefix}/generate_stream"),
                generate::handle_stream,
            );
    }
    routes = routes
        .get(
            "/v2/models/{model}/trace/setting",
            settings::get_model_trace,
        )
        .post(
            "/v2/models/{model}/trace/setting",
            settings::post_model_trace,
        )
        .merge(shared_memory::routes())
        .merge(openapi::routes());
    if console {
        routes = routes.merge(console::routes());
    }
    routes
}

/// The model name and version of a `/v2/models/{model}[/versions/{version}]` path. Versions are
/// decimal digits, as in Triton's route pattern: anything else is an unknown path.
pub struct ModelPath {
    pub name: String,
    /// Empty when the path names no version.
    pub version: String,
}

impl<S: Send + Sync> FromRequestParts<S> for ModelPath {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(mut params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(bad_path)?;
        let name = params.remove("model").unwrap_or_default();
        let version = params.remove("version").unwrap_or_default();
        if !version.bytes().all(|b| b.is_ascii_digit()) {
            return Err(HttpError::not_found());
        }
        Ok(ModelPath { name, version })
    }
}

/// The one name a route's path holds (`{model}` of the repository routes, `{region}` of the
/// shared-memory ones).
pub struct PathName(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathName {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(bad_path)?;
        Ok(PathName(name))
    }
}

/// A path that does not decode: INVALID_ARGUMENT with axum's reason.
fn bad_path(rejection: PathRejection) -> HttpError {
    HttpError::from(Error::InvalidArgument(rejection.body_text()))
}

/// `{"live": true}` with 200, or `{"live": false}` with 400 (Triton's code; KServe's client
/// reads the body).
async fn live(State(state): State<Shared>) -> Response {
    let live = state.engine.is_live();
    health(live, json!({ "live": live }))
}

async fn ready(State(state): State<Shared>) -> Response {
    let ready = state.engine.is_ready();
    health(ready, json!({ "ready": ready }))
}

fn health(ok: bool, body: Value) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    (status, Json(body)).into_response()
}

async fn server_metadata(State(state): State<Shared>) -> Json<Value> {
    let metadata = state.engine.server_metadata();
    Json(json!({
        "name": metadata.name,
        "version": metadata.version,
        "extensions": metadata.extensions,
    }))
}

async fn model_metadata(
    State(state): State<Shared>,
    model: ModelPath,
) -> Result<Json<Value>, HttpError> {
    let metadata = state
        .engine
        .model_metadata(&model.name, &model.version)
        .await?;
    let tensors = |list: Vec<TensorMetadata>| -> Vec<Value> {
        list.into_iter()
            .map(|t| json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape }))
            .collect()
    };
    Ok(Json(json!({
        "name": metadata.name,
        "versions": metadata.versions,
        "platform": metadata.platform,
        "inputs": tensors(metadata.inputs),
        "outputs": tensors(metadata.outputs),
    })))
}

/// 200 with an empty body when ready; otherwise, as Triton's HTTP front end, 400 "Model version
/// not ready" (unknown models and versions included: readiness never fails in the engine).
async fn model_ready(State(state): State<Shared>, model: ModelPath) -> Response {
    if state.engine.model_ready(&model.name, &model.version) {
        StatusCode::OK.into_response()
    } else {
        HttpError::from(invalid_arg!("Model version not ready")).into_response()
    }
}

/// The effective config as Triton's protobuf JSON (the config itself, not wrapped).
async fn model_config(
    State(state): State<Shared>,
    model: ModelPath,
) -> Result<Json<Value>, HttpError> {
    let config = state
        .engine
        .model_config(&model.name, &model.version)
        .await?;
    Ok(Json(config_to_json(&config)))
}

/// `GET /v2/models/stats`: Triton's statistics of every serving model version.
async fn all_statistics(State(state): State<Shared>) -> Result<Json<Value>, HttpError> {
    statistics(&state, "", "")
}

/// `GET /v2/models/{m}[/versions/{v}]/stats`.
async fn model_statistics(
    State(state): State<Shared>,
    model: ModelPath,
) -> Result<Json<Value>, HttpError> {
    statistics(&state, &model.name, &model.version)
}

/// `{"model_stats": [...]}`, each entry the protobuf JSON of Triton's `ModelStatistics`, as
/// Triton's REST API answers (the same numbers the gRPC `ModelStatistics` returns).
fn statistics(state: &AppState, name: &str, version: &str) -> Result<Json<Value>, HttpError> {
    let stats = state.engine.model_statistics(name, version)?;
    let model_stats: Vec<Value> = stats.iter().map(statistics_json).collect();
    Ok(Json(json!({ "model_stats": model_stats })))
}

/// One version's statistics in the order Triton writes them: its server builds this JSON by
/// hand, with `response_stats` right after `inference_stats` (the .proto declares it last).
fn statistics_json(stats: &crate::proto::inference::ModelStatistics) -> Value {
    let mut json = crate::proto::to_json(stats, "inference.ModelStatistics");
    if let Value::Object(fields) = &mut json {
        let response = fields.shift_remove("response_stats");
        let at = fields.keys().position(|key| key == "batch_stats");
        if let (Some(response), Some(at)) = (response, at) {
            fields.shift_insert(at, "response_stats".to_string(), response);
        }
    }
    json
}

/// `POST /v2/repository/index` with an optional `{"ready": bool}` body; answers a JSON array.
async fn repository_index(
    State(state): State<Shared>,
    headers: HeaderMap,
    request: Body,
) -> Result<Json<Value>, HttpError> {
    let request = body::read(request, &headers, &state.config).await?;
    let ready = if request.iter().all(u8::is_ascii_whitespace) {
        false
    } else {
        // Read as Triton reads it, whatever its depth or size (qa/L0_http
        // test_repository_index_deeply_nested_json: 250,000 levels under "ready"), without
        // building a tree past the reader's depth: only "ready" is looked at.
        let document = super::json::parse(&request, None).map_err(|e| {
            HttpError::from(Error::InvalidArgument(format!(
                "failed to parse the request JSON buffer: {e}"
            )))
        })?;
        match document.get("ready") {
            None => false,
            Some(super::json::Value::Bool(ready)) => *ready,
            // Triton main's text and code (server src/http_server.cc, HandleRepositoryIndex).
            Some(_) => {
                return Err(HttpError::from(Error::InvalidArgument(
                    "Invalid value for 'ready': expected a boolean".into(),
                )))
            }
        }
    };
    let entries = state
        .engine
        .repository_index(ready)
        .into_iter()
        .map(|entry| {
            // As Triton: `reason` accompanies every state, even empty (MLServer's
            // RepositoryIndexResponseItem requires it); a failed model has no version.
            let mut object = serde_json::Map::new();
            object.insert("name".into(), entry.name.into());
            if !entry.version.is_empty() {
                object.insert("version".into(), entry.version.into());
            }
            if !entry.state.is_empty() {
                object.insert("state".into(), entry.state.into());
                object.insert("reason".into(), entry.reason.into());
            }
            Value::Object(object)
        })
        .collect();
    Ok(Json(Value::Array(entries)))
}

/// `POST /v2/repository/models/{model}/load` with an optional `{"parameters": {...}}` body:
/// `config` (a JSON config as a string) and `file:<path>` (base64 file contents). 200 with an
/// empty body once the model serves.
async fn load(
    State(state): State<Shared>,
    PathName(model): PathName,
    headers: HeaderMap,
    request: Body,
) -> Result<StatusCode, HttpError> {
    let parameters = repository_parameters(&state, &headers, request).await?;
    state.engine.load_model(&model, parameters).await?;
    Ok(StatusCode::OK)
}

/// `POST /v2/repository/models/{model}/unload` with an optional `{"parameters":
/// {"unload_dependents": bool}}` body.
async fn unload(
    State(state): State<Shared>,
    PathName(model): PathName,
    headers: HeaderMap,
    request: Body,
) -> Result<StatusCode, HttpError> {
    let parameters = repository_parameters(&state, &headers, request).await?;
    let dependents = matches!(
        parameters.get("unload_dependents"),
        Some(LoadParameter::Bool(true))
    );
    state.engine.unload_model(&model, dependents).await?;
    Ok(StatusCode::OK)
}

/// The `parameters` object of a load or unload body (an empty body has none). `file:` values
/// are base64 strings, decoded here so the engine sees the bytes gRPC would carry.
async fn repository_parameters(
    state: &AppState,
    headers: &HeaderMap,
    request: Body,
) -> Result<BTreeMap<String, LoadParameter>, HttpError> {
    let request = body::read(request, headers, &state.config).await?;
    let bad = |message: String| HttpError::from(Error::InvalidArgument(message));
    if request.iter().all(u8::is_ascii_whitespace) {
        return Ok(BTreeMap::new());
    }
    let doc = super::json::document(&request)?;
    let parameters = match doc.get("parameters") {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(parameters)) => parameters,
        Some(_) => return Err(bad("'parameters' must be a JSON object".into())),
    };
    let mut decoded = BTreeMap::new();
    for (key, value) in parameters {
        let parameter = match value {
            Value::String(text) if key.starts_with("file:") => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| {
                        bad(format!(
                            "failed to decode base64 for parameter '{key}': {e}"
                        ))
                    })?;
                LoadParameter::Bytes(bytes.into())
            }
            Value::String(text) => LoadParameter::String(text.clone()),
            Value::Bool(flag) => LoadParameter::Bool(*flag),
            Value::Number(n) => match n.as_i64() {
                Some(n) => LoadParameter::Int64(n),
                None => return Err(bad(format!("parameter '{key}' must be an integer"))),
            },
            _ => return Err(bad(format!("parameter '{key}' has an unsupported type"))),
        };
        decoded.insert(key.clone(), parameter);
    }
    Ok(decoded)
}

async fn repository_name() -> HttpError {
    HttpError::from(Error::Unsupported(
        "'repository_name' specification is not supported".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_keep_tritons_field_order() {
        let stats = crate::metrics::ModelStats::new("m", 1).snapshot();
        let json = statistics_json(&stats);
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "name",
                "version",
                "last_inference",
                "inference_count",
                "execution_count",
                "inference_stats",
                "response_stats",
                "batch_stats",
                "memory_usage"
            ]
        );
        let inference: Vec<&str> = json["inference_stats"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(inference[..3], ["success", "fail", "queue"]);
    }
}
