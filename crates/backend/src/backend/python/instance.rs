//! A Python model's instances ([`PythonInstance`]): started all at once through `initialize`,
//! each running a batch of requests at a time in one `execute` call on its stub (starting the
//! stub again if it died), and handing each request its responses, as they come for a decoupled
//! model. Scheduling them is the repository's ([`crate::repository::python`]).

use super::stub::{discard, stub_of, Call, Launcher, Stub};
use super::{cancel, decoupled, messages::pipe_error, Instance, PythonSpec, Request, Streamed};
use crate::core::Error;
use crate::proto::inference::ModelConfig;
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// One version of a Python model, as its instances start: the model's config, the version's
/// number, the model's directory, the version's code and how the stubs run.
#[derive(Clone, Copy)]
pub struct PythonVersion<'a> {
    pub config: &'a ModelConfig,
    pub version: i64,
    pub dir: &'a Path,
    pub model_file: &'a Path,
    pub spec: &'a PythonSpec,
}

/// Starts every instance of `what`, all at once, each through `initialize`: them, and what they
/// share. Blocking.
///
/// # Errors
/// Why an instance did not start (the interpreter, the stub, or what `initialize` raised); the
/// instances that did start are stopped.
pub fn start_instances(
    what: PythonVersion<'_>,
) -> Result<(Arc<Common>, Vec<PythonInstance>), String> {
    let PythonVersion {
        config,
        version,
        dir,
        model_file,
        spec,
    } = what;
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
    let mut instances = Vec::with_capacity(started.len());
    let mut failure = None;
    for (instance, stub) in spec.instances.iter().zip(started) {
        match stub {
            Ok(stub) => instances.push(PythonInstance {
                instance: instance.clone(),
                stub: Some(stub),
                common: Arc::clone(&common),
            }),
            Err(why) => failure = failure.or(Some(why)),
        }
    }
    match failure {
        Some(why) => {
            instances.into_iter().for_each(PythonInstance::retire);
            Err(why)
        }
        None => Ok((common, instances)),
    }
}

/// What a version's instances share.
#[derive(Debug)]
pub struct Common {
    pub(super) launcher: Launcher,
    /// What `requested_output_names()` gives when a request names none: every output.
    pub(super) all_outputs: Vec<String>,
    /// Where requests are watched for clients that go away (instance threads are not the
    /// runtime's): the runtime of the first request (loads may run outside it).
    pub(super) runtime: OnceLock<tokio::runtime::Handle>,
    /// `sequence_batching { iterative_sequence: true }`: the model may reschedule requests.
    pub(super) reschedules: bool,
}

impl Common {
    /// The model's name.
    pub fn model(&self) -> &str {
        &self.launcher.model
    }

    /// Whether the model is decoupled.
    pub fn decoupled(&self) -> bool {
        self.launcher.decoupled
    }

    /// Whether the model may reschedule requests (`iterative_sequence`).
    pub fn reschedules(&self) -> bool {
        self.reschedules
    }

    /// Notes the runtime of the caller (a request's), where requests are watched.
    pub fn enter_runtime(&self) {
        self.runtime.get_or_init(tokio::runtime::Handle::current);
    }
}

/// An instance, its stub running or (after a crash) to be started again: it runs a batch of
/// requests at a time, each `execute` call on the thread that calls it.
pub struct PythonInstance {
    instance: Instance,
    stub: Option<Stub>,
    common: Arc<Common>,
}

/// Where a call's responses go.
pub enum Deliver<'a> {
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

impl PythonInstance {
    /// Runs `requests` in one `execute` call on the stub, starting it first if it died, and
    /// delivers each request's responses, the last with `last`. Blocking until `execute` has
    /// returned (and, for a model that is not decoupled, answered). A decoupled model's requests
    /// it rescheduled are returned, by index (they have had no last response).
    pub fn execute(
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

    /// Asks the model to `finalize` and ends the process.
    pub fn retire(mut self) {
        if let Some(stub) = self.stub.take() {
            stub.finalize();
        }
    }

    /// What the version's instances share.
    pub fn common(&self) -> &Arc<Common> {
        &self.common
    }
}
