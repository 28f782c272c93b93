//! Decoupled Python models as Triton runs them: an instance takes its next `execute` call as
//! soon as the one before has returned, while the model still answers earlier requests from its
//! own threads (a vLLM-style model keeps every request in its engine at once). So the stub's
//! answers are read by a thread of their own, which hands each response to its request wherever
//! it waits, tells the calling thread when `execute` has returned, answers the model's calls to
//! other models, and fails every open request if the stub dies.

use super::calls::{spawn_call, ModelCaller, Streams};
use super::cancel::Watch;
use super::{
    channel,
    logs::{log_line, metric},
    messages::{execute_failed, pipe_error, read_outputs},
    Outputs, Streamed,
};
use crate::core::Error;
use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::process::{ChildStdin, ChildStdout};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tokio::sync::mpsc::UnboundedSender;

/// A request whose last response has not come yet.
pub(super) struct Open {
    /// The outputs it asks for (empty: all).
    pub asked: Vec<String>,
    pub sender: UnboundedSender<Streamed>,
    /// Tells the model if its client goes away; ends with the last response (dropped with this).
    pub watch: Watch,
}

impl Open {
    /// Whether its client has gone and the model has been told: nothing waits for the rest of
    /// its responses (which a model that stops on `is_cancelled()` may never send).
    fn abandoned(&self) -> bool {
        self.sender.is_closed() && self.watch.settled()
    }
}

/// What the reader thread knows, shared with the threads that run calls.
#[derive(Default)]
struct State {
    /// Open requests by (call number, index in the call).
    open: HashMap<(u64, usize), Open>,
    /// The last call whose `execute` returned (or raised).
    returned: u64,
    /// The requests each returned call rescheduled (by index), until the call's thread asks.
    rescheduled: HashMap<u64, Vec<usize>>,
    /// Why the stub stopped answering.
    dead: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The thread reading a decoupled model's stub, and what it shares. The thread is not joined: it
/// ends when the stub's pipe closes, which a process the model forked (holding the pipe) may
/// delay past the stub's own end.
pub(super) struct Reader {
    shared: Arc<Shared>,
}

/// Who the reader reads for (names for messages, and where calls to other models go).
pub(super) struct Names {
    pub model: String,
    pub instance: String,
    pub caller: ModelCaller,
    /// The stub's hold on its custom metrics, let go when its pipe closes.
    pub metrics: Arc<crate::metrics::custom::Owner>,
}

impl Reader {
    /// Starts reading `output`; answers to the model's calls are written to `input`.
    pub fn start(
        output: BufReader<ChildStdout>,
        input: Arc<Mutex<BufWriter<ChildStdin>>>,
        names: Names,
    ) -> Reader {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let reading = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(format!("py-{}", names.instance))
            .spawn(move || read(output, &input, &names, &reading));
        if spawned.is_err() {
            shared.lock().dead = Some("its reader thread could not start".into());
        }
        Reader { shared }
    }

    /// Registers request `index` of call `call` before the call is sent; requests whose
    /// clients have gone are forgotten (what the model still sends for them is dropped).
    pub fn open(&self, call: u64, index: usize, open: Open) {
        let mut state = self.shared.lock();
        state.open.retain(|_, open| !open.abandoned());
        state.open.insert((call, index), open);
    }

    /// Waits until call `call`'s `execute` has returned; the requests it rescheduled, by
    /// index.
    ///
    /// # Errors
    /// Why the stub stopped answering first (its open requests have been failed).
    pub fn returned(&self, call: u64) -> Result<Vec<usize>, String> {
        let mut state = self.shared.lock();
        loop {
            if let Some(why) = &state.dead {
                return Err(why.clone());
            }
            if state.returned >= call {
                return Ok(state.rescheduled.remove(&call).unwrap_or_default());
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Why the stub stopped answering, if it did.
    pub fn dead(&self) -> Option<String> {
        self.shared.lock().dead.clone()
    }
}

/// The reader thread: every message of the stub until its pipe closes.
fn read(
    mut output: BufReader<ChildStdout>,
    input: &Arc<Mutex<BufWriter<ChildStdin>>>,
    names: &Names,
    shared: &Shared,
) {
    let streams = Streams::default();
    let why = loop {
        let message = match channel::receive(&mut output) {
            Ok(message) => message,
            Err(error) => break pipe_error(&error),
        };
        let header = &message.header;
        match header["op"].as_str() {
            Some("call" | "manage") => spawn_call(input, &names.caller, &streams, message),
            Some("cancel") => streams.cancel(header),
            Some("metric") => metric(&names.metrics, &names.model, header),
            Some("log") => log_line(&names.model, &names.instance, header),
            Some("response") => {
                if let Err(why) = respond(shared, &names.model, message) {
                    break why;
                }
            }
            Some("executed") => {
                let call = header["call"].as_u64().unwrap_or(0);
                let mut state = shared.lock();
                // A rescheduled request's responses go on in a later call, under that call.
                let rescheduled: Vec<usize> = header["rescheduled"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|index| usize::try_from(index.as_u64()?).ok())
                    .filter(|&index| state.open.remove(&(call, index)).is_some())
                    .collect();
                if !rescheduled.is_empty() {
                    state.rescheduled.insert(call, rescheduled);
                }
                state.returned = state.returned.max(call);
                shared.changed.notify_all();
            }
            Some("error") => {
                // `execute` raised: the call's requests still open end with its error.
                let call = header["call"].as_u64().unwrap_or(0);
                let error = execute_failed(&names.instance, &message);
                let mut state = shared.lock();
                let failed: Vec<(u64, usize)> = state
                    .open
                    .keys()
                    .filter(|key| key.0 == call)
                    .copied()
                    .collect();
                for key in failed {
                    if let Some(open) = state.open.remove(&key) {
                        let _ = open.sender.send(Streamed {
                            outputs: Err(error.clone()),
                            last: true,
                        });
                    }
                }
                state.returned = state.returned.max(call);
                shared.changed.notify_all();
            }
            // `finalize` ran; the process ends next.
            Some("done") => {}
            other => tracing::warn!(
                model = names.model,
                instance = names.instance,
                "ignoring an unexpected message from the Python stub: {other:?}"
            ),
        }
    };
    // The stub is gone (or broke the protocol): every request still open ends with why.
    let message = format!(
        "Stub process '{}' is not healthy ({why}); it restarts for the next request",
        names.instance
    );
    let mut state = shared.lock();
    for (_, open) in state.open.drain() {
        let _ = open.sender.send(Streamed {
            outputs: Err(Error::Internal(message.clone())),
            last: true,
        });
    }
    state.dead = Some(why);
    shared.changed.notify_all();
}

/// Hands one response to its request; `Err` when the message does not hold together.
fn respond(shared: &Shared, model: &str, message: channel::Message) -> Result<(), String> {
    let header = &message.header;
    let key = (
        header["call"].as_u64().unwrap_or(0),
        header["request"]
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .unwrap_or(usize::MAX),
    );
    let last = header["final"].as_bool().unwrap_or(false);
    let mut state = shared.lock();
    let Some(open) = state.open.get(&key) else {
        // The stub refuses a response after the last, so this is a request failed already
        // (its call raised): nothing waits for it.
        return Ok(());
    };
    let outputs = if header["outputs"].is_null() && header["error"].is_null() {
        Ok(None)
    } else {
        let mut data = message.blobs.into_iter();
        // A decoupled model's error response fails its request as any error does.
        read_outputs(model, &open.asked, header, &mut data)
            .map_err(|e| e.to_string())?
            .and_then(Outputs::answered)
            .map(Some)
    };
    // A client that went away does not stop the others.
    let _ = open.sender.send(Streamed { outputs, last });
    if last {
        state.open.remove(&key);
    }
    Ok(())
}
