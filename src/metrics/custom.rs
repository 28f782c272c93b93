//! Metrics that models make themselves: Triton's custom metrics API for Python models
//! (`pb_utils.MetricFamily(name, description, kind)`, `family.Metric(labels, buckets)`,
//! `increment`, `set`, `observe`). A model's process sends each change to kiln, which keeps the
//! values here and adds them to `/metrics` (counters, gauges and histograms as Prometheus', `f64`
//! values, the labels the model gave).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// The most buckets a histogram may have (a model's bound, not Prometheus').
pub const MAX_BUCKETS: usize = 256;

/// What a family counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One change a model sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A series that exists from now on (at 0 until changed); a histogram's with its buckets'
    /// upper bounds, increasing.
    Create {
        buckets: Vec<f64>,
    },
    Increment(f64),
    Set(f64),
    /// One observation of a histogram.
    Observe(f64),
}

/// One series' value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Number(f64),
    Histogram {
        /// Upper bounds, increasing (`+Inf` implied).
        bounds: Vec<f64>,
        /// Observations at or under each bound (not cumulative).
        counts: Vec<u64>,
        count: u64,
        sum: f64,
    },
}

#[derive(Debug)]
struct Family {
    kind: Kind,
    description: String,
    /// By their sorted labels.
    series: BTreeMap<Vec<(String, String)>, Value>,
}

static FAMILIES: Mutex<BTreeMap<String, Family>> = Mutex::new(BTreeMap::new());

/// Whether `name` is a Prometheus metric name.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Applies one change to the series `labels` of family `name`.
///
/// # Errors
/// A name that is not Prometheus', a family that exists with another kind or description, a
/// counter set or decreased, a histogram set, incremented or made without increasing finite
/// buckets (at most [`MAX_BUCKETS`]), an observation of a series that is not a histogram's, a
/// value that is not finite: nothing changes then.
pub fn apply(
    name: &str,
    description: &str,
    kind: Kind,
    labels: &[(String, String)],
    change: &Change,
) -> Result<(), String> {
    if !valid_name(name) || labels.iter().any(|(key, _)| !valid_name(key)) {
        return Err(format!(
            "'{name}' (or one of its labels) is not a metric name"
        ));
    }
    if let Change::Increment(v) | Change::Set(v) | Change::Observe(v) = change {
        if !v.is_finite() {
            return Err(format!("metric '{name}': {v} is not a finite value"));
        }
    }
    let mut families = FAMILIES.lock().unwrap_or_else(|e| e.into_inner());
    let family = families.entry(name.to_string()).or_insert_with(|| Family {
        kind,
        description: description.to_string(),
        series: BTreeMap::new(),
    });
    if family.kind != kind || family.description != description {
        return Err(format!(
            "metric family '{name}' exists with another kind or description"
        ));
    }
    let mut key = labels.to_vec();
    key.sort();
    let zero = || Value::Number(0.0);
    match (kind, change) {
        (Kind::Counter, Change::Increment(v)) if *v < 0.0 => Err(format!(
            "counter '{name}' can only be incremented by a non-negative value"
        )),
        (Kind::Counter, Change::Set(_)) => Err(format!("counter '{name}' cannot be set")),
        (Kind::Histogram, Change::Create { buckets }) => {
            let increasing = buckets.windows(2).all(|pair| pair[0] < pair[1]);
            if buckets.len() > MAX_BUCKETS || !increasing || buckets.iter().any(|b| !b.is_finite())
            {
                return Err(format!(
                    "histogram '{name}' needs at most {MAX_BUCKETS} increasing, finite buckets"
                ));
            }
            family
                .series
                .entry(key)
                .or_insert_with(|| Value::Histogram {
                    bounds: buckets.clone(),
                    counts: vec![0; buckets.len()],
                    count: 0,
                    sum: 0.0,
                });
            Ok(())
        }
        (Kind::Histogram, Change::Observe(v)) => match family.series.get_mut(&key) {
            Some(Value::Histogram {
                bounds,
                counts,
                count,
                sum,
            }) => {
                if let Some(bucket) = bounds.iter().position(|bound| v <= bound) {
                    counts[bucket] += 1;
                }
                *count += 1;
                *sum += v;
                Ok(())
            }
            _ => Err(format!("histogram '{name}' has no such series")),
        },
        (Kind::Histogram, _) => Err(format!("histogram '{name}' can only observe values")),
        (_, Change::Observe(_)) => Err(format!("'{name}' is not a histogram")),
        (_, Change::Create { .. }) => {
            family.series.entry(key).or_insert_with(zero);
            Ok(())
        }
        (_, Change::Increment(v)) => {
            if let Value::Number(total) = family.series.entry(key).or_insert_with(zero) {
                *total += v;
            }
            Ok(())
        }
        (Kind::Gauge, Change::Set(v)) => {
            family.series.insert(key, Value::Number(*v));
            Ok(())
        }
    }
}

/// Appends every family to `out`, in Prometheus' text format.
pub fn render(out: &mut String) {
    let families = FAMILIES.lock().unwrap_or_else(|e| e.into_inner());
    render_families(&families, out);
}

fn render_families(families: &BTreeMap<String, Family>, out: &mut String) {
    for (name, family) in families {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let kind = match family.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let help = family
            .description
            .replace('\\', "\\\\")
            .replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in &family.series {
            let pairs: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}=\"{}\"", super::series::escape(value)))
                .collect();
            let with = |extra: Option<String>| {
                let all: Vec<&String> = pairs.iter().chain(extra.as_ref()).collect();
                if all.is_empty() {
                    String::new()
                } else {
                    let joined: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
                    format!("{{{}}}", joined.join(","))
                }
            };
            match value {
                Value::Number(value) => {
                    let _ = writeln!(out, "{name}{} {value}", with(None));
                }
                Value::Histogram {
                    bounds,
                    counts,
                    count,
                    sum,
                } => {
                    let mut cumulative = 0;
                    for (bound, n) in bounds.iter().zip(counts) {
                        cumulative += n;
                        let le = Some(format!("le=\"{bound}\""));
                        let _ = writeln!(out, "{name}_bucket{} {cumulative}", with(le));
                    }
                    let inf = Some("le=\"+Inf\"".to_string());
                    let _ = writeln!(out, "{name}_bucket{} {count}", with(inf));
                    let _ = writeln!(out, "{name}_sum{} {sum}", with(None));
                    let _ = writeln!(out, "{name}_count{} {count}", with(None));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn counters_and_gauges_render_in_prometheus_text() {
        // The registry is the process's: names here are this test's own.
        let model = labels(&[("model", "m\"1"), ("b", "x")]);
        apply(
            "test_custom_total",
            "Requests seen",
            Kind::Counter,
            &model,
            &Change::Create {
                buckets: Vec::new(),
            },
        )
        .unwrap();
        apply(
            "test_custom_total",
            "Requests seen",
            Kind::Counter,
            &model,
            &Change::Increment(1.5),
        )
        .unwrap();
        let reordered = labels(&[("b", "x"), ("model", "m\"1")]);
        apply(
            "test_custom_total",
            "Requests seen",
            Kind::Counter,
            &reordered,
            &Change::Increment(2.0),
        )
        .unwrap();
        apply(
            "test_custom_gauge",
            "Depth",
            Kind::Gauge,
            &[],
            &Change::Set(-3.0),
        )
        .unwrap();
        let mut text = String::from("existing 1");
        render(&mut text);
        assert!(text.contains(
            "existing 1\n# HELP test_custom_gauge Depth\n# TYPE test_custom_gauge gauge\ntest_custom_gauge -3\n"
        ), "{text}");
        assert!(text.contains(
            "# TYPE test_custom_total counter\ntest_custom_total{b=\"x\",model=\"m\\\"1\"} 3.5\n"
        ), "{text}");
    }

    #[test]
    fn what_prometheus_or_triton_refuses_changes_nothing() {
        let none: &[(String, String)] = &[];
        apply(
            "test_refusals_total",
            "c",
            Kind::Counter,
            none,
            &Change::Increment(1.0),
        )
        .unwrap();
        for (name, kind, change) in [
            (
                "test_refusals_total",
                Kind::Counter,
                Change::Increment(-1.0),
            ),
            ("test_refusals_total", Kind::Counter, Change::Set(5.0)),
            ("test_refusals_total", Kind::Gauge, Change::Set(5.0)),
            (
                "test_refusals_total",
                Kind::Counter,
                Change::Increment(f64::NAN),
            ),
            ("1bad", Kind::Gauge, Change::Set(1.0)),
            ("bad-name", Kind::Gauge, Change::Set(1.0)),
        ] {
            assert!(
                apply(name, "c", kind, none, &change).is_err(),
                "{name} {change:?}"
            );
        }
        assert!(apply(
            "test_refusals_total",
            "other help",
            Kind::Counter,
            none,
            &Change::Create {
                buckets: Vec::new()
            }
        )
        .is_err());
        let mut text = String::new();
        render(&mut text);
        assert!(text.contains("test_refusals_total 1\n"), "{text}");
        assert!(!text.contains("1bad") && !text.contains("bad-name"));
    }

    #[test]
    fn histograms_count_in_their_buckets_and_refuse_the_rest() {
        let series = labels(&[("model", "m")]);
        let apply = |change: Change| {
            apply(
                "test_histogram:seconds",
                "Times",
                Kind::Histogram,
                &series,
                &change,
            )
        };
        assert!(apply(Change::Observe(1.0)).is_err(), "no series yet");
        apply(Change::Create {
            buckets: vec![0.5, 2.0],
        })
        .unwrap();
        for v in [0.25, 0.5, 1.0, 9.0] {
            apply(Change::Observe(v)).unwrap();
        }
        for refused in [
            Change::Increment(1.0),
            Change::Set(1.0),
            Change::Observe(f64::INFINITY),
            Change::Create {
                buckets: vec![2.0, 1.0],
            },
        ] {
            assert!(apply(refused.clone()).is_err(), "{refused:?}");
        }
        let other = labels(&[("model", "n")]);
        assert!(super::apply(
            "test_histogram:seconds",
            "Times",
            Kind::Histogram,
            &other,
            &Change::Create {
                buckets: vec![f64::NAN]
            }
        )
        .is_err());
        let mut text = String::new();
        render(&mut text);
        assert!(
            text.contains(
                "# TYPE test_histogram:seconds histogram\n\
                 test_histogram:seconds_bucket{model=\"m\",le=\"0.5\"} 2\n\
                 test_histogram:seconds_bucket{model=\"m\",le=\"2\"} 3\n\
                 test_histogram:seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n\
                 test_histogram:seconds_sum{model=\"m\"} 10.75\n\
                 test_histogram:seconds_count{model=\"m\"} 4\n"
            ),
            "{text}"
        );
        assert!(super::apply(
            "test_histogram:seconds",
            "Times",
            Kind::Gauge,
            &series,
            &Change::Set(1.0)
        )
        .is_err());
    }
}
