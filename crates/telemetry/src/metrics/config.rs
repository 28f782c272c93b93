//! `--metrics-config`: which latency series are published, as Triton's settings.
//!
//! - `counter_latencies=<bool>` (default true): the cumulative `nv_inference_*_duration_us`
//!   counters.
//! - `summary_latencies=<bool>` (default false): the summaries `nv_inference_request_summary_us`,
//!   `nv_inference_queue_summary_us` and `nv_inference_compute_{input,infer,output}_summary_us`.
//! - `summary_quantiles=<q>:<error>,...` (default `0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,
//!   0.999:0.001`): the quantiles those summaries report. The error is checked, then left to the
//!   exporter, whose sketch keeps every quantile within about 1 % of the true value.
//!
//! - `histogram_latencies=<bool>` (default false): the first-response histogram of decoupled
//!   (generation) models, `nv_inference_first_response_histogram_ms` (see [`super::histogram`]).
//!
//! Triton ignores settings it does not know and values it cannot read; kiln refuses them, naming
//! the setting.

use std::sync::OnceLock;

/// The latency series to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `counter_latencies`.
    pub counter_latencies: bool,
    /// `summary_latencies`.
    pub summary_latencies: bool,
    /// `summary_quantiles`, without their error bounds.
    pub summary_quantiles: Vec<f64>,
    /// `histogram_latencies`.
    pub histogram_latencies: bool,
}

impl Default for MetricsConfig {
    fn default() -> MetricsConfig {
        MetricsConfig {
            counter_latencies: true,
            summary_latencies: false,
            summary_quantiles: vec![0.5, 0.9, 0.95, 0.99, 0.999],
            histogram_latencies: false,
        }
    }
}

impl MetricsConfig {
    /// Reads the `--metrics-config <setting>=<value>` flags; a setting given twice keeps the last.
    ///
    /// # Errors
    /// A message naming the flag that is not understood.
    pub fn from_flags(values: &[String]) -> Result<MetricsConfig, String> {
        let mut config = MetricsConfig::default();
        for value in values {
            let bad = |why: &str| format!("--metrics-config {value}: {why}");
            let (key, text) = value
                .split_once('=')
                .ok_or_else(|| bad("expected <setting>=<value>"))?;
            match key {
                "counter_latencies" => config.counter_latencies = parse_bool(text).map_err(bad)?,
                "summary_latencies" => config.summary_latencies = parse_bool(text).map_err(bad)?,
                "summary_quantiles" => config.summary_quantiles = quantiles(text).map_err(bad)?,
                "histogram_latencies" => {
                    config.histogram_latencies = parse_bool(text).map_err(bad)?
                }
                _ => {
                    return Err(bad(
                        "unknown setting (known: counter_latencies, summary_latencies, \
                         summary_quantiles, histogram_latencies)",
                    ))
                }
            }
        }
        Ok(config)
    }
}

fn parse_bool(text: &str) -> Result<bool, &'static str> {
    crate::core::parse_bool(text.trim()).ok_or("expected true or false")
}

/// `<quantile>:<error>,...`, each quantile in [0, 1] and each error in (0, 1).
fn quantiles(text: &str) -> Result<Vec<f64>, &'static str> {
    const FORM: &str =
        "expected <quantile>:<error>,... with quantiles in [0, 1] and errors in (0, 1)";
    let mut quantiles = Vec::new();
    for pair in text.split(',') {
        let (quantile, error) = pair.split_once(':').ok_or(FORM)?;
        let quantile: f64 = quantile.trim().parse().map_err(|_| FORM)?;
        let error: f64 = error.trim().parse().map_err(|_| FORM)?;
        if !((0.0..=1.0).contains(&quantile) && error > 0.0 && error < 1.0) {
            return Err(FORM);
        }
        quantiles.push(quantile);
    }
    Ok(quantiles)
}

static CONFIG: OnceLock<MetricsConfig> = OnceLock::new();

/// Sets the process's metrics config; the first call wins. It must come before the recorder is
/// installed and before any model registers its series.
pub fn configure(config: MetricsConfig) {
    if CONFIG.set(config).is_err() {
        tracing::debug!("the metrics config was set already; keeping the first");
    }
}

/// The process's metrics config (the defaults when [`configure`] was not called).
pub fn current() -> &'static MetricsConfig {
    CONFIG.get_or_init(MetricsConfig::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(values: &[&str]) -> Result<MetricsConfig, String> {
        MetricsConfig::from_flags(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_are_tritons() {
        let config = flags(&[]).unwrap();
        assert!(config.counter_latencies && !config.summary_latencies);
        assert!(!config.histogram_latencies);
        assert_eq!(config.summary_quantiles, [0.5, 0.9, 0.95, 0.99, 0.999]);
    }

    #[test]
    fn settings_are_read_and_the_last_wins() {
        let config = flags(&[
            "summary_latencies=true",
            "counter_latencies=false",
            "summary_quantiles=0.5:0.05,0.99:0.001",
            "summary_latencies=1",
            "histogram_latencies=true",
            "histogram_latencies=false",
        ])
        .unwrap();
        assert!(config.summary_latencies && !config.counter_latencies);
        assert!(!config.histogram_latencies);
        assert!(
            flags(&["histogram_latencies=on"])
                .unwrap()
                .histogram_latencies
        );
        assert_eq!(config.summary_quantiles, [0.5, 0.99]);
    }

    #[test]
    fn what_is_not_understood_is_refused_by_name() {
        for (value, needle) in [
            ("summary_latencies", "expected <setting>=<value>"),
            ("summary_latencies=maybe", "expected true or false"),
            ("summary_quantiles=2:0.1", "quantiles in [0, 1]"),
            ("summary_quantiles=0.5", "quantiles in [0, 1]"),
            ("summary_quantiles=0.5:0", "errors in (0, 1)"),
            ("summary_quantiles=", "expected <quantile>"),
            ("histogram_latencies=2", "expected true or false"),
            ("summary_max_age=100", "unknown setting"),
        ] {
            let error = flags(&[value]).unwrap_err();
            assert!(
                error.starts_with(&format!("--metrics-config {value}: ")),
                "{error}"
            );
            assert!(error.contains(needle), "{value}: {error}");
        }
    }
}
