//! A Python model's versions as the repository serves them ([`PythonModel`]): the backend's
//! instances ([`crate::backend::python`]) behind the scheduler every backend has (queues,
//! priorities, queue policies, and with `dynamic_batching` its delay and preferred sizes), warmed
//! up with the config's samples first. A stateful model (`sequence_batching`) has a scheduler per
//! instance: a sequence's requests all go to the same one, where the model keeps its state.

use crate::backend::python::{
    start_instances, Answer, Common, Deliver, Gone, Outputs, PythonInstance, PythonSpec,
    PythonVersion, Request, Streamed,
};
use crate::backend::BackendError;
use crate::core::{Error, Tensor};
use crate::metrics::{ComputeTimes, ModelStats};
use crate::proto::inference::model_config::SchedulingChoice;
use crate::proto::inference::ModelConfig;
use crate::scheduler::rate_limit::{Limit, Permit};
use crate::scheduler::{self, Outcome, ScheduleError, Scheduler};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`, a request's first of its sequence.
const SEQUENCE_START: u32 = 1;

/// The error of a request the model rescheduled without `iterative_sequence`, in Triton's words
/// (Triton 2.51 logs them, and its client waits for ever).
fn cannot_reschedule() -> Error {
    Error::Internal(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not \
         configured to handle such a flag."
            .into(),
    )
}

/// How long an unload waits for `execute` calls still running (their clients gone: the version
/// unloads once nobody waits for it) before it goes on without them.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// An instance as the scheduler sees it: the scheduler hands it a batch of requests at a time,
/// each `execute` call on an instance thread.
struct Slot {
    instance: PythonInstance,
    /// Its place in the rate limiter (`--rate-limit`), if its group lists resources.
    limit: Option<Limit>,
}

/// A request on its way to an instance.
pub struct Work {
    request: Request,
    caller: Caller,
}

/// Who waits for a request.
enum Caller {
    /// A model that is not decoupled: the caller of [`PythonModel::execute`], which holds the
    /// sender while it waits.
    Waiting(tokio::sync::watch::Receiver<()>),
    /// A decoupled model's request: where its responses go, whenever the model sends them.
    Streaming(tokio::sync::mpsc::UnboundedSender<Streamed>),
}

impl Caller {
    /// Resolves when the caller goes away (then `is_cancelled()` says so in the model), for
    /// each run of the request (a rescheduled request runs again).
    fn gone(&self) -> Gone {
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

/// A version of a Python model: its instances behind the scheduler every backend has (queues,
/// priorities, queue policies, `dynamic_batching`'s delay and preferred sizes).
pub struct PythonModel {
    common: Arc<Common>,
    /// `model_transaction_policy { decoupled: true }`: requests get any number of responses.
    decoupled: bool,
    /// One scheduler for the instances; for a stateful model (`sequence_batching`), one per
    /// instance, which takes the sequences given to it.
    schedulers: Vec<Scheduler<Slot>>,
}

impl std::fmt::Debug for PythonModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonModel")
            .field("common", &self.common)
            .finish_non_exhaustive()
    }
}

impl PythonModel {
    /// Starts every instance of `what`, all at once, each through `initialize`, warms each up
    /// with `samples` (Triton's `model_warmup`), then starts the scheduler; its executions count
    /// in `stats`; `limits` are the instances' places in the rate limiter (one per instance of
    /// its spec, or none). Blocking.
    ///
    /// # Errors
    /// Why an instance did not start (the interpreter, the stub, or what `initialize` raised) or
    /// a warmup sample failed; the instances that did start are stopped.
    pub fn start(
        what: PythonVersion<'_>,
        samples: &[crate::repository::warmup::Sample],
        stats: &Arc<ModelStats>,
        limits: Vec<Option<Limit>>,
    ) -> Result<PythonModel, String> {
        let (config, version, spec) = (what.config, what.version, what.spec);
        let (common, instances) = start_instances(what)?;
        let decoupled = common.decoupled();
        let mut limits = limits.into_iter();
        let mut slots: Vec<Slot> = instances
            .into_iter()
            .map(|instance| Slot {
                instance,
                limit: limits.next().flatten(),
            })
            .collect();
        if let Err(why) = warm_up(&mut slots, samples, (&config.name, stats), decoupled) {
            slots.into_iter().for_each(scheduler::Instance::retire);
            return Err(why);
        }
        let sequences = matches!(
            config.scheduling_choice,
            Some(SchedulingChoice::SequenceBatching(_))
        );
        let schedulers = schedule(config, version, spec, slots, sequences, stats)?;
        Ok(PythonModel {
            common,
            decoupled,
            schedulers,
        })
    }

    /// The scheduler `request` goes to: a stateful model's sequence always to the same
    /// instance's, the slot it was given when it started (as Triton's sequence batcher routes
    /// them).
    fn scheduler(&self, request: &Request) -> &Scheduler<Slot> {
        let slot = request.sequence.as_ref().map_or(0, |s| s.slot);
        &self.schedulers[slot % self.schedulers.len()]
    }

    /// Runs `job` on an instance, in one `execute` call with the requests batched beside it
    /// (`dynamic_batching`, up to `max_batch_size` rows).
    ///
    /// # Errors
    /// The scheduler's refusals (a full queue, a timeout, the model unloading); the outcome
    /// carries the model's own error for the request (its `TritonError`, with the code it gave),
    /// or INTERNAL for an exception, a stub that died or an answer kiln cannot read.
    pub async fn execute(
        &self,
        job: scheduler::Request<Request>,
    ) -> Result<Outcome<Answer>, ScheduleError> {
        if self.decoupled {
            let why = format!(
                "model '{}' is decoupled: its requests go through execute_stream",
                self.common.model()
            );
            return Err(ScheduleError::Backend(BackendError::Run(why)));
        }
        // Held while this waits: a caller that goes away drops it, and the model hears so.
        let (_waiting, caller) = tokio::sync::watch::channel(());
        self.common.enter_runtime();
        let scheduler = self.scheduler(&job.inputs);
        scheduler
            .submit(job.map(|request| Work {
                request,
                caller: Caller::Waiting(caller),
            }))
            .await
    }

    /// Whether the model is decoupled: its requests go through [`PythonModel::execute_stream`].
    pub fn decoupled(&self) -> bool {
        self.decoupled
    }

    /// Runs `job` on a decoupled model: its responses as the model sends them, the last with
    /// `last` (or an error for the request, last too: the scheduler's refusal as `refused`
    /// words it). A request the model reschedules runs again, its responses going on in the
    /// same stream. `returned` runs once the request is out of the model's hands: its last
    /// `execute` call has returned (its responses may still be coming), with when it started
    /// and its time queued and computing; or the scheduler refused it, or its client went away
    /// (no outcome).
    pub fn execute_stream(
        self: &Arc<Self>,
        job: scheduler::Request<Request>,
        refused: impl FnOnce(ScheduleError) -> Error + Send + 'static,
        returned: impl FnOnce(Option<scheduler::Outcome<()>>) + Send + 'static,
    ) -> tokio::sync::mpsc::UnboundedReceiver<Streamed> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        self.common.enter_runtime();
        let this = Arc::clone(self);
        let job = job.map(|request| Work {
            request,
            caller: Caller::Streaming(sender.clone()),
        });
        tokio::spawn(async move {
            let scheduler = this.scheduler(&job.inputs.request);
            // Waits until `execute` has returned (the last time, for a request the model
            // reschedules); a client gone meanwhile takes the request out of the queue.
            let timing = tokio::select! {
                outcome = scheduler.submit(job) => match outcome {
                    Ok(outcome) => Some(outcome.map(|_| ())),
                    Err(error) => {
                        let _ = sender.send(Streamed { outputs: Err(refused(error)), last: true });
                        None
                    }
                },
                () = sender.closed() => None,
            };
            returned(timing);
        });
        receiver
    }

    /// Calls every instance's `finalize` and ends its process, once the requests already
    /// running are answered (an instance still running after [`STOP_GRACE`] is killed when its
    /// call ends); requests still queued are refused. Blocking.
    pub fn stop(&self) {
        for scheduler in &self.schedulers {
            scheduler.halt_within(Some(STOP_GRACE));
        }
    }
}

/// Starts the scheduler(s) of a version's started instances `slots`: one for them all, or for a
/// stateful model (`sequences`) one per instance, which takes the sequences given to it.
///
/// # Errors
/// Why a scheduler did not start; those started are halted.
fn schedule(
    config: &ModelConfig,
    version: i64,
    spec: &PythonSpec,
    slots: Vec<Slot>,
    sequences: bool,
    stats: &Arc<ModelStats>,
) -> Result<Vec<Scheduler<Slot>>, String> {
    let mut batching = crate::repository::config::batching_config(config, spec.adaptive_batching);
    // Requests batch together when their inputs agree in shape, but for ragged ones.
    batching.layout = Arc::new(crate::scheduler::layout::BatchLayout {
        ragged: config
            .input
            .iter()
            .filter(|input| input.allow_ragged_batch)
            .map(|input| input.name.clone())
            .collect(),
        ..Default::default()
    });
    let label = format!("{}-{version}", config.name);
    // A stateful model's instances each keep their sequences' state: one scheduler each.
    let groups: Vec<Vec<Slot>> = if sequences {
        slots.into_iter().map(|slot| vec![slot]).collect()
    } else {
        vec![slots]
    };
    let mut schedulers = Vec::with_capacity(groups.len());
    for (index, group) in groups.into_iter().enumerate() {
        let label = if sequences {
            format!("{label}-{index}")
        } else {
            label.clone()
        };
        schedulers.push(Scheduler::launch(
            &label,
            batching.clone(),
            group,
            Arc::clone(stats),
        ));
    }
    Ok(schedulers)
}

/// Runs every warmup sample on every instance, `count` times each, before the version serves
/// (Triton's `model_warmup`). Blocking.
///
/// # Errors
/// The first sample that fails, with the model's error.
fn warm_up(
    slots: &mut [Slot],
    samples: &[crate::repository::warmup::Sample],
    (model, stats): (&str, &crate::metrics::ModelStats),
    decoupled: bool,
) -> Result<(), String> {
    for sample in samples {
        // As Triton sends a sample: a request per batch element, all in one call.
        let requests: Vec<Request> = sample
            .requests()
            .into_iter()
            .map(|inputs| Request {
                inputs,
                ..Request::default()
            })
            .collect();
        let requests: Vec<&Request> = requests.iter().collect();
        for slot in slots.iter_mut() {
            for _ in 0..sample.count {
                let mut failure = None;
                let started = std::time::Instant::now();
                if decoupled {
                    // Every response of each request, until its last.
                    let (senders, receivers): (Vec<_>, Vec<_>) = requests
                        .iter()
                        .map(|_| tokio::sync::mpsc::unbounded_channel())
                        .unzip();
                    slot.instance
                        .execute(&requests, Vec::new(), Deliver::Later(senders));
                    for mut responses in receivers {
                        while let Some(item) = responses.blocking_recv() {
                            if let Err(error) = item.outputs {
                                failure.get_or_insert(error);
                            }
                            if item.last {
                                break;
                            }
                        }
                    }
                } else {
                    let mut note = |_, item: Streamed| {
                        let answered = item
                            .outputs
                            .and_then(|o| o.map(Outputs::answered).transpose());
                        if let Err(error) = answered {
                            failure.get_or_insert(error);
                        }
                    };
                    slot.instance
                        .execute(&requests, Vec::new(), Deliver::Now(&mut note));
                }
                if let Some(error) = failure {
                    return Err(sample.failed(model, error.message()));
                }
                sample.record(stats, started.elapsed(), None);
            }
        }
        tracing::info!(
            "model '{model}': {} instance(s) warmed up with sample '{}'",
            slots.len(),
            sample.name
        );
    }
    Ok(())
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
        let reschedules = self.instance.common().reschedules();
        let answers = if self.instance.common().decoupled() {
            let senders = batch
                .iter()
                .filter_map(|work| match &work.caller {
                    Caller::Streaming(stream) => Some(stream.clone()),
                    Caller::Waiting(_) => None,
                })
                .collect();
            let rescheduled = self
                .instance
                .execute(&requests, gone, Deliver::Later(senders));
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
            self.instance
                .execute(&requests, gone, Deliver::Now(&mut answer));
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
    fn retire(self) {
        self.instance.retire();
    }
}
