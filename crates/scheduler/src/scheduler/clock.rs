//! The scheduler's time: when a request was queued, when a batch is due, how long a run took,
//! and the timed waits in between. In production it is the system's; the unit tests give a
//! scheduler a `ManualClock` instead, which moves only when the test moves it, so that tests
//! of batching delays, deadlines and grace periods neither sleep nor race a loaded machine.

use std::future::Future;
use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

#[cfg(test)]
pub use manual::ManualClock;

/// Where the scheduler reads the time and how it waits for a moment. A plain enum whose first
/// arm is the real clock: outside the tests it has no other arm, so it takes no room and every
/// `match` on it is the system call alone (no allocation, lock or branch on the request path).
/// (The test variant has named fields: `src/layers.rs` blanks a `#[cfg(test)]` item up to its
/// first closing brace, which for a tuple variant's arm would be the `match`'s own.)
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    #[cfg(test)]
    Manual { clock: std::sync::Arc<ManualClock> },
}

// Outside the tests the clock takes no room, as said above.
#[cfg(not(test))]
const _: () = assert!(std::mem::size_of::<Clock>() == 0);

impl Clock {
    pub fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            #[cfg(test)]
            Clock::Manual { clock } => clock.now(),
        }
    }

    /// Waits on `condvar` (releasing `guard`'s lock meanwhile) until it is notified or `timeout`
    /// has passed on this clock; wakes spuriously as a `Condvar` may. A poisoned lock is
    /// recovered: nothing panics while holding the scheduler's.
    pub fn wait_timeout<'a, T>(
        &self,
        condvar: &Condvar,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> MutexGuard<'a, T> {
        match self {
            Clock::System => condvar
                .wait_timeout(guard, timeout)
                .map_or_else(|e| e.into_inner().0, |(guard, _)| guard),
            #[cfg(test)]
            Clock::Manual { clock } => clock.wait_timeout(condvar, guard, timeout),
        }
    }

    /// `future`'s output, or `None` once `at` comes first.
    pub async fn timeout_at<F: Future>(&self, at: Instant, future: F) -> Option<F::Output> {
        match self {
            Clock::System => tokio::time::timeout_at(at.into(), future).await.ok(),
            #[cfg(test)]
            Clock::Manual { clock } => clock.timeout_at(at, future).await,
        }
    }
}

#[cfg(test)]
mod manual {
    use std::future::Future;
    use std::sync::{Condvar, Mutex, MutexGuard};
    use std::time::{Duration, Instant};
    use tokio::sync::watch;

    /// A clock for tests: it starts at the moment it is made and moves only by
    /// [`ManualClock::advance`] (or [`ManualClock::advance_to`]), which wakes every timed wait
    /// of the schedulers that read it. A test that must let time pass while an instance waits
    /// (a batching delay) awaits [`ManualClock::next_timer`]: the moment the first thread in a
    /// timed wait waits for.
    pub struct ManualClock {
        start: Instant,
        /// How far the clock has moved, and the timed waits in progress; async waiters (callers
        /// timing a deadline, tests awaiting a timer) watch it.
        time: watch::Sender<Time>,
        /// One per scheduler reading this clock: wakes its instance threads (see
        /// [`ManualClock::on_advance`]).
        wakers: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    }

    #[derive(Debug, Default)]
    struct Time {
        elapsed: Duration,
        /// Each thread in a timed wait: its number and the moment it waits for.
        timers: Vec<(u64, Instant)>,
        next_timer: u64,
    }

    impl std::fmt::Debug for ManualClock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ManualClock")
                .field("time", &*self.time.borrow())
                .finish_non_exhaustive()
        }
    }

    impl ManualClock {
        pub fn new() -> std::sync::Arc<ManualClock> {
            std::sync::Arc::new(ManualClock {
                start: Instant::now(),
                time: watch::Sender::new(Time::default()),
                wakers: Mutex::new(Vec::new()),
            })
        }

        pub fn now(&self) -> Instant {
            self.start + self.time.borrow().elapsed
        }

        /// Calls `wake` on every move of the clock. A scheduler registers one that takes its
        /// queue's lock before notifying its condvar: a thread that read the time under that
        /// lock is then either waiting already (and woken) or reads the new time.
        pub fn on_advance(&self, wake: Box<dyn Fn() + Send + Sync>) {
            self.wakers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(wake);
        }

        /// Moves the clock on by `by` and wakes the timed waits. Never call it while holding a
        /// scheduler's queue lock (the wakers take it).
        pub fn advance(&self, by: Duration) {
            self.time.send_modify(|time| {
                time.elapsed += by;
                let now = self.start + time.elapsed;
                // A wait whose moment came is over, even before its thread wakes to say so.
                time.timers.retain(|&(_, at)| at > now);
            });
            for wake in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                wake();
            }
        }

        /// Moves the clock on to `at` (not back if it is past).
        pub fn advance_to(&self, at: Instant) {
            self.advance(at.saturating_duration_since(self.now()));
        }

        /// The earliest moment a thread in a timed wait waits for, once there is one.
        pub async fn next_timer(&self) -> Instant {
            let mut watched = self.time.subscribe();
            let time = watched
                .wait_for(|time| !time.timers.is_empty())
                .await
                .expect("the clock outlives its receivers");
            time.timers
                .iter()
                .map(|&(_, at)| at)
                .min()
                .expect("not empty")
        }

        pub(super) fn wait_timeout<'a, T>(
            &self,
            condvar: &Condvar,
            guard: MutexGuard<'a, T>,
            timeout: Duration,
        ) -> MutexGuard<'a, T> {
            if timeout.is_zero() {
                return guard;
            }
            let mut number = 0;
            self.time.send_modify(|time| {
                number = time.next_timer;
                time.next_timer += 1;
                let at = self.start + time.elapsed + timeout;
                time.timers.push((number, at));
            });
            // No real timeout: only a notification or a move of the clock (whose waker
            // notifies) ends the wait.
            let guard = condvar.wait(guard).unwrap_or_else(|e| e.into_inner());
            self.time.send_if_modified(|time| {
                let before = time.timers.len();
                time.timers.retain(|&(n, _)| n != number);
                time.timers.len() != before
            });
            guard
        }

        pub(super) async fn timeout_at<F: Future>(
            &self,
            at: Instant,
            future: F,
        ) -> Option<F::Output> {
            let mut watched = self.time.subscribe();
            let start = self.start;
            let passed = watched.wait_for(|time| start + time.elapsed >= at);
            tokio::select! {
                biased;
                output = future => Some(output),
                _ = passed => None,
            }
        }
    }
}
