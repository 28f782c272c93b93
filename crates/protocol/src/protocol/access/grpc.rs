//! The access policy on gRPC: a tower layer in front of every service that maps the method path
//! to Triton's API group and answers a refused call itself, before the message is decoded.
//! Triton answers a restricted protocol with UNAVAILABLE "This protocol is restricted, expecting
//! header '...'"; a missing or wrong bearer token is UNAUTHENTICATED; a web page's call from an
//! origin `--grpc-web-cors-origin` does not list is PERMISSION_DENIED.

use super::{AccessPolicy, ApiGroup, Denied};
use axum::http::{Request, Response};
use futures_util::future::Either;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::Status;
use tower_service::Service;

/// Triton's group of a gRPC method path (`/<service>/<method>`); `None` for services outside the
/// inference protocol (reflection), which stay open.
pub fn group_of(path: &str) -> Option<ApiGroup> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    match service {
        "grpc.health.v1.Health" => return Some(ApiGroup::Health),
        "inference.GRPCInferenceService" => {}
        _ => return None,
    }
    Some(match method {
        "ServerLive" | "ServerReady" | "ModelReady" => ApiGroup::Health,
        "ServerMetadata" | "ModelMetadata" => ApiGroup::Metadata,
        "ModelInfer" | "ModelStreamInfer" => ApiGroup::Inference,
        "ModelConfig" => ApiGroup::ModelConfig,
        "ModelStatistics" => ApiGroup::Statistics,
        "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => {
            ApiGroup::ModelRepository
        }
        "TraceSetting" => ApiGroup::Trace,
        "LogSettings" => ApiGroup::Logging,
        m if m.starts_with("SystemSharedMemory") || m.starts_with("CudaSharedMemory") => {
            ApiGroup::SharedMemory
        }
        // An unknown method gets UNIMPLEMENTED from the router; restrict it like inference so a
        // restricted server tells nothing about its methods to a caller without credentials.
        _ => ApiGroup::Inference,
    })
}

/// The refusal as a gRPC status.
pub fn status(denied: &Denied) -> Status {
    match denied {
        Denied::Restricted { .. } => Status::unavailable(denied.message("protocol")),
        Denied::Unauthenticated => Status::unauthenticated(denied.message("protocol")),
        Denied::Host { .. } | Denied::UntrustedHost { .. } | Denied::CrossOrigin { .. } => {
            Status::permission_denied(denied.message("protocol"))
        }
    }
}

/// Applies an [`AccessPolicy`] to every gRPC call (`Server::builder().layer(...)`).
#[derive(Debug, Clone)]
pub struct GrpcAccessLayer {
    policy: Arc<AccessPolicy>,
}

impl GrpcAccessLayer {
    pub fn new(policy: Arc<AccessPolicy>) -> GrpcAccessLayer {
        GrpcAccessLayer { policy }
    }
}

impl<S> tower_layer::Layer<S> for GrpcAccessLayer {
    type Service = GrpcAccess<S>;

    fn layer(&self, inner: S) -> GrpcAccess<S> {
        GrpcAccess {
            inner,
            policy: Arc::clone(&self.policy),
        }
    }
}

/// The service [`GrpcAccessLayer`] wraps around the gRPC routes.
#[derive(Debug, Clone)]
pub struct GrpcAccess<S> {
    inner: S,
    policy: Arc<AccessPolicy>,
}

impl<S, B> Service<Request<B>> for GrpcAccess<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<Response<Body>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // A web page's call (gRPC-Web, or any request that carries an `Origin`): native gRPC
        // clients send none.
        let authority = request.uri().authority().map(|a| a.as_str());
        if let Err(denied) =
            self.policy
                .check_browser(request.method(), authority, request.headers())
        {
            return Either::Left(std::future::ready(Ok(status(&denied).into_http())));
        }
        if !self.policy.is_open() {
            if let Some(group) = group_of(request.uri().path()) {
                if let Err(denied) = self.policy.check(group, request.headers()) {
                    return Either::Left(std::future::ready(Ok(status(&denied).into_http())));
                }
            }
        }
        Either::Right(self.inner.call(request))
    }
}
