//! Serving connections: the HTTP accept loop, and [`Repoll`], which keeps a connection that wakes
//! itself from being rescheduled.
//!
//! hyper's HTTP/1 connection wakes its own task whenever the handler takes a request body (its
//! body channel wakes the sender on every hand-over, whether or not the sender waits). tokio
//! treats a task that wakes itself while running as one that yields: it goes to the back of the
//! queue and, if a worker sleeps, that worker is woken to steal it, finds nothing, and sleeps
//! again. On the benchmark VM that was 0.6 futex calls and 1.3 extra context switches per REST
//! request at concurrency 1 (bench/RESULTS.md, "Tenth session").

use futures_util::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Rounds one wake-up of a task may take before it yields to others anyway.
const MAX_ROUNDS: usize = 16;

/// A future polled again in place, up to [`MAX_ROUNDS`] times, when it wakes itself while being
/// polled, instead of being rescheduled by the runtime.
pub struct Repoll<F> {
    inner: Pin<Box<F>>,
    flags: Arc<Flags>,
    waker: Waker,
}

/// The waker handed to the inner future: a wake during the poll only sets `woken`.
struct Flags {
    polling: AtomicBool,
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flags {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F: Future> Repoll<F> {
    pub fn new(inner: F) -> Repoll<F> {
        let flags = Arc::new(Flags {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        Repoll {
            inner: Box::pin(inner),
            waker: Waker::from(Arc::clone(&flags)),
            flags,
        }
    }

    /// The wrapped future, e.g. to start a connection's graceful shutdown.
    pub fn inner(&mut self) -> Pin<&mut F> {
        self.inner.as_mut()
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.flags.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_ROUNDS {
            this.flags.polling.store(true, Ordering::SeqCst);
            this.flags.woken.store(false, Ordering::SeqCst);
            let poll = this.inner.as_mut().poll(&mut inner_cx);
            this.flags.polling.store(false, Ordering::SeqCst);
            if poll.is_ready() {
                return poll;
            }
            // A wake that came from elsewhere after `polling` went false has woken the task
            // already; one during the poll is this loop's to act on.
            if !this.flags.woken.swap(false, Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<F> Unpin for Repoll<F> {}

/// Serves `router` over HTTP/1 and HTTP/2 (prior knowledge) on `listener` until `stop`; then
/// each connection shuts down gracefully (requests in progress are answered) and this returns
/// once all have closed.
pub async fn serve_http<L>(mut listener: L, router: axum::Router, stop: impl Future<Output = ()>)
where
    L: axum::serve::Listener,
{
    let (closing, closed) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let io = tokio::select! {
            () = &mut stop => break,
            (io, _) = listener.accept() => io,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut closed = closed.clone();
        tokio::spawn(async move {
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let connection =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service);
            let mut connection = Repoll::new(connection);
            let result = tokio::select! {
                result = &mut connection => result,
                () = async { let _ = closed.wait_for(|c| *c).await; } => {
                    connection.inner().graceful_shutdown();
                    (&mut connection).await
                }
            };
            if let Err(e) = result {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
    drop(listener);
    drop(closed);
    let _ = closing.send(true);
    closing.closed().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Polls `future` once with a counting waker; returns the result and the count.
    fn poll_once<F: Future + Unpin>(future: &mut F) -> (Poll<F::Output>, Arc<Count>) {
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let poll = Pin::new(future).poll(&mut Context::from_waker(&waker));
        (poll, count)
    }

    /// Wakes itself and stays pending for its first `pending` polls, then is ready with the
    /// number of polls; keeps the last waker it saw.
    struct SelfWaking {
        pending: usize,
        polls: usize,
        waker: Arc<Mutex<Option<Waker>>>,
        wake_itself: bool,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if self.polls > self.pending {
                return Poll::Ready(self.polls);
            }
            if self.wake_itself {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
    }

    fn self_waking(
        pending: usize,
        wake_itself: bool,
    ) -> (Repoll<SelfWaking>, Arc<Mutex<Option<Waker>>>) {
        let waker = Arc::new(Mutex::new(None));
        let future = SelfWaking {
            pending,
            polls: 0,
            waker: Arc::clone(&waker),
            wake_itself,
        };
        (Repoll::new(future), waker)
    }

    #[test]
    fn a_future_that_wakes_itself_is_polled_again_in_place() {
        let (mut future, _) = self_waking(3, true);
        let (poll, count) = poll_once(&mut future);
        assert_eq!(poll, Poll::Ready(4), "four polls within one");
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "the task was never woken"
        );
    }

    #[test]
    fn a_wake_from_elsewhere_wakes_the_task() {
        let (mut future, inner_waker) = self_waking(1, false);
        let (poll, count) = poll_once(&mut future);
        assert_eq!(poll, Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        let waker = inner_waker.lock().unwrap().take().unwrap();
        std::thread::spawn(move || waker.wake()).join().unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert_eq!(poll_once(&mut future).0, Poll::Ready(2));
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_after_a_bound() {
        let (mut future, _) = self_waking(usize::MAX, true);
        let (poll, count) = poll_once(&mut future);
        assert_eq!(poll, Poll::Pending);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "woken once, to run again later"
        );
        assert_eq!(future.inner.polls, MAX_ROUNDS);
    }
}
