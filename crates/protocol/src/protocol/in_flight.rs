//! Responses in flight on either protocol, counted from the moment a request reaches a service
//! until its response body has been sent in full (or the connection dropped it). Graceful
//! shutdown waits for this count to reach zero before it closes any connection, so no response —
//! inference or not, unary or stream — is cut off mid-way; idle keep-alive connections, which
//! carry no response, do not hold the shutdown up. Each request carries the moment it reached
//! the service ([`Arrived`]), for the traces of gRPC requests.

use crate::trace::RecordOnDrop;
use axum::http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tower_service::Service;

/// When a request reached the service, before its body was read: in its extensions.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);

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

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        request.extensions_mut().insert(Arrived(Instant::now()));
        // A health Watch stream lasts as long as its client wants and only reports status (which
        // turns NOT_SERVING at shutdown): it must not hold shutdown up until the exit timeout.
        let guard = (request.uri().path() != HEALTH_WATCH).then(|| self.count.enter());
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            let send_end = response.extensions_mut().remove::<RecordOnDrop>();
            Ok(response.map(|inner| Tracked {
                inner,
                _guard: guard,
                _send_end: send_end,
            }))
        })
    }
}

/// The one streaming call that is not counted.
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";

/// A response body that keeps its response counted until it is dropped, and records the end of
/// its sending on the request's trace, if it has one.
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    _guard: Option<Guard>,
    _send_end: Option<RecordOnDrop>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body as AxumBody;
    use std::convert::Infallible;
    use tower_layer::Layer;

    /// Answers every request with what its function says of it.
    #[derive(Clone)]
    struct Says(fn(&Request<()>) -> &'static str);

    /// A small body.
    const HELLO: Says = Says(|_| "hello");

    impl Service<Request<()>> for Says {
        type Response = Response<AxumBody>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<AxumBody>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new(AxumBody::from((self.0)(&request)))))
        }
    }

    #[tokio::test]
    async fn a_request_says_when_it_reached_the_service() {
        let arrival = Says(|request| match request.extensions().get::<Arrived>() {
            Some(_) => "arrived",
            None => "unknown",
        });
        let mut service = ResponsesInFlight::default().layer(arrival);
        let response = service.call(request("/inference.GRPCInferenceService/ModelInfer"));
        let body = AxumBody::new(response.await.unwrap().into_body());
        let body = axum::body::to_bytes(body, 100).await.unwrap();
        assert_eq!(&body[..], b"arrived");
    }

    fn request(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).unwrap()
    }

    #[tokio::test]
    async fn a_response_counts_until_its_body_is_gone() {
        let count = ResponsesInFlight::default();
        let mut service = count.layer(HELLO);
        let pending = service.call(request("/v2/models/m/infer"));
        assert_eq!(
            count.count(),
            1,
            "counted from the call, before the answer exists"
        );
        let response = pending.await.unwrap();
        assert_eq!(count.count(), 1, "and while the body is being sent");
        let body = axum::body::to_bytes(AxumBody::new(response.into_body()), 100)
            .await
            .unwrap();
        assert_eq!(&body[..], b"hello");
        assert_eq!(count.count(), 0, "sent in full");
        let watch = service
            .call(request("/grpc.health.v1.Health/Watch"))
            .await
            .unwrap();
        assert_eq!(
            count.count(),
            0,
            "health watch streams never hold shutdown up"
        );
        drop(watch);
    }
}
