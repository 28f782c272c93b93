//! A request's statistics, recorded in one place as Triton counts them: how it got its outputs
//! ([`Ran`]), how a failure counts ([`Counted`]), and the [`Recorder`] every path that runs a
//! request (unary, streamed, an ensemble's) records it through, once: a success, a failure for
//! its reason, or, dropped before either (its client went away), a cancellation.

use crate::core::Error;
use crate::metrics::{FailureReason, ModelStats, Timing};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Records one request of a version in that version's statistics, once.
pub(super) struct Recorder<'a> {
    stats: &'a ModelStats,
    arrived: Instant,
    recorded: bool,
}

impl<'a> Recorder<'a> {
    /// The recorder of a request that arrived at `arrived` (its end-to-end time starts there).
    pub(super) fn new(stats: &'a ModelStats, arrived: Instant) -> Recorder<'a> {
        Recorder {
            stats,
            arrived,
            recorded: false,
        }
    }

    /// The request was answered, as `ran` says.
    pub(super) fn answered(mut self, ran: &Ran) {
        self.recorded = true;
        ran.record_success(self.stats, self.arrived.elapsed());
    }

    /// The request failed; it counts as `counted` says.
    pub(super) fn failed(mut self, counted: &Counted) {
        self.recorded = true;
        counted.record(self.stats, self.arrived.elapsed());
    }

    /// A streamed request whose last response went out after `total`: a success once its
    /// model's `execute` has returned its `timing`, else a failure as the scheduler's refusal
    /// counts (a refusal as it was queued counts nowhere), else the model's.
    pub(super) async fn streamed(
        mut self,
        (rows, total, succeeded): (usize, Duration, bool),
        timing: oneshot::Receiver<Option<Timing>>,
        refusal: &OnceLock<Counted>,
    ) {
        self.recorded = true;
        if succeeded {
            let timing = timing.await.ok().flatten().unwrap_or_default();
            self.stats.record_success(rows, total, timing);
        } else {
            let backend = Counted::Failure(FailureReason::Backend);
            refusal.get().unwrap_or(&backend).record(self.stats, total);
        }
    }
}

impl Drop for Recorder<'_> {
    /// A request neither answered nor failed: its caller stopped waiting (CANCELED).
    fn drop(&mut self) {
        if !self.recorded {
            self.stats
                .record_failure(self.arrived.elapsed(), FailureReason::Canceled);
        }
    }
}

/// A request the engine did not answer: its error, in Triton's words, and how it counts in its
/// model's statistics, which also says where it stopped ([`Failed::stage`]). The one failure
/// type of the engine, from a lookup's refusal to a model's error.
#[derive(Debug)]
pub struct Failed {
    pub error: Error,
    pub(super) counted: Counted,
}

impl Failed {
    /// `error`, counted as `counted` says.
    pub(super) fn new(error: Error, counted: Counted) -> Failed {
        Failed { error, counted }
    }

    /// Where the request stopped (Triton's stream answers tell them apart).
    pub fn stage(&self) -> Stage {
        match &self.counted {
            Counted::Nowhere => Stage::Refused,
            // The model (or an ensemble's step) had it: its answer says so. A timeout in the
            // queue or a cancellation is a refusal.
            Counted::Failure(FailureReason::Backend | FailureReason::Other) => Stage::Failed,
            Counted::Failure(FailureReason::Rejected | FailureReason::Canceled) => Stage::Refused,
            Counted::Answered(_) => Stage::Failed,
        }
    }

    /// The error alone, for those that do not tell the stages apart.
    pub fn into_error(self) -> Error {
        self.error
    }
}

/// A refusal before the model's scheduler had the request: counted nowhere, as in Triton.
impl From<Error> for Failed {
    fn from(error: Error) -> Failed {
        Failed::new(error, Counted::Nowhere)
    }
}

/// Where a failed request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Refused before its model had it: lookup, validation, admission, its sequence, the queue.
    Refused,
    /// Its model had it and failed it (or its outputs could not be answered).
    Failed,
}

/// How a request that failed counts in its model's statistics, as Triton counts it.
#[derive(Debug, Clone)]
pub(super) enum Counted {
    /// Refused before its model's scheduler had it: nowhere.
    Nowhere,
    /// A failure, for this reason.
    Failure(FailureReason),
    /// A success: its model answered it, with an error (a Python model's error response, which
    /// Triton's Python backend counts as a response sent).
    Answered(Ran),
}

impl Counted {
    /// Records a request that failed after `total` as Triton counts it.
    fn record(&self, stats: &ModelStats, total: Duration) {
        match self {
            Counted::Nowhere => {}
            Counted::Failure(reason) => stats.record_failure(total, *reason),
            Counted::Answered(ran) => ran.record_success(stats, total),
        }
    }
}

impl From<Option<FailureReason>> for Counted {
    fn from(reason: Option<FailureReason>) -> Counted {
        reason.map_or(Counted::Nowhere, Counted::Failure)
    }
}

/// How a request got its outputs, for its statistics.
#[derive(Debug, Clone)]
pub(super) enum Ran {
    /// Its model ran it (in a batch, possibly).
    Executed { rows: usize, timing: Timing },
    /// The response cache held them; the request reached it after `queue` (checks, as Triton
    /// counts a hit's time queued) and finding them took `lookup`.
    Cached { queue: Duration, lookup: Duration },
    /// An ensemble's steps made them.
    Composed { rows: usize },
}

impl Ran {
    /// Statistics of a request answered in `total`.
    fn record_success(&self, stats: &ModelStats, total: Duration) {
        match self {
            Ran::Executed { rows, timing } => stats.record_success(*rows, total, *timing),
            Ran::Cached { queue, lookup } => stats.record_cache_hit(total, *queue, *lookup),
            // Triton counts an ensemble's request as one execution of its rows too.
            Ran::Composed { rows } => {
                stats.record_execution(*rows, Default::default(), None);
                stats.record_success(*rows, total, Default::default());
            }
        }
    }
}
