//! One window `[offset, offset + len)` of a client's POSIX shared-memory object, opened by key
//! (`shm_open`) and read and written through its descriptor (`pread`/`pwrite`), never mapped.
//!
//! Triton maps regions into its address space. Then a client that shrinks the object
//! (`ftruncate`) under a registered region makes the server's next access to the lost pages a
//! SIGBUS, which kills the process. Through the descriptor the same client gets a short read, and
//! the request fails with a message. The copy costs what a `memcpy` out of a mapping would (the
//! kernel copies the pages once), and a client writing to the object mid-request can tear the
//! server's copy, never the server.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};

/// A checked window of an open shared-memory object.
#[derive(Debug)]
pub struct Window {
    object: File,
    offset: u64,
    len: usize,
}

/// Why a window could not be opened.
#[derive(Debug, PartialEq, Eq)]
pub enum OpenError {
    /// No object under that key, or no permission to open it.
    Open(String),
    /// The window does not fit inside the object, or is empty.
    OutOfBounds,
    /// The object belongs to another user (this uid) than the one asked for.
    Foreign(u32),
    /// The name is not a plain file (a directory, a FIFO, a socket).
    NotAnObject,
}

/// Why a read or write of a window failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AccessError {
    /// The range is not inside the window (a caller's bug; slots are checked before).
    OutOfWindow,
    /// The object is smaller now than when the window was registered.
    Shrunk,
    /// Any other I/O error.
    Io(String),
}

impl Window {
    /// Opens the object `key` (an `shm_open` name, e.g. `/input0`) and checks that it is a plain
    /// object (owned by `owner`, when given) and that `len` bytes at `offset` lie inside it.
    ///
    /// The key names one file of `/dev/shm`: a name with a `/` after its leading ones, `.` or
    /// `..` is refused here, whatever the C library would make of it, and a symbolic link is not
    /// followed (`O_NOFOLLOW`), so a key reaches no file outside `/dev/shm`.
    pub fn open(key: &str, offset: u64, len: u64, owner: Option<u32>) -> Result<Window, OpenError> {
        let name = key.trim_start_matches('/');
        if name.contains('/') || name == "." || name == ".." {
            return Err(OpenError::Open("not the name of one object".into()));
        }
        let c_key = CString::new(key).map_err(|_| OpenError::Open("the key holds a NUL".into()))?;
        let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        // SAFETY: `c_key` is a valid C string; a non-negative result is a descriptor that nothing
        // else owns, handed to `OwnedFd` at once.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), flags, 0) };
        if fd < 0 {
            return Err(OpenError::Open(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: see above.
        let object = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let metadata = object
            .metadata()
            .map_err(|e| OpenError::Open(e.to_string()))?;
        if !metadata.file_type().is_file() {
            return Err(OpenError::NotAnObject);
        }
        if owner.is_some_and(|uid| metadata.uid() != uid) {
            return Err(OpenError::Foreign(metadata.uid()));
        }
        let size = metadata.len();
        match (offset.checked_add(len), usize::try_from(len)) {
            (Some(end), Ok(len)) if len > 0 && end <= size => Ok(Window {
                object,
                offset,
                len,
            }),
            _ => Err(OpenError::OutOfBounds),
        }
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Copies `len` bytes at `at` (within the window) out of the object.
    pub fn read(&self, at: usize, len: usize) -> Result<Vec<u8>, AccessError> {
        let position = self.position(at, len)?;
        let mut out = vec![0; len];
        self.object
            .read_exact_at(&mut out, position)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => AccessError::Shrunk,
                _ => AccessError::Io(e.to_string()),
            })?;
        Ok(out)
    }

    /// Copies `data` into the object at `at` (within the window). An object that shrank is left
    /// as it is rather than grown back.
    pub fn write(&self, at: usize, data: &[u8]) -> Result<(), AccessError> {
        let position = self.position(at, data.len())?;
        let size = self
            .object
            .metadata()
            .map_err(|e| AccessError::Io(e.to_string()))?
            .len();
        if position + data.len() as u64 > size {
            return Err(AccessError::Shrunk);
        }
        self.object
            .write_all_at(data, position)
            .map_err(|e| AccessError::Io(e.to_string()))
    }

    /// Where `[at, at + len)` of the window starts in the object.
    fn position(&self, at: usize, len: usize) -> Result<u64, AccessError> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + at as u64),
            _ => Err(AccessError::OutOfWindow),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A shared-memory object made the way clients make them (`shm_open` + `ftruncate`),
    /// removed on drop.
    pub struct Object {
        pub key: String,
        file: File,
    }

    impl Object {
        pub fn new(tag: &str, size: u64) -> Object {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let key = format!("/kiln-unit-{tag}-{}-{n}", std::process::id());
            let c_key = CString::new(key.clone()).unwrap();
            // SAFETY: test setup; the descriptor is checked and owned at once.
            let fd = unsafe {
                libc::shm_open(
                    c_key.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )
            };
            assert!(fd >= 0, "shm_open: {}", std::io::Error::last_os_error());
            let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            file.set_len(size).unwrap();
            Object { key, file }
        }

        /// What a client does to break the contract: shrink the object under its regions.
        pub fn truncate(&self, size: u64) {
            self.file.set_len(size).unwrap();
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
        let whole = Window::open(&object.key, 0, 3 * 4096, None).unwrap();
        let window = Window::open(&object.key, 4096 + 100, 64, None).unwrap();
        assert_eq!(window.len(), 64);
        window.write(8, &[1, 2, 3, 4]).unwrap();
        assert_eq!(whole.read(4096 + 108, 4).unwrap(), [1, 2, 3, 4]);
        whole.write(4096 + 100, &[9; 8]).unwrap();
        assert_eq!(
            window.read(0, 12).unwrap(),
            [9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 3, 4]
        );
    }

    #[test]
    fn accesses_outside_the_window_are_refused() {
        let object = Object::new("bounds", 4096);
        let window = Window::open(&object.key, 1000, 100, None).unwrap();
        assert!(window.read(0, 100).is_ok());
        assert_eq!(window.read(1, 100), Err(AccessError::OutOfWindow));
        assert_eq!(window.read(usize::MAX, 2), Err(AccessError::OutOfWindow));
        assert_eq!(window.write(99, &[0, 0]), Err(AccessError::OutOfWindow));
        assert_eq!(window.read(99, 1).unwrap(), [0]);
    }

    #[test]
    fn a_shrunken_object_is_an_error_not_a_signal() {
        let object = Object::new("shrunk", 8192);
        let window = Window::open(&object.key, 4096, 4096, None).unwrap();
        object.truncate(4096 + 10);
        assert_eq!(window.read(0, 4096), Err(AccessError::Shrunk));
        assert_eq!(window.write(0, &[1; 64]), Err(AccessError::Shrunk));
        // Nothing was grown back, and what is left still reads.
        assert_eq!(window.read(0, 10).unwrap(), [0; 10]);
        assert!(window.write(0, &[5; 10]).is_ok());
        assert_eq!(window.read(0, 10).unwrap(), [5; 10]);
    }

    #[test]
    fn windows_must_fit_the_object() {
        let object = Object::new("fit", 4096);
        for (offset, len) in [(0, 4097), (4000, 97), (u64::MAX, 2), (0, 0)] {
            assert_eq!(
                Window::open(&object.key, offset, len, None).unwrap_err(),
                OpenError::OutOfBounds,
                "{offset} + {len}"
            );
        }
        assert!(matches!(
            Window::open("/kiln-no-such-object", 0, 1, None).unwrap_err(),
            OpenError::Open(_)
        ));
        assert!(matches!(
            Window::open("/bad\0key", 0, 1, None).unwrap_err(),
            OpenError::Open(_)
        ));
    }

    #[test]
    fn keys_reach_only_plain_objects_of_dev_shm_of_the_owner_asked_for() {
        let object = Object::new("owner", 4096);
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        assert!(Window::open(&object.key, 0, 8, Some(me)).is_ok());
        assert_eq!(
            Window::open(&object.key, 0, 8, Some(me.wrapping_add(1))).unwrap_err(),
            OpenError::Foreign(me)
        );
        // A symbolic link in /dev/shm to the object (or to any file) is not followed.
        let link = format!("{}-link", object.key);
        std::os::unix::fs::symlink(format!("/dev/shm{}", object.key), format!("/dev/shm{link}"))
            .unwrap();
        let through_link = Window::open(&link, 0, 8, None);
        std::fs::remove_file(format!("/dev/shm{link}")).unwrap();
        assert!(
            matches!(through_link, Err(OpenError::Open(_))),
            "{through_link:?}"
        );
        // Nothing outside /dev/shm, nothing that is not one object's name.
        let inside = object.key.trim_start_matches('/');
        for key in [
            "/../shm/".to_string() + inside,
            format!("/./{inside}"),
            "/..".into(),
            "/.".into(),
            "/../../etc/passwd".into(),
        ] {
            assert!(
                matches!(Window::open(&key, 0, 1, None), Err(OpenError::Open(_))),
                "{key}"
            );
        }
        // A directory is no object.
        let dir = format!("{}-dir", object.key);
        std::fs::create_dir(format!("/dev/shm{dir}")).unwrap();
        let opened = Window::open(&dir, 0, 1, None);
        std::fs::remove_dir(format!("/dev/shm{dir}")).unwrap();
        assert!(opened.is_err(), "{opened:?}");
    }
}
