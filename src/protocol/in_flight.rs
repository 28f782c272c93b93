//! Responses in flight on either protocol, counted from the moment a request reaches a service
//! until its response body has been sent in full (or the connection dropped it). Graceful
//! shutdown waits for this count to reach zero before it closes any connection, so no response —
//! inference or not, unary or stream — is cut off mid-way; idle keep-alive connections, which
//! carry no response, do not hold the shutdown up.

use axum::http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// The shared count; cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct ResponsesInFlight(Arc<AtomicUsize>);

impl ResponsesInFlight {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    fn enter(&self) -> Guard {
        self.0.fetch_add(1, Ordering::SeqCst);
        Guard(Arc::clone(&self.0))
    }
}

/// One response counted until dropped.
#[derive(Debug)]
struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<S> tower_layer::Layer<S> for ResponsesInFlight {
    type Service = Tracking<S>;

    fn layer(&self, inner: S) -> Tracking<S> {
        Tracking {
            inner,
            count: self.clone(),
        }
    }
}

/// A service whose responses are counted in [`ResponsesInFlight`].
#[derive(Debug, Clone)]
pub struct Tracking<S> {
    inner: S,
    count: ResponsesInFlight,
}

impl<S, B, R> Service<Request<B>> for Tracking<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = Response<Tracked<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let guard = self.count.enter();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| Tracked {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// A response body that keeps its response counted until it is dropped.
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    _guard: Guard,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
