//! kiln's `server` layer (see docs/architecture.md).
#![forbid(unsafe_code)]

pub mod server;

pub use kiln_backend::backend;
pub use kiln_core::invalid_arg;
pub use kiln_core::{core, idle_poll, scratch, tls};
pub use kiln_engine::engine;
pub use kiln_generate::generate;
pub use kiln_protocol::{proto, protocol};
pub use kiln_repository::repository;
pub use kiln_scheduler::scheduler;
pub use kiln_telemetry::{logging, metrics, trace};
