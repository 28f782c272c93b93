//! The per-model-version scheduler. The batching [`State`] (pure, unit-tested) sits behind one
//! mutex; instance threads pull from it, each with a free session: a thread takes the next batch
//! as soon as the batching rules allow (or sleeps on a condition variable until a request
//! arrives or the batching delay ends), merges it, runs it, splits the outputs and answers every
//! request itself. A thread starts when a request is queued and none waits for it, up to one per
//! instance, and ends once it has had no work for a while (`worker.rs`): a version nobody calls
//! has none.
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
//!
//! What an instance is, the scheduler does not mind ([`Instance`]): an ONNX Runtime session
//! ([`Session`]: the batch's inputs merged, run once, the outputs split) or a Python model's
//! stub (the requests handed over as a list), each with the same queues, priorities, policies,
//! delays and rate limiter, as Triton's schedulers serve every backend.

pub mod batch;
pub mod clock;
pub mod layout;
pub mod rate_limit;
pub mod state;
mod worker;

use crate::backend::{Backend, BackendError};
use crate::core::Tensor;
use crate::metrics::{ComputeTimes, ModelStats, Timing};
use clock::Clock;
use state::{Rejection, State, Submission};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub use state::{BatchingConfig, QueuePolicy, TimeoutAction};
use worker::{execute, requeue};

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

/// One model instance as the scheduler drives it: a batch of requests at a time, on an instance
/// thread (or, for a quick model, on a caller's: [`Instance::may_run_inline`]).
pub trait Instance: Send + 'static {
    /// What a request brings (for an ONNX session, its input tensors).
    type Input: Send + 'static;
    /// What a request gets back (for an ONNX session, its output tensors).
    type Output: Send + 'static;

    /// A request's input tensors: requests batch together only when theirs agree in shape
    /// (see [`layout::BatchLayout::signature`]).
    fn tensors(input: &Self::Input) -> &[Tensor];

    /// Runs one batch, `rows[i]` rows from request `i`: one output per request, in order, or the
    /// error that fails them all (a [`BackendError::Input`] error of a batch of several runs
    /// each request again alone); and where the time went.
    fn run(
        &mut self,
        batch: &mut [&mut Self::Input],
        rows: &[usize],
    ) -> (Result<Vec<Self::Output>, BackendError>, ComputeTimes);

    /// Whether a lone request may run on the caller's (network) thread when the model is quick.
    fn may_run_inline(&self) -> bool {
        false
    }

    /// Whether the instance's answer to a request says the model rescheduled it (Triton's
    /// `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`): the request goes back in the queue, to run
    /// again in a later batch, before the instance takes its next one, instead of being answered.
    fn rescheduled(_output: &Self::Output) -> bool {
        false
    }

    /// The CUDA ordinal of the GPU this instance runs on (`None`: CPU).
    fn gpu(&self) -> Option<i32> {
        None
    }

    /// Waits until the rate limiter lets this instance run, and holds its resources until the
    /// permit is dropped (`--rate-limit`; `None`: the instance is not limited).
    fn admit(&self) -> Option<rate_limit::Permit> {
        None
    }

    /// Ends the instance when its version stops, after its last batch (dropping it otherwise).
    fn retire(self)
    where
        Self: Sized,
    {
    }
}

/// An ONNX Runtime session (or a backend wrapping one) with its version's batch layout: a batch's
/// inputs are merged, run once, and the outputs split among the requests.
pub struct Session {
    backend: Box<dyn Backend>,
    layout: Arc<layout::BatchLayout>,
    /// Its place in the rate limiter, if it is limited.
    limit: Option<rate_limit::Limit>,
    /// Times its runs (the system's clock but in unit tests).
    clock: Clock,
}

impl Session {
    pub fn new(
        backend: Box<dyn Backend>,
        layout: Arc<layout::BatchLayout>,
        limit: Option<rate_limit::Limit>,
    ) -> Session {
        Session {
            backend,
            layout,
            limit,
            clock: Clock::System,
        }
    }
}

impl Instance for Session {
    type Input = Vec<Tensor>;
    type Output = Vec<Tensor>;

    fn tensors(input: &Vec<Tensor>) -> &[Tensor] {
        input
    }

    fn run(
        &mut self,
        batch: &mut [&mut Vec<Tensor>],
        rows: &[usize],
    ) -> (Result<Vec<Vec<Tensor>>, BackendError>, ComputeTimes) {
        let start = self.clock.now();
        let inputs: Vec<&[Tensor]> = batch.iter().map(|inputs| inputs.as_slice()).collect();
        let merged = self.layout.assemble(&inputs);
        let ran = self.clock.now();
        let result = self.backend.run(&merged);
        drop(merged);
        let inferred = self.clock.now();
        let split = result.and_then(|outputs| {
            self.layout
                .split(outputs, rows, &inputs)
                .map_err(BackendError::Run)
        });
        let times = ComputeTimes {
            input: ran - start,
            infer: inferred - ran,
            output: self.clock.now().saturating_duration_since(inferred),
        };
        (split, times)
    }

    /// Never a limited one: waiting for resources would block the network thread.
    fn may_run_inline(&self) -> bool {
        self.limit.is_none() && self.backend.may_run_inline()
    }

    fn gpu(&self) -> Option<i32> {
        self.backend.gpu()
    }

    fn admit(&self) -> Option<rate_limit::Permit> {
        self.limit.as_ref().map(rate_limit::Limit::admit)
    }
}

/// A validated request on its way to an instance.
#[derive(Debug)]
pub struct Request<T = Vec<Tensor>> {
    /// For an ONNX session, the inputs in the model's layout and in the model's input order.
    pub inputs: T,
    /// Rows this request contributes to a batch (1 for models without a batch dimension).
    pub rows: usize,
    pub priority: Option<u64>,
    /// The request's own `timeout` parameter.
    pub timeout: Option<Duration>,
    /// The client's deadline (gRPC `grpc-timeout`).
    pub deadline: Option<Instant>,
}

impl<T> Request<T> {
    /// The same request, its inputs made into what another kind of instance takes.
    pub fn map<U>(self, make: impl FnOnce(T) -> U) -> Request<U> {
        Request {
            inputs: make(self.inputs),
            rows: self.rows,
            priority: self.priority,
            timeout: self.timeout,
            deadline: self.deadline,
        }
    }
}

/// A request's outputs and where its time went.
#[derive(Debug)]
pub struct Outcome<T = Vec<Tensor>> {
    pub outputs: T,
    /// When its batch started (merging inputs, then running the model).
    pub started: Instant,
    pub queue: Duration,
    pub compute: ComputeTimes,
    /// The GPU (CUDA ordinal) of the instance that ran it; `None`: a CPU instance.
    pub gpu: Option<i32>,
}

impl<T> Outcome<T> {
    /// The same outcome with `f` of its outputs.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        Outcome {
            outputs: f(self.outputs),
            started: self.started,
            queue: self.queue,
            compute: self.compute,
            gpu: self.gpu,
        }
    }

    /// The request's time queued and computing, and where it ran.
    pub fn timing(&self) -> Timing {
        Timing {
            queue: self.queue,
            compute: self.compute,
            gpu: self.gpu,
        }
    }
}

/// Where a request's outcome goes.
type Reply<I> = oneshot::Sender<Result<Outcome<<I as Instance>::Output>, ScheduleError>>;

struct Job<I: Instance> {
    input: I::Input,
    rows: usize,
    ticket: u64,
    enqueued: Instant,
    reply: Reply<I>,
}

/// What the caller and the instances share.
struct Shared<I: Instance> {
    queue: Mutex<Queue<I>>,
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
    /// What queue times, batching delays, deadlines and grace periods are timed by.
    clock: Clock,
    /// Instance threads are named `<label>-<n>`.
    label: String,
    /// The most instance threads at once: one per instance.
    instances: usize,
    /// The instance threads started, joined by [`Scheduler::halt`] (finished ones are dropped as
    /// new ones start).
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// How long an instance thread with no work waits for some before it ends: an idle version
/// costs no thread, and a busy one does not start a thread per request.
const LINGER: Duration = Duration::from_secs(1);

struct Queue<I: Instance> {
    state: State<Job<I>>,
    stopped: bool,
    /// Sessions running nothing. An instance thread takes one with each batch; a caller running
    /// its request inline takes one too, so a thread with a batch may have to wait for one.
    free: Vec<I>,
    /// The queue's length as last added to the version's pending-request gauge (which the
    /// schedulers of a stateful Python model's instances share).
    reported: usize,
    /// Instance threads running now: one starts when work is queued and none waits for it, up
    /// to one per instance; each ends after [`LINGER`] without work.
    threads: usize,
    /// Of those, the ones waiting (for work, a batching delay or a free session).
    waiting: usize,
    /// Threads started so far, which number their names.
    started: usize,
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

impl<I: Instance> Shared<I> {
    fn lock(&self) -> MutexGuard<'_, Queue<I>> {
        // A panic never happens while the lock is held (backends run outside it); recover anyway.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The scheduler of one model version (of one instance, for a stateful Python model's). Its
/// instance threads start when requests queue and end when there is none: an idle version has
/// none. Dropping it stops the instances once they finish the batch they are running; requests
/// still queued are answered [`ScheduleError::Stopped`]. [`Scheduler::halt`] does the same and
/// waits for the threads, so a caller knows the instances are freed when it returns.
pub struct Scheduler<I: Instance = Session> {
    shared: Arc<Shared<I>>,
    next_ticket: AtomicU64,
    batching: bool,
    instances: usize,
    /// 0: no limit (see [`BatchingConfig::max_in_flight`]).
    max_in_flight: usize,
    /// The instances may run on a caller's thread (see [`Instance::may_run_inline`]).
    may_inline: bool,
}

impl Scheduler {
    /// Starts a scheduler of one [`Session`] per ONNX backend, with the config's batch layout and
    /// no rate limit (what the tests run); its threads are named `<label>-<n>`.
    #[cfg(any(test, feature = "testing"))]
    pub fn start(
        label: &str,
        config: BatchingConfig,
        backends: Vec<Box<dyn Backend>>,
        stats: Arc<ModelStats>,
    ) -> Scheduler {
        Scheduler::start_clocked(label, config, backends, stats, Clock::System)
    }

    /// [`Scheduler::start`] with the scheduler and its sessions on `clock`.
    #[cfg(any(test, feature = "testing"))]
    pub fn start_clocked(
        label: &str,
        config: BatchingConfig,
        backends: Vec<Box<dyn Backend>>,
        stats: Arc<ModelStats>,
        clock: Clock,
    ) -> Scheduler {
        let layout = &config.layout;
        let sessions = backends
            .into_iter()
            .map(|backend| Session {
                clock: clock.clone(),
                ..Session::new(backend, Arc::clone(layout), None)
            })
            .collect();
        Scheduler::launch_clocked(label, config, sessions, stats, clock)
    }

    /// Stops the instances and waits until each has finished its batch, dropped its session and
    /// exited. Blocking: call it off the async runtime.
    pub fn stop(self) {
        self.halt();
    }
}

impl<I: Instance> Scheduler<I> {
    /// Starts the scheduler of `instances`; its instance threads, named `<label>-<n>`, start as
    /// requests queue.
    pub fn launch(
        label: &str,
        config: BatchingConfig,
        instances: Vec<I>,
        stats: Arc<ModelStats>,
    ) -> Scheduler<I> {
        Scheduler::launch_clocked(label, config, instances, stats, Clock::System)
    }

    /// [`Scheduler::launch`] on `clock` (the system's but in unit tests).
    fn launch_clocked(
        label: &str,
        config: BatchingConfig,
        instances: Vec<I>,
        stats: Arc<ModelStats>,
        clock: Clock,
    ) -> Scheduler<I> {
        let batching = config.merges();
        let may_inline = instances.iter().all(Instance::may_run_inline);
        let max_in_flight = config.max_in_flight;
        let count = instances.len();
        let layout = Arc::clone(&config.layout);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                state: State::new(config),
                stopped: false,
                free: instances,
                reported: 0,
                threads: 0,
                waiting: 0,
                started: 0,
            }),
            work: Condvar::new(),
            stats,
            recent_infer: RecentInfer(AtomicU64::new(u64::MAX)),
            in_flight: AtomicUsize::new(0),
            layout,
            clock,
            label: label.to_string(),
            instances: count,
            threads: Mutex::new(Vec::new()),
        });
        #[cfg(test)]
        Shared::follow_clock(&shared);
        Scheduler {
            shared,
            next_ticket: AtomicU64::new(0),
            batching,
            instances: count,
            max_in_flight,
            may_inline,
        }
    }

    /// Stops the instances: the requests still queued are answered [`ScheduleError::Stopped`],
    /// each instance thread finishes its batch and exits, and every instance is retired
    /// ([`Instance::retire`]) once back (a caller running one inline gives it back when its run
    /// ends). Blocking: call it off the async runtime.
    pub fn halt(&self) {
        self.halt_within(None);
    }

    /// [`Scheduler::halt`], waiting at most `grace` (if given) for the batches still running:
    /// an instance that is not back by then is not retired but dropped when its batch ends (a
    /// Python model stuck in `execute` for a client long gone must not hold up the unloads
    /// after it).
    pub fn halt_within(&self, grace: Option<Duration>) {
        let clock = &self.shared.clock;
        let deadline = grace.map(|grace| clock.now() + grace);
        {
            let mut queue = self.shared.lock();
            queue.stopped = true;
            while let Some(job) = queue.state.cancel(|_| true) {
                let _ = job.reply.send(Err(ScheduleError::Stopped));
            }
            self.shared.report_pending(&mut queue);
        }
        self.shared.work.notify_all();
        let mut queue = self.shared.lock();
        while queue.free.len() < self.instances && deadline.is_none_or(|d| clock.now() < d) {
            queue = clock.wait_timeout(&self.shared.work, queue, Duration::from_millis(5));
        }
        let all_back = queue.free.len() == self.instances;
        let retired = std::mem::take(&mut queue.free);
        drop(queue);
        if all_back {
            // Every thread has given its instance back and is on its way out.
            let threads = std::mem::take(
                &mut *self
                    .shared
                    .threads
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            for thread in threads {
                let _ = thread.join();
            }
        } else {
            tracing::warn!(
                "{} of {} instances still running after {:?}: not waited for",
                self.instances - retired.len(),
                self.instances,
                grace.unwrap_or_default()
            );
        }
        retired.into_iter().for_each(Instance::retire);
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
    pub async fn submit(
        &self,
        request: Request<I::Input>,
    ) -> Result<Outcome<I::Output>, ScheduleError> {
        let _admitted = self.admit()?;
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = oneshot::channel();
        let recent = &self.shared.recent_infer;
        if self.may_inline
            && (recent.below(ALWAYS_INLINE_MAX_INFER)
                || (self.shared.in_flight.load(Ordering::Relaxed) == 1
                    && recent.below(INLINE_MAX_INFER)))
        {
            if let Some(instance) = self.shared.take_idle_session() {
                let now = self.shared.clock.now();
                if request.deadline.is_some_and(|deadline| deadline <= now) {
                    self.shared.give_back(instance);
                    return Err(ScheduleError::Deadline);
                }
                let job = Job {
                    input: request.inputs,
                    rows: request.rows,
                    ticket,
                    enqueued: now,
                    reply,
                };
                let mut instance = instance;
                let (answers, again) = execute(&mut instance, vec![job], &self.shared);
                requeue(&self.shared, again);
                self.shared.give_back(instance);
                return match answers.into_iter().next() {
                    Some((_, result)) => result,
                    // Rescheduled: it is queued now.
                    None => self.queued_answer(ticket, answer).await,
                };
            }
        }
        let signature = if self.batching {
            self.shared.layout.signature(I::tensors(&request.inputs))
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
                input: request.inputs,
                rows: request.rows,
                ticket,
                enqueued: self.shared.clock.now(),
                reply,
            },
        };
        let rejection_at = {
            let mut queue = self.shared.lock();
            if queue.stopped {
                return Err(ScheduleError::Stopped);
            }
            let now = self.shared.clock.now();
            self.shared.observe_in_flight(&mut queue, now);
            let pushed = queue.state.push(submission, now);
            self.shared.report_pending(&mut queue);
            let rejection_at = pushed.map_err(|(rejection, _)| ScheduleError::from(rejection))?;
            self.shared.wake(queue);
            rejection_at
        };
        if let Some((at, rejection)) = rejection_at {
            let mut guard = CancelOnDrop {
                shared: &self.shared,
                ticket: Some(ticket),
            };
            let waited = self.shared.clock.timeout_at(at, &mut answer).await;
            guard.ticket = None;
            if let Some(outcome) = waited {
                return outcome.map_err(|_| ScheduleError::Stopped)?;
            }
            // Still queued: it leaves the queue unanswered. Already running: wait for it.
            if self.shared.cancel(ticket) {
                return Err(rejection.into());
            }
        }
        self.queued_answer(ticket, answer).await
    }

    /// The answer of queued request `ticket`; a caller that goes away (drops this) takes the
    /// request out of the queue.
    async fn queued_answer(
        &self,
        ticket: u64,
        answer: oneshot::Receiver<Result<Outcome<I::Output>, ScheduleError>>,
    ) -> Result<Outcome<I::Output>, ScheduleError> {
        let mut guard = CancelOnDrop {
            shared: &self.shared,
            ticket: Some(ticket),
        };
        let outcome = answer.await;
        guard.ticket = None;
        outcome.map_err(|_| ScheduleError::Stopped)?
    }
}

impl<I: Instance> Scheduler<I> {
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

impl<I: Instance> Shared<I> {
    /// A free session, when nothing is queued (a queued request goes first), a queued request
    /// would not wait to be batched, and the scheduler runs.
    fn take_idle_session(&self) -> Option<I> {
        let mut queue = self.lock();
        if queue.stopped || !queue.state.is_empty() || queue.state.waits_for_company() {
            return None;
        }
        queue.free.pop()
    }

    /// Returns a session to the pool, waking an instance thread if work is waiting for it.
    fn give_back(&self, backend: I) {
        let mut queue = self.lock();
        queue.free.push(backend);
        let waiting = !queue.state.is_empty() || queue.stopped;
        drop(queue);
        if waiting {
            self.work.notify_all();
        }
    }

    /// Tells the batcher how many requests are in flight (see [`State::observe_in_flight`]).
    fn observe_in_flight(&self, queue: &mut Queue<I>, now: Instant) {
        let count = self.in_flight.load(Ordering::Relaxed);
        queue.state.observe_in_flight(count, now);
    }

    /// Brings the pending-request gauge up to date with the queue's length.
    fn report_pending(&self, queue: &mut Queue<I>) {
        let len = queue.state.len();
        if len != queue.reported {
            self.stats.add_pending(len as f64 - queue.reported as f64);
            queue.reported = len;
        }
    }

    /// Wakes the instance threads' timed waits whenever a test's manual clock moves.
    #[cfg(test)]
    fn follow_clock(shared: &Arc<Shared<I>>) {
        if let Clock::Manual { clock } = &shared.clock {
            let shared = Arc::downgrade(shared);
            clock.on_advance(Box::new(move || {
                if let Some(shared) = shared.upgrade() {
                    // Under the lock: a thread that read the time is waiting now, or reads anew.
                    drop(shared.lock());
                    shared.work.notify_all();
                }
            }));
        }
    }

    /// Removes a queued request; false if it already left the queue.
    fn cancel(&self, ticket: u64) -> bool {
        let mut queue = self.lock();
        let removed = queue.state.cancel(|job| job.ticket == ticket).is_some();
        self.report_pending(&mut queue);
        removed
    }
}

impl<I: Instance> Drop for Scheduler<I> {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.work.notify_all();
    }
}

/// Takes a request out of the queue when its caller stops waiting.
struct CancelOnDrop<'a, I: Instance> {
    shared: &'a Shared<I>,
    ticket: Option<u64>,
}

impl<I: Instance> Drop for CancelOnDrop<'_, I> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.shared.cancel(ticket);
        }
    }
}

#[cfg(test)]
mod tests;
