//! Google Vertex AI's serving contract, as Triton serves it with `--allow-vertex-ai=true` (its own
//! listener, `--vertex-ai-port`, by default `AIP_HTTP_PORT` or 8080):
//!
//! - `GET $AIP_HEALTH_ROUTE`: the server's readiness (200, or 400 with Triton's body).
//! - `POST $AIP_PREDICT_ROUTE`: an inference request on the default model (`--vertex-ai-default-
//!   model`, or the one model served), the body as `/v2/models/{m}/infer` takes it; binary tensor
//!   data under the content type `application/vnd.vertex-ai-triton.binary+json;json-header-size=
//!   <n>`, both ways. With the header `X-Vertex-Ai-Triton-Redirect: <path>` the request goes to
//!   that REST endpoint of the server instead (`v2/models/m/infer`, `v2/models/m/config`,
//!   `v2/repository/index`, ...), with the method that endpoint takes: Vertex AI only sends POST.
//!   `X-Vertex-Ai-Triton-Redirect: metrics` answers the Prometheus metrics (when the server
//!   publishes them).
//!
//! Errors keep the REST API's status codes, as in Triton. Both routes are required, as Triton
//! requires them.

use super::infer;
use super::routes::AppState;
use super::sagemaker::{binary_header, binary_response, default_model};
use super::{HttpConfig, HttpError};
use crate::engine::Engine;
use crate::protocol::access::http::refusal;
use crate::protocol::access::ApiGroup;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;

/// Vertex AI's content type of a body with binary tensor data, before the JSON's length.
const BINARY_MIME: &str = "application/vnd.vertex-ai-triton.binary+json;json-header-size=";

/// The header that sends a prediction request to another REST endpoint.
const REDIRECT: &str = "x-vertex-ai-triton-redirect";

/// The Vertex AI settings: routes from the environment Vertex AI sets, the default model from
/// the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VertexConfig {
    /// `AIP_PREDICT_ROUTE`.
    pub predict_route: String,
    /// `AIP_HEALTH_ROUTE`.
    pub health_route: String,
    /// `--vertex-ai-default-model`.
    pub model: Option<String>,
}

impl VertexConfig {
    /// Reads the routes through `var` (the process environment in `main`).
    ///
    /// # Errors
    /// Triton's messages for a route that is not set.
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
        model: Option<String>,
    ) -> Result<VertexConfig, String> {
        let route = |name: &str, what: &str| {
            var(name)
                .filter(|route| route.starts_with('/'))
                .ok_or_else(|| format!("{what} is not defined for Vertex AI endpoint"))
        };
        Ok(VertexConfig {
            predict_route: route("AIP_PREDICT_ROUTE", "API_PREDICT_ROUTE")?,
            health_route: route("AIP_HEALTH_ROUTE", "AIP_HEALTH_ROUTE")?,
            model: model.filter(|m| !m.is_empty()),
        })
    }
}

struct VertexState {
    app: Arc<AppState>,
    /// The server's REST API, where redirected requests go.
    rest: Router,
    /// The metrics a `metrics` redirect renders (`None` with `--allow-metrics=false`).
    metrics: Option<PrometheusHandle>,
    model: Option<String>,
}

/// The Vertex AI router over `engine`; `rest` is the server's REST router, `metrics` what a
/// `metrics` redirect renders.
pub fn router(
    engine: Arc<Engine>,
    http: HttpConfig,
    rest: Router,
    metrics: Option<PrometheusHandle>,
    config: VertexConfig,
) -> Router {
    let access = Arc::clone(&http.access);
    let state = Arc::new(VertexState {
        app: Arc::new(AppState {
            engine,
            config: http,
        }),
        rest,
        metrics,
        model: config.model,
    });
    Router::new()
        .route(&config.health_route, get(health))
        .route(&config.predict_route, post(predict))
        .method_not_allowed_fallback(|| async {
            HttpError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        })
        .fallback(|| async { HttpError::new(StatusCode::BAD_REQUEST, "Bad Request") })
        .layer(axum::middleware::from_fn_with_state(
            access,
            crate::protocol::access::http::guard_browsers,
        ))
        .with_state(state)
}

/// The access policy's refusal for `group`, if it refuses (redirected requests meet the REST
/// API's own check).
fn refused(state: &VertexState, group: ApiGroup, headers: &HeaderMap) -> Option<Response> {
    state
        .app
        .config
        .access
        .check(group, headers)
        .err()
        .map(|denied| refusal(&denied))
}

async fn health(State(state): State<Arc<VertexState>>, headers: HeaderMap) -> Response {
    if let Some(refusal) = refused(&state, ApiGroup::Health, &headers) {
        return refusal;
    }
    let ready = state.app.engine.is_ready();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    (status, axum::Json(serde_json::json!({ "ready": ready }))).into_response()
}

async fn predict(State(state): State<Arc<VertexState>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    if let Err(error) = binary_header(&mut parts.headers, BINARY_MIME) {
        return error.into_response();
    }
    let redirect = parts
        .headers
        .get(REDIRECT)
        .and_then(|value| value.to_str().ok())
        .map(|path| format!("/{}", path.trim_start_matches('/')));
    let response = match redirect {
        None => {
            if let Some(refusal) = refused(&state, ApiGroup::Inference, &parts.headers) {
                return refusal;
            }
            let model = match default_model(
                &state.app.engine,
                state.model.as_deref(),
                "--vertex-ai-default-model",
            ) {
                Ok(model) => model,
                Err(error) => return error.into_response(),
            };
            infer::handle(State(Arc::clone(&state.app)), model, parts.headers, body).await
        }
        Some(path) if path == "/metrics" => {
            return match &state.metrics {
                Some(handle) => (
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    crate::metrics::render(handle),
                )
                    .into_response(),
                None => HttpError::new(
                    StatusCode::BAD_REQUEST,
                    "metrics are not published (--allow-metrics=false)",
                )
                .into_response(),
            };
        }
        Some(path) => {
            let Ok(uri) = path.parse::<Uri>() else {
                return HttpError::new(StatusCode::BAD_REQUEST, format!("bad redirect '{path}'"))
                    .into_response();
            };
            parts.method = redirect_method(uri.path());
            parts.uri = uri;
            let request = Request::from_parts(parts, body);
            let mut rest = state.rest.clone();
            // An axum router is always ready; its error type is uninhabited.
            let ready = std::future::poll_fn(|cx| {
                tower_service::Service::<Request>::poll_ready(&mut rest, cx)
            });
            match ready.await {
                Ok(()) => match tower_service::Service::call(&mut rest, request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                },
                Err(never) => match never {},
            }
        }
    };
    binary_response(response, BINARY_MIME)
}

/// The method the REST endpoint at `path` takes: reads are GET, everything else POST (as
/// Triton's Vertex AI service rewrites them).
fn redirect_method(path: &str) -> Method {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let read = match segments.as_slice() {
        ["", "v2"] | ["", "v2", "health", ..] | ["", "v2", "models", "stats"] => true,
        ["", "v2", "systemsharedmemory" | "cudasharedmemory", .., "status"] => true,
        ["", "v2", "models", _model, rest @ ..] => {
            let rest = match rest {
                ["versions", _, rest @ ..] => rest,
                rest => rest,
            };
            matches!(rest, [] | ["ready"] | ["config"] | ["stats"])
        }
        _ => false,
    };
    if read {
        Method::GET
    } else {
        Method::POST
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_routes_must_be_set() {
        let env = |name: &str| match name {
            "AIP_PREDICT_ROUTE" => Some("/predict".to_string()),
            "AIP_HEALTH_ROUTE" => Some("/health".to_string()),
            _ => None,
        };
        let config = VertexConfig::from_env(env, Some("add_sub".into())).unwrap();
        assert_eq!(config.predict_route, "/predict");
        assert_eq!(config.model.as_deref(), Some("add_sub"));
        let error = VertexConfig::from_env(|_| None, None).unwrap_err();
        assert_eq!(
            error,
            "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"
        );
        let error = VertexConfig::from_env(
            |name| (name == "AIP_PREDICT_ROUTE").then(|| "/p".to_string()),
            None,
        )
        .unwrap_err();
        assert_eq!(
            error,
            "AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint"
        );
    }

    #[test]
    fn redirected_reads_become_get_and_the_rest_stay_post() {
        for path in [
            "/v2",
            "/v2/health/ready",
            "/v2/models/stats",
            "/v2/models/m",
            "/v2/models/m/versions/1/config",
            "/v2/models/m/ready",
            "/v2/systemsharedmemory/status",
            "/v2/systemsharedmemory/region/r/status",
        ] {
            assert_eq!(redirect_method(path), Method::GET, "{path}");
        }
        for path in [
            "/v2/models/m/infer",
            "/v2/models/m/versions/2/infer",
            "/v2/repository/index",
            "/v2/repository/models/m/load",
            "/v2/systemsharedmemory/region/r/register",
        ] {
            assert_eq!(redirect_method(path), Method::POST, "{path}");
        }
    }
}
