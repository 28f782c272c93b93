//! One request's way through a front end, the same in every handler that runs a model (gRPC
//! `ModelInfer`, each `ModelStreamInfer` request, REST `infer` and `generate`, the OpenAI
//! completions and embeddings): its trace, sampled as it arrived, with the protocol's receive
//! stamps; its admission into the engine, with its origin, deadline and trace; the
//! INFER_RESPONSE_COMPLETE stamp when an answer (a response or an error) comes; and the send
//! stamps of what goes out.

use crate::core::Error;
use crate::engine::{Context, Engine, Origin};
use crate::trace::{Activity, RecordOnDrop, Trace};
use std::sync::Arc;
use std::time::Instant;

/// Which front end a request came through: its origin, and its trace's send stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Grpc,
    Http,
}

impl Wire {
    /// Records the protocol's SEND_START on `trace` now, and its SEND_END when the marker
    /// returned is dropped (by the connection layer once the response has gone, or at once for
    /// what is handed over whole).
    pub fn sending(self, trace: Option<&Arc<Trace>>) -> Option<RecordOnDrop> {
        let (start, end) = match self {
            Wire::Grpc => (Activity::GrpcSendStart, Activity::GrpcSendEnd),
            Wire::Http => (Activity::HttpSendStart, Activity::HttpSendEnd),
        };
        trace.map(|trace| RecordOnDrop::sending(trace, start, end))
    }
}

/// A request on its way through a front end (see the module doc).
#[derive(Clone)]
pub struct Lifecycle {
    wire: Wire,
    trace: Option<Arc<Trace>>,
    deadline: Option<Instant>,
}

impl Lifecycle {
    /// A gRPC request for `model`, traced when the trace settings sample it (`traceparent`: its
    /// call's W3C trace context): GRPC_WAITREAD_START at `waited` (when its call or stream began
    /// waiting for it), GRPC_WAITREAD_END now.
    pub fn grpc(
        engine: &Engine,
        model: &str,
        traceparent: Option<&str>,
        waited: Instant,
    ) -> Lifecycle {
        let trace = engine.tracer().sample_with(model, traceparent);
        if let Some(trace) = &trace {
            trace.record(Activity::GrpcWaitreadStart, waited);
            trace.record(Activity::GrpcWaitreadEnd, Instant::now());
        }
        Lifecycle {
            wire: Wire::Grpc,
            trace,
            deadline: None,
        }
    }

    /// A REST request for `model` whose body is about to be read, traced when sampled:
    /// HTTP_RECV_START now (and HTTP_RECV_END at [`Lifecycle::received`]).
    pub fn http(engine: &Engine, model: &str, traceparent: Option<&str>) -> Lifecycle {
        let trace = engine.tracer().sample_with(model, traceparent);
        if let Some(trace) = &trace {
            trace.record(Activity::HttpRecvStart, Instant::now());
        }
        Lifecycle {
            wire: Wire::Http,
            trace,
            deadline: None,
        }
    }

    /// A request that is never traced (the OpenAI front end's, as Triton's OpenAI front end
    /// does not trace its requests).
    pub fn untraced(wire: Wire) -> Lifecycle {
        Lifecycle {
            wire,
            trace: None,
            deadline: None,
        }
    }

    /// When its client stops waiting (gRPC `grpc-timeout`).
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Lifecycle {
        self.deadline = deadline;
        self
    }

    /// Its body has arrived: HTTP_RECV_END.
    pub fn received(&self) {
        if let Some(trace) = &self.trace {
            trace.record(Activity::HttpRecvEnd, Instant::now());
        }
    }

    /// Admits it into the engine: its context, with its origin, deadline and trace. Every
    /// handler calls this once the request has arrived whole, before any work on it.
    ///
    /// # Errors
    /// As [`Engine::admit`]: the server is shutting down, or at `--max-inflight-requests`.
    pub fn admit(&self, engine: &Engine) -> Result<Context, Error> {
        let origin = match self.wire {
            Wire::Grpc => Origin::Grpc,
            Wire::Http => Origin::Http,
        };
        Ok(engine
            .context(origin)?
            .with_deadline(self.deadline)
            .with_trace(self.trace.clone()))
    }

    /// An answer from the model has come, a response or an error (both are sent and traced
    /// alike): INFER_RESPONSE_COMPLETE.
    pub fn answered<T>(&self, answer: T) -> T {
        if let Some(trace) = &self.trace {
            trace.record(Activity::InferResponseComplete, Instant::now());
        }
        answer
    }

    /// Something goes out now (see [`Wire::sending`]).
    pub fn sending(&self) -> Option<RecordOnDrop> {
        self.wire.sending(self.trace.as_ref())
    }

    /// Its trace, when it was sampled.
    pub fn trace(&self) -> Option<&Arc<Trace>> {
        self.trace.as_ref()
    }
}
