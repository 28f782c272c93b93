//! One POSIX shared-memory object mapped into this process: `shm_open` by key, bounds checked
//! against the object's size, `mmap`ped shared and read-write, unmapped on drop. The only unsafe
//! code of the shared-memory extension lives here.
//!
//! The client owns the memory and may write to it at any time; Triton's contract is that it does
//! not touch a region while a request that uses it is in flight. Nothing here hands out a Rust
//! reference into the mapping: bytes are copied in and out through raw pointers, so a client
//! that breaks the contract gets torn tensor data, never undefined behaviour in the server.

use std::ffi::CString;
use std::ptr::NonNull;

/// A mapped window `[offset, offset + len)` of a shared-memory object.
#[derive(Debug)]
pub struct Mapping {
    /// Start of the `mmap`, at the page boundary at or below the requested offset.
    base: NonNull<u8>,
    /// Bytes mapped from `base`.
    mapped: usize,
    /// Where the requested window starts within the mapping.
    skip: usize,
    /// The window's length.
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value until drop; every access copies
// through raw pointers with bounds checked against `len` (see the module docs on concurrent
// writers), so it may move between and be used from several threads.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

/// Why a mapping could not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum MapError {
    /// No object under that key, or no permission to open it.
    Open(String),
    /// The window does not fit inside the object.
    OutOfBounds,
    /// `fstat` or `mmap` failed.
    Map(String),
}

impl Mapping {
    /// Maps `len` bytes at `offset` of the object `key` (an `shm_open` name, e.g. `/input0`).
    pub fn open(key: &str, offset: u64, len: u64) -> Result<Mapping, MapError> {
        let c_key = CString::new(key).map_err(|_| MapError::Open("the key holds a NUL".into()))?;
        // SAFETY: `c_key` is a valid C string; the returned descriptor is checked and closed
        // below on every path.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(MapError::Open(std::io::Error::last_os_error().to_string()));
        }
        let mapped = map(fd, offset, len);
        // SAFETY: `fd` is the descriptor opened above; the mapping does not need it open.
        unsafe { libc::close(fd) };
        mapped
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Copies `len` bytes at `at` out of the window, or `None` when they do not fit in it.
    pub fn read(&self, at: usize, len: usize) -> Option<Vec<u8>> {
        self.check(at, len)?;
        let mut out = Vec::with_capacity(len);
        // SAFETY: `check` keeps `[at, at + len)` inside the window, which lies inside the live
        // mapping; `out` has room for `len` bytes and does not overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(self.start().add(at), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        Some(out)
    }

    /// Copies `data` into the window at `at`; `false` (and nothing written) when it does not fit.
    pub fn write(&self, at: usize, data: &[u8]) -> bool {
        if self.check(at, data.len()).is_none() {
            return false;
        }
        // SAFETY: as in `read`; the mapping is writable (PROT_WRITE) and `data` is our own
        // memory, which cannot overlap a mapping made by `mmap`.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.start().add(at), data.len());
        }
        true
    }

    fn check(&self, at: usize, len: usize) -> Option<()> {
        (at.checked_add(len)? <= self.len).then_some(())
    }

    fn start(&self) -> *mut u8 {
        // SAFETY: `skip` is below the page size and inside the mapping (see `map`).
        unsafe { self.base.as_ptr().add(self.skip) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`mapped` are exactly what `mmap` returned and nothing refers into the
        // mapping once its owner is dropped (every access copies).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

/// Checks the window against the object behind `fd` and maps it, from the page boundary below
/// `offset` (`mmap` takes page-aligned offsets only).
fn map(fd: libc::c_int, offset: u64, len: u64) -> Result<Mapping, MapError> {
    // SAFETY: `stat` is plain old data that `fstat` fills; the result is checked.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(MapError::Map(std::io::Error::last_os_error().to_string()));
    }
    let size = u64::try_from(stat.st_size).map_err(|_| MapError::OutOfBounds)?;
    let end = offset.checked_add(len).ok_or(MapError::OutOfBounds)?;
    if len == 0 || end > size {
        return Err(MapError::OutOfBounds);
    }
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    let aligned = offset - offset % page;
    let skip = offset - aligned;
    let (Ok(mapped), Ok(file_offset), Ok(skip_bytes), Ok(len_bytes)) = (
        usize::try_from(len + skip),
        libc::off_t::try_from(aligned),
        usize::try_from(skip),
        usize::try_from(len),
    ) else {
        return Err(MapError::OutOfBounds);
    };
    // SAFETY: a fresh shared mapping of a range checked to lie inside the object; the result is
    // checked against MAP_FAILED.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            file_offset,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(MapError::Map(std::io::Error::last_os_error().to_string()));
    }
    Ok(Mapping {
        base: NonNull::new(base.cast())
            .ok_or_else(|| MapError::Map("mmap returned null".into()))?,
        mapped,
        skip: skip_bytes,
        len: len_bytes,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A shared-memory object made the way clients make them (`shm_open` + `ftruncate`),
    /// removed on drop.
    pub struct Object {
        pub key: String,
    }

    impl Object {
        pub fn new(tag: &str, size: usize) -> Object {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let key = format!("/kiln-unit-{tag}-{}-{n}", std::process::id());
            let c_key = CString::new(key.clone()).unwrap();
            // SAFETY: test setup with checked results.
            unsafe {
                let fd = libc::shm_open(
                    c_key.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                );
                assert!(fd >= 0, "shm_open: {}", std::io::Error::last_os_error());
                assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
                libc::close(fd);
            }
            Object { key }
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let c_key = CString::new(self.key.clone()).unwrap();
            // SAFETY: removes the name created in `new`.
            unsafe { libc::shm_unlink(c_key.as_ptr()) };
        }
    }

    #[test]
    fn windows_see_each_others_writes_at_any_offset() {
        let object = Object::new("window", 3 * 4096);
        let whole = Mapping::open(&object.key, 0, 3 * 4096).unwrap();
        // An offset that is not page-aligned maps from the page below it.
        let window = Mapping::open(&object.key, 4096 + 100, 64).unwrap();
        assert_eq!(window.len(), 64);
        assert!(window.write(8, &[1, 2, 3, 4]));
        assert_eq!(whole.read(4096 + 108, 4).unwrap(), [1, 2, 3, 4]);
        assert!(whole.write(4096 + 100, &[9; 8]));
        assert_eq!(
            window.read(0, 12).unwrap(),
            [9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 3, 4]
        );
    }

    #[test]
    fn accesses_outside_the_window_are_refused() {
        let object = Object::new("bounds", 4096);
        let window = Mapping::open(&object.key, 1000, 100).unwrap();
        assert!(window.read(0, 100).is_some());
        assert!(window.read(1, 100).is_none());
        assert!(window.read(usize::MAX, 2).is_none());
        assert!(!window.write(99, &[0, 0]));
        assert_eq!(window.read(99, 1).unwrap(), [0]);
    }

    #[test]
    fn windows_must_fit_the_object() {
        let object = Object::new("fit", 4096);
        for (offset, len) in [(0, 4097), (4000, 97), (u64::MAX, 2), (0, 0)] {
            assert_eq!(
                Mapping::open(&object.key, offset, len).unwrap_err(),
                MapError::OutOfBounds,
                "{offset} + {len}"
            );
        }
        assert!(matches!(
            Mapping::open("/kiln-no-such-object", 0, 1).unwrap_err(),
            MapError::Open(_)
        ));
        assert!(matches!(
            Mapping::open("/bad\0key", 0, 1).unwrap_err(),
            MapError::Open(_)
        ));
    }
}
