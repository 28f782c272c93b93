//! A Python model's calls to the server ([`ModelCaller`]): `InferenceRequest.exec()` (Triton's
//! BLS), decoupled or not, and `pb_utils.load_model` / `unload_model` / `is_model_ready`, as
//! the stub asks for them and as their answers go back to it.

use super::channel;
use super::messages::error_code;
use crate::core::{Error, InferRequest, InferResponse, ParamValue, Tensor};
use crate::trace::Trace;
use serde_json::{json, Value};
use std::io::BufWriter;
use std::process::ChildStdin;
use std::sync::{Arc, Mutex, OnceLock};

/// Runs one request on any model of the server.
pub(super) type RunRequest = dyn Fn(InferRequest) -> Result<InferResponse, Error> + Send + Sync;
/// Runs one request on a decoupled model of the server: each response as it sends it (an error
/// ends the stream). A value sent on its [`Cancel`] cancels the request: the stream ends there.
pub(super) type RunDecoupled = dyn Fn(InferRequest, Cancel) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>>
    + Send
    + Sync;

/// What cancels a decoupled call (`ResponseIterator.cancel()`): a value sent (a sender dropped
/// without sending cancels nothing).
pub type Cancel = tokio::sync::oneshot::Receiver<()>;

/// The decoupled call a stub's model is iterating, by the number the stub gave it, for
/// `ResponseIterator.cancel()`. A stub has at most one open: it reads a call's answers to their
/// end before it makes its next call.
#[derive(Clone, Default)]
pub(super) struct Streams(Arc<Mutex<Option<OpenStream>>>);

/// A decoupled call's number, and what cancels it.
pub(super) type OpenStream = (u64, tokio::sync::oneshot::Sender<()>);

impl Streams {
    /// Call `stream` starts: what cancels it.
    pub(super) fn open(&self, stream: u64) -> Cancel {
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((stream, cancel));
        cancelled
    }

    /// Cancels the call a stub's `cancel` message names, if it is still the one open.
    pub(super) fn cancel(&self, message: &Value) {
        if let Some(cancel) = message["stream"]
            .as_u64()
            .and_then(|stream| self.take(stream))
        {
            let _ = cancel.send(());
        }
    }

    /// Call `stream` ended.
    pub(super) fn close(&self, stream: u64) {
        self.take(stream);
    }

    fn take(&self, stream: u64) -> Option<tokio::sync::oneshot::Sender<()>> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if open.as_ref().is_some_and(|(id, _)| *id == stream) {
            open.take().map(|(_, cancel)| cancel)
        } else {
            None
        }
    }
}

/// Loads, unloads or asks after a model of the server: whether it is ready (for `Ready`).
pub(super) type Manage = dyn Fn(Management) -> Result<bool, Error> + Send + Sync;

/// What a Python model asks of the server's model repository (`pb_utils.load_model`,
/// `unload_model`, `is_model_ready`).
#[derive(Debug, Clone, PartialEq)]
pub enum Management {
    /// Loads or reloads `model`, with the repository API's `config` / `file:` parameters.
    Load {
        model: String,
        parameters: std::collections::BTreeMap<String, crate::core::LoadParameter>,
    },
    Unload {
        model: String,
        dependents: bool,
    },
    Ready {
        model: String,
        version: String,
    },
}

/// What a Python model's calls to the server run on: the server's models and its repository.
/// The server implements it over its engine (the backend knows nothing above itself).
pub trait ServerCalls: Send + Sync {
    /// Runs one request on any model of the server (`exec()`), traced as `trace` (a child of
    /// the calling request's trace) when it is.
    fn infer(
        &self,
        request: InferRequest,
        trace: Option<Arc<Trace>>,
    ) -> Result<InferResponse, Error>;

    /// Runs one request on a decoupled model of the server (`exec(decoupled=True)`): each
    /// response as it sends it (an error ends the stream). A value sent on `cancel` cancels the
    /// request: the stream ends there.
    fn infer_decoupled(
        &self,
        request: InferRequest,
        trace: Option<Arc<Trace>>,
        cancel: Cancel,
    ) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>>;

    /// Loads, unloads or asks after a model of the server: whether it is ready (for `Ready`).
    fn manage(&self, asked: Management) -> Result<bool, Error>;
}

/// [`ServerCalls`] made of three functions.
pub(super) struct Calls {
    unary: Box<RunRequest>,
    decoupled: Box<RunDecoupled>,
    manage: Box<Manage>,
}

impl ServerCalls for Calls {
    fn infer(&self, request: InferRequest, _: Option<Arc<Trace>>) -> Result<InferResponse, Error> {
        (self.unary)(request)
    }

    fn infer_decoupled(
        &self,
        request: InferRequest,
        _: Option<Arc<Trace>>,
        cancel: Cancel,
    ) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>> {
        (self.decoupled)(request, cancel)
    }

    fn manage(&self, asked: Management) -> Result<bool, Error> {
        (self.manage)(asked)
    }
}

/// How a Python model's `InferenceRequest.exec()` (Triton's BLS: business logic scripting)
/// reaches the server's models. The repository exists before the engine that serves it, so the
/// server connects this once the engine does; every model loaded with the same options shares it.
#[derive(Clone, Default)]
pub struct ModelCaller(
    Arc<OnceLock<Box<dyn ServerCalls>>>,
    Arc<Mutex<TracedRequests>>,
);

/// The traces of the requests sent to Python models, by trace id, while they live: a model's call
/// that passes on `request.trace()` is traced as a child of its request's (as in Triton).
pub(super) type TracedRequests = std::collections::HashMap<u64, std::sync::Weak<Trace>>;

impl ModelCaller {
    /// Sets what runs the calls, `exec()` and `exec(decoupled=True)`, and the model management
    /// requests (the first setting stays).
    pub fn connect_to(&self, calls: impl ServerCalls + 'static) {
        let _ = self.0.set(Box::new(calls));
    }

    /// [`ModelCaller::connect_to`] with the three functions.
    pub fn connect(
        &self,
        unary: impl Fn(InferRequest) -> Result<InferResponse, Error> + Send + Sync + 'static,
        decoupled: impl Fn(InferRequest, Cancel) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>>
            + Send
            + Sync
            + 'static,
        manage: impl Fn(Management) -> Result<bool, Error> + Send + Sync + 'static,
    ) {
        self.connect_to(Calls {
            unary: Box::new(unary),
            decoupled: Box::new(decoupled),
            manage: Box::new(manage),
        });
    }

    fn calls(&self) -> Result<&dyn ServerCalls, Error> {
        self.0.get().map(Box::as_ref).ok_or_else(|| {
            Error::Unavailable("this server cannot run other models for a Python model".into())
        })
    }

    /// The id a request's trace goes to the stub with (0: none), kept for its calls.
    pub(super) fn traced(&self, trace: Option<&Arc<Trace>>) -> u64 {
        let Some(trace) = trace else { return 0 };
        let mut traced = self.1.lock().unwrap_or_else(|e| e.into_inner());
        traced.retain(|_, trace| trace.strong_count() > 0);
        traced.insert(trace.id(), Arc::downgrade(trace));
        trace.id()
    }

    /// A trace for a call made on behalf of the request traced as `id`, while that lives.
    pub(super) fn child_trace(&self, id: u64) -> Option<Arc<Trace>> {
        let traced = self.1.lock().unwrap_or_else(|e| e.into_inner());
        traced
            .get(&id)
            .and_then(std::sync::Weak::upgrade)
            .map(|trace| trace.child())
    }
}

impl std::fmt::Debug for ModelCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelCaller")
    }
}

impl PartialEq for ModelCaller {
    fn eq(&self, other: &ModelCaller) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ModelCaller {}

/// A response (or its error) as a `called` message describes it; its outputs' data is
/// appended to `data`.
pub(super) fn called_response(
    response: Result<InferResponse, Error>,
    data: &mut Vec<Tensor>,
) -> Value {
    match response {
        Ok(response) => {
            let outputs: Vec<Value> = response.outputs.iter().map(channel::describe).collect();
            data.extend(response.outputs);
            let parameters: serde_json::Map<String, Value> = response
                .parameters
                .iter()
                .map(|(key, value)| (key.clone(), value.to_json()))
                .collect();
            json!({ "outputs": outputs, "parameters": parameters })
        }
        Err(error) => json!({"error": error.message(), "code": error_code(&error)}),
    }
}

/// Runs a model's call to another model, handing `answer` what to write to the stub: one
/// `called` message, or for a decoupled call (`exec(decoupled=True)`) one per response as the
/// called model sends it, then one with `end` (sooner when `cancel` cancels it). `answer` says
/// false when the stub cannot be written to any more: the call is dropped then (the called model
/// hears its client left).
pub(super) fn call(
    caller: &ModelCaller,
    message: channel::Message,
    cancel: Option<Cancel>,
    answer: &mut dyn FnMut(Value, Vec<Tensor>) -> bool,
) {
    let decoupled = message.header["request"]["decoupled"].as_bool() == Some(true);
    let called = |response: Result<InferResponse, Error>| {
        let mut data = Vec::new();
        let mut header = called_response(response, &mut data);
        header["op"] = json!("called");
        (header, data)
    };
    let trace = message.header["request"]["trace"].as_u64().unwrap_or(0);
    let trace = (trace != 0).then(|| caller.child_trace(trace)).flatten();
    let request = call_request(message)
        .map_err(Error::InvalidArgument)
        .and_then(|request| Ok((caller.calls()?, request)));
    let (calls, request) = match request {
        Ok(ready) => ready,
        Err(error) => {
            let (header, data) = called(Err(error));
            if answer(header, data) && decoupled {
                answer(json!({"op": "called", "end": true}), Vec::new());
            }
            return;
        }
    };
    if !decoupled {
        let (header, data) = called(calls.infer(request, trace));
        answer(header, data);
        return;
    }
    // Kept until the call ends: a call nothing can cancel.
    let (_uncancellable, never) = tokio::sync::oneshot::channel();
    for response in calls.infer_decoupled(request, trace, cancel.unwrap_or(never)) {
        let (header, data) = called(response);
        if !answer(header, data) {
            return;
        }
    }
    answer(json!({"op": "called", "end": true}), Vec::new());
}

/// Answers a model's call to another model (or its management request) from a thread of its
/// own, writing the answers to the stub's `input`: the stub's other messages are read meanwhile
/// (a decoupled call's `cancel`, a decoupled model's responses).
pub(super) fn spawn_call(
    input: &Arc<Mutex<BufWriter<ChildStdin>>>,
    caller: &ModelCaller,
    streams: &Streams,
    message: channel::Message,
) {
    let write = |input: &Mutex<BufWriter<ChildStdin>>, header: Value, tensors: Vec<Tensor>| {
        let blobs: Vec<&[u8]> = tensors.iter().map(|t| t.data.as_ref()).collect();
        let mut input = input.lock().unwrap_or_else(|e| e.into_inner());
        channel::send(&mut *input, header, &blobs).is_ok()
    };
    let request = &message.header["request"];
    let streams_answers = request["decoupled"].as_bool() == Some(true);
    let stream = streams_answers
        .then(|| message.header["stream"].as_u64())
        .flatten();
    let cancel = stream.map(|stream| streams.open(stream));
    let (running, caller, open) = (Arc::clone(input), caller.clone(), streams.clone());
    let spawned = std::thread::Builder::new()
        .name("py-call".into())
        .spawn(move || {
            if message.header["op"] == "manage" {
                write(&running, manage(&caller, &message), Vec::new());
            } else {
                call(&caller, message, cancel, &mut |header, tensors| {
                    write(&running, header, tensors)
                });
            }
            if let Some(stream) = stream {
                open.close(stream);
            }
        });
    if let Err(error) = spawned {
        // The model waits for an answer: it gets one.
        let refusal = json!({
            "op": "called",
            "error": format!("kiln cannot run the call: {error}"),
            "code": 1,
        });
        if write(input, refusal, Vec::new()) && streams_answers {
            write(input, json!({"op": "called", "end": true}), Vec::new());
        }
    }
}

/// Runs a model's management request (a `manage` message): the `managed` header to answer with.
pub(super) fn manage(caller: &ModelCaller, message: &channel::Message) -> Value {
    let header = &message.header;
    let text = |key: &str| header[key].as_str().unwrap_or_default().to_string();
    let model = text("model");
    let asked = match header["action"].as_str() {
        Some("load") => {
            let mut parameters = std::collections::BTreeMap::new();
            let config = text("config");
            if !config.is_empty() {
                parameters.insert(
                    "config".to_string(),
                    crate::core::LoadParameter::String(config),
                );
            }
            let names = header["files"].as_array().cloned().unwrap_or_default();
            if names.len() == message.blobs.len() {
                for (name, data) in names.iter().zip(&message.blobs) {
                    let name = name.as_str().unwrap_or_default().to_string();
                    parameters.insert(name, crate::core::LoadParameter::Bytes(data.clone()));
                }
                Ok(Management::Load { model, parameters })
            } else {
                Err(Error::InvalidArgument(
                    "the load's files and their data do not match".into(),
                ))
            }
        }
        Some("unload") => Ok(Management::Unload {
            model,
            dependents: header["unload_dependents"].as_bool() == Some(true),
        }),
        Some("ready") => Ok(Management::Ready {
            model,
            version: text("version"),
        }),
        other => Err(Error::InvalidArgument(format!(
            "unknown model management action {other:?}"
        ))),
    };
    match asked.and_then(|asked| caller.calls()?.manage(asked)) {
        Ok(ready) => json!({"op": "managed", "ready": ready}),
        Err(error) => {
            json!({"op": "managed", "error": error.message(), "code": error_code(&error)})
        }
    }
}

/// The request a stub's `call` message describes.
pub(super) fn call_request(message: channel::Message) -> Result<InferRequest, String> {
    let header = &message.header["request"];
    let text = |key: &str| header[key].as_str().unwrap_or_default().to_string();
    let described = header["inputs"].as_array().cloned().unwrap_or_default();
    if described.len() != message.blobs.len() {
        return Err("the call's inputs and their data do not match".into());
    }
    let inputs = described
        .iter()
        .zip(message.blobs)
        .map(|(description, data)| channel::tensor(description, data))
        .collect::<Result<Vec<Tensor>, String>>()?;
    let parameters: serde_json::Map<String, Value> =
        serde_json::from_str(&text("parameters")).unwrap_or_default();
    let mut request = InferRequest {
        model_name: text("model"),
        model_version: text("version"),
        id: text("id"),
        inputs,
        ..InferRequest::default()
    };
    for (key, value) in parameters {
        let value = ParamValue::from_json(value)
            .ok_or_else(|| format!("parameter '{key}' must be a bool, a number or a string"))?;
        request.parameters.insert(key, value);
    }
    request.outputs = header["outputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|name| crate::core::RequestedOutput {
            name: name.to_string(),
            ..Default::default()
        })
        .collect();
    Ok(request)
}
