//! Flags for serving many models (kiln's own), and the settings of what the models get: the
//! response cache and the rate limiter.

use super::{Args, ModelControlMode, RateLimitMode};
use crate::engine::CacheConfig;
use crate::scheduler::rate_limit::ResourceFlags;

/// `--load-on-demand`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelFlags {
    /// Load a model on its first inference, metadata or config request, when the repository
    /// holds it and it is not loaded (explicit or poll mode, where polls then reload and unload
    /// only the models requests loaded; kiln's own, off as in Triton). Requests
    /// for a model that is loading wait for that one load; a failed load is answered with its
    /// error for a backoff (1 s, doubling to 60 s) before it is tried again; a name no
    /// repository holds is remembered for 5 s (docs/models.md, "Many models").
    #[arg(long = "load-on-demand", env = "KILN_LOAD_ON_DEMAND", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = super::bool_value, action = clap::ArgAction::Set)]
    pub load_on_demand: bool,
}

impl ModelFlags {
    /// Whether models load on demand under `mode`.
    ///
    /// # Errors
    /// `--load-on-demand` in mode `none`.
    pub fn load_on_demand(&self, mode: ModelControlMode) -> Result<bool, String> {
        match (self.load_on_demand, mode) {
            (true, ModelControlMode::None) => Err(
                "--load-on-demand needs --model-control-mode=explicit or poll (mode none loads \
                 every model at start-up)"
                    .into(),
            ),
            (on, _) => Ok(on),
        }
    }
}

impl Args {
    /// The response cache `--cache-config` and `--response-cache-byte-size` ask for.
    pub(super) fn response_cache(&self) -> Result<Option<CacheConfig>, String> {
        let mut cache_flags = self.cache_config.clone();
        if let Some(bytes) = self.response_cache_byte_size {
            cache_flags.push(format!("local,size={bytes}"));
        }
        CacheConfig::from_flags(&cache_flags)
    }

    /// The rate limiter's resources under `--rate-limit=execution_count`; none when it is off
    /// (a note says when `--rate-limit-resource` is given to no effect).
    pub(super) fn rate_limit(
        &self,
        notes: &mut Vec<String>,
    ) -> Result<Option<ResourceFlags>, String> {
        let resources = ResourceFlags::parse(&self.rate_limit_resource)?;
        Ok(match self.rate_limit {
            RateLimitMode::ExecutionCount => Some(resources),
            RateLimitMode::Off => {
                if !self.rate_limit_resource.is_empty() {
                    notes.push(
                        "--rate-limit-resource has no effect without --rate-limit=execution_count"
                            .into(),
                    );
                }
                None
            }
        })
    }
}
