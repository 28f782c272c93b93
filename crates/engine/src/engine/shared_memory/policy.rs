//! Which clients may use shared memory, and which objects they may name.
//!
//! Triton's current release serves client shared memory only with `--allow-client-shm=true`
//! (server PR #8721): without it, registering and unregistering regions, system or CUDA, are
//! refused (UNSUPPORTED) and status lists none; inference can name no region, since none is
//! registered. kiln does the same, in Triton's words.
//!
//! With it on, Triton opens any object its user can open, whoever made it: a client that can
//! reach the API reads and overwrites another process's `/dev/shm` objects by naming their keys.
//! kiln's default is closed there (the rule for safety): an object must belong to kiln's own
//! user (`--client-shm-any-owner=true` gives Triton's behaviour), and with `--client-shm-prefix P`
//! its key must start with `P`. Keys Triton's current release refuses (all slashes, its Python
//! backend's reserved prefix) are refused in its words. What is left reachable (the objects of
//! kiln's own user under the prefix) is docs/operations.md's "Security model".

use crate::core::Error;

/// Triton's refusal while client shared memory is off (server src/common.h,
/// `kClientShmDisabledErrorStr`), UNSUPPORTED: gRPC UNIMPLEMENTED, REST 501.
pub const DISABLED: &str =
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";

/// The key prefix Triton keeps for its Python backend's own regions (server src/common.h,
/// `kTritonSharedMemoryRegionPrefix`); a client's key may not start with it.
pub const RESERVED_KEY_PREFIX: &str = "triton_python_backend_shm_region_";

/// What clients may do with shared memory (`--allow-client-shm`, `--client-shm-prefix`,
/// `--client-shm-any-owner`). The default serves none, as Triton's current release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShmPolicy {
    /// Clients may register, unregister and use regions.
    pub allow: bool,
    /// Keys must start with this object name (leading slashes ignored on both sides).
    pub prefix: Option<String>,
    /// Objects of any owner may be registered (Triton's behaviour); otherwise only kiln's user's.
    pub any_owner: bool,
}

impl ShmPolicy {
    /// Client shared memory on, with kiln's checks.
    pub fn allowing() -> ShmPolicy {
        ShmPolicy {
            allow: true,
            ..ShmPolicy::default()
        }
    }

    /// The refusal while client shared memory is off.
    ///
    /// # Errors
    /// UNSUPPORTED with Triton's text.
    pub fn check_allowed(&self) -> Result<(), Error> {
        if self.allow {
            Ok(())
        } else {
            Err(Error::Unsupported(DISABLED.into()))
        }
    }

    /// The uid an object must belong to, if any.
    pub fn owner(&self) -> Option<u32> {
        // SAFETY: geteuid cannot fail and touches no memory.
        (!self.any_owner).then(|| unsafe { libc::geteuid() })
    }

    /// Refuses a key before any object is opened: Triton's checks (all slashes, its reserved
    /// prefix; server src/common.cc, `ValidateSharedMemoryKey`), then kiln's prefix.
    ///
    /// # Errors
    /// INVALID_ARGUMENT.
    pub fn check_key(&self, name: &str, key: &str) -> Result<(), Error> {
        let object = object_name(key);
        if object.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "cannot register shared memory region '{name}' - invalid shm key '{key}'"
            )));
        }
        if object.starts_with(RESERVED_KEY_PREFIX) {
            return Err(Error::InvalidArgument(format!(
                "cannot register shared memory region '{name}' with key '{key}' as the key \
                 contains the reserved prefix '{RESERVED_KEY_PREFIX}'"
            )));
        }
        match &self.prefix {
            Some(prefix) if !object.starts_with(object_name(prefix)) => {
                Err(Error::InvalidArgument(format!(
                    "cannot register shared memory region '{name}' with key '{key}': this server \
                     accepts only keys starting with '{prefix}' (--client-shm-prefix)"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The object's name in `/dev/shm`: the key without its leading slashes, as `shm_open` takes it.
pub fn object_name(key: &str) -> &str {
    key.trim_start_matches('/')
}

/// Checks a `--client-shm-prefix`: a file name, with or without its leading slash.
///
/// # Errors
/// A message for the command line.
pub fn parse_prefix(prefix: &str) -> Result<String, String> {
    let object = object_name(prefix);
    if object.is_empty() || object.contains('/') || object == "." || object == ".." {
        return Err(format!(
            "expected the start of a shared-memory object's name (e.g. /myapp_), got '{prefix}'"
        ));
    }
    Ok(prefix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_in_tritons_words() {
        let error = ShmPolicy::default().check_allowed().unwrap_err();
        assert_eq!(
            error,
            Error::Unsupported(
                "Client shared memory is disabled. Start the server with \
                 '--allow-client-shm=true' to enable."
                    .into()
            )
        );
        assert!(ShmPolicy::allowing().check_allowed().is_ok());
    }

    #[test]
    fn keys_triton_refuses_are_refused_in_its_words() {
        let policy = ShmPolicy::allowing();
        for key in ["", "/", "///"] {
            assert_eq!(
                policy.check_key("r", key).unwrap_err().message(),
                format!("cannot register shared memory region 'r' - invalid shm key '{key}'")
            );
        }
        for key in [
            "triton_python_backend_shm_region_1",
            "//triton_python_backend_shm_region_x",
        ] {
            assert_eq!(
                policy.check_key("r", key).unwrap_err().message(),
                format!(
                    "cannot register shared memory region 'r' with key '{key}' as the key \
                     contains the reserved prefix 'triton_python_backend_shm_region_'"
                )
            );
        }
        for key in [
            "/input0",
            "input0",
            "//a",
            "/triton_python_backend_shm_region",
        ] {
            assert!(policy.check_key("r", key).is_ok(), "{key}");
        }
    }

    #[test]
    fn a_prefix_is_compared_without_leading_slashes() {
        for prefix in ["/app_", "app_"] {
            let policy = ShmPolicy {
                prefix: Some(prefix.into()),
                ..ShmPolicy::allowing()
            };
            for key in ["/app_in", "app_out", "//app_"] {
                assert!(policy.check_key("r", key).is_ok(), "{prefix} {key}");
            }
            for key in ["/other", "/ap", "/x/app_in"] {
                assert_eq!(
                    policy.check_key("r", key).unwrap_err().message(),
                    format!(
                        "cannot register shared memory region 'r' with key '{key}': this server \
                         accepts only keys starting with '{prefix}' (--client-shm-prefix)"
                    )
                );
            }
        }
        assert_eq!(parse_prefix("/app_").unwrap(), "/app_");
        for bad in ["", "/", "/a/b", "..", "/."] {
            assert!(parse_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_owner_is_kilns_unless_any_owner() {
        // SAFETY: as in `owner`.
        let me = unsafe { libc::geteuid() };
        assert_eq!(ShmPolicy::allowing().owner(), Some(me));
        let any = ShmPolicy {
            any_owner: true,
            ..ShmPolicy::allowing()
        };
        assert_eq!(any.owner(), None);
    }
}
