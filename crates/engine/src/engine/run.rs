//! Requests that answer once. [`Engine::infer`] enters here: the model is looked up once, a
//! decoupled model refused in the words of the request's origin, the request prepared like every
//! other ([`super::prepare`]), and run on its version ([`super::execution`]); statistics go
//! through one [`Recorder`], trace stamps through [`super::traces`].

use super::context::{Context, Origin, Scope};
use super::execution::Job;
use super::prepare::Call;
use super::record::{Counted, Failed, Recorder};
use super::shared_memory::tensors::{self, OutputSlots};
use super::target::{Answers, Target};
use super::{classification, response, Admission, Engine};
use crate::backend::BackendError;
use crate::core::reserved;
use crate::core::{Error, InferRequest, InferResponse};
use crate::invalid_arg;
use crate::metrics::FailureReason;
use crate::repository::sequence::SequenceFlags;
use crate::repository::visit_order;
use crate::scheduler::{self, ScheduleError};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Engine {
    /// Runs one inference request that answers once: the one way such a request reaches its
    /// model, from either front end, a Python model's calls, the OpenAI and embeddings front ends
    /// (an ensemble's steps run the same path with their request's scope). The model is looked
    /// up once, here; a decoupled model is refused here, in the words of the context's origin.
    ///
    /// # Errors
    /// Lookup errors as [`Engine::model_metadata`]; UNSUPPORTED for a decoupled model;
    /// INVALID_ARGUMENT for a request that does not fit the model; RESOURCE_EXHAUSTED when the
    /// model version is at its `max_inflight_requests`; INTERNAL when the model fails while
    /// running; each with how it counts (see [`Failed::stage`]).
    pub async fn infer(
        &self,
        request: InferRequest,
        context: Context,
    ) -> Result<InferResponse, Failed> {
        let Context { admission, scope } = context;
        self.infer_in(request, Some(admission), scope).await
    }

    /// Runs one of an ensemble's steps in its request's `scope` (see [`Engine::infer`]).
    pub(super) async fn run(
        &self,
        request: InferRequest,
        scope: Scope,
    ) -> Result<InferResponse, Error> {
        self.infer_in(request, None, scope)
            .await
            .map_err(Failed::into_error)
    }

    /// [`Engine::infer`] on the version `target` resolved to (see [`Engine::target`]).
    ///
    /// # Errors
    /// As [`Engine::infer`].
    pub async fn infer_on(
        &self,
        target: Target,
        request: InferRequest,
        context: Context,
    ) -> Result<InferResponse, Failed> {
        let Context { admission, scope } = context;
        self.infer_at(target, request, Some(admission), scope).await
    }

    /// [`Engine::infer`], holding `admission` (none for an ensemble's step) until answered.
    async fn infer_in(
        &self,
        request: InferRequest,
        admission: Option<Admission>,
        scope: Scope,
    ) -> Result<InferResponse, Failed> {
        let target = self
            .target_loading(&request.model_name, &request.model_version)
            .await?;
        self.infer_at(target, request, admission, scope).await
    }

    /// [`Engine::infer_on`] with the request's parts.
    async fn infer_at(
        &self,
        target: Target,
        request: InferRequest,
        admission: Option<Admission>,
        scope: Scope,
    ) -> Result<InferResponse, Failed> {
        if target.answers() != Answers::Once {
            let generates = target.answers() == Answers::Generation;
            return Err(refuse_decoupled(target.name(), generates, scope.origin).into());
        }
        let mut call = self.begin(target, request, admission, scope);
        let (job, slots) = self.check_once(&mut call)?;
        self.run_once(call, job, slots).await
    }

    /// Runs a checked `call` that answers once: its `job` on its version, its outputs shaped
    /// into the response (and written to the shared-memory `slots` it named).
    pub(super) async fn run_once(
        &self,
        call: Call,
        job: Job,
        slots: OutputSlots,
    ) -> Result<InferResponse, Failed> {
        let serving = Arc::clone(&call.serving);
        let record = Recorder::new(&serving.stats, call.arrived);
        let (produced, ran) = match self.execute(&call, job).await {
            Ok(done) => done,
            Err(failed) => {
                record.failed(&failed.counted);
                return Err(failed);
            }
        };
        let answer = response::response(&call.model, &serving, call.request, produced.tensors)
            .and_then(|mut answer| {
                tensors::write_outputs(&slots, &mut answer)?;
                answer.parameters.extend(produced.parameters);
                Ok(answer)
            });
        // The model answered: a success, even when its outputs cannot be written as asked (a
        // shared memory region too small), as Triton counts it.
        record.answered(&ran);
        answer.map_err(|e| Failed::new(e, Counted::Answered(ran)))
    }
}

/// The one refusal of a decoupled model's request that must answer once, in the words of
/// whoever sent it: Triton's gRPC and HTTP front ends each have theirs.
pub(super) fn refuse_decoupled(model: &str, generates: bool, origin: Origin) -> Error {
    Error::Unsupported(match (origin, generates) {
        (Origin::Grpc, _) => {
            "ModelInfer RPC doesn't support models with decoupled transaction policy".into()
        }
        (Origin::Http, _) => {
            "HTTP end point doesn't support models with decoupled transaction policy".into()
        }
        (Origin::Model, true) => {
            format!("model '{model}' is decoupled: use ModelStreamInfer or the generate endpoints")
        }
        (Origin::Model, false) => format!("model '{model}' is decoupled: use ModelStreamInfer"),
    })
}

/// `inputs` (`rows` of them) as the scheduler queues them, with the request's `priority` and
/// `timeout` parameters and its client's `deadline`.
pub(super) fn queued<T>(
    request: &InferRequest,
    deadline: Option<Instant>,
    rows: usize,
    inputs: T,
) -> scheduler::Request<T> {
    scheduler::Request {
        inputs,
        rows,
        priority: unsigned_param(request, "priority"),
        timeout: unsigned_param(request, "timeout")
            .filter(|&t| t > 0)
            .map(Duration::from_micros),
        deadline,
    }
}

/// A non-negative integer request parameter (`priority`, `timeout`), from either integer kind.
fn unsigned_param(request: &InferRequest, key: &str) -> Option<u64> {
    request.parameters.get(key)?.as_unsigned()
}

/// Scheduler outcomes in Triton's words, counted for metrics as Triton counts them: nowhere for
/// a request refused as it was queued (a full queue, an overload).
pub(super) fn schedule_error(error: ScheduleError, prefix: &str, model: &str) -> Failed {
    let (error, reason) = match error {
        ScheduleError::QueueFull => (Error::Unavailable(format!("{prefix}{error}")), None),
        // Triton says this one without the request's id.
        ScheduleError::Timeout => (
            Error::Unavailable(error.to_string()),
            Some(FailureReason::Rejected),
        ),
        ScheduleError::Overloaded(_) => (
            Error::ResourceExhausted(format!("{prefix}{error} for model '{model}'")),
            None,
        ),
        ScheduleError::Deadline => (
            Error::DeadlineExceeded(format!("{prefix}{error}")),
            Some(FailureReason::Rejected),
        ),
        ScheduleError::Backend(BackendError::Input(message)) => (
            invalid_arg!("{message} (model '{model}')"),
            Some(FailureReason::Other),
        ),
        ScheduleError::Backend(other) => (
            Error::Internal(other.to_string()),
            Some(FailureReason::Backend),
        ),
        ScheduleError::Stopped => (
            Error::Unavailable(format!("{prefix}{error}")),
            Some(FailureReason::Other),
        ),
    };
    Failed::new(error, Counted::from(reason))
}

/// The order a Python model's `request.inputs()` lists a request's validated `inputs` in, those
/// it sent in `arrival` order and the sequence controls the server added: Triton's.
pub(super) fn python_listing(arrival: &[String], inputs: &[crate::core::Tensor]) -> Vec<usize> {
    let arrival: Vec<&str> = arrival.iter().map(String::as_str).collect();
    let names: Vec<&str> = inputs.iter().map(|input| input.name.as_str()).collect();
    visit_order::listed_order(&arrival, &names)
}

/// Where a stateful Python model's request stands in its sequence: its correlation ID, its
/// START / END flags (Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_*`), and the slot (instance)
/// its sequence was given.
pub(super) fn python_sequence(
    flags: &SequenceFlags,
    slot: usize,
) -> crate::backend::python::SequenceOf {
    use crate::repository::sequence::CorrId;
    crate::backend::python::SequenceOf {
        correlation_id: match &flags.id {
            CorrId::Number(n) => serde_json::json!(n),
            CorrId::Text(s) => serde_json::json!(s),
        },
        flags: u32::from(flags.start) | (u32::from(flags.end) << 1),
        slot,
    }
}

/// Rejects reserved `triton_*` keys and malformed `classification` counts before the model runs.
/// Triton's other reserved keys (`priority`, `timeout`, `sequence_*`) are accepted.
pub(super) fn check_parameters(request: &InferRequest) -> Result<(), Error> {
    for key in request.parameters.keys() {
        if reserved::has_triton_prefix(key) && reserved::reserved(key).is_none() {
            // Triton's REST words; its gRPC front end words it otherwise (protocol::codec).
            return Err(invalid_arg!(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            ));
        }
    }
    for output in &request.outputs {
        classification::requested_count(
            output.parameters.get(classification::CLASSIFICATION),
            &output.name,
        )?;
    }
    Ok(())
}
