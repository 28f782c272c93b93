//! Metrics that models make themselves: Triton's custom metrics API for Python models
//! (`pb_utils.MetricFamily(name, description, kind)`, `family.Metric(labels, buckets)`,
//! `increment`, `set`, `observe`). A model's process sends each change to kiln, which keeps the
//! values here and adds them to `/metrics` (counters, gauges and histograms as Prometheus', `f64`
//! values, the labels the model gave).
//!
//! A series lives while a model process holds it: from a `Metric`'s creation (or its first
//! change) until every `Metric` object of those labels is gone (`Change::Delete`) or their
//! process ends ([`Owner`]'s drop), so a model's series leave `/metrics` when it unloads.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// A `Metric` object of the series is gone.
    Delete,
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
    /// Who holds each series: owner → its `Metric` objects of those labels (0: it changed the
    /// series without making one).
    holders: BTreeMap<Vec<(String, String)>, BTreeMap<u64, u32>>,
}

static FAMILIES: Mutex<BTreeMap<String, Family>> = Mutex::new(BTreeMap::new());

fn families() -> std::sync::MutexGuard<'static, BTreeMap<String, Family>> {
    FAMILIES.lock().unwrap_or_else(|e| e.into_inner())
}

/// One model process's hold on the series it changes; dropped when the process is gone, it lets
/// go of them all (a series no one holds leaves `/metrics`).
#[derive(Debug)]
pub struct Owner(u64);

impl Owner {
    pub fn new() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for Owner {
    fn default() -> Owner {
        Owner::new()
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let mut families = families();
        for family in families.values_mut() {
            let Family {
                series, holders, ..
            } = family;
            holders.retain(|key, owners| {
                owners.remove(&self.0);
                let held = !owners.is_empty();
                if !held {
                    series.remove(key);
                }
                held
            });
        }
        families.retain(|_, family| !family.series.is_empty());
    }
}

/// Whether `name` is a Prometheus metric name.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Applies `owner`'s change to the series `labels` of family `name`.
///
/// # Errors
/// A name that is not Prometheus', a family that exists with another kind or description, a
/// counter set or decreased, a histogram set, incremented or made without increasing finite
/// buckets (at most [`MAX_BUCKETS`]), an observation of a series that is not a histogram's, a
/// value that is not finite: nothing changes then.
pub fn apply(
    owner: &Owner,
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
    let mut families = families();
    let mut key = labels.to_vec();
    key.sort();
    if let Change::Delete = change {
        if let Some(family) = families.get_mut(name) {
            family.let_go(&key, owner.0);
            if family.series.is_empty() {
                families.remove(name);
            }
        }
        return Ok(());
    }
    let family = families.entry(name.to_string()).or_insert_with(|| Family {
        kind,
        description: description.to_string(),
        series: BTreeMap::new(),
        holders: BTreeMap::new(),
    });
    if family.kind != kind || family.description != description {
        return Err(format!(
            "metric family '{name}' exists with another kind or description"
        ));
    }
    let changed = family.change(name, kind, key.clone(), change);
    if changed.is_ok() && family.series.contains_key(&key) {
        let objects = family.holders.entry(key).or_default().entry(owner.0);
        let objects = objects.or_insert(0);
        if let Change::Create { .. } = change {
            *objects += 1;
        }
    }
    changed
}

impl Family {
    /// One `Metric` object of `owner`'s for `key` is gone: the series goes when no one holds it.
    fn let_go(&mut self, key: &Vec<(String, String)>, owner: u64) {
        let Some(owners) = self.holders.get_mut(key) else {
            return;
        };
        if let Some(objects) = owners.get_mut(&owner) {
            *objects = objects.saturating_sub(1);
            if *objects == 0 {
                owners.remove(&owner);
            }
        }
        if owners.is_empty() {
            self.holders.remove(key);
            self.series.remove(key);
        }
    }

    /// Applies `change` to the series `key` (of a family of `kind`).
    fn change(
        &mut self,
        name: &str,
        kind: Kind,
        key: Vec<(String, String)>,
        change: &Change,
    ) -> Result<(), String> {
        let zero = || Value::Number(0.0);
        match (kind, change) {
            (Kind::Counter, Change::Increment(v)) if *v < 0.0 => Err(format!(
                "counter '{name}' can only be incremented by a non-negative value"
            )),
            (Kind::Counter, Change::Set(_)) => Err(format!("counter '{name}' cannot be set")),
            (Kind::Histogram, Change::Create { buckets }) => {
                let increasing = buckets.windows(2).all(|pair| pair[0] < pair[1]);
                if buckets.len() > MAX_BUCKETS
                    || !increasing
                    || buckets.iter().any(|b| !b.is_finite())
                {
                    return Err(format!(
                        "histogram '{name}' needs at most {MAX_BUCKETS} increasing, finite buckets"
                    ));
                }
                self.series.entry(key).or_insert_with(|| Value::Histogram {
                    bounds: buckets.clone(),
                    counts: vec![0; buckets.len()],
                    count: 0,
                    sum: 0.0,
                });
                Ok(())
            }
            (Kind::Histogram, Change::Observe(v)) => match self.series.get_mut(&key) {
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
                self.series.entry(key).or_insert_with(zero);
                Ok(())
            }
            (_, Change::Increment(v)) => {
                if let Value::Number(total) = self.series.entry(key).or_insert_with(zero) {
                    *total += v;
                }
                Ok(())
            }
            (Kind::Gauge, Change::Set(v)) => {
                self.series.insert(key, Value::Number(*v));
                Ok(())
            }
            (_, Change::Delete) => Ok(()),
        }
    }
}

/// Appends every family to `out`, in Prometheus' text format.
pub fn render(out: &mut String) {
    render_families(&families(), out);
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
        let owner = Owner::new();
        // The registry is the process's: names here are this test's own.
        let model = labels(&[("model", "m\"1"), ("b", "x")]);
        apply(
            &owner,
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
            &owner,
            "test_custom_total",
            "Requests seen",
            Kind::Counter,
            &model,
            &Change::Increment(1.5),
        )
        .unwrap();
        let reordered = labels(&[("b", "x"), ("model", "m\"1")]);
        apply(
            &owner,
            "test_custom_total",
            "Requests seen",
            Kind::Counter,
            &reordered,
            &Change::Increment(2.0),
        )
        .unwrap();
        apply(
            &owner,
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
        let owner = Owner::new();
        let none: &[(String, String)] = &[];
        apply(
            &owner,
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
                apply(&owner, name, "c", kind, none, &change).is_err(),
                "{name} {change:?}"
            );
        }
        assert!(apply(
            &owner,
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
        let owner = Owner::new();
        let series = labels(&[("model", "m")]);
        let apply = |change: Change| {
            apply(
                &owner,
                "test_histogram:seconds",
                "Times",
                Kind::Histogram,
                &series,
                &change,
            )
        };
        assert_eq!(
            apply(Change::Observe(1.0)).unwrap_err(),
            "histogram 'test_histogram:seconds' has no such series"
        );
        apply(Change::Create {
            buckets: vec![0.5, 2.0],
        })
        .unwrap();
        for v in [0.25, 0.5, 1.0, 9.0] {
            apply(Change::Observe(v)).unwrap();
        }
        for (refused, why) in [
            (
                Change::Increment(1.0),
                "histogram 'test_histogram:seconds' can only observe values",
            ),
            (
                Change::Set(1.0),
                "histogram 'test_histogram:seconds' can only observe values",
            ),
            (
                Change::Observe(f64::INFINITY),
                "metric 'test_histogram:seconds': inf is not a finite value",
            ),
            (
                Change::Create {
                    buckets: vec![2.0, 1.0],
                },
                "histogram 'test_histogram:seconds' needs at most 256 increasing, finite buckets",
            ),
        ] {
            assert_eq!(apply(refused.clone()).unwrap_err(), why, "{refused:?}");
        }
        let other = labels(&[("model", "n")]);
        assert!(super::apply(
            &owner,
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
            &owner,
            "test_histogram:seconds",
            "Times",
            Kind::Gauge,
            &series,
            &Change::Set(1.0)
        )
        .is_err());
    }

    #[test]
    fn a_series_lives_while_a_process_holds_a_metric_of_it() {
        let rendered = || {
            let mut text = String::new();
            render(&mut text);
            text
        };
        let create = Change::Create {
            buckets: Vec::new(),
        };
        let (first, second) = (Owner::new(), Owner::new());
        let change = |owner: &Owner, model: &str, change: &Change| {
            let labels = labels(&[("model", model)]);
            apply(
                owner,
                "test_held_total",
                "Held",
                Kind::Counter,
                &labels,
                change,
            )
            .unwrap();
        };
        // Two instances of one model hold its series, one of them with two `Metric`s.
        change(&first, "a", &create);
        change(&first, "a", &create);
        change(&second, "a", &create);
        change(&second, "a", &Change::Increment(2.0));
        change(&second, "b", &Change::Increment(1.0));
        change(&first, "a", &Change::Delete);
        change(&first, "a", &Change::Delete);
        assert!(rendered().contains("test_held_total{model=\"a\"} 2\n"));
        drop(second);
        // Its series go with the last holder; a change makes one again, from 0.
        let text = rendered();
        assert!(!text.contains("test_held_total"), "{text}");
        change(&first, "a", &Change::Increment(1.0));
        assert!(rendered().contains("test_held_total{model=\"a\"} 1\n"));
        drop(first);
        assert!(!rendered().contains("test_held_total"));
    }
}
