//! Per-model-version statistics (Triton's `ModelStatistics`) and Prometheus metrics with Triton's
//! names, recorded together at the same points: once per request (success or failure, with its
//! queue and compute times) and once per execution (a batch run on an instance).
//!
//! Metrics (labels `model`, `version`; counters carry no `_total` suffix, as Triton's):
//! `nv_inference_request_success`, `nv_inference_request_failure` (+ `reason`),
//! `nv_inference_count`, `nv_inference_exec_count`, `nv_inference_pending_request_count` (gauge),
//! `nv_model_load_duration_secs` (gauge); the latency counters
//! `nv_inference_{request,queue}_duration_us` and `nv_inference_compute_{input,infer,output}_duration_us`
//! and, when [`config`] asks for them, the summaries `nv_inference_{request,queue}_summary_us` and
//! `nv_inference_compute_{input,infer,output}_summary_us` (quantiles over a sliding window).
//!
//! As in Triton, what ran on a GPU instance (success, counts, durations, the summaries) is
//! counted in series that carry the GPU's `gpu_uuid` label as well; failures, the pending count
//! and the load time belong to the model version. [`gpu`] adds the per-GPU gauges, [`cpu`] the
//! machine's CPU gauges.
//!
//! A version's series live as long as it does ([`series`]): a model unloaded leaves `/metrics`,
//! and loaded again counts from 0, as Triton's; a reload keeps counting.
//!
//! Generation models add (same labels; see [`GenerationMetrics`]): the histograms
//! `kiln_time_to_first_token_seconds` and `kiln_inter_token_latency_seconds`, the counters
//! `kiln_generation_tokens_total` (tokens/s is its `rate()`) and `kiln_prompt_tokens_total`,
//! and the gauge `kiln_active_sequences`; with `histogram_latencies`, Triton's
//! `nv_inference_first_response_histogram_ms` ([`histogram`]).

pub mod config;
pub mod cpu;
pub mod custom;
mod families;
pub mod gpu;
pub mod histogram;
pub mod latency;
pub mod series;

pub use config::MetricsConfig;

use crate::proto::inference::{
    InferBatchStatistics, InferStatistics, ModelStatistics, StatisticDuration,
};
use families::*;
use metrics::{describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use series::{Counter, Gauge, Summary};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Installs the Prometheus recorder once per process and returns its handle (`None` if another
/// recorder was installed first). The recorder has the server's series (CPU, GPUs, the response
/// cache); the model versions' are [`series`]'.
pub fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| tracing::warn!("Prometheus metrics disabled: {e}"))
                .ok()
                .inspect(|_| describe())
        })
        .clone()
}

/// The Prometheus text of every series: the exporter's, then the model versions' and the
/// models' own (custom metrics).
pub fn render(handle: &PrometheusHandle) -> String {
    let mut text = handle.render();
    series::render(&mut text);
    custom::render(&mut text);
    text
}

/// The help lines of the server's gauges, Triton's texts word for word.
fn describe() {
    for (name, help) in [
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]"),
        (
            "nv_cache_num_entries",
            "Number of responses stored in response cache",
        ),
        (
            "nv_cache_num_hits",
            "Number of cache hits in response cache",
        ),
        (
            "nv_cache_num_misses",
            "Number of cache misses in response cache",
        ),
        (
            "nv_cache_num_lookups",
            "Number of cache lookups in response cache",
        ),
        (
            "nv_cache_num_evictions",
            "Number of cache evictions in response cache",
        ),
        (
            "nv_cache_lookup_duration",
            "Total cache lookup duration (hit and miss), in microseconds",
        ),
        (
            "nv_cache_insertion_duration",
            "Total cache insertion duration, in microseconds",
        ),
    ] {
        describe_gauge!(name, help);
    }
    // Triton's pinned memory pool gauges, which dashboards read: kiln has no pinned pool (its
    // tensors stay where the request put them), so both say 0.
    for (name, help) in [
        (
            "nv_pinned_memory_pool_total_bytes",
            "Pinned memory pool total memory size, in bytes",
        ),
        (
            "nv_pinned_memory_pool_used_bytes",
            "Pinned memory pool used memory size, in bytes",
        ),
    ] {
        describe_gauge!(name, help);
        gauge!(name).set(0.0);
    }
}

/// Histogram buckets (seconds) of the generation latencies: 0.5 ms to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Prometheus metrics of one generation model version.
pub struct GenerationMetrics {
    time_to_first_token: Arc<series::Histogram>,
    /// Triton's first-response histogram (ms), when the metrics config asks for it.
    first_response: Option<Arc<series::Histogram>>,
    inter_token_latency: Arc<series::Histogram>,
    generated: Counter,
    prompt: Counter,
    active: Gauge,
}

impl GenerationMetrics {
    /// `first_response_buckets`: the bounds of Triton's first-response histogram (ms), published
    /// when the metrics config asks for it.
    pub fn new(model: &str, version: i64, first_response_buckets: &[f64]) -> GenerationMetrics {
        let labels = [
            ("model", model.to_string()),
            ("version", version.to_string()),
        ];
        GenerationMetrics {
            time_to_first_token: series::histogram(&TIME_TO_FIRST_TOKEN, &labels, LATENCY_BUCKETS),
            first_response: config::current()
                .histogram_latencies
                .then(|| series::histogram(&FIRST_RESPONSE, &labels, first_response_buckets)),
            inter_token_latency: series::histogram(&INTER_TOKEN_LATENCY, &labels, LATENCY_BUCKETS),
            generated: series::counter(&GENERATION_TOKENS, &labels),
            prompt: series::counter(&PROMPT_TOKENS, &labels),
            active: series::gauge(&ACTIVE_SEQUENCES, &labels),
        }
    }

    /// From a request's arrival to its first generated token.
    pub fn first_token(&self, elapsed: Duration) {
        self.time_to_first_token.observe(elapsed.as_secs_f64());
        if let Some(first_response) = &self.first_response {
            first_response.observe(elapsed.as_secs_f64() * 1e3);
        }
    }

    /// Between two tokens of one sequence.
    pub fn token_gap(&self, elapsed: Duration) {
        self.inter_token_latency.observe(elapsed.as_secs_f64());
    }

    pub fn generated(&self, tokens: usize) {
        self.generated.increment(tokens as u64);
    }

    pub fn prompt(&self, tokens: usize) {
        self.prompt.increment(tokens as u64);
    }

    /// Sequences in the running batch.
    pub fn active(&self, sequences: usize) {
        self.active.set(sequences as f64);
    }
}

/// Why a request failed, as Triton's `reason` label spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// Refused by the queue: full, or timed out while waiting.
    Rejected,
    /// The client went away before the answer.
    Canceled,
    /// The model failed while running.
    Backend,
    /// Anything else after the model was found (e.g. an invalid request).
    Other,
}

impl FailureReason {
    fn label(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }
}

/// Time spent in each phase of one execution, shared by every request of its batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComputeTimes {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

/// Where one request's time went, for its statistics: queued, then computing (its batch's
/// times), on GPU `gpu` or (`None`) on CPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub queue: Duration,
    pub compute: ComputeTimes,
    pub gpu: Option<i32>,
}

impl Timing {
    /// A request that waited `queue` and whose compute is not timed per request (a generation
    /// model's sequence: its steps are executions of their own).
    pub fn queued(queue: Duration) -> Timing {
        Timing {
            queue,
            ..Timing::default()
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Total {
    count: u64,
    ns: u64,
}

impl Total {
    fn add(&mut self, d: Duration) {
        self.count += 1;
        self.ns += d.as_nanos() as u64;
    }

    fn proto(self) -> Option<StatisticDuration> {
        Some(StatisticDuration {
            count: self.count,
            ns: self.ns,
        })
    }
}

#[derive(Debug, Default)]
struct Totals {
    last_inference_ms: u64,
    inference_count: u64,
    execution_count: u64,
    success: Total,
    fail: Total,
    queue: Total,
    compute_input: Total,
    compute_infer: Total,
    compute_output: Total,
    cache_hit: Total,
    cache_miss: Total,
    /// Per executed batch size: (input, infer, output).
    batches: BTreeMap<u64, [Total; 3]>,
    /// Successful requests' end-to-end and queue times, for the status page's percentiles.
    request_latency: latency::LatencyHistogram,
    queue_latency: latency::LatencyHistogram,
}

/// Prometheus handles of what one device (the CPU, or one GPU) ran for a model version,
/// registered once. Series the metrics config leaves out are no-op handles, never registered.
struct Handles {
    success: Counter,
    inference_count: Counter,
    exec_count: Counter,
    request_us: Counter,
    queue_us: Counter,
    compute_input_us: Counter,
    compute_infer_us: Counter,
    compute_output_us: Counter,
    request_summary: Summary,
    queue_summary: Summary,
    compute_input_summary: Summary,
    compute_infer_summary: Summary,
    compute_output_summary: Summary,
}

impl Handles {
    fn new(labels: &[(&'static str, String)], cached: bool) -> Handles {
        let config = config::current();
        let latency = |family: &series::Family| {
            if config.counter_latencies {
                series::counter(family, labels)
            } else {
                Counter::noop()
            }
        };
        let summary = |family: &series::Family| {
            if config.summary_latencies {
                series::summary(family, labels, &config.summary_quantiles)
            } else {
                Summary::noop()
            }
        };
        Handles {
            success: series::counter(&SUCCESS, labels),
            inference_count: series::counter(&INFERENCE_COUNT, labels),
            exec_count: series::counter(&EXEC_COUNT, labels),
            request_us: latency(&REQUEST_DURATION),
            queue_us: latency(&QUEUE_DURATION),
            compute_input_us: latency(&COMPUTE_INPUT_DURATION),
            compute_infer_us: latency(&COMPUTE_INFER_DURATION),
            compute_output_us: latency(&COMPUTE_OUTPUT_DURATION),
            request_summary: if cached {
                Summary::noop()
            } else {
                summary(&REQUEST_SUMMARY)
            },
            queue_summary: summary(&QUEUE_SUMMARY),
            compute_input_summary: summary(&COMPUTE_INPUT_SUMMARY),
            compute_infer_summary: summary(&COMPUTE_INFER_SUMMARY),
            compute_output_summary: summary(&COMPUTE_OUTPUT_SUMMARY),
        }
    }
}

/// Statistics of one model version.
pub struct ModelStats {
    model: String,
    version: String,
    totals: Mutex<Totals>,
    /// What ran on CPU instances (series without `gpu_uuid`).
    cpu: Handles,
    /// What ran on each GPU, by CUDA ordinal (series with its `gpu_uuid`).
    gpus: Vec<(i32, Handles)>,
    failures: [Counter; 4],
    pending: Gauge,
    load_secs: Gauge,
    /// The response-cache series, for versions whose responses are cached.
    cache: Option<CacheHandles>,
}

/// Triton's per-model response-cache counters (hits and misses, and their µs).
struct CacheHandles {
    hits: Counter,
    hit_us: Counter,
    misses: Counter,
    miss_us: Counter,
    /// With `summary_latencies`: the hits' and the misses' µs.
    hit_summary: Summary,
    miss_summary: Summary,
}

impl CacheHandles {
    fn new(labels: &[(&'static str, String)]) -> CacheHandles {
        let config = config::current();
        let summary = |family: &series::Family| {
            if config.summary_latencies {
                series::summary(family, labels, &config.summary_quantiles)
            } else {
                Summary::noop()
            }
        };
        CacheHandles {
            hits: series::counter(&CACHE_HITS, labels),
            hit_us: series::counter(&CACHE_HIT_DURATION, labels),
            misses: series::counter(&CACHE_MISSES, labels),
            miss_us: series::counter(&CACHE_MISS_DURATION, labels),
            hit_summary: summary(&CACHE_HIT_SUMMARY),
            miss_summary: summary(&CACHE_MISS_SUMMARY),
        }
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

impl ModelStats {
    /// Statistics of a version whose instances all run on CPU.
    pub fn new(model: &str, version: i64) -> ModelStats {
        ModelStats::with_gpus(model, version, &[], false)
    }

    /// Statistics of a version with instances on `gpus` (CUDA ordinal and UUID) too.
    /// `cached`: its responses go to the response cache, which adds the cache series and, as in
    /// Triton, leaves out the request summary (hits would read as impossibly fast executions).
    pub fn with_gpus(
        model: &str,
        version: i64,
        gpus: &[(i32, String)],
        cached: bool,
    ) -> ModelStats {
        let version = version.to_string();
        let labels = [("model", model.to_string()), ("version", version.clone())];
        // Labels in Triton's order (alphabetical), as its exporter writes them.
        let failure = |reason: FailureReason| {
            let labels = [
                ("model", model.to_string()),
                ("reason", reason.label().to_string()),
                ("version", version.clone()),
            ];
            series::counter(&FAILURE, &labels)
        };
        let gpus = gpus
            .iter()
            .map(|(id, uuid)| {
                let mut labels = labels.to_vec();
                labels.push(("gpu_uuid", uuid.clone()));
                (*id, Handles::new(&labels, cached))
            })
            .collect();
        ModelStats {
            model: model.to_string(),
            version: version.clone(),
            totals: Mutex::new(Totals::default()),
            cpu: Handles::new(&labels, cached),
            gpus,
            failures: [
                failure(FailureReason::Rejected),
                failure(FailureReason::Canceled),
                failure(FailureReason::Backend),
                failure(FailureReason::Other),
            ],
            pending: series::gauge(&PENDING, &labels),
            load_secs: series::gauge(&LOAD_DURATION, &labels),
            cache: cached.then(|| CacheHandles::new(&labels)),
        }
    }

    /// A request answered from the response cache: a success that ran nothing (no inference or
    /// compute time); it waited `queue` before the lookup (Triton counts that as queued) and
    /// spent `lookup` finding the entry.
    pub fn record_cache_hit(&self, total: Duration, queue: Duration, lookup: Duration) {
        {
            let mut totals = self.totals();
            totals.last_inference_ms = now_ms();
            totals.success.add(total);
            totals.queue.add(queue);
            totals.cache_hit.add(lookup);
            totals.request_latency.record(micros(total));
            totals.queue_latency.record(micros(queue));
        }
        self.cpu.success.increment(1);
        self.cpu.request_us.increment(micros(total));
        self.cpu.queue_us.increment(micros(queue));
        self.cpu.queue_summary.record(micros(queue) as f64);
        if let Some(cache) = &self.cache {
            cache.hits.increment(1);
            cache.hit_us.increment(micros(lookup));
            cache.hit_summary.record(micros(lookup) as f64);
        }
    }

    /// A request the response cache did not hold: `spent` looking it up and storing its outputs.
    pub fn record_cache_miss(&self, spent: Duration) {
        self.totals().cache_miss.add(spent);
        if let Some(cache) = &self.cache {
            cache.misses.increment(1);
            cache.miss_us.increment(micros(spent));
            cache.miss_summary.record(micros(spent) as f64);
        }
    }

    /// The series of the device that ran an execution (`gpu`: its CUDA ordinal).
    fn device(&self, gpu: Option<i32>) -> &Handles {
        gpu.and_then(|id| self.gpus.iter().find(|(g, _)| *g == id))
            .map_or(&self.cpu, |(_, handles)| handles)
    }

    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Requests waiting in the queue.
    pub fn set_pending(&self, pending: usize) {
        self.pending.set(pending as f64);
    }

    /// Requests waiting: `change` more (fewer, when negative) in one of the version's queues
    /// (a stateful Python model has one per instance).
    pub fn add_pending(&self, change: f64) {
        self.pending.increment(change);
    }

    /// How long loading this version took (its sessions and instances).
    pub fn record_load(&self, duration: Duration) {
        self.load_secs.set(duration.as_secs_f64());
    }

    /// One execution of a batch of `batch_size` rows, on GPU `gpu` or (`None`) on CPU.
    pub fn record_execution(&self, batch_size: usize, times: ComputeTimes, gpu: Option<i32>) {
        {
            let mut totals = self.totals();
            totals.execution_count += 1;
            let entry = totals.batches.entry(batch_size as u64).or_default();
            entry[0].add(times.input);
            entry[1].add(times.infer);
            entry[2].add(times.output);
        }
        self.device(gpu).exec_count.increment(1);
    }

    /// One request answered successfully: `rows` inferences, `total` end to end.
    pub fn record_success(&self, rows: usize, total: Duration, timing: Timing) {
        let Timing {
            queue,
            compute: times,
            gpu,
        } = timing;
        {
            let mut totals = self.totals();
            totals.last_inference_ms = now_ms();
            totals.inference_count += rows as u64;
            totals.success.add(total);
            totals.queue.add(queue);
            totals.compute_input.add(times.input);
            totals.compute_infer.add(times.infer);
            totals.compute_output.add(times.output);
            totals.request_latency.record(micros(total));
            totals.queue_latency.record(micros(queue));
        }
        let h = self.device(gpu);
        h.success.increment(1);
        h.inference_count.increment(rows as u64);
        h.request_us.increment(micros(total));
        h.queue_us.increment(micros(queue));
        h.compute_input_us.increment(micros(times.input));
        h.compute_infer_us.increment(micros(times.infer));
        h.compute_output_us.increment(micros(times.output));
        h.request_summary.record(micros(total) as f64);
        h.queue_summary.record(micros(queue) as f64);
        h.compute_input_summary.record(micros(times.input) as f64);
        h.compute_infer_summary.record(micros(times.infer) as f64);
        h.compute_output_summary.record(micros(times.output) as f64);
    }

    /// One request that failed after its model was found.
    pub fn record_failure(&self, total: Duration, reason: FailureReason) {
        {
            let mut totals = self.totals();
            totals.last_inference_ms = now_ms();
            totals.fail.add(total);
        }
        let index = match reason {
            FailureReason::Rejected => 0,
            FailureReason::Canceled => 1,
            FailureReason::Backend => 2,
            FailureReason::Other => 3,
        };
        self.failures[index].increment(1);
        self.cpu.request_us.increment(micros(total));
    }

    /// Cumulative histograms of successful requests' end-to-end and queue times (buckets of
    /// [`latency::BOUNDS_US`]).
    pub fn latencies(&self) -> (latency::LatencyHistogram, latency::LatencyHistogram) {
        let totals = self.totals();
        (totals.request_latency.clone(), totals.queue_latency.clone())
    }

    /// Triton's `ModelStatistics` message for this version.
    pub fn snapshot(&self) -> ModelStatistics {
        let totals = self.totals();
        ModelStatistics {
            name: self.model.clone(),
            version: self.version.clone(),
            last_inference: totals.last_inference_ms,
            inference_count: totals.inference_count,
            execution_count: totals.execution_count,
            inference_stats: Some(InferStatistics {
                success: totals.success.proto(),
                fail: totals.fail.proto(),
                queue: totals.queue.proto(),
                compute_input: totals.compute_input.proto(),
                compute_infer: totals.compute_infer.proto(),
                compute_output: totals.compute_output.proto(),
                cache_hit: totals.cache_hit.proto(),
                cache_miss: totals.cache_miss.proto(),
            }),
            batch_stats: totals
                .batches
                .iter()
                .map(
                    |(&batch_size, [input, infer, output])| InferBatchStatistics {
                        batch_size,
                        compute_input: input.proto(),
                        compute_infer: infer.proto(),
                        compute_output: output.proto(),
                    },
                )
                .collect(),
            memory_usage: Vec::new(),
            response_stats: Default::default(),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn idle_versions_report_zeros() {
        let stats = ModelStats::new("m", 3).snapshot();
        assert_eq!((stats.name.as_str(), stats.version.as_str()), ("m", "3"));
        assert_eq!(
            (
                stats.inference_count,
                stats.execution_count,
                stats.last_inference
            ),
            (0, 0, 0)
        );
        let inference = stats.inference_stats.unwrap();
        assert_eq!(inference.success.unwrap().count, 0);
        assert!(stats.batch_stats.is_empty());
    }

    #[test]
    fn requests_and_executions_are_counted_separately() {
        let stats = ModelStats::new("m", 1);
        let times = ComputeTimes {
            input: MS,
            infer: 2 * MS,
            output: MS,
        };
        // One execution of a batch of 3 rows serving two requests (1 + 2 rows).
        stats.record_execution(3, times, None);
        let timing = |queue, gpu| Timing {
            queue,
            compute: times,
            gpu,
        };
        stats.record_success(1, 5 * MS, timing(MS, None));
        stats.record_success(2, 6 * MS, timing(2 * MS, Some(0)));
        stats.record_failure(MS, FailureReason::Rejected);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.inference_count, 3);
        assert_eq!(snapshot.execution_count, 1);
        assert!(snapshot.last_inference > 0);
        let inference = snapshot.inference_stats.unwrap();
        assert_eq!(
            inference.success.unwrap(),
            StatisticDuration {
                count: 2,
                ns: 11_000_000
            }
        );
        assert_eq!(
            inference.fail.unwrap(),
            StatisticDuration {
                count: 1,
                ns: 1_000_000
            }
        );
        assert_eq!(
            inference.queue.unwrap(),
            StatisticDuration {
                count: 2,
                ns: 3_000_000
            }
        );
        assert_eq!(
            inference.compute_infer.unwrap(),
            StatisticDuration {
                count: 2,
                ns: 4_000_000
            }
        );
        assert_eq!(snapshot.batch_stats.len(), 1);
        let batch = &snapshot.batch_stats[0];
        assert_eq!(batch.batch_size, 3);
        assert_eq!(
            batch.compute_infer.unwrap(),
            StatisticDuration {
                count: 1,
                ns: 2_000_000
            }
        );
    }

    #[test]
    fn successes_and_cache_hits_feed_the_latency_histograms_and_failures_do_not() {
        let stats = ModelStats::new("m", 1);
        let timing = Timing::queued(Duration::from_micros(12));
        stats.record_success(1, Duration::from_micros(120), timing);
        stats.record_cache_hit(MS, Duration::from_micros(5), Duration::from_micros(1));
        stats.record_failure(10 * MS, FailureReason::Other);
        let (request, queue) = stats.latencies();
        let bucket = |us: u64| latency::BOUNDS_US.partition_point(|&b| b < us);
        assert_eq!(request.counts()[bucket(120)], 1);
        assert_eq!(request.counts()[bucket(1_000)], 1);
        assert_eq!(request.counts().iter().sum::<u64>(), 2);
        assert_eq!(queue.counts()[bucket(12)], 1);
        assert_eq!(queue.counts()[bucket(5)], 1);
    }

    #[test]
    fn batch_stats_are_sorted_by_size() {
        let stats = ModelStats::new("m", 1);
        for size in [4, 1, 2, 4] {
            stats.record_execution(size, ComputeTimes::default(), None);
        }
        let sizes: Vec<(u64, u64)> = stats
            .snapshot()
            .batch_stats
            .iter()
            .map(|b| (b.batch_size, b.compute_infer.unwrap().count))
            .collect();
        assert_eq!(sizes, vec![(1, 1), (2, 1), (4, 2)]);
    }
}
