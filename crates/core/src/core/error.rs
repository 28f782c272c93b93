//! The error every front end receives from the engine. The variants are Triton's status kinds, so
//! that each protocol maps them exactly once (gRPC status code, HTTP status) and the message text
//! can match Triton's word for word.

/// A request failure, classified the way Triton classifies it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed or does not fit the model (gRPC INVALID_ARGUMENT, HTTP 400).
    #[error("{0}")]
    InvalidArgument(String),
    /// The model or version does not exist (gRPC NOT_FOUND, HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The thing to create exists already, e.g. a shared-memory region name (gRPC ALREADY_EXISTS,
    /// HTTP 400 as Triton answers it).
    #[error("{0}")]
    AlreadyExists(String),
    /// The model or server cannot take the request now (gRPC UNAVAILABLE, HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// Too many requests are in flight, server-wide or for the model: a bounded admission limit,
    /// answered at once instead of queueing without bound (gRPC RESOURCE_EXHAUSTED, HTTP 429).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The request's deadline passed before it could run (gRPC DEADLINE_EXCEEDED, HTTP 504).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The feature is not implemented (gRPC UNIMPLEMENTED, HTTP 501).
    #[error("{0}")]
    Unsupported(String),
    /// The model failed while running a valid request (gRPC INTERNAL, HTTP 500).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The message without the kind, as clients see it.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::NotFound(m)
            | Error::AlreadyExists(m)
            | Error::Unavailable(m)
            | Error::ResourceExhausted(m)
            | Error::DeadlineExceeded(m)
            | Error::Unsupported(m)
            | Error::Internal(m) => m,
        }
    }
}

impl Error {
    /// The same kind of error with another message.
    pub fn with_message(self, message: String) -> Error {
        match self {
            Error::InvalidArgument(_) => Error::InvalidArgument(message),
            Error::NotFound(_) => Error::NotFound(message),
            Error::AlreadyExists(_) => Error::AlreadyExists(message),
            Error::Unavailable(_) => Error::Unavailable(message),
            Error::ResourceExhausted(_) => Error::ResourceExhausted(message),
            Error::DeadlineExceeded(_) => Error::DeadlineExceeded(message),
            Error::Unsupported(_) => Error::Unsupported(message),
            Error::Internal(_) => Error::Internal(message),
        }
    }
}

/// Shorthand for building an [`Error::InvalidArgument`] with `format!` arguments.
#[macro_export]
macro_rules! invalid_arg {
    ($($arg:tt)*) => { $crate::core::Error::InvalidArgument(format!($($arg)*)) };
}
