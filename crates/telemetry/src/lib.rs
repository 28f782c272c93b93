//! kiln's `logging`, `metrics`, `trace` layer (see docs/architecture.md).

pub mod logging;
pub mod metrics;
pub mod trace;

pub use kiln_core::invalid_arg;
pub use kiln_core::{core, idle_poll, proto, scratch, tls};
