//! A Python model's instance as the scheduler sees it ([`Slot`]): it takes a batch of requests
//! at a time, runs them in one `execute` call on its stub (starting the stub again if it died),
//! and hands each request its responses, as they come for a decoupled model.

use super::stub::{discard, stub_of, Call, Stub};
use super::Answer;
use super::{
    cancel, decoupled, messages::pipe_error, Common, Instance, Outputs, Request, Streamed,
};
use crate::backend::BackendError;
use crate::core::{Error, Tensor};
use crate::metrics::ComputeTimes;
use crate::scheduler;
use crate::scheduler::rate_limit::{Limit, Permit};
use std::sync::Arc;
use std::time::Instant;

/// Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`, a request's first of its sequence.
pub(super) const SEQUENCE_START: u32 = 1;

/// The error of a request the model rescheduled without `iterative_sequence`, in Triton's words
/// (Triton 2.51 logs them, and its client waits for ever).
pub(super) fn cannot_reschedule() -> Error {
    Error::Internal(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not \
         configured to handle such a flag."
            .into(),
    )
}

/// An instance, its stub running or (after a crash) to be started again; the scheduler hands it
/// a batch of requests at a time, each `execute` call on the instance's own thread.
pub(super) struct Slot {
    pub(super) instance: Instance,
    pub(super) stub: Option<Stub>,
    pub(super) common: Arc<Common>,
    /// Its place in the rate limiter (`--rate-limit`), if its group lists resources.
    pub(super) limit: Option<Limit>,
}

/// A request on its way to an instance.
pub struct Work {
    pub(super) request: Request,
    pub(super) caller: Caller,
}

/// Who waits for a request.
pub(super) enum Caller {
    /// A model that is not decoupled: the caller of [`PythonModel::execute`], which holds the
    /// sender while it waits.
    Waiting(tokio::sync::watch::Receiver<()>),
    /// A decoupled model's request: where its responses go, whenever the model sends them.
    Streaming(tokio::sync::mpsc::UnboundedSender<Streamed>),
}

impl Caller {
    /// Resolves when the caller goes away (then `is_cancelled()` says so in the model), for
    /// each run of the request (a rescheduled request runs again).
    fn gone(&self) -> cancel::Gone {
        match self {
            Caller::Waiting(waiting) => {
                let mut waiting = waiting.clone();
                // Nothing is ever sent: it resolves when the sender is dropped.
                Box::pin(async move { while waiting.changed().await.is_ok() {} })
            }
            Caller::Streaming(stream) => {
                let stream = stream.clone();
                Box::pin(async move { stream.closed().await })
            }
        }
    }
}

/// Where a call's responses go.
pub(super) enum Deliver<'a> {
    /// Handed over as the call answers (a model that is not decoupled).
    Now(&'a mut dyn FnMut(usize, Streamed)),
    /// Sent to each request's channel by the stub's reader, whenever the model answers (a
    /// decoupled model), one sender per request.
    Later(Vec<tokio::sync::mpsc::UnboundedSender<Streamed>>),
}

impl Deliver<'_> {
    /// Ends each of `count` requests with `error`.
    fn fail(self, count: usize, error: &Error) {
        let item = || Streamed {
            outputs: Err(error.clone()),
            last: true,
        };
        match self {
            Deliver::Now(deliver) => (0..count).for_each(|index| deliver(index, item())),
            Deliver::Later(senders) => senders.iter().for_each(|sender| {
                let _ = sender.send(item());
            }),
        }
    }
}

impl scheduler::Instance for Slot {
    type Input = Work;
    /// A decoupled model's requests are answered through their streams: theirs is empty.
    type Output = Answer;

    fn tensors(work: &Work) -> &[Tensor] {
        &work.request.inputs
    }

    fn run(
        &mut self,
        batch: &mut [&mut Work],
        _rows: &[usize],
    ) -> (Result<Vec<Answer>, BackendError>, ComputeTimes) {
        let started = Instant::now();
        let gone = batch.iter().map(|work| Some(work.caller.gone())).collect();
        let requests: Vec<&Request> = batch.iter().map(|work| &work.request).collect();
        let reschedules = self.common.reschedules;
        let answers = if self.common.launcher.decoupled {
            let senders = batch
                .iter()
                .filter_map(|work| match &work.caller {
                    Caller::Streaming(stream) => Some(stream.clone()),
                    Caller::Waiting(_) => None,
                })
                .collect();
            let rescheduled = self.execute(&requests, gone, Deliver::Later(senders));
            batch
                .iter()
                .enumerate()
                .map(|(index, work)| {
                    let again = rescheduled.contains(&index);
                    match &work.caller {
                        Caller::Streaming(stream) if again && !reschedules => {
                            let _ = stream.send(Streamed {
                                outputs: Err(cannot_reschedule()),
                                last: true,
                            });
                        }
                        _ => {}
                    }
                    Ok(Outputs {
                        rescheduled: again && reschedules,
                        ..Outputs::default()
                    })
                })
                .collect()
        } else {
            let mut whole: Vec<Option<Result<Option<Outputs>, Error>>> =
                requests.iter().map(|_| None).collect();
            let mut answer = |index: usize, item: Streamed| whole[index] = Some(item.outputs);
            self.execute(&requests, gone, Deliver::Now(&mut answer));
            whole
                .into_iter()
                .map(|answer| match answer {
                    Some(Ok(Some(outputs))) if outputs.rescheduled && !reschedules => {
                        Err(cannot_reschedule())
                    }
                    Some(Ok(outputs)) => Ok(outputs.unwrap_or_default()),
                    Some(Err(error)) => Err(error),
                    None => Err(Error::Internal("the Python model sent no response".into())),
                })
                .collect()
        };
        // A rescheduled request runs on in its sequence: its next runs are not its START (as
        // Triton 2.51 shows them to the model).
        for (work, answer) in batch.iter_mut().zip(&answers) {
            if <Slot as scheduler::Instance>::rescheduled(answer) {
                if let Some(sequence) = &mut work.request.sequence {
                    sequence.flags &= !SEQUENCE_START;
                }
            }
        }
        let times = ComputeTimes {
            infer: started.elapsed(),
            ..ComputeTimes::default()
        };
        (Ok(answers), times)
    }

    fn admit(&self) -> Option<Permit> {
        self.limit.as_ref().map(Limit::admit)
    }

    fn rescheduled(answer: &Answer) -> bool {
        answer.as_ref().is_ok_and(|outputs| outputs.rescheduled)
    }

    /// Asks the model to `finalize` and ends the process.
    fn retire(mut self) {
        if let Some(stub) = self.stub.take() {
            stub.finalize();
        }
    }
}

impl Slot {
    /// Runs `requests` in one `execute` call on the stub, starting it first if it died, and
    /// delivers each request's responses, the last with `last`. Blocking until `execute` has
    /// returned (and, for a model that is not decoupled, answered). A decoupled model's requests
    /// it rescheduled are returned, by index (they have had no last response).
    pub(super) fn execute(
        &mut self,
        requests: &[&Request],
        gone: Vec<Option<cancel::Gone>>,
        deliver: Deliver<'_>,
    ) -> Vec<usize> {
        let common = Arc::clone(&self.common);
        let instance = &self.instance.name;
        let stub = match stub_of(&common.launcher, &self.instance, &mut self.stub) {
            Ok(stub) => stub,
            Err(error) => {
                deliver.fail(requests.len(), &error);
                return Vec::new();
            }
        };
        let call = Call {
            all_outputs: &common.all_outputs,
            model: &common.launcher.model,
            instance,
            caller: &common.launcher.caller,
        };
        let runtime = common.runtime.get();
        let number = stub.calls.get() + 1;
        let broken = match deliver {
            Deliver::Now(deliver) => {
                // Watched while the call runs; the watch ends with it.
                let _watch = cancel::Watch::start(runtime, &stub.notices, number, gone);
                match stub.execute(requests, &call) {
                    Ok(answers) => {
                        for (index, answer) in answers.into_iter().enumerate() {
                            let outputs = answer.map(Some);
                            deliver(
                                index,
                                Streamed {
                                    outputs,
                                    last: true,
                                },
                            );
                        }
                        return Vec::new();
                    }
                    Err(broken) => {
                        let (why, status) = (pipe_error(&broken), discard(&mut self.stub));
                        Deliver::Now(deliver).fail(
                            requests.len(),
                            &Error::Internal(format!(
                                "Stub process '{instance}' is not healthy: {why}{status}; it \
                                 restarts for the next request"
                            )),
                        );
                        (why, status)
                    }
                }
            }
            Deliver::Later(senders) => {
                let Some(reader) = &stub.reader else {
                    Deliver::Later(senders).fail(
                        requests.len(),
                        &Error::Internal("a decoupled model's stub has no reader".into()),
                    );
                    return Vec::new();
                };
                let mut gone = gone.into_iter();
                for (index, (request, sender)) in requests.iter().zip(senders).enumerate() {
                    let watch = cancel::Watch::one(
                        runtime,
                        &stub.notices,
                        number,
                        index,
                        gone.next().flatten(),
                    );
                    let asked = request.outputs.clone();
                    let open = decoupled::Open {
                        asked,
                        sender,
                        watch,
                    };
                    reader.open(number, index, open);
                }
                let sent = stub.send_requests(requests, &call);
                match sent
                    .map_err(|e| pipe_error(&e))
                    .and_then(|()| reader.returned(number))
                {
                    Ok(rescheduled) => return rescheduled,
                    // Ending the stub ends its reader, which fails the requests still open.
                    Err(why) => (why, discard(&mut self.stub)),
                }
            }
        };
        let (why, status) = broken;
        tracing::error!(
            "Stub process '{instance}' is not healthy ({why}{status}); it restarts for the next \
             request"
        );
        Vec::new()
    }
}
