//! The queue and dynamic-batching decisions of one model version, as plain data: no channels, no
//! clocks of its own (every call takes `now`), so every rule is unit-tested without threads.
//!
//! Rules (Triton's dynamic batcher):
//! - priority levels 1 (highest) ..= N; requests without a priority (or an out-of-range one) go to
//!   the default level; each level has its queue policy (max size, timeout, timeout action);
//! - a batch starts with the oldest request of the highest non-empty level and extends, in queue
//!   order, with requests of the same shape signature while the batch stays within
//!   `max_batch_size`; the first incompatible request ends it (order is never skipped);
//! - a batch is sent when it reaches `max_batch_size` or a preferred size (the longest prefix
//!   of the queue that makes a preferred size goes), or once its oldest request has waited
//!   `max_queue_delay`; otherwise the batcher waits until then. That is all, by default: the
//!   config is the contract, and a batch that reaches no preferred size waits out the delay the
//!   user asked for;
//! - a request whose timeout passes while queued is rejected (REJECT) or moved behind every request
//!   that has not timed out (DELAY); a client deadline always rejects;
//! - without dynamic batching every request runs alone, in priority and arrival order.
//!
//! With `adaptive_delay` on (kiln's opt-in extension: the config parameter
//! `adaptive_batching_delay: "true"` or the server flag `--adaptive-batching`), a batch also
//! goes before its delay when waiting looks useless. These shortcuts assume closed-loop clients
//! at a steady concurrency (each sends its next request only once answered: a benchmark load
//! generator); with independent, open-loop arrivals they give smaller batches than asked for:
//! - once no request has joined it for a tenth of the delay ([`SETTLE_FRACTION`]: the burst
//!   it came with is over);
//! - at once while waiting has not paid lately: once a batch has gone with a single request
//!   (after waiting, or early by the next rules), later ones go at once, until a batch of
//!   several forms again (requests that queued up behind busy instances);
//! - at once while another instance stays free for whoever comes next (a batch waits for
//!   company only on the last free instance);
//! - at once when as many of the version's requests are in flight (queued, running, or answered
//!   and on their way back) as were ever in flight at once lately ([`PEAK_WINDOW`]): every
//!   client that could send one is already waiting on an answer.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A batch still below its preferred sizes goes once no request has joined it for
/// `max_queue_delay / SETTLE_FRACTION`. Clients that wait for their answers (most do) send
/// nothing more until the batch runs: without this rule each such batch would wait out the whole
/// delay for nothing. Requests that keep arriving closer together than this still extend the
/// batch, up to the full delay, as Triton's batcher would.
pub const SETTLE_FRACTION: u32 = 10;

/// The most requests in flight at once is taken over the current window of this length and the
/// last one before it that saw requests. Long enough to span many batches at any load worth
/// batching, short enough to follow clients that come and go.
pub const PEAK_WINDOW: Duration = Duration::from_millis(100);

/// What to do with a request whose queue-policy timeout expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeoutAction {
    #[default]
    Reject,
    Delay,
}

/// Triton's `ModelQueuePolicy` for one priority level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuePolicy {
    /// 0 means unbounded.
    pub max_queue_size: usize,
    /// Time a request may wait in the queue; `None` means forever.
    pub default_timeout: Option<Duration>,
    pub timeout_action: TimeoutAction,
    /// Whether a request's own `timeout` may shorten `default_timeout` (never lengthen it, nor
    /// give a timeout to a policy without one: Triton's rule).
    pub allow_timeout_override: bool,
}

/// How a model version's requests are queued and batched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchingConfig {
    /// Merge requests along the batch dimension (`dynamic_batching` in the config).
    pub dynamic: bool,
    /// Largest merged batch; 0 for models without a batch dimension.
    pub max_batch_size: usize,
    /// Batch sizes sent as soon as they are reached, ascending.
    pub preferred_batch_sizes: Vec<usize>,
    pub max_queue_delay: Duration,
    /// Number of priority levels (at least 1).
    pub priority_levels: usize,
    /// Level (1-based) for requests that give no valid priority.
    pub default_priority: usize,
    /// One policy per level, index 0 = level 1.
    pub policies: Vec<QueuePolicy>,
    /// Most requests of this version queued or running at once (the config parameter
    /// `max_inflight_requests`); 0 means no limit. Enforced by the [`Scheduler`](super::Scheduler)
    /// before a request reaches the queue, so `State` itself never sees it.
    pub max_in_flight: usize,
    /// Wait less than `max_queue_delay` when waiting looks useless (the module's opt-in rules;
    /// the config parameter `adaptive_batching_delay`, or `--adaptive-batching`). Off (the
    /// default): every batch that reaches neither `max_batch_size` nor a preferred size waits
    /// for its full delay, as in Triton.
    pub adaptive_delay: bool,
    /// How batches are laid out: ragged inputs, batch inputs, scatter outputs.
    pub layout: std::sync::Arc<super::layout::BatchLayout>,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            dynamic: false,
            max_batch_size: 0,
            preferred_batch_sizes: Vec::new(),
            max_queue_delay: Duration::ZERO,
            priority_levels: 1,
            default_priority: 1,
            policies: vec![QueuePolicy::default()],
            max_in_flight: 0,
            adaptive_delay: false,
            layout: Default::default(),
        }
    }
}

impl BatchingConfig {
    /// Whether requests are merged into batches (dynamic batching on a model with a batch
    /// dimension).
    pub fn merges(&self) -> bool {
        self.dynamic && self.max_batch_size > 0
    }

    fn level(&self, priority: Option<u64>) -> usize {
        match priority {
            Some(p) if p >= 1 && p as usize <= self.priority_levels => p as usize - 1,
            _ => self.default_priority.clamp(1, self.priority_levels) - 1,
        }
    }

    fn policy(&self, level: usize) -> &QueuePolicy {
        static UNBOUNDED: QueuePolicy = QueuePolicy {
            max_queue_size: 0,
            default_timeout: None,
            timeout_action: TimeoutAction::Reject,
            allow_timeout_override: false,
        };
        self.policies.get(level).unwrap_or(&UNBOUNDED)
    }
}

/// Why a request left the queue without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The level's queue is full ("Exceeds maximum queue size").
    QueueFull,
    /// The queue policy's timeout passed (REJECT action).
    Timeout,
    /// The client's own deadline passed.
    Deadline,
}

/// A request as the queue sees it.
#[derive(Debug, Clone)]
pub struct Submission<T> {
    pub payload: T,
    /// Rows this request adds to a batch (its first dim; 1 for models without batching).
    pub batch_size: usize,
    /// Requests merge only when their signatures (non-batch shapes and datatypes) are equal.
    pub signature: u64,
    pub priority: Option<u64>,
    /// Client deadline (gRPC `grpc-timeout`).
    pub deadline: Option<Instant>,
    /// The request's own `timeout` parameter.
    pub timeout: Option<Duration>,
}

#[derive(Debug)]
struct Entry<T> {
    payload: T,
    batch_size: usize,
    signature: u64,
    enqueued: Instant,
    /// When the queue policy's timeout fires, if it applies.
    policy_expiry: Option<Instant>,
    action: TimeoutAction,
    deadline: Option<Instant>,
}

/// What the batcher can do now.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<T> {
    /// Send these requests to an instance as one batch.
    Batch(Vec<T>),
    /// Nothing to send before this instant (unless new requests arrive).
    WaitUntil(Instant),
    /// The queue is empty.
    Idle,
}

/// The queues of one model version.
#[derive(Debug)]
pub struct State<T> {
    config: BatchingConfig,
    /// One FIFO per priority level, index 0 = highest.
    levels: Vec<VecDeque<Entry<T>>>,
    /// Requests whose DELAY timeout fired: served only when every level is empty.
    delayed: VecDeque<Entry<T>>,
    /// Whether the last batches that waited for company got some (see the module's rules).
    waiting_pays: bool,
    in_flight: InFlightPeak,
}

/// The version's requests in flight, as last told by the scheduler, and the most there were at
/// once in the current [`PEAK_WINDOW`] and in the last one before it that saw any.
#[derive(Debug, Default)]
struct InFlightPeak {
    count: usize,
    /// Start of the current window: the first observation after the last one ended.
    window_start: Option<Instant>,
    peak: usize,
    previous_peak: usize,
}

impl InFlightPeak {
    fn observe(&mut self, count: usize, now: Instant) {
        if self
            .window_start
            .is_none_or(|start| now >= start + PEAK_WINDOW)
        {
            self.previous_peak = self.peak;
            self.peak = 0;
            self.window_start = Some(now);
        }
        self.count = count;
        self.peak = self.peak.max(count);
    }

    /// Whether as many requests are in flight now as at any moment lately. Unknown (false) until
    /// a whole window has seen requests: during the first one every arrival is a new peak.
    fn at_peak(&self) -> bool {
        self.previous_peak > 0 && self.count >= self.peak.max(self.previous_peak)
    }
}

impl<T> State<T> {
    pub fn new(mut config: BatchingConfig) -> State<T> {
        config.priority_levels = config.priority_levels.max(1);
        config.preferred_batch_sizes.sort_unstable();
        let levels = (0..config.priority_levels)
            .map(|_| VecDeque::new())
            .collect();
        State {
            config,
            levels,
            delayed: VecDeque::new(),
            waiting_pays: true,
            in_flight: InFlightPeak::default(),
        }
    }

    /// Tells the batcher how many of the version's requests are in flight at `now`: queued,
    /// running, or answered and not yet returned to their clients (see the module's rules). The
    /// scheduler calls it as each request arrives and before each [`State::next_batch`].
    pub fn observe_in_flight(&mut self, count: usize, now: Instant) {
        self.in_flight.observe(count, now);
    }

    pub fn config(&self) -> &BatchingConfig {
        &self.config
    }

    /// Requests waiting (including delayed ones).
    pub fn len(&self) -> usize {
        self.levels.iter().map(VecDeque::len).sum::<usize>() + self.delayed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a request queued now would wait for others to join it.
    pub fn waits_for_company(&self) -> bool {
        self.config.merges()
            && !self.config.max_queue_delay.is_zero()
            && (self.waiting_pays || !self.config.adaptive_delay)
    }

    /// Queues a request and says when, if it is still queued then, it will be rejected: its
    /// client deadline, or its REJECT timeout (a DELAY timeout only reorders, so it is not one).
    ///
    /// # Errors
    /// [`Rejection::QueueFull`] (with the payload back) when its level is at `max_queue_size`.
    pub fn push(
        &mut self,
        submission: Submission<T>,
        now: Instant,
    ) -> Result<Option<(Instant, Rejection)>, (Rejection, T)> {
        let level = self.config.level(submission.priority);
        let policy = self.config.policy(level);
        if policy.max_queue_size > 0 && self.levels[level].len() >= policy.max_queue_size {
            return Err((Rejection::QueueFull, submission.payload));
        }
        // As Triton's queues: a request's own timeout only shortens the policy's, when allowed.
        let timeout = match (policy.default_timeout, submission.timeout) {
            (Some(default), Some(own)) if policy.allow_timeout_override && own < default => {
                Some(own)
            }
            (default, _) => default,
        };
        let policy_expiry = timeout.map(|t| now + t);
        let rejection_at = [
            submission.deadline.map(|at| (at, Rejection::Deadline)),
            policy_expiry
                .filter(|_| policy.timeout_action == TimeoutAction::Reject)
                .map(|at| (at, Rejection::Timeout)),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|(at, _)| *at);
        self.levels[level].push_back(Entry {
            payload: submission.payload,
            batch_size: submission.batch_size.max(1),
            signature: submission.signature,
            enqueued: now,
            policy_expiry,
            action: policy.timeout_action,
            deadline: submission.deadline,
        });
        Ok(rejection_at)
    }

    /// Queues again a request its model rescheduled (it ran, and runs again in a later batch):
    /// at the default priority, behind what waits there, whatever the queue's size (it was
    /// admitted when it came), with no timeout.
    pub fn requeue(&mut self, payload: T, batch_size: usize, signature: u64, now: Instant) {
        let level = self.config.level(None);
        self.levels[level].push_back(Entry {
            payload,
            batch_size: batch_size.max(1),
            signature,
            enqueued: now,
            policy_expiry: None,
            action: TimeoutAction::Reject,
            deadline: None,
        });
    }

    /// Removes the first queued request `matches` selects (its client went away). `None` if it
    /// already left the queue.
    pub fn cancel(&mut self, matches: impl Fn(&T) -> bool) -> Option<T> {
        for queue in self
            .levels
            .iter_mut()
            .chain(std::iter::once(&mut self.delayed))
        {
            if let Some(index) = queue.iter().position(|e| matches(&e.payload)) {
                return queue.remove(index).map(|e| e.payload);
            }
        }
        None
    }

    /// Applies deadlines and timeouts at `now`: returns the rejected requests; DELAY requests move
    /// to the delayed queue.
    pub fn expire(&mut self, now: Instant) -> Vec<(T, Rejection)> {
        let mut rejected = Vec::new();
        if self.next_expiry().is_none_or(|at| at > now) {
            return rejected;
        }
        for level in 0..self.levels.len() {
            let queue = std::mem::take(&mut self.levels[level]);
            for mut entry in queue {
                if entry.deadline.is_some_and(|d| d <= now) {
                    rejected.push((entry.payload, Rejection::Deadline));
                } else if entry.policy_expiry.is_some_and(|t| t <= now) {
                    match entry.action {
                        TimeoutAction::Reject => rejected.push((entry.payload, Rejection::Timeout)),
                        TimeoutAction::Delay => {
                            entry.policy_expiry = None;
                            self.delayed.push_back(entry);
                        }
                    }
                } else {
                    self.levels[level].push_back(entry);
                }
            }
        }
        let delayed = std::mem::take(&mut self.delayed);
        for entry in delayed {
            if entry.deadline.is_some_and(|d| d <= now) {
                rejected.push((entry.payload, Rejection::Deadline));
            } else {
                self.delayed.push_back(entry);
            }
        }
        rejected
    }

    /// The earliest instant at which [`State::expire`] has work.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.levels
            .iter()
            .flatten()
            .flat_map(|e| [e.deadline, e.policy_expiry])
            .chain(self.delayed.iter().map(|e| e.deadline))
            .flatten()
            .min()
    }

    /// Forms the next batch for a free instance, or says how long to wait. `spare_instance`:
    /// another instance would still be free after this one takes the batch. Call
    /// [`State::expire`] first so that no expired request is sent, and
    /// [`State::observe_in_flight`] so that the batch knows who is left to come.
    pub fn next_batch(&mut self, now: Instant, spare_instance: bool) -> Next<T> {
        // The highest non-empty level, then the delayed requests (`levels.len()`).
        let Some(level) = (0..=self.levels.len()).find(|&level| !self.queue(level).is_empty())
        else {
            return Next::Idle;
        };
        if !self.config.merges() {
            let entry = self.queue(level).pop_front().expect("non-empty");
            return Next::Batch(vec![entry.payload]);
        }
        let queue = self.levels.get(level).unwrap_or(&self.delayed);
        let scan = Scan::of(queue, &self.config);
        let delay = self.config.max_queue_delay;
        // Triton's `delay_is_exceeded` is false without a delay: a preferred prefix still goes
        // alone then, and the rest right after it.
        let delay_exceeded = !delay.is_zero() && now >= scan.oldest + delay;
        let max_preferred = self
            .config
            .preferred_batch_sizes
            .last()
            .copied()
            .unwrap_or(self.config.max_batch_size);
        let take = match scan.best_prefix {
            // Triton: a preferred size (or the most that stays within the largest one) goes at
            // once, unless the delay has passed, when everything pending goes.
            Some(prefix) if !delay_exceeded => prefix,
            _ if scan.ends_early
                || scan.rows >= max_preferred
                || delay_exceeded
                || delay.is_zero() =>
            {
                if self.config.adaptive_delay && delay_exceeded {
                    self.waiting_pays = scan.count > 1;
                }
                scan.count
            }
            _ if self.config.adaptive_delay => {
                match self.adaptive_take(&scan, now, spare_instance) {
                    Some(count) => count,
                    None => {
                        return Next::WaitUntil(
                            (scan.oldest + delay).min(scan.newest + delay / SETTLE_FRACTION),
                        )
                    }
                }
            }
            _ => return Next::WaitUntil(scan.oldest + delay),
        };
        if take > 1 {
            self.waiting_pays = true;
        }
        let batch = self.queue(level).drain(..take).map(|e| e.payload);
        Next::Batch(batch.collect())
    }

    /// Priority level `level`'s queue; the delayed requests' past the last level.
    fn queue(&mut self, level: usize) -> &mut VecDeque<Entry<T>> {
        self.levels.get_mut(level).unwrap_or(&mut self.delayed)
    }

    /// The opt-in shortcuts (see the module's rules): how many requests go now although the
    /// batch reached no preferred size and its delay has not passed; `None`: wait.
    fn adaptive_take(&mut self, scan: &Scan, now: Instant, spare_instance: bool) -> Option<usize> {
        if !self.waiting_pays {
            return Some(scan.count);
        }
        let settled = now >= scan.newest + self.config.max_queue_delay / SETTLE_FRACTION;
        // Latecomers would find another instance, or nobody is left to come.
        let need_not_wait = spare_instance || self.in_flight.at_peak();
        if settled || need_not_wait {
            // It waited, or need not wait longer: did anyone join?
            self.waiting_pays = scan.count > 1;
            return Some(scan.count);
        }
        None
    }
}

/// The pending batch at the head of a queue, as Triton's dynamic batcher forms it
/// (`DynamicBatchScheduler::GetDynamicBatch`): the longest run of requests, in order, with the
/// head's shape signature that fits `max_batch_size`.
struct Scan {
    /// Requests in the run.
    count: usize,
    /// Their rows.
    rows: usize,
    /// The longest prefix that goes before the delay: the last one whose rows are a preferred
    /// size, or, where none is, the run up to the request that would take it past the largest
    /// preferred size (the batch cannot reach a preferred size by growing).
    best_prefix: Option<usize>,
    /// The run ended at a request that cannot join it (another shape, or past
    /// `max_batch_size`): it cannot grow, so it goes now.
    ends_early: bool,
    oldest: Instant,
    newest: Instant,
}

impl Scan {
    fn of<T>(queue: &VecDeque<Entry<T>>, config: &BatchingConfig) -> Scan {
        let head = &queue[0];
        let max_preferred = config
            .preferred_batch_sizes
            .last()
            .copied()
            .unwrap_or(config.max_batch_size);
        let mut scan = Scan {
            count: 0,
            rows: 0,
            best_prefix: None,
            ends_early: false,
            oldest: head.enqueued,
            newest: head.enqueued,
        };
        for entry in queue {
            if scan.count > 0 {
                let rows = scan.rows + entry.batch_size;
                if rows > max_preferred && scan.best_prefix.is_none() {
                    scan.best_prefix = Some(scan.count);
                }
                if rows > config.max_batch_size || entry.signature != head.signature {
                    scan.ends_early = true;
                    break;
                }
            }
            scan.rows += entry.batch_size;
            scan.count += 1;
            scan.newest = scan.newest.max(entry.enqueued);
            if config
                .preferred_batch_sizes
                .binary_search(&scan.rows)
                .is_ok()
            {
                scan.best_prefix = Some(scan.count);
            }
        }
        // A single request larger than max_batch_size cannot be queued: the engine rejects it.
        scan.count = scan.count.max(1);
        scan
    }
}

#[cfg(test)]
mod tests;
