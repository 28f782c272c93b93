//! Ensembles with a decoupled step — a decoupled Python model, such as an LLM between a
//! preprocessing and a postprocessing model, the way TensorRT-LLM's ensembles are built, or a
//! generation model, or an ensemble with such a step. As in Triton, such an ensemble is
//! decoupled itself: the steps before the decoupled one run once, and each response the
//! decoupled step sends runs the steps after it — fanning out again at the next decoupled step,
//! if there is one — and each result becomes one response of the ensemble, in order; the
//! ensemble's last response is the one that follows the last response of every decoupled step.
//! Clients stream them (gRPC `ModelStreamInfer`, REST `generate_stream`); a client that goes
//! away cancels the decoupled steps' requests.

use super::context::Scope;
use super::ensemble::{ensemble_outputs, step_error, step_request, take_outputs, MAX_DEPTH};
use super::prepare::Call;
use super::record::{Counted, Ran, Recorder};
use super::{response, Engine, StreamedResponse};
use crate::core::{Error, Tensor};
use crate::metrics::FailureReason;
use crate::repository::ensemble::{EnsemblePlan, Step};
use crate::trace::{Activity, Trace};
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// A decoupled ensemble's request, checked: its call, plan and inputs.
struct Streaming {
    call: Call,
    plan: Arc<EnsemblePlan>,
    inputs: Vec<Tensor>,
    rows: usize,
}

impl Streaming {
    fn trace(&self) -> Option<&Arc<Trace>> {
        self.call.scope.trace.as_ref()
    }

    /// What its steps share with it: its origin, deadline and trace.
    fn scope(&self) -> Scope {
        Scope {
            depth: 0,
            ..self.call.scope.clone()
        }
    }
}

impl Engine {
    /// Whether ensemble `plan` has a decoupled step (and so streams): a decoupled Python model,
    /// a generation model or such an ensemble itself, looked up at most [`MAX_DEPTH`] deep
    /// (ensembles may name each other; running them stops there too).
    pub(super) fn has_decoupled_step(&self, plan: &EnsemblePlan, depth: usize) -> bool {
        plan.waves
            .iter()
            .any(|wave| self.decoupled_in(wave, depth).is_some())
    }

    /// The index of the first step of `wave` that streams (see [`Engine::has_decoupled_step`]).
    fn decoupled_in(&self, wave: &[Step], depth: usize) -> Option<usize> {
        if depth >= MAX_DEPTH {
            return None;
        }
        wave.iter()
            .position(|step| self.streams_within(&step.model, &step.version, depth + 1))
    }

    /// Starts the checked `call` of ensemble `plan` on `inputs` (`rows` of them): its responses
    /// as the decoupled step sends them. Its admission ends with the last.
    pub(super) fn stream_ensemble(
        self: &Arc<Self>,
        call: Call,
        plan: Arc<EnsemblePlan>,
        inputs: Vec<Tensor>,
        rows: usize,
    ) -> mpsc::UnboundedReceiver<StreamedResponse> {
        let streaming = Streaming {
            call,
            plan,
            inputs,
            rows,
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        let engine = Arc::clone(self);
        if let Some(trace) = streaming.trace() {
            trace.record(Activity::QueueStart, Instant::now());
        }
        tokio::spawn(async move {
            let record = Recorder::new(&streaming.call.serving.stats, streaming.call.arrived);
            let outcome = engine.run_streaming(&streaming, &sender).await;
            match outcome {
                // Its client went away: the recorder's drop counts it CANCELED.
                Ok(false) => drop(record),
                Ok(true) => record.answered(&Ran::Composed {
                    rows: streaming.rows,
                }),
                Err(error) => {
                    record.failed(&Counted::Failure(FailureReason::Other));
                    let _ = sender.send(StreamedResponse {
                        response: Err(error),
                        last: true,
                    });
                }
            }
        });
        receiver
    }

    /// Runs the steps up to the first decoupled one, then the rest once per response it sends
    /// (see [`Engine::stream_waves`]). Returns early (the steps cancelled) when the client goes
    /// away: whether the stream ended.
    async fn run_streaming(
        self: &Arc<Self>,
        streaming: &Streaming,
        sender: &mpsc::UnboundedSender<StreamedResponse>,
    ) -> Result<bool, Error> {
        let tensors: HashMap<String, Tensor> = streaming
            .inputs
            .iter()
            .map(|t| (t.name.clone(), t.clone()))
            .collect();
        self.stream_waves(streaming, 0, tensors, true, sender).await
    }

    /// Runs the plan's waves from `from` on `tensors`. Up to the next wave with a decoupled step
    /// they run once; there, the wave's other steps run once, then the rest of the plan once
    /// per response the decoupled step sends, on a copy of the tensors. Without a decoupled
    /// step left, the ensemble's outputs become one response, the last when `last` (every
    /// decoupled step before sent its last) says so. Whether it sent the ensemble's last response
    /// (false: not its to send, or the client went away).
    fn stream_waves<'a>(
        self: &'a Arc<Self>,
        streaming: &'a Streaming,
        from: usize,
        mut tensors: HashMap<String, Tensor>,
        last: bool,
        sender: &'a mpsc::UnboundedSender<StreamedResponse>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let Call {
                model,
                serving,
                request,
                ..
            } = &streaming.call;
            let plan = &streaming.plan;
            let name = model.name.as_str();
            let scope = streaming.scope();
            let mut wave_at = from;
            let decoupled_at = loop {
                let Some(wave) = plan.waves.get(wave_at) else {
                    // Every wave ran: one response of the ensemble.
                    let outputs = ensemble_outputs(name, &serving.io, tensors)?;
                    if let Some(trace) = streaming.trace() {
                        super::traces::record_outputs(trace, request, &outputs);
                    }
                    let answer = response::response(model, serving, request.clone(), outputs)?;
                    let sent = sender.send(StreamedResponse {
                        response: Ok(Some(answer)),
                        last,
                    });
                    return Ok(sent.is_ok() && last);
                };
                if let Some(step) = self.decoupled_in(wave, 0) {
                    break step;
                }
                self.run_wave(name, wave, &mut tensors, request, &scope)
                    .await?;
                wave_at += 1;
            };
            let wave = &plan.waves[wave_at];
            let decoupled = &wave[decoupled_at];
            let siblings: Vec<_> = wave
                .iter()
                .enumerate()
                .filter(|(index, _)| *index != decoupled_at)
                .map(|(_, step)| step.clone())
                .collect();
            self.run_wave(name, &siblings, &mut tensors, request, &scope)
                .await?;
            let step = step_request(decoupled, &tensors, request);
            let mut responses = self
                .decoupled_stream(step, scope.step())
                .await
                .map_err(|e| step_error(name, e))?;
            loop {
                let streamed = tokio::select! {
                    streamed = responses.recv() => match streamed {
                        Some(streamed) => streamed,
                        None => return Err(step_error(
                            name,
                            Error::Unavailable(format!(
                                "step '{}' stopped before its last response",
                                decoupled.model
                            )),
                        )),
                    },
                    // The client went away: dropping `responses` cancels the step's request.
                    () = sender.closed() => return Ok(false),
                };
                let this_last = last && streamed.last;
                match streamed.response {
                    Err(error) => {
                        // The step's request runs on to its last response, as in Triton (an
                        // error does not cancel it), its statistics its own.
                        if !streamed.last {
                            tokio::spawn(async move {
                                while let Some(rest) = responses.recv().await {
                                    if rest.last {
                                        break;
                                    }
                                }
                            });
                        }
                        return Err(step_error(name, error));
                    }
                    // The word alone that the response before was the step's last: the
                    // ensemble's too when every decoupled step before is at its last.
                    Ok(None) => {
                        if this_last
                            && sender
                                .send(StreamedResponse {
                                    response: Ok(None),
                                    last: true,
                                })
                                .is_err()
                        {
                            return Ok(false);
                        }
                    }
                    Ok(Some(answer)) => {
                        let mut these = tensors.clone();
                        take_outputs(name, decoupled, answer.outputs, &mut these)?;
                        let ended = self
                            .stream_waves(streaming, wave_at + 1, these, this_last, sender)
                            .await?;
                        if this_last {
                            return Ok(ended);
                        }
                        if sender.is_closed() {
                            return Ok(false);
                        }
                    }
                }
                if streamed.last {
                    return Ok(this_last);
                }
            }
        })
    }
}
