//! Where finished traces go, in Triton's layout: one JSON array per file. With a log frequency,
//! each group of traces is its own file `<path>.<n>` (n = 0, 1, ...); without, traces accumulate
//! in `<path>` itself, which stays a complete JSON array after every write (Triton's closes its
//! array only when the server stops).

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tracing::error;

#[derive(Debug)]
pub struct TraceFile {
    path: String,
    /// The next numbered file.
    index: AtomicU32,
    /// The main file once its first traces were written.
    main: Mutex<Option<File>>,
}

impl TraceFile {
    pub fn new(path: String) -> TraceFile {
        TraceFile {
            path,
            index: AtomicU32::new(0),
            main: Mutex::new(None),
        }
    }

    /// Writes `traces` (comma-separated JSON objects) to the next numbered file, as one array.
    pub fn save_numbered(&self, traces: &str) {
        let path = format!(
            "{}.{}",
            self.path,
            self.index.fetch_add(1, Ordering::Relaxed)
        );
        let written = File::create(&path).and_then(|mut file| write!(file, "[{traces}]"));
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
            None => File::create(&self.path).and_then(|mut file| {
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
