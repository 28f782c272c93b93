//! Ensembles with a decoupled step — a decoupled Python model, such as an LLM between a
//! preprocessing and a postprocessing model, the way TensorRT-LLM's ensembles are built. As in
//! Triton, such an ensemble is decoupled itself: the steps before the decoupled one run once,
//! and each response the decoupled step sends runs the steps after it and becomes one response
//! of the ensemble, in order; the ensemble's last response follows the step's. Clients stream
//! them (gRPC `ModelStreamInfer`, REST `generate_stream`); a client that goes away cancels the
//! decoupled step's request.

use super::ensemble::{ensemble_outputs, step_error, step_request, take_outputs, MAX_DEPTH};
use super::{response, Admission, Engine, StreamedResponse};
use crate::core::{Error, InferRequest, Tensor};
use crate::metrics::{ComputeTimes, FailureReason};
use crate::repository::ensemble::EnsemblePlan;
use crate::repository::{Executor, Model, ServingVersion};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// A decoupled ensemble's request, validated.
pub(super) struct Streaming {
    pub model: Arc<Model>,
    pub serving: Arc<ServingVersion>,
    pub plan: Arc<EnsemblePlan>,
    /// The decoupled step: its wave and its index in the wave.
    pub at: (usize, usize),
    pub inputs: Vec<Tensor>,
    pub request: InferRequest,
    pub rows: usize,
    pub arrived: Instant,
}

impl Engine {
    /// Where ensemble `plan`'s decoupled step is (the first, if several): its wave and its index
    /// in the wave; `None` for an ensemble whose steps all answer once. A step streams if it is
    /// a decoupled Python model or such an ensemble itself, looked up at most [`MAX_DEPTH`] deep
    /// (ensembles may name each other; running them stops there too).
    pub(super) fn decoupled_step(
        &self,
        plan: &EnsemblePlan,
        depth: usize,
    ) -> Option<(usize, usize)> {
        if depth >= MAX_DEPTH {
            return None;
        }
        plan.waves.iter().enumerate().find_map(|(wave, steps)| {
            steps
                .iter()
                .position(|step| self.streams_within(&step.model, &step.version, depth + 1))
                .map(|step| (wave, step))
        })
    }

    /// Whether the model streams its responses through [`Engine::infer_stream`], `depth`
    /// ensembles down.
    pub(super) fn streams_within(&self, name: &str, version: &str, depth: usize) -> bool {
        self.resolve(name, version)
            .is_ok_and(|(_, serving)| match &serving.executor {
                Executor::Python(python) => python.decoupled(),
                Executor::Ensemble(plan) => self.decoupled_step(plan, depth).is_some(),
                Executor::Batched(_) | Executor::Generate(_) => false,
            })
    }

    /// Starts `streaming`, admitted earlier: its responses as the decoupled step sends them. The
    /// admission ends with the last.
    pub(super) fn stream_ensemble(
        self: &Arc<Self>,
        streaming: Streaming,
        admission: Admission,
    ) -> mpsc::UnboundedReceiver<StreamedResponse> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            let _admission = admission;
            let outcome = engine.run_streaming(&streaming, &sender).await;
            let (stats, total) = (&streaming.serving.stats, streaming.arrived.elapsed());
            match outcome {
                Ok(false) => stats.record_failure(total, FailureReason::Canceled),
                Ok(true) => stats.record_success(
                    streaming.rows,
                    total,
                    Default::default(),
                    ComputeTimes::default(),
                    None,
                ),
                Err(error) => {
                    stats.record_failure(total, FailureReason::Other);
                    let _ = sender.send(StreamedResponse {
                        response: Err(error),
                        last: true,
                    });
                }
            }
        });
        receiver
    }

    /// Runs the steps up to the decoupled one, then the rest once per response it sends, each
    /// result sent on `sender`. Returns early (the step cancelled) when the client goes away:
    /// whether the stream ended.
    async fn run_streaming(
        self: &Arc<Self>,
        streaming: &Streaming,
        sender: &mpsc::UnboundedSender<StreamedResponse>,
    ) -> Result<bool, Error> {
        let Streaming {
            model,
            serving,
            plan,
            at: (wave_at, step_at),
            inputs,
            request,
            ..
        } = streaming;
        let name = model.name.as_str();
        let caller = (request, None);
        let mut tensors: HashMap<String, Tensor> =
            inputs.iter().map(|t| (t.name.clone(), t.clone())).collect();
        for wave in &plan.waves[..*wave_at] {
            self.run_wave(name, wave, &mut tensors, caller, 1).await?;
        }
        let wave = &plan.waves[*wave_at];
        let decoupled = &wave[*step_at];
        let siblings: Vec<_> = wave
            .iter()
            .enumerate()
            .filter(|(index, _)| index != step_at)
            .map(|(_, step)| step.clone())
            .collect();
        self.run_wave(name, &siblings, &mut tensors, caller, 1)
            .await?;
        let step = step_request(decoupled, &tensors, request);
        let mut responses = self
            .infer_stream(self.admit()?, step)
            .await
            .map_err(|e| step_error(name, decoupled, e))?;
        loop {
            let streamed = tokio::select! {
                streamed = responses.recv() => match streamed {
                    Some(streamed) => streamed,
                    None => break,
                },
                // The client went away: dropping `responses` cancels the step's request.
                () = sender.closed() => return Ok(false),
            };
            let answer = match streamed.response {
                Err(error) => return Err(step_error(name, decoupled, error)),
                // The word alone that the response before was the last.
                Ok(None) => None,
                Ok(Some(answer)) => {
                    let mut these = tensors.clone();
                    take_outputs(name, decoupled, answer.outputs, &mut these)?;
                    for wave in &plan.waves[wave_at + 1..] {
                        self.run_wave(name, wave, &mut these, caller, 1).await?;
                    }
                    let outputs = ensemble_outputs(name, &serving.io, these)?;
                    Some(response::response(
                        model,
                        serving,
                        request.clone(),
                        outputs,
                    )?)
                }
            };
            let last = streamed.last;
            let sent = sender.send(StreamedResponse {
                response: Ok(answer),
                last,
            });
            if sent.is_err() || last {
                return Ok(last);
            }
        }
        Err(step_error(
            name,
            decoupled,
            Error::Unavailable("the step stopped before its last response".into()),
        ))
    }
}
