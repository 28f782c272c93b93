//! What a stub tells the server besides its answers: changes to the model's custom metrics
//! (`pb_utils.MetricFamily`) and its log lines (`pb_utils.Logger`).

use serde_json::Value;

/// Applies a model's change to one of its custom metrics (`pb_utils.MetricFamily`); what the
/// registry refuses is logged (the model has been told already when it could know).
pub(super) fn metric(owner: &crate::metrics::custom::Owner, model: &str, header: &Value) {
    use crate::metrics::custom::{apply, Change, Kind};
    let text = |key: &str| header[key].as_str().unwrap_or_default();
    let kind = match text("kind") {
        "counter" => Kind::Counter,
        "histogram" => Kind::Histogram,
        _ => Kind::Gauge,
    };
    let value = header["value"].as_f64().unwrap_or(f64::NAN);
    let change = match text("action") {
        "increment" => Change::Increment(value),
        "set" => Change::Set(value),
        "observe" => Change::Observe(value),
        "delete" => Change::Delete,
        _ => Change::Create {
            buckets: header["buckets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|bound| bound.as_f64().unwrap_or(f64::NAN))
                .collect(),
        },
    };
    let labels: Vec<(String, String)> = header["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            (key.clone(), value)
        })
        .collect();
    if let Err(why) = apply(
        owner,
        text("name"),
        text("description"),
        kind,
        &labels,
        &change,
    ) {
        tracing::warn!(model, "custom metric not changed: {why}");
    }
}

/// A stub's `log` message, in kiln's log.
pub(super) fn log_line(model: &str, instance: &str, header: &Value) {
    let text = header["message"].as_str().unwrap_or("");
    match header["level"].as_i64() {
        Some(1) => tracing::warn!(model, instance, "{text}"),
        Some(2) => tracing::error!(model, instance, "{text}"),
        Some(3) => tracing::debug!(model, instance, "{text}"),
        _ => tracing::info!(model, instance, "{text}"),
    }
}
