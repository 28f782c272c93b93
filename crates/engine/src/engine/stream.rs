//! Requests whose responses stream: a decoupled Python model's (any number of responses per
//! request, as the model sends them: Triton's decoupled transaction policy), shaped for the
//! client like any response; and the ways a model's own call or an ensemble's step reads any
//! decoupled model's responses, a generation model's pieces included.

use super::context::{Context, Scope};
use super::prepare::{Call, Reply, Runs, Streamed};
use super::record::{Counted, Failed, Recorder};
use super::target::Answers;
use super::{response, Engine};
use crate::backend::python;
use crate::core::{Error, InferRequest, InferResponse, Tensor};
use crate::repository::python::PythonModel;
use crate::repository::sequence::{Place, Sequences};
use crate::repository::{Model, ServingVersion};
use crate::scheduler::Outcome;
use std::sync::{Arc, OnceLock};
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
    /// Lookup errors; UNSUPPORTED for a model that is not decoupled; the request's errors
    /// before its first response.
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

    /// A decoupled model's responses for an ensemble's step (see [`Engine::decoupled_stream_in`]).
    pub(super) async fn decoupled_stream(
        self: &Arc<Self>,
        request: InferRequest,
        scope: Scope,
    ) -> Result<mpsc::UnboundedReceiver<StreamedResponse>, Error> {
        // A step of a request admitted already, counted in flight as a request of its own.
        let context = Context::within(self.admit()?, scope);
        self.decoupled_stream_in(request, context).await
    }

    /// A decoupled model's responses (a call's, an ensemble step's): a decoupled Python model's
    /// or an ensemble's as they come, a generation model's pieces as `text_output` responses
    /// (one per piece when the request streams, else one with the whole text). Dropping the
    /// receiver drops the request.
    async fn decoupled_stream_in(
        self: &Arc<Self>,
        request: InferRequest,
        context: Context,
    ) -> Result<mpsc::UnboundedReceiver<StreamedResponse>, Error> {
        let target = self
            .target_loading(&request.model_name, &request.model_version)
            .await?;
        if target.answers() == Answers::Once {
            return Err(not_streaming(target.name()));
        }
        let reply = self.call(target, request, context).await;
        Ok(match reply.map_err(Failed::into_error)? {
            Reply::Stream(receiver) => receiver,
            Reply::Generation(generation) => generation.responses(),
            Reply::Once(response) => {
                let (sender, receiver) = mpsc::unbounded_channel();
                let _ = sender.send(StreamedResponse {
                    response: Ok(Some(response)),
                    last: true,
                });
                receiver
            }
        })
    }

    /// Whether `name` (the version given, or the newest) streams its responses as a decoupled
    /// Python model does, `depth` ensembles down; in an ensemble (`depth` above 0), a generation
    /// model's pieces stream too.
    pub(super) fn streams_within(&self, name: &str, version: &str, depth: usize) -> bool {
        self.resolve(name, version)
            .is_ok_and(|(_, serving)| match self.answers(&serving, depth) {
                Answers::Stream => true,
                Answers::Generation => depth > 0,
                Answers::Once => false,
            })
    }

    /// Runs a checked `call` whose responses stream: a decoupled Python model's once its turn in
    /// its sequence comes, an ensemble's as its decoupled step sends them.
    pub(super) async fn run_stream(
        self: &Arc<Self>,
        call: Call,
        streamed: Streamed,
    ) -> mpsc::UnboundedReceiver<StreamedResponse> {
        let Streamed { inputs, rows, runs } = streamed;
        match runs {
            Runs::Python(python, placed) => stream_python(call, python, placed, inputs, rows).await,
            Runs::Ensemble(plan) => self.stream_ensemble(call, plan, inputs, rows),
        }
    }
}

/// Waits for the request's turn in its sequence, hands it to the model, and returns its
/// responses as they come.
async fn stream_python(
    call: Call,
    python: Arc<PythonModel>,
    placed: Option<(Arc<Sequences>, Place)>,
    mut inputs: Vec<Tensor>,
    rows: usize,
) -> mpsc::UnboundedReceiver<StreamedResponse> {
    let Call {
        model,
        serving,
        request,
        scope,
        prefix,
        arrived,
        arrival,
        sequence: flags,
        admission,
        end,
    } = call;
    // A sequence's requests run one at a time, in order, on one instance: the next once this
    // one's `execute` has returned (as Triton releases a decoupled model's requests), whether
    // or not its responses have all been sent.
    let (turn, sequence) = match (placed, &flags) {
        (Some((sequences, place)), Some(flags)) => {
            let turn = place.turn().await;
            inputs.extend(sequences.inputs(&turn));
            let of = super::python_sequence(flags, turn.slot());
            (Some((sequences, turn)), Some(of))
        }
        _ => (None, None),
    };
    let job = super::queued(
        &request,
        scope.deadline,
        rows,
        python::Request {
            id: request.id.clone(),
            parameters: request.parameters.clone(),
            outputs: request.outputs.iter().map(|o| o.name.clone()).collect(),
            listed: super::python_listing(&arrival, &inputs),
            inputs,
            sequence,
            trace: scope.trace.clone(),
        },
    );
    let name = model.name.clone();
    // How the scheduler's refusal of the request (a full queue, a timeout) counts, if it refused
    // it, for the failure's reason in the metrics.
    let refusal = Arc::new(OnceLock::new());
    let refused = Arc::clone(&refusal);
    let refused = move |error| {
        let Failed { error, counted } = super::schedule_error(error, &prefix, &name);
        let _ = refused.set(counted);
        error
    };
    // The request's time queued and computing, known once `execute` has returned: its
    // statistics are recorded when both that and the last response have come (and its trace's
    // REQUEST_END, which `end` records when its last holder lets go).
    let (timed, timing) = tokio::sync::oneshot::channel();
    let (trace, returned_end) = (scope.trace.clone(), end.clone());
    let returned = move |outcome: Option<Outcome<()>>| {
        if let Some((sequences, turn)) = turn {
            sequences.finish(turn, &mut Vec::new());
        }
        if let (Some(trace), Some(outcome)) = (&trace, &outcome) {
            super::traces::record_outcome(trace, outcome);
        }
        let _ = timed.send(outcome.map(|outcome| outcome.timing()));
        drop(returned_end);
    };
    let mut responses = python.execute_stream(job, refused, returned);
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (admission, _end) = (admission, end);
        // Its statistics: a cancellation when dropped before the last response.
        let record = Recorder::new(&serving.stats, arrived);
        loop {
            // A client that goes away is noticed at once, not at the next response: the model's
            // `is_cancelled()` turns true when `responses` is dropped.
            let streamed = tokio::select! {
                streamed = responses.recv() => match streamed {
                    Some(streamed) => streamed,
                    None => {
                        // Ended without its last response: counted nowhere, as before.
                        record.failed(&Counted::Nowhere);
                        return;
                    }
                },
                () = sender.closed() => return,
            };
            let last = streamed.last;
            if let (Some(trace), Ok(Some(outputs))) = (&scope.trace, &streamed.outputs) {
                super::traces::record_outputs(trace, &request, &outputs.tensors);
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
                // The request is answered; its statistics may wait for `execute` to return (the
                // last response can come from it), the server's count of work need not.
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
pub(super) fn not_streaming(model: &str) -> Error {
    Error::Unsupported(format!(
        "model '{model}' is not a decoupled Python model or an ensemble with a decoupled step"
    ))
}
