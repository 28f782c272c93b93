//! Triton's `opentelemetry` trace mode: the same sampled requests and timestamps, sent as
//! OpenTelemetry spans over OTLP/HTTP (protobuf) to a collector instead of written to a file.
//!
//! A traced request becomes, as in Triton, a root span `InferRequest` (the protocol's events:
//! `HTTP_RECV_START` ... `HTTP_SEND_END` or `GRPC_WAITREAD_START` ... `GRPC_SEND_END`, with
//! `INFER_RESPONSE_COMPLETE` between), a span named
//! after the model (`REQUEST_START`, `QUEUE_START`, `REQUEST_END`; attributes `triton.model_name`,
//! `triton.model_version`, `triton.trace_id`, `triton.trace_parent_id` (0 for a client's request)
//! and `triton.request_id` when it has one) and under it a `compute` span (`COMPUTE_START` ...
//! `COMPUTE_END`). An ensemble's steps are model spans under the ensemble's. Event times are the
//! wall clock (OpenTelemetry's), not the monotonic clock of Triton's JSON traces.
//!
//! A request carrying a W3C `traceparent` header (HTTP) or metadata entry (gRPC) is always traced
//! (whatever the rate and count, as in Triton) and its root span joins the caller's trace.

mod export;
pub mod wire;

pub use export::Exporter;

use super::Activity;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// `--trace-config opentelemetry,<setting>=<value>`: where spans go and how they are batched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP traces endpoint.
    pub url: String,
    /// Resource attributes (`service.name` first).
    pub resource: Vec<(String, String)>,
    /// Spans held for export at most; more are dropped (and counted in the log).
    pub max_queue_size: usize,
    /// Milliseconds between two exports.
    pub schedule_delay_ms: u64,
    /// Spans per export request at most.
    pub max_export_batch_size: usize,
}

impl Default for OtelConfig {
    /// Triton's defaults, with kiln's service name.
    fn default() -> OtelConfig {
        OtelConfig {
            url: "http://localhost:4318/v1/traces".into(),
            resource: vec![("service.name".into(), "kiln".into())],
            max_queue_size: 2048,
            schedule_delay_ms: 5000,
            max_export_batch_size: 512,
        }
    }
}

impl OtelConfig {
    /// Applies one `opentelemetry,<key>=<value>` setting.
    ///
    /// # Errors
    /// A message for an unknown key or a value that does not parse.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let number = |what: &str| -> Result<u64, String> {
            value
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{what} must be a positive integer, got '{value}'"))
        };
        match key {
            "url" => {
                if value.is_empty() {
                    return Err("url must not be empty".into());
                }
                self.url = if value.contains("://") {
                    value.to_string()
                } else {
                    format!("http://{value}")
                };
            }
            "resource" => {
                let (name, text) = value
                    .split_once('=')
                    .filter(|(name, _)| !name.is_empty())
                    .ok_or_else(|| format!("resource must be <key>=<value>, got '{value}'"))?;
                self.resource.retain(|(k, _)| k != name);
                self.resource.push((name.to_string(), text.to_string()));
            }
            "bsp_max_queue_size" => self.max_queue_size = number(key)? as usize,
            "bsp_schedule_delay" => self.schedule_delay_ms = number(key)?,
            "bsp_max_export_batch_size" => self.max_export_batch_size = number(key)? as usize,
            _ => {
                return Err(format!(
                    "unknown opentelemetry setting '{key}' (known: url, resource, \
                     bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)"
                ))
            }
        }
        if self.max_export_batch_size > self.max_queue_size {
            return Err("bsp_max_export_batch_size must not exceed bsp_max_queue_size".into());
        }
        Ok(())
    }

    /// Adds `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`), as OpenTelemetry SDKs read it; settings
    /// given on the command line win.
    pub fn with_environment(mut self, attributes: Option<&str>) -> OtelConfig {
        for pair in attributes.unwrap_or_default().split(',') {
            if let Some((key, value)) = pair.trim().split_once('=') {
                if !key.is_empty() && !self.resource.iter().any(|(k, _)| k == key) {
                    self.resource.push((key.to_string(), value.to_string()));
                }
            }
        }
        self
    }
}

/// A caller's trace context from a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl SpanContext {
    /// Reads a `traceparent` value; `None` unless it is well formed with non-zero ids.
    pub fn parse(traceparent: &str) -> Option<SpanContext> {
        let mut parts = traceparent.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || flags.len() != 2 {
            return None;
        }
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?.try_into().ok()?;
        let span_id: [u8; 8] = hex(span)?.try_into().ok()?;
        hex(flags)?;
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(SpanContext { trace_id, span_id })
    }
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0
        || !text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// Nanoseconds since the Unix epoch at `at`.
pub fn unix_ns(at: Instant) -> u64 {
    let now = Instant::now();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    if at <= now {
        wall.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX))
    } else {
        wall.saturating_add(u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX))
    }
}

/// What a traced request collected, in the shape spans are made from.
#[derive(Debug, Default)]
pub struct OtelTrace {
    pub id: u64,
    pub parent_id: Option<u64>,
    /// Its trace (the caller's, when it sent its context).
    pub trace_id: [u8; 16],
    /// Its model span's id, known from the start for [`OtelTrace::context`].
    pub span_id: [u8; 8],
    pub model: String,
    pub version: i64,
    pub request_id: String,
    pub events: Vec<(Activity, u64)>,
    /// Ensemble steps.
    pub children: Vec<OtelTrace>,
}

/// Random, non-zero bytes (trace and span ids): from the kernel, or, where `getrandom` is not
/// allowed, from std's randomly keyed hasher over a counter.
fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // SAFETY: getrandom writes at most `N` bytes into the buffer it is given.
    let written = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), N, 0) };
    if written == N as isize && bytes != [0; N] {
        return bytes;
    }
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    for chunk in bytes.chunks_mut(8) {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let value = hasher.finish() | 1;
        chunk.copy_from_slice(&value.to_le_bytes()[..chunk.len()]);
    }
    bytes
}

impl OtelTrace {
    /// A client's request's: in the caller's trace (`remote`), or in a new one.
    pub fn new(id: u64, remote: Option<SpanContext>) -> OtelTrace {
        OtelTrace {
            id,
            trace_id: remote.map_or_else(random::<16>, |r| r.trace_id),
            span_id: random::<8>(),
            ..OtelTrace::default()
        }
    }

    /// A request's made on behalf of this one (an ensemble step, a Python model's call), in
    /// its trace.
    pub fn child(&self, id: u64) -> OtelTrace {
        OtelTrace {
            id,
            parent_id: Some(self.id),
            trace_id: self.trace_id,
            span_id: random::<8>(),
            ..OtelTrace::default()
        }
    }

    /// Its model span's W3C context, as Triton gives it to a Python model
    /// (`request.trace().get_context()`): `{"traceparent":"00-<trace id>-<span id>-01"}`.
    pub fn context(&self) -> String {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        format!(
            r#"{{"traceparent":"00-{}-{}-01"}}"#,
            hex(&self.trace_id),
            hex(&self.span_id)
        )
    }

    /// The spans of a finished request: the root `InferRequest` (a child of `remote` when the
    /// caller sent its context), the model span, the compute span, and its steps' spans.
    pub fn spans(&self, remote: Option<SpanContext>) -> Vec<wire::Span> {
        let root_id = random::<8>();
        let protocol: Vec<(Activity, u64)> = self
            .events
            .iter()
            .copied()
            .filter(|(activity, _)| activity.is_protocol())
            .collect();
        let (start, end) = bounds(self.all_events());
        let mut spans = vec![wire::Span {
            trace_id: self.trace_id.to_vec(),
            span_id: root_id.to_vec(),
            parent_span_id: remote.map(|r| r.span_id.to_vec()).unwrap_or_default(),
            name: "InferRequest".into(),
            kind: wire::SPAN_KIND_SERVER,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: Vec::new(),
            events: events(&protocol),
        }];
        self.model_spans(&root_id, &mut spans);
        spans
    }

    fn all_events(&self) -> Vec<u64> {
        let mut times: Vec<u64> = self.events.iter().map(|(_, ns)| *ns).collect();
        for child in &self.children {
            times.extend(child.all_events());
        }
        times
    }

    /// This request's model span (and its compute span), then its steps' under it.
    fn model_spans(&self, parent: &[u8; 8], spans: &mut Vec<wire::Span>) {
        let span_id = self.span_id;
        let of = |kinds: fn(Activity) -> bool| -> Vec<(Activity, u64)> {
            self.events
                .iter()
                .copied()
                .filter(|(activity, _)| kinds(*activity))
                .collect()
        };
        let request = of(Activity::is_request);
        let compute = of(Activity::is_compute);
        // Triton 2.51's attributes: the parent's trace id 0 for a request of the client's.
        let mut attributes = vec![
            wire::KeyValue::string("triton.model_name", self.model.clone()),
            wire::KeyValue::int("triton.model_version", self.version),
            wire::KeyValue::int("triton.trace_id", self.id as i64),
            wire::KeyValue::int("triton.trace_parent_id", self.parent_id.unwrap_or(0) as i64),
        ];
        if !self.request_id.is_empty() {
            attributes.push(wire::KeyValue::string(
                "triton.request_id",
                self.request_id.clone(),
            ));
        }
        let (start, end) = bounds(request.iter().chain(&compute).map(|(_, ns)| *ns).collect());
        spans.push(wire::Span {
            trace_id: self.trace_id.to_vec(),
            span_id: span_id.to_vec(),
            parent_span_id: parent.to_vec(),
            name: self.model.clone(),
            kind: wire::SPAN_KIND_SERVER,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes,
            events: events(&request),
        });
        if !compute.is_empty() {
            let (start, end) = bounds(compute.iter().map(|(_, ns)| *ns).collect());
            spans.push(wire::Span {
                trace_id: self.trace_id.to_vec(),
                span_id: random::<8>().to_vec(),
                parent_span_id: span_id.to_vec(),
                name: "compute".into(),
                kind: wire::SPAN_KIND_SERVER,
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                attributes: Vec::new(),
                events: events(&compute),
            });
        }
        for child in &self.children {
            child.model_spans(&span_id, spans);
        }
    }
}

fn events(events: &[(Activity, u64)]) -> Vec<wire::Event> {
    events
        .iter()
        .map(|(activity, ns)| wire::Event {
            time_unix_nano: *ns,
            name: activity.name().into(),
        })
        .collect()
}

/// The earliest and latest of `times` (both 0 when there are none).
fn bounds(times: Vec<u64>) -> (u64, u64) {
    let start = times.iter().copied().min().unwrap_or(0);
    let end = times.iter().copied().max().unwrap_or(start);
    (start, end)
}

#[cfg(test)]
mod tests;
