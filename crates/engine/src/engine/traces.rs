//! The engine's side of request tracing: the tracer it holds, the trace settings API with
//! Triton's model check, and the core timestamps and outputs of a traced request.

use super::Engine;
use crate::core::{Error, InferRequest, Tensor};
use crate::invalid_arg;
use crate::scheduler::Outcome;
use crate::trace::{Activity, TensorActivity, Trace, TraceSettings, TraceUpdate, Tracer};
use std::sync::Arc;

impl Engine {
    /// Traces with these settings (`--trace-config`); tracing is off otherwise.
    pub fn with_tracer(mut self, tracer: Tracer) -> Engine {
        self.tracer = Arc::new(tracer);
        self
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// The trace settings of `model` (the global ones for an empty name), after applying
    /// `update` when there is one.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, in Triton's words, for a model that is not ready; the update's errors.
    pub fn trace_settings(
        &self,
        model: &str,
        update: Option<&TraceUpdate>,
    ) -> Result<TraceSettings, Error> {
        if !model.is_empty() && !self.model_ready(model, "") {
            return Err(invalid_arg!("Request for unknown model : {model}"));
        }
        match update {
            Some(update) => self.tracer.update(model, update),
            None => Ok(self.tracer.settings(model)),
        }
    }
}

/// The outputs a request's response carries, as TENSOR_BACKEND_OUTPUT: those it asked for (all
/// when it named none), as Triton traces them.
pub fn record_outputs(trace: &Trace, request: &InferRequest, outputs: &[Tensor]) {
    let asked = |tensor: &&Tensor| {
        request.outputs.is_empty() || request.outputs.iter().any(|o| o.name == tensor.name)
    };
    trace.tensors(TensorActivity::BackendOutput, outputs.iter().filter(asked));
}

/// A request's time in the queue and in its batch, from what the scheduler reports.
pub fn record_outcome<T>(trace: &Trace, outcome: &Outcome<T>) {
    let started = outcome.started;
    let times = &outcome.compute;
    trace.record(
        Activity::QueueStart,
        started.checked_sub(outcome.queue).unwrap_or(started),
    );
    trace.record(Activity::ComputeStart, started);
    let input_end = started + times.input;
    trace.record(Activity::ComputeInputEnd, input_end);
    let output_start = input_end + times.infer;
    trace.record(Activity::ComputeOutputStart, output_start);
    trace.record(Activity::ComputeEnd, output_start + times.output);
}
