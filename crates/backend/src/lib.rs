//! kiln's `backend` layer (see docs/architecture.md).

pub mod backend;

pub use kiln_core::invalid_arg;
pub use kiln_core::{core, idle_poll, proto, scratch, tls};
pub use kiln_telemetry::{logging, metrics, trace};
