//! The KServe v2 / Triton REST API over the engine (axum).
//!
//! Layout: `routes` lists every endpoint and answers the small ones; `infer` decodes inference
//! requests (JSON, or Triton's binary tensor data extension) into the engine's
//! [`InferRequest`](crate::core::InferRequest) and encodes the response; `generate` is Triton's
//! generate extension (whole text, or server-sent events) for generation models; `body` reads request
//! bodies under the size limit and handles compression; `json` and `tensor_json` are the wire
//! format; `console` is the status and documentation pages, `openapi` the OpenAPI document
//! of every route, held to the routers, which list their routes through `route_table`.
//! Validation and inference happen in the engine only, exactly as for gRPC; engine
//! errors become HTTP statuses in one place, [`status`].

pub mod body;
mod console;
pub mod generate;
pub mod infer;
pub mod json;
pub mod openai;
mod openapi;
mod route_table;
mod routes;
pub mod sagemaker;
mod settings;
mod shared_memory;
pub mod tensor_json;
pub mod vertex;

pub use routes::router;

/// `X-Content-Type-Options: nosniff` on every response of a REST listener (`router`'s, errors
/// and refusals included): no browser takes a JSON body or a tensor's bytes for a script or a
/// page. One static header insert per response.
pub fn with_nosniff(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::map_response(
        |mut response: Response| async move {
            response.headers_mut().insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            response
        },
    ))
}

use crate::core::Error;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Settings of the REST front end.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Largest request body accepted, checked while reading and again after decompression
    /// (Triton's `--http-max-input-size`).
    pub max_input_bytes: usize,
    /// How long a request body may go without a byte arriving (`--http-body-timeout-secs`).
    pub body_timeout: std::time::Duration,
    /// Restricted APIs and the bearer token (`--http-restricted-api`, `--inference-bearer-token`).
    pub access: std::sync::Arc<crate::protocol::access::AccessPolicy>,
    /// Serve the status page and the document's rendering under `/console` (`--console`).
    pub console: bool,
    /// What compressed bodies may take once inflated, all together (`--http-max-inflated-bytes`).
    pub inflate_budget: std::sync::Arc<body::InflateBudget>,
}

/// Triton's default `--http-max-input-size`: 64 MiB.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 64 * 1024 * 1024;

/// The one mapping from engine errors to HTTP status codes (Triton's `HttpCodeFromError`; a
/// passed deadline, which Triton has no code for, is 504; an admission limit is 429).
pub fn status(error: &Error) -> StatusCode {
    match error {
        Error::InvalidArgument(_) | Error::AlreadyExists(_) => StatusCode::BAD_REQUEST,
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        Error::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
        Error::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
        Error::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error answer: a status and Triton's `{"error": "..."}` body, plus any extra headers
/// (e.g. `Accept-Encoding` after an unsupported request encoding).
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    message: String,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// Triton's answer for a path no route matches.
    pub fn not_found() -> HttpError {
        HttpError::new(StatusCode::NOT_FOUND, "Not Found")
    }

    pub fn with_header(mut self, name: HeaderName, value: &'static str) -> HttpError {
        self.headers.push((name, HeaderValue::from_static(value)));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The text the answer's `{"error": ...}` carries.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<Error> for HttpError {
    fn from(error: Error) -> HttpError {
        let answer = HttpError::new(status(&error), error.message());
        // Overload is momentary: tell well-behaved clients to back off briefly, not give up.
        match error {
            Error::ResourceExhausted(_) => answer.with_header(header::RETRY_AFTER, "1"),
            _ => answer,
        }
    }
}

/// An error answer's message, kept in the response's extensions beside its JSON body, so that a
/// route that passes another route's answer on (SageMaker's invoke, which makes an out-of-memory
/// failure 507) reads why it failed from the error, not by parsing the body it was written to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnsweredError(pub String);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message }).to_string();
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        response.headers_mut().extend(self.headers);
        response
            .extensions_mut()
            .insert(AnsweredError(self.message));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_status_mapping() {
        let cases = [
            (Error::InvalidArgument("m".into()), 400),
            (Error::NotFound("m".into()), 404),
            (Error::AlreadyExists("m".into()), 400),
            (Error::Unavailable("m".into()), 503),
            (Error::ResourceExhausted("m".into()), 429),
            (Error::DeadlineExceeded("m".into()), 504),
            (Error::Unsupported("m".into()), 501),
            (Error::Internal("m".into()), 500),
        ];
        for (error, code) in cases {
            assert_eq!(status(&error).as_u16(), code, "{error:?}");
            assert_eq!(HttpError::from(error).status().as_u16(), code);
        }
    }

    #[tokio::test]
    async fn error_body_is_json() {
        let response = HttpError::new(StatusCode::BAD_REQUEST, "bad \"thing\"")
            .with_header(header::ACCEPT_ENCODING, "gzip, deflate")
            .into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(response.headers()[header::ACCEPT_ENCODING], "gzip, deflate");
        assert_eq!(
            response.extensions().get::<AnsweredError>(),
            Some(&AnsweredError("bad \"thing\"".into()))
        );
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value, serde_json::json!({"error": "bad \"thing\""}));
    }
}
