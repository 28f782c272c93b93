//! Triton's Python backend: a model whose `<version>/model.py` defines `TritonPythonModel`
//! (`initialize(args)`, `execute(requests)`, `finalize()`) runs in Python processes of its own,
//! one per instance, as Triton runs it in its stub processes. kiln sends each process its stub
//! (`stub.py`) and its `triton_python_backend_utils` (what models import as `pb_utils`) over
//! the process's standard input, then talks to it there and on its standard output
//! ([`channel`]).
//!
//! Requests go through the scheduler every backend has ([`crate::scheduler`]): its queues,
//! priorities and queue policies, and with `dynamic_batching` its delay and preferred sizes. An
//! instance thread hands each batch (up to `max_batch_size` rows of requests whose inputs agree
//! in shape) to its stub in one `execute` call, each request with its id, its parameters (as the
//! JSON text `request.parameters()` gives) and the outputs it asks for. A response's
//! `TritonError` fails its request with that message, an exception fails the call's requests
//! with Triton's "Failed to process the request(s)" message. A decoupled model's responses are
//! passed on as the model sends them ([`Streamed`]). A stub that dies (a crash, `os._exit`)
//! fails what it was running and is started again, `initialize` and all, for the next call. A
//! request whose client goes away while it runs is reported to the stub ([`cancel`]): the
//! model's `is_cancelled()`. `InferenceRequest.exec()` in a model runs through the server's
//! engine ([`ModelCaller`]). A stateful model (`sequence_batching`) has a scheduler per
//! instance: a sequence's requests all go to the same one, where the model keeps its state, and
//! different sequences' requests batch together there.
//!
//! The interpreter is the config's `EXECUTION_ENV_PATH` (an environment, packed or not), else
//! `$KILN_PYTHON`, else `python3` on the `PATH` ([`environment`]); it needs numpy. A stub sees
//! only some of kiln's environment variables, none of its secrets ([`StubEnvironment`]).
//!
//! By job: [`spec`] reads the config (interpreter, instances, `auto_complete_config`); this
//! module starts, warms up, schedules and stops a version ([`PythonModel`]); [`slot`] is an
//! instance as the scheduler runs it; [`stub`] the stub process and its pipe; [`calls`] the
//! model's calls to the server; [`messages`] what the stub's messages mean (error codes,
//! outputs, parameters); [`logs`] its log lines and custom metrics.

mod calls;
mod cancel;
mod channel;
mod decoupled;
pub mod environment;
mod logs;
mod messages;
mod slot;
mod spec;
mod stub;
mod stub_env;

use crate::backend::BackendError;
use crate::core::{Error, Parameters, Tensor};
use crate::metrics::ModelStats;
use crate::proto::inference::ModelConfig;
use crate::scheduler::rate_limit::Limit;
use crate::scheduler::{self, Outcome, ScheduleError, Scheduler};
use crate::trace::Trace;
pub use calls::{Cancel, Management, ModelCaller, ServerCalls};
use serde_json::Value;
pub use slot::Work;
use slot::{Caller, Deliver, Slot};
pub use spec::{
    auto_complete, backend_code, Instance, PythonSpec, BACKEND, DEFAULT_BACKEND_DIRECTORY,
    DEFAULT_MODEL_FILENAME,
};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use stub::{Launcher, Stub};
pub use stub_env::StubEnvironment;
// What the unit tests (`use super::*`, written when this was one file) reach in its parts.
#[cfg(test)]
use {
    crate::core::{InferResponse, ParamValue},
    crate::proto::inference::model_instance_group::Kind,
    calls::{call, manage, Streams},
    messages::{error_code, model_error, parameters_json},
    serde_json::json,
    std::sync::Mutex,
};

/// How long an unload waits for `execute` calls still running (their clients gone: the version
/// unloads once nobody waits for it) before it goes on without them.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// One inference request for a Python model.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub id: String,
    pub parameters: Parameters,
    /// The outputs asked for; empty: all.
    pub outputs: Vec<String>,
    pub inputs: Vec<Tensor>,
    /// The order `request.inputs()` lists `inputs` in, as indexes (Triton's order, which
    /// follows the client's); empty: as they are.
    pub listed: Vec<usize>,
    /// Its sequence, for a model with `sequence_batching`.
    pub sequence: Option<SequenceOf>,
    /// Its trace, which the model's calls may pass on (`trace=request.trace()`).
    pub trace: Option<Arc<Trace>>,
}

impl Request {
    /// The inputs in the order the model is given them.
    fn listed_inputs(&self) -> impl Iterator<Item = &Tensor> {
        let listed = (self.listed.len() == self.inputs.len()).then_some(&self.listed);
        (0..self.inputs.len()).map(move |at| &self.inputs[listed.map_or(at, |order| order[at])])
    }
}

/// Where a request of a stateful model stands in its sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceOf {
    /// `request.correlation_id()`: a number or a string.
    pub correlation_id: Value,
    /// `request.flags()`: TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) and _END (2).
    pub flags: u32,
    /// The instance every request of the sequence runs on (by index).
    pub slot: usize,
}

/// What one response carries: its output tensors and the parameters the model gave it
/// (`InferenceResponse(..., parameters=...)`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outputs {
    pub tensors: Vec<Tensor>,
    pub parameters: Parameters,
    /// The model rescheduled the request (`set_release_flags(TRITONSERVER_REQUEST_RELEASE_
    /// RESCHEDULE)`): it runs again in a later `execute` call, which answers it.
    pub rescheduled: bool,
    /// The model's error response (`InferenceResponse(error=...)`) to a request of a model that
    /// is not decoupled: the request fails with it, yet counts as a success, as Triton's Python
    /// backend counts a response it sent.
    pub refused: Option<Error>,
}

impl Outputs {
    /// The outputs, or the model's error response as the error.
    pub fn answered(self) -> Result<Outputs, Error> {
        match self.refused {
            Some(error) => Err(error),
            None => Ok(self),
        }
    }
}

/// What a version's instances share.
#[derive(Debug)]
struct Common {
    launcher: Launcher,
    /// What `requested_output_names()` gives when a request names none: every output.
    all_outputs: Vec<String>,
    /// Where requests are watched for clients that go away (instance threads are not the
    /// runtime's): the runtime of the first request (loads may run outside it).
    runtime: OnceLock<tokio::runtime::Handle>,
    /// `sequence_batching { iterative_sequence: true }`: the model may reschedule requests.
    reschedules: bool,
}

/// A request's answer from a model that is not decoupled: its response, or the model's error for
/// it (an exception, a `TritonError`, a stub that died).
pub type Answer = Result<Outputs, Error>;

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

/// One response to a request: its outputs (`None`: only the word that the response before was
/// the last, which a decoupled model may send alone), or its error; `last` on the final one.
#[derive(Debug)]
pub struct Streamed {
    pub outputs: Result<Option<Outputs>, Error>,
    pub last: bool,
}

impl std::fmt::Debug for PythonModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonModel")
            .field("launcher", &self.common.launcher)
            .finish_non_exhaustive()
    }
}

impl PythonModel {
    /// Starts every instance of version `version` (`model_file` in `dir`), all at once, each
    /// through `initialize`, warms each up with `samples` (Triton's `model_warmup`), then
    /// starts the scheduler; its executions count in `stats`; `limits` are the instances'
    /// places in the rate limiter (one per instance of `spec`, or none). Blocking.
    ///
    /// # Errors
    /// Why an instance did not start (the interpreter, the stub, or what `initialize` raised) or
    /// a warmup sample failed; the instances that did start are stopped.
    pub fn start(
        config: &ModelConfig,
        version: i64,
        (dir, model_file): (&Path, &Path),
        spec: &PythonSpec,
        samples: &[crate::repository::warmup::Sample],
        stats: &Arc<ModelStats>,
        limits: Vec<Option<Limit>>,
    ) -> Result<PythonModel, String> {
        let config_json = crate::proto::to_json(config, "inference.ModelConfig").to_string();
        let mut args = serde_json::Map::new();
        for (key, value) in [
            ("model_config", config_json),
            ("model_repository", dir.to_string_lossy().into_owned()),
            ("model_version", version.to_string()),
            ("model_name", config.name.clone()),
        ] {
            args.insert(key.into(), Value::String(value));
        }
        let decoupled = config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled);
        let sequence_batching = match &config.scheduling_choice {
            Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(
                batching,
            )) => Some(batching),
            _ => None,
        };
        let common = Arc::new(Common {
            launcher: Launcher {
                model: config.name.clone(),
                decoupled,
                caller: spec.caller.clone(),
                interpreter: spec.interpreter.clone(),
                model_file: model_file.to_path_buf(),
                args,
            },
            all_outputs: config.output.iter().map(|o| o.name.clone()).collect(),
            runtime: OnceLock::new(),
            reschedules: sequence_batching.is_some_and(|batching| batching.iterative_sequence),
        });
        let launcher = &common.launcher;
        let started: Vec<Result<Stub, String>> = std::thread::scope(|scope| {
            let starting: Vec<_> = spec
                .instances
                .iter()
                .map(|instance| scope.spawn(|| launcher.start(instance)))
                .collect();
            starting
                .into_iter()
                .map(|start| {
                    start
                        .join()
                        .unwrap_or_else(|_| Err("starting an instance panicked".into()))
                })
                .collect()
        });
        let mut slots = Vec::with_capacity(started.len());
        let mut failure = None;
        let mut limits = limits.into_iter();
        for (instance, stub) in spec.instances.iter().zip(started) {
            let limit = limits.next().flatten();
            match stub {
                Ok(stub) => slots.push(Slot {
                    instance: instance.clone(),
                    stub: Some(stub),
                    common: Arc::clone(&common),
                    limit,
                }),
                Err(why) => failure = failure.or(Some(why)),
            }
        }
        if failure.is_none() {
            failure = warm_up(&mut slots, samples, (&config.name, stats), decoupled).err();
        }
        if let Some(why) = failure {
            slots.into_iter().for_each(scheduler::Instance::retire);
            return Err(why);
        }
        let sequences = sequence_batching.is_some();
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
                self.common.launcher.model
            );
            return Err(ScheduleError::Backend(BackendError::Run(why)));
        }
        // Held while this waits: a caller that goes away drops it, and the model hears so.
        let (_waiting, caller) = tokio::sync::watch::channel(());
        self.common
            .runtime
            .get_or_init(tokio::runtime::Handle::current);
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
        self.common
            .runtime
            .get_or_init(tokio::runtime::Handle::current);
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
        match Scheduler::launch(&label, batching.clone(), group, Arc::clone(stats)) {
            Ok(scheduler) => schedulers.push(scheduler),
            Err(error) => {
                schedulers.iter().for_each(Scheduler::halt);
                return Err(format!("failed to start instances: {error}"));
            }
        }
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
                    slot.execute(&requests, Vec::new(), Deliver::Later(senders));
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
                    slot.execute(&requests, Vec::new(), Deliver::Now(&mut note));
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

#[cfg(test)]
mod tests;
