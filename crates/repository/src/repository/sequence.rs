//! Triton's sequence batcher for stateful models (`sequence_batching`): requests carry a
//! correlation ID (`sequence_id`) and the `sequence_start` / `sequence_end` flags; the server feeds
//! the model its control inputs (START, END, READY, CORRID) and its implicit state: each `state`
//! entry's output of one request is the same entry's input on the next request of the sequence,
//! zeros on the first. A sequence's requests run one at a time, in order; a sequence idle longer
//! than `max_sequence_idle_microseconds` (default 1 s) is dropped.

use crate::backend::TensorInfo;
use crate::core::{DataType, Error, InferRequest, ParamValue, Tensor};
use crate::invalid_arg;
use crate::proto::inference::model_config::SchedulingChoice;
use crate::proto::inference::model_sequence_batching::{control::Kind, Control, StrategyChoice};
use crate::proto::inference::ModelConfig;
use crate::repository::config::datatype_from_config;
use bytes::Bytes;
use slots::Seats;
use states::{state_spec, State};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Triton's default idle time of a sequence.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// Live sequences a version holds at most; a new one beyond is refused.
const MAX_SEQUENCES: usize = 65_536;

/// Longest string correlation ID, in bytes: a live sequence keeps its ID (up to
/// [`MAX_SEQUENCES`] of them), so its length is bounded as the count is.
pub const MAX_CORRELATION_ID_BYTES: usize = 1024;

/// A control input the server fills.
#[derive(Debug, Clone, PartialEq)]
struct ControlInput {
    name: String,
    kind: ControlKind,
    datatype: DataType,
}

#[derive(Debug, Clone, PartialEq)]
enum ControlKind {
    /// START, END, READY: the (false, true) values, raw.
    Flag(Flag, [Bytes; 2]),
    CorrId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    Start,
    End,
    Ready,
}

/// A model's sequence batching, as its config declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceSpec {
    idle: Duration,
    controls: Vec<ControlInput>,
    states: Vec<State>,
    /// Whether the model batches (its tensors then have a leading batch dimension of 1).
    batched: bool,
    /// Whether string correlation IDs fit: no CORRID control, or a STRING one.
    text_ids: bool,
    /// `iterative_sequence`: a request may come without a sequence (it is one of its own, which
    /// the model reschedules until it is done).
    iterative: bool,
    /// Sequence slots per instance, as Triton's sequence batcher has them: `max_batch_size`
    /// (at least 1), or the oldest strategy's `max_candidate_sequences` when it sets one.
    seats: usize,
}

impl SequenceSpec {
    /// The config's sequence batching, if it has one.
    ///
    /// # Errors
    /// A message naming what kiln cannot feed: a control without exactly one kind and value pair,
    /// a CORRID type other than an integer or STRING, a state with a variable dimension, larger
    /// than 64 MiB, or whose initial state file (in `<model>/initial_state/`) does not fit.
    pub fn from_config(
        config: &ModelConfig,
        model_dir: &Path,
    ) -> Result<Option<SequenceSpec>, String> {
        let Some(SchedulingChoice::SequenceBatching(batching)) = &config.scheduling_choice else {
            return Ok(None);
        };
        let model = &config.name;
        let mut controls = Vec::new();
        for input in &batching.control_input {
            let [control] = input.control.as_slice() else {
                return Err(format!(
                    "sequence batching of model '{model}': control input '{}' must have exactly one control",
                    input.name
                ));
            };
            controls.push(control_input(model, &input.name, control)?);
        }
        // In the order Triton's sequence batcher adds them to a request, whatever the config's:
        // START, END, READY, then CORRID (a Python model lists its inputs in an order that
        // follows it).
        controls.sort_by_key(|control| match control.kind {
            ControlKind::Flag(Flag::Start, _) => 0,
            ControlKind::Flag(Flag::End, _) => 1,
            ControlKind::Flag(Flag::Ready, _) => 2,
            ControlKind::CorrId => 3,
        });
        let states = batching
            .state
            .iter()
            .map(|state| state_spec(model, model_dir, state))
            .collect::<Result<Vec<_>, _>>()?;
        let idle = match batching.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };
        let text_ids = !controls
            .iter()
            .any(|c| c.kind == ControlKind::CorrId && c.datatype != DataType::Bytes);
        let seats = match &batching.strategy_choice {
            Some(StrategyChoice::Oldest(oldest)) if oldest.max_candidate_sequences > 0 => {
                oldest.max_candidate_sequences as usize
            }
            _ => config.max_batch_size.max(1) as usize,
        };
        Ok(Some(SequenceSpec {
            text_ids,
            seats,
            iterative: batching.iterative_sequence,
            idle,
            controls,
            states,
            batched: config.max_batch_size > 0,
        }))
    }

    /// Whether the server fills this graph input (a control or a state).
    pub fn fills(&self, input: &str) -> bool {
        self.controls.iter().any(|c| c.name == input)
            || self.states.iter().any(|s| s.input == input)
    }

    /// Checks that the graph has every input the server fills, of the declared type, and every
    /// state output.
    ///
    /// # Errors
    /// A message naming the first tensor missing or of another type.
    pub fn check_graph(
        &self,
        model: &str,
        inputs: &[TensorInfo],
        outputs: &[TensorInfo],
    ) -> Result<(), String> {
        let filled = self
            .controls
            .iter()
            .map(|c| (c.name.as_str(), c.datatype))
            .chain(self.states.iter().map(|s| (s.input.as_str(), s.datatype)));
        let wanted = self.states.iter().map(|s| (s.output.as_str(), s.datatype));
        for (kind, list, mut expected) in [
            ("input", inputs, filled.collect::<Vec<_>>()),
            ("output", outputs, wanted.collect::<Vec<_>>()),
        ] {
            for (name, datatype) in expected.drain(..) {
                let found = list.iter().find(|t| t.name == name).ok_or_else(|| {
                    format!(
                        "sequence batching of model '{model}': the model has no {kind} '{name}'"
                    )
                })?;
                if found.datatype != Some(datatype) {
                    return Err(format!(
                        "sequence batching of model '{model}': {kind} '{name}' is declared {datatype} \
                         but the model's is {}",
                        found.datatype.map_or("an unsupported type", DataType::as_wire)
                    ));
                }
            }
        }
        Ok(())
    }
}

fn control_input(model: &str, name: &str, control: &Control) -> Result<ControlInput, String> {
    let pair = |values: Vec<Bytes>| -> Result<[Bytes; 2], String> {
        <[Bytes; 2]>::try_from(values).map_err(|_| {
            format!("sequence batching of model '{model}': control '{name}' needs a false and a true value")
        })
    };
    let flag = match Kind::try_from(control.kind) {
        Ok(Kind::ControlSequenceStart) => Flag::Start,
        Ok(Kind::ControlSequenceEnd) => Flag::End,
        Ok(Kind::ControlSequenceReady) => Flag::Ready,
        Ok(Kind::ControlSequenceCorrid) => {
            let datatype = datatype_from_config(control.data_type)
                .filter(|t| {
                    matches!(
                        t,
                        DataType::Uint64
                            | DataType::Int64
                            | DataType::Uint32
                            | DataType::Int32
                            | DataType::Bytes
                    )
                })
                .ok_or_else(|| {
                    format!(
                        "sequence batching of model '{model}': CORRID control '{name}' must be \
                         TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
                    )
                })?;
            return Ok(ControlInput {
                name: name.to_string(),
                kind: ControlKind::CorrId,
                datatype,
            });
        }
        Err(_) => {
            return Err(format!(
                "sequence batching of model '{model}': control '{name}' has an unknown kind"
            ))
        }
    };
    let (datatype, values) = if !control.int32_false_true.is_empty() {
        let values = control
            .int32_false_true
            .iter()
            .map(|v| Bytes::copy_from_slice(&v.to_le_bytes()));
        (DataType::Int32, pair(values.collect())?)
    } else if !control.fp32_false_true.is_empty() {
        let values = control
            .fp32_false_true
            .iter()
            .map(|v| Bytes::copy_from_slice(&v.to_le_bytes()));
        (DataType::Fp32, pair(values.collect())?)
    } else if !control.bool_false_true.is_empty() {
        let values = control
            .bool_false_true
            .iter()
            .map(|&v| Bytes::copy_from_slice(&[u8::from(v)]));
        (DataType::Bool, pair(values.collect())?)
    } else {
        return Err(format!(
            "sequence batching of model '{model}': control '{name}' needs int32_false_true, \
             fp32_false_true or bool_false_true"
        ));
    };
    Ok(ControlInput {
        name: name.to_string(),
        kind: ControlKind::Flag(flag, values),
        datatype,
    })
}

/// A sequence's correlation ID, as the request gave it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrId {
    Number(u64),
    Text(String),
}

impl std::fmt::Display for CorrId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorrId::Number(n) => write!(f, "{n}"),
            CorrId::Text(s) => write!(f, "'{s}'"),
        }
    }
}

/// What a request says about its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFlags {
    pub id: CorrId,
    pub start: bool,
    pub end: bool,
    /// A sequence of its own (an `iterative_sequence` model's request without a `sequence_id`):
    /// it ends with this request, though the model is told only START, as Triton tells it.
    pub alone: bool,
}

impl SequenceFlags {
    /// The `sequence_id`, `sequence_start` and `sequence_end` parameters of a request to `model`.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, in Triton's words, without a usable correlation ID.
    pub fn of(request: &InferRequest, model: &str) -> Result<SequenceFlags, Error> {
        let flag = |key: &str| matches!(request.parameters.get(key), Some(ParamValue::Bool(true)));
        let id = match request.parameters.get("sequence_id") {
            Some(ParamValue::Uint64(n)) if *n != 0 => CorrId::Number(*n),
            Some(ParamValue::Int64(n)) if *n > 0 => CorrId::Number(*n as u64),
            Some(ParamValue::String(s)) if s.len() > MAX_CORRELATION_ID_BYTES => {
                return Err(invalid_arg!(
                    "inference request to model '{model}' has a correlation ID of {} bytes, \
                     longer than the {MAX_CORRELATION_ID_BYTES} kiln keeps",
                    s.len()
                ))
            }
            Some(ParamValue::String(s)) if !s.is_empty() => CorrId::Text(s.clone()),
            _ => {
                return Err(invalid_arg!(
                    "inference request to model '{model}' must specify a non-zero or non-empty \
                     correlation ID"
                ))
            }
        };
        Ok(SequenceFlags {
            id,
            start: flag("sequence_start"),
            end: flag("sequence_end"),
            alone: false,
        })
    }
}

/// The sequences of one version in progress.
#[derive(Debug)]
pub struct Sequences {
    spec: SequenceSpec,
    live: Mutex<Table>,
    /// The last correlation ID given to an iterative sequence a request began on its own.
    given: std::sync::atomic::AtomicU64,
}

/// Where the correlation IDs kiln gives iterative sequences start: far from the small numbers
/// clients pick.
const GIVEN_IDS: u64 = 1 << 62;

#[derive(Debug)]
struct Table {
    sequences: HashMap<CorrId, Live>,
    /// The free sequence slots of the instances: a new sequence takes one as Triton's batcher
    /// gives it ([`slots`]).
    seats: Seats,
    /// Live sequences per slot (a stateful Python model's instance, which keeps the sequence's
    /// state): when every sequence slot is taken (Triton would make a new sequence wait), a new
    /// one goes to the instance with the fewest.
    per_slot: Vec<usize>,
    /// When idle sequences were last looked for: at most every tenth of the idle time, so that
    /// many live sequences do not make every request scan them all.
    swept: Instant,
}

#[derive(Debug)]
struct Live {
    states: Arc<tokio::sync::Mutex<Vec<Tensor>>>,
    last_used: Instant,
    slot: usize,
    /// Its sequence slot on that instance, if it got one.
    seat: Option<usize>,
    /// What the sequence's last request to take its place releases when its turn ends (or it
    /// gives its place up): the next request's go-ahead.
    line: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// A request's place in its sequence, taken when it arrived: its turn comes when the requests
/// of the sequence before it have had theirs ([`Place::turn`]).
pub struct Place {
    flags: SequenceFlags,
    states: Arc<tokio::sync::Mutex<Vec<Tensor>>>,
    /// A START's states: the sequence begins again from them.
    initial: Option<Vec<Tensor>>,
    slot: usize,
    /// Released by the request before, when its turn ends (`None`: none before it, or it has
    /// been released).
    after: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Released (dropped) when this request's turn ends, or, when it gives its place up, once
    /// the request before it is done.
    before: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A request's turn in its sequence: the states it runs with, held until it has stored the next.
/// The sequence's next request has its turn once this one is finished or dropped.
pub struct Turn {
    flags: SequenceFlags,
    states: tokio::sync::OwnedMutexGuard<Vec<Tensor>>,
    slot: usize,
    /// Dropped after `states` (fields drop in order): the next request's go-ahead.
    _before: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Place {
    /// Waits for the sequence's requests before this one, then for the states.
    pub async fn turn(mut self) -> Turn {
        if let Some(after) = &mut self.after {
            // An error is the sender dropped: the request before is done either way.
            let _ = after.await;
            self.after = None;
        }
        let mut states = Arc::clone(&self.states).lock_owned().await;
        if let Some(initial) = self.initial.take() {
            *states = initial;
        }
        Turn {
            flags: self.flags.clone(),
            states,
            slot: self.slot,
            _before: self.before.take(),
        }
    }
}

impl Drop for Place {
    /// A request that leaves before its turn (its client went away) passes its place on: the
    /// request after it waits for the one before it. Without a runtime to wait on, the request
    /// after it goes at once.
    fn drop(&mut self) {
        if let (Some(after), Some(before)) = (self.after.take(), self.before.take()) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = after.await;
                    drop(before);
                });
            }
        }
    }
}

impl Turn {
    /// The sequence's slot: which of the model's instances runs it (see
    /// [`Sequences::with_slots`]).
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl SequenceSpec {
    /// Whether the model keeps implicit state (`state` entries) between a sequence's requests.
    pub fn has_states(&self) -> bool {
        !self.states.is_empty()
    }
}

impl Sequences {
    pub fn new(spec: SequenceSpec) -> Sequences {
        Sequences::with_slots(spec, 1)
    }

    /// Sequences spread over `slots` instances, each kept by one (a stateful Python model's
    /// instances keep their sequences' state): a new sequence goes to the instance Triton's
    /// sequence batcher would give it a free slot on ([`slots`]).
    pub fn with_slots(spec: SequenceSpec, slots: usize) -> Sequences {
        let slots = slots.max(1);
        Sequences {
            live: Mutex::new(Table {
                sequences: HashMap::new(),
                seats: Seats::new(slots, spec.seats),
                per_slot: vec![0; slots],
                swept: Instant::now(),
            }),
            spec,
            given: std::sync::atomic::AtomicU64::new(GIVEN_IDS),
        }
    }

    /// Where `request` stands in its sequence ([`SequenceFlags::of`]). For a model with
    /// `iterative_sequence`, a request without a `sequence_id` is a sequence of its own (START,
    /// and over when the request is), under a correlation ID kiln gives it, as Triton's sequence
    /// batcher takes such requests, which the model reschedules until they are done.
    ///
    /// # Errors
    /// As [`SequenceFlags::of`].
    pub fn flags(&self, request: &InferRequest, model: &str) -> Result<SequenceFlags, Error> {
        let no_id = match request.parameters.get("sequence_id") {
            None | Some(ParamValue::Uint64(0) | ParamValue::Int64(0)) => true,
            Some(ParamValue::String(id)) => id.is_empty(),
            Some(_) => false,
        };
        if self.spec.iterative && no_id {
            let id = self
                .given
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            return Ok(SequenceFlags {
                id: CorrId::Number(id),
                start: true,
                end: false,
                alone: true,
            });
        }
        SequenceFlags::of(request, model)
    }

    /// Waits for the sequence's previous request, then returns the request's turn. A START
    /// begins the sequence again from the initial states.
    ///
    /// # Errors
    /// As [`Sequences::place`].
    pub async fn begin(
        &self,
        flags: SequenceFlags,
        rows: usize,
        model: &str,
    ) -> Result<Turn, Error> {
        Ok(self.place(flags, rows, model)?.turn().await)
    }

    /// Takes the request's place in its sequence, now, behind the sequence's requests that took
    /// theirs before: their turns come in the order their places were taken (a stream's
    /// requests, in the order they came).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a sequence that was never started (or was dropped as idle), and for a
    /// request of more than one row; UNAVAILABLE when too many sequences are live.
    pub fn place(&self, flags: SequenceFlags, rows: usize, model: &str) -> Result<Place, Error> {
        if self.spec.batched && rows != 1 {
            return Err(invalid_arg!(
                "inference request to model '{model}' must specify batch-size 1 due to requirements \
                 of sequence batcher"
            ));
        }
        if matches!(flags.id, CorrId::Text(_)) && !self.spec.text_ids {
            return Err(invalid_arg!(
                "inference request to model '{model}' has a string correlation ID {}, but the \
                 model's CORRID control takes integers",
                flags.id
            ));
        }
        let now = Instant::now();
        let place = {
            let mut guard = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let table = &mut *guard;
            let idle = self.spec.idle;
            if now.duration_since(table.swept) >= idle / 10 {
                // Sequences idle too long go, unless a request of theirs is running.
                table.swept = now;
                let Table {
                    sequences,
                    seats,
                    per_slot,
                    ..
                } = table;
                sequences.retain(|_, l| {
                    let keep =
                        now.duration_since(l.last_used) < idle || l.states.try_lock().is_err();
                    if !keep {
                        release(seats, per_slot, l);
                    }
                    keep
                });
            }
            let live = &mut table.sequences;
            let entry = if flags.start {
                if !live.contains_key(&flags.id) && live.len() >= MAX_SEQUENCES {
                    return Err(Error::Unavailable(format!(
                        "model '{model}' already has {MAX_SEQUENCES} sequences in progress"
                    )));
                }
                let (seats, per_slot) = (&mut table.seats, &mut table.per_slot);
                let entry = live.entry(flags.id.clone()).or_insert_with(|| {
                    let (slot, seat) = match seats.take() {
                        Some((slot, seat)) => (slot, Some(seat)),
                        None => {
                            let slot = (0..per_slot.len())
                                .min_by_key(|&slot| per_slot[slot])
                                .unwrap_or(0);
                            (slot, None)
                        }
                    };
                    per_slot[slot] += 1;
                    Live {
                        states: Arc::new(tokio::sync::Mutex::new(Vec::new())),
                        last_used: now,
                        slot,
                        seat,
                        line: None,
                    }
                });
                entry.last_used = now;
                entry
            } else {
                let entry = live.get_mut(&flags.id).ok_or_else(|| {
                    invalid_arg!(
                        "inference request for sequence {} to model '{model}' must specify the START \
                         flag on the first request of the sequence",
                        flags.id
                    )
                })?;
                entry.last_used = now;
                entry
            };
            let (before, line) = tokio::sync::oneshot::channel();
            Place {
                after: entry.line.replace(line),
                before: Some(before),
                states: Arc::clone(&entry.states),
                initial: flags.start.then(|| self.initial_states()),
                slot: entry.slot,
                flags,
            }
        };
        Ok(place)
    }

    fn initial_states(&self) -> Vec<Tensor> {
        self.spec
            .states
            .iter()
            .map(|state| {
                let shape = self.shape(&state.dims);
                Tensor::new(
                    state.input.clone(),
                    state.datatype,
                    shape,
                    state.initial.clone(),
                )
            })
            .collect()
    }

    fn shape(&self, dims: &[i64]) -> Vec<i64> {
        if self.spec.batched {
            std::iter::once(1).chain(dims.iter().copied()).collect()
        } else {
            dims.to_vec()
        }
    }

    /// The inputs the server adds to the request: its control values and its states.
    pub fn inputs(&self, turn: &Turn) -> Vec<Tensor> {
        let mut inputs: Vec<Tensor> = self
            .spec
            .controls
            .iter()
            .map(|control| {
                let data = match &control.kind {
                    ControlKind::Flag(flag, values) => {
                        let on = match flag {
                            Flag::Start => turn.flags.start,
                            Flag::End => turn.flags.end,
                            Flag::Ready => true,
                        };
                        values[usize::from(on)].clone()
                    }
                    ControlKind::CorrId => corrid_data(&turn.flags.id, control.datatype),
                };
                Tensor::new(
                    control.name.clone(),
                    control.datatype,
                    self.shape(&[1]),
                    data,
                )
            })
            .collect();
        inputs.extend(turn.states.iter().cloned());
        inputs
    }

    /// Keeps the state outputs of the request's run for the next request (taking them out of
    /// `outputs`), or ends the sequence after its END.
    pub fn finish(&self, mut turn: Turn, outputs: &mut Vec<Tensor>) {
        let mut next = Vec::with_capacity(self.spec.states.len());
        for state in &self.spec.states {
            if let Some(index) = outputs.iter().position(|o| o.name == state.output) {
                let mut tensor = outputs.remove(index);
                tensor.name = state.input.clone();
                next.push(tensor);
            }
        }
        if next.len() == self.spec.states.len() {
            *turn.states = next;
        }
        let mut guard = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let table = &mut *guard;
        if turn.flags.end || turn.flags.alone {
            if let Some(ended) = table.sequences.remove(&turn.flags.id) {
                release(&mut table.seats, &mut table.per_slot, &ended);
            }
        } else if let Some(live) = table.sequences.get_mut(&turn.flags.id) {
            // Idle time counts from the end of its last request, however long that one ran.
            live.last_used = Instant::now();
        }
    }

    /// Sequences in progress.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.live.lock().unwrap().sequences.len()
    }
}

/// An ended sequence's place on its instance, free again.
fn release(seats: &mut Seats, per_slot: &mut [usize], ended: &Live) {
    per_slot[ended.slot] -= 1;
    if let Some(seat) = ended.seat {
        seats.give_back((ended.slot, seat));
    }
}

/// A correlation ID as a CORRID control tensor's one element.
fn corrid_data(id: &CorrId, datatype: DataType) -> Bytes {
    match (id, datatype) {
        (CorrId::Number(n), DataType::Uint64 | DataType::Int64) => {
            Bytes::copy_from_slice(&n.to_le_bytes())
        }
        (CorrId::Number(n), _) if datatype != DataType::Bytes => {
            Bytes::copy_from_slice(&(*n as u32).to_le_bytes())
        }
        (id, _) => {
            let text = match id {
                CorrId::Number(n) => n.to_string(),
                CorrId::Text(s) => s.clone(),
            };
            crate::core::tensor::frame_bytes([text.as_bytes()])
        }
    }
}

mod slots;
mod states;
#[cfg(test)]
mod tests;
