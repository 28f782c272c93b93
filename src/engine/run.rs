//! Running one request to its response: its checks, its turn in its sequence, the cache, the
//! model's executor (batched, Python, ensemble) and its statistics as Triton counts them.

use super::cache::{Key, ResponseCache};
use super::shared_memory::tensors;
use super::{classification, response, traces, validate, Engine};
use crate::backend::python::{Answer, Outputs};
use crate::backend::BackendError;
use crate::core::{Error, InferRequest, InferResponse, Parameters, Tensor};
use crate::invalid_arg;
use crate::metrics::{FailureReason, ModelStats};
use crate::repository::python::PythonModel;
use crate::repository::sequence::SequenceFlags;
use crate::repository::visit_order;
use crate::repository::{Executor, ServingVersion};
use crate::scheduler::{self, ScheduleError, Scheduler};
use crate::trace::{Activity, TensorActivity, Trace};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Engine {
    /// Runs one request; `depth` counts the ensembles it is a step of.
    pub(super) async fn run(
        &self,
        request: InferRequest,
        depth: usize,
    ) -> Result<InferResponse, Error> {
        self.run_staged(request, depth)
            .await
            .map_err(|(error, _)| error)
    }

    /// [`Engine::run`], telling where a failure happened.
    pub(super) async fn run_staged(
        &self,
        mut request: InferRequest,
        depth: usize,
    ) -> Result<InferResponse, (Error, Stage)> {
        let arrived = Instant::now();
        let trace = request.trace.take();
        let (model, serving) = self
            .resolve(&request.model_name, &request.model_version)
            .map_err(|e| (e, Stage::Refused))?;
        if let Some(trace) = &trace {
            trace.describe(&model.name, serving.version, &request.id);
            trace.record(Activity::RequestStart, arrived);
        }
        let mut record = Recorder {
            stats: &serving.stats,
            arrived,
            finished: false,
        };
        let prefix = validate::request_prefix(&request.id);
        let memory = &self.shared_memory;
        let mut output_slots = tensors::OutputSlots::new();
        // A stateful model's request belongs to a sequence.
        let flags = serving
            .sequences
            .as_ref()
            .map(|sequences| sequences.flags(&request, &model.name))
            .transpose();
        let arrival = arrival(&serving.executor, &request);
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
                if let Some(trace) = &trace {
                    trace.tensors(TensorActivity::QueueInput, inputs);
                }
            })
            .map(|inputs| queued(&request, validate::rows(&serving.io, &inputs), inputs));
        // Parameters a Python model gave its response.
        let mut model_parameters = crate::core::Parameters::new();
        let call = Call {
            model: &model.name,
            serving: &serving,
            request: &request,
            trace: trace.as_ref(),
            prefix: &prefix,
            sequence: flags.as_ref().ok().and_then(Option::as_ref),
            arrived,
        };
        let result = match scheduled {
            Ok(job) => {
                self.execute(&call, job, &arrival, &mut model_parameters, depth)
                    .await
            }
            Err(failure) => Err(failure),
        };
        record.finished = true;
        let _end = trace.map(|trace| crate::trace::RecordOnDrop {
            trace,
            activity: Activity::RequestEnd,
        });
        let (outputs, ran) = match result {
            Ok(done) => done,
            Err((error, counted)) => {
                return Err((error, counted.record(&serving.stats, arrived.elapsed())))
            }
        };
        let answer =
            response::response(&model, &serving, request, outputs).and_then(|mut answer| {
                tensors::write_outputs(&output_slots, &mut answer)?;
                answer.parameters.extend(model_parameters);
                Ok(answer)
            });
        // The model answered: a success, even when its outputs cannot be written as asked (a
        // shared memory region too small), as Triton counts it.
        ran.record_success(&serving.stats, arrived.elapsed());
        answer.map_err(|e| (e, Stage::Failed))
    }

    /// Runs a checked request's `job` on its model's executor, or answers it from the response
    /// cache (for versions that use it: a hit answers without running).
    async fn execute(
        &self,
        call: &Call<'_>,
        job: scheduler::Request<Vec<Tensor>>,
        arrival: &[String],
        model_parameters: &mut Parameters,
        depth: usize,
    ) -> Answered {
        let serving = call.serving;
        let lookup = self.cache.as_ref().filter(|_| serving.cache).map(|cache| {
            let started = Instant::now();
            let key = cache.key(call.model, serving.version, &job.inputs);
            let hit = cache.get(key);
            (cache, key, hit, started)
        });
        match (lookup, &serving.executor) {
            (Some((_, _, Some(outputs), started)), _) => {
                // Queued and answered, as Triton traces a hit: no compute.
                if let Some(trace) = call.trace {
                    trace.record(Activity::QueueStart, started);
                    traces::record_outputs(trace, call.request, &outputs);
                }
                let queue = started.duration_since(call.arrived);
                let lookup = started.elapsed();
                Ok((outputs.to_vec(), Ran::Cached { queue, lookup }))
            }
            (lookup, Executor::Batched(scheduler)) => {
                run_batched(call, scheduler, job, lookup).await
            }
            (_, Executor::Ensemble(plan)) => self.run_composed(call, plan, job, depth).await,
            (_, Executor::Python(python)) if python.decoupled() => Err((
                Error::Unsupported(format!(
                    "model '{}' is decoupled: use ModelStreamInfer",
                    call.model
                )),
                Counted::Nowhere,
            )),
            (lookup, Executor::Python(python)) => {
                let ran = run_python(call, python, job, lookup, arrival).await;
                ran.map(|(outputs, ran)| {
                    *model_parameters = outputs.parameters;
                    (outputs.tensors, ran)
                })
            }
            (_, Executor::Generate(_)) => Err((
                Error::Unsupported(format!(
                    "model '{}' is decoupled: use ModelStreamInfer or the generate endpoints",
                    call.model
                )),
                Counted::Nowhere,
            )),
        }
    }

    /// Runs an ensemble's request through its steps.
    async fn run_composed(
        &self,
        call: &Call<'_>,
        plan: &crate::repository::ensemble::EnsemblePlan,
        job: scheduler::Request<Vec<Tensor>>,
        depth: usize,
    ) -> Answered {
        let rows = job.rows;
        if let Some(trace) = call.trace {
            trace.record(Activity::QueueStart, Instant::now());
        }
        let caller = (call.request, call.trace);
        let io = &call.serving.io;
        let ran = self
            .run_ensemble(call.model, plan, io, job.inputs, caller, depth)
            .await;
        if let (Some(trace), Ok(outputs)) = (call.trace, &ran) {
            traces::record_outputs(trace, call.request, outputs);
        }
        ran.map(|outputs| (outputs, Ran::Composed { rows }))
            .map_err(|e| (e, Counted::Failure(FailureReason::Other)))
    }
}

/// What [`Engine::execute`]'s ways of running a request share of it.
struct Call<'a> {
    model: &'a str,
    serving: &'a ServingVersion,
    request: &'a InferRequest,
    trace: Option<&'a Arc<Trace>>,
    /// Its id as Triton's messages begin with it.
    prefix: &'a str,
    /// Its sequence's flags, for a stateful version's request.
    sequence: Option<&'a SequenceFlags>,
    arrived: Instant,
}

/// A response-cache lookup: the cache, the request's key, what it held, and when it began.
type Lookup<'c> = (&'c ResponseCache, Key, Option<Arc<[Tensor]>>, Instant);

/// A request's outputs and how they were made, or its error and how it counts.
type Answered<T = Vec<Tensor>> = Result<(T, Ran), (Error, Counted)>;

/// Runs a request on a batched model's scheduler, in its sequence's turn, storing a cache
/// miss's outputs.
async fn run_batched(
    call: &Call<'_>,
    scheduler: &Scheduler,
    mut job: scheduler::Request<Vec<Tensor>>,
    lookup: Option<Lookup<'_>>,
) -> Answered {
    let looked = lookup.as_ref().map(|(.., started)| started.elapsed());
    let rows = job.rows;
    // A sequence's requests run one at a time, with the states its last one left.
    let turn = take_turn(call, rows, &mut job.inputs).await?;
    let mut ran = scheduler.submit(job).await.map_err(|e| {
        let (error, reason) = schedule_error(e, call.prefix, call.model);
        (error, Counted::from(reason))
    });
    if let Some((sequences, turn)) = turn {
        if let Ok(outcome) = &mut ran {
            sequences.finish(turn, &mut outcome.outputs);
        }
    }
    if let (Some((cache, key, None, _)), Some(looked), Ok(outcome)) = (lookup, looked, &ran) {
        let stored = Instant::now();
        cache.insert(key, Arc::from(outcome.outputs.clone()));
        call.serving
            .stats
            .record_cache_miss(looked + stored.elapsed());
    }
    if let (Some(trace), Ok(outcome)) = (call.trace, &ran) {
        traces::record_outcome(trace, outcome);
        traces::record_outputs(trace, call.request, &outcome.outputs);
    }
    ran.map(|outcome| {
        let ran = Ran::Executed {
            rows,
            timing: outcome.timing(),
        };
        (outcome.outputs, ran)
    })
}

/// Runs a request on a (not decoupled) Python model's instances, in its sequence's turn,
/// storing a cache miss's outputs.
async fn run_python(
    call: &Call<'_>,
    python: &PythonModel,
    mut job: scheduler::Request<Vec<Tensor>>,
    lookup: Option<Lookup<'_>>,
    arrival: &[String],
) -> Answered<Outputs> {
    let looked = lookup.as_ref().map(|(.., started)| started.elapsed());
    let (request, rows) = (call.request, job.rows);
    // A sequence's requests run one at a time, in order, on one instance, with the control
    // inputs the config asks for; its state is the model's to keep.
    let turn = take_turn(call, rows, &mut job.inputs).await?;
    let sequence = call
        .sequence
        .zip(turn.as_ref())
        .map(|(flags, (_, turn))| python_sequence(flags, turn.slot()));
    let job = job.map(|inputs| crate::backend::python::Request {
        id: request.id.clone(),
        parameters: request.parameters.clone(),
        outputs: request.outputs.iter().map(|o| o.name.clone()).collect(),
        listed: python_listing(arrival, &inputs),
        inputs,
        sequence,
        trace: call.trace.cloned(),
    });
    let executed = python.execute(job).await;
    if let (Some(trace), Ok(outcome)) = (call.trace, &executed) {
        traces::record_outcome(trace, outcome);
    }
    let mut ran = python_answer(executed, rows, call);
    if let Some((sequences, turn)) = turn {
        if let Ok((outputs, ..)) = &mut ran {
            sequences.finish(turn, &mut outputs.tensors);
        }
    }
    if let (Some(trace), Ok((outputs, ..))) = (call.trace, &ran) {
        traces::record_outputs(trace, request, &outputs.tensors);
    }
    // Cached: a response with every output (the model may leave out outputs a request did not
    // ask for) and no parameters of its own (the cache keeps tensors only).
    if let (Some((cache, key, None, _)), Some(looked), Ok((outputs, ..)), true) =
        (lookup, looked, &ran, request.outputs.is_empty())
    {
        if outputs.parameters.is_empty() {
            let stored = Instant::now();
            cache.insert(key, Arc::from(outputs.tensors.clone()));
            call.serving
                .stats
                .record_cache_miss(looked + stored.elapsed());
        }
    }
    ran
}

/// A Python model's answer to a request of `rows`: its outputs, its error response (which
/// counts as answered), its failure, or the scheduler's refusal.
fn python_answer(
    executed: Result<scheduler::Outcome<Answer>, ScheduleError>,
    rows: usize,
    call: &Call<'_>,
) -> Answered<Outputs> {
    match executed {
        Ok(outcome) => {
            let timing = outcome.timing();
            let ran = Ran::Executed { rows, timing };
            match outcome.outputs {
                Ok(mut outputs) => match outputs.refused.take() {
                    Some(error) => Err((error, Counted::Answered(ran))),
                    None => Ok((outputs, ran)),
                },
                Err(error) => Err((error, Counted::Failure(FailureReason::Backend))),
            }
        }
        Err(error) => {
            let (error, reason) = schedule_error(error, call.prefix, call.model);
            Err((error, Counted::from(reason)))
        }
    }
}

/// Where a failed request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Refused before its model had it: lookup, validation, admission, its sequence, the queue.
    Refused,
    /// Its model had it and failed it (or its outputs could not be answered).
    Failed,
}

/// How a request that failed counts in its model's statistics, as Triton counts it.
enum Counted {
    /// Refused before its model's scheduler had it: nowhere.
    Nowhere,
    /// A failure, for this reason.
    Failure(FailureReason),
    /// A success: its model answered it, with an error (a Python model's error response, which
    /// Triton's Python backend counts as a response sent).
    Answered(Ran),
}

impl Counted {
    /// Records a request that failed after `total` as Triton counts it, and says where it
    /// stopped.
    fn record(self, stats: &ModelStats, total: Duration) -> Stage {
        match self {
            Counted::Nowhere => Stage::Refused,
            Counted::Failure(reason) => {
                stats.record_failure(total, reason);
                // The model (or an ensemble's step) had it: its answer says so. A timeout in
                // the queue or a cancellation is a refusal.
                match reason {
                    FailureReason::Backend | FailureReason::Other => Stage::Failed,
                    FailureReason::Rejected | FailureReason::Canceled => Stage::Refused,
                }
            }
            Counted::Answered(ran) => {
                ran.record_success(stats, total);
                Stage::Failed
            }
        }
    }
}

impl From<Option<FailureReason>> for Counted {
    fn from(reason: Option<FailureReason>) -> Counted {
        reason.map_or(Counted::Nowhere, Counted::Failure)
    }
}

/// How a request got its outputs, for its statistics.
pub(super) enum Ran {
    /// Its model ran it (in a batch, possibly).
    Executed {
        rows: usize,
        timing: crate::metrics::Timing,
    },
    /// The response cache held them; the request reached it after `queue` (checks, as Triton
    /// counts a hit's time queued) and finding them took `lookup`.
    Cached { queue: Duration, lookup: Duration },
    /// An ensemble's steps made them.
    Composed { rows: usize },
}

impl Ran {
    /// Statistics of a request answered in `total`.
    pub(super) fn record_success(&self, stats: &ModelStats, total: Duration) {
        match self {
            Ran::Executed { rows, timing } => stats.record_success(*rows, total, *timing),
            Ran::Cached { queue, lookup } => stats.record_cache_hit(total, *queue, *lookup),
            // Triton counts an ensemble's request as one execution of its rows too.
            Ran::Composed { rows } => {
                stats.record_execution(*rows, Default::default(), None);
                stats.record_success(*rows, total, Default::default());
            }
        }
    }
}

/// Records a request whose caller stopped waiting as CANCELED.
struct Recorder<'a> {
    stats: &'a ModelStats,
    arrived: Instant,
    finished: bool,
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.stats
                .record_failure(self.arrived.elapsed(), FailureReason::Canceled);
        }
    }
}

/// `inputs` (`rows` of them) as the scheduler queues them, with the request's `priority` and
/// `timeout` parameters and its client's deadline.
pub(super) fn queued<T>(request: &InferRequest, rows: usize, inputs: T) -> scheduler::Request<T> {
    scheduler::Request {
        inputs,
        rows,
        priority: unsigned_param(request, "priority"),
        timeout: unsigned_param(request, "timeout")
            .filter(|&t| t > 0)
            .map(Duration::from_micros),
        deadline: request.deadline,
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

/// A stateful version's request takes its turn in its sequence (waiting for the one before),
/// its control inputs and states joining `inputs`; `None` for other versions.
///
/// # Errors
/// The sequence's refusal (see [`crate::repository::sequence::Sequences::begin`]), counted
/// nowhere, as in Triton.
async fn take_turn<'s>(
    call: &Call<'s>,
    rows: usize,
    inputs: &mut Vec<crate::core::Tensor>,
) -> Result<
    Option<(
        &'s Arc<crate::repository::sequence::Sequences>,
        crate::repository::sequence::Turn,
    )>,
    (Error, Counted),
> {
    let (Some(sequences), Some(flags)) = (&call.serving.sequences, call.sequence) else {
        return Ok(None);
    };
    let turn = sequences
        .begin(flags.clone(), rows, call.model)
        .await
        .map_err(|e| (e, Counted::Nowhere))?;
    inputs.extend(sequences.inputs(&turn));
    Ok(Some((sequences, turn)))
}

/// The names of the inputs a request sent, in its order, where they matter: a Python model lists
/// them in an order that follows it ([`python_listing`]).
pub(super) fn arrival(executor: &Executor, request: &InferRequest) -> Vec<String> {
    match executor {
        Executor::Python(_) => request.inputs.iter().map(|i| i.name.clone()).collect(),
        _ => Vec::new(),
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
        if key.starts_with("triton_") && key != "triton_enable_empty_final_response" {
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
