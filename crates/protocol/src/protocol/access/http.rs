//! The access policy on REST: axum middleware in front of every route that maps the path to
//! Triton's API group and refuses before the handler (and before any body is read). Triton
//! answers a restricted API with 403 `{"error":"This API is restricted, expecting header '...'"}`;
//! a missing or wrong bearer token is 401 with `WWW-Authenticate: Bearer`; a web page refused by
//! the browser policy (another origin, an untrusted Host) is 403.

use super::{AccessPolicy, ApiGroup, Denied};
use crate::protocol::http::HttpError;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Triton's group of a REST path; `None` for paths outside the API (they answer 404 anyway).
pub fn group_of(path: &str) -> Option<ApiGroup> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match segments.as_slice() {
        ["", "v2"] => Some(ApiGroup::Metadata),
        // The API's own description, and the status page's data (`--console`).
        ["", "v2", "openapi.json"] => Some(ApiGroup::Metadata),
        ["", "console", "status"] => Some(ApiGroup::Statistics),
        ["", "v2", "health", ..] => Some(ApiGroup::Health),
        ["", "v2", "repository", ..] => Some(ApiGroup::ModelRepository),
        ["", "v2", "systemsharedmemory" | "cudasharedmemory", ..] => Some(ApiGroup::SharedMemory),
        ["", "v2", "trace", ..] => Some(ApiGroup::Trace),
        ["", "v2", "logging", ..] => Some(ApiGroup::Logging),
        ["", "v2", "models", "stats"] => Some(ApiGroup::Statistics),
        ["", "v2", "models", _model, rest @ ..] => Some(model_group(rest)),
        // SageMaker's service (`--allow-sagemaker`).
        ["", "ping"] => Some(ApiGroup::Health),
        ["", "invocations"] => Some(ApiGroup::Inference),
        ["", "models", _hash, "invoke"] => Some(ApiGroup::Inference),
        // The OpenAI-compatible API (`--openai-port`).
        ["", "health", ..] => Some(ApiGroup::Health),
        ["", "v1", "models", ..] => Some(ApiGroup::Metadata),
        ["", "v1", "completions" | "chat" | "embeddings", ..] => Some(ApiGroup::Inference),
        ["", "models", ..] => Some(ApiGroup::ModelRepository),
        _ => None,
    }
}

/// The group of `/v2/models/<model>[/versions/<v>]/<rest>`.
fn model_group(rest: &[&str]) -> ApiGroup {
    let rest = match rest {
        ["versions", _version, rest @ ..] => rest,
        rest => rest,
    };
    match rest {
        [] => ApiGroup::Metadata,
        ["ready"] => ApiGroup::Health,
        ["config"] => ApiGroup::ModelConfig,
        ["stats"] => ApiGroup::Statistics,
        ["trace", ..] => ApiGroup::Trace,
        // infer, generate, generate_stream, and anything unknown: the strictest common choice.
        _ => ApiGroup::Inference,
    }
}

/// The refusal as a REST answer.
pub fn refusal(denied: &Denied) -> Response {
    match denied {
        Denied::Restricted { .. } => {
            HttpError::new(StatusCode::FORBIDDEN, denied.message("API")).into_response()
        }
        Denied::Unauthenticated => HttpError::new(StatusCode::UNAUTHORIZED, denied.message("API"))
            .with_header(header::WWW_AUTHENTICATE, "Bearer")
            .into_response(),
        Denied::Host { .. } | Denied::UntrustedHost { .. } | Denied::CrossOrigin { .. } => {
            HttpError::new(StatusCode::FORBIDDEN, denied.message("API")).into_response()
        }
    }
}

/// The browser check alone (the Vertex AI listener, whose routes check their groups
/// themselves): `axum::middleware::from_fn_with_state(policy, guard_browsers)`.
pub async fn guard_browsers(
    State(policy): State<Arc<AccessPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(denied) = browser_check(&policy, &request) {
        return refusal(&denied);
    }
    next.run(request).await
}

fn browser_check(policy: &AccessPolicy, request: &Request) -> Result<(), Denied> {
    let authority = request.uri().authority().map(|a| a.as_str());
    policy.check_browser(request.method(), authority, request.headers())
}

/// The middleware (`axum::middleware::from_fn_with_state(policy, enforce)`).
pub async fn enforce(
    State(policy): State<Arc<AccessPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(denied) = browser_check(&policy, &request) {
        return refusal(&denied);
    }
    let path = request.uri().path();
    for group in [group_of(path), also_of(path)].into_iter().flatten() {
        if let Err(denied) = policy.check(group, request.headers()) {
            return refusal(&denied);
        }
    }
    next.run(request).await
}

/// The group a path needs besides its own: the status page's data (`/console/status`) holds the
/// repository index too (every model, its state and its failure text), so a restricted
/// model-repository API restricts it as well.
pub fn also_of(path: &str) -> Option<ApiGroup> {
    (path.trim_end_matches('/') == "/console/status").then_some(ApiGroup::ModelRepository)
}
