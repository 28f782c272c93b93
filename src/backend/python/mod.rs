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

mod cancel;
mod channel;
mod decoupled;
pub mod environment;
mod stub_env;

use crate::backend::BackendError;
use crate::core::{Error, InferRequest, InferResponse, ParamValue, Parameters, Tensor};
use crate::metrics::{ComputeTimes, ModelStats};
use crate::proto::inference::{model_instance_group::Kind, ModelConfig};
use crate::scheduler::rate_limit::{Limit, Permit};
use crate::scheduler::{self, Outcome, ScheduleError, Scheduler};
use crate::trace::Trace;
use environment::Interpreter;
use serde_json::{json, Value};
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
pub use stub_env::StubEnvironment;

/// Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`, a request's first of its sequence.
const SEQUENCE_START: u32 = 1;

/// The `backend` of a Python model.
pub const BACKEND: &str = "python";
/// Its model file when the config names none.
pub const DEFAULT_MODEL_FILENAME: &str = "model.py";
/// Where Python-based backends live unless `--backend-directory` says otherwise (Triton's).
pub const DEFAULT_BACKEND_DIRECTORY: &str = "/opt/tritonserver/backends";

/// The `model.py` of the Python-based backend `config` names: `<backend_dir>/<backend>/model.py`
/// when the backend is neither ONNX Runtime nor Python and the file exists (Triton's Python-based
/// backends: one `model.py` serves every model naming the backend). A backend name that is not a
/// plain directory name names none.
pub fn backend_code(config: &ModelConfig, backend_dir: &Path) -> Option<PathBuf> {
    let backend = config.backend.as_str();
    let plain = !backend.is_empty()
        && !matches!(backend, "." | ".." | BACKEND | "onnxruntime")
        && !backend.contains(['/', '\\', '\0']);
    let code = backend_dir.join(backend).join(DEFAULT_MODEL_FILENAME);
    (plain && code.is_file()).then_some(code)
}
/// How long `finalize` may take when a model unloads before its process is killed.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an unload waits for `execute` calls still running (their clients gone: the version
/// unloads once nobody waits for it) before it goes on without them.
const STOP_GRACE: Duration = Duration::from_secs(5);

const STUB: &str = include_str!("stub.py");
const UTILS: &str = include_str!("triton_python_backend_utils.py");

/// Runs one request on any model of the server.
type RunRequest = dyn Fn(InferRequest) -> Result<InferResponse, Error> + Send + Sync;
/// Runs one request on a decoupled model of the server: each response as it sends it (an error
/// ends the stream). A value sent on its [`Cancel`] cancels the request: the stream ends there.
type RunDecoupled = dyn Fn(InferRequest, Cancel) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>>
    + Send
    + Sync;

/// What cancels a decoupled call (`ResponseIterator.cancel()`): a value sent (a sender dropped
/// without sending cancels nothing).
pub type Cancel = tokio::sync::oneshot::Receiver<()>;

/// The decoupled call a stub's model is iterating, by the number the stub gave it, for
/// `ResponseIterator.cancel()`. A stub has at most one open: it reads a call's answers to their
/// end before it makes its next call.
#[derive(Clone, Default)]
struct Streams(Arc<Mutex<Option<OpenStream>>>);

/// A decoupled call's number, and what cancels it.
type OpenStream = (u64, tokio::sync::oneshot::Sender<()>);

impl Streams {
    /// Call `stream` starts: what cancels it.
    fn open(&self, stream: u64) -> Cancel {
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((stream, cancel));
        cancelled
    }

    /// Cancels the call a stub's `cancel` message names, if it is still the one open.
    fn cancel(&self, message: &Value) {
        if let Some(cancel) = message["stream"]
            .as_u64()
            .and_then(|stream| self.take(stream))
        {
            let _ = cancel.send(());
        }
    }

    /// Call `stream` ended.
    fn close(&self, stream: u64) {
        self.take(stream);
    }

    fn take(&self, stream: u64) -> Option<tokio::sync::oneshot::Sender<()>> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if open.as_ref().is_some_and(|(id, _)| *id == stream) {
            open.take().map(|(_, cancel)| cancel)
        } else {
            None
        }
    }
}

/// Loads, unloads or asks after a model of the server: whether it is ready (for `Ready`).
type Manage = dyn Fn(Management) -> Result<bool, Error> + Send + Sync;

/// What a Python model asks of the server's model repository (`pb_utils.load_model`,
/// `unload_model`, `is_model_ready`).
#[derive(Debug, Clone, PartialEq)]
pub enum Management {
    /// Loads or reloads `model`, with the repository API's `config` / `file:` parameters.
    Load {
        model: String,
        parameters: std::collections::BTreeMap<String, crate::repository::LoadParameter>,
    },
    Unload {
        model: String,
        dependents: bool,
    },
    Ready {
        model: String,
        version: String,
    },
}

/// What runs a Python model's calls to other models.
struct Calls {
    unary: Box<RunRequest>,
    decoupled: Box<RunDecoupled>,
    manage: Box<Manage>,
}

/// How a Python model's `InferenceRequest.exec()` (Triton's BLS: business logic scripting)
/// reaches the server's models. The repository exists before the engine that serves it, so the
/// server connects this once the engine does; every model loaded with the same options shares it.
#[derive(Clone, Default)]
pub struct ModelCaller(Arc<OnceLock<Calls>>, Arc<Mutex<TracedRequests>>);

/// The traces of the requests sent to Python models, by trace id, while they live: a model's call
/// that passes on `request.trace()` is traced as a child of its request's (as in Triton).
type TracedRequests = std::collections::HashMap<u64, std::sync::Weak<Trace>>;

impl ModelCaller {
    /// Sets what runs the calls, `exec()` and `exec(decoupled=True)`, and the model management
    /// requests (the first setting stays).
    pub fn connect(
        &self,
        unary: impl Fn(InferRequest) -> Result<InferResponse, Error> + Send + Sync + 'static,
        decoupled: impl Fn(InferRequest, Cancel) -> std::sync::mpsc::Receiver<Result<InferResponse, Error>>
            + Send
            + Sync
            + 'static,
        manage: impl Fn(Management) -> Result<bool, Error> + Send + Sync + 'static,
    ) {
        let _ = self.0.set(Calls {
            unary: Box::new(unary),
            decoupled: Box::new(decoupled),
            manage: Box::new(manage),
        });
    }

    fn calls(&self) -> Result<&Calls, Error> {
        self.0.get().ok_or_else(|| {
            Error::Unavailable("this server cannot run other models for a Python model".into())
        })
    }

    /// The id a request's trace goes to the stub with (0: none), kept for its calls.
    fn traced(&self, trace: Option<&Arc<Trace>>) -> u64 {
        let Some(trace) = trace else { return 0 };
        let mut traced = self.1.lock().unwrap_or_else(|e| e.into_inner());
        traced.retain(|_, trace| trace.strong_count() > 0);
        traced.insert(trace.id(), Arc::downgrade(trace));
        trace.id()
    }

    /// A trace for a call made on behalf of the request traced as `id`, while that lives.
    fn child_trace(&self, id: u64) -> Option<Arc<Trace>> {
        let traced = self.1.lock().unwrap_or_else(|e| e.into_inner());
        traced
            .get(&id)
            .and_then(std::sync::Weak::upgrade)
            .map(|trace| trace.child())
    }
}

impl std::fmt::Debug for ModelCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelCaller")
    }
}

impl PartialEq for ModelCaller {
    fn eq(&self, other: &ModelCaller) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ModelCaller {}

/// One instance: Triton's name for it and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    /// `CPU`, `GPU` or `MODEL`, as `args["model_instance_kind"]` tells the model.
    pub kind: &'static str,
    pub device: i32,
    /// Its instance group, by index in the config.
    pub group: usize,
}

/// What a Python model's versions start: the interpreter and the instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonSpec {
    pub interpreter: Interpreter,
    pub instances: Vec<Instance>,
    /// What the model's calls to other models go through.
    pub caller: ModelCaller,
    /// The `model.py` of a Python-based backend, which every version runs (`None`: each
    /// version's own).
    pub code: Option<PathBuf>,
    /// Whether the dynamic batcher takes kiln's shortcuts (see
    /// [`crate::repository::config::adaptive_batching_delay`]).
    pub adaptive_batching: bool,
}

impl PythonSpec {
    /// Reads the interpreter and the instance groups, normalised in `config` as Triton shows
    /// them: a config without groups gets one named after the model, an unnamed group is
    /// `<model>_<index>`, counts are 1 by default; instances are `<group>_<n>`. A `KIND_GPU`
    /// group tells its instances their GPU; kiln does not check it (the model's own libraries
    /// use it).
    ///
    /// # Errors
    /// An `EXECUTION_ENV_PATH` that is not an environment, a BF16 tensor (numpy has no
    /// such type).
    pub fn from_config(
        config: &mut ModelConfig,
        dir: &Path,
        caller: &ModelCaller,
        variables: &StubEnvironment,
    ) -> Result<PythonSpec, String> {
        let name = config.name.clone();
        for (tensor, data_type) in config
            .input
            .iter()
            .map(|i| (&i.name, i.data_type))
            .chain(config.output.iter().map(|o| (&o.name, o.data_type)))
        {
            if data_type == crate::proto::inference::DataType::TypeBf16 as i32 {
                return Err(format!(
                    "tensor '{tensor}' of Python model '{name}' is BF16, which numpy cannot hold"
                ));
            }
        }
        let interpreter = interpreter(config, dir, variables)?;
        // As Triton names them: the group a config leaves out is named after the model, unnamed
        // groups `<model>_<index>`; instances `<group>_<n>`.
        if config.instance_group.is_empty() {
            config
                .instance_group
                .push(crate::proto::inference::ModelInstanceGroup {
                    name: name.clone(),
                    ..Default::default()
                });
        }
        let mut instances = Vec::new();
        for (index, group) in config.instance_group.iter_mut().enumerate() {
            if group.name.is_empty() {
                group.name = format!("{name}_{index}");
            }
            if group.count < 1 {
                group.count = 1;
            }
            let (kind, devices) = if group.kind == Kind::Gpu as i32 {
                let gpus = if group.gpus.is_empty() {
                    vec![0]
                } else {
                    group.gpus.clone()
                };
                ("GPU", gpus)
            } else if group.kind == Kind::Model as i32 {
                // The model places itself (vLLM's multi-GPU engines ask for this).
                ("MODEL", vec![0])
            } else {
                group.kind = Kind::Cpu as i32;
                ("CPU", vec![0])
            };
            let mut n = 0;
            for device in devices {
                for _ in 0..group.count {
                    instances.push(Instance {
                        name: format!("{}_{n}", group.name),
                        kind,
                        device,
                        group: index,
                    });
                    n += 1;
                }
            }
        }
        Ok(PythonSpec {
            interpreter,
            instances,
            caller: caller.clone(),
            code: None,
            adaptive_batching: false,
        })
    }
}

/// Completes `config` with the model's `auto_complete_config(auto_complete_model_config)`, as
/// Triton does before loading, when `model_file`'s `TritonPythonModel` has one. Blocking.
///
/// # Errors
/// What the model raised, a config it made that does not parse or renames the model, or why
/// Python did not run.
pub fn auto_complete(
    config: &mut ModelConfig,
    dir: &Path,
    model_file: &Path,
    variables: &StubEnvironment,
) -> Result<(), String> {
    let interpreter = interpreter(config, dir, variables)?;
    let name = config.name.clone();
    let mut stub = Stub::spawn(&interpreter, model_file, &["--auto-complete"])?;
    let current = crate::repository::config::config_to_json(config);
    let answer = stub
        .send(json!({"op": "auto_complete", "config": current}), &[])
        .and_then(|()| stub.answer(&name, "auto-complete", &ModelCaller::default()));
    let status = stub.kill();
    let message = answer.map_err(|e| {
        format!(
            "the Python stub of model '{name}' ended before auto_complete_config answered \
             ({}{status}): its error is in the log above; the stub needs numpy in {interpreter}",
            pipe_error(&e),
        )
    })?;
    match (message.header["op"].as_str(), &message.header["config"]) {
        (Some("config"), Value::Null) => Ok(()),
        (Some("config"), completed) => {
            let completed = crate::repository::config_from_json(&completed.to_string())
                .map_err(|e| {
                    format!("auto_complete_config of model '{name}' made a config kiln cannot read: {e}")
                })?;
            if completed.name != name {
                return Err(format!(
                    "auto_complete_config of model '{name}' renamed it '{}'",
                    completed.name
                ));
            }
            *config = completed;
            Ok(())
        }
        _ => Err(format!(
            "auto_complete_config of model '{name}' failed: {}",
            message.header["message"].as_str().unwrap_or("")
        )),
    }
}

/// The interpreter a model runs under, its stubs seeing `variables`. Blocking: a packed
/// environment is unpacked.
fn interpreter(
    config: &ModelConfig,
    dir: &Path,
    variables: &StubEnvironment,
) -> Result<Interpreter, String> {
    let parameter = config
        .parameters
        .get(environment::EXECUTION_ENV_PATH)
        .map(|p| p.string_value.as_str());
    Ok(Interpreter::find(parameter, dir)?.with_variables(variables.clone()))
}

/// What `python -c` runs: it reads the two modules kiln sends first on the pipe (two
/// little-endian `u64` lengths, then `triton_python_backend_utils.py` and the stub), makes them
/// modules, and runs the stub. Nothing is written to disk, so nothing can be swapped in for it.
const BOOTSTRAP: &str = r#"import os, struct, sys, types
def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit("kiln closed the pipe before the stub arrived")
        data += chunk
    return data
sizes = struct.unpack("<QQ", read(16))
for name, size in zip(("triton_python_backend_utils", "kiln_python_stub"), sizes):
    module = types.ModuleType(name)
    module.__file__ = name + ".py"
    sys.modules[name] = module
    exec(compile(read(size), module.__file__, "exec"), module.__dict__)
sys.modules["kiln_python_stub"].main()
"#;

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

/// Starts a model's stubs.
#[derive(Debug)]
struct Launcher {
    model: String,
    /// A decoupled model's stubs are read by threads of their own (see [`decoupled`]).
    decoupled: bool,
    caller: ModelCaller,
    interpreter: Interpreter,
    model_file: PathBuf,
    /// `initialize`'s arguments, the instance's aside.
    args: serde_json::Map<String, Value>,
}

/// A running stub.
struct Stub {
    child: Child,
    /// Shared with the reader of a decoupled model's stub, which writes its calls' answers.
    input: Arc<Mutex<BufWriter<ChildStdin>>>,
    /// Read here, or by `reader` (a decoupled model's stub, once `initialize` has run).
    output: Option<BufReader<ChildStdout>>,
    reader: Option<decoupled::Reader>,
    /// Where the stub hears that a request was cancelled.
    notices: Arc<cancel::Notices>,
    /// `execute` calls sent so far (the stub counts them too).
    calls: std::cell::Cell<u64>,
    /// The decoupled call the model iterates, which it may cancel.
    streams: Streams,
    /// Its hold on the custom metrics it changes (shared with its reader, if any).
    metrics: Arc<crate::metrics::custom::Owner>,
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

/// The error of a request the model rescheduled without `iterative_sequence`, in Triton's words
/// (Triton 2.51 logs them, and its client waits for ever).
fn cannot_reschedule() -> Error {
    Error::Internal(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not \
         configured to handle such a flag."
            .into(),
    )
}

/// An instance, its stub running or (after a crash) to be started again; the scheduler hands it
/// a batch of requests at a time, each `execute` call on the instance's own thread.
struct Slot {
    instance: Instance,
    stub: Option<Stub>,
    common: Arc<Common>,
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

fn discard(stub: &mut Option<Stub>) -> String {
    stub.take().map(Stub::kill).unwrap_or_default()
}

/// Where a call's responses go.
enum Deliver<'a> {
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
        let config_json = crate::repository::config::config_to_json(config).to_string();
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
        let mut batching =
            crate::repository::config::batching_config(config, spec.adaptive_batching);
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
        let sequences = sequence_batching.is_some();
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
    fn execute(
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

/// `instance`'s stub, started again if it died.
///
/// # Errors
/// INTERNAL when it cannot be started.
fn stub_of<'s>(
    launcher: &Launcher,
    instance: &Instance,
    stub: &'s mut Option<Stub>,
) -> Result<&'s mut Stub, Error> {
    let dead = stub
        .as_ref()
        .and_then(|s| s.reader.as_ref())
        .and_then(decoupled::Reader::dead);
    if let Some(why) = dead {
        let status = stub.take().map(Stub::kill).unwrap_or_default();
        tracing::warn!(
            "Stub process '{}' stopped ({why}{status}); starting it again",
            instance.name
        );
    }
    if let Some(stub) = stub {
        return Ok(stub);
    }
    match launcher.start(instance) {
        Ok(started) => Ok(stub.insert(started)),
        Err(why) => Err(Error::Internal(format!(
            "the Python stub of model instance '{}' could not be restarted: {why}",
            instance.name
        ))),
    }
}

impl Launcher {
    /// Starts a stub for `instance` and runs the model's `initialize`. Blocking.
    fn start(&self, instance: &Instance) -> Result<Stub, String> {
        let mut stub = Stub::spawn(&self.interpreter, &self.model_file, &[])?;
        let mut args = self.args.clone();
        args.insert("model_instance_name".into(), json!(instance.name));
        args.insert("model_instance_kind".into(), json!(instance.kind));
        args.insert(
            "model_instance_device_id".into(),
            json!(instance.device.to_string()),
        );
        let started = stub
            .send(json!({"op": "init", "args": args}), &[])
            .and_then(|()| stub.answer(&self.model, &instance.name, &self.caller));
        match started {
            Ok(message) if message.header["op"] == "ready" => {
                if self.decoupled {
                    stub.read_apart(decoupled::Names {
                        model: self.model.clone(),
                        instance: instance.name.clone(),
                        caller: self.caller.clone(),
                        metrics: Arc::clone(&stub.metrics),
                    });
                }
                Ok(stub)
            }
            Ok(message) => {
                let why = message.header["message"].as_str().unwrap_or("").to_string();
                stub.kill();
                Err(format!(
                    "initialize of model instance '{}' failed: {why}",
                    instance.name
                ))
            }
            Err(e) => {
                let status = stub.kill();
                Err(format!(
                    "the Python stub of model instance '{}' ended before it was ready ({}{status}): \
                     its error is in the log above; the stub needs numpy in {}",
                    instance.name,
                    pipe_error(&e),
                    self.interpreter
                ))
            }
        }
    }
}

/// Makes an error of one kind from its message.
type MakeError = fn(String) -> Error;

/// `pb_utils.TritonError`'s codes with the errors they stand for; any other code (1 is
/// INTERNAL) is an internal error.
const ERROR_CODES: [(i64, MakeError); 5] = [
    (2, Error::NotFound),
    (3, Error::InvalidArgument),
    (4, Error::Unavailable),
    (5, Error::Unsupported),
    (6, Error::AlreadyExists),
];

/// Triton's code for an error a response carries (`pb_utils.TritonError`'s numbering).
fn error_code(error: &Error) -> i64 {
    let kind = std::mem::discriminant(error);
    ERROR_CODES
        .iter()
        .find(|(_, make)| std::mem::discriminant(&make(String::new())) == kind)
        .map_or(1, |(code, _)| *code)
}

/// A response's parameters as the stub sends them (`null`: none); the stub checks their types.
fn response_parameters(parameters: &Value) -> Result<Parameters, String> {
    let Some(parameters) = parameters.as_object() else {
        return match parameters {
            Value::Null => Ok(Parameters::new()),
            _ => Err("response parameters are not an object".into()),
        };
    };
    parameters
        .iter()
        .map(|(key, value)| match ParamValue::from_json(value.clone()) {
            Some(value) => Ok((key.clone(), value)),
            None => Err(format!("response parameter '{key}' is not a scalar")),
        })
        .collect()
}

/// A response (or its error) as a `called` message describes it; its outputs' data is
/// appended to `data`.
fn called_response(response: Result<InferResponse, Error>, data: &mut Vec<Tensor>) -> Value {
    match response {
        Ok(response) => {
            let outputs: Vec<Value> = response.outputs.iter().map(channel::describe).collect();
            data.extend(response.outputs);
            let parameters: serde_json::Map<String, Value> = response
                .parameters
                .iter()
                .map(|(key, value)| (key.clone(), value.to_json()))
                .collect();
            json!({ "outputs": outputs, "parameters": parameters })
        }
        Err(error) => json!({"error": error.message(), "code": error_code(&error)}),
    }
}

/// Runs a model's call to another model, handing `answer` what to write to the stub: one
/// `called` message, or for a decoupled call (`exec(decoupled=True)`) one per response as the
/// called model sends it, then one with `end` (sooner when `cancel` cancels it). `answer` says
/// false when the stub cannot be written to any more: the call is dropped then (the called model
/// hears its client left).
fn call(
    caller: &ModelCaller,
    message: channel::Message,
    cancel: Option<Cancel>,
    answer: &mut dyn FnMut(Value, Vec<Tensor>) -> bool,
) {
    let decoupled = message.header["request"]["decoupled"].as_bool() == Some(true);
    let called = |response: Result<InferResponse, Error>| {
        let mut data = Vec::new();
        let mut header = called_response(response, &mut data);
        header["op"] = json!("called");
        (header, data)
    };
    let trace = message.header["request"]["trace"].as_u64().unwrap_or(0);
    let request = call_request(message)
        .map_err(Error::InvalidArgument)
        .and_then(|mut request| {
            if trace != 0 {
                request.trace = caller.child_trace(trace);
            }
            Ok((caller.calls()?, request))
        });
    let (calls, request) = match request {
        Ok(ready) => ready,
        Err(error) => {
            let (header, data) = called(Err(error));
            if answer(header, data) && decoupled {
                answer(json!({"op": "called", "end": true}), Vec::new());
            }
            return;
        }
    };
    if !decoupled {
        let (header, data) = called((calls.unary)(request));
        answer(header, data);
        return;
    }
    // Kept until the call ends: a call nothing can cancel.
    let (_uncancellable, never) = tokio::sync::oneshot::channel();
    for response in (calls.decoupled)(request, cancel.unwrap_or(never)) {
        let (header, data) = called(response);
        if !answer(header, data) {
            return;
        }
    }
    answer(json!({"op": "called", "end": true}), Vec::new());
}

/// Answers a model's call to another model (or its management request) from a thread of its
/// own, writing the answers to the stub's `input`: the stub's other messages are read meanwhile
/// (a decoupled call's `cancel`, a decoupled model's responses).
fn spawn_call(
    input: &Arc<Mutex<BufWriter<ChildStdin>>>,
    caller: &ModelCaller,
    streams: &Streams,
    message: channel::Message,
) {
    let write = |input: &Mutex<BufWriter<ChildStdin>>, header: Value, tensors: Vec<Tensor>| {
        let blobs: Vec<&[u8]> = tensors.iter().map(|t| t.data.as_ref()).collect();
        let mut input = input.lock().unwrap_or_else(|e| e.into_inner());
        channel::send(&mut *input, header, &blobs).is_ok()
    };
    let request = &message.header["request"];
    let streams_answers = request["decoupled"].as_bool() == Some(true);
    let stream = streams_answers
        .then(|| message.header["stream"].as_u64())
        .flatten();
    let cancel = stream.map(|stream| streams.open(stream));
    let (running, caller, open) = (Arc::clone(input), caller.clone(), streams.clone());
    let spawned = std::thread::Builder::new()
        .name("py-call".into())
        .spawn(move || {
            if message.header["op"] == "manage" {
                write(&running, manage(&caller, &message), Vec::new());
            } else {
                call(&caller, message, cancel, &mut |header, tensors| {
                    write(&running, header, tensors)
                });
            }
            if let Some(stream) = stream {
                open.close(stream);
            }
        });
    if let Err(error) = spawned {
        // The model waits for an answer: it gets one.
        let refusal = json!({
            "op": "called",
            "error": format!("kiln cannot run the call: {error}"),
            "code": 1,
        });
        if write(input, refusal, Vec::new()) && streams_answers {
            write(input, json!({"op": "called", "end": true}), Vec::new());
        }
    }
}

/// Runs a model's management request (a `manage` message): the `managed` header to answer with.
fn manage(caller: &ModelCaller, message: &channel::Message) -> Value {
    let header = &message.header;
    let text = |key: &str| header[key].as_str().unwrap_or_default().to_string();
    let model = text("model");
    let asked = match header["action"].as_str() {
        Some("load") => {
            let mut parameters = std::collections::BTreeMap::new();
            let config = text("config");
            if !config.is_empty() {
                parameters.insert(
                    "config".to_string(),
                    crate::repository::LoadParameter::String(config),
                );
            }
            let names = header["files"].as_array().cloned().unwrap_or_default();
            if names.len() == message.blobs.len() {
                for (name, data) in names.iter().zip(&message.blobs) {
                    let name = name.as_str().unwrap_or_default().to_string();
                    parameters.insert(name, crate::repository::LoadParameter::Bytes(data.clone()));
                }
                Ok(Management::Load { model, parameters })
            } else {
                Err(Error::InvalidArgument(
                    "the load's files and their data do not match".into(),
                ))
            }
        }
        Some("unload") => Ok(Management::Unload {
            model,
            dependents: header["unload_dependents"].as_bool() == Some(true),
        }),
        Some("ready") => Ok(Management::Ready {
            model,
            version: text("version"),
        }),
        other => Err(Error::InvalidArgument(format!(
            "unknown model management action {other:?}"
        ))),
    };
    match asked.and_then(|asked| (caller.calls()?.manage)(asked)) {
        Ok(ready) => json!({"op": "managed", "ready": ready}),
        Err(error) => {
            json!({"op": "managed", "error": error.message(), "code": error_code(&error)})
        }
    }
}

/// The request a stub's `call` message describes.
fn call_request(message: channel::Message) -> Result<InferRequest, String> {
    let header = &message.header["request"];
    let text = |key: &str| header[key].as_str().unwrap_or_default().to_string();
    let described = header["inputs"].as_array().cloned().unwrap_or_default();
    if described.len() != message.blobs.len() {
        return Err("the call's inputs and their data do not match".into());
    }
    let inputs = described
        .iter()
        .zip(message.blobs)
        .map(|(description, data)| channel::tensor(description, data))
        .collect::<Result<Vec<Tensor>, String>>()?;
    let parameters: serde_json::Map<String, Value> =
        serde_json::from_str(&text("parameters")).unwrap_or_default();
    let mut request = InferRequest {
        model_name: text("model"),
        model_version: text("version"),
        id: text("id"),
        inputs,
        ..InferRequest::default()
    };
    for (key, value) in parameters {
        let value = ParamValue::from_json(value)
            .ok_or_else(|| format!("parameter '{key}' must be a bool, a number or a string"))?;
        request.parameters.insert(key, value);
    }
    request.outputs = header["outputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|name| crate::core::RequestedOutput {
            name: name.to_string(),
            ..Default::default()
        })
        .collect();
    Ok(request)
}

/// Applies a model's change to one of its custom metrics (`pb_utils.MetricFamily`); what the
/// registry refuses is logged (the model has been told already when it could know).
fn metric(owner: &crate::metrics::custom::Owner, model: &str, header: &Value) {
    use crate::metrics::custom::{apply, Change, Kind};
    let text = |key: &str| header[key].as_str().unwrap_or_default();
    let kind = match text("kind") {
        "counter" => Kind::Counter,
        "histogram" => Kind::Histogram,
        _ => Kind::Gauge,
    };
    let value = header["value"].as_f64().unwrap_or(f64::NAN);
    let change = match text("action") {
        "increment" => Change::Increment(value),
        "set" => Change::Set(value),
        "observe" => Change::Observe(value),
        "delete" => Change::Delete,
        _ => Change::Create {
            buckets: header["buckets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|bound| bound.as_f64().unwrap_or(f64::NAN))
                .collect(),
        },
    };
    let labels: Vec<(String, String)> = header["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            (key.clone(), value)
        })
        .collect();
    if let Err(why) = apply(
        owner,
        text("name"),
        text("description"),
        kind,
        &labels,
        &change,
    ) {
        tracing::warn!(model, "custom metric not changed: {why}");
    }
}

/// What went wrong on a stub's pipe, for messages: a closed pipe said as such.
fn pipe_error(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::BrokenPipe => {
            "its pipe closed".to_string()
        }
        _ => error.to_string(),
    }
}

/// A protocol error: the stub said something kiln cannot read.
fn broken(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

/// What one `execute` call runs with.
struct Call<'a> {
    /// What a request that names no outputs asks for.
    all_outputs: &'a [String],
    model: &'a str,
    instance: &'a str,
    caller: &'a ModelCaller,
}

impl Call<'_> {
    /// The error an exception in `execute` fails its requests with, in Triton's words.
    fn failed(&self, message: &channel::Message) -> Error {
        execute_failed(self.instance, message)
    }

    /// A response's outputs (their data taken from `data`) and parameters, or its error; `Err`
    /// when the message does not hold together.
    fn outputs(
        &self,
        request: &Request,
        response: &Value,
        data: &mut impl Iterator<Item = bytes::Bytes>,
    ) -> std::io::Result<Result<Outputs, Error>> {
        read_outputs(self.model, &request.outputs, response, data)
    }
}

/// The error an exception in `execute` (an `error` message) fails its requests with, in
/// Triton's words.
fn execute_failed(instance: &str, message: &channel::Message) -> Error {
    let why = message.header["message"].as_str().unwrap_or("");
    Error::Internal(format!(
        "Failed to process the request(s) for model '{instance}', message: {why}"
    ))
}

/// A response of `model` to a request asking for outputs `asked` (empty: all): its outputs
/// (their data taken from `data`) and parameters, or its error; `Err` when the message does
/// not hold together.
fn read_outputs(
    model: &str,
    asked: &[String],
    response: &Value,
    data: &mut impl Iterator<Item = bytes::Bytes>,
) -> std::io::Result<Result<Outputs, Error>> {
    if let Some(why) = response["error"].as_str() {
        let code = response["code"].as_i64().unwrap_or(1);
        return Ok(Ok(Outputs {
            refused: Some(model_error(why.to_string(), code)),
            ..Outputs::default()
        }));
    }
    let described = response["outputs"]
        .as_array()
        .ok_or_else(|| broken("a response without outputs".into()))?;
    let mut outputs = Vec::with_capacity(described.len());
    let mut bad = None;
    for description in described {
        let blob = data
            .next()
            .ok_or_else(|| broken("outputs and their data do not match".into()))?;
        match channel::tensor(description, blob) {
            Ok(tensor) => outputs.push(tensor),
            Err(why) => bad = bad.or(Some(why)),
        }
    }
    let missing = asked
        .iter()
        .find(|name| !outputs.iter().any(|o| &o.name == *name));
    let parameters = response_parameters(&response["parameters"])
        .map_err(|why| broken(format!("model '{model}': {why}")))?;
    Ok(match (bad, missing) {
        (Some(why), _) => Err(Error::Internal(format!("model '{model}': {why}"))),
        (None, Some(missing)) => Err(Error::Internal(format!(
            "model '{model}' did not return the requested output '{missing}'"
        ))),
        (None, None) => Ok(Outputs {
            tensors: outputs,
            parameters,
            ..Outputs::default()
        }),
    })
}

/// A stub's `log` message, in kiln's log.
fn log_line(model: &str, instance: &str, header: &Value) {
    let text = header["message"].as_str().unwrap_or("");
    match header["level"].as_i64() {
        Some(1) => tracing::warn!(model, instance, "{text}"),
        Some(2) => tracing::error!(model, instance, "{text}"),
        Some(3) => tracing::debug!(model, instance, "{text}"),
        _ => tracing::info!(model, instance, "{text}"),
    }
}

/// Request parameters the server acts on, which a model does not see among its request's
/// `parameters()` (Triton takes them out): the sequence's (the model has `correlation_id()` and
/// `flags()`), the schedule policy's (`timeout()`), the empty final response's.
const SERVER_PARAMETERS: [&str; 6] = [
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "triton_enable_empty_final_response",
];

/// The parameters as the JSON object `request.parameters()` gives.
fn parameters_json(parameters: &Parameters) -> String {
    let map: serde_json::Map<String, Value> = parameters
        .iter()
        .filter(|(key, _)| !SERVER_PARAMETERS.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.to_json()))
        .collect();
    Value::Object(map).to_string()
}

/// The error a response's `TritonError` fails its request with.
fn model_error(message: String, code: i64) -> Error {
    match ERROR_CODES.iter().find(|(known, _)| *known == code) {
        Some((_, make)) => make(message),
        None => Error::Internal(message),
    }
}

impl Stub {
    /// Starts the stub for `model_file` under `interpreter`, with `options` after the model
    /// file, and sends it its code.
    fn spawn(
        interpreter: &Interpreter,
        model_file: &Path,
        options: &[&str],
    ) -> Result<Stub, String> {
        let mut command = interpreter.command();
        command
            .arg("-c")
            .arg(BOOTSTRAP)
            .arg(model_file)
            .args(options)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let (notices, stub_end) = cancel::Notices::attach(&mut command)
            .map_err(|e| format!("cannot make a pipe for a Python stub: {e}"))?;
        let spawned = command.spawn();
        drop(stub_end);
        let mut child = spawned.map_err(|e| format!("cannot start Python ({interpreter}): {e}"))?;
        let input = child.stdin.take().expect("piped");
        let output = child.stdout.take().expect("piped");
        let stub = Stub {
            child,
            input: Arc::new(Mutex::new(BufWriter::new(input))),
            output: Some(BufReader::new(output)),
            reader: None,
            notices: Arc::new(notices),
            calls: std::cell::Cell::new(0),
            streams: Streams::default(),
            metrics: Arc::default(),
        };
        let mut code = Vec::with_capacity(16 + UTILS.len() + STUB.len());
        code.extend_from_slice(&(UTILS.len() as u64).to_le_bytes());
        code.extend_from_slice(&(STUB.len() as u64).to_le_bytes());
        code.extend_from_slice(UTILS.as_bytes());
        code.extend_from_slice(STUB.as_bytes());
        // A Python that is not one ends at once: the code finds a closed pipe, and the first
        // answer says why.
        {
            let mut input = stub.writer();
            let _ = input.write_all(&code).and_then(|()| input.flush());
        }
        Ok(stub)
    }

    /// The stub's input, for one message.
    fn writer(&self) -> std::sync::MutexGuard<'_, BufWriter<ChildStdin>> {
        self.input.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one message to the stub.
    fn send(&self, header: Value, blobs: &[&[u8]]) -> std::io::Result<()> {
        channel::send(&mut *self.writer(), header, blobs)
    }

    /// The next answer of the stub, its log lines passed on and its calls to other models run
    /// meanwhile (a stub whose answers a reader thread takes has none here).
    fn answer(
        &mut self,
        model: &str,
        instance: &str,
        caller: &ModelCaller,
    ) -> std::io::Result<channel::Message> {
        loop {
            let output = self
                .output
                .as_mut()
                .ok_or_else(|| broken("the stub's answers go to its reader".into()))?;
            let message = channel::receive(output)?;
            match message.header["op"].as_str() {
                // Answered while this reads on, so that the model can cancel it.
                Some("call") if message.header["request"]["decoupled"] == true => {
                    spawn_call(&self.input, caller, &self.streams, message);
                }
                Some("cancel") => self.streams.cancel(&message.header),
                Some("call") => {
                    let mut broken = None;
                    call(caller, message, None, &mut |header, tensors| {
                        let blobs: Vec<&[u8]> = tensors.iter().map(|t| t.data.as_ref()).collect();
                        let sent = self.send(header, &blobs);
                        sent.map_err(|error| broken = Some(error)).is_ok()
                    });
                    if let Some(error) = broken {
                        return Err(error);
                    }
                }
                Some("manage") => self.send(manage(caller, &message), &[])?,
                Some("metric") => metric(&self.metrics, model, &message.header),
                Some("log") => log_line(model, instance, &message.header),
                _ => return Ok(message),
            }
        }
    }

    /// Hands the stub's answers to a reader thread from now on (a decoupled model's, once its
    /// `initialize` has run).
    fn read_apart(&mut self, names: decoupled::Names) {
        if let Some(output) = self.output.take() {
            self.reader = Some(decoupled::Reader::start(
                output,
                Arc::clone(&self.input),
                names,
            ));
        }
    }

    /// Sends `requests` to the model's `execute`.
    fn send_requests(&self, requests: &[&Request], call: &Call<'_>) -> std::io::Result<()> {
        let described: Vec<Value> = requests
            .iter()
            .map(|request| {
                let asked = if request.outputs.is_empty() {
                    call.all_outputs
                } else {
                    &request.outputs
                };
                let (correlation_id, flags) = request
                    .sequence
                    .as_ref()
                    .map_or((json!(0), 0), |s| (s.correlation_id.clone(), s.flags));
                json!({
                    "id": request.id,
                    "parameters": parameters_json(&request.parameters),
                    "outputs": asked,
                    "inputs": request.listed_inputs().map(channel::describe).collect::<Vec<_>>(),
                    "correlation_id": correlation_id,
                    "flags": flags,
                    // For `request.timeout()`, in microseconds (0: none).
                    "timeout": request.parameters.get("timeout").and_then(ParamValue::as_unsigned).unwrap_or(0),
                    "trace": call.caller.traced(request.trace.as_ref()),
                    // OpenTelemetry mode: the W3C context of the request's span.
                    "trace_context": request.trace.as_ref().and_then(|trace| trace.context()),
                })
            })
            .collect();
        let blobs: Vec<&[u8]> = requests
            .iter()
            .flat_map(|request| request.listed_inputs().map(|t| t.data.as_ref()))
            .collect();
        self.calls.set(self.calls.get() + 1);
        self.send(json!({"op": "execute", "requests": described}), &blobs)
    }

    /// Runs `requests` in one `execute` call: `Err` when the stub is gone or broke the
    /// protocol, else the model's answer to each request.
    fn execute(
        &mut self,
        requests: &[&Request],
        call: &Call<'_>,
    ) -> std::io::Result<Vec<Result<Outputs, Error>>> {
        self.send_requests(requests, call)?;
        let message = self.answer(call.model, call.instance, call.caller)?;
        match message.header["op"].as_str() {
            Some("responses") => {}
            Some("error") => return Ok(vec![Err(call.failed(&message)); requests.len()]),
            other => return Err(broken(format!("unexpected answer {other:?}"))),
        }
        let responses = message.header["responses"]
            .as_array()
            .filter(|r| r.len() == requests.len())
            .ok_or_else(|| broken("not one response per request".into()))?;
        let mut data = message.blobs.into_iter();
        let mut answers = Vec::with_capacity(requests.len());
        for (request, response) in requests.iter().zip(responses) {
            if response["rescheduled"] == true {
                answers.push(Ok(Outputs {
                    rescheduled: true,
                    ..Outputs::default()
                }));
                continue;
            }
            answers.push(call.outputs(request, response, &mut data)?);
        }
        if data.next().is_some() {
            return Err(broken("outputs and their data do not match".into()));
        }
        Ok(answers)
    }

    /// Asks the model to `finalize`, then ends the process (killed when it takes too long).
    fn finalize(mut self) {
        // The stub answers `done` (which a reader just notes) and ends when its threads do.
        let sent = self.send(json!({"op": "finalize"}), &[]);
        let deadline = Instant::now() + FINALIZE_TIMEOUT;
        while sent.is_ok() && Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => break,
            }
        }
        self.kill();
    }

    /// Ends the process; what it exited with, for messages.
    fn kill(mut self) -> String {
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => format!("; the process {status}"),
            Err(_) => String::new(),
        }
    }
}

impl Drop for Stub {
    /// A stub dropped without `finalize` (its version gone while it ran) is ended and reaped,
    /// not left a zombie; after `finalize` or `kill` this finds it reaped already.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests;
