//! Request cancellation for Python models (`request.is_cancelled()`,
//! `response_sender.is_cancelled()`): when a request's client goes away while its `execute` call
//! runs, kiln tells the stub on a pipe of its own, the stub's file descriptor 3, so that the
//! word does not wait behind the call on the main channel. Each notice is 16 bytes: the call's
//! number (the stub's `execute` calls counted from 1) and the request's index in it, both
//! little-endian u64; a thread in the stub reads them.

use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::process::Command;
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;

/// The file descriptor the stub reads notices from.
const STUB_FD: i32 = 3;

/// Resolves when a request's client has gone away.
pub type Gone = Pin<Box<dyn Future<Output = ()> + Send>>;

/// kiln's end of a stub's cancellation pipe.
#[derive(Debug)]
pub struct Notices {
    pipe: Mutex<File>,
}

impl Notices {
    /// A pipe whose read end `command`'s process gets as descriptor 3. The read end is
    /// returned too: it must stay open until the command has spawned, and be closed then.
    ///
    /// # Errors
    /// When the pipe cannot be made.
    pub fn attach(command: &mut Command) -> std::io::Result<(Notices, OwnedFd)> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        // A stub that stops reading must not block kiln: a notice that does not fit is dropped.
        // SAFETY: fcntl on a descriptor this function owns.
        unsafe {
            let flags = libc::fcntl(write.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(write.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let raw = read.as_raw_fd();
        // SAFETY: runs in the child between fork and exec and only calls dup2 and fcntl, which
        // are async-signal-safe; `read` stays open in the parent until the command has spawned.
        unsafe {
            command.pre_exec(move || {
                let result = if raw == STUB_FD {
                    // Already in place: only keep it across exec.
                    libc::fcntl(raw, libc::F_SETFD, 0)
                } else {
                    // The copy does not inherit close-on-exec.
                    libc::dup2(raw, STUB_FD)
                };
                if result < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let notices = Notices {
            pipe: Mutex::new(write),
        };
        Ok((notices, read))
    }

    /// Tells the stub that request `index` of call `call` was cancelled. Best effort: a stub
    /// that is gone or not reading just misses it.
    pub fn cancel(&self, call: u64, index: usize) {
        let mut notice = [0u8; 16];
        notice[..8].copy_from_slice(&call.to_le_bytes());
        notice[8..].copy_from_slice(&(index as u64).to_le_bytes());
        let mut pipe = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        let _ = pipe.write_all(&notice);
    }
}

/// Watches the requests of one `execute` call and sends a notice for each whose client goes
/// away while it runs; dropping it stops watching.
pub struct Watch {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watch {
    /// Starts watching call `call`'s requests (`gone[i]` for request `i`; `None`: not watched)
    /// on `runtime`; without one nothing is watched.
    pub fn start(
        runtime: Option<&Handle>,
        notices: &Arc<Notices>,
        call: u64,
        gone: Vec<Option<Gone>>,
    ) -> Watch {
        let tasks = runtime.map_or_else(Vec::new, |runtime| {
            gone.into_iter()
                .enumerate()
                .filter_map(|(index, gone)| Some(spawn(runtime, notices, call, index, gone?)))
                .collect()
        });
        Watch { tasks }
    }

    /// Whether every notice this watch was to send is sent (or needs no sending).
    pub fn settled(&self) -> bool {
        self.tasks.iter().all(tokio::task::JoinHandle::is_finished)
    }

    /// Starts watching request `index` of call `call` alone.
    pub fn one(
        runtime: Option<&Handle>,
        notices: &Arc<Notices>,
        call: u64,
        index: usize,
        gone: Option<Gone>,
    ) -> Watch {
        let gone = (0..index).map(|_| None).chain([gone]).collect();
        Watch::start(runtime, notices, call, gone)
    }
}

/// A task that sends the notice when `gone` resolves.
fn spawn(
    runtime: &Handle,
    notices: &Arc<Notices>,
    call: u64,
    index: usize,
    gone: Gone,
) -> tokio::task::JoinHandle<()> {
    let notices = Arc::clone(notices);
    runtime.spawn(async move {
        gone.await;
        notices.cancel(call, index);
    })
}

impl Drop for Watch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Stdio};

    /// A child that prints, as numbers, the u64s it reads on descriptor 3 (`od`), and the
    /// notices that reach it.
    fn reader() -> (Notices, Child) {
        let mut command = Command::new("sh");
        command
            .args(["-c", "od -An -tu8 <&3"])
            .stdout(Stdio::piped());
        let (notices, stub_end) = Notices::attach(&mut command).unwrap();
        let child = command.spawn().unwrap();
        drop(stub_end);
        (notices, child)
    }

    /// What the child read, once its pipe closed.
    fn read(child: Child) -> Vec<String> {
        let output = child.wait_with_output().unwrap();
        String::from_utf8(output.stdout)
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_child_reads_notices_on_descriptor_3() {
        let (notices, child) = reader();
        notices.cancel(7, 2);
        notices.cancel(u64::MAX, 0);
        drop(notices);
        assert_eq!(read(child), ["7", "2", &u64::MAX.to_string(), "0"]);
    }

    #[test]
    fn a_gone_client_is_noticed_and_a_finished_watch_sends_nothing() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (notices, child) = reader();
        let notices = Arc::new(notices);
        runtime.block_on(async {
            let (left, gone) = tokio::sync::oneshot::channel::<()>();
            let (stays, kept) = tokio::sync::oneshot::channel::<()>();
            let watch = Watch::start(
                Some(&Handle::current()),
                &notices,
                3,
                vec![
                    Some(Box::pin(async move {
                        let _ = gone.await;
                    })),
                    None,
                    Some(Box::pin(async move {
                        let _ = kept.await;
                    })),
                ],
            );
            assert!(!watch.settled());
            drop(left);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(!watch.settled(), "request 2's client is still there");
            drop(watch);
            drop(stays);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            // A watch whose one client left is settled once its notice is sent.
            let (left, gone) = tokio::sync::oneshot::channel::<()>();
            let gone: Gone = Box::pin(async move {
                let _ = gone.await;
            });
            let watch = Watch::one(Some(&Handle::current()), &notices, 4, 1, Some(gone));
            drop(left);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(watch.settled());
        });
        drop(notices);
        assert_eq!(read(child), ["3", "0", "4", "1"]);
    }
}
