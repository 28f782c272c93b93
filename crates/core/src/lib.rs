//! kiln's `core`, `proto`, `scratch`, `tls`, `idle_poll` layer (see docs/architecture.md).

pub mod core;
pub mod idle_poll;
pub mod proto;
pub mod scratch;
pub mod tls;
