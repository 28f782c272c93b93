//! The status page and the API's documentation page, served by the REST listener unless
//! `--console=false`:
//!
//! - `GET /console`: one HTML page (no build step, no dependency, embedded): the server's name,
//!   version and uptime, every model with its versions, states and failure reasons, and per
//!   serving version the request rate, latency percentiles and queue time, refreshed every
//!   second from `GET /console/status`; and a "try it" form that sends an inference (JSON
//!   tensors through REST, or through gRPC-Web when the gRPC listener serves it; text to
//!   `generate_stream` for generation and decoupled models, tokens shown as they come).
//! - `GET /console/docs`: the OpenAPI document (`/v2/openapi.json`) rendered by a small
//!   hand-written page, so that nothing is fetched from a CDN and the binary grows by kilobytes.
//! - `GET /console/status`: what the status page shows, as JSON (the Statistics API group, and as
//!   it holds the repository index, the ModelRepository group too: a restriction of either
//!   restricts it).
//!
//! Both pages carry a strict Content-Security-Policy (`content_security_policy`): their one
//! inline script and one inline style run by hash, nothing else loads, so no style or event
//! handler attributes in them.
//!
//! The pages call the REST API like any other client: access restrictions and the bearer token
//! apply to them (the page sends a token typed into it).

use super::route_table::Routes;
use super::routes::Shared;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::OnceLock;

const STATUS_PAGE: &str = include_str!("assets/console.html");
const DOCS_PAGE: &str = include_str!("assets/docs.html");
static STATUS_POLICY: OnceLock<String> = OnceLock::new();
static DOCS_POLICY: OnceLock<String> = OnceLock::new();

pub fn routes() -> Routes<Shared> {
    Routes::new()
        .get("/console", || async { html(STATUS_PAGE, &STATUS_POLICY) })
        .get("/console/docs", || async { html(DOCS_PAGE, &DOCS_POLICY) })
        .get("/console/status", status)
}

fn html(page: &'static str, policy: &'static OnceLock<String>) -> impl IntoResponse {
    let policy = policy.get_or_init(|| content_security_policy(page));
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The pages hold no secret, but nothing else should frame them.
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, policy.as_str()),
        ],
        page,
    )
}

/// A page's Content-Security-Policy: nothing loads but its own inline script and style (allowed
/// by their SHA-256, so that no injected markup runs), no frame, form or base. The status page's
/// "try it" form may send gRPC-Web to the URL typed into it, another origin (the gRPC port):
/// `connect-src` allows the server's own origin and any http(s) one.
pub fn content_security_policy(page: &str) -> String {
    let hash = |tag: &str| {
        let open = format!("<{tag}>");
        let start = page.find(&open).map_or(0, |at| at + open.len());
        let end = page[start..]
            .find(&format!("</{tag}>"))
            .map_or(start, |at| start + at);
        let digest = ring::digest::digest(&ring::digest::SHA256, &page.as_bytes()[start..end]);
        format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        )
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self' http: https:; \
         img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash("script"),
        hash("style")
    )
}

/// `GET /console/status`: the server, then each model version the repository knows with its
/// state and, while it serves, its statistics and latency histograms.
async fn status(State(state): State<Shared>) -> Json<Value> {
    let engine = &state.engine;
    let metadata = engine.server_metadata();
    // Statistics of every serving version; unknown or unserved versions simply have none.
    let mut statistics: HashMap<(String, String), Value> = engine
        .model_statistics("", "")
        .unwrap_or_default()
        .iter()
        .map(|stats| {
            let key = (stats.name.clone(), stats.version.clone());
            (
                key,
                crate::proto::to_json(stats, "inference.ModelStatistics"),
            )
        })
        .collect();
    let mut latencies: HashMap<(String, String), _> = engine
        .latencies()
        .into_iter()
        .map(|l| ((l.model.clone(), l.version.clone()), l))
        .collect();
    let models: Vec<Value> = engine
        .repository_index(false)
        .into_iter()
        .map(|entry| {
            let key = (entry.name.clone(), entry.version.clone());
            let mut model = Map::new();
            model.insert("name".into(), entry.name.into());
            model.insert("version".into(), entry.version.into());
            model.insert("state".into(), entry.state.into());
            model.insert("reason".into(), entry.reason.into());
            if let Some(stats) = statistics.remove(&key) {
                model.insert("statistics".into(), stats);
            }
            if let Some(histograms) = latencies.remove(&key) {
                model.insert("request_latency".into(), json!(histograms.request.counts()));
                model.insert("queue_latency".into(), json!(histograms.queue.counts()));
            }
            Value::Object(model)
        })
        .collect();
    Json(json!({
        "name": metadata.name,
        "version": metadata.version,
        "ready": engine.is_ready(),
        "uptime_s": engine.uptime().as_secs_f64(),
        "latency_bounds_us": crate::metrics::latency::BOUNDS_US.to_vec(),
        "models": models,
    }))
}
