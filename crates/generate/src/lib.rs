//! kiln's `generate` layer (see docs/architecture.md).
#![forbid(unsafe_code)]

pub mod generate;

pub use kiln_backend::backend;
pub use kiln_core::invalid_arg;
pub use kiln_core::{core, idle_poll, proto, scratch, tls};
pub use kiln_telemetry::{logging, metrics, trace};
