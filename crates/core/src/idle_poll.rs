//! Idle polling (`--idle-poll-us`): for a short window after each burst of work, CPUs that run
//! out of work keep polling instead of going idle.
//!
//! A request that arrives at a server whose threads all sleep pays for waking a CPU: cheap on a
//! busy machine, expensive on an idle one, and very expensive on a VM whose idle vCPUs halt (the
//! guest's `HLT` exits to the hypervisor, and the wake-up is an interrupt the host must deliver to
//! a descheduled vCPU). On the 2-vCPU benchmark VM (guest halt polling off) that cost is ~60 µs
//! of each round trip at concurrency 1, half of kiln's whole latency.
//!
//! The pollers are one thread per CPU the process may use, at `SCHED_IDLE` priority: they run
//! only on a CPU that has nothing else to run, and any thread that wakes there (a tokio worker
//! whose socket became readable, an instance thread, another process) takes the CPU from them at
//! once. So they take no CPU time from work; what they cost is CPU time (and power) while they
//! poll, which is why polling stops `window` after the last activity and the feature is off by
//! default. In a container with a CPU quota the polling counts against the quota. Near
//! saturation the pollers get only short idle gaps, each ended by a preemption instead of a
//! halt, and that costs: on the benchmark VM `add_sub` at concurrency 8 ran at 0.91x of its
//! throughput without polling (4 interleaved pairs).
//!
//! Activity is the async runtime's workers waking ([`Activity::mark`], from tokio's
//! `on_thread_unpark`): a request arriving or an answer coming back.
//!
//! The kernel can do this better where it is allowed to: a KVM guest's `haltpoll` cpuidle driver
//! polls in the idle task for up to `guest_halt_poll_ns` (200 µs by default) before it halts, and
//! a thread woken on a polling CPU needs neither an interrupt nor a preemption. With that on, the
//! benchmark VM ran `add_sub` at concurrency 1 at 2-2.5x the throughput these pollers reach,
//! and the pollers on top only added cost (0.54x), so kiln warns when both are on
//! ([`kernel_halt_poll_ns`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::warn;

/// Spin-loop hints between two looks at the activity counter (~2-4 µs on current x86).
const SPINS_PER_CHECK: usize = 64;

/// The pollers; dropping it stops them.
pub struct IdlePoll {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// A cheap handle that records activity (see [`IdlePoll::activity`]).
#[derive(Clone)]
pub struct Activity(Arc<Shared>);

struct Shared {
    /// Bumped on every activity; pollers keep polling while it moves.
    ticks: AtomicU64,
    /// Pollers asleep on `wake`.
    sleeping: AtomicUsize,
    stopped: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    window: Duration,
    /// Times a poller went back to polling after sleeping.
    #[cfg(test)]
    resumed: AtomicU64,
}

impl IdlePoll {
    /// Starts `threads` pollers that poll for `window` after each activity.
    ///
    /// # Errors
    /// The OS error when a thread cannot be spawned.
    pub fn start(window: Duration, threads: usize) -> std::io::Result<IdlePoll> {
        let shared = Arc::new(Shared {
            ticks: AtomicU64::new(0),
            sleeping: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            window,
            #[cfg(test)]
            resumed: AtomicU64::new(0),
        });
        let mut poll = IdlePoll {
            shared,
            threads: Vec::with_capacity(threads),
        };
        for index in 0..threads {
            let shared = Arc::clone(&poll.shared);
            poll.threads.push(
                std::thread::Builder::new()
                    .name(format!("idle-poll-{index}"))
                    .spawn(move || shared.run())?,
            );
        }
        Ok(poll)
    }

    /// The handle that records activity.
    pub fn activity(&self) -> Activity {
        Activity(Arc::clone(&self.shared))
    }
}

impl Drop for IdlePoll {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.wake_sleepers();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Activity {
    /// Records activity: pollers that poll keep polling, pollers that sleep start again.
    pub fn mark(&self) {
        let shared = &self.0;
        // SeqCst pairs with the poller's: it registers as sleeping, then looks at the ticks.
        shared.ticks.fetch_add(1, Ordering::SeqCst);
        if shared.sleeping.load(Ordering::SeqCst) > 0 {
            shared.wake_sleepers();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every sleeping poller. Taking the lock first means a poller between its last look
    /// at the ticks and its wait cannot miss the notification.
    fn wake_sleepers(&self) {
        drop(self.lock());
        self.wake.notify_all();
    }

    fn run(&self) {
        if let Err(e) = become_idle_class() {
            // Polling at normal priority would take CPU time from real work: do not poll.
            warn!("idle polling is off: cannot make a thread SCHED_IDLE: {e}");
            return;
        }
        let mut seen = self.ticks.load(Ordering::SeqCst);
        let mut since = Instant::now();
        while !self.stopped.load(Ordering::Relaxed) {
            for _ in 0..SPINS_PER_CHECK {
                std::hint::spin_loop();
            }
            let ticks = self.ticks.load(Ordering::Relaxed);
            if ticks != seen {
                seen = ticks;
                since = Instant::now();
            } else if since.elapsed() >= self.window {
                seen = self.sleep_until_active(seen);
                since = Instant::now();
            }
        }
    }

    /// Sleeps until the ticks move past `seen` (or the pollers stop); returns the new ticks.
    fn sleep_until_active(&self, seen: u64) -> u64 {
        let mut guard = self.lock();
        self.sleeping.fetch_add(1, Ordering::SeqCst);
        while self.ticks.load(Ordering::SeqCst) == seen && !self.stopped.load(Ordering::SeqCst) {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        self.sleeping.fetch_sub(1, Ordering::SeqCst);
        #[cfg(test)]
        self.resumed.fetch_add(1, Ordering::Relaxed);
        self.ticks.load(Ordering::SeqCst)
    }
}

/// How long the kernel itself polls an idle CPU before halting it, when it does: the `haltpoll`
/// cpuidle driver of KVM guests with `guest_halt_poll_ns` above 0. `None` elsewhere (bare metal,
/// other drivers, sysfs unreadable), where nothing is known.
pub fn kernel_halt_poll_ns() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    halt_poll_ns(
        &read("/sys/devices/system/cpu/cpuidle/current_driver")?,
        &read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")?,
    )
}

/// [`kernel_halt_poll_ns`] from the two sysfs files' contents.
fn halt_poll_ns(driver: &str, poll_ns: &str) -> Option<u64> {
    if driver.trim() != "haltpoll" {
        return None;
    }
    poll_ns.trim().parse().ok().filter(|&ns| ns > 0)
}

/// Moves the calling thread to the `SCHED_IDLE` class (no privilege needed).
fn become_idle_class() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` on the calling thread (pid 0) with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (up to 10 s) for `condition`; false if it never held.
    fn eventually(condition: impl Fn() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if condition() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn pollers_sleep_without_activity_and_resume_with_it() {
        let poll = IdlePoll::start(Duration::from_millis(2), 2).unwrap();
        let shared = Arc::clone(&poll.shared);
        assert!(eventually(|| shared.sleeping.load(Ordering::SeqCst) == 2));
        let resumed = shared.resumed.load(Ordering::Relaxed);
        poll.activity().mark();
        assert!(eventually(
            || shared.resumed.load(Ordering::Relaxed) >= resumed + 2
        ));
        // Polling ends again one window after the last activity.
        assert!(eventually(|| shared.sleeping.load(Ordering::SeqCst) == 2));
        drop(poll);
        assert_eq!(Arc::strong_count(&shared), 1, "the pollers have exited");
    }

    #[test]
    fn only_a_polling_haltpoll_driver_counts_as_kernel_polling() {
        assert_eq!(halt_poll_ns("haltpoll\n", "200000\n"), Some(200_000));
        assert_eq!(halt_poll_ns("haltpoll\n", "0\n"), None);
        assert_eq!(halt_poll_ns("intel_idle\n", "200000\n"), None);
        assert_eq!(halt_poll_ns("haltpoll", "garbage"), None);
    }

    #[test]
    fn pollers_run_in_the_idle_class() {
        let policy = std::thread::spawn(|| {
            become_idle_class().unwrap();
            // SAFETY: querying the calling thread's policy.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap();
        assert_eq!(policy, libc::SCHED_IDLE);
    }

    #[test]
    fn dropping_stops_pollers_that_are_polling() {
        let poll = IdlePoll::start(Duration::from_secs(3600), 1).unwrap();
        let shared = Arc::clone(&poll.shared);
        poll.activity().mark();
        drop(poll);
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
