//! The per-model-version scheduler. The batching [`State`] (pure, unit-tested) sits behind one
//! mutex; the instances, each owning one backend session on its own thread, pull from it: an idle
//! instance takes the next batch as soon as the batching rules allow (or sleeps on a condition
//! variable until a request arrives or the batching delay ends), merges it, runs it, splits the
//! outputs and answers every request itself.
//!
//! No thread sits between the caller and the instances: a request costs one lock and at most one
//! wake-up on the way in and one on the way out. (A separate queue thread — the first design —
//! added two more context switches per request, which on two cores cost more than the model.)
//! Cheaper still, a lone request (the only one of its version in flight) runs at once on the
//! caller's own thread when the model is known to be quick and would not wait to batch anyway
//! (no delay, or waiting has not paid lately: see [`state`]; and [`INLINE_MAX_INFER`]): no
//! hand-off at all. Under concurrent load requests go to the instance threads as before — run
//! inline, they would hold up the other connections of the network thread — unless the model
//! is tiny ([`ALWAYS_INLINE_MAX_INFER`]), when the hand-off would cost more than the run. So
//! sessions are not tied to threads: idle sessions wait in a pool that instance threads and
//! inline callers both take from.
//! Deadlines and REJECT timeouts are timed by the waiting caller, which takes its request back
//! out of the queue when they pass; instances also drop anything expired they come across.

pub mod batch;
pub mod layout;
pub mod rate_limit;
pub mod state;

use crate::backend::{Backend, BackendError};
use crate::core::Tensor;
use crate::metrics::{ComputeTimes, ModelStats};
use state::{Next, Rejection, State, Submission};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub use state::{BatchingConfig, QueuePolicy, TimeoutAction};

/// Why a request was not answered with outputs.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScheduleError {
    #[error("Exceeds maximum queue size")]
    QueueFull,
    /// The version already has its `max_inflight_requests` queued or running.
    #[error("Exceeds maximum in-flight requests ({0})")]
    Overloaded(usize),
    /// The queue policy's timeout passed before the request ran.
    #[error("Request timeout expired")]
    Timeout,
    /// The client's deadline passed before the request ran.
    #[error("Request timeout expired")]
    Deadline,
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the model's instances have stopped")]
    Stopped,
}

impl From<Rejection> for ScheduleError {
    fn from(rejection: Rejection) -> Self {
        match rejection {
            Rejection::QueueFull => ScheduleError::QueueFull,
            Rejection::Timeout => ScheduleError::Timeout,
            Rejection::Deadline => ScheduleError::Deadline,
        }
    }
}

/// A validated request on its way to an instance.
#[derive(Debug)]
pub struct Request {
    /// Inputs in the model's layout and in the model's input order.
    pub inputs: Vec<Tensor>,
    /// Rows this request contributes to a batch (1 for models without a batch dimension).
    pub rows: usize,
    pub priority: Option<u64>,
    /// The request's own `timeout` parameter.
    pub timeout: Option<Duration>,
    /// The client's deadline (gRPC `grpc-timeout`).
    pub deadline: Option<Instant>,
}

/// A request's outputs and where its time went.
#[derive(Debug)]
pub struct Outcome {
    pub outputs: Vec<Tensor>,
    /// When its batch started (merging inputs, then running the model).
    pub started: Instant,
    pub queue: Duration,
    pub compute: ComputeTimes,
    /// The GPU (CUDA ordinal) of the instance that ran it; `None`: a CPU instance.
    pub gpu: Option<i32>,
}

struct Job {
    inputs: Vec<Tensor>,
    rows: usize,
    ticket: u64,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Outcome, ScheduleError>>,
}

/// What the caller and the instances share.
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when work arrives, a session comes back with work waiting, or the scheduler
    /// stops.
    work: Condvar,
    stats: Arc<ModelStats>,
    recent_infer: RecentInfer,
    /// Requests between `submit` and the return of their answer (queued, running, or answered
    /// and not yet returned), for `max_in_flight` and the batching rules.
    in_flight: AtomicUsize,
    /// How batches are laid out (ragged inputs, batch inputs, scatter outputs).
    layout: Arc<layout::BatchLayout>,
}

struct Queue {
    state: State<Job>,
    stopped: bool,
    /// Sessions running nothing. An instance thread takes one with each batch; a caller running
    /// its request inline takes one too, so a thread with a batch may have to wait for one.
    free: Vec<Box<dyn Backend>>,
}

/// A model whose runs have lately taken less than this may run a lone request on the caller's
/// (network) thread. Long enough for small models (`add_sub`, an MLP: tens of microseconds),
/// short enough that the other connections served by that thread barely notice.
pub const INLINE_MAX_INFER: Duration = Duration::from_micros(250);

/// A model whose runs have lately taken less than this runs every request on the caller's thread
/// while a session is free and nothing is queued, however many requests are in flight: handing
/// such a run to an instance thread and waking the caller afterwards costs more than the run
/// (measured: `add_sub` over gRPC at concurrency 8, 0.8-0.9 context switches and 61-65 µs of CPU
/// per request before, 0.2-0.26 and 41-49 µs after).
pub const ALWAYS_INLINE_MAX_INFER: Duration = Duration::from_micros(25);

/// Moving average of the model's run time, in nanoseconds; `u64::MAX` until the first run.
struct RecentInfer(AtomicU64);

impl RecentInfer {
    fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX - 1);
        let old = self.0.load(Ordering::Relaxed);
        let new = if old == u64::MAX {
            took
        } else {
            old - old / 8 + took / 8
        };
        self.0.store(new, Ordering::Relaxed);
    }

    fn below(&self, limit: Duration) -> bool {
        u128::from(self.0.load(Ordering::Relaxed)) < limit.as_nanos()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic never happens while the lock is held (backends run outside it); recover anyway.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The scheduler of one model version. Dropping it stops the instances once they finish the
/// batch they are running; requests still queued are answered [`ScheduleError::Stopped`].
/// [`Scheduler::stop`] does the same and waits for the threads, so a caller knows the sessions
/// are freed when it returns.
pub struct Scheduler {
    shared: Arc<Shared>,
    next_ticket: AtomicU64,
    batching: bool,
    instances: usize,
    /// The instance threads, joined by [`Scheduler::stop`].
    threads: Vec<std::thread::JoinHandle<()>>,
    /// 0: no limit (see [`BatchingConfig::max_in_flight`]).
    max_in_flight: usize,
    /// The backends may run on a caller's thread (see [`Backend::may_run_inline`]).
    may_inline: bool,
}

impl Scheduler {
    /// Starts one thread per backend, named `<label>-<index>`.
    ///
    /// # Errors
    /// The OS error when a thread cannot be spawned.
    pub fn start(
        label: &str,
        config: BatchingConfig,
        backends: Vec<Box<dyn Backend>>,
        stats: Arc<ModelStats>,
    ) -> std::io::Result<Scheduler> {
        let batching = config.merges();
        let may_inline = backends.iter().all(|backend| backend.may_run_inline());
        let max_in_flight = config.max_in_flight;
        let instances = backends.len();
        let layout = Arc::clone(&config.layout);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                state: State::new(config),
                stopped: false,
                free: backends,
            }),
            work: Condvar::new(),
            stats,
            recent_infer: RecentInfer(AtomicU64::new(u64::MAX)),
            in_flight: AtomicUsize::new(0),
            layout,
        });
        let mut threads = Vec::with_capacity(instances);
        for index in 0..instances {
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{label}-{index}"))
                    .spawn(move || instance_loop(&shared))?,
            );
        }
        Ok(Scheduler {
            shared,
            next_ticket: AtomicU64::new(0),
            batching,
            instances,
            threads,
            max_in_flight,
            may_inline,
        })
    }

    /// Stops the instances and waits until each has finished its batch, dropped its session and
    /// exited. Blocking: call it off the async runtime.
    pub fn stop(mut self) {
        let threads = std::mem::take(&mut self.threads);
        let shared = Arc::clone(&self.shared);
        let instances = self.instances;
        drop(self);
        for thread in threads {
            let _ = thread.join();
        }
        // A caller running inline still holds its session; it returns it when its run ends.
        let mut queue = shared.lock();
        while queue.free.len() < instances {
            queue = shared
                .work
                .wait_timeout(queue, Duration::from_millis(5))
                .map_or_else(|e| e.into_inner().0, |(q, _)| q);
        }
        queue.free.clear();
    }

    /// Number of instances serving this version.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// Queues a request and waits for its outcome. If this future is dropped first (the client
    /// went away), the request leaves the queue; if it is already running, its result is dropped.
    ///
    /// # Errors
    /// [`ScheduleError`] for rejections, timeouts, model failures and a stopped scheduler.
    pub async fn submit(&self, request: Request) -> Result<Outcome, ScheduleError> {
        let _admitted = self.admit()?;
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = oneshot::channel();
        let recent = &self.shared.recent_infer;
        if self.may_inline
            && (recent.below(ALWAYS_INLINE_MAX_INFER)
                || (self.shared.in_flight.load(Ordering::Relaxed) == 1
                    && recent.below(INLINE_MAX_INFER)))
        {
            if let Some(backend) = self.shared.take_idle_session() {
                let now = Instant::now();
                if request.deadline.is_some_and(|deadline| deadline <= now) {
                    self.shared.give_back(backend);
                    return Err(ScheduleError::Deadline);
                }
                let job = Job {
                    inputs: request.inputs,
                    rows: request.rows,
                    ticket,
                    enqueued: now,
                    reply,
                };
                let mut backend = backend;
                let answers = execute(backend.as_mut(), vec![job], &self.shared);
                self.shared.give_back(backend);
                let (_, result) = answers.into_iter().next().ok_or(ScheduleError::Stopped)?;
                return result;
            }
        }
        let signature = if self.batching {
            self.shared.layout.signature(&request.inputs)
        } else {
            0
        };
        let submission = Submission {
            batch_size: request.rows,
            signature,
            priority: request.priority,
            deadline: request.deadline,
            timeout: request.timeout,
            payload: Job {
                inputs: request.inputs,
                rows: request.rows,
                ticket,
                enqueued: Instant::now(),
                reply,
            },
        };
        let rejection_at = {
            let mut queue = self.shared.lock();
            if queue.stopped {
                return Err(ScheduleError::Stopped);
            }
            let now = Instant::now();
            self.shared.observe_in_flight(&mut queue, now);
            let pushed = queue.state.push(submission, now);
            self.shared.stats.set_pending(queue.state.len());
            pushed.map_err(|(rejection, _)| ScheduleError::from(rejection))?
        };
        self.shared.work.notify_one();
        let mut guard = CancelOnDrop {
            shared: &self.shared,
            ticket: Some(ticket),
        };
        if let Some((at, rejection)) = rejection_at {
            if let Ok(outcome) = tokio::time::timeout_at(at.into(), &mut answer).await {
                guard.ticket = None;
                return outcome.map_err(|_| ScheduleError::Stopped)?;
            }
            // Still queued: it leaves the queue unanswered. Already running: wait for it.
            if self.shared.cancel(ticket) {
                guard.ticket = None;
                return Err(rejection.into());
            }
        }
        let outcome = answer.await;
        guard.ticket = None;
        outcome.map_err(|_| ScheduleError::Stopped)?
    }
}

impl Scheduler {
    /// Counts a request in flight for as long as the guard lives, refusing it at once when the
    /// version is at its limit: overload is answered, never queued without bound.
    fn admit(&self) -> Result<InFlight<'_>, ScheduleError> {
        let in_flight = &self.shared.in_flight;
        let count = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = InFlight(in_flight);
        if self.max_in_flight > 0 && count > self.max_in_flight {
            return Err(ScheduleError::Overloaded(self.max_in_flight));
        }
        Ok(guard)
    }
}

/// One request counted in [`Shared::in_flight`] until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// A free session, when nothing is queued (a queued request goes first), a queued request
    /// would not wait to be batched, and the scheduler runs.
    fn take_idle_session(&self) -> Option<Box<dyn Backend>> {
        let mut queue = self.lock();
        if queue.stopped || !queue.state.is_empty() || queue.state.waits_for_company() {
            return None;
        }
        queue.free.pop()
    }

    /// Returns a session to the pool, waking an instance thread if work is waiting for it.
    fn give_back(&self, backend: Box<dyn Backend>) {
        let mut queue = self.lock();
        queue.free.push(backend);
        let waiting = !queue.state.is_empty() || queue.stopped;
        drop(queue);
        if waiting {
            self.work.notify_all();
        }
    }

    /// Tells the batcher how many requests are in flight (see [`State::observe_in_flight`]).
    fn observe_in_flight(&self, queue: &mut Queue, now: Instant) {
        let count = self.in_flight.load(Ordering::Relaxed);
        queue.state.observe_in_flight(count, now);
    }

    /// Removes a queued request; false if it already left the queue.
    fn cancel(&self, ticket: u64) -> bool {
        let mut queue = self.lock();
        let removed = queue.state.cancel(|job| job.ticket == ticket).is_some();
        self.stats.set_pending(queue.state.len());
        removed
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.work.notify_all();
    }
}

/// Takes a request out of the queue when its caller stops waiting.
struct CancelOnDrop<'a> {
    shared: &'a Shared,
    ticket: Option<u64>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.shared.cancel(ticket);
        }
    }
}

fn instance_loop(shared: &Shared) {
    while let Some((jobs, mut backend)) = next_batch(shared) {
        // Waiting for the rate limiter counts as queue time, as in Triton.
        let permit = backend.admit();
        let answers = execute(backend.as_mut(), jobs, shared);
        drop(permit);
        shared.give_back(backend);
        send_answers(answers);
    }
}

/// Waits for the next batch and a free session to run it; `None` once the scheduler stops.
fn next_batch(shared: &Shared) -> Option<(Vec<Job>, Box<dyn Backend>)> {
    let mut queue = shared.lock();
    loop {
        if queue.stopped {
            return None;
        }
        let now = Instant::now();
        for (job, rejection) in queue.state.expire(now) {
            let _ = job.reply.send(Err(rejection.into()));
        }
        if queue.free.is_empty() {
            // Every session is out (some with inline callers): wait for one to come back.
            queue = match queue.state.next_expiry() {
                Some(at) => {
                    let wait = at.saturating_duration_since(now);
                    shared
                        .work
                        .wait_timeout(queue, wait)
                        .map_or_else(|e| e.into_inner().0, |(q, _)| q)
                }
                None => shared.work.wait(queue).unwrap_or_else(|e| e.into_inner()),
            };
            continue;
        }
        // Taking a session leaves another free for whoever comes next.
        let spare_instance = queue.free.len() >= 2;
        shared.observe_in_flight(&mut queue, now);
        match queue.state.next_batch(now, spare_instance) {
            Next::Batch(mut jobs) => {
                jobs.retain(|job| !job.reply.is_closed());
                if jobs.is_empty() {
                    continue;
                }
                shared.stats.set_pending(queue.state.len());
                if !queue.state.is_empty() {
                    shared.work.notify_one(); // more work for another idle instance
                }
                let backend = queue
                    .free
                    .pop()
                    .expect("a free session was checked for above");
                return Some((jobs, backend));
            }
            Next::WaitUntil(at) => {
                let wait = at.saturating_duration_since(now);
                queue = shared
                    .work
                    .wait_timeout(queue, wait)
                    .map_or_else(|e| e.into_inner().0, |(q, _)| q);
            }
            Next::Idle => {
                queue = shared.work.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

/// Each request's reply channel with what to send on it.
type Answers = Vec<(
    oneshot::Sender<Result<Outcome, ScheduleError>>,
    Result<Outcome, ScheduleError>,
)>;

fn send_answers(answers: Answers) {
    for (reply, result) in answers {
        let _ = reply.send(result);
    }
}

/// Merges, runs and splits one batch; the answers are sent by the caller once the session is
/// back in the pool, so that a client's next request finds it free.
fn execute(backend: &mut dyn Backend, jobs: Vec<Job>, shared: &Shared) -> Answers {
    let stats = &shared.stats;
    let start = Instant::now();
    let rows: Vec<usize> = jobs.iter().map(|job| job.rows).collect();
    let inputs: Vec<&[Tensor]> = jobs.iter().map(|job| job.inputs.as_slice()).collect();
    let merged = shared.layout.assemble(&inputs);
    let ran = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| backend.run(&merged)))
        .unwrap_or_else(|_| Err(BackendError::Run("model instance panicked".into())));
    drop(merged);
    // One request's bad input (say, a text too long for a model that does not truncate) must
    // not fail the requests it was batched with: run each of them alone.
    if jobs.len() > 1 && matches!(result, Err(BackendError::Input(_))) {
        return jobs
            .into_iter()
            .flat_map(|job| execute(backend, vec![job], shared))
            .collect();
    }
    let inferred = Instant::now();
    shared.recent_infer.record(inferred - ran);
    let split = result.map_err(ScheduleError::from).and_then(|outputs| {
        shared
            .layout
            .split(outputs, &rows, &inputs)
            .map_err(|e| ScheduleError::Backend(BackendError::Run(e)))
    });
    let times = ComputeTimes {
        input: ran - start,
        infer: inferred - ran,
        output: inferred.elapsed(),
    };
    let gpu = backend.gpu();
    stats.record_execution(rows.iter().sum(), times, gpu);
    match split {
        Ok(per_request) => jobs
            .into_iter()
            .zip(per_request)
            .map(|(job, outputs)| {
                let queue = start.saturating_duration_since(job.enqueued);
                let outcome = Outcome {
                    outputs,
                    started: start,
                    queue,
                    compute: times,
                    gpu,
                };
                (job.reply, Ok(outcome))
            })
            .collect(),
        Err(error) => jobs
            .into_iter()
            .map(|job| (job.reply, Err(error.clone())))
            .collect(),
    }
}

#[cfg(test)]
mod tests;
