//! The inference pipeline: one request to its response. [`Engine::infer`] enters here; the
//! model is looked up once, a decoupled model refused in the words of the request's origin, the
//! request checked (parameters, shared memory, the config), a cache hit answered, and the rest
//! handed to its version's [`Execution`](super::execution::Execution); statistics go through
//! one [`Recorder`], trace stamps through [`super::traces`].

use super::context::{Origin, Scope};
use super::execution::{self, Answered, Job, Miss, Produced};
use super::record::{Counted, Ran, Recorder};
use super::shared_memory::tensors;
use super::{classification, response, traces, validate, Engine};
use crate::backend::BackendError;
use crate::core::reserved;
use crate::core::{Error, InferRequest, InferResponse};
use crate::invalid_arg;
use crate::metrics::FailureReason;
use crate::repository::sequence::SequenceFlags;
use crate::repository::visit_order;
use crate::repository::ServingVersion;
use crate::scheduler::{self, ScheduleError};
use crate::trace::{Activity, TensorActivity};
use std::time::{Duration, Instant};

impl Engine {
    /// Runs one request in `scope` (see [`Engine::infer`]).
    pub(super) async fn run(
        &self,
        request: InferRequest,
        scope: Scope,
    ) -> Result<InferResponse, Error> {
        self.run_staged(request, scope)
            .await
            .map_err(|(error, _)| error)
    }

    /// [`Engine::run`], telling where a failure happened.
    pub(super) async fn run_staged(
        &self,
        mut request: InferRequest,
        scope: Scope,
    ) -> Result<InferResponse, (Error, Stage)> {
        let arrived = Instant::now();
        let (model, serving) = self
            .resolve(&request.model_name, &request.model_version)
            .map_err(|e| (e, Stage::Refused))?;
        let execution = execution::of(&serving.executor);
        if execution.decoupled(self, 0) {
            let generates = matches!(serving.executor, crate::repository::Executor::Generate(_));
            let refusal = refuse_decoupled(&model.name, generates, scope.origin);
            return Err((refusal, Stage::Refused));
        }
        if let Some(trace) = &scope.trace {
            trace.describe(&model.name, serving.version, &request.id);
            trace.record(Activity::RequestStart, arrived);
        }
        let record = Recorder::new(&serving.stats, arrived);
        let prefix = validate::request_prefix(&request.id);
        let memory = &self.shared_memory;
        let mut output_slots = tensors::OutputSlots::new();
        // A stateful model's request belongs to a sequence.
        let flags = serving
            .sequences
            .as_ref()
            .map(|sequences| sequences.flags(&request, &model.name))
            .transpose();
        let arrival = execution.arrival(&request);
        let scheduled = check_parameters(&request)
            .and_then(|()| flags.as_ref().map(|_| ()).map_err(Clone::clone))
            .and_then(|()| tensors::read_inputs(memory, &model.name, &prefix, &mut request))
            .and_then(|()| {
                output_slots = tensors::output_slots(memory, &request)?;
                validate::prepare_inputs(&model.name, &serving.io, &mut request)
            })
            // Refused before the model's scheduler had it: counted nowhere, as in Triton.
            .map_err(|e| (e, Counted::Nowhere))
            .inspect(|inputs| {
                if let Some(trace) = &scope.trace {
                    trace.tensors(TensorActivity::QueueInput, inputs);
                }
            })
            .map(|inputs| {
                queued(
                    &request,
                    scope.deadline,
                    validate::rows(&serving.io, &inputs),
                    inputs,
                )
            });
        let call = Call {
            model: &model.name,
            serving: &serving,
            request: &request,
            scope: &scope,
            prefix: &prefix,
            sequence: flags.as_ref().ok().and_then(Option::as_ref),
            arrival: &arrival,
            arrived,
        };
        let result = match scheduled {
            Ok(job) => self.execute(&call, execution, job).await,
            Err(failure) => Err(failure),
        };
        let _end = scope.trace.map(|trace| crate::trace::RecordOnDrop {
            trace,
            activity: Activity::RequestEnd,
        });
        let (produced, ran) = match result {
            Ok(done) => done,
            Err((error, counted)) => return Err((error, record.failed(counted))),
        };
        let answer = response::response(&model, &serving, request, produced.tensors).and_then(
            |mut answer| {
                tensors::write_outputs(&output_slots, &mut answer)?;
                answer.parameters.extend(produced.parameters);
                Ok(answer)
            },
        );
        // The model answered: a success, even when its outputs cannot be written as asked (a
        // shared memory region too small), as Triton counts it.
        record.answered(&ran);
        answer.map_err(|e| (e, Stage::Failed))
    }

    /// Answers a checked request's `job` from the response cache (for versions that use it: a
    /// hit answers without running), or runs it on its version's `execution`.
    async fn execute(
        &self,
        call: &Call<'_>,
        execution: &dyn execution::Execution,
        job: Job,
    ) -> Answered {
        let serving = call.serving;
        let mut miss: Option<Miss<'_>> = None;
        if let Some(cache) = self.cache.as_ref().filter(|_| serving.cache) {
            let started = Instant::now();
            let key = cache.key(call.model, serving.version, &job.inputs);
            match cache.get(key) {
                Some(outputs) => {
                    // Queued and answered, as Triton traces a hit: no compute.
                    if let Some(trace) = &call.scope.trace {
                        trace.record(Activity::QueueStart, started);
                        traces::record_outputs(trace, call.request, &outputs);
                    }
                    let queue = started.duration_since(call.arrived);
                    let lookup = started.elapsed();
                    let produced = Produced::from(outputs.to_vec());
                    return Ok((produced, Ran::Cached { queue, lookup }));
                }
                None => miss = Some((cache, key, started.elapsed())),
            }
        }
        execution.run(self, call, job, miss).await
    }
}

/// What the ways of running a request share of it.
pub(super) struct Call<'a> {
    pub(super) model: &'a str,
    pub(super) serving: &'a ServingVersion,
    pub(super) request: &'a InferRequest,
    /// Its origin, deadline, trace and ensemble depth.
    pub(super) scope: &'a Scope,
    /// Its id as Triton's messages begin with it.
    pub(super) prefix: &'a str,
    /// Its sequence's flags, for a stateful version's request.
    pub(super) sequence: Option<&'a SequenceFlags>,
    /// The inputs it sent, in its order, for a Python model (see
    /// [`execution::Execution::arrival`]).
    pub(super) arrival: &'a [String],
    pub(super) arrived: Instant,
}

/// A request [`Engine::infer`] did not answer: its error, and where it stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub error: Error,
    pub stage: Stage,
}

impl Failed {
    /// The error alone, for those that do not tell the stages apart.
    pub fn into_error(self) -> Error {
        self.error
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

/// Where a failed request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Refused before its model had it: lookup, validation, admission, its sequence, the queue.
    Refused,
    /// Its model had it and failed it (or its outputs could not be answered).
    Failed,
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

/// Scheduler outcomes in Triton's words, with the failure reason for metrics: `None` for a
/// request refused as it was queued (a full queue, an overload), which Triton counts nowhere.
pub(super) fn schedule_error(
    error: ScheduleError,
    prefix: &str,
    model: &str,
) -> (Error, Option<FailureReason>) {
    match error {
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
    }
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
