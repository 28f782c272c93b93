//! Scratch space under the system's temporary directory (`$TMPDIR`, else `/tmp`) that another
//! local user cannot pre-create, redirect or read: load overrides, the default cache of a remote
//! model store and unpacked Python environments go here.
//!
//! A directory name under a shared `/tmp` that others can guess (`kiln-override-<pid>-0`) lets a
//! local user plant a symlink or a directory of their own there first, and `create_dir_all`
//! happily writes through it. So each directory is made here with one `mkdir` (which never
//! follows a link and fails on anything already in place) under a random name, mode 0700; and
//! files written into places a path names are opened with `O_CREAT|O_EXCL|O_NOFOLLOW`, so an
//! existing file or link is an error, never a target.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Names tried before giving up: a clash means someone else made that exact random name.
const ATTEMPTS: usize = 16;

/// Makes a new directory `<temp>/<prefix><16 random hex digits>`, mode 0700, and returns it.
///
/// # Errors
/// The OS error of `mkdir`, or of the random source; `AlreadyExists` after [`ATTEMPTS`] names
/// that were all taken.
pub fn private_dir(prefix: &str) -> io::Result<PathBuf> {
    private_dir_in(&std::env::temp_dir(), prefix)
}

/// [`private_dir`] in `parent`.
///
/// # Errors
/// As [`private_dir`].
pub fn private_dir_in(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    let mut builder = DirBuilder::new();
    builder.mode(0o700);
    for _ in 0..ATTEMPTS {
        let dir = parent.join(format!("{prefix}{:016x}", random_u64()?));
        match builder.create(&dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            other => return other.map(|()| dir),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{ATTEMPTS} random names under {} were all taken",
            parent.display()
        ),
    ))
}

/// Opens `path` for writing as a new file: refused (`AlreadyExists`, or `ELOOP` for a link)
/// when anything is there already, so a planted file or symlink is never written through.
///
/// # Errors
/// The OS error of `open`.
pub fn create_new_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// 64 bits from the kernel's random source (`getrandom`), which names cannot be guessed from.
fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `bytes`.
        let got = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if got < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
            continue;
        }
        filled += got as usize;
    }
    Ok(u64::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dirs_are_new_owner_only_and_differently_named() {
        let first = private_dir("kiln-scratch-test-").unwrap();
        let second = private_dir("kiln-scratch-test-").unwrap();
        assert_ne!(first, second);
        let name = first.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), "kiln-scratch-test-".len() + 16, "{name}");
        let mode = std::fs::metadata(&first).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        for dir in [first, second] {
            std::fs::remove_dir(dir).unwrap();
        }
    }

    #[test]
    fn new_files_never_replace_or_follow_what_is_there() {
        let dir = private_dir("kiln-scratch-test-").unwrap();
        let target = dir.join("target");
        std::fs::write(&target, b"kept").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new_file(&link).is_err());
        assert_eq!(
            create_new_file(&target).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"kept");
        let mut fresh = create_new_file(&dir.join("fresh")).unwrap();
        fresh.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(dir.join("fresh")).unwrap(), b"new");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
