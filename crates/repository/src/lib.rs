//! kiln's `repository` layer (see docs/architecture.md).

pub mod repository;

pub use kiln_backend::backend;
pub use kiln_core::invalid_arg;
pub use kiln_core::{core, idle_poll, proto, scratch, tls};
pub use kiln_generate::generate;
pub use kiln_scheduler::scheduler;
pub use kiln_telemetry::{logging, metrics, trace};
