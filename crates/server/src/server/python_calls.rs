//! How Python models call the server ([`ServerCalls`]): `InferenceRequest.exec()` (Triton's BLS;
//! `exec(decoupled=True)` collects a decoupled model's responses) and `pb_utils.load_model`,
//! `unload_model`, `is_model_ready`, run on the engine from the stub's (blocking) threads.

use crate::backend::python::{Cancel, Management, ServerCalls};
use crate::core::{Error, InferRequest, InferResponse};
use crate::engine::{Engine, Failed, Origin};
use crate::trace::Trace;
use std::future::Future;
use std::sync::{Arc, Weak};
use tracing::warn;

/// The engine's side of Python models' calls. The engine is held weakly: the repository it
/// owns holds this.
struct EngineCalls {
    engine: Weak<Engine>,
    runtime: tokio::runtime::Handle,
}

/// Lets Python models call the server's models and manage its repository.
pub(super) fn connect(engine: &Arc<Engine>) {
    engine.repository().python_calls().connect_to(EngineCalls {
        engine: Arc::downgrade(engine),
        runtime: tokio::runtime::Handle::current(),
    });
}

impl ServerCalls for EngineCalls {
    fn infer(
        &self,
        request: InferRequest,
        trace: Option<Arc<Trace>>,
    ) -> Result<InferResponse, Error> {
        on_engine(&self.runtime, &self.engine, |engine| async move {
            let context = engine.context(Origin::Model)?.with_trace(trace);
            engine
                .infer(request, context)
                .await
                .map_err(Failed::into_error)
        })
    }

    /// Each response as the called model sends it; the stream ends with the call, or when the
    /// calling model cancels it (the request is dropped: the called model hears its client
    /// left).
    fn infer_decoupled(
        &self,
        request: InferRequest,
        trace: Option<Arc<Trace>>,
        cancel: Cancel,
    ) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>> {
        let (sink, responses) = std::sync::mpsc::channel();
        match self.engine.upgrade() {
            Some(engine) => {
                self.runtime.spawn(async move {
                    let each = |response| sink.send(response).is_ok();
                    let ran = async {
                        let context = engine.context(Origin::Model)?.with_trace(trace);
                        engine.infer_decoupled(request, context, each).await
                    };
                    tokio::select! {
                        ran = ran => if let Err(error) = ran {
                            let _ = sink.send(Err(error));
                        },
                        Ok(()) = cancel => {}
                    }
                });
            }
            None => {
                let _ = sink.send(Err(Error::Unavailable("Server exiting".into())));
            }
        }
        responses
    }

    fn manage(&self, asked: Management) -> Result<bool, Error> {
        on_engine(&self.runtime, &self.engine, |engine| async move {
            match asked {
                Management::Load { model, parameters } => {
                    engine.load_model(&model, parameters).await.map(|()| true)
                }
                // Not waited for, as in Triton: a model may unload itself.
                Management::Unload { model, dependents } => {
                    tokio::spawn(async move {
                        if let Err(error) = engine.unload_model(&model, dependents).await {
                            warn!("a Python model's unload of '{model}' failed: {error}");
                        }
                    });
                    Ok(true)
                }
                Management::Ready { model, version } => Ok(engine.model_ready(&model, &version)),
            }
        })
    }
}

/// Runs `work` on the engine, on the runtime, while this (blocking) thread waits for it.
fn on_engine<T, F>(
    runtime: &tokio::runtime::Handle,
    engine: &Weak<Engine>,
    work: impl FnOnce(Arc<Engine>) -> F,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
{
    let engine = engine
        .upgrade()
        .ok_or_else(|| Error::Unavailable("Server exiting".into()))?;
    let (answer, answered) = std::sync::mpsc::channel();
    let work = work(engine);
    runtime.spawn(async move {
        let _ = answer.send(work.await);
    });
    answered.recv().unwrap_or_else(|_| {
        Err(Error::Internal(
            "a Python model's call to another model was dropped".into(),
        ))
    })
}
