//! What a client may hold of the server's connections, memory and time, on every listener: the
//! bounds that make a hostile client cost no more than a legitimate one. Each limit has a flag
//! (README, "Reliability and security: hostile clients"); this module only holds the settings
//! and the shared connection count, the listeners ([`super::connection`], `server.rs`) and the
//! gRPC decoding ([`super::grpc_codec`], [`super::grpc_frames`]) apply them.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connection and decoding limits shared by the listeners.
#[derive(Debug, Clone)]
pub struct TransportLimits {
    /// How long an HTTP/1 client may take to send a request's headers, counted from the moment
    /// the connection waits for them (so an idle keep-alive connection is closed after it too);
    /// also how long a REST connection may take to start its first request, and a gRPC one to
    /// send the HTTP/2 preface.
    pub header_timeout: Duration,
    /// How long a REST request body may go without a byte arriving.
    pub body_timeout: Duration,
    /// How long a REST connection may stay open with no request in progress.
    pub idle_timeout: Duration,
    /// Connections open at once on all listeners together; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// HTTP/2 streams one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub http2_max_concurrent_streams: u32,
    /// Streams a client may reset before the server accepted them (rapid reset,
    /// CVE-2023-44487) before the connection is closed with GOAWAY.
    pub http2_max_pending_reset_streams: usize,
    /// Streams the server may reset for a client's protocol errors (MadeYouReset,
    /// CVE-2025-8671) before the connection is closed with GOAWAY.
    pub http2_max_local_error_reset_streams: usize,
    /// Largest gRPC message once decompressed (the wire size has its own cap,
    /// `--grpc-max-message-bytes`).
    pub grpc_max_decompressed_bytes: usize,
    /// Memory that decoding one gRPC message may take for the structs of its repeated fields
    /// (tensors, parameters, strings), estimated from its wire bytes before it is decoded.
    pub grpc_max_decode_bytes: usize,
    /// Bytes that REST bodies being inflated (or inflated and still held) may take all together.
    pub http_max_inflated_bytes: usize,
}

/// hyper's default header read timeout.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// nginx's `client_body_timeout`.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's `keepalive_timeout` is 75 s; 60 s is within the 30-60 s of the other two.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's `http2_max_concurrent_streams` is 128, hyper's 200; gRPC clients multiplex many calls
/// on one channel, so a little more.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 256;
/// h2's own default.
pub const DEFAULT_HTTP2_MAX_PENDING_RESET_STREAMS: usize = 20;
/// h2's and hyper's default.
pub const DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;
/// 256 MiB: compressed requests are rare and a gzip bomb inflates 1000 to 1; uncompressed
/// messages keep the 2 GiB wire cap.
pub const DEFAULT_GRPC_MAX_DECOMPRESSED_BYTES: usize = 256 * 1024 * 1024;
/// 64 MiB: about 100,000 input tensors or 400,000 parameters in one request (a tensor's struct
/// is 320 bytes, charged twice for its `Vec`'s growth); BYTES strings, tensor data and packed
/// numbers are not charged (`grpc_codec`), so Triton's ten million strings pass.
pub const DEFAULT_GRPC_MAX_DECODE_BYTES: usize = 64 * 1024 * 1024;
/// 256 MiB: four bodies at `--http-max-input-size` (64 MiB) at once; compressed REST requests
/// are rare (tritonclient compresses only when asked), and uncompressed ones are not counted.
pub const DEFAULT_HTTP_MAX_INFLATED_BYTES: usize = 256 * 1024 * 1024;
impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: default_max_connections(),
            http2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            http2_max_pending_reset_streams: DEFAULT_HTTP2_MAX_PENDING_RESET_STREAMS,
            http2_max_local_error_reset_streams: DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS,
            grpc_max_decompressed_bytes: DEFAULT_GRPC_MAX_DECOMPRESSED_BYTES,
            grpc_max_decode_bytes: DEFAULT_GRPC_MAX_DECODE_BYTES,
            http_max_inflated_bytes: DEFAULT_HTTP_MAX_INFLATED_BYTES,
        }
    }
}

/// File descriptors kept back from connections: model files, shared-memory regions, Python
/// stubs' pipes, logs, the listeners.
const RESERVED_DESCRIPTORS: u64 = 256;

/// Raises the soft limit on open descriptors to the hard limit, as servers do (nginx's
/// `worker_rlimit_nofile`): every connection, model file, shared-memory region and Python stub
/// pipe holds one, and distributions still start processes with a soft limit of 1,024, a default
/// for interactive shells. An unlimited hard limit still stops at the kernel's `nr_open` (2^20 by
/// default). Returns the soft limit now in force. The one place kiln changes the limit.
///
/// # Errors
/// The OS error of `getrlimit` or `setrlimit`.
pub fn raise_file_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read or write only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let target = limit.rlim_max.min(1 << 20);
        if target > limit.rlim_cur {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = target;
        }
    }
    Ok(limit.rlim_cur)
}

/// Connections allowed by default: the open-file limit less what the server keeps for itself
/// (at least 64), so that accepting never fails with EMFILE.
pub fn default_max_connections() -> usize {
    let files = raise_file_limit().unwrap_or(1024);
    usize::try_from(files.saturating_sub(RESERVED_DESCRIPTORS).max(64)).unwrap_or(usize::MAX)
}

/// The count of open connections on all listeners; cloning shares it.
#[derive(Debug, Clone)]
pub struct ConnectionSlots(Arc<Semaphore>);

impl ConnectionSlots {
    pub fn new(max: usize) -> ConnectionSlots {
        ConnectionSlots(Arc::new(Semaphore::new(
            max.clamp(1, Semaphore::MAX_PERMITS),
        )))
    }

    /// Waits for a free slot; the connection holds the permit until it closes.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.0)
            .acquire_owned()
            .await
            .expect("the connection semaphore is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_connection_cap_leaves_descriptors_for_the_server() {
        let files = raise_file_limit().unwrap();
        let cap = default_max_connections() as u64;
        assert!(cap >= 64);
        assert!(cap <= files.max(64 + RESERVED_DESCRIPTORS));
    }

    #[tokio::test]
    async fn a_slot_is_free_again_once_its_connection_closes() {
        let slots = ConnectionSlots::new(1);
        let held = slots.acquire().await;
        let waiting = tokio::time::timeout(Duration::from_millis(50), slots.acquire()).await;
        assert!(waiting.is_err(), "no second slot while the first is held");
        drop(held);
        let _again = slots.acquire().await;
    }
}
