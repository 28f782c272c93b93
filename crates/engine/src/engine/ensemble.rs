//! Running an ensemble's requests: its plan's steps wave by wave, the steps of a wave at the same
//! time, each as a request to its model (looked up now, so reloads are followed), and each
//! step's outputs renamed into the ensemble tensors that later steps and the answer read.

use super::context::Scope;
use super::Engine;
use crate::core::{Error, InferRequest, InferResponse, RequestedOutput, Tensor};
use crate::repository::ensemble::{EnsemblePlan, Step};
use crate::repository::{Executor, IoSpec, ServingVersion};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// How deep ensembles may nest (an ensemble whose step is an ensemble...), which also stops
/// ensembles that run each other.
pub const MAX_DEPTH: usize = 8;

type Answer<'a> = Pin<Box<dyn Future<Output = Result<InferResponse, Error>> + Send + 'a>>;

impl Engine {
    /// Runs `plan` for ensemble `name` on its request's validated `inputs` and returns the
    /// ensemble's outputs, in the order of `io`. Steps of a traced request are traced as its
    /// children.
    ///
    /// # Errors
    /// A step's error, its kind kept and its message prefixed with the ensemble and step; an
    /// output of the wrong type; nesting deeper than [`MAX_DEPTH`].
    pub(super) async fn run_ensemble(
        &self,
        name: &str,
        plan: &EnsemblePlan,
        io: &IoSpec,
        inputs: Vec<Tensor>,
        request: &InferRequest,
        scope: &Scope,
    ) -> Result<Vec<Tensor>, Error> {
        if scope.depth >= MAX_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "ensemble '{name}' nests ensembles more than {MAX_DEPTH} deep"
            )));
        }
        let mut tensors: HashMap<String, Tensor> =
            inputs.into_iter().map(|t| (t.name.clone(), t)).collect();
        for wave in &plan.waves {
            self.run_wave(name, wave, &mut tensors, request, scope)
                .await?;
        }
        ensemble_outputs(name, io, tensors)
    }

    /// Runs the steps of one wave at the same time, their outputs renamed into `tensors`.
    pub(super) async fn run_wave(
        &self,
        name: &str,
        wave: &[Step],
        tensors: &mut HashMap<String, Tensor>,
        request: &InferRequest,
        scope: &Scope,
    ) -> Result<(), Error> {
        let runs = wave.iter().map(|step| {
            let step_request = step_request(step, tensors, request);
            let answer = self.run_request(step_request, scope.step());
            async move { answer.await.map_err(|e| step_error(name, e)) }
        });
        let answers = futures_util::future::try_join_all(runs).await?;
        for (step, answer) in wave.iter().zip(answers) {
            take_outputs(name, step, answer.outputs, tensors)?;
        }
        Ok(())
    }

    /// [`Engine::run`] behind a pointer, so that an ensemble's steps can be requests themselves.
    fn run_request(&self, request: InferRequest, scope: Scope) -> Answer<'_> {
        Box::pin(self.run(request, scope))
    }

    /// Whether a version serves: for an ensemble, also every model it runs (each as its step
    /// names it).
    pub(super) fn serves(&self, serving: &ServingVersion, depth: usize) -> bool {
        let Executor::Ensemble(plan) = &serving.executor else {
            return true;
        };
        depth < MAX_DEPTH
            && plan.waves.iter().flatten().all(|step| {
                self.resolve_loaded(&step.model, &step.version)
                    .is_ok_and(|(_, composing)| self.serves(&composing, depth + 1))
            })
    }
}

/// A step's error, its kind kept and its message prefixed with the ensemble, in Triton's words.
pub(super) fn step_error(name: &str, error: Error) -> Error {
    let message = format!("in ensemble '{name}', {}", error.message());
    error.with_message(message)
}

/// Renames the outputs `step` maps into ensemble tensors.
///
/// # Errors
/// INTERNAL when the step returned no output it maps.
pub(super) fn take_outputs(
    name: &str,
    step: &Step,
    mut outputs: Vec<Tensor>,
    tensors: &mut HashMap<String, Tensor>,
) -> Result<(), Error> {
    for (output, tensor) in &step.outputs {
        let index = outputs
            .iter()
            .position(|o| &o.name == output)
            .ok_or_else(|| {
                Error::Internal(format!(
                    "ensemble '{name}': step '{}' returned no output '{output}'",
                    step.model
                ))
            })?;
        let mut made = outputs.swap_remove(index);
        made.name = tensor.clone();
        made.parameters.clear();
        tensors.insert(tensor.clone(), made);
    }
    Ok(())
}

/// The ensemble's outputs from its tensors, in the order Triton's answer lists them: its walk
/// of a hash map of the config's outputs ([`super::visit_order`]).
///
/// # Errors
/// INTERNAL for an output no step made, or one of another type than the config's.
pub(super) fn ensemble_outputs(
    name: &str,
    io: &IoSpec,
    mut tensors: HashMap<String, Tensor>,
) -> Result<Vec<Tensor>, Error> {
    let names: Vec<&str> = io.outputs.iter().map(|spec| spec.name.as_str()).collect();
    super::visit_order(&names)
        .into_iter()
        .map(|index| {
            let spec = &io.outputs[index];
            let tensor = tensors.remove(&spec.name).ok_or_else(|| {
                Error::Internal(format!("ensemble '{name}' made no output '{}'", spec.name))
            })?;
            if tensor.datatype != spec.datatype {
                return Err(Error::Internal(format!(
                    "ensemble '{name}': output '{}' is {}, the config declares {}",
                    spec.name,
                    tensor.datatype.as_wire(),
                    spec.datatype.as_wire()
                )));
            }
            Ok(tensor)
        })
        .collect()
}

/// A step's request: its model's inputs from the ensemble tensors, only its mapped outputs, and
/// the ensemble request's sequence parameters.
pub(super) fn step_request(
    step: &Step,
    tensors: &HashMap<String, Tensor>,
    request: &InferRequest,
) -> InferRequest {
    InferRequest {
        model_name: step.model.clone(),
        model_version: step.version.clone(),
        id: request.id.clone(),
        inputs: step
            .inputs
            .iter()
            .filter_map(|(input, tensor)| {
                let mut fed = tensors.get(tensor)?.clone();
                fed.name = input.clone();
                fed.parameters.clear();
                Some(fed)
            })
            .collect(),
        outputs: step
            .outputs
            .iter()
            .map(|(output, _)| RequestedOutput {
                name: output.clone(),
                ..Default::default()
            })
            .collect(),
        // A stateful composing model follows the ensemble request's sequence.
        parameters: request
            .parameters
            .iter()
            .filter(|(key, _)| key.starts_with("sequence_"))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    }
}
