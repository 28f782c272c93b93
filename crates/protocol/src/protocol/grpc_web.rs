//! gRPC-Web on the gRPC listener (`--grpc-web`): browsers cannot speak gRPC (they give scripts
//! neither HTTP/2 framing nor trailers), so tonic-web translates `application/grpc-web[+proto]`
//! and `application/grpc-web-text[+proto]` requests into gRPC and their answers back, for every
//! unary RPC; `ModelStreamInfer` works too when the client sends its requests in one body, and
//! its responses arrive as they are produced (what gRPC-Web can carry of a bidirectional call).
//!
//! Off by default: it makes the gRPC port accept HTTP/1.1 as well, which Triton's does not, and
//! a browser on another origin (the status page is on the REST port) needs CORS, which is an
//! operator's decision. With it on, CORS headers are given only to the origins
//! `--grpc-web-cors-origin` lists (`*`: any origin), and preflight requests are answered here;
//! a call that carries another origin is refused by the access layer (PERMISSION_DENIED, see
//! `access::browser`), so that no page can drive the API with a request that needs no preflight.
//!
//! The layer sits outside every other layer of the gRPC server, so what applies to gRPC applies
//! to gRPC-Web: the access policy (a refusal is a gRPC-Web status the page can read, with CORS
//! headers), TLS (the same listener), message size limits, in-flight tracking for shutdown.

use axum::http::{header, HeaderName, HeaderValue, Method, Request, Response};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::Body;
use tower_http::cors::{AllowHeaders, AllowOrigin, Cors, CorsLayer};
use tower_layer::Layer;
use tower_service::Service;

/// `--grpc-web` and `--grpc-web-cors-origin`.
#[derive(Debug, Clone, Default)]
pub struct GrpcWebOptions {
    /// Translate gRPC-Web requests (and accept HTTP/1.1 on the gRPC port).
    pub enabled: bool,
    /// Origins whose pages may call: each `scheme://host[:port]`, or `*` for any.
    pub cors_origins: Vec<String>,
}

impl GrpcWebOptions {
    /// The options of the flags, each origin checked.
    ///
    /// # Errors
    /// A message naming an origin that is not a valid header value or has a path.
    pub fn from_flags(enabled: bool, cors_origins: Vec<String>) -> Result<GrpcWebOptions, String> {
        for origin in &cors_origins {
            if !crate::protocol::access::browser::valid_origin(origin) {
                return Err(format!(
                    "--grpc-web-cors-origin {origin:?}: expected scheme://host[:port] or *"
                ));
            }
        }
        Ok(GrpcWebOptions {
            enabled,
            cors_origins,
        })
    }

    fn cors(&self) -> CorsLayer {
        let origins = if self.cors_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(
                self.cors_origins
                    .iter()
                    .filter_map(|o| HeaderValue::from_str(o).ok()),
            )
        };
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::POST, Method::OPTIONS])
            // Whatever headers the page asks to send (the bearer token, restricted-protocol
            // headers, grpc-timeout): the origin is what is checked.
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                HeaderName::from_static("grpc-status"),
                HeaderName::from_static("grpc-message"),
                HeaderName::from_static("grpc-status-details-bin"),
            ])
            .max_age(Duration::from_secs(3600))
    }
}

/// The gRPC server's outermost layer: browsers' requests go through CORS and tonic-web, every
/// other request (and all of them when gRPC-Web is off) straight to the inner service.
#[derive(Debug, Clone)]
pub struct GrpcWebLayer {
    options: Option<GrpcWebOptions>,
}

impl GrpcWebLayer {
    pub fn new(options: &GrpcWebOptions) -> GrpcWebLayer {
        GrpcWebLayer {
            options: options.enabled.then(|| options.clone()),
        }
    }
}

impl<S: Clone> Layer<S> for GrpcWebLayer {
    type Service = GrpcWeb<S>;

    fn layer(&self, inner: S) -> GrpcWeb<S> {
        let web = self.options.as_ref().map(|options| {
            options
                .cors()
                .layer(tonic_web::GrpcWebLayer::new().layer(inner.clone()))
        });
        GrpcWeb { inner, web }
    }
}

#[derive(Debug, Clone)]
pub struct GrpcWeb<S> {
    inner: S,
    web: Option<Cors<tonic_web::GrpcWebService<S>>>,
}

/// A browser's request: a gRPC-Web content type, or anything carrying an `Origin` (a CORS
/// preflight, or a gRPC-Web call the browser marked as cross-origin).
fn from_browser<B>(request: &Request<B>) -> bool {
    let grpc_web = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc-web"));
    grpc_web || request.headers().contains_key(header::ORIGIN)
}

type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl<S, R> Service<Request<Body>> for GrpcWeb<S>
where
    S: Service<Request<Body>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    R::Error: Into<Box<dyn std::error::Error + Send + Sync>> + std::fmt::Display,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        match &mut self.web {
            Some(web) if from_browser(&request) => {
                let mut web = web.clone();
                Box::pin(async move {
                    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut web, cx))
                        .await?;
                    web.call(request).await
                })
            }
            _ => {
                let answer = self.inner.call(request);
                Box::pin(async move { Ok(answer.await?.map(Body::new)) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked() {
        let ok = GrpcWebOptions::from_flags(
            true,
            vec!["http://127.0.0.1:8000".into(), "https://a.example".into()],
        );
        assert!(ok.is_ok());
        assert!(GrpcWebOptions::from_flags(true, vec!["*".into()]).is_ok());
        for bad in [
            "127.0.0.1:8000",
            "http://a.example/page",
            "http://",
            "http://a\nb",
        ] {
            let error = GrpcWebOptions::from_flags(true, vec![bad.into()]).unwrap_err();
            assert!(error.contains("--grpc-web-cors-origin"), "{error}");
        }
    }

    #[test]
    fn browsers_are_told_apart_by_content_type_or_origin() {
        let request = |headers: &[(&str, &str)]| {
            let mut builder = Request::builder().method(Method::POST);
            for (name, value) in headers {
                builder = builder.header(*name, *value);
            }
            builder.body(()).unwrap()
        };
        assert!(from_browser(&request(&[(
            "content-type",
            "application/grpc-web-text"
        )])));
        assert!(from_browser(&request(&[("origin", "http://a.example")])));
        assert!(!from_browser(&request(&[(
            "content-type",
            "application/grpc"
        )])));
    }
}
