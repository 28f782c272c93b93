//! Triton's Python backend: a model whose `<version>/model.py` defines `TritonPythonModel`
//! (`initialize(args)`, `execute(requests)`, `finalize()`) runs in Python processes of its own,
//! one per instance, as Triton runs it in its stub processes. kiln sends each process its stub
//! (`stub.py`) and its `triton_python_backend_utils` (what models import as `pb_utils`) over
//! the process's standard input, then talks to it there and on its standard output
//! ([`channel`]).
//!
//! Requests go through the scheduler every backend has (`kiln-scheduler`): its queues,
//! priorities and queue policies, and with `dynamic_batching` its delay and preferred sizes. An
//! instance thread hands each batch (up to `max_batch_size` rows of requests whose inputs agree
//! in shape) to its stub in one `execute` call, each request with its id, its parameters (as the
//! JSON text `request.parameters()` gives) and the outputs it asks for. A response's
//! `TritonError` fails its request with that message, an exception fails the call's requests
//! with Triton's "Failed to process the request(s)" message. A decoupled model's responses are
//! passed on as the model sends them ([`Streamed`]). A stub that dies (a crash, `os._exit`)
//! fails what it was running and is started again, `initialize` and all, for the next call. A
//! request whose client goes away while it runs is reported to the stub ([`cancel`]): the
//! model's `is_cancelled()`. `InferenceRequest.exec()` in a model runs through the server's
//! engine ([`ModelCaller`]). A stateful model (`sequence_batching`) has a scheduler per
//! instance: a sequence's requests all go to the same one, where the model keeps its state, and
//! different sequences' requests batch together there.
//!
//! The interpreter is the config's `EXECUTION_ENV_PATH` (an environment, packed or not), else
//! `$KILN_PYTHON`, else `python3` on the `PATH` ([`environment`]); it needs numpy. A stub sees
//! only some of kiln's environment variables, none of its secrets ([`StubEnvironment`]), and
//! starts without capabilities or new privileges, as another user if asked ([`StubPrivileges`]).
//!
//! By job: [`spec`] reads the config (interpreter, instances, `auto_complete_config`);
//! [`instance`] starts a version's instances and runs a batch on one ([`PythonInstance`]), which
//! the repository schedules and warms up (`repository::python`, in `kiln-repository`); [`stub`] the stub
//! process and its pipe; [`calls`] the model's calls to the server, behind [`ServerCalls`];
//! [`messages`] what the stub's messages mean (error codes, outputs, parameters); [`logs`] its
//! log lines and custom metrics.

mod calls;
mod cancel;
mod channel;
mod decoupled;
pub mod environment;
mod instance;
mod logs;
mod messages;
mod privileges;
mod spec;
mod stub;
mod stub_env;

use crate::core::{Error, Parameters, Tensor};
use crate::trace::Trace;
pub use calls::{Cancel, Management, ModelCaller, ServerCalls};
pub use cancel::Gone;
pub use instance::{start_instances, Common, Deliver, PythonInstance, PythonVersion};
pub use privileges::StubPrivileges;
use serde_json::Value;
pub use spec::{
    auto_complete, backend_code, Instance, PythonSpec, BACKEND, DEFAULT_BACKEND_DIRECTORY,
    DEFAULT_MODEL_FILENAME,
};
use std::sync::Arc;
pub use stub_env::StubEnvironment;
// What the unit tests (`use super::*`, written when this was one file) reach in its parts.
#[cfg(test)]
use {
    crate::core::{InferResponse, ParamValue},
    crate::proto::inference::{model_instance_group::Kind, ModelConfig},
    calls::{call, manage, Streams},
    messages::{error_code, model_error, parameters_json},
    serde_json::json,
    std::path::Path,
    std::sync::Mutex,
};

/// One inference request for a Python model.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub id: String,
    pub parameters: Parameters,
    /// The outputs asked for; empty: all.
    pub outputs: Vec<String>,
    pub inputs: Vec<Tensor>,
    /// The order `request.inputs()` lists `inputs` in, as indexes (Triton's order, which
    /// follows the client's); empty: as they are.
    pub listed: Vec<usize>,
    /// Its sequence, for a model with `sequence_batching`.
    pub sequence: Option<SequenceOf>,
    /// Its trace, which the model's calls may pass on (`trace=request.trace()`).
    pub trace: Option<Arc<Trace>>,
}

impl Request {
    /// The inputs in the order the model is given them.
    fn listed_inputs(&self) -> impl Iterator<Item = &Tensor> {
        let listed = (self.listed.len() == self.inputs.len()).then_some(&self.listed);
        (0..self.inputs.len()).map(move |at| &self.inputs[listed.map_or(at, |order| order[at])])
    }
}

/// Where a request of a stateful model stands in its sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceOf {
    /// `request.correlation_id()`: a number or a string.
    pub correlation_id: Value,
    /// `request.flags()`: TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) and _END (2).
    pub flags: u32,
    /// The instance every request of the sequence runs on (by index).
    pub slot: usize,
}

/// What one response carries: its output tensors and the parameters the model gave it
/// (`InferenceResponse(..., parameters=...)`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outputs {
    pub tensors: Vec<Tensor>,
    pub parameters: Parameters,
    /// The model rescheduled the request (`set_release_flags(TRITONSERVER_REQUEST_RELEASE_
    /// RESCHEDULE)`): it runs again in a later `execute` call, which answers it.
    pub rescheduled: bool,
    /// The model's error response (`InferenceResponse(error=...)`) to a request of a model that
    /// is not decoupled: the request fails with it, yet counts as a success, as Triton's Python
    /// backend counts a response it sent.
    pub refused: Option<Error>,
}

impl Outputs {
    /// The outputs, or the model's error response as the error.
    pub fn answered(self) -> Result<Outputs, Error> {
        match self.refused {
            Some(error) => Err(error),
            None => Ok(self),
        }
    }
}

/// A request's answer from a model that is not decoupled: its response, or the model's error for
/// it (an exception, a `TritonError`, a stub that died).
pub type Answer = Result<Outputs, Error>;

/// One response to a request: its outputs (`None`: only the word that the response before was
/// the last, which a decoupled model may send alone), or its error; `last` on the final one.
#[derive(Debug)]
pub struct Streamed {
    pub outputs: Result<Option<Outputs>, Error>,
    pub last: bool,
}

#[cfg(test)]
mod tests;
