//! Metrics that models make themselves: Triton's custom metrics API for Python models
//! (`pb_utils.MetricFamily(name, description, kind)`, `family.Metric(labels)`, `increment`,
//! `set`). A model's process sends each change to kiln, which keeps the values here and adds
//! them to `/metrics` (counters and gauges as Prometheus counters and gauges, `f64` values, the
//! labels the model gave).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// What a family counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One change a model sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A series that exists from now on (at 0 until changed).
    Create,
    Increment(f64),
    Set(f64),
}

#[derive(Debug)]
struct Family {
    kind: Kind,
    description: String,
    /// By their sorted labels.
    series: BTreeMap<Vec<(String, String)>, f64>,
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
/// counter set or decreased, a value that is not finite: nothing changes then.
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
    if let Change::Increment(v) | Change::Set(v) = change {
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
    match (kind, change) {
        (Kind::Counter, Change::Increment(v)) if *v < 0.0 => Err(format!(
            "counter '{name}' can only be incremented by a non-negative value"
        )),
        (Kind::Counter, Change::Set(_)) => Err(format!("counter '{name}' cannot be set")),
        (_, Change::Create) => {
            family.series.entry(key).or_insert(0.0);
            Ok(())
        }
        (_, Change::Increment(v)) => {
            *family.series.entry(key).or_insert(0.0) += v;
            Ok(())
        }
        (Kind::Gauge, Change::Set(v)) => {
            family.series.insert(key, *v);
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
        };
        let help = family
            .description
            .replace('\\', "\\\\")
            .replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in &family.series {
            let labels: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}=\"{}\"", super::histogram::escape(value)))
                .collect();
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", labels.join(","))
            };
            let _ = writeln!(out, "{name}{labels} {value}");
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
            &Change::Create,
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
            &Change::Create
        )
        .is_err());
        let mut text = String::new();
        render(&mut text);
        assert!(text.contains("test_refusals_total 1\n"), "{text}");
        assert!(!text.contains("1bad") && !text.contains("bad-name"));
    }
}
