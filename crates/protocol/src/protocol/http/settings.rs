//! Triton's `logging` and `trace` extensions over REST: `GET`/`POST /v2/logging` and
//! `GET`/`POST /v2[/models/{m}]/trace/setting`. A POST names only the settings it changes; every
//! answer carries all of them.

use super::routes::{AppState, PathName};
use super::{body, HttpError};
use crate::core::Error;
use crate::invalid_arg;
use crate::logging::{self, LogFormat, LogSettings, LogUpdate};
use crate::trace::TraceUpdate;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use std::sync::Arc;

type Shared = Arc<AppState>;

/// `GET /v2/logging`.
pub async fn get_log() -> Response {
    log_json(&logging::settings())
}

/// `POST /v2/logging`: every named setting is checked before any is applied. A `null` value
/// leaves its setting as it is, as in Triton.
pub async fn post_log(
    State(state): State<Shared>,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    let doc = json_object(&state, &headers, request).await?;
    let present = |key: &str| doc.get(key).filter(|v| !v.is_null());
    if present("log_file").is_some() {
        return Err(Error::Unsupported(logging::FILE_NOT_UPDATABLE.into()).into());
    }
    let flag = |key: &str| -> Result<Option<bool>, Error> {
        present(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| invalid_arg!("expect boolean for '{key}'"))
            })
            .transpose()
    };
    let update = LogUpdate {
        info: flag("log_info")?,
        warning: flag("log_warning")?,
        error: flag("log_error")?,
        verbose_level: present("log_verbose_level")
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| invalid_arg!("expect uint32 for 'log_verbose_level'"))
            })
            .transpose()?,
        format: present("log_format")
            .map(|v| match v.as_str() {
                Some(name) => LogFormat::parse(name)
                    .ok_or_else(|| invalid_arg!("invalid argument for --log_format, got: {name}")),
                None => Err(invalid_arg!("expect string for 'log_format'")),
            })
            .transpose()?,
    };
    Ok(log_json(&logging::update(&update)))
}

fn log_json(settings: &LogSettings) -> Response {
    ordered_json(&[
        ("log_file", Value::from(settings.file.as_str())),
        ("log_info", Value::from(settings.info)),
        ("log_warning", Value::from(settings.warning)),
        ("log_error", Value::from(settings.error)),
        ("log_verbose_level", Value::from(settings.verbose_level)),
        ("log_format", Value::from(settings.format.name())),
    ])
}

/// A JSON object with its keys in Triton's order (serde_json's maps sort them).
fn ordered_json(fields: &[(&str, Value)]) -> Response {
    let members: Vec<String> = fields
        .iter()
        .map(|(key, value)| format!("{}:{value}", Value::from(*key)))
        .collect();
    let body = format!("{{{}}}", members.join(","));
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A POST body that must be one JSON object (Triton parses the body whatever it is, and an empty
/// one fails to parse).
async fn json_object(
    state: &AppState,
    headers: &HeaderMap,
    request: Body,
) -> Result<Map<String, Value>, HttpError> {
    let request = body::read(request, headers, &state.config).await?;
    match super::json::document(&request)? {
        Value::Object(doc) => Ok(doc),
        _ => Err(invalid_arg!("the request body must be a JSON object").into()),
    }
}

/// `GET /v2/trace/setting`.
pub async fn get_global_trace(State(state): State<Shared>) -> Result<Response, HttpError> {
    trace_json(&state, "", None)
}

/// `GET /v2/models/{model}/trace/setting`.
pub async fn get_model_trace(
    State(state): State<Shared>,
    PathName(model): PathName,
) -> Result<Response, HttpError> {
    trace_json(&state, &model, None)
}

/// `POST /v2/trace/setting`.
pub async fn post_global_trace(
    State(state): State<Shared>,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    let update = trace_update(&state, &headers, request).await?;
    trace_json(&state, "", Some(&update))
}

/// `POST /v2/models/{model}/trace/setting`.
pub async fn post_model_trace(
    State(state): State<Shared>,
    PathName(model): PathName,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    let update = trace_update(&state, &headers, request).await?;
    trace_json(&state, &model, Some(&update))
}

/// The update a POST body asks for: values are strings (`trace_level` a list of them), `null`
/// clears a setting back to the one it mirrors.
async fn trace_update(
    state: &AppState,
    headers: &HeaderMap,
    request: Body,
) -> Result<TraceUpdate, HttpError> {
    let doc = json_object(state, headers, request).await?;
    let mut update = TraceUpdate::default();
    // `trace_file` (refused) first, whatever the body's order.
    let mut named: Vec<_> = doc.iter().collect();
    named.sort_by_key(|(key, _)| key.as_str() != "trace_file");
    for (key, value) in named {
        let values = match value {
            Value::Null => None,
            Value::String(text) if key != "trace_level" => Some(vec![text.clone()]),
            Value::Array(items) if key == "trace_level" => Some(
                items
                    .iter()
                    .map(|item| item.as_str().map(String::from))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| invalid_arg!("expect an array of strings for 'trace_level'"))?,
            ),
            _ if key == "trace_level" => {
                return Err(invalid_arg!("expect an array of strings for 'trace_level'").into())
            }
            _ if key == "trace_file" => None,
            _ => return Err(invalid_arg!("expect a string for '{key}'").into()),
        };
        update.set(key, values.as_deref())?;
    }
    Ok(update)
}

/// The settings in force, each a string but `trace_level`, a list.
fn trace_json(
    state: &AppState,
    model: &str,
    update: Option<&TraceUpdate>,
) -> Result<Response, HttpError> {
    let settings = state.engine.trace_settings(model, update)?;
    let fields: Vec<(&str, Value)> = settings
        .report()
        .into_iter()
        .map(|(key, mut values)| {
            let value = if key == "trace_level" {
                Value::from(values)
            } else {
                Value::from(values.pop().unwrap_or_default())
            };
            (key, value)
        })
        .collect();
    Ok(ordered_json(&fields))
}
