//! How each kind of serving version runs a checked request that answers once: the part of the
//! pipeline ([`super::run`]) that differs between ONNX Runtime sessions behind the scheduler,
//! Python models, ensembles and generation models. Everything around it (the lookup, the
//! checks, a cache hit, the statistics, the trace's ends) the pipeline does alike for all.

use super::cache::{Key, ResponseCache};
use super::record::{Counted, Ran};
use super::run::{python_listing, python_sequence, refuse_decoupled, schedule_error, Call};
use super::{traces, Engine};
use crate::backend::python::{Answer, Outputs};
use crate::core::{Error, Parameters, Tensor};
use crate::generate::Generator;
use crate::metrics::FailureReason;
use crate::repository::ensemble::EnsemblePlan;
use crate::repository::python::PythonModel;
use crate::repository::sequence::{Sequences, Turn};
use crate::repository::Executor;
use crate::scheduler::{self, ScheduleError, Scheduler};
use crate::trace::Activity;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A checked request as the scheduler queues it.
pub(super) type Job = scheduler::Request<Vec<Tensor>>;

/// A response-cache miss: the cache, the request's key and how long the lookup took; the
/// outputs go in once made.
pub(super) type Miss<'c> = (&'c ResponseCache, Key, Duration);

/// A request's outputs and how they were made, or its error and how it counts.
pub(super) type Answered<T = Produced> = Result<(T, Ran), (Error, Counted)>;

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

/// One kind of serving version's way of running requests.
pub(super) trait Execution: Sync {
    /// Whether its requests answer more than once (decoupled), `depth` ensembles down: those
    /// go through [`Engine::infer_stream`] or [`Engine::generate`], and [`Engine::infer`]
    /// refuses them.
    fn decoupled(&self, engine: &Engine, depth: usize) -> bool;

    /// The names of the inputs a request sent, in its order, where the model sees that order (a
    /// Python model's `request.inputs()`); taken before the checks reorder them.
    fn arrival(&self, _request: &crate::core::InferRequest) -> Vec<String> {
        Vec::new()
    }

    /// Runs `job` for `call`; `miss` is the response cache's miss to fill, for versions that
    /// cache.
    fn run<'a>(
        &'a self,
        engine: &'a Engine,
        call: &'a Call<'a>,
        job: Job,
        miss: Option<Miss<'a>>,
    ) -> BoxFuture<'a, Answered>;
}

/// The execution of a serving version's executor.
pub(super) fn of(executor: &Executor) -> &dyn Execution {
    match executor {
        Executor::Batched(scheduler) => scheduler,
        Executor::Python(python) => python.as_ref(),
        Executor::Ensemble(plan) => plan.as_ref(),
        Executor::Generate(generator) => generator,
    }
}

/// ONNX Runtime sessions (CPU or CUDA) behind the version's scheduler.
impl Execution for Scheduler {
    fn decoupled(&self, _: &Engine, _: usize) -> bool {
        false
    }

    fn run<'a>(
        &'a self,
        _: &'a Engine,
        call: &'a Call<'a>,
        job: Job,
        miss: Option<Miss<'a>>,
    ) -> BoxFuture<'a, Answered> {
        Box::pin(run_batched(call, self, job, miss))
    }
}

/// A Python model's instances (stub processes); a decoupled one's requests stream.
impl Execution for PythonModel {
    fn decoupled(&self, _: &Engine, _: usize) -> bool {
        PythonModel::decoupled(self)
    }

    fn arrival(&self, request: &crate::core::InferRequest) -> Vec<String> {
        request.inputs.iter().map(|i| i.name.clone()).collect()
    }

    fn run<'a>(
        &'a self,
        _: &'a Engine,
        call: &'a Call<'a>,
        job: Job,
        miss: Option<Miss<'a>>,
    ) -> BoxFuture<'a, Answered> {
        Box::pin(run_python(call, self, job, miss))
    }
}

/// An ensemble: each step an ordinary request to its model. Its responses are not cached.
impl Execution for EnsemblePlan {
    fn decoupled(&self, engine: &Engine, depth: usize) -> bool {
        engine.has_decoupled_step(self, depth)
    }

    fn run<'a>(
        &'a self,
        engine: &'a Engine,
        call: &'a Call<'a>,
        job: Job,
        _: Option<Miss<'a>>,
    ) -> BoxFuture<'a, Answered> {
        Box::pin(run_composed(engine, call, self, job))
    }
}

/// A generation model: decoupled, so never run here.
impl Execution for Generator {
    fn decoupled(&self, _: &Engine, _: usize) -> bool {
        true
    }

    fn run<'a>(
        &'a self,
        _: &'a Engine,
        call: &'a Call<'a>,
        _: Job,
        _: Option<Miss<'a>>,
    ) -> BoxFuture<'a, Answered> {
        let refused = refuse_decoupled(call.model, true, call.scope.origin);
        Box::pin(std::future::ready(Err((refused, Counted::Nowhere))))
    }
}

/// Runs a request on a batched model's scheduler, in its sequence's turn, storing a cache
/// miss's outputs.
async fn run_batched(
    call: &Call<'_>,
    scheduler: &Scheduler,
    mut job: Job,
    miss: Option<Miss<'_>>,
) -> Answered {
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
    if let (Some(miss), Ok(outcome)) = (miss, &ran) {
        fill(call, miss, &outcome.outputs);
    }
    if let (Some(trace), Ok(outcome)) = (call.scope.trace.as_ref(), &ran) {
        traces::record_outcome(trace, outcome);
        traces::record_outputs(trace, call.request, &outcome.outputs);
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
    call: &Call<'_>,
    python: &PythonModel,
    mut job: Job,
    miss: Option<Miss<'_>>,
) -> Answered {
    let (request, rows, trace) = (call.request, job.rows, call.scope.trace.as_ref());
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
        listed: python_listing(call.arrival, &inputs),
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
fn fill(call: &Call<'_>, (cache, key, looked): Miss<'_>, outputs: &[Tensor]) {
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

/// Runs an ensemble's request through its steps.
async fn run_composed(engine: &Engine, call: &Call<'_>, plan: &EnsemblePlan, job: Job) -> Answered {
    let rows = job.rows;
    let trace = call.scope.trace.as_ref();
    if let Some(trace) = trace {
        trace.record(Activity::QueueStart, Instant::now());
    }
    let io = &call.serving.io;
    let ran = engine
        .run_ensemble(call.model, plan, io, job.inputs, call.request, call.scope)
        .await;
    if let (Some(trace), Ok(outputs)) = (trace, &ran) {
        traces::record_outputs(trace, call.request, outputs);
    }
    ran.map(|outputs| (outputs.into(), Ran::Composed { rows }))
        .map_err(|e| (e, Counted::Failure(FailureReason::Other)))
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
    inputs: &mut Vec<Tensor>,
) -> Result<Option<(&'s Arc<Sequences>, Turn)>, (Error, Counted)> {
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
