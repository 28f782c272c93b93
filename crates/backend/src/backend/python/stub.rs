//! A stub process and its pipe ([`Stub`]): started with its code sent over its standard input,
//! through `initialize` ([`Launcher`]), asked to `execute` batches of requests and to `finalize`,
//! ended and reaped.

use super::calls::{call, manage, spawn_call, Streams};
use super::environment::Interpreter;
use super::logs::{log_line, metric};
use super::messages::{broken, execute_failed, parameters_json, pipe_error, read_outputs};
use super::{cancel, channel, decoupled, Instance, ModelCaller, Outputs, Request};
use crate::core::{Error, ParamValue};
use serde_json::{json, Value};
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long `finalize` may take when a model unloads before its process is killed.
pub(super) const FINALIZE_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const STUB: &str = include_str!("stub.py");
pub(super) const UTILS: &str = include_str!("triton_python_backend_utils.py");

/// What `python -c` runs: it reads the two modules kiln sends first on the pipe (two
/// little-endian `u64` lengths, then `triton_python_backend_utils.py` and the stub), makes them
/// modules, and runs the stub. Nothing is written to disk, so nothing can be swapped in for it.
pub(super) const BOOTSTRAP: &str = r#"import os, struct, sys, types
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

/// Starts a model's stubs.
#[derive(Debug)]
pub(super) struct Launcher {
    pub(super) model: String,
    /// A decoupled model's stubs are read by threads of their own (see [`decoupled`]).
    pub(super) decoupled: bool,
    pub(super) caller: ModelCaller,
    pub(super) interpreter: Interpreter,
    pub(super) model_file: PathBuf,
    /// `initialize`'s arguments, the instance's aside.
    pub(super) args: serde_json::Map<String, Value>,
}

/// A running stub.
pub(super) struct Stub {
    pub(super) child: Child,
    /// Shared with the reader of a decoupled model's stub, which writes its calls' answers.
    pub(super) input: Arc<Mutex<BufWriter<ChildStdin>>>,
    /// Read here, or by `reader` (a decoupled model's stub, once `initialize` has run).
    pub(super) output: Option<BufReader<ChildStdout>>,
    pub(super) reader: Option<decoupled::Reader>,
    /// Where the stub hears that a request was cancelled.
    pub(super) notices: Arc<cancel::Notices>,
    /// `execute` calls sent so far (the stub counts them too).
    pub(super) calls: std::cell::Cell<u64>,
    /// The decoupled call the model iterates, which it may cancel.
    pub(super) streams: Streams,
    /// Its hold on the custom metrics it changes (shared with its reader, if any).
    pub(super) metrics: Arc<crate::metrics::custom::Owner>,
}

pub(super) fn discard(stub: &mut Option<Stub>) -> String {
    stub.take().map(Stub::kill).unwrap_or_default()
}

/// `instance`'s stub, started again if it died.
///
/// # Errors
/// INTERNAL when it cannot be started.
pub(super) fn stub_of<'s>(
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
    pub(super) fn start(&self, instance: &Instance) -> Result<Stub, String> {
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

/// What one `execute` call runs with.
pub(super) struct Call<'a> {
    /// What a request that names no outputs asks for.
    pub(super) all_outputs: &'a [String],
    pub(super) model: &'a str,
    pub(super) instance: &'a str,
    pub(super) caller: &'a ModelCaller,
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

impl Stub {
    /// Starts the stub for `model_file` under `interpreter`, with `options` after the model
    /// file, and sends it its code.
    pub(super) fn spawn(
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
    pub(super) fn send(&self, header: Value, blobs: &[&[u8]]) -> std::io::Result<()> {
        channel::send(&mut *self.writer(), header, blobs)
    }

    /// The next answer of the stub, its log lines passed on and its calls to other models run
    /// meanwhile (a stub whose answers a reader thread takes has none here).
    pub(super) fn answer(
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
    pub(super) fn send_requests(
        &self,
        requests: &[&Request],
        call: &Call<'_>,
    ) -> std::io::Result<()> {
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
    pub(super) fn execute(
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
    pub(super) fn finalize(mut self) {
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
    pub(super) fn kill(mut self) -> String {
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
