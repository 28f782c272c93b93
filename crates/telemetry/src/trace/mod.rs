//! Triton's request tracing (the `trace` extension): one request in `trace_rate` of a model is
//! followed through the server, and its timestamps (and, at level TENSORS, its input and output
//! tensors) are written to a JSON file in Triton's layout, so that Triton's trace tools read it.
//!
//! Settings exist globally and per model; a model's setting mirrors every field it does not set
//! itself, and follows later global updates of those fields (Triton's `TraceManager` rules). A
//! setting is replaced, never changed, by an update: traces already running finish under the
//! setting that sampled them, and a replaced setting writes what it still holds when the last of
//! them ends.
//!
//! In Triton's `opentelemetry` mode the same traces become OpenTelemetry spans sent to a
//! collector instead (see [`otel`]).
//!
//! Off (the default) costs one relaxed atomic load per request.

mod file;
pub mod otel;
pub mod settings;
mod tensors;

use crate::core::{Error, Tensor};
use crate::invalid_arg;
use file::TraceFile;
use otel::{Exporter, OtelTrace, SpanContext};
pub use settings::{Change, Level, TraceConfig, TraceMode, TraceSettings, TraceUpdate};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

/// The moments a trace records, by Triton's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// The REST request's headers were read; its body follows.
    HttpRecvStart,
    HttpRecvEnd,
    HttpSendStart,
    /// The response's last byte went to the connection.
    HttpSendEnd,
    /// The gRPC request reached the server (a unary call's headers), or, on a stream, the
    /// server began waiting for this message (the one before was read).
    GrpcWaitreadStart,
    /// The gRPC request message was read and decoded.
    GrpcWaitreadEnd,
    GrpcSendStart,
    GrpcSendEnd,
    RequestStart,
    QueueStart,
    ComputeStart,
    ComputeInputEnd,
    ComputeOutputStart,
    ComputeEnd,
    RequestEnd,
    /// The protocol has the model's response (before encoding and sending it).
    InferResponseComplete,
}

impl Activity {
    /// Recorded by the protocol (the root span's events in OpenTelemetry mode).
    pub fn is_protocol(self) -> bool {
        matches!(
            self,
            Activity::HttpRecvStart
                | Activity::HttpRecvEnd
                | Activity::HttpSendStart
                | Activity::HttpSendEnd
                | Activity::GrpcWaitreadStart
                | Activity::GrpcWaitreadEnd
                | Activity::GrpcSendStart
                | Activity::GrpcSendEnd
                | Activity::InferResponseComplete
        )
    }

    /// The model request's own moments (its span's events).
    pub fn is_request(self) -> bool {
        matches!(
            self,
            Activity::RequestStart | Activity::QueueStart | Activity::RequestEnd
        )
    }

    /// The execution's moments (the compute span's events).
    pub fn is_compute(self) -> bool {
        matches!(
            self,
            Activity::ComputeStart
                | Activity::ComputeInputEnd
                | Activity::ComputeOutputStart
                | Activity::ComputeEnd
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Activity::HttpRecvStart => "HTTP_RECV_START",
            Activity::HttpRecvEnd => "HTTP_RECV_END",
            Activity::HttpSendStart => "HTTP_SEND_START",
            Activity::HttpSendEnd => "HTTP_SEND_END",
            Activity::GrpcWaitreadStart => "GRPC_WAITREAD_START",
            Activity::GrpcWaitreadEnd => "GRPC_WAITREAD_END",
            Activity::GrpcSendStart => "GRPC_SEND_START",
            Activity::GrpcSendEnd => "GRPC_SEND_END",
            Activity::RequestStart => "REQUEST_START",
            Activity::QueueStart => "QUEUE_START",
            Activity::ComputeStart => "COMPUTE_START",
            Activity::ComputeInputEnd => "COMPUTE_INPUT_END",
            Activity::ComputeOutputStart => "COMPUTE_OUTPUT_START",
            Activity::ComputeEnd => "COMPUTE_END",
            Activity::RequestEnd => "REQUEST_END",
            Activity::InferResponseComplete => "INFER_RESPONSE_COMPLETE",
        }
    }
}

/// What a TENSORS-level record shows, by Triton's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorActivity {
    /// A request's inputs as queued.
    QueueInput,
    /// Its outputs as the model produced them.
    BackendOutput,
}

impl TensorActivity {
    pub fn name(self) -> &'static str {
        match self {
            TensorActivity::QueueInput => "TENSOR_QUEUE_INPUT",
            TensorActivity::BackendOutput => "TENSOR_BACKEND_OUTPUT",
        }
    }
}

/// Nanoseconds of the monotonic clock (CLOCK_MONOTONIC, Triton's steady clock) at `at`.
pub fn monotonic_ns(at: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (instant, ns) = *ANCHOR.get_or_init(|| {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the struct it is given; CLOCK_MONOTONIC always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let ns = u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(now.tv_nsec).unwrap_or(0);
        (Instant::now(), ns)
    });
    if at >= instant {
        ns.saturating_add(u64::try_from((at - instant).as_nanos()).unwrap_or(u64::MAX))
    } else {
        ns.saturating_sub(u64::try_from((instant - at).as_nanos()).unwrap_or(u64::MAX))
    }
}

/// The traces of the server: sampling, settings and files.
#[derive(Debug)]
pub struct Tracer {
    /// Whether any setting can trace; false spares requests the lock.
    active: AtomicBool,
    next_id: Arc<AtomicU64>,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The start-up settings, which a cleared global field returns to.
    default: TraceSettings,
    global: Arc<Setting>,
    models: HashMap<String, Arc<Setting>>,
    /// Models with a setting of their own that still mirrors some global fields.
    mirroring: BTreeSet<String>,
    /// One writer per path, shared by the settings that write there.
    files: HashMap<String, Weak<TraceFile>>,
    /// Where spans go in OpenTelemetry mode.
    exporter: Option<Arc<Exporter>>,
}

impl Tracer {
    /// Traces written to Triton's JSON files.
    pub fn new(settings: TraceSettings) -> Tracer {
        Tracer::with_exporter(settings, None)
    }

    /// Traces sent as OpenTelemetry spans by `exporter` (`None`: to files).
    pub fn with_exporter(settings: TraceSettings, exporter: Option<Arc<Exporter>>) -> Tracer {
        let file = Arc::new(TraceFile::new(settings.file.clone(), settings.file_limit));
        let files = HashMap::from([(settings.file.clone(), Arc::downgrade(&file))]);
        let global = Arc::new(Setting::new(
            settings.clone(),
            Specified::default(),
            file,
            exporter.clone(),
        ));
        let tracer = Tracer {
            active: AtomicBool::new(false),
            next_id: Arc::new(AtomicU64::new(1)),
            inner: Mutex::new(Inner {
                default: settings,
                global,
                models: HashMap::new(),
                mirroring: BTreeSet::new(),
                files,
                exporter,
            }),
        };
        tracer.refresh_active(&tracer.lock());
        tracer
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any setting can trace (a relaxed load: off costs nothing more).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// A trace for this request of `model`, if its setting samples it.
    pub fn sample(&self, model: &str) -> Option<Arc<Trace>> {
        self.sample_with(model, None)
    }

    /// As [`Tracer::sample`], for a request that may carry the caller's W3C `traceparent`: in
    /// OpenTelemetry mode such a request is always traced, and joins the caller's trace.
    pub fn sample_with(&self, model: &str, traceparent: Option<&str>) -> Option<Arc<Trace>> {
        if !self.is_active() {
            return None;
        }
        let setting = {
            let inner = self.lock();
            Arc::clone(inner.models.get(model).unwrap_or(&inner.global))
        };
        let remote = traceparent
            .filter(|_| setting.exporter.is_some())
            .and_then(SpanContext::parse);
        setting.sample(&self.next_id, remote)
    }

    /// The settings in force for `model` (the global ones for an empty name).
    pub fn settings(&self, model: &str) -> TraceSettings {
        let inner = self.lock();
        inner.models.get(model).unwrap_or(&inner.global).current()
    }

    /// Applies `update` to `model`'s settings (the global ones for an empty name) and returns
    /// the settings now in force.
    ///
    /// # Errors
    /// INVALID_ARGUMENT when the result could not trace although its level asks to (Triton's
    /// "Attempting to set invalid trace setting").
    pub fn update(&self, model: &str, update: &TraceUpdate) -> Result<TraceSettings, Error> {
        let mut inner = self.lock();
        inner.update_one(model, update)?;
        if model.is_empty() {
            for name in inner.mirroring.clone() {
                inner.update_one(&name, &TraceUpdate::default())?;
            }
        }
        self.refresh_active(&inner);
        Ok(inner.models.get(model).unwrap_or(&inner.global).current())
    }

    /// Writes every trace still held, as when settings are replaced, and sends the spans
    /// waiting for export; for shutdown.
    pub fn flush(&self) {
        let inner = self.lock();
        inner.global.flush();
        for setting in inner.models.values() {
            setting.flush();
        }
        if let Some(exporter) = &inner.exporter {
            exporter.flush(EXPORT_FLUSH_TIMEOUT);
        }
    }

    fn refresh_active(&self, inner: &Inner) {
        let active = std::iter::once(&inner.global)
            .chain(inner.models.values())
            .any(|setting| setting.values.invalid_reason().is_none());
        self.active.store(active, Ordering::Relaxed);
    }
}

impl Inner {
    /// Triton's update rule for one setting: each field is either the setting's own (set now or
    /// before, and not cleared) or the one it mirrors.
    fn update_one(&mut self, model: &str, update: &TraceUpdate) -> Result<(), Error> {
        let (current, fallback) = if model.is_empty() {
            (Some(&self.global), self.default.clone())
        } else {
            (self.models.get(model), self.global.current())
        };
        let now = current.map(|setting| (setting.current(), setting.specified));
        fn pick<T: Copy>(change: Change<T>, own: Option<(T, bool)>, fallback: T) -> (T, bool) {
            match (change, own) {
                (Change::Set(value), _) => (value, true),
                (Change::Keep, Some((value, true))) => (value, true),
                _ => (fallback, false),
            }
        }
        let (level, level_set) = pick(
            update.level,
            now.as_ref().map(|(v, s)| (v.level, s.level)),
            fallback.level,
        );
        let (rate, rate_set) = pick(
            update.rate,
            now.as_ref().map(|(v, s)| (v.rate, s.rate)),
            fallback.rate,
        );
        let (count, count_set) = pick(
            update.count,
            now.as_ref().map(|(v, s)| (v.count, s.count)),
            fallback.count,
        );
        let (log_frequency, frequency_set) = pick(
            update.log_frequency,
            now.as_ref()
                .map(|(v, s)| (v.log_frequency, s.log_frequency)),
            fallback.log_frequency,
        );
        let specified = Specified {
            level: level_set,
            rate: rate_set,
            count: count_set,
            log_frequency: frequency_set,
        };
        if !model.is_empty() {
            if specified.all() {
                self.mirroring.remove(model);
            } else if specified.none() {
                self.mirroring.remove(model);
                self.models.remove(model);
                return Ok(());
            } else {
                self.mirroring.insert(model.to_string());
            }
        }
        let values = TraceSettings {
            level,
            rate,
            count,
            log_frequency,
            file: fallback.file,
            file_limit: fallback.file_limit,
            mode: fallback.mode,
        };
        if let Some(reason) = values.invalid_reason() {
            if !level.is_off() {
                return Err(invalid_arg!(
                    "Attempting to set invalid trace setting :{reason}"
                ));
            }
        }
        let file = self.file(&values.file);
        let setting = Arc::new(Setting::new(values, specified, file, self.exporter.clone()));
        if model.is_empty() {
            self.global = setting;
        } else {
            self.models.insert(model.to_string(), setting);
        }
        Ok(())
    }

    fn file(&mut self, path: &str) -> Arc<TraceFile> {
        if let Some(file) = self.files.get(path).and_then(Weak::upgrade) {
            return file;
        }
        let file = Arc::new(TraceFile::new(path.to_string(), self.default.file_limit));
        self.files.retain(|_, file| file.strong_count() > 0);
        self.files.insert(path.to_string(), Arc::downgrade(&file));
        file
    }
}

/// Which fields a setting sets itself rather than mirrors.
#[derive(Debug, Clone, Copy, Default)]
struct Specified {
    level: bool,
    rate: bool,
    count: bool,
    log_frequency: bool,
}

impl Specified {
    fn all(self) -> bool {
        self.level && self.rate && self.count && self.log_frequency
    }

    fn none(self) -> bool {
        !(self.level || self.rate || self.count || self.log_frequency)
    }
}

/// Finished traces a setting holds at most before it writes them out.
const PENDING_BYTES: usize = 1 << 20;

/// How long shutdown waits for the last spans to reach the collector.
const EXPORT_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One setting in force, with its sampling state and the traces it has not written yet.
#[derive(Debug)]
struct Setting {
    values: TraceSettings,
    specified: Specified,
    file: Arc<TraceFile>,
    /// In OpenTelemetry mode, where finished traces go instead of `file`.
    exporter: Option<Arc<Exporter>>,
    state: Mutex<Sampling>,
}

#[derive(Debug, Default)]
struct Sampling {
    /// Requests seen, for the rate.
    seen: u64,
    /// Traces still to take; -1: no limit.
    count: i32,
    created: u64,
    written: u64,
    /// Finished traces not in a file yet, comma-separated, and how many.
    pending: String,
    pending_traces: u32,
}

impl Sampling {
    fn take_pending(&mut self) -> String {
        self.pending_traces = 0;
        std::mem::take(&mut self.pending)
    }
}

impl Setting {
    fn new(
        values: TraceSettings,
        specified: Specified,
        file: Arc<TraceFile>,
        exporter: Option<Arc<Exporter>>,
    ) -> Setting {
        let state = Mutex::new(Sampling {
            count: values.count,
            ..Sampling::default()
        });
        Setting {
            values,
            specified,
            file,
            exporter,
            state,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sampling> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The values, with the count of traces still to take.
    fn current(&self) -> TraceSettings {
        TraceSettings {
            count: self.lock().count,
            ..self.values.clone()
        }
    }

    /// A trace when this request is sampled; a request with the caller's trace context
    /// (`remote`) always is, whatever the rate and count.
    fn sample(
        self: &Arc<Self>,
        next_id: &Arc<AtomicU64>,
        remote: Option<SpanContext>,
    ) -> Option<Arc<Trace>> {
        let mut state = self.lock();
        if self.values.invalid_reason().is_some() {
            return None;
        }
        if remote.is_none() {
            if state.count == 0 || self.values.rate == 0 {
                return None;
            }
            state.seen += 1;
            if state.seen % u64::from(self.values.rate) != 0 {
                return None;
            }
            if state.count > 0 {
                state.count -= 1;
            }
        }
        state.created += 1;
        drop(state);
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        Some(Arc::new(Trace {
            id,
            ids: Arc::clone(next_id),
            parent: None,
            level: self.values.level,
            setting: Arc::clone(self),
            records: Mutex::new(String::new()),
            otel: self
                .exporter
                .as_ref()
                .map(|_| Mutex::new(OtelTrace::new(id, remote))),
            remote,
        }))
    }

    /// Takes a finished trace; writes a numbered file when the log frequency's worth is pending,
    /// or when the last trace of a count has finished. Pending traces are written whenever they
    /// reach [`PENDING_BYTES`] too (to the main file without a log frequency, else to a numbered
    /// file of fewer traces), so that memory stays bounded however long tracing runs, whatever
    /// log frequency a client sets (Triton keeps them all until it exits).
    fn finish(&self, records: &str) {
        let mut state = self.lock();
        state.written += 1;
        if !records.is_empty() {
            if state.pending_traces > 0 {
                state.pending.push(',');
            }
            state.pending.push_str(records);
            state.pending_traces += 1;
        }
        let frequency = self.values.log_frequency;
        let count_done = state.count == 0 && state.written == state.created;
        if count_done || (frequency != 0 && state.pending_traces >= frequency) {
            let traces = state.take_pending();
            drop(state);
            self.file.save_numbered(&traces);
        } else if state.pending.len() >= PENDING_BYTES {
            let traces = state.take_pending();
            drop(state);
            if frequency == 0 {
                self.file.save(&traces);
            } else {
                self.file.save_numbered(&traces);
            }
        }
    }

    /// Writes what is pending: to a numbered file with a log frequency, else to the main file.
    fn flush(&self) {
        let mut state = self.lock();
        if state.pending_traces == 0 {
            return;
        }
        let traces = state.take_pending();
        drop(state);
        if self.values.log_frequency != 0 {
            self.file.save_numbered(&traces);
        } else {
            self.file.save(&traces);
        }
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        self.flush();
    }
}

/// One traced request. Its records are written when the last holder lets it go; a child's (an
/// ensemble step's) join its parent's, as Triton groups them.
#[derive(Debug)]
pub struct Trace {
    id: u64,
    /// Where ids come from (the tracer's counter).
    ids: Arc<AtomicU64>,
    /// The ensemble request this one is a step of.
    parent: Option<Arc<Trace>>,
    level: Level,
    setting: Arc<Setting>,
    /// This trace's JSON objects, comma-separated.
    records: Mutex<String>,
    /// In OpenTelemetry mode, what it collects instead.
    otel: Option<Mutex<OtelTrace>>,
    /// The caller's trace context, when it sent one (OpenTelemetry mode).
    remote: Option<SpanContext>,
}

impl Trace {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A trace of its own for a request made on this one's behalf (an ensemble step), written
    /// with this one and naming it as `parent_id`.
    pub fn child(self: &Arc<Self>) -> Arc<Trace> {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        Arc::new(Trace {
            id,
            ids: Arc::clone(&self.ids),
            parent: Some(Arc::clone(self)),
            level: self.level,
            setting: Arc::clone(&self.setting),
            records: Mutex::new(String::new()),
            otel: self.otel().map(|otel| Mutex::new(otel.child(id))),
            remote: None,
        })
    }

    /// In OpenTelemetry mode, the W3C context of the request's model span, for a Python model
    /// (`request.trace().get_context()`, as Triton's).
    pub fn context(&self) -> Option<String> {
        self.otel().map(|otel| otel.context())
    }

    fn otel(&self) -> Option<MutexGuard<'_, OtelTrace>> {
        self.otel
            .as_ref()
            .map(|otel| otel.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn push(&self, record: impl FnOnce(&mut String)) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if !records.is_empty() {
            records.push(',');
        }
        record(&mut records);
    }

    /// A timestamp, at level TIMESTAMPS.
    pub fn record(&self, activity: Activity, at: Instant) {
        if !self.level.contains(Level::TIMESTAMPS) {
            return;
        }
        if let Some(mut otel) = self.otel() {
            otel.events.push((activity, otel::unix_ns(at)));
            return;
        }
        let ns = monotonic_ns(at);
        self.push(|out| {
            let _ = write!(
                out,
                r#"{{"id":{},"timestamps":[{{"name":"{}","ns":{ns}}}]}}"#,
                self.id,
                activity.name()
            );
        });
    }

    /// INFER_RESPONSE_COMPLETE, now, for a response that goes to the client: not for a step's
    /// or a call's (its responses go to the request it serves), as Triton's front ends record it.
    pub fn responded(&self) {
        if self.parent.is_none() {
            self.record(Activity::InferResponseComplete, Instant::now());
        }
    }

    /// The model, version and request id the trace is about (written once the request has found
    /// its model version).
    pub fn describe(&self, model: &str, version: i64, request_id: &str) {
        if let Some(mut otel) = self.otel() {
            otel.model = model.to_string();
            otel.version = version;
            otel.request_id = request_id.to_string();
            return;
        }
        self.push(|out| {
            let _ = write!(
                out,
                r#"{{"id":{},"model_name":{},"model_version":{version}"#,
                self.id,
                serde_json::Value::from(model)
            );
            if !request_id.is_empty() {
                let _ = write!(
                    out,
                    r#","request_id":{}"#,
                    serde_json::Value::from(request_id)
                );
            }
            if let Some(parent) = &self.parent {
                let _ = write!(out, r#","parent_id":{}"#, parent.id);
            }
            out.push('}');
        });
    }

    /// Tensors, at level TENSORS (not sent in OpenTelemetry mode).
    pub fn tensors<'a>(
        &self,
        activity: TensorActivity,
        tensors: impl IntoIterator<Item = &'a Tensor>,
    ) {
        if !self.level.contains(Level::TENSORS) || self.otel.is_some() {
            return;
        }
        for tensor in tensors {
            self.push(|out| tensors::write(out, self.id, activity.name(), tensor));
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some(otel) = self.otel.take() {
            let otel = otel.into_inner().unwrap_or_else(|e| e.into_inner());
            match (&self.parent, &self.setting.exporter) {
                (Some(parent), _) => {
                    if let Some(mut parent) = parent.otel() {
                        parent.children.push(otel);
                    }
                }
                (None, Some(exporter)) => exporter.push(otel.spans(self.remote)),
                (None, None) => {}
            }
            return;
        }
        let records = std::mem::take(self.records.get_mut().unwrap_or_else(|e| e.into_inner()));
        match &self.parent {
            Some(parent) if !records.is_empty() => parent.push(|out| out.push_str(&records)),
            Some(_) => {}
            None => self.setting.finish(&records),
        }
    }
}

/// Records `activity` on a trace when the value holding it is dropped: the response body's end,
/// for the send timestamps.
#[derive(Debug, Clone)]
pub struct RecordOnDrop {
    pub trace: Arc<Trace>,
    pub activity: Activity,
}

impl RecordOnDrop {
    /// Records `start` on `trace` now, and `end` when the value returned is dropped: a
    /// response's sending.
    pub fn sending(trace: &Arc<Trace>, start: Activity, end: Activity) -> RecordOnDrop {
        trace.record(start, Instant::now());
        RecordOnDrop {
            trace: Arc::clone(trace),
            activity: end,
        }
    }
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        self.trace.record(self.activity, Instant::now());
    }
}

/// Responses sent one after another on one connection (a gRPC stream's messages, server-sent
/// events), each with what records its send end: that is recorded when the next is asked for
/// (the one before has been handed to the connection), or when the stream ends.
pub fn sent_one_by_one<T>(
    mut items: impl futures_util::Stream<Item = (T, Option<RecordOnDrop>)> + Unpin,
) -> impl futures_util::Stream<Item = T> {
    use futures_util::StreamExt;
    let mut sending: Option<RecordOnDrop> = None;
    futures_util::stream::poll_fn(move |cx| {
        drop(sending.take());
        items.poll_next_unpin(cx).map(|next| {
            next.map(|(item, sent)| {
                sending = sent;
                item
            })
        })
    })
}

#[cfg(test)]
mod tests;
