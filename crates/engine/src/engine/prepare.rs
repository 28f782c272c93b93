//! The one preparation step every request goes through, whatever answers it: a [`Target`]
//! and its request become a [`Call`] (what every way of running it shares: the version, the
//! request, its scope and trace, its id prefix) and the checked form its version runs ([`Form`]):
//! queued inputs for a version that answers once, queued inputs and a sequence place for one
//! that streams, parsed settings for a generation model. [`Engine::call`] runs it and answers
//! with one [`Reply`].

use super::context::Scope;
use super::execution::Job;
use super::generate::{params, Generation};
use super::record::Failed;
use super::shared_memory::tensors::{self, OutputSlots};
use super::stream::StreamedResponse;
use super::target::{Answers, Target};
use super::{validate, Admission, Context, Engine};
use crate::core::{InferRequest, InferResponse, Tensor};
use crate::repository::ensemble::EnsemblePlan;
use crate::repository::python::PythonModel;
use crate::repository::sequence::{Place, SequenceFlags, Sequences};
use crate::repository::{Executor, Model, ServingVersion};
use crate::trace::{Activity, RecordOnDrop, TensorActivity};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the engine answers a request with.
pub enum Reply {
    /// Its one response.
    Once(InferResponse),
    /// Its responses as the model sends them (a decoupled Python model's, an ensemble's with a
    /// decoupled step). Dropping the receiver drops the request.
    Stream(mpsc::UnboundedReceiver<StreamedResponse>),
    /// Its generated text, piece by piece. Dropping it cancels the request.
    Generation(Generation),
}

/// What the ways of running a request share of it, checked.
pub(super) struct Call {
    pub(super) model: Arc<Model>,
    pub(super) serving: Arc<ServingVersion>,
    pub(super) request: InferRequest,
    /// Its origin, deadline, trace and ensemble depth.
    pub(super) scope: Scope,
    /// Its id as Triton's messages begin with it.
    pub(super) prefix: String,
    pub(super) arrived: Instant,
    /// The names of the inputs it sent, in its order, for a Python model, whose
    /// `request.inputs()` lists them so (taken before the checks reorder them).
    pub(super) arrival: Vec<String>,
    /// Its sequence's flags, for a stateful version's request.
    pub(super) sequence: Option<SequenceFlags>,
    /// Its in-flight slot, held until it is answered; `None` for an ensemble's step, which runs
    /// within its request's.
    pub(super) admission: Option<Admission>,
    /// Records the trace's REQUEST_END when the last holder lets go (at once for a request
    /// refused while it is prepared).
    pub(super) end: Option<Arc<RecordOnDrop>>,
}

/// A call's checked form, as its version runs it.
pub(super) enum Form {
    /// Inputs to queue, and the shared-memory regions its outputs go to.
    Once(Job, OutputSlots),
    /// Inputs to hand to a decoupled Python model or an ensemble with a decoupled step.
    Stream(Streamed),
    /// A generation model's settings.
    Generation(params::Parsed),
}

/// A checked request whose responses stream.
pub(super) struct Streamed {
    pub(super) inputs: Vec<Tensor>,
    pub(super) rows: usize,
    pub(super) runs: Runs,
}

/// What streams a request's responses.
pub(super) enum Runs {
    /// A decoupled Python model; a stateful one's sequence and the request's place in it,
    /// taken as the request was prepared.
    Python(Arc<PythonModel>, Option<(Arc<Sequences>, Place)>),
    /// An ensemble with a decoupled step.
    Ensemble(Arc<EnsemblePlan>),
}

impl Engine {
    /// Runs `request` on `target`, admitted with `context`, and answers it as its version
    /// answers. The request is prepared (checked, and a stateful model's request given its
    /// place in its sequence) when this is called, not when the future is first polled:
    /// requests that come one after another on a stream run in that order however their tasks
    /// are scheduled.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a request that does not fit the model or its sequence;
    /// RESOURCE_EXHAUSTED when the model version is at its `max_inflight_requests`; INTERNAL when
    /// the model fails while running; each with how it counts (see [`Failed::stage`]).
    pub fn call(
        self: &Arc<Self>,
        target: Target,
        request: InferRequest,
        context: Context,
    ) -> impl Future<Output = Result<Reply, Failed>> + Send + 'static {
        let Context { admission, scope } = context;
        let prepared = self.prepare(target, request, Some(admission), scope);
        let engine = Arc::clone(self);
        async move {
            let (call, form) = prepared?;
            match form {
                Form::Once(job, slots) => engine.run_once(call, job, slots).await.map(Reply::Once),
                Form::Stream(streamed) => {
                    Ok(Reply::Stream(engine.run_stream(call, streamed).await))
                }
                Form::Generation(parsed) => engine
                    .start_generation(call, parsed)
                    .await
                    .map(Reply::Generation),
            }
        }
    }

    /// The preparation step: `request` to `target` as a [`Call`] and its checked [`Form`].
    ///
    /// # Errors
    /// The request's refusal, counted nowhere (as in Triton: its model's scheduler never had
    /// it).
    pub(super) fn prepare(
        &self,
        target: Target,
        request: InferRequest,
        admission: Option<Admission>,
        scope: Scope,
    ) -> Result<(Call, Form), Failed> {
        let answers = target.answers();
        // A generation request's settings are read before its trace starts, as its refusal is
        // an answer to its body, not a run of its model.
        let parsed = match answers {
            Answers::Generation => {
                super::check_parameters(&request)?;
                Some(params::parse(
                    &target.model.name,
                    &target.serving.io,
                    &request,
                )?)
            }
            Answers::Once | Answers::Stream => None,
        };
        let mut call = self.begin(target, request, admission, scope);
        let form = match parsed {
            Some(parsed) => {
                if let Some(trace) = &call.scope.trace {
                    trace.record(Activity::QueueStart, Instant::now());
                }
                Form::Generation(parsed)
            }
            None if answers == Answers::Stream => Form::Stream(self.check_streamed(&mut call)?),
            None => {
                let (job, slots) = self.check_once(&mut call)?;
                Form::Once(job, slots)
            }
        };
        Ok((call, form))
    }

    /// The call of `request` to `target`, its trace started.
    pub(super) fn begin(
        &self,
        target: Target,
        request: InferRequest,
        admission: Option<Admission>,
        scope: Scope,
    ) -> Call {
        let arrived = Instant::now();
        let Target { model, serving, .. } = target;
        let end = scope.trace.as_ref().map(|trace| {
            trace.describe(&model.name, serving.version, &request.id);
            trace.record(Activity::RequestStart, arrived);
            Arc::new(RecordOnDrop {
                trace: Arc::clone(trace),
                activity: Activity::RequestEnd,
            })
        });
        let arrival = match &serving.executor {
            Executor::Python(_) => request.inputs.iter().map(|i| i.name.clone()).collect(),
            _ => Vec::new(),
        };
        Call {
            prefix: validate::request_prefix(&request.id),
            model,
            serving,
            request,
            scope,
            arrived,
            arrival,
            sequence: None,
            admission,
            end,
        }
    }

    /// Checks a request that answers once: its parameters, its sequence's flags, its
    /// shared-memory inputs and outputs, and its inputs against the config.
    ///
    /// # Errors
    /// The first check that fails.
    pub(super) fn check_once(&self, call: &mut Call) -> Result<(Job, OutputSlots), Failed> {
        let name = &call.model.name;
        super::check_parameters(&call.request)?;
        call.sequence = call
            .serving
            .sequences
            .as_ref()
            .map(|sequences| sequences.flags(&call.request, name))
            .transpose()?;
        tensors::read_inputs(&self.shared_memory, name, &call.prefix, &mut call.request)?;
        let slots = tensors::output_slots(&self.shared_memory, &call.request)?;
        let inputs = validate::prepare_inputs(name, &call.serving.io, &mut call.request)?;
        if let Some(trace) = &call.scope.trace {
            trace.tensors(TensorActivity::QueueInput, &inputs);
        }
        let rows = validate::rows(&call.serving.io, &inputs);
        let job = super::run::queued(&call.request, call.scope.deadline, rows, inputs);
        Ok((job, slots))
    }

    /// Checks a request whose responses stream: its parameters, its shared-memory inputs, its
    /// inputs against the config; a stateful model's request takes its place in its sequence.
    ///
    /// # Errors
    /// The first check that fails.
    fn check_streamed(&self, call: &mut Call) -> Result<Streamed, Failed> {
        let name = &call.model.name;
        super::check_parameters(&call.request)?;
        tensors::read_inputs(&self.shared_memory, name, &call.prefix, &mut call.request)?;
        let inputs = validate::prepare_inputs(name, &call.serving.io, &mut call.request)?;
        let rows = validate::rows(&call.serving.io, &inputs);
        // A stateful model's request takes its place in its sequence now.
        let placed = match &call.serving.sequences {
            Some(sequences) => {
                let flags = sequences.flags(&call.request, name)?;
                let place = sequences.place(flags.clone(), rows, name)?;
                call.sequence = Some(flags);
                Some((Arc::clone(sequences), place))
            }
            None => None,
        };
        let runs = match &call.serving.executor {
            Executor::Python(python) => Runs::Python(Arc::clone(python), placed),
            Executor::Ensemble(plan) => Runs::Ensemble(Arc::clone(plan)),
            Executor::Batched(_) | Executor::Generate(_) => {
                return Err(super::stream::not_streaming(name).into())
            }
        };
        if let Some(trace) = &call.scope.trace {
            trace.tensors(TensorActivity::QueueInput, &inputs);
        }
        Ok(Streamed { inputs, rows, runs })
    }
}
