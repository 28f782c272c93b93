//! Admission: the server-wide bound on inference requests in flight, and the shutdown switch.
//! Both front ends admit a request once it has arrived and before doing any work for it, so
//! overload and shutdown are answered at once and cost no more than reading it; the same count
//! tells graceful shutdown what to wait for.

use super::Engine;
use crate::core::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An inference request admitted by [`Engine::admit`]; it counts as in flight until dropped. It
/// owns its share of the count, so a streamed generation can carry it into its own task.
pub struct Admission {
    /// Held only for its `Drop`, which ends the request's count.
    _in_flight: InFlight,
}

/// Counts one request in flight for as long as it lives.
struct InFlight {
    counter: Arc<AtomicUsize>,
    /// The count right after this request entered, itself included.
    count: usize,
}

impl InFlight {
    fn enter(counter: &Arc<AtomicUsize>) -> Self {
        let count = counter.fetch_add(1, Ordering::SeqCst) + 1;
        InFlight {
            counter: Arc::clone(counter),
            count,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Engine {
    /// Bounds the inference requests admitted at once, server-wide (0: no bound).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Engine {
        self.max_in_flight = max_in_flight;
        self
    }

    /// Inference requests currently being handled.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Starts shutdown: from now on the server is not ready and new inference requests are
    /// answered UNAVAILABLE "Server exiting"; requests already admitted run to the end.
    pub fn begin_shutdown(&self) {
        self.exiting.store(true, Ordering::SeqCst);
    }

    /// Admits one inference request, or refuses it at once: UNAVAILABLE while shutting down,
    /// RESOURCE_EXHAUSTED when `--max-inflight-requests` are already in flight. Front ends call
    /// this once the request has arrived whole and before any work on it: a client that sends
    /// its body slowly, or never, must not hold a slot (the body read is bounded in size and
    /// time by the transport instead).
    ///
    /// # Errors
    /// As described; the message names the limit, never a queue position.
    pub fn admit(&self) -> Result<Admission, Error> {
        // Counted before `exiting` is read: shutdown sets `exiting` and then waits for the count
        // to reach zero, so a request is either refused here or waited for, never lost between.
        let guard = InFlight::enter(&self.in_flight);
        if self.exiting.load(Ordering::SeqCst) {
            return Err(Error::Unavailable("Server exiting".into()));
        }
        if self.max_in_flight > 0 && guard.count > self.max_in_flight {
            return Err(Error::ResourceExhausted(format!(
                "Exceeds maximum in-flight requests ({}) for the server",
                self.max_in_flight
            )));
        }
        Ok(Admission { _in_flight: guard })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::{LoadOptions, ModelRepository, RepositoryOptions};
    use std::sync::Arc;

    /// An engine over an empty repository whose start-up load has run: ready, with no models.
    fn engine(max_in_flight: usize) -> Engine {
        let options = RepositoryOptions {
            load: LoadOptions {
                auto_complete: false,
                ..LoadOptions::default()
            },
            ..RepositoryOptions::default()
        };
        let repository = ModelRepository::new(Vec::new(), options).expect("empty repository");
        repository.load_startup();
        Engine::new(Arc::new(repository), true).with_max_in_flight(max_in_flight)
    }

    #[test]
    fn the_server_wide_bound_refuses_at_once_and_frees_on_drop() {
        let engine = engine(2);
        let first = engine.admit().unwrap();
        let _second = engine.admit().unwrap();
        let refused = engine.admit().err().unwrap();
        assert!(matches!(refused, Error::ResourceExhausted(_)));
        assert_eq!(
            refused.message(),
            "Exceeds maximum in-flight requests (2) for the server"
        );
        assert_eq!(engine.in_flight(), 2, "a refused request is not counted");
        drop(first);
        let _third = engine.admit().unwrap();
        let Err(refused) = engine.admit() else {
            panic!("a third request was admitted beside two");
        };
        assert_eq!(
            refused,
            Error::ResourceExhausted(
                "Exceeds maximum in-flight requests (2) for the server".into()
            )
        );
    }

    #[test]
    fn zero_means_no_bound() {
        let engine = engine(0);
        let held: Vec<_> = (0..10_000).map(|_| engine.admit().unwrap()).collect();
        assert_eq!(engine.in_flight(), held.len());
    }

    #[test]
    fn shutdown_refuses_new_requests_and_reports_not_ready() {
        let engine = engine(0);
        assert!(engine.is_ready());
        let admitted = engine.admit().unwrap();
        engine.begin_shutdown();
        assert!(!engine.is_ready());
        let refused = engine.admit().err().unwrap();
        assert_eq!(refused, Error::Unavailable("Server exiting".into()));
        assert_eq!(
            engine.in_flight(),
            1,
            "the admitted request is still waited for"
        );
        drop(admitted);
        assert_eq!(engine.in_flight(), 0);
    }
}
