//! kiln's `protocol` layer (see docs/architecture.md).

pub mod protocol;

pub use kiln_core::{core, idle_poll, scratch, tls};

/// kiln-core's protocol types, with the gRPC services generated over them here (they use this
/// crate's bounded codec).
pub mod proto {
    pub use kiln_core::proto::*;

    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod inference {
        pub use kiln_core::proto::inference::*;
        tonic::include_proto!("inference");
    }
}
pub use kiln_backend::backend;
pub use kiln_core::invalid_arg;
pub use kiln_engine::engine;
pub use kiln_generate::generate;
pub use kiln_repository::repository;
pub use kiln_scheduler::scheduler;
pub use kiln_telemetry::{logging, metrics, trace};
