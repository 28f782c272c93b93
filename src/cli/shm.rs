//! The shared-memory flags: Triton's `--allow-client-shm` (off by default, as in Triton's current
//! release) and kiln's checks on the objects a client names once it is on.

use super::bool_value;
use crate::engine::shared_memory::{parse_prefix, ShmPolicy};

#[derive(Debug, Clone, clap::Args)]
pub struct ShmFlags {
    /// Let clients register, unregister and use shared-memory regions (system and CUDA) for
    /// inputs and outputs. Off, those calls are refused ("Client shared memory is disabled"),
    /// as in Triton's current release; status lists no region.
    #[arg(long, env = "KILN_ALLOW_CLIENT_SHM", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_client_shm: bool,

    /// Only shared-memory objects whose key starts with this name (e.g. `/myapp_`; leading
    /// slashes ignored) may be registered. Default: any key.
    #[arg(long, env = "KILN_CLIENT_SHM_PREFIX", value_name = "PREFIX", value_parser = parse_prefix)]
    pub client_shm_prefix: Option<String>,

    /// Let clients register objects of any user, as Triton does. By default an object must
    /// belong to the user kiln runs as.
    #[arg(long, env = "KILN_CLIENT_SHM_ANY_OWNER", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub client_shm_any_owner: bool,
}

impl ShmFlags {
    /// What clients may do with shared memory.
    pub fn policy(&self) -> ShmPolicy {
        ShmPolicy {
            allow: self.allow_client_shm,
            prefix: self.client_shm_prefix.clone(),
            any_owner: self.client_shm_any_owner,
        }
    }
}
