//! Stopping versions that no longer serve. A version leaves the snapshot at once on unload or
//! reload, but requests that resolved it earlier still hold it (by `Arc`) and must finish on it.
//! The retirer keeps every such version until it holds the last reference, then stops its
//! scheduler and waits for the instance threads to drop their sessions, on its own thread so no
//! request or async task ever blocks on it. Until then the index reports the version UNLOADING;
//! afterwards its memory is back with the allocator, and glibc is asked to return free heap pages
//! to the system, so resident memory falls after an unload instead of staying at its peak.

use super::ServingVersion;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tracing::info;

/// How often versions still in use are checked again.
const RECHECK: Duration = Duration::from_millis(10);

struct Retired {
    model: String,
    version: i64,
    serving: Arc<ServingVersion>,
}

#[derive(Default)]
struct Queue {
    /// Versions waiting for their last request.
    pending: Vec<Retired>,
    /// Versions being stopped right now (still UNLOADING).
    stopping: Vec<(String, i64)>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Called after versions were stopped, so readiness and health watchers look again.
    on_freed: Box<dyn Fn() + Send + Sync>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The retirement thread and its queue. Dropping it ends the thread; versions still pending are
/// then dropped without waiting (their schedulers stop in the background).
pub struct Retirer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Retirer {
    /// Starts the thread; `on_freed` runs on it after each round that stopped versions.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub fn start(on_freed: impl Fn() + Send + Sync + 'static) -> std::io::Result<Retirer> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            on_freed: Box::new(on_freed),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("kiln-retire".into())
            .spawn(move || run(&worker))?;
        Ok(Retirer {
            shared,
            thread: Some(thread),
        })
    }

    /// Hands over versions that no longer serve.
    pub fn retire(&self, model: &str, versions: impl IntoIterator<Item = Arc<ServingVersion>>) {
        let mut queue = self.shared.lock();
        queue
            .pending
            .extend(versions.into_iter().map(|serving| Retired {
                model: model.to_string(),
                version: serving.version,
                serving,
            }));
        drop(queue);
        self.shared.wake.notify_all();
    }

    /// Whether `model` `version` is retired but not yet stopped.
    pub fn is_retiring(&self, model: &str, version: i64) -> bool {
        let queue = self.shared.lock();
        queue
            .pending
            .iter()
            .any(|r| r.model == model && r.version == version)
            || queue
                .stopping
                .iter()
                .any(|(m, v)| m == model && *v == version)
    }
}

impl Drop for Retirer {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared) {
    let mut queue = shared.lock();
    loop {
        while queue.pending.is_empty() && !queue.closed {
            queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        if queue.closed {
            return;
        }
        let mut free = Vec::new();
        for retired in std::mem::take(&mut queue.pending) {
            match Arc::try_unwrap(retired.serving) {
                Ok(serving) => free.push((retired.model, serving)),
                Err(serving) => queue.pending.push(Retired { serving, ..retired }),
            }
        }
        if !free.is_empty() {
            queue.stopping = free.iter().map(|(m, s)| (m.clone(), s.version)).collect();
            drop(queue);
            for (model, serving) in free {
                let version = serving.version;
                serving.executor.stop();
                info!("successfully unloaded '{model}' version {version}");
            }
            trim_heap();
            shared.lock().stopping.clear();
            (shared.on_freed)();
            queue = shared.lock();
        }
        if !queue.pending.is_empty() && !queue.closed {
            queue = shared
                .wake
                .wait_timeout(queue, RECHECK)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Returns free heap pages, of every malloc arena, to the system (glibc keeps them otherwise, so
/// an unload would not show in resident memory, nor the end of a parallel load).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(super) fn trim_heap() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::os::raw::c_int;
    }
    // SAFETY: malloc_trim takes no pointers and only releases memory the allocator holds free;
    // glibc makes it safe to call from any thread.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn trim_heap() {}
