//! What an instance thread does: waits for the next batch and a free session, runs the batch,
//! puts back what the model rescheduled and answers the rest. A lone request run inline on its
//! caller's thread goes through the same [`execute`].

use super::state::Next;
use super::{Instance, Job, Outcome, Queue, Reply, ScheduleError, Shared};
use crate::backend::BackendError;
use crate::metrics::ComputeTimes;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::Duration;

/// Instance threads running now, of every scheduler in the process.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// How long a thread without work waits for some: [`super::LINGER`] while the process runs at
/// most four instance threads per core, none past that (a busy server with many models keeps
/// threads for the work, not for the models that had some a moment ago).
fn linger() -> Duration {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if RUNNING.load(Ordering::Relaxed) > 4 * cores {
        Duration::ZERO
    } else {
        super::LINGER
    }
}

/// Counts one instance thread in [`RUNNING`] while it lives.
struct Running;

impl Running {
    fn enter() -> Running {
        RUNNING.fetch_add(1, Ordering::Relaxed);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs batches until the scheduler stops or no work has come for a while ([`linger`]);
/// counted in the queue's `threads` until it returns.
pub(super) fn instance_loop<I: Instance>(shared: &Arc<Shared<I>>) {
    let _running = Running::enter();
    while let Some((jobs, mut backend)) = next_batch(shared) {
        // Waiting for the rate limiter counts as queue time, as in Triton.
        let permit = backend.admit();
        let (answers, again) = execute(&mut backend, jobs, shared);
        drop(permit);
        requeue(shared, again);
        shared.give_back(backend);
        send_answers::<I>(answers);
    }
}

impl<I: Instance> Shared<I> {
    /// Hands work just queued (under the lock, `queue`) to an instance thread: a waiting one, or
    /// one started now when none waits and fewer than one per instance run (a busy one takes
    /// it when its batch is done otherwise).
    pub(super) fn wake(self: &Arc<Self>, mut queue: MutexGuard<'_, Queue<I>>) {
        if queue.waiting > 0 || queue.threads >= self.instances || queue.stopped {
            drop(queue);
            self.work.notify_one();
            return;
        }
        queue.threads += 1;
        queue.started += 1;
        let name = format!("{}-{}", self.label, queue.started - 1);
        drop(queue);
        let serves = Arc::clone(self);
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || instance_loop(&serves))
        {
            Ok(thread) => {
                let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
                threads.retain(|thread| !thread.is_finished());
                threads.push(thread);
            }
            Err(error) => {
                // A busy thread takes the work when its batch is done; with none, the queued
                // requests are answered now rather than left waiting.
                tracing::warn!(
                    "cannot start an instance thread for {}: {error}",
                    self.label
                );
                let mut queue = self.lock();
                queue.threads -= 1;
                if queue.threads == 0 {
                    let failed = format!("cannot start an instance thread: {error}");
                    while let Some(job) = queue.state.cancel(|_| true) {
                        let error = BackendError::Run(failed.clone());
                        let _ = job.reply.send(Err(error.into()));
                    }
                    self.report_pending(&mut queue);
                }
            }
        }
    }
}

/// Waits for the next batch and a free session to run it; `None` (the thread leaving the
/// queue's count) once the scheduler stops, or when no work has come for a while ([`linger`]).
fn next_batch<I: Instance>(shared: &Shared<I>) -> Option<(Vec<Job<I>>, I)> {
    let mut queue = shared.lock();
    loop {
        if queue.stopped {
            queue.threads -= 1;
            return None;
        }
        let now = shared.clock.now();
        for (job, rejection) in queue.state.expire(now) {
            let _ = job.reply.send(Err(rejection.into()));
        }
        shared.report_pending(&mut queue);
        if queue.state.is_empty() {
            // No work: wait a while for some, then leave.
            queue.waiting += 1;
            let (mut guard, waited) = shared
                .work
                .wait_timeout(queue, linger())
                .unwrap_or_else(|e| e.into_inner());
            guard.waiting -= 1;
            if waited.timed_out() && guard.state.is_empty() && !guard.stopped {
                guard.threads -= 1;
                return None;
            }
            queue = guard;
            continue;
        }
        if queue.free.is_empty() {
            // Every session is out (some with inline callers): wait for one to come back.
            queue.waiting += 1;
            queue = match queue.state.next_expiry() {
                Some(at) => {
                    let wait = at.saturating_duration_since(now);
                    shared.clock.wait_timeout(&shared.work, queue, wait)
                }
                None => shared.work.wait(queue).unwrap_or_else(|e| e.into_inner()),
            };
            queue.waiting -= 1;
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
                shared.report_pending(&mut queue);
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
                queue.waiting += 1;
                queue = shared.clock.wait_timeout(&shared.work, queue, wait);
                queue.waiting -= 1;
            }
            Next::Idle => {
                queue.waiting += 1;
                queue = shared.work.wait(queue).unwrap_or_else(|e| e.into_inner());
                queue.waiting -= 1;
            }
        }
    }
}

/// Each request's reply channel with what to send on it.
type Answers<I> = Vec<(
    Reply<I>,
    Result<Outcome<<I as Instance>::Output>, ScheduleError>,
)>;

fn send_answers<I: Instance>(answers: Answers<I>) {
    for (reply, result) in answers {
        let _ = reply.send(result);
    }
}

/// Puts the requests a model rescheduled back in the queue (before their instance takes its next
/// batch, so that they may join it); answered `Stopped` when the scheduler has stopped.
pub(super) fn requeue<I: Instance>(shared: &Arc<Shared<I>>, jobs: Vec<Job<I>>) {
    if jobs.is_empty() {
        return;
    }
    let mut queue = shared.lock();
    let now = shared.clock.now();
    for mut job in jobs {
        if queue.stopped {
            let _ = job.reply.send(Err(ScheduleError::Stopped));
            continue;
        }
        job.enqueued = now;
        let (rows, signature) = (job.rows, shared.layout.signature(I::tensors(&job.input)));
        queue.state.requeue(job, rows, signature, now);
    }
    shared.report_pending(&mut queue);
    shared.wake(queue);
}

/// Runs one batch; the answers are sent by the caller once the instance is back in the pool, so
/// that a client's next request finds it free. Requests the model rescheduled come back apart,
/// unanswered, to be queued again.
pub(super) fn execute<I: Instance>(
    instance: &mut I,
    mut jobs: Vec<Job<I>>,
    shared: &Shared<I>,
) -> (Answers<I>, Vec<Job<I>>) {
    let start = shared.clock.now();
    let rows: Vec<usize> = jobs.iter().map(|job| job.rows).collect();
    let (result, times) = {
        let mut batch: Vec<&mut I::Input> = jobs.iter_mut().map(|job| &mut job.input).collect();
        catch_unwind(AssertUnwindSafe(|| instance.run(&mut batch, &rows))).unwrap_or_else(|_| {
            let panicked = BackendError::Run("model instance panicked".into());
            (Err(panicked), ComputeTimes::default())
        })
    };
    // One request's bad input (say, a text too long for a model that does not truncate) must
    // not fail the requests it was batched with: run each of them alone.
    if jobs.len() > 1 && matches!(result, Err(BackendError::Input(_))) {
        let (mut answers, mut again) = (Vec::new(), Vec::new());
        for job in jobs {
            let (answered, rescheduled) = execute(instance, vec![job], shared);
            answers.extend(answered);
            again.extend(rescheduled);
        }
        return (answers, again);
    }
    shared.recent_infer.record(times.infer);
    let gpu = instance.gpu();
    shared.stats.record_execution(rows.iter().sum(), times, gpu);
    let result = result.and_then(|outputs| {
        if outputs.len() == jobs.len() {
            Ok(outputs)
        } else {
            Err(BackendError::Run(format!(
                "the instance answered {} of {} requests",
                outputs.len(),
                jobs.len()
            )))
        }
    });
    match result {
        Ok(outputs) => {
            let mut again = Vec::new();
            let answers = jobs
                .into_iter()
                .zip(outputs)
                .filter_map(|(job, outputs)| {
                    if I::rescheduled(&outputs) {
                        again.push(job);
                        return None;
                    }
                    let outcome = Outcome {
                        outputs,
                        started: start,
                        queue: start.saturating_duration_since(job.enqueued),
                        compute: times,
                        gpu,
                    };
                    Some((job.reply, Ok(outcome)))
                })
                .collect();
            (answers, again)
        }
        Err(error) => {
            let error = ScheduleError::from(error);
            let answers = jobs
                .into_iter()
                .map(|job| (job.reply, Err(error.clone())))
                .collect();
            (answers, Vec::new())
        }
    }
}
