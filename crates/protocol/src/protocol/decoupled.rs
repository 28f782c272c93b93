//! Decoupled responses on gRPC `ModelStreamInfer`, as Triton sends them for models with
//! `model_transaction_policy { decoupled: true }`: a request to a generation model is answered
//! with one `ModelStreamInferResponse` per generated token (`text_output`, BYTES `[1]`), each
//! carrying the `triton_final_response` parameter, true on the last. A request that does not
//! stream (`stream` false) gets one response with the whole text. With
//! `triton_enable_empty_final_response`, every data response says false and an extra response
//! without outputs says true. A failed request gets `error_message`; the stream stays open.
//! Responses of different requests interleave; clients match them by `id`. A decoupled Python
//! model's responses go out as the model sends them, each with its outputs and the flag, true
//! on the last ([`python_stream`]).

use super::codec::{request_from_wire, response_to_wire};
use super::lifecycle::{Lifecycle, Wire};
use crate::core::tensor::frame_bytes;
use crate::core::{Error, ParamValue};
use crate::engine::generate::Generation;
use crate::engine::{Engine, Failed, Reply, StreamedResponse, Target};
use crate::proto::inference::{
    infer_parameter::ParameterChoice, model_infer_response::InferOutputTensor, InferParameter,
    ModelInferRequest, ModelInferResponse, ModelStreamInferResponse,
};
use crate::trace::{sent_one_by_one, RecordOnDrop, Trace};
use futures_util::{Stream, StreamExt};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// Where a stream's messages go, each with what records its GRPC_SEND_END on its request's
/// trace.
pub type Responses = mpsc::Sender<(ModelStreamInferResponse, Option<RecordOnDrop>)>;

/// Queues `message` on the stream, recording GRPC_SEND_START on `trace` now and GRPC_SEND_END
/// once it has gone (see [`outgoing`]). False once the client is gone.
pub async fn deliver(
    responses: &Responses,
    message: ModelStreamInferResponse,
    trace: Option<&Arc<Trace>>,
) -> bool {
    let sent = Wire::Grpc.sending(trace);
    responses.send((message, sent)).await.is_ok()
}

/// A stream's messages as tonic takes them, each one's send end recorded once tonic has encoded
/// it for the connection ([`sent_one_by_one`]).
pub fn outgoing(
    receiver: mpsc::Receiver<(ModelStreamInferResponse, Option<RecordOnDrop>)>,
) -> impl Stream<Item = Result<ModelStreamInferResponse, Status>> {
    sent_one_by_one(ReceiverStream::new(receiver)).map(Ok)
}

/// The parameter Triton sets on every response of a decoupled model.
pub const FINAL_RESPONSE: &str = "triton_final_response";

/// Runs one request on a decoupled model (`target`) and sends its responses, until the last one
/// or until the client goes away (then the request is dropped, which cancels it).
/// `traceparent` is the stream's W3C trace context, for OpenTelemetry traces; `waited` when the
/// stream began waiting for this message. The request is checked, and takes its place in its
/// sequence, when this is called: a stream's requests keep their order whatever the order in
/// which their tasks run.
pub fn answer(
    engine: Arc<Engine>,
    target: Target,
    wire: ModelInferRequest,
    responses: Responses,
    traceparent: Option<&str>,
    waited: Instant,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let header = ModelInferResponse {
        model_name: wire.model_name.clone(),
        model_version: wire.model_version.clone(),
        id: wire.id.clone(),
        ..Default::default()
    };
    let life = Lifecycle::grpc(&engine, &wire.model_name, traceparent, waited);
    let mut empty_final = false;
    let started = life.admit(&engine).and_then(|context| {
        let request = request_from_wire(wire)?;
        empty_final = request
            .parameters
            .get(crate::core::reserved::EMPTY_FINAL_RESPONSE)
            == Some(&ParamValue::Bool(true));
        Ok(engine.call(target, request, context))
    });
    async move {
        let trace = life.trace();
        let reply = match started {
            Ok(call) => call.await.map_err(Failed::into_error),
            Err(error) => Err(error),
        };
        match reply {
            Ok(Reply::Stream(stream)) => tokio::select! {
                () = python_stream(stream, header, empty_final, &responses, &life) => {}
                () = responses.closed() => {}
            },
            Ok(Reply::Generation(generation)) => tokio::select! {
                () = self::stream(generation, &responses, trace) => {}
                () = responses.closed() => {}
            },
            Ok(Reply::Once(response)) => {
                let mut wire = response_to_wire(response);
                wire.parameters.extend([final_flag(true)]);
                let message = ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(wire),
                };
                deliver(&responses, message, trace).await;
            }
            Err(error) => {
                deliver(&responses, refused(header.id, &error), trace).await;
            }
        }
    }
}

/// Sends the responses of a running generation.
async fn stream(mut generation: Generation, responses: &Responses, trace: Option<&Arc<Trace>>) {
    if !generation.request.stream {
        let answer = generation.text().await;
        send(&generation, answer, true, responses, trace).await;
        return;
    }
    while let Some(chunk) = generation.next().await {
        let last = chunk.as_ref().map_or(true, |c| c.last());
        if !send(&generation, chunk.map(|c| c.text), last, responses, trace).await || last {
            return;
        }
    }
}

/// Sends a decoupled Python model's responses as they come: each with its outputs and the final
/// flag; with `empty_final` the flag goes on an extra response without outputs (as it does when
/// the model sends the flag alone), else on the last data response.
async fn python_stream(
    mut stream: mpsc::UnboundedReceiver<StreamedResponse>,
    header: ModelInferResponse,
    empty_final: bool,
    responses: &Responses,
    life: &Lifecycle,
) {
    let trace = life.trace();
    while let Some(streamed) = stream.recv().await {
        let mut messages = Vec::with_capacity(2);
        match life.answered(streamed.response) {
            Ok(Some(response)) => {
                let mut wire = response_to_wire(response);
                wire.parameters
                    .extend([final_flag(streamed.last && !empty_final)]);
                messages.push(ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(wire),
                });
                if streamed.last && empty_final {
                    messages.push(flag_only(header.clone()));
                }
            }
            Ok(None) if empty_final => messages.push(flag_only(header.clone())),
            Ok(None) => {}
            Err(error) => messages.push(flagged_failure(header.clone(), &error, streamed.last)),
        }
        for message in messages {
            if !deliver(responses, message, trace).await {
                return;
            }
        }
        if streamed.last {
            return;
        }
    }
}

/// A response without outputs that only says "final".
fn flag_only(mut header: ModelInferResponse) -> ModelStreamInferResponse {
    header.parameters.extend([final_flag(true)]);
    ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(header),
    }
}

/// Sends one answer, text or failure; after the last text, the flag-only response when the
/// request asked for it. False once the client is gone.
async fn send(
    generation: &Generation,
    answer: Result<String, Error>,
    last: bool,
    responses: &Responses,
    trace: Option<&Arc<Trace>>,
) -> bool {
    let empty_final = generation.request.empty_final;
    let message = match &answer {
        Ok(text) => text_response(generation, text, last && !empty_final),
        Err(error) => failure(header(generation), error),
    };
    if !deliver(responses, message, trace).await {
        return false;
    }
    if last && empty_final && answer.is_ok() {
        return deliver(responses, final_only(generation), trace).await;
    }
    true
}

fn header(generation: &Generation) -> ModelInferResponse {
    ModelInferResponse {
        model_name: generation.model_name.clone(),
        model_version: generation.model_version.clone(),
        id: generation.id.clone(),
        ..Default::default()
    }
}

/// The `triton_final_response` parameter.
pub(super) fn final_flag(is_final: bool) -> (String, InferParameter) {
    (
        FINAL_RESPONSE.to_string(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(is_final)),
        },
    )
}

/// A response holding `text` as `text_output`.
fn text_response(generation: &Generation, text: &str, is_final: bool) -> ModelStreamInferResponse {
    let mut response = header(generation);
    response.parameters.extend([final_flag(is_final)]);
    response.outputs.push(InferOutputTensor {
        name: "text_output".into(),
        datatype: "BYTES".into(),
        shape: vec![1],
        ..Default::default()
    });
    response.raw_output_contents.push(frame_bytes([text]));
    ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(response),
    }
}

/// The empty response that only says "final".
fn final_only(generation: &Generation) -> ModelStreamInferResponse {
    flag_only(header(generation))
}

/// The answer to a request refused before its model had it: as Triton 2.51 writes it, the
/// error and the request's id alone (no model, no final flag).
pub fn refused(id: String, error: &Error) -> ModelStreamInferResponse {
    ModelStreamInferResponse {
        error_message: error.message().to_string(),
        infer_response: Some(ModelInferResponse {
            id,
            ..Default::default()
        }),
    }
}

/// A request's error, which ends it.
fn failure(header: ModelInferResponse, error: &Error) -> ModelStreamInferResponse {
    flagged_failure(header, error, true)
}

/// An error response, the last of its request when `last`.
fn flagged_failure(
    mut header: ModelInferResponse,
    error: &Error,
    last: bool,
) -> ModelStreamInferResponse {
    header.parameters.extend([final_flag(last)]);
    ModelStreamInferResponse {
        error_message: error.message().to_string(),
        infer_response: Some(header),
    }
}
