//! kiln: an inference server for ONNX models that speaks NVIDIA Triton's KServe v2 / Open
//! Inference Protocol (gRPC, REST with the binary tensor data extension, Prometheus metrics).
//! `docs/architecture.md` describes the layers and the request path; this is the map.
//!
//! # Layout
//!
//! - [`server`]: wiring: the listeners, reflection, health, graceful shutdown.
//! - [`protocol`]: the wire: gRPC, REST (JSON and binary tensors), the cloud and OpenAI listeners,
//!   gRPC-Web, restricted APIs, transport limits; everything decodes to [`core`] types.
//! - [`engine`]: the façade both protocols call: admission, lookup, validation, shared memory,
//!   the response cache, ensembles, decoupled streams, responses.
//! - [`repository`]: model stores, `config.pbtxt` and auto-complete, version policies, placement,
//!   loading, and the lifecycle (control modes, load/unload/poll, readiness, index).
//! - [`scheduler`]: per model version, the batching state behind a `Mutex` and `Condvar`, the
//!   instances that pull batches from it, and inline runs of lone requests on the caller's thread.
//! - [`generate`]: the continuous-batching generation loop of decoupled generation models.
//! - [`backend`]: execution: ONNX Runtime (CPU, CUDA, text models, decoder passes) and Triton's
//!   Python backend (a stub process per instance).
//! - [`core`]: pure types: datatypes, tensors, requests and responses, the façade error.
//! - [`metrics`]: Triton's statistics and Prometheus metrics, recorded at the same points.
//! - [`trace`]: Triton's request traces (JSON files) and OpenTelemetry spans.
//! - [`logging`]: Triton's log settings and line formats, changed at run time.
//! - [`cli`]: `tritonserver`'s flags, parsed and checked, turned into the server's config.
//! - [`proto`]: the code generated from Triton's `.proto` files.
//! - [`tls`], [`scratch`], [`idle_poll`]: rustls settings, private temporary directories, the
//!   `--idle-poll-us` pollers.
//!
//! # The import rule
//!
//! Imports run one way only: `server → protocol → engine → repository → scheduler → backend →
//! core`. [`cli`] sits on top (it starts the server); [`generate`] sits between
//! [`repository`] and [`backend`], beside the scheduler; [`metrics`], [`trace`] and [`logging`]
//! are leaves that any layer may use and that import only [`core`] (and the generated
//! [`proto`]). No arrow runs back up.
//!
//! Each layer is a crate of the workspace (`crates/`) that depends only on the crates below it,
//! so the compiler refuses an arrow that runs up or sideways. This crate holds the command line
//! and the binary, and re-exports every layer under its module name.

pub mod cli;
#[cfg(test)]
mod scan;
#[cfg(test)]
mod sizes;

pub use kiln_backend::backend;
pub use kiln_core::invalid_arg;
pub use kiln_core::{core, idle_poll, scratch, tls};
pub use kiln_engine::engine;
pub use kiln_generate::generate;
pub use kiln_protocol::{proto, protocol};
pub use kiln_repository::repository;
pub use kiln_scheduler::scheduler;
pub use kiln_server::server;
pub use kiln_telemetry::{logging, metrics, trace};
