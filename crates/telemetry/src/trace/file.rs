//! Where finished traces go, in Triton's layout: one JSON array per file. With a log frequency,
//! each group of traces is its own file `<path>.<n>` (n = 0, 1, ...); without, traces accumulate
//! in `<path>` itself, which stays a complete JSON array after every write (Triton's closes its
//! array only when the server stops).
//!
//! Unlike Triton, kiln opens a trace file without following a symbolic link at its path, and
//! empties only a regular file: a link planted where a numbered file will go is refused (the
//! traces are not written, with an error in the log), never followed to truncate its target. And
//! numbered files wrap, after [`DEFAULT_FILE_LIMIT`] unless `--trace-config triton,file-limit=N`
//! says otherwise (0: never, as in Triton): a client that sets `log_frequency` 1 through the trace
//! API (as Triton allows) makes a file per request, but not without bound.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tracing::error;

/// Numbered files before the next one is `<path>.0` again (emptied): the disk holds at most this
/// many, the newest traces kept.
pub const DEFAULT_FILE_LIMIT: u32 = 10_000;

#[derive(Debug)]
pub struct TraceFile {
    path: String,
    /// Numbered files before `<path>.0` again; 0: no limit.
    limit: u32,
    /// The next numbered file.
    index: AtomicU32,
    /// The main file once its first traces were written.
    main: Mutex<Option<File>>,
}

impl TraceFile {
    pub fn new(path: String, limit: u32) -> TraceFile {
        TraceFile {
            path,
            limit,
            index: AtomicU32::new(0),
            main: Mutex::new(None),
        }
    }

    /// Writes `traces` (comma-separated JSON objects) to the next numbered file, as one array.
    pub fn save_numbered(&self, traces: &str) {
        let index = self
            .index
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| {
                Some(if self.limit == 0 {
                    i.wrapping_add(1)
                } else {
                    (i + 1) % self.limit
                })
            })
            .unwrap_or_default();
        let path = format!("{}.{index}", self.path);
        let written = create(&path).and_then(|mut file| write!(file, "[{traces}]"));
        if let Err(e) = written {
            error!("cannot write the trace file {path}: {e}");
        }
    }

    /// Appends `traces` to the main file's array, creating the file (emptied) at the first write.
    pub fn save(&self, traces: &str) {
        let mut main = self.main.lock().unwrap_or_else(|e| e.into_inner());
        let written = match &mut *main {
            // Over the closing bracket.
            Some(file) => file
                .seek(SeekFrom::End(-1))
                .and_then(|_| write!(file, ",{traces}]")),
            None => create(&self.path).and_then(|mut file| {
                write!(file, "[{traces}]")?;
                *main = Some(file);
                Ok(())
            }),
        };
        if let Err(e) = written {
            error!("cannot write the trace file {}: {e}", self.path);
        }
    }
}

/// `path` opened for writing, created or emptied as `File::create` would, but never through a
/// symbolic link at `path` (ELOOP) and never emptying anything but a regular file (a FIFO or a
/// device is refused, and opening one does not block).
pub fn create(path: &str) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    file.set_len(0)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kiln-trace-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_link_at_the_path_is_refused_and_its_target_kept() {
        let dir = scratch("link");
        let target = dir.join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let link = dir.join("trace.json.0");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create(link.to_str().unwrap()).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn a_regular_file_is_emptied_and_a_fifo_refused() {
        let dir = scratch("fifo");
        let old = dir.join("old");
        std::fs::write(&old, "0123456789").unwrap();
        let mut file = create(old.to_str().unwrap()).unwrap();
        write!(file, "[]").unwrap();
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "[]");
        let fifo = dir.join("fifo");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(create(fifo.to_str().unwrap()).is_err());
    }

    #[test]
    fn numbered_files_wrap() {
        let dir = scratch("wrap");
        let file = TraceFile::new(dir.join("t").to_str().unwrap().to_string(), 3);
        file.index.store(2, Ordering::Relaxed);
        file.save_numbered("{\"id\":1}");
        file.save_numbered("{\"id\":2}");
        let last = dir.join("t.2");
        assert_eq!(std::fs::read_to_string(last).unwrap(), "[{\"id\":1}]");
        assert_eq!(
            std::fs::read_to_string(dir.join("t.0")).unwrap(),
            "[{\"id\":2}]"
        );
    }
}
