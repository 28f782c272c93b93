//! Requests to decoupled Python models: any number of responses per request, as the model sends
//! them (Triton's decoupled transaction policy), shaped for the client like any response.
//! Generation models, the other decoupled kind, have their own path ([`super::generate`]).

use super::context::{Context, Scope};
use super::record::{Counted, Recorder};
use super::{response, tensors, validate, Admission, Engine};
use crate::backend::python;
use crate::core::{Error, InferRequest, InferResponse, Tensor};
use crate::repository::sequence::{Place, SequenceFlags, Sequences};
use crate::repository::{Executor, Model, ServingVersion};
use crate::scheduler::Outcome;
use crate::trace::{Activity, RecordOnDrop, TensorActivity};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// One response of a decoupled model's request: a response (`None`: only the word that the one
/// before was the last), or the request's error; `last` on the final one.
#[derive(Debug)]
pub struct StreamedResponse {
    pub response: Result<Option<InferResponse>, Error>,
    pub last: bool,
}

impl Engine {
    /// Runs `request` on a decoupled model, a generation model or a decoupled Python model, and
    /// hands each response to `each` as it comes: what a Python model's `exec(decoupled=True)`
    /// iterates over. A generation model's responses carry `text_output` (one per generated
    /// piece when the request streams, else one with the whole text); a final flag sent alone
    /// is a response without outputs, as Triton's BLS iterator yields it. An error is the last
    /// thing `each` gets; when `each` answers false (nobody listens any more), the request is
    /// dropped, and the model hears that its client went away.
    ///
    /// # Errors
    /// Admission and lookup errors; UNSUPPORTED for a model that is not decoupled; the
    /// request's errors before its first response.
    pub async fn infer_decoupled(
        self: &Arc<Self>,
        request: InferRequest,
        context: Context,
        mut each: impl FnMut(Result<InferResponse, Error>) -> bool + Send,
    ) -> Result<(), Error> {
        let mut stream = self.decoupled_stream_in(request, context).await?;
        while let Some(streamed) = stream.recv().await {
            // The final flag alone is a response without outputs, as Triton's BLS iterator
            // yields it.
            let response = match streamed.response {
                Ok(None) if !streamed.last => continue,
                Ok(response) => Ok(response.unwrap_or_default()),
                Err(error) => Err(error),
            };
            let failed = response.is_err();
            if !each(response) || failed || streamed.last {
                break;
            }
        }
        Ok(())
    }

    /// A decoupled model's responses (a call's, an ensemble step's): a decoupled Python model's
    /// or an ensemble's through [`Engine::infer_stream`], a generation model's pieces as
    /// `text_output` responses (one per piece when the request streams, else one with the whole
    /// text). Dropping the receiver drops the request.
    pub(super) async fn decoupled_stream(
        self: &Arc<Self>,
        request: InferRequest,
        scope: Scope,
    ) -> Result<mpsc::UnboundedReceiver<StreamedResponse>, Error> {
        // A step of a request admitted already, counted in flight as a request of its own.
        let context = Context::within(self.admit()?, scope);
        self.decoupled_stream_in(request, context).await
    }

    /// [`Engine::decoupled_stream`] in `context`.
    async fn decoupled_stream_in(
        self: &Arc<Self>,
        request: InferRequest,
        context: Context,
    ) -> Result<mpsc::UnboundedReceiver<StreamedResponse>, Error> {
        if !self.generates_text(&request.model_name, &request.model_version) {
            return self.infer_stream(request, context).await;
        }
        let mut generation = self.generate(request, context).await?;
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            if !generation.request.stream {
                let text = generation.text().await;
                let response = text.map(|text| Some(generation.text_response(&text)));
                let _ = sender.send(StreamedResponse {
                    response,
                    last: true,
                });
                return;
            }
            loop {
                let chunk = tokio::select! {
                    chunk = generation.next() => match chunk {
                        Some(chunk) => chunk,
                        None => return,
                    },
                    // Nobody listens any more: the generation is dropped.
                    () = sender.closed() => return,
                };
                let last = chunk.as_ref().map_or(true, |chunk| chunk.last());
                let response = chunk.map(|chunk| Some(generation.text_response(&chunk.text)));
                if sender.send(StreamedResponse { response, last }).is_err() || last {
                    return;
                }
            }
        });
        Ok(receiver)
    }

    /// Whether `name` (the version given, or the newest) answers through
    /// [`Engine::infer_stream`]: a decoupled Python model, or an ensemble with a decoupled step.
    pub fn streams(&self, name: &str, version: &str) -> bool {
        self.streams_within(name, version, 0)
    }

    /// Runs `request`, admitted earlier with [`Engine::admit`], on a decoupled Python model or
    /// an ensemble with a decoupled step (see [`super::ensemble_stream`]): its responses as the
    /// model sends them. The admission ends with the last.
    ///
    /// The request is checked, and a stateful model's request takes its place in its sequence,
    /// when this is called, not when the future is first polled: requests that come one after
    /// another on a stream run in that order however their tasks are scheduled.
    ///
    /// # Errors
    /// Lookup errors as [`Engine::model_metadata`]; UNSUPPORTED for a model that does not
    /// stream so; INVALID_ARGUMENT for a request that does not fit the model or its sequence.
    pub fn infer_stream(
        self: &Arc<Self>,
        request: InferRequest,
        context: Context,
    ) -> impl Future<Output = Result<mpsc::UnboundedReceiver<StreamedResponse>, Error>> + Send + 'static
    {
        let started = self.start_stream(request, context);
        async move {
            match started? {
                Started::Streaming(receiver) => Ok(receiver),
                Started::Queued(queued) => Ok(queued.run().await),
            }
        }
    }

    /// What [`Engine::infer_stream`] does at once.
    fn start_stream(
        self: &Arc<Self>,
        mut request: InferRequest,
        context: Context,
    ) -> Result<Started, Error> {
        let arrived = Instant::now();
        let Context { admission, scope } = context;
        let trace = scope.trace;
        let (model, serving) = self.resolve(&request.model_name, &request.model_version)?;
        // The request's trace, which records REQUEST_END when the last holder lets go: at once
        // for a request refused here.
        let trace = trace.map(|trace| {
            trace.describe(&model.name, serving.version, &request.id);
            trace.record(Activity::RequestStart, arrived);
            Arc::new(RecordOnDrop {
                trace,
                activity: Activity::RequestEnd,
            })
        });
        let runs = match &serving.executor {
            Executor::Python(python) if python.decoupled() => Runs::Python(Arc::clone(python)),
            Executor::Ensemble(plan) if self.has_decoupled_step(plan, 0) => {
                Runs::Ensemble(Arc::clone(plan))
            }
            _ => return Err(not_streaming(&model.name)),
        };
        let prefix = validate::request_prefix(&request.id);
        // A stateful model's request belongs to a sequence, where it takes its place now.
        let placed = |request: &InferRequest, rows| {
            let Some(sequences) = &serving.sequences else {
                return Ok(None);
            };
            let flags = sequences.flags(request, &model.name)?;
            let place = sequences.place(flags.clone(), rows, &model.name)?;
            Ok(Some((Arc::clone(sequences), flags, place)))
        };
        let arrival = super::execution::of(&serving.executor).arrival(&request);
        // A request refused here, before the model's scheduler has it, counts nowhere (as in
        // Triton).
        let (inputs, rows, sequence) = super::check_parameters(&request)
            .and_then(|()| {
                tensors::read_inputs(&self.shared_memory, &model.name, &prefix, &mut request)
            })
            .and_then(|()| validate::prepare_inputs(&model.name, &serving.io, &mut request))
            .and_then(|inputs| {
                let rows = validate::rows(&serving.io, &inputs);
                Ok((inputs, rows, placed(&request, rows)?))
            })?;
        if let Some(traced) = &trace {
            traced.trace.tensors(TensorActivity::QueueInput, &inputs);
        }
        match runs {
            Runs::Python(python) => Ok(Started::Queued(Box::new(Queued {
                python,
                model,
                serving,
                request,
                arrival,
                inputs,
                rows,
                sequence,
                prefix,
                arrived,
                admission,
                deadline: scope.deadline,
                trace,
            }))),
            Runs::Ensemble(plan) => {
                let streaming = super::ensemble_stream::Streaming {
                    model,
                    serving,
                    plan,
                    inputs,
                    request,
                    rows,
                    arrived,
                    trace,
                    origin: scope.origin,
                    deadline: scope.deadline,
                };
                Ok(Started::Streaming(
                    self.stream_ensemble(streaming, admission),
                ))
            }
        }
    }
}

/// What streams a request's responses.
enum Runs {
    /// A decoupled Python model.
    Python(Arc<crate::repository::python::PythonModel>),
    /// An ensemble with a decoupled step.
    Ensemble(Arc<crate::repository::ensemble::EnsemblePlan>),
}

/// A stream [`Engine::infer_stream`] started.
enum Started {
    /// Its responses (an ensemble's).
    Streaming(mpsc::UnboundedReceiver<StreamedResponse>),
    /// A decoupled Python model's request, to run when its turn in its sequence comes.
    Queued(Box<Queued>),
}

/// A checked request to a decoupled Python model.
struct Queued {
    python: Arc<crate::repository::python::PythonModel>,
    model: Arc<crate::repository::Model>,
    serving: Arc<crate::repository::ServingVersion>,
    request: InferRequest,
    /// The names of the inputs it sent, in its order.
    arrival: Vec<String>,
    inputs: Vec<Tensor>,
    rows: usize,
    /// A stateful model's sequence and the request's place in it.
    sequence: Option<(Arc<Sequences>, SequenceFlags, Place)>,
    prefix: String,
    arrived: Instant,
    admission: Admission,
    deadline: Option<Instant>,
    trace: Option<Arc<RecordOnDrop>>,
}

impl Queued {
    /// Waits for the request's turn in its sequence, hands it to the model, and returns its
    /// responses as they come.
    async fn run(self: Box<Self>) -> mpsc::UnboundedReceiver<StreamedResponse> {
        let Queued {
            python,
            model,
            serving,
            request,
            arrival,
            mut inputs,
            rows,
            sequence,
            prefix,
            arrived,
            admission,
            deadline,
            trace,
        } = *self;
        // A sequence's requests run one at a time, in order, on one instance: the next once
        // this one's `execute` has returned (as Triton releases a decoupled model's requests),
        // whether or not its responses have all been sent.
        let (turn, sequence) = match sequence {
            Some((sequences, flags, place)) => {
                let turn = place.turn().await;
                inputs.extend(sequences.inputs(&turn));
                let of = super::python_sequence(&flags, turn.slot());
                (Some((sequences, turn)), Some(of))
            }
            None => (None, None),
        };
        let job = super::queued(
            &request,
            deadline,
            rows,
            python::Request {
                id: request.id.clone(),
                parameters: request.parameters.clone(),
                outputs: request.outputs.iter().map(|o| o.name.clone()).collect(),
                listed: super::python_listing(&arrival, &inputs),
                inputs,
                sequence,
                trace: trace.as_ref().map(|traced| Arc::clone(&traced.trace)),
            },
        );
        let name = model.name.clone();
        // Why the scheduler refused the request, if it did (a full queue, a timeout), for the
        // failure's reason in the metrics.
        let refusal = Arc::new(std::sync::OnceLock::new());
        let refused = Arc::clone(&refusal);
        let refused = move |error| {
            let (error, reason) = super::schedule_error(error, &prefix, &name);
            let _ = refused.set(reason);
            error
        };
        // The request's time queued and computing, known once `execute` has returned: its
        // statistics are recorded when both that and the last response have come (and its
        // trace's REQUEST_END).
        let (timed, timing) = tokio::sync::oneshot::channel();
        let traced = trace.clone();
        let returned = move |outcome: Option<Outcome<()>>| {
            if let Some((sequences, turn)) = turn {
                sequences.finish(turn, &mut Vec::new());
            }
            if let (Some(traced), Some(outcome)) = (&traced, &outcome) {
                super::traces::record_outcome(&traced.trace, outcome);
            }
            let _ = timed.send(outcome.map(|outcome| outcome.timing()));
        };
        let mut responses = python.execute_stream(job, refused, returned);
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let admission = admission;
            // Its statistics: a cancellation when dropped before the last response.
            let record = Recorder::new(&serving.stats, arrived);
            loop {
                // A client that goes away is noticed at once, not at the next response: the
                // model's `is_cancelled()` turns true when `responses` is dropped.
                let streamed = tokio::select! {
                    streamed = responses.recv() => match streamed {
                        Some(streamed) => streamed,
                        None => {
                            // Ended without its last response: counted nowhere, as before.
                            record.failed(Counted::Nowhere);
                            return;
                        }
                    },
                    () = sender.closed() => return,
                };
                let last = streamed.last;
                if let (Some(traced), Ok(Some(outputs))) = (&trace, &streamed.outputs) {
                    super::traces::record_outputs(&traced.trace, &request, &outputs.tensors);
                }
                let shaped = streamed
                    .outputs
                    .and_then(|outputs| shape(&model, &serving, &request, outputs));
                let total = arrived.elapsed();
                let succeeded = shaped.is_ok();
                let gone = sender
                    .send(StreamedResponse {
                        response: shaped,
                        last,
                    })
                    .is_err();
                if last {
                    // The request is answered; its statistics may wait for `execute` to return
                    // (the last response can come from it), the server's count of work need not.
                    drop(admission);
                    let answered = (rows, total, succeeded);
                    record.streamed(answered, timing, &refusal).await;
                    return;
                }
                if gone {
                    return;
                }
            }
        });
        receiver
    }
}

/// A Python model's response (`None` for a final flag without one) shaped as the request asked.
fn shape(
    model: &Model,
    serving: &ServingVersion,
    request: &InferRequest,
    outputs: Option<python::Outputs>,
) -> Result<Option<InferResponse>, Error> {
    outputs
        .map(|outputs| {
            let mut answer = response::response(model, serving, request.clone(), outputs.tensors)?;
            answer.parameters.extend(outputs.parameters);
            Ok(answer)
        })
        .transpose()
}

/// The refusal of a model that does not stream its responses.
fn not_streaming(model: &str) -> Error {
    Error::Unsupported(format!(
        "model '{model}' is not a decoupled Python model or an ensemble with a decoupled step"
    ))
}
