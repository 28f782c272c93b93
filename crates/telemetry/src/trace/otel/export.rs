//! Sends spans to the collector in the background, as OpenTelemetry's batch span processor does:
//! spans wait in a bounded queue (beyond it they are dropped, and counted) and go out every
//! schedule delay, or as soon as a full batch is waiting, in POSTs of at most a batch each.

use super::wire::{
    ExportTraceServiceRequest, InstrumentationScope, KeyValue, Resource, ResourceSpans, ScopeSpans,
    Span,
};
use super::OtelConfig;
use prost::Message;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long one POST may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The background exporter of one server.
#[derive(Debug)]
pub struct Exporter {
    config: OtelConfig,
    queue: Mutex<Queue>,
    wake: Condvar,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Queue {
    spans: Vec<Span>,
    /// Flushes asked for and flushes done: a flush waits until every span queued before it has
    /// been sent.
    flush_asked: u64,
    flush_done: u64,
}

impl Exporter {
    /// Starts the exporter's thread.
    ///
    /// # Errors
    /// When the thread cannot start.
    pub fn start(config: OtelConfig) -> std::io::Result<Arc<Exporter>> {
        let exporter = Arc::new(Exporter {
            config,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let worker = Arc::clone(&exporter);
        std::thread::Builder::new()
            .name("otel-export".into())
            .spawn(move || worker.run())?;
        info!(
            "OpenTelemetry traces go to {} (resource {})",
            exporter.config.url,
            exporter
                .config
                .resource
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(exporter)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a finished request's spans; drops them when the queue is full.
    pub fn push(&self, spans: Vec<Span>) {
        let mut queue = self.lock();
        if queue.spans.len() + spans.len() > self.config.max_queue_size {
            drop(queue);
            if self
                .dropped
                .fetch_add(spans.len() as u64, Ordering::Relaxed)
                == 0
            {
                warn!(
                    "OpenTelemetry span queue full ({} spans): dropping spans until it drains",
                    self.config.max_queue_size
                );
            }
            return;
        }
        queue.spans.extend(spans);
        if queue.spans.len() >= self.config.max_export_batch_size {
            self.wake.notify_all();
        }
    }

    /// Spans waiting for export.
    pub fn queued(&self) -> usize {
        self.lock().spans.len()
    }

    /// Spans dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends every queued span now and waits (at most `timeout`) until they are out: at
    /// shutdown.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut queue = self.lock();
        queue.flush_asked += 1;
        let ticket = queue.flush_asked;
        self.wake.notify_all();
        while queue.flush_done < ticket {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!("OpenTelemetry spans not all sent before shutdown");
                return;
            }
            queue = self
                .wake
                .wait_timeout(queue, left)
                .map_or_else(|e| e.into_inner().0, |(q, _)| q);
        }
    }

    fn run(&self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                warn!("OpenTelemetry export stopped: cannot start its runtime: {e}");
                return;
            }
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = match reqwest::Client::builder().timeout(SEND_TIMEOUT).build() {
            Ok(client) => client,
            Err(e) => {
                warn!("OpenTelemetry export stopped: cannot make its HTTP client: {e}");
                return;
            }
        };
        let delay = Duration::from_millis(self.config.schedule_delay_ms);
        let mut failing = false;
        loop {
            let (batches, flushed) = self.next_batches(delay);
            for spans in batches {
                let body = self.request(spans).encode_to_vec();
                // Built inside the runtime: the request's timeout needs its timer.
                let outcome = runtime.block_on(async {
                    let sent = client
                        .post(&self.config.url)
                        .header("content-type", "application/x-protobuf")
                        .body(body)
                        .send()
                        .await;
                    match sent {
                        Ok(response) if response.status().is_success() => Ok(()),
                        Ok(response) => {
                            Err(format!("the collector answered {}", response.status()))
                        }
                        Err(e) => Err(e.to_string()),
                    }
                });
                match outcome {
                    Ok(()) if failing => {
                        info!("OpenTelemetry spans reach {} again", self.config.url);
                        failing = false;
                    }
                    Ok(()) => {}
                    Err(e) if !failing => {
                        warn!(
                            "cannot send OpenTelemetry spans to {}: {e}",
                            self.config.url
                        );
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
            if let Some(ticket) = flushed {
                self.lock().flush_done = ticket;
                self.wake.notify_all();
            }
        }
    }

    /// Waits for spans to send: a full batch, the delay, or a flush (which takes everything).
    fn next_batches(&self, delay: Duration) -> (Vec<Vec<Span>>, Option<u64>) {
        let deadline = Instant::now() + delay;
        let mut queue = self.lock();
        loop {
            let flushing = queue.flush_asked > queue.flush_done;
            let full = queue.spans.len() >= self.config.max_export_batch_size;
            let now = Instant::now();
            if flushing || full || now >= deadline {
                let batch = self.config.max_export_batch_size;
                let take = if flushing {
                    queue.spans.len()
                } else {
                    queue.spans.len().min(batch)
                };
                let spans: Vec<Span> = queue.spans.drain(..take).collect();
                let flushed = flushing.then_some(queue.flush_asked);
                let batches = spans.chunks(batch).map(<[Span]>::to_vec).collect();
                return (batches, flushed);
            }
            queue = self
                .wake
                .wait_timeout(queue, deadline - now)
                .map_or_else(|e| e.into_inner().0, |(q, _)| q);
        }
    }

    fn request(&self, spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: self
                        .config
                        .resource
                        .iter()
                        .map(|(key, value)| KeyValue::string(key, value.clone()))
                        .collect(),
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "kiln".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                }],
            }],
        }
    }
}
