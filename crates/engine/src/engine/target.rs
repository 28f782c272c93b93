//! What a request is for: the model version it resolved to, looked up once ([`Engine::target`]),
//! and how that version answers ([`Answers`]). A protocol that must know the kind before it
//! reads a request (REST `generate` reads a generation model's body otherwise; gRPC's stream
//! answers requests that answer once in order) asks the target, then hands it to
//! [`Engine::call`] with the request: the version is not looked up again.

use super::{Engine, ModelMetadata, TensorMetadata};
use crate::core::Error;
use crate::repository::{Executor, Model, ServingVersion, TensorSpec};
use std::sync::Arc;

/// A model version resolved for a request: the one named, or the newest ready one. It holds the
/// version by `Arc`, so a reload or unload meanwhile lets the request finish on it.
#[derive(Clone)]
pub struct Target {
    pub(super) model: Arc<Model>,
    pub(super) serving: Arc<ServingVersion>,
    answers: Answers,
}

/// How a version answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answers {
    /// With one response: an ONNX Runtime model, a Python model, an ensemble without a
    /// decoupled step.
    Once,
    /// With responses as the model sends them (Triton's decoupled transaction policy): a
    /// decoupled Python model, or an ensemble with a decoupled step.
    Stream,
    /// With generated text: a generation model.
    Generation,
}

impl Target {
    /// How its version answers.
    pub fn answers(&self) -> Answers {
        self.answers
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.model.name
    }

    /// The version number.
    pub fn version(&self) -> i64 {
        self.serving.version
    }

    /// Its model metadata: of every version of the model when `all_versions` (no version was
    /// asked for), else of its own.
    pub fn metadata(&self, all_versions: bool) -> ModelMetadata {
        let (model, serving) = (&self.model, &self.serving);
        let versions = if all_versions {
            model.versions.keys().map(i64::to_string).collect()
        } else {
            vec![serving.version.to_string()]
        };
        let batched = serving.io.max_batch_size > 0;
        let describe = |spec: &TensorSpec| TensorMetadata {
            name: spec.name.clone(),
            datatype: spec.datatype.as_wire().to_string(),
            shape: batched
                .then_some(-1)
                .into_iter()
                .chain(spec.dims.iter().copied())
                .collect(),
        };
        ModelMetadata {
            name: model.name.clone(),
            versions,
            // A backend model without a platform (a Python model) names its backend, as in
            // Triton.
            platform: if model.config.platform.is_empty() {
                model.config.backend.clone()
            } else {
                model.config.platform.clone()
            },
            inputs: serving.io.inputs.iter().map(describe).collect(),
            outputs: serving.io.outputs.iter().map(describe).collect(),
        }
    }

    /// Whether it takes Triton's LLM tensors without being a generation model: a Python model
    /// or an ensemble with a BYTES `text_input` input and a BYTES `text_output` output (a
    /// vLLM-style `model.py`, a TensorRT-LLM-style ensemble), which the OpenAI API drives
    /// through them.
    pub fn takes_llm_tensors(&self) -> bool {
        matches!(
            self.serving.executor,
            Executor::Python(_) | Executor::Ensemble(_)
        ) && self.serving.io.is_llm()
    }
}

impl Engine {
    /// Resolves the model version a request names (the newest ready one when `version` is
    /// empty): the one lookup a request makes.
    ///
    /// # Errors
    /// NOT_FOUND / UNAVAILABLE / INVALID_ARGUMENT in Triton's words when the model or version
    /// is unknown, not ready, or the version string is not a number.
    pub fn target(&self, name: &str, version: &str) -> Result<Target, Error> {
        let (model, serving) = self.resolve(name, version)?;
        let answers = self.answers(&serving, 0);
        Ok(Target {
            model,
            serving,
            answers,
        })
    }

    /// How `serving` answers, `depth` ensembles down (an ensemble answers as a stream when a
    /// step is decoupled, looked up as deep as ensembles run).
    pub(super) fn answers(&self, serving: &ServingVersion, depth: usize) -> Answers {
        match &serving.executor {
            Executor::Batched(_) => Answers::Once,
            Executor::Python(python) if python.decoupled() => Answers::Stream,
            Executor::Python(_) => Answers::Once,
            Executor::Ensemble(plan) if self.has_decoupled_step(plan, depth) => Answers::Stream,
            Executor::Ensemble(_) => Answers::Once,
            Executor::Generate(_) => Answers::Generation,
        }
    }
}
