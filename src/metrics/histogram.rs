//! Triton's first-response histogram, `nv_inference_first_response_histogram_ms` (labels `model`,
//! `version`): from a request's arrival to its first response, in milliseconds, for decoupled
//! (generation) models, published with `--metrics-config histogram_latencies=true`.
//!
//! Its buckets are Triton's (100, 500, 2000, 5000 ms) unless the model's config sets others
//! (`model_metrics { metric_control [ { metric_identifier { family: "..." } histogram_options {
//! buckets: [...] } } ] }`), so each model version may have its own. The Prometheus exporter kiln
//! uses gives every series of one name the same buckets, so these histograms are kept here and
//! appended to its output ([`render`]).

use crate::proto::inference::model_metrics::metric_control::MetricOptions;
use crate::proto::inference::ModelConfig;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The family's name, as Triton spells it.
pub const FIRST_RESPONSE: &str = "nv_inference_first_response_histogram_ms";
const HELP: &str = "Duration from request to first response in milliseconds";

/// Triton's default bucket bounds (ms).
pub const DEFAULT_BUCKETS: &[f64] = &[100.0, 500.0, 2000.0, 5000.0];

/// Most bounds one histogram may have (each is a series on every scrape).
const MAX_BUCKETS: usize = 128;

/// The first-response buckets `config` sets, or Triton's defaults.
///
/// # Errors
/// A family kiln does not publish, a setting that is not a histogram's, or bounds that are not
/// finite and increasing.
pub fn first_response_buckets(config: &ModelConfig) -> Result<Vec<f64>, String> {
    let model = &config.name;
    let mut buckets = DEFAULT_BUCKETS.to_vec();
    let Some(metrics) = &config.model_metrics else {
        return Ok(buckets);
    };
    for control in &metrics.metric_control {
        let family = control
            .metric_identifier
            .as_ref()
            .map_or("", |id| id.family.as_str());
        let bad = |why: String| format!("model_metrics of model '{model}': {why}");
        if family != FIRST_RESPONSE {
            return Err(bad(format!(
                "metric family '{family}' has no settings (only {FIRST_RESPONSE} has)"
            )));
        }
        let Some(MetricOptions::HistogramOptions(options)) = &control.metric_options else {
            return Err(bad(format!("{FIRST_RESPONSE} needs histogram_options")));
        };
        if options.buckets.len() > MAX_BUCKETS
            || options.buckets.iter().any(|b| !b.is_finite())
            || options.buckets.windows(2).any(|pair| pair[0] >= pair[1])
        {
            return Err(bad(format!(
                "the buckets of {FIRST_RESPONSE} must be at most {MAX_BUCKETS} finite numbers in \
                 increasing order, got {:?}",
                options.buckets
            )));
        }
        buckets.clone_from(&options.buckets);
    }
    Ok(buckets)
}

/// One model version's first-response histogram.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); the last is above every bound.
    counts: Vec<AtomicU64>,
    /// The sum of observations, in µs (whole, so that it can be added atomically).
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Counts one request's time to its first response.
    pub fn observe(&self, elapsed: Duration) {
        let ms = elapsed.as_secs_f64() * 1e3;
        let bucket = self.bounds.partition_point(|&bound| bound < ms);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }
}

struct Series {
    model: String,
    version: String,
    histogram: Arc<Histogram>,
}

static SERIES: Mutex<Vec<Series>> = Mutex::new(Vec::new());

/// The histogram of `model` `version` with `bounds`: the one registered before when its bounds
/// are the same (a reload keeps counting), else a new one in its place.
pub fn register(model: &str, version: i64, bounds: &[f64]) -> Arc<Histogram> {
    let version = version.to_string();
    let mut series = SERIES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = series
        .iter_mut()
        .find(|s| s.model == model && s.version == version)
    {
        if found.histogram.bounds != bounds {
            found.histogram = Arc::new(Histogram::new(bounds));
        }
        return Arc::clone(&found.histogram);
    }
    let histogram = Arc::new(Histogram::new(bounds));
    series.push(Series {
        model: model.to_string(),
        version,
        histogram: Arc::clone(&histogram),
    });
    histogram
}

/// Appends the histograms registered so far to `out`, in Prometheus' text format.
pub fn render(out: &mut String) {
    let series = SERIES.lock().unwrap_or_else(|e| e.into_inner());
    render_series(&series, out);
}

fn render_series(series: &[Series], out: &mut String) {
    if series.is_empty() {
        return;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(out, "# HELP {FIRST_RESPONSE} {HELP}");
    let _ = writeln!(out, "# TYPE {FIRST_RESPONSE} histogram");
    for s in series {
        let labels = format!(
            "model=\"{}\",version=\"{}\"",
            escape(&s.model),
            escape(&s.version)
        );
        let mut cumulative = 0;
        for (index, count) in s.histogram.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = match s.histogram.bounds.get(index) {
                Some(bound) => bound.to_string(),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(
                out,
                "{FIRST_RESPONSE}_bucket{{{labels},le=\"{le}\"}} {cumulative}"
            );
        }
        let sum_ms = s.histogram.sum_us.load(Ordering::Relaxed) as f64 / 1e3;
        let _ = writeln!(out, "{FIRST_RESPONSE}_sum{{{labels}}} {sum_ms}");
        let _ = writeln!(out, "{FIRST_RESPONSE}_count{{{labels}}} {cumulative}");
    }
}

/// A label value as Prometheus' text format quotes it.
pub(super) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::config::parse_config;

    fn buckets(text: &str) -> Result<Vec<f64>, String> {
        let mut config = parse_config(text).unwrap();
        config.name = "m".into();
        first_response_buckets(&config)
    }

    #[test]
    fn buckets_are_tritons_unless_the_config_sets_them() {
        assert_eq!(buckets("").unwrap(), DEFAULT_BUCKETS);
        let set = r#"model_metrics { metric_control [ {
            metric_identifier { family: "nv_inference_first_response_histogram_ms" }
            histogram_options { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }"#;
        assert_eq!(buckets(set).unwrap(), [-1.0, 0.0, 1.0, 2.5]);
        let empty = set.replace("[ -1, 0.0, 1, 2.5 ]", "[ ]");
        assert_eq!(buckets(&empty).unwrap(), Vec::<f64>::new());
    }

    #[test]
    fn bad_model_metrics_are_refused() {
        for (text, needle) in [
            (
                r#"model_metrics { metric_control [ { metric_identifier { family: "nv_inference_count" }
                   histogram_options { buckets: [ 1 ] } } ] }"#,
                "metric family 'nv_inference_count' has no settings",
            ),
            (
                r#"model_metrics { metric_control [ {
                   metric_identifier { family: "nv_inference_first_response_histogram_ms" } } ] }"#,
                "needs histogram_options",
            ),
            (
                r#"model_metrics { metric_control [ {
                   metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                   histogram_options { buckets: [ 5, 1 ] } } ] }"#,
                "increasing order, got [5.0, 1.0]",
            ),
        ] {
            let error = buckets(text).unwrap_err();
            assert!(error.starts_with("model_metrics of model 'm': "), "{error}");
            assert!(error.contains(needle), "{error}");
        }
    }

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let histogram = Arc::new(Histogram::new(&[1.0, 10.0, 100.0]));
        for ms in [0.5, 1.0, 7.0, 250.0, 3_000.0] {
            histogram.observe(Duration::from_secs_f64(ms / 1e3));
        }
        let series = [Series {
            model: "gen\"x".into(),
            version: "2".into(),
            histogram,
        }];
        let mut out = String::from("# other metrics");
        render_series(&series, &mut out);
        let expected = "# other metrics\n\
            # HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds\n\
            # TYPE nv_inference_first_response_histogram_ms histogram\n\
            nv_inference_first_response_histogram_ms_bucket{model=\"gen\\\"x\",version=\"2\",le=\"1\"} 2\n\
            nv_inference_first_response_histogram_ms_bucket{model=\"gen\\\"x\",version=\"2\",le=\"10\"} 3\n\
            nv_inference_first_response_histogram_ms_bucket{model=\"gen\\\"x\",version=\"2\",le=\"100\"} 3\n\
            nv_inference_first_response_histogram_ms_bucket{model=\"gen\\\"x\",version=\"2\",le=\"+Inf\"} 5\n\
            nv_inference_first_response_histogram_ms_sum{model=\"gen\\\"x\",version=\"2\"} 3258.5\n\
            nv_inference_first_response_histogram_ms_count{model=\"gen\\\"x\",version=\"2\"} 5\n";
        assert_eq!(out, expected);
        let mut nothing = String::new();
        render_series(&[], &mut nothing);
        assert_eq!(nothing, "");
    }

    #[test]
    fn a_reload_keeps_counting_unless_the_buckets_change() {
        let first = register("reloaded", 1, &[1.0]);
        first.observe(Duration::from_millis(2));
        let again = register("reloaded", 1, &[1.0]);
        assert!(Arc::ptr_eq(&first, &again));
        let changed = register("reloaded", 1, &[5.0]);
        assert!(!Arc::ptr_eq(&first, &changed));
        let mut out = String::new();
        render(&mut out);
        assert!(
            out.contains("_bucket{model=\"reloaded\",version=\"1\",le=\"5\"} 0"),
            "{out}"
        );
        assert!(!out.contains("le=\"1\"} 1"), "{out}");
    }
}
