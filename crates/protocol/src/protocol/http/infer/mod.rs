//! `POST /v2/models/{m}[/versions/{v}]/infer`: JSON requests and Triton's binary tensor data
//! extension, exactly as `tritonclient.http` uses it. No `Content-Type` is required (tritonclient
//! sends none): the body is read as bytes and split by `Inference-Header-Content-Length`.
//! `Inference-Header-Content-Length: 0` is Triton's raw binary request: the whole body is the data
//! of the model's single input, and every output comes back binary.

mod request;
mod response;
#[cfg(test)]
mod tests;

use super::body;
use super::routes::{AppState, ModelPath};
use super::HttpError;
use crate::core::Error;
use crate::invalid_arg;
use crate::protocol::lifecycle::Lifecycle;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
pub use request::{decode, OutputFormats};
use std::sync::Arc;

/// The header that splits a body into the JSON part and binary tensor data.
pub const INFERENCE_HEADER_CONTENT_LENGTH: HeaderName =
    HeaderName::from_static("inference-header-content-length");

/// The infer endpoint.
pub async fn handle(
    State(state): State<Arc<AppState>>,
    model: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match infer(&state, model, &headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn infer(
    state: &AppState,
    model: ModelPath,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let life = Lifecycle::http(&state.engine, &model.name, traceparent(headers));
    let encoding = body::response_encoding(headers.get(header::ACCEPT_ENCODING));
    let body = body::read(body, headers, &state.config).await?;
    life.received();
    // Admitted once the body has arrived: a client that sends its body slowly, or never, holds
    // no in-flight slot (the body read is bounded in size and time instead).
    let context = life.admit(&state.engine)?;
    let header_length = header_length(headers, body.len())?;
    // No JSON at all (a header length of 0, or an empty body without one): the body is the
    // data of the model's only input, as Triton reads it.
    let (request, formats) = if header_length.unwrap_or(body.len()) == 0 {
        let request = state
            .engine
            .raw_input_request(&model.name, &model.version, body)
            .await?;
        (request, OutputFormats::all_binary())
    } else {
        request::decode(&model.name, &model.version, body, header_length)?
    };
    let response = state.engine.infer(request, context).await;
    let response = match life.answered(response) {
        Ok(response) => response,
        Err(failed) => {
            let error = HttpError::from(failed.into_error());
            return Ok(sending(error.into_response(), &life));
        }
    };
    let (encoded, encoding, bytes) = encode_and_compress(response, formats, encoding).await?;
    let content_type = if encoded.header_length.is_some() {
        "application/octet-stream"
    } else {
        "application/json"
    };
    let mut reply = ([(header::CONTENT_TYPE, content_type)], bytes).into_response();
    let reply_headers = reply.headers_mut();
    if let Some(length) = encoded.header_length {
        reply_headers.insert(INFERENCE_HEADER_CONTENT_LENGTH, HeaderValue::from(length));
    }
    if let Some(value) = encoding.header_value() {
        reply_headers.insert(header::CONTENT_ENCODING, value);
    }
    Ok(sending(reply, &life))
}

/// Output data past which a response is encoded and compressed on a blocking thread: writing
/// megabytes of JSON numbers or gzip takes milliseconds, which must not stall the async workers
/// (and every connection they serve); below it the hand-over costs more than the work.
const ENCODE_ON_WORKER_BYTES: usize = 256 * 1024;

/// The response body, compressed as asked; its `body` has moved into the returned bytes.
async fn encode_and_compress(
    response: crate::core::InferResponse,
    formats: OutputFormats,
    encoding: body::Encoding,
) -> Result<(response::Encoded, body::Encoding, Vec<u8>), HttpError> {
    let data: usize = response.outputs.iter().map(|o| o.data.len()).sum();
    let work = move || {
        let mut encoded = response::encode(&response, &formats)?;
        let (encoding, bytes) = body::compress(encoding, std::mem::take(&mut encoded.body));
        Ok::<_, Error>((encoded, encoding, bytes))
    };
    let done = if data > ENCODE_ON_WORKER_BYTES {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| Error::Internal(format!("encoding the response stopped: {e}")))?
    } else {
        work()
    };
    Ok(done?)
}

/// Records a traced response's send timestamps: its start now, its end when the connection has
/// sent the whole body (the `in_flight` layer drops the marker then).
pub(super) fn sending(mut response: Response, life: &Lifecycle) -> Response {
    if let Some(sent) = life.sending() {
        response.extensions_mut().insert(sent);
    }
    response
}

/// A request's W3C trace context (`traceparent`), for OpenTelemetry traces.
pub(super) fn traceparent(headers: &HeaderMap) -> Option<&str> {
    headers.get("traceparent").and_then(|v| v.to_str().ok())
}

/// `Inference-Header-Content-Length`: `None` when absent (the body is all JSON).
///
/// # Errors
/// INVALID_ARGUMENT, with Triton's texts, when it is not a number or exceeds the (decompressed)
/// body.
pub fn header_length(headers: &HeaderMap, body_length: usize) -> Result<Option<usize>, Error> {
    let Some(value) = headers.get(INFERENCE_HEADER_CONTENT_LENGTH) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    let length: i128 = text.trim().parse().map_err(|_| {
        invalid_arg!("Unable to parse Inference-Header-Content-Length, got: {text}")
    })?;
    match usize::try_from(length) {
        Ok(length) if length <= body_length => Ok(Some(length)),
        _ => Err(invalid_arg!(
            "inference header size should be in range (0, {body_length}), got: {text}"
        )),
    }
}
