//! Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` answers one JSON
//! object; `.../generate_stream` answers `text/event-stream; charset=utf-8`, one `data: {...}`
//! event per response. Errors before the first response are Triton's JSON errors with their
//! status; an error after the stream started is an event `data: {"error": "..."}`. A client that
//! closes the connection cancels its request.
//!
//! Two kinds of model answer it:
//! - generation models (a decoder and a tokenizer, run by kiln's generation loop, see [`text`]):
//!   `{"text_input": "...", "parameters": {...}}` in, `{"model_name", "model_version",
//!   "text_output"}` out, one event per generated token;
//! - every other model, by Triton's generic mapping ([`mapped`]): keys naming inputs become
//!   inputs, the rest parameters; each response becomes a flat object of its outputs. A
//!   decoupled Python model streams its responses on `generate_stream`; on `generate` it must
//!   send exactly one.

pub mod mapped;
pub mod text;

use super::body;
use super::infer::{sending, traceparent};
use super::routes::{AppState, ModelPath};
use super::HttpError;
use crate::core::Error;
use crate::engine::generate::Generation;
use crate::engine::{Answers, Failed, Reply, StreamedResponse};
use crate::protocol::lifecycle::Lifecycle;
use crate::trace::sent_one_by_one;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, StreamExt};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a started request answers with.
enum Started {
    /// A generation model's text.
    Text(Generation),
    /// A model's one response, as its generate object.
    One(Vec<u8>),
    /// A decoupled model's responses, the first already received (`None`: it sent none; an
    /// error: the request's).
    Stream {
        first: Result<Option<Vec<u8>>, Error>,
        rest: Responses,
    },
}

/// `.../generate`: one JSON answer.
pub async fn handle(
    State(state): State<Arc<AppState>>,
    model: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let (started, life) = start(&state, model, &headers, body).await?;
        let body = match started {
            Started::Text(mut generation) => {
                text::whole(&mut generation).await?.to_string().into_bytes()
            }
            Started::One(body) => body,
            Started::Stream { first, rest } => exactly_one(first?, rest).await?,
        };
        let response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
        Ok::<_, HttpError>(sending(response, &life))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `.../generate_stream`: server-sent events.
pub async fn handle_stream(
    State(state): State<Arc<AppState>>,
    model: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (started, life) = match start(&state, model, &headers, body).await {
        Ok(started) => started,
        Err(error) => return error.into_response(),
    };
    let mut status = StatusCode::OK;
    let events: BoxStream<'static, Vec<u8>> = match started {
        Started::Text(generation) => text::events(generation),
        Started::One(body) => stream::iter([body]).boxed(),
        Started::Stream {
            first: Ok(first),
            rest,
        } => responses(first, rest),
        // As Triton: the error of the first response is the stream's status, and its one event.
        Started::Stream {
            first: Err(error), ..
        } => {
            status = super::status(&error);
            stream::iter([error_event(&error)]).boxed()
        }
    };
    let events = events.map(|data| {
        let mut event = Vec::with_capacity(data.len() + 8);
        event.extend_from_slice(b"data: ");
        event.extend_from_slice(&data);
        event.extend_from_slice(b"\n\n");
        Bytes::from(event)
    });
    (
        status,
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(each_sent(events.boxed(), life)),
    )
        .into_response()
}

/// The events, with the send stamps of each on the trace, as Triton stamps each event it sends:
/// HTTP_SEND_START as the body takes it, HTTP_SEND_END once it has gone to the connection
/// ([`sent_one_by_one`]).
fn each_sent(
    events: BoxStream<'static, Bytes>,
    life: Lifecycle,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let events = events.map(move |event| (event, life.sending()));
    sent_one_by_one(events).map(Ok)
}

/// Reads the request, admits it (once its body has arrived, so a stalled body holds no in-flight
/// slot) and starts it; with its lifecycle (its trace, when it is sampled).
async fn start(
    state: &AppState,
    model: ModelPath,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Started, Lifecycle), HttpError> {
    let life = Lifecycle::http(&state.engine, &model.name, traceparent(headers));
    let body = body::read(body, headers, &state.config).await?;
    life.received();
    let context = life.admit(&state.engine)?;
    let engine = &state.engine;
    // Looked up once: how the model answers says how its body reads.
    let target = engine.target_loading(&model.name, &model.version).await?;
    let request = if target.answers() == Answers::Generation {
        text::decode(&model.name, &model.version, &body)?
    } else {
        let metadata = target.metadata(model.version.is_empty());
        mapped::request(&metadata, &model.version, &body)?
    };
    let reply = engine.call(target, request, context).await;
    let started = match reply.map_err(Failed::into_error)? {
        Reply::Generation(generation) => Started::Text(generation),
        Reply::Stream(receiver) => {
            let mut rest = Responses {
                receiver,
                life: life.clone(),
            };
            let first = rest.next().await;
            Started::Stream { first, rest }
        }
        Reply::Once(response) => Started::One(mapped::response(&response)?),
    };
    Ok((started, life))
}

/// A decoupled model's responses, with the request's lifecycle.
struct Responses {
    receiver: mpsc::UnboundedReceiver<StreamedResponse>,
    life: Lifecycle,
}

impl Responses {
    /// The next response, as its generate object (INFER_RESPONSE_COMPLETE for each the model
    /// sends, a final flag alone too); `None` after the last.
    ///
    /// # Errors
    /// The request's error, when the model sent one.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, Error> {
        while let Some(streamed) = self.receiver.recv().await {
            match self.life.answered(streamed.response)? {
                Some(response) => return mapped::response(&response).map(Some),
                // A flag alone: the response before was the last.
                None if streamed.last => break,
                None => {}
            }
        }
        Ok(None)
    }
}

/// The one response `generate` answers with, from a decoupled model.
///
/// # Errors
/// The model's error; INVALID_ARGUMENT when it sent no response or more than one (Triton's
/// text; Triton answers it with status 200 when the first response was fine).
async fn exactly_one(first: Option<Vec<u8>>, mut rest: Responses) -> Result<Vec<u8>, Error> {
    let not_one = || {
        Error::InvalidArgument(
            "generate expects model to produce exactly 1 response, use generate stream for \
             model that generates various number of responses"
                .into(),
        )
    };
    let first = first.ok_or_else(not_one)?;
    match rest.next().await? {
        None => Ok(first),
        Some(_) => Err(not_one()),
    }
}

/// A decoupled model's responses as events: each response, and an error event when the model
/// fails mid-stream.
fn responses(first: Option<Vec<u8>>, rest: Responses) -> BoxStream<'static, Vec<u8>> {
    let rest = stream::unfold(Some(rest), |state| async move {
        let mut rest = state?;
        match rest.next().await {
            Ok(Some(data)) => Some((data, Some(rest))),
            Ok(None) => None,
            Err(error) => Some((error_event(&error), None)),
        }
    });
    stream::iter(first).chain(rest).boxed()
}

/// `{"error": "..."}`: an error after the stream started.
fn error_event(error: &Error) -> Vec<u8> {
    serde_json::json!({ "error": error.message() })
        .to_string()
        .into_bytes()
}
