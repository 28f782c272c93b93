//! Integration tests: the real kiln binary started on ephemeral ports and driven with real
//! clients (tonic, a raw HTTP/1.1 client, tritonclient-style requests, an S3 server).
//!
//! One test binary rather than one per file: every file here would otherwise link its own copy of
//! kiln and all its dependencies, which costs CI minutes and gigabytes of disk for nothing.

mod common;

mod generate;
mod gpu;
mod grpc;
mod http;
mod http_errors;
mod http_tensors;
mod idle_poll;
mod lifecycle;
mod lifecycle_overrides;
mod lifecycle_poll;
mod lifecycle_reload;
mod lifecycle_remote;
mod model_files;
mod overload;
mod scheduler;
mod session_tuning;
mod shared_memory;
mod shutdown;
mod text;
