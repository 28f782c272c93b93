//! Triton's system shared-memory routes: `GET /v2/systemsharedmemory[/region/{name}]/status`,
//! `POST /v2/systemsharedmemory/region/{name}/register` with `{"key", "offset", "byte_size"}`,
//! and `POST /v2/systemsharedmemory[/region/{name}]/unregister`. The registry is the engine's
//! (see `engine::shared_memory`); gRPC serves the same one. The `/v2/cudasharedmemory` routes
//! answer as Triton without GPUs does: no regions, registration refused. Without
//! `--allow-client-shm=true`, registering and unregistering either kind are refused (501).

use super::route_table::Routes;
use super::routes::{AppState, PathName};
use super::{body, HttpError};
use crate::core::Error;
use crate::engine::shared_memory;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

type Shared = Arc<AppState>;

/// The system and CUDA shared-memory routes, for the REST router to merge.
pub fn routes() -> Routes<Shared> {
    let region = "/v2/systemsharedmemory/region/{region}";
    let cuda_region = "/v2/cudasharedmemory/region/{region}";
    Routes::new()
        .get("/v2/systemsharedmemory/status", status_all)
        .get(&format!("{region}/status"), status_region)
        .post(&format!("{region}/register"), register)
        .post("/v2/systemsharedmemory/unregister", unregister_all)
        .post(&format!("{region}/unregister"), unregister_region)
        .get("/v2/cudasharedmemory/status", cuda_status_all)
        .get(&format!("{cuda_region}/status"), cuda_status_region)
        .post(&format!("{cuda_region}/register"), cuda_register)
        .post("/v2/cudasharedmemory/unregister", cuda_unregister)
        .post(&format!("{cuda_region}/unregister"), cuda_unregister)
}

/// Every region: `[{"name", "key", "offset", "byte_size"}, ...]`.
async fn status_all(State(state): State<Shared>) -> Result<Json<Value>, HttpError> {
    status(&state, "")
}

/// The region named in the path, as a one-element array.
async fn status_region(
    State(state): State<Shared>,
    PathName(name): PathName,
) -> Result<Json<Value>, HttpError> {
    status(&state, &name)
}

fn status(state: &AppState, name: &str) -> Result<Json<Value>, HttpError> {
    let regions = state.engine.shared_memory().status(name)?;
    Ok(Json(Value::Array(
        regions
            .into_iter()
            .map(|r| {
                json!({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size})
            })
            .collect(),
    )))
}

/// Registers the region named in the path; 200 with an empty body. While client shared memory
/// is off the body is not read (Triton refuses first).
async fn register(
    State(state): State<Shared>,
    PathName(name): PathName,
    headers: HeaderMap,
    request: Body,
) -> Result<StatusCode, HttpError> {
    state.engine.shared_memory().check_allowed()?;
    let request = body::read(request, &headers, &state.config).await?;
    let (key, offset, byte_size) = register_body(&request)?;
    state
        .engine
        .shared_memory()
        .register(&name, &key, offset, byte_size)?;
    Ok(StatusCode::OK)
}

/// Unregisters every region; 200 with an empty body.
async fn unregister_all(State(state): State<Shared>) -> Result<StatusCode, HttpError> {
    state.engine.shared_memory().unregister("")?;
    Ok(StatusCode::OK)
}

/// Unregisters the region named in the path (not an error when there is none); 200.
async fn unregister_region(
    State(state): State<Shared>,
    PathName(name): PathName,
) -> Result<StatusCode, HttpError> {
    state.engine.shared_memory().unregister(&name)?;
    Ok(StatusCode::OK)
}

/// No CUDA region is ever registered: an empty list.
async fn cuda_status_all() -> Json<Value> {
    Json(Value::Array(Vec::new()))
}

/// NOT_FOUND for any name.
async fn cuda_status_region(PathName(name): PathName) -> Result<Json<Value>, HttpError> {
    shared_memory::cuda_status(&name)?;
    Ok(Json(Value::Array(Vec::new())))
}

/// Refused: kiln does not serve CUDA shared memory.
async fn cuda_register(State(state): State<Shared>, PathName(name): PathName) -> HttpError {
    state.engine.shared_memory().cuda_register(&name).into()
}

/// Nothing to unregister; 200 (501 while client shared memory is off).
async fn cuda_unregister(State(state): State<Shared>) -> Result<StatusCode, HttpError> {
    state.engine.shared_memory().cuda_unregister()?;
    Ok(StatusCode::OK)
}

/// `{"key": string, "offset": unsigned (default 0), "byte_size": unsigned}`.
fn register_body(request: &[u8]) -> Result<(String, u64, u64), Error> {
    let doc = super::json::document(request)?;
    // Triton's words for a field left out.
    let missing = |field: &str| {
        Error::InvalidArgument(format!(
            "Shared memory register request has no '{field}' field"
        ))
    };
    let key = doc
        .get("key")
        .ok_or_else(|| missing("key"))?
        .as_str()
        .ok_or_else(|| Error::InvalidArgument("Unable to parse 'key': expected a string".into()))?;
    let unsigned = |field: &str, default: Option<u64>| match doc.get(field) {
        None => default.ok_or_else(|| missing(field)),
        Some(value) => value.as_u64().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "Unable to parse '{field}': expected an unsigned integer"
            ))
        }),
    };
    Ok((
        key.to_string(),
        unsigned("offset", Some(0))?,
        unsigned("byte_size", None)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_bodies_need_a_key_and_a_size() {
        assert_eq!(
            register_body(br#"{"key": "/k", "offset": 8, "byte_size": 64}"#).unwrap(),
            ("/k".to_string(), 8, 64)
        );
        assert_eq!(
            register_body(br#"{"key": "/k", "byte_size": 64}"#).unwrap(),
            ("/k".to_string(), 0, 64)
        );
        for (body, message) in [
            (
                &br#"{"byte_size": 64}"#[..],
                "Shared memory register request has no 'key' field",
            ),
            (b"[1]", "Shared memory register request has no 'key' field"),
            (
                br#"{"key": 1, "byte_size": 64}"#,
                "Unable to parse 'key': expected a string",
            ),
            (
                br#"{"key": "/k"}"#,
                "Shared memory register request has no 'byte_size' field",
            ),
            (
                br#"{"key": "/k", "byte_size": -1}"#,
                "Unable to parse 'byte_size': expected an unsigned integer",
            ),
            (
                br#"{"key": "/k", "offset": "0", "byte_size": 1}"#,
                "Unable to parse 'offset': expected an unsigned integer",
            ),
        ] {
            assert_eq!(register_body(body).unwrap_err().message(), message);
        }
        assert!(register_body(b"{")
            .unwrap_err()
            .message()
            .starts_with("failed to parse the request JSON buffer"));
    }
}
