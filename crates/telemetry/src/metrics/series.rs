//! The Prometheus series of model versions, which live as long as the versions they measure.
//!
//! Triton keeps one set of series per model version (its `MetricModelReporter`), shared by every
//! copy of that version that is loaded at once (a reload serves the old copy until the new one is
//! ready, so its counters carry on) and removed when the last copy goes: a model unloaded drops
//! out of `/metrics`, and one loaded again counts from 0, as its statistics do. The `metrics`
//! crate's exporter never forgets a series, so these series are kept here instead: the registry
//! holds each one weakly, a handle ([`Counter`], [`Gauge`], [`Summary`], [`Histogram`]) holds it
//! strongly, and [`render`] writes those still held, in the exporter's text format.

use metrics_exporter_prometheus::Distribution;
use metrics_util::Quantile;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A metric family: its name and help text (its kind is the handle's).
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
}

/// A series' labels, in the order they are written.
pub type Labels<'a> = &'a [(&'static str, String)];

/// A summary's window: 3 buckets of 20 s, the exporter's (quantiles over the last minute).
const SUMMARY_BUCKETS: NonZeroU32 = match NonZeroU32::new(3) {
    Some(count) => count,
    None => unreachable!(),
};
const SUMMARY_BUCKET_DURATION: Duration = Duration::from_secs(20);

/// A counter; a no-op one records nothing and is never written.
#[derive(Debug, Clone, Default)]
pub struct Counter(Option<Arc<AtomicU64>>);

impl Counter {
    pub fn noop() -> Counter {
        Counter(None)
    }

    pub fn increment(&self, by: u64) {
        if let Some(value) = &self.0 {
            value.fetch_add(by, Ordering::Relaxed);
        }
    }
}

/// A gauge (an `f64`).
#[derive(Debug, Clone)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    pub fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    pub fn increment(&self, by: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + by).to_bits())
            });
    }
}

/// A summary: the quantiles of its samples over the last minute, their sum and count ever.
#[derive(Clone, Default)]
pub struct Summary(Option<Arc<Mutex<Distribution>>>);

impl Summary {
    pub fn noop() -> Summary {
        Summary(None)
    }

    pub fn record(&self, value: f64) {
        if let Some(distribution) = &self.0 {
            lock(distribution).record_samples(&[(value, quanta::Instant::now())]);
        }
    }
}

/// A histogram with fixed bucket bounds.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds, increasing (`+Inf` implied).
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); the last is above every bound.
    counts: Vec<AtomicU64>,
    /// The sum of observations (`f64` bits).
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// Counts `value` in the first bucket whose bound is at or above it.
    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.partition_point(|&bound| bound < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

/// What the registry keeps of one series: a weak reference to its value.
enum Cell {
    Counter(Weak<AtomicU64>),
    Gauge(Weak<AtomicU64>),
    Summary(Weak<Mutex<Distribution>>),
    Histogram(Weak<Histogram>),
}

impl Cell {
    fn alive(&self) -> bool {
        match self {
            Cell::Counter(weak) | Cell::Gauge(weak) => weak.strong_count() > 0,
            Cell::Summary(weak) => weak.strong_count() > 0,
            Cell::Histogram(weak) => weak.strong_count() > 0,
        }
    }
}

struct Registered {
    help: &'static str,
    kind: &'static str,
    /// By their labels' text.
    series: BTreeMap<String, Cell>,
}

static REGISTRY: Mutex<BTreeMap<&'static str, Registered>> = Mutex::new(BTreeMap::new());

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The series `labels` of `family` (of `kind`): `find` takes the one that lives already, if it
/// suits; else `make` makes one, which takes its place.
fn register<T>(
    family: &Family,
    kind: &'static str,
    labels: Labels<'_>,
    find: impl FnOnce(&Cell) -> Option<Arc<T>>,
    make: impl FnOnce() -> (Arc<T>, Cell),
) -> Arc<T> {
    let mut registry = lock(&REGISTRY);
    let registered = registry.entry(family.name).or_insert_with(|| Registered {
        help: family.help,
        kind,
        series: BTreeMap::new(),
    });
    debug_assert_eq!(registered.kind, kind, "{} registered twice", family.name);
    registered.series.retain(|_, cell| cell.alive());
    let key = label_text(labels);
    if let Some(found) = registered.series.get(&key).and_then(find) {
        return found;
    }
    let (value, cell) = make();
    registered.series.insert(key, cell);
    value
}

/// The counter `labels` of `family`.
pub fn counter(family: &Family, labels: Labels<'_>) -> Counter {
    Counter(Some(register(
        family,
        "counter",
        labels,
        |cell| match cell {
            Cell::Counter(weak) => weak.upgrade(),
            _ => None,
        },
        || {
            let value = Arc::new(AtomicU64::new(0));
            let cell = Cell::Counter(Arc::downgrade(&value));
            (value, cell)
        },
    )))
}

/// The gauge `labels` of `family`.
pub fn gauge(family: &Family, labels: Labels<'_>) -> Gauge {
    Gauge(register(
        family,
        "gauge",
        labels,
        |cell| match cell {
            Cell::Gauge(weak) => weak.upgrade(),
            _ => None,
        },
        || {
            let value = Arc::new(AtomicU64::new(0f64.to_bits()));
            let cell = Cell::Gauge(Arc::downgrade(&value));
            (value, cell)
        },
    ))
}

/// The summary `labels` of `family`, reporting `quantiles` (each in [0, 1]).
pub fn summary(family: &Family, labels: Labels<'_>, quantiles: &[f64]) -> Summary {
    Summary(Some(register(
        family,
        "summary",
        labels,
        |cell| match cell {
            Cell::Summary(weak) => weak.upgrade(),
            _ => None,
        },
        || {
            let quantiles = Arc::new(quantiles.iter().map(|&q| Quantile::new(q)).collect());
            let value = Arc::new(Mutex::new(Distribution::new_summary(
                quantiles,
                SUMMARY_BUCKET_DURATION,
                SUMMARY_BUCKETS,
            )));
            let cell = Cell::Summary(Arc::downgrade(&value));
            (value, cell)
        },
    )))
}

/// The histogram `labels` of `family` with `bounds`: the live one if its bounds are the same,
/// else a new one in its place.
pub fn histogram(family: &Family, labels: Labels<'_>, bounds: &[f64]) -> Arc<Histogram> {
    register(
        family,
        "histogram",
        labels,
        |cell| match cell {
            Cell::Histogram(weak) => weak.upgrade().filter(|h| h.bounds == bounds),
            _ => None,
        },
        || {
            let value = Arc::new(Histogram::new(bounds));
            let cell = Cell::Histogram(Arc::downgrade(&value));
            (value, cell)
        },
    )
}

fn label_text(labels: Labels<'_>) -> String {
    let pairs: Vec<String> = labels
        .iter()
        .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
        .collect();
    pairs.join(",")
}

/// A label value as Prometheus' text format quotes it.
pub fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `name{labels,extra} value`, without braces when there are no labels at all.
fn line(
    out: &mut String,
    name: &str,
    labels: &str,
    extra: Option<String>,
    value: impl std::fmt::Display,
) {
    let _ = match (labels.is_empty(), extra) {
        (true, None) => writeln!(out, "{name} {value}"),
        (true, Some(extra)) => writeln!(out, "{name}{{{extra}}} {value}"),
        (false, None) => writeln!(out, "{name}{{{labels}}} {value}"),
        (false, Some(extra)) => writeln!(out, "{name}{{{labels},{extra}}} {value}"),
    };
}

/// Appends every series still held to `out`, family by family (by name), in Prometheus' text
/// format; families left without series are forgotten.
pub fn render(out: &mut String) {
    let mut registry = lock(&REGISTRY);
    registry.retain(|_, registered| {
        registered.series.retain(|_, cell| cell.alive());
        !registered.series.is_empty()
    });
    for (name, registered) in registry.iter() {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = writeln!(out, "# HELP {name} {}", registered.help);
        let _ = writeln!(out, "# TYPE {name} {}", registered.kind);
        for (labels, cell) in &registered.series {
            write_series(out, name, labels, cell);
        }
        out.push('\n');
    }
}

fn write_series(out: &mut String, name: &str, labels: &str, cell: &Cell) {
    match cell {
        Cell::Counter(weak) => {
            if let Some(value) = weak.upgrade() {
                line(out, name, labels, None, value.load(Ordering::Relaxed));
            }
        }
        Cell::Gauge(weak) => {
            if let Some(value) = weak.upgrade() {
                line(
                    out,
                    name,
                    labels,
                    None,
                    f64::from_bits(value.load(Ordering::Relaxed)),
                );
            }
        }
        Cell::Summary(weak) => {
            let Some(value) = weak.upgrade() else { return };
            let distribution = lock(&value);
            let Distribution::Summary(rolling, quantiles, sum) = &*distribution else {
                return;
            };
            let snapshot = rolling.snapshot(quanta::Instant::now());
            for quantile in quantiles.iter() {
                let value = snapshot.quantile(quantile.value()).unwrap_or(0.0);
                let extra = format!("quantile=\"{}\"", quantile.value());
                line(out, name, labels, Some(extra), value);
            }
            line(out, &format!("{name}_sum"), labels, None, sum);
            line(out, &format!("{name}_count"), labels, None, rolling.count());
        }
        Cell::Histogram(weak) => {
            let Some(histogram) = weak.upgrade() else {
                return;
            };
            let bucket = format!("{name}_bucket");
            let mut cumulative = 0;
            for (index, count) in histogram.counts.iter().enumerate() {
                cumulative += count.load(Ordering::Relaxed);
                let le = match histogram.bounds.get(index) {
                    Some(bound) => format!("le=\"{bound}\""),
                    None => "le=\"+Inf\"".to_string(),
                };
                line(out, &bucket, labels, Some(le), cumulative);
            }
            let sum = f64::from_bits(histogram.sum.load(Ordering::Relaxed));
            line(out, &format!("{name}_sum"), labels, None, sum);
            line(out, &format!("{name}_count"), labels, None, cumulative);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(model: &str) -> Vec<(&'static str, String)> {
        vec![("model", model.to_string()), ("version", "1".to_string())]
    }

    /// The series lines of `render` that name `needle`.
    fn rendered(needle: &str) -> Vec<String> {
        let mut out = String::new();
        render(&mut out);
        out.lines()
            .filter(|line| !line.starts_with('#') && line.contains(needle))
            .map(str::to_string)
            .collect()
    }

    const COUNTED: Family = Family {
        name: "kiln_test_counted",
        help: "Counted in tests",
    };

    #[test]
    fn a_series_lives_while_a_handle_holds_it() {
        let first = counter(&COUNTED, &labels("held\"m"));
        first.increment(2);
        // A second copy of the version (a reload) shares the series while the first lives.
        let second = counter(&COUNTED, &labels("held\"m"));
        second.increment(1);
        assert_eq!(
            rendered("held"),
            ["kiln_test_counted{model=\"held\\\"m\",version=\"1\"} 3"]
        );
        drop(first);
        assert_eq!(rendered("held").len(), 1);
        drop(second);
        assert!(rendered("held").is_empty());
        // Registered again after the last went: from 0.
        let again = counter(&COUNTED, &labels("held\"m"));
        assert_eq!(
            rendered("held"),
            ["kiln_test_counted{model=\"held\\\"m\",version=\"1\"} 0"]
        );
        drop(again);
        assert!(
            rendered("kiln_test_counted").is_empty(),
            "the family goes too"
        );
        Counter::noop().increment(1);
    }

    #[test]
    fn gauges_are_set_and_moved() {
        const FAMILY: Family = Family {
            name: "kiln_test_gauge",
            help: "A gauge in tests",
        };
        let gauge = gauge(&FAMILY, &labels("gauged"));
        gauge.set(2.5);
        gauge.increment(-1.0);
        let mut out = String::new();
        render(&mut out);
        assert!(
            out.contains(
                "# HELP kiln_test_gauge A gauge in tests\n# TYPE kiln_test_gauge gauge\n\
                 kiln_test_gauge{model=\"gauged\",version=\"1\"} 1.5\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn summaries_report_their_quantiles_sum_and_count() {
        const FAMILY: Family = Family {
            name: "kiln_test_summary_us",
            help: "A summary in tests",
        };
        let summary = summary(&FAMILY, &labels("summed"), &[0.5, 0.99]);
        for value in 1..=100 {
            summary.record(f64::from(value));
        }
        let lines = rendered("kiln_test_summary_us");
        let value = |prefix: &str| -> f64 {
            let line = lines.iter().find(|l| l.starts_with(prefix)).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let median = value("kiln_test_summary_us{model=\"summed\",version=\"1\",quantile=\"0.5\"}");
        assert!((49.0..=52.0).contains(&median), "{median}");
        let p99 = value("kiln_test_summary_us{model=\"summed\",version=\"1\",quantile=\"0.99\"}");
        assert!((97.0..=101.0).contains(&p99), "{p99}");
        assert_eq!(value("kiln_test_summary_us_sum{"), 5050.0);
        assert_eq!(value("kiln_test_summary_us_count{"), 100.0);
        Summary::noop().record(1.0);
    }

    #[test]
    fn histograms_count_cumulatively_and_keep_their_bounds() {
        const FAMILY: Family = Family {
            name: "kiln_test_histogram_ms",
            help: "A histogram in tests",
        };
        let first = histogram(&FAMILY, &labels("binned"), &[1.0, 10.0, 100.0]);
        for ms in [0.5, 1.0, 7.0, 250.0, 3_000.0] {
            first.observe(ms);
        }
        assert_eq!(
            rendered("kiln_test_histogram_ms_"),
            [
                "kiln_test_histogram_ms_bucket{model=\"binned\",version=\"1\",le=\"1\"} 2",
                "kiln_test_histogram_ms_bucket{model=\"binned\",version=\"1\",le=\"10\"} 3",
                "kiln_test_histogram_ms_bucket{model=\"binned\",version=\"1\",le=\"100\"} 3",
                "kiln_test_histogram_ms_bucket{model=\"binned\",version=\"1\",le=\"+Inf\"} 5",
                "kiln_test_histogram_ms_sum{model=\"binned\",version=\"1\"} 3258.5",
                "kiln_test_histogram_ms_count{model=\"binned\",version=\"1\"} 5",
            ]
        );
        // The same bounds share the live series; other bounds replace it.
        let same = histogram(&FAMILY, &labels("binned"), &[1.0, 10.0, 100.0]);
        assert!(Arc::ptr_eq(&first, &same));
        let other = histogram(&FAMILY, &labels("binned"), &[5.0]);
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(
            rendered("kiln_test_histogram_ms_bucket")[0],
            "kiln_test_histogram_ms_bucket{model=\"binned\",version=\"1\",le=\"5\"} 0"
        );
    }

    #[test]
    fn series_without_labels_have_no_braces() {
        const FAMILY: Family = Family {
            name: "kiln_test_bare",
            help: "Bare",
        };
        let bare = counter(&FAMILY, &[]);
        bare.increment(4);
        assert_eq!(rendered("kiln_test_bare "), ["kiln_test_bare 4"]);
    }
}
