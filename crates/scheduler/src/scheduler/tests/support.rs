//! What the scheduler tests drive instances with: fake backends, a gate that holds runs, and
//! the bound that turns a hang into a failure.

use super::super::clock::ManualClock;
use crate::backend::{Backend, BackendError};
use crate::core::{DataType, Tensor};
use bytes::Bytes;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// `future`'s output. The bound is not a timing: it only turns a hang (what a test waits for
/// never comes, its behaviour broken) into a failure that says what did not happen; when all is
/// well nothing waits anywhere near it.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("never happened: {what}"))
}

/// Holds every run of the instances given [`Gate::held`] until the test opens it, and counts
/// the runs that came to it: a test knows an instance is busy, and frees it, when it chooses.
/// Dropped, it opens, so that a failing test leaves no instance blocked.
pub struct Gate(Arc<Held>);

/// A [`Gate`] as the instances see it.
pub struct Held {
    open: Mutex<bool>,
    opened: Condvar,
    /// Runs that came to the gate so far.
    entered: watch::Sender<usize>,
}

impl Gate {
    pub fn new() -> Gate {
        Gate(Arc::new(Held {
            open: Mutex::new(false),
            opened: Condvar::new(),
            entered: watch::Sender::new(0),
        }))
    }

    pub fn held(&self) -> Arc<Held> {
        Arc::clone(&self.0)
    }

    /// Once `count` runs have come to the gate.
    pub async fn entered(&self, count: usize) {
        let mut entered = self.0.entered.subscribe();
        entered
            .wait_for(|&entered| entered >= count)
            .await
            .expect("the gate outlives its receivers");
    }

    /// Lets every run through, now and later.
    pub fn open(&self) {
        *self.0.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.opened.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

impl Held {
    /// Waits until the gate is open.
    pub fn pass(&self) {
        self.entered.send_modify(|entered| *entered += 1);
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let _open = self
            .opened
            .wait_while(open, |open| !*open)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Adds one to every byte of its single input and records the batch sizes it ran; its runs
/// wait for `gate`, if given.
pub struct AddOne {
    pub batches: Arc<Mutex<Vec<i64>>>,
    pub gate: Option<Arc<Held>>,
}

impl Backend for AddOne {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        if let Some(gate) = &self.gate {
            gate.pass();
        }
        let input = inputs
            .first()
            .ok_or_else(|| BackendError::Run("no input".into()))?;
        self.batches.lock().unwrap().push(input.shape[0]);
        let data: Vec<u8> = input.data.iter().map(|b| b.wrapping_add(1)).collect();
        Ok(vec![Tensor::new(
            "out",
            DataType::Uint8,
            input.shape.clone(),
            Bytes::from(data),
        )])
    }
}

pub struct Panicker;

impl Backend for Panicker {
    fn run(&mut self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        panic!("boom")
    }
}

/// Records the name of the thread each run happens on; each run takes `takes` of `clock` (the
/// clock moves by that much while it runs), which is what the scheduler measures it by.
pub struct WhereRun {
    pub threads: Arc<Mutex<Vec<String>>>,
    pub clock: Arc<ManualClock>,
    pub takes: Duration,
}

impl Backend for WhereRun {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.clock.advance(self.takes);
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        self.threads.lock().unwrap().push(name);
        Ok(inputs.to_vec())
    }
}
