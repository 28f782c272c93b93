//! What travels with a request through the engine besides its tensors: its admission (the
//! in-flight slot it holds), who sent it, its deadline and its trace. Every way into the engine
//! that runs a model ([`Engine::call`], [`Engine::infer`], [`Engine::embed`]) takes one, so none
//! can run without having been admitted.
//!
//! Cancellation is the future's drop: a front end drops the request's future when its client
//! goes away (tonic on a reset stream, hyper on a closed connection), and the engine counts the
//! request CANCELED then, as Triton does.

use super::{Admission, Engine};
use crate::core::Error;
use crate::trace::Trace;
use std::sync::Arc;
use std::time::Instant;

/// Who sent a request: the front ends word some refusals differently (Triton's texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `GRPCInferenceService` (ModelInfer, ModelStreamInfer).
    Grpc,
    /// REST: `/v2/.../infer`, generate, and the OpenAI / SageMaker / Vertex AI front ends.
    Http,
    /// A model's own request to the server (a Python model's BLS call).
    Model,
}

/// A request's admission, origin, deadline and trace.
pub struct Context {
    /// Held for its drop, which ends the request's in-flight count.
    pub(super) admission: Admission,
    pub(super) scope: Scope,
}

/// A [`Context`] without the admission: what an ensemble's steps share with their request.
#[derive(Clone)]
pub(super) struct Scope {
    pub(super) origin: Origin,
    /// When the client stops waiting (gRPC `grpc-timeout`): queued requests past it never run.
    pub(super) deadline: Option<Instant>,
    /// Its trace, when the trace settings sampled it.
    pub(super) trace: Option<Arc<Trace>>,
    /// How many ensembles the request is a step of.
    pub(super) depth: usize,
}

impl Context {
    /// The context of a request admitted with [`Engine::admit`].
    pub fn new(admission: Admission, origin: Origin) -> Context {
        Context {
            admission,
            scope: Scope {
                origin,
                deadline: None,
                trace: None,
                depth: 0,
            },
        }
    }

    /// The context of a request admitted with [`Engine::admit`] on behalf of another, whose
    /// `scope` it shares (an ensemble's decoupled step).
    pub(super) fn within(admission: Admission, scope: Scope) -> Context {
        Context { admission, scope }
    }

    /// When the client stops waiting.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Context {
        self.scope.deadline = deadline;
        self
    }

    /// The request's trace, when it was sampled.
    #[must_use]
    pub fn with_trace(mut self, trace: Option<Arc<Trace>>) -> Context {
        self.scope.trace = trace;
        self
    }
}

impl Scope {
    /// The scope of one of an ensemble's steps: the same origin and deadline, a child trace.
    pub(super) fn step(&self) -> Scope {
        Scope {
            origin: self.origin,
            deadline: self.deadline,
            trace: self.trace.as_ref().map(|trace| trace.child()),
            depth: self.depth + 1,
        }
    }
}

impl Engine {
    /// Admits a request from `origin` (see [`Engine::admit`]) and gives it its context. Both
    /// front ends call this once a request has arrived whole and before any work on it.
    ///
    /// # Errors
    /// As [`Engine::admit`].
    pub fn context(&self, origin: Origin) -> Result<Context, Error> {
        self.admit()
            .map(|admission| Context::new(admission, origin))
    }
}
