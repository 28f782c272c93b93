//! Triton's system shared-memory extension: a client puts tensors in POSIX shared-memory objects
//! it made (`shm_open` + `ftruncate`, e.g. with `tritonclient.utils.shared_memory`), registers a
//! window of one under a region name, and then names the region (with a byte size and an
//! optional offset) in an input's or an output's parameters instead of sending the bytes:
//! `shared_memory_region`, `shared_memory_byte_size`, `shared_memory_offset`.
//!
//! Layout: this module keeps the registry (register, status, unregister; Triton's texts and
//! codes); `policy` says whether clients may use shared memory at all (`--allow-client-shm`, off
//! by default as in Triton's current release) and which objects they may name; `window` opens one window of a client's object and copies bytes in and out of it
//! (through the descriptor, so a client that shrinks its object gets an error, not a crashed
//! server); `tensors` reads inputs out of regions and writes outputs into them around a request.
//!
//! A request holds the regions it uses, so unregistering one while a request is in flight is
//! safe: the window stays open until that request is done (Triton waits the same way).

mod policy;
pub(super) mod tensors;
mod window;

use crate::core::Error;
pub use policy::{parse_prefix, ShmPolicy, DISABLED};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
pub use tensors::{BYTE_SIZE, OFFSET, REGION};
use window::{OpenError, Window};

/// Most regions registered at once: each holds an open descriptor, and the process needs its
/// descriptors for connections too.
pub const MAX_REGIONS: usize = 4096;

/// Longest region name, in bytes: names are kept while the region is registered and listed by
/// every status call, so they are bounded like the file names they usually mirror (NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;

/// Longest key, in bytes: a `/` and a file name of at most NAME_MAX (255) bytes is the longest
/// key `shm_open` can open; a longer one could only fail, after being logged and echoed.
pub const MAX_KEY_BYTES: usize = 256;

/// What status reports of one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

/// A registered region: its window of the client's object.
#[derive(Debug)]
pub(super) struct Region {
    name: String,
    key: String,
    offset: u64,
    window: Window,
}

/// The registered system shared-memory regions, by name, and what clients may do with them.
/// The default serves no client (see [`ShmPolicy`]).
#[derive(Debug, Default)]
pub struct SharedMemory {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
    policy: ShmPolicy,
}

impl SharedMemory {
    /// Refuses while client shared memory is off (for a front end that checks before it reads
    /// the request, as Triton's REST front end does).
    ///
    /// # Errors
    /// UNSUPPORTED with Triton's text.
    pub fn check_allowed(&self) -> Result<(), Error> {
        self.policy.check_allowed()
    }

    /// A registry that lets clients do what `policy` says.
    pub fn new(policy: ShmPolicy) -> SharedMemory {
        SharedMemory {
            regions: Mutex::default(),
            policy,
        }
    }

    /// Opens `byte_size` bytes at `offset` of the object `key` and registers them as `name`.
    ///
    /// # Errors
    /// UNSUPPORTED while client shared memory is off; ALREADY_EXISTS for a name in use; INTERNAL
    /// when the object cannot be opened; INVALID_ARGUMENT for a key Triton refuses, when the
    /// window does not fit inside the object (Triton's texts), for an object of another user or a
    /// key outside `--client-shm-prefix`, or when the name or key is longer than
    /// [`MAX_NAME_BYTES`] / [`MAX_KEY_BYTES`]; RESOURCE_EXHAUSTED past [`MAX_REGIONS`].
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), Error> {
        self.policy.check_allowed()?;
        check_lengths(name, key)?;
        self.policy.check_key(name, key)?;
        let mut regions = self
            .regions
            .lock()
            .expect("shared-memory registry poisoned");
        if regions.contains_key(name) {
            return Err(Error::AlreadyExists(format!(
                "shared memory region '{name}' already in manager"
            )));
        }
        if regions.len() >= MAX_REGIONS {
            return Err(Error::ResourceExhausted(format!(
                "failed to register shared memory region '{name}': {MAX_REGIONS} regions are \
                 registered already"
            )));
        }
        let owner = self.policy.owner();
        let window = Window::open(key, offset, byte_size, owner).map_err(|e| match e {
            OpenError::Open(why) => {
                tracing::debug!("shm_open('{key}') failed: {why}");
                Error::Internal(format!("Unable to open shared memory region: '{key}'"))
            }
            OpenError::NotAnObject => {
                tracing::debug!("shm_open('{key}'): not a shared-memory object");
                Error::Internal(format!("Unable to open shared memory region: '{key}'"))
            }
            OpenError::Foreign(uid) => {
                tracing::warn!(
                    "refused to register shared memory region '{name}': its object '{key}' \
                     belongs to uid {uid}, not to kiln's user"
                );
                Error::InvalidArgument(format!(
                    "failed to register shared memory region '{name}': the object '{key}' \
                     belongs to another user than the server's (--client-shm-any-owner)"
                ))
            }
            OpenError::OutOfBounds => Error::InvalidArgument(format!(
                "failed to register shared memory region '{name}': invalid args"
            )),
        })?;
        regions.insert(
            name.to_string(),
            Arc::new(Region {
                name: name.to_string(),
                key: key.to_string(),
                offset,
                window,
            }),
        );
        Ok(())
    }

    /// Every region (`name` empty), or the one named.
    ///
    /// # Errors
    /// NOT_FOUND for a name that is not registered.
    pub fn status(&self, name: &str) -> Result<Vec<RegionStatus>, Error> {
        let regions = self
            .regions
            .lock()
            .expect("shared-memory registry poisoned");
        let describe = |region: &Arc<Region>| RegionStatus {
            name: region.name.clone(),
            key: region.key.clone(),
            offset: region.offset,
            byte_size: region.window.len() as u64,
        };
        if name.is_empty() {
            return Ok(regions.values().map(describe).collect());
        }
        regions.get(name).map(|r| vec![describe(r)]).ok_or_else(|| {
            Error::NotFound(format!(
                "Unable to find system shared memory region: '{name}'"
            ))
        })
    }

    /// Unregisters every region (`name` empty), or the one named; a name that is not registered
    /// is not an error (Triton's rule). Requests in flight keep their regions open until done.
    ///
    /// # Errors
    /// UNSUPPORTED while client shared memory is off.
    pub fn unregister(&self, name: &str) -> Result<(), Error> {
        self.policy.check_allowed()?;
        let mut regions = self
            .regions
            .lock()
            .expect("shared-memory registry poisoned");
        if name.is_empty() {
            regions.clear();
        } else {
            regions.remove(name);
        }
        Ok(())
    }

    /// CUDA shared memory as a server without CUDA IPC answers it (as Triton built without
    /// GPUs): no region is ever registered, so status lists none, unregistering has nothing to do,
    /// and registration is refused. Clients such as perf_analyzer unregister both kinds on exit.
    /// While client shared memory is off, both are refused as Triton (built with GPUs) refuses
    /// them.
    pub fn cuda_register(&self, name: &str) -> Error {
        if let Err(off) = self.policy.check_allowed() {
            return off;
        }
        Error::Unsupported(format!(
            "failed to register CUDA shared memory region '{name}': kiln does not serve CUDA \
             shared memory"
        ))
    }

    /// Unregisters CUDA regions: there are none (see [`SharedMemory::cuda_register`]).
    ///
    /// # Errors
    /// UNSUPPORTED while client shared memory is off.
    pub fn cuda_unregister(&self) -> Result<(), Error> {
        self.policy.check_allowed()
    }

    /// The region registered as `name`, for a request to use.
    ///
    /// # Errors
    /// NOT_FOUND, as Triton words it for tensors.
    pub(super) fn region(&self, name: &str) -> Result<Arc<Region>, Error> {
        let regions = self
            .regions
            .lock()
            .expect("shared-memory registry poisoned");
        regions.get(name).cloned().ok_or_else(|| {
            Error::NotFound(format!("Unable to find shared memory region: '{name}'"))
        })
    }
}

/// Refuses a name or a key too long to keep, without repeating it (it may be megabytes).
fn check_lengths(name: &str, key: &str) -> Result<(), Error> {
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "failed to register shared memory region: its name is {} bytes, longer than the \
             {MAX_NAME_BYTES} kiln accepts",
            name.len()
        )));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "failed to register shared memory region '{name}': its key is {} bytes, longer than \
             the {MAX_KEY_BYTES} kiln accepts",
            key.len()
        )));
    }
    Ok(())
}

/// The CUDA regions: none (see [`SharedMemory::cuda_register`]); listed whether or not client
/// shared memory is on, as Triton lists them.
///
/// # Errors
/// NOT_FOUND for any name, in Triton's words.
pub fn cuda_status(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        Ok(())
    } else {
        Err(Error::NotFound(format!(
            "Unable to find cuda shared memory region: '{name}'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::window::tests::Object;
    use super::*;

    #[test]
    fn regions_register_report_and_unregister() {
        let object = Object::new("registry", 8192);
        let memory = SharedMemory::new(ShmPolicy::allowing());
        memory.register("in", &object.key, 0, 64).unwrap();
        memory.register("out", &object.key, 4096, 128).unwrap();
        assert_eq!(
            memory.register("in", &object.key, 0, 8).unwrap_err(),
            Error::AlreadyExists("shared memory region 'in' already in manager".into())
        );
        let status = |name: &str, offset, byte_size| RegionStatus {
            name: name.into(),
            key: object.key.clone(),
            offset,
            byte_size,
        };
        assert_eq!(
            memory.status("").unwrap(),
            [status("in", 0, 64), status("out", 4096, 128)]
        );
        assert_eq!(memory.status("out").unwrap(), [status("out", 4096, 128)]);
        assert_eq!(
            memory.status("nope").unwrap_err(),
            Error::NotFound("Unable to find system shared memory region: 'nope'".into())
        );

        memory.unregister("in").unwrap();
        memory.unregister("never registered").unwrap();
        assert_eq!(memory.status("").unwrap(), [status("out", 4096, 128)]);
        memory.unregister("").unwrap();
        assert!(memory.status("").unwrap().is_empty());
        assert_eq!(
            memory.region("out").unwrap_err(),
            Error::NotFound("Unable to find shared memory region: 'out'".into())
        );
    }

    #[test]
    fn registration_failures_use_tritons_words() {
        let object = Object::new("failures", 4096);
        let memory = SharedMemory::new(ShmPolicy::allowing());
        assert_eq!(
            memory
                .register("r", "/kiln-missing-object", 0, 8)
                .unwrap_err(),
            Error::Internal("Unable to open shared memory region: '/kiln-missing-object'".into())
        );
        for (offset, size) in [(0, 4097), (4095, 2), (u64::MAX, 1), (0, 0)] {
            assert_eq!(
                memory.register("r", &object.key, offset, size).unwrap_err(),
                Error::InvalidArgument(
                    "failed to register shared memory region 'r': invalid args".into()
                ),
                "{offset} + {size}"
            );
        }
        assert!(memory.status("").unwrap().is_empty());
    }

    #[test]
    fn names_and_keys_longer_than_the_bounds_are_refused_unrepeated() {
        let object = Object::new("bounds", 4096);
        let memory = SharedMemory::new(ShmPolicy::allowing());
        let long_name = "n".repeat(MAX_NAME_BYTES + 1);
        let error = memory.register(&long_name, &object.key, 0, 8).unwrap_err();
        assert_eq!(
            error,
            Error::InvalidArgument(
                "failed to register shared memory region: its name is 256 bytes, longer than the \
                 255 kiln accepts"
                    .into()
            )
        );
        let long_key = format!("/{}", "k".repeat(MAX_KEY_BYTES));
        let error = memory.register("r", &long_key, 0, 8).unwrap_err();
        assert_eq!(
            error,
            Error::InvalidArgument(
                "failed to register shared memory region 'r': its key is 257 bytes, longer than \
                 the 256 kiln accepts"
                    .into()
            )
        );
        assert!(memory.status("").unwrap().is_empty());
        // At the bounds: the name is kept; the key is passed on to shm_open.
        let name = "n".repeat(MAX_NAME_BYTES);
        memory.register(&name, &object.key, 0, 8).unwrap();
        assert_eq!(memory.status(&name).unwrap()[0].name, name);
        let longest_key = format!("/{}", "k".repeat(MAX_KEY_BYTES - 1));
        assert!(matches!(
            memory.register("r", &longest_key, 0, 8),
            Err(Error::Internal(_))
        ));
    }

    #[test]
    fn a_region_in_use_outlives_its_unregistration() {
        let object = Object::new("in-use", 4096);
        let memory = SharedMemory::new(ShmPolicy::allowing());
        memory.register("r", &object.key, 0, 16).unwrap();
        let held = memory.region("r").unwrap();
        memory.unregister("r").unwrap();
        held.window.write(0, &[7; 16]).unwrap();
        assert_eq!(held.window.read(0, 16).unwrap(), [7; 16]);
        // The name is free again at once.
        memory.register("r", &object.key, 0, 16).unwrap();
        assert_eq!(
            memory.region("r").unwrap().window.read(0, 2).unwrap(),
            [7, 7]
        );
    }

    #[test]
    fn off_by_default_every_call_but_status_is_refused() {
        let object = Object::new("off", 4096);
        let memory = SharedMemory::default();
        let off = Error::Unsupported(DISABLED.into());
        assert_eq!(memory.register("r", &object.key, 0, 8).unwrap_err(), off);
        assert_eq!(memory.unregister("r").unwrap_err(), off);
        assert_eq!(memory.unregister("").unwrap_err(), off);
        assert_eq!(memory.cuda_register("r"), off);
        assert_eq!(memory.cuda_unregister().unwrap_err(), off);
        assert!(memory.status("").unwrap().is_empty());
        let on = SharedMemory::new(ShmPolicy::allowing());
        assert!(on.cuda_unregister().is_ok());
        assert_eq!(
            on.cuda_register("r").message(),
            "failed to register CUDA shared memory region 'r': kiln does not serve CUDA shared \
             memory"
        );
    }

    #[test]
    fn keys_are_checked_before_the_name_and_the_object() {
        let object = Object::new("keys", 4096);
        let memory = SharedMemory::new(ShmPolicy {
            prefix: Some("/kiln-unit-keys".into()),
            ..ShmPolicy::allowing()
        });
        memory.register("r", &object.key, 0, 8).unwrap();
        // Triton's key checks come before the name in use.
        assert!(memory
            .register("r", "/", 0, 8)
            .unwrap_err()
            .message()
            .contains("invalid shm key '/'"));
        let outside = memory.register("s", "/kiln-other", 0, 8).unwrap_err();
        assert!(
            matches!(&outside, Error::InvalidArgument(m) if m.contains("--client-shm-prefix")),
            "{outside:?}"
        );
        assert_eq!(memory.status("").unwrap().len(), 1);
    }
}
