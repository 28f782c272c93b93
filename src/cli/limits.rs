//! The flags of the transport limits (kiln's own: `tritonserver` has none of them), which bound
//! what one client may hold of the server's connections, memory and time (README, "Hostile
//! clients").

use crate::protocol::limits::{self, TransportLimits};
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct LimitFlags {
    /// Seconds an HTTP/1 client may take to send a request's headers, counted from when the
    /// connection starts waiting for them (so an idle keep-alive connection closes after it too);
    /// also the time to start a first request on a REST connection and to send the HTTP/2
    /// preface on gRPC.
    #[arg(long, env = "KILN_HTTP_HEADER_TIMEOUT_SECS", default_value_t = limits::DEFAULT_HEADER_TIMEOUT.as_secs_f64(), value_parser = positive_secs)]
    pub http_header_timeout_secs: f64,

    /// Seconds a REST request body may go without a byte arriving (then 408).
    #[arg(long, env = "KILN_HTTP_BODY_TIMEOUT_SECS", default_value_t = limits::DEFAULT_BODY_TIMEOUT.as_secs_f64(), value_parser = positive_secs)]
    pub http_body_timeout_secs: f64,

    /// Seconds a REST connection may stay open with no request in progress.
    #[arg(long, env = "KILN_HTTP_IDLE_TIMEOUT_SECS", default_value_t = limits::DEFAULT_IDLE_TIMEOUT.as_secs_f64(), value_parser = positive_secs)]
    pub http_idle_timeout_secs: f64,

    /// Connections open at once on all listeners together (0: the open-file limit, raised to
    /// its hard limit, less 256 kept for the server); more wait in the kernel's backlog.
    #[arg(long, env = "KILN_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,

    /// HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS), on
    /// the gRPC and REST listeners.
    #[arg(long, env = "KILN_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = limits::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,

    /// HTTP/2 streams a client may reset before the server has accepted them (rapid reset)
    /// before its connection is closed.
    #[arg(long, env = "KILN_HTTP2_MAX_PENDING_RESET_STREAMS", default_value_t = limits::DEFAULT_HTTP2_MAX_PENDING_RESET_STREAMS)]
    pub http2_max_pending_reset_streams: usize,

    /// HTTP/2 streams the server may reset for a client's errors (MadeYouReset) before the
    /// connection is closed.
    #[arg(long, env = "KILN_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS", default_value_t = limits::DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS)]
    pub http2_max_local_error_reset_streams: usize,

    /// Largest gRPC message once decompressed, in bytes (the wire size has
    /// --grpc-max-message-bytes).
    #[arg(long, env = "KILN_GRPC_MAX_DECOMPRESSED_BYTES", default_value_t = limits::DEFAULT_GRPC_MAX_DECOMPRESSED_BYTES)]
    pub grpc_max_decompressed_bytes: usize,

    /// Bytes of memory that decoding one gRPC message may take for the structs of its repeated
    /// fields (tensors, parameters, requested outputs, raw inputs), estimated from its wire bytes
    /// before it is decoded; tensor data, BYTES strings and packed numbers are not counted.
    #[arg(long, env = "KILN_GRPC_MAX_DECODE_BYTES", default_value_t = limits::DEFAULT_GRPC_MAX_DECODE_BYTES, value_parser = at_least_one)]
    pub grpc_max_decode_bytes: usize,

    /// Bytes that compressed REST request bodies may take once inflated, all of them together
    /// (each is also held to --http-max-input-size); a body that would pass it is refused with
    /// 429 and Retry-After. Uncompressed bodies are not counted.
    #[arg(long, env = "KILN_HTTP_MAX_INFLATED_BYTES", default_value_t = limits::DEFAULT_HTTP_MAX_INFLATED_BYTES, value_parser = at_least_one)]
    pub http_max_inflated_bytes: usize,
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "expected a whole number of at least 1, got '{text}'"
        )),
    }
}

fn positive_secs(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => Ok(secs),
        _ => Err(format!(
            "expected seconds greater than 0, at most 86400, got '{text}'"
        )),
    }
}

impl LimitFlags {
    pub fn limits(&self) -> TransportLimits {
        let secs = Duration::from_secs_f64;
        TransportLimits {
            header_timeout: secs(self.http_header_timeout_secs),
            body_timeout: secs(self.http_body_timeout_secs),
            idle_timeout: secs(self.http_idle_timeout_secs),
            max_connections: match self.max_connections {
                0 => limits::default_max_connections(),
                n => {
                    // main.rs raised it already (and said so when it could not).
                    let _ = limits::raise_file_limit();
                    n
                }
            },
            http2_max_concurrent_streams: self.http2_max_concurrent_streams,
            http2_max_pending_reset_streams: self.http2_max_pending_reset_streams,
            http2_max_local_error_reset_streams: self.http2_max_local_error_reset_streams,
            grpc_max_decompressed_bytes: self.grpc_max_decompressed_bytes,
            grpc_max_decode_bytes: self.grpc_max_decode_bytes,
            http_max_inflated_bytes: self.http_max_inflated_bytes,
        }
    }
}
