//! How each kind of serving version runs a checked request that answers once, chosen by one
//! match on its [`Executor`]: the part of the pipeline ([`super::run`]) that differs between
//! ONNX Runtime sessions behind the scheduler, Python models and ensembles. Everything around
//! it (the lookup, the checks, a cache hit, the statistics, the trace's ends) the pipeline does
//! alike for all.

use super::cache::{Key, ResponseCache};
use super::prepare::Call;
use super::record::{Counted, Failed, Ran};
use super::run::{python_listing, python_sequence, refuse_decoupled, schedule_error};
use super::{traces, Engine};
use crate::backend::python::{Answer, Outputs};
use crate::core::{Parameters, Tensor};
use crate::metrics::FailureReason;
use crate::repository::ensemble::EnsemblePlan;
use crate::repository::python::PythonModel;
use crate::repository::sequence::{Sequences, Turn};
use crate::repository::Executor;
use crate::scheduler::{self, ScheduleError, Scheduler};
use crate::trace::Activity;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A checked request as the scheduler queues it.
pub(super) type Job = scheduler::Request<Vec<Tensor>>;

/// A response-cache miss: the cache, the request's key and how long the lookup took; the
/// outputs go in once made.
pub(super) type Miss<'c> = (&'c ResponseCache, Key, Duration);

/// A request's outputs and how they were made, or its error and how it counts.
pub(super) type Answered<T = Produced> = Result<(T, Ran), Failed>;

/// What a model made for a request: its outputs, and the parameters it gave its response (a
/// Python model's).
#[derive(Default)]
pub(super) struct Produced {
    pub tensors: Vec<Tensor>,
    pub parameters: Parameters,
}

impl From<Vec<Tensor>> for Produced {
    fn from(tensors: Vec<Tensor>) -> Produced {
        Produced {
            tensors,
            parameters: Parameters::new(),
        }
    }
}

impl Engine {
    /// Answers a checked request's `job` from the response cache (for versions that use it: a
    /// hit answers without running), or runs it on its version's executor.
    pub(super) async fn execute(&self, call: &Call, job: Job) -> Answered {
        let serving = &call.serving;
        let mut miss: Option<Miss<'_>> = None;
        if let Some(cache) = self.cache.as_ref().filter(|_| serving.cache) {
            let started = Instant::now();
            let key = cache.key(&call.model.name, serving.version, &job.inputs);
            match cache.get(key) {
                Some(outputs) => {
                    // Queued and answered, as Triton traces a hit: no compute.
                    if let Some(trace) = &call.scope.trace {
                        trace.record(Activity::QueueStart, started);
                        traces::record_outputs(trace, &call.request, &outputs);
                    }
                    let queue = started.duration_since(call.arrived);
                    let lookup = started.elapsed();
                    let produced = Produced::from(outputs.to_vec());
                    return Ok((produced, Ran::Cached { queue, lookup }));
                }
                None => miss = Some((cache, key, started.elapsed())),
            }
        }
        match &serving.executor {
            // ONNX Runtime sessions (CPU or CUDA) behind the version's scheduler.
            Executor::Batched(scheduler) => run_batched(call, scheduler, job, miss).await,
            // A Python model's instances (stub processes).
            Executor::Python(python) => run_python(call, python, job, miss).await,
            // Each step an ordinary request to its model; its responses are not cached.
            Executor::Ensemble(plan) => run_composed(self, call, plan, job).await,
            // Decoupled: refused before it gets here ([`Engine::infer`]).
            Executor::Generate(_) => {
                let refused = refuse_decoupled(&call.model.name, true, call.scope.origin);
                Err(refused.into())
            }
        }
    }
}

/// Runs a request on a batched model's scheduler, in its sequence's turn, storing a cache
/// miss's outputs.
async fn run_batched(
    call: &Call,
    scheduler: &Scheduler,
    mut job: Job,
    miss: Option<Miss<'_>>,
) -> Answered {
    let rows = job.rows;
    // A sequence's requests run one at a time, with the states its last one left.
    let turn = take_turn(call, rows, &mut job.inputs).await?;
    let mut ran = scheduler
        .submit(job)
        .await
        .map_err(|e| schedule_error(e, &call.prefix, &call.model.name));
    if let Some((sequences, turn)) = turn {
        if let Ok(outcome) = &mut ran {
            sequences.finish(turn, &mut outcome.outputs);
        }
    }
    if let (Some(miss), Ok(outcome)) = (miss, &ran) {
        fill(call, miss, &outcome.outputs);
    }
    if let (Some(trace), Ok(outcome)) = (call.scope.trace.as_ref(), &ran) {
        traces::record_outcome(trace, outcome);
        traces::record_outputs(trace, &call.request, &outcome.outputs);
    }
    ran.map(|outcome| {
        let ran = Ran::Executed {
            rows,
            timing: outcome.timing(),
        };
        (outcome.outputs.into(), ran)
    })
}

/// Runs a request on a (not decoupled) Python model's instances, in its sequence's turn,
/// storing a cache miss's outputs.
async fn run_python(
    call: &Call,
    python: &PythonModel,
    mut job: Job,
    miss: Option<Miss<'_>>,
) -> Answered {
    let (request, rows, trace) = (&call.request, job.rows, call.scope.trace.as_ref());
    // A sequence's requests run one at a time, in order, on one instance, with the control
    // inputs the config asks for; its state is the model's to keep.
    let turn = take_turn(call, rows, &mut job.inputs).await?;
    let sequence = call
        .sequence
        .as_ref()
        .zip(turn.as_ref())
        .map(|(flags, (_, turn))| python_sequence(flags, turn.slot()));
    let job = job.map(|inputs| crate::backend::python::Request {
        id: request.id.clone(),
        parameters: request.parameters.clone(),
        outputs: request.outputs.iter().map(|o| o.name.clone()).collect(),
        listed: python_listing(&call.arrival, &inputs),
        inputs,
        sequence,
        trace: trace.cloned(),
    });
    let executed = python.execute(job).await;
    if let (Some(trace), Ok(outcome)) = (trace, &executed) {
        traces::record_outcome(trace, outcome);
    }
    let mut ran = python_answer(executed, rows, call);
    if let Some((sequences, turn)) = turn {
        if let Ok((outputs, ..)) = &mut ran {
            sequences.finish(turn, &mut outputs.tensors);
        }
    }
    if let (Some(trace), Ok((outputs, ..))) = (trace, &ran) {
        traces::record_outputs(trace, request, &outputs.tensors);
    }
    // Cached: a response with every output (the model may leave out outputs a request did not
    // ask for) and no parameters of its own (the cache keeps tensors only).
    if let (Some(miss), Ok((outputs, ..))) = (miss, &ran) {
        if request.outputs.is_empty() && outputs.parameters.is_empty() {
            fill(call, miss, &outputs.tensors);
        }
    }
    ran.map(|(outputs, ran)| {
        let produced = Produced {
            tensors: outputs.tensors,
            parameters: outputs.parameters,
        };
        (produced, ran)
    })
}

/// Stores a cache miss's outputs, and the time the miss cost (the lookup and the insertion, as
/// Triton counts it; not the run between).
fn fill(call: &Call, (cache, key, looked): Miss<'_>, outputs: &[Tensor]) {
    let stored = Instant::now();
    cache.insert(key, Arc::from(outputs.to_vec()));
    call.serving
        .stats
        .record_cache_miss(looked + stored.elapsed());
}

/// A Python model's answer to a request of `rows`: its outputs, its error response (which
/// counts as answered), its failure, or the scheduler's refusal.
fn python_answer(
    executed: Result<scheduler::Outcome<Answer>, ScheduleError>,
    rows: usize,
    call: &Call,
) -> Answered<Outputs> {
    match executed {
        Ok(outcome) => {
            let timing = outcome.timing();
            let ran = Ran::Executed { rows, timing };
            match outcome.outputs {
                Ok(mut outputs) => match outputs.refused.take() {
                    Some(error) => Err(Failed::new(error, Counted::Answered(ran))),
                    None => Ok((outputs, ran)),
                },
                Err(error) => Err(Failed::new(error, Counted::Failure(FailureReason::Backend))),
            }
        }
        Err(error) => Err(schedule_error(error, &call.prefix, &call.model.name)),
    }
}

/// Runs an ensemble's request through its steps.
async fn run_composed(engine: &Engine, call: &Call, plan: &EnsemblePlan, job: Job) -> Answered {
    let rows = job.rows;
    let trace = call.scope.trace.as_ref();
    if let Some(trace) = trace {
        trace.record(Activity::QueueStart, Instant::now());
    }
    let io = &call.serving.io;
    let ran = engine
        .run_ensemble(
            &call.model.name,
            plan,
            io,
            job.inputs,
            &call.request,
            &call.scope,
        )
        .await;
    if let (Some(trace), Ok(outputs)) = (trace, &ran) {
        traces::record_outputs(trace, &call.request, outputs);
    }
    ran.map(|outputs| (outputs.into(), Ran::Composed { rows }))
        .map_err(|e| Failed::new(e, Counted::Failure(FailureReason::Other)))
}

/// A stateful version's request takes its turn in its sequence (waiting for the one before),
/// its control inputs and states joining `inputs`; `None` for other versions.
///
/// # Errors
/// The sequence's refusal (see [`crate::repository::sequence::Sequences::begin`]), counted
/// nowhere, as in Triton.
async fn take_turn<'s>(
    call: &'s Call,
    rows: usize,
    inputs: &mut Vec<Tensor>,
) -> Result<Option<(&'s Arc<Sequences>, Turn)>, Failed> {
    let (Some(sequences), Some(flags)) = (&call.serving.sequences, &call.sequence) else {
        return Ok(None);
    };
    let turn = sequences
        .begin(flags.clone(), rows, &call.model.name)
        .await?;
    inputs.extend(sequences.inputs(&turn));
    Ok(Some((sequences, turn)))
}
