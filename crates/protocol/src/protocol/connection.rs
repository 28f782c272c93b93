//! Serving connections: the HTTP accept loop with its limits (connection slots, header and idle
//! timeouts, HTTP/2 stream and reset limits), and [`Repoll`], which keeps a connection that wakes
//! itself from being rescheduled.
//!
//! hyper's HTTP/1 connection wakes its own task whenever the handler takes a request body (its
//! body channel wakes the sender on every hand-over, whether or not the sender waits). tokio
//! treats a task that wakes itself while running as one that yields: it goes to the back of the
//! queue and, if a worker sleeps, that worker is woken to steal it, finds nothing, and sleeps
//! again. On the benchmark VM that was 0.6 futex calls and 1.3 extra context switches per REST
//! request at concurrency 1 (bench/RESULTS.md, "Tenth session").

use super::limits::{ConnectionSlots, TransportLimits};
use futures_util::task::AtomicWaker;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

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

/// What a REST listener's connections are held to, and the count they share with the other
/// listeners.
#[derive(Debug, Clone)]
pub struct Transport {
    pub limits: TransportLimits,
    pub slots: ConnectionSlots,
}

impl Transport {
    /// The limits, with a connection count of their own.
    pub fn new(limits: TransportLimits) -> Transport {
        Transport {
            slots: ConnectionSlots::new(limits.max_connections),
            limits,
        }
    }

    /// The connection builder: hyper's header read timeout (which needs a timer; without one
    /// half-sent headers held a connection for ever) and the HTTP/2 stream and reset limits.
    fn builder(&self) -> Builder<TokioExecutor> {
        let limits = &self.limits;
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            .max_pending_accept_reset_streams(limits.http2_max_pending_reset_streams)
            .max_local_error_reset_streams(limits.http2_max_local_error_reset_streams);
        builder
    }
}

/// Serves `router` over HTTP/1 and HTTP/2 (prior knowledge) on `listener` until `stop`; then
/// each connection shuts down gracefully (requests in progress are answered) and this returns
/// once all have closed. A connection is accepted only with a free slot of `transport.slots`
/// (the others wait in the kernel's backlog), and one that stays idle for the idle timeout is
/// closed.
pub async fn serve_http<L>(
    mut listener: L,
    router: axum::Router,
    stop: impl Future<Output = ()>,
    transport: Transport,
) where
    L: axum::serve::Listener,
{
    let (closing, closed) = tokio::sync::watch::channel(false);
    let builder = transport.builder();
    let (header_timeout, idle_timeout) = (
        transport.limits.header_timeout,
        transport.limits.idle_timeout,
    );
    tokio::pin!(stop);
    loop {
        let (permit, io) = tokio::select! {
            () = &mut stop => break,
            accepted = async {
                let permit = transport.slots.acquire().await;
                (permit, listener.accept().await.0)
            } => accepted,
        };
        let activity = Activity::default();
        let service = hyper_util::service::TowerToHyperService::new(Watched {
            router: router.clone(),
            activity: activity.clone(),
        });
        let mut closed = closed.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let connection =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service);
            let mut connection = Repoll::new(connection);
            let result = tokio::select! {
                result = &mut connection => result,
                () = activity.idle_for(header_timeout, idle_timeout) => {
                    connection.inner().graceful_shutdown();
                    (&mut connection).await
                }
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

/// The gRPC listener's connections, each accepted only with a free slot of `transport` (held
/// until it closes), with TCP_NODELAY, and closed unless the HTTP/2 preface has arrived within
/// the header timeout (h2 has no timer of its own before its handshake). Accept errors (a full
/// descriptor table, a connection reset before it was accepted) are logged and retried after a
/// pause, never handed to tonic.
pub fn grpc_incoming(
    listener: tokio::net::TcpListener,
    transport: &Transport,
) -> impl futures_util::Stream<Item = Result<SlottedStream, std::io::Error>> {
    let (slots, preface_timeout) = (transport.slots.clone(), transport.limits.header_timeout);
    futures_util::stream::unfold((listener, slots), move |(listener, slots)| async move {
        let permit = slots.acquire().await;
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::warn!("cannot set TCP_NODELAY on a gRPC connection: {e}");
                    }
                    let stream = SlottedStream {
                        stream,
                        _permit: permit,
                        preface: Some(Preface {
                            missing: PREFACE_LEN,
                            deadline: Box::pin(tokio::time::sleep(preface_timeout)),
                        }),
                    };
                    return Some((Ok(stream), (listener, slots)));
                }
                Err(e) => {
                    tracing::warn!("gRPC accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// The HTTP/2 client preface (`PRI * HTTP/2.0...`).
const PREFACE_LEN: usize = 24;

/// A gRPC connection holding its slot.
#[derive(Debug)]
pub struct SlottedStream {
    stream: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// Until the preface has arrived: how much of it is missing, and by when it must come.
    preface: Option<Preface>,
}

#[derive(Debug)]
struct Preface {
    missing: usize,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl tonic::transport::server::Connected for SlottedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for SlottedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(preface) = &mut this.preface else {
            return read;
        };
        if let Poll::Ready(Ok(())) = read {
            preface.missing = preface.missing.saturating_sub(buf.filled().len() - before);
            if preface.missing == 0 {
                this.preface = None;
            }
            return read;
        }
        if read.is_pending() && preface.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no HTTP/2 preface within the header timeout",
            )));
        }
        read
    }
}

impl tokio::io::AsyncWrite for SlottedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A connection's requests in progress and when that last changed, for the idle timeout.
///
/// Nothing wakes the watcher when a request begins or ends: a wake-up of the connection's own
/// task from inside its poll makes tokio reschedule it (see [`Repoll`]), which on every request
/// cost 1.4 more context switches and tripled REST's CPU time per request at concurrency 1. The
/// watcher sleeps until the deadline the state it last read gives, then reads it again.
#[derive(Debug, Clone)]
struct Activity(Arc<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    /// Requests whose response has not been sent in full.
    open: AtomicUsize,
    /// Whether a request has begun: until one has, the connection gets the header timeout
    /// (hyper's own starts only once it knows the connection is HTTP/1, after the first bytes).
    begun: AtomicBool,
    /// When a request last began or ended, in nanoseconds since `origin`.
    changed: AtomicU64,
    origin: tokio::time::Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Activity(Arc::new(ActivityState {
            open: AtomicUsize::new(0),
            begun: AtomicBool::new(false),
            changed: AtomicU64::new(0),
            origin: tokio::time::Instant::now(),
        }))
    }
}

impl ActivityState {
    fn touch(&self) {
        let since = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.changed.store(since, Ordering::SeqCst);
    }

    fn changed_at(&self) -> tokio::time::Instant {
        self.origin + Duration::from_nanos(self.changed.load(Ordering::SeqCst))
    }
}

impl Activity {
    fn begin(&self) -> RequestOpen {
        self.0.open.fetch_add(1, Ordering::SeqCst);
        self.0.begun.store(true, Ordering::SeqCst);
        self.0.touch();
        RequestOpen(Arc::clone(&self.0))
    }

    /// Resolves once no request has been in progress for `idle` (`first` before the first
    /// request).
    async fn idle_for(&self, first: Duration, idle: Duration) {
        // Looked at again at least this often, so that a first request that came meanwhile
        // switches the clock from `first` to `idle` in time.
        let step = first.min(idle);
        loop {
            let timeout = if self.0.begun.load(Ordering::SeqCst) {
                idle
            } else {
                first
            };
            let now = tokio::time::Instant::now();
            let due = if self.0.open.load(Ordering::SeqCst) > 0 {
                now + step // busy
            } else {
                self.0.changed_at() + timeout
            };
            if due <= now {
                return;
            }
            tokio::time::sleep_until(due.min(now + step)).await;
        }
    }
}

/// One request in progress; its end, when dropped, restarts the idle clock.
#[derive(Debug)]
struct RequestOpen(Arc<ActivityState>);

impl Drop for RequestOpen {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router, with each request counted in progress until its response body is gone.
#[derive(Clone)]
struct Watched {
    router: axum::Router,
    activity: Activity,
}

impl<B> tower_service::Service<axum::http::Request<B>> for Watched
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let open = self.activity.begin();
        let response = tower_service::Service::call(&mut self.router, request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| axum::body::Body::new(Counted { body, _open: open })))
        })
    }
}

/// A response body that keeps its request in progress until dropped.
struct Counted {
    body: axum::body::Body,
    _open: RequestOpen,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
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
