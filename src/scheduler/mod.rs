//! Running requests on model instances. Each instance owns one backend session on its own thread
//! and pulls work from a queue shared by the instances of one model version, so a slow request
//! never blocks a free instance. (Dynamic batching, priorities and deadlines build on this.)

pub mod state;

use crate::backend::{Backend, BackendError};
use crate::core::Tensor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::oneshot;

/// One unit of work: inputs in the model's layout, and where to send the outputs.
struct Job {
    inputs: Vec<Tensor>,
    reply: oneshot::Sender<Result<Vec<Tensor>, BackendError>>,
}

/// The instances of one model version. Dropping the pool closes the queue; each instance thread
/// finishes its current job and exits.
pub struct InstancePool {
    queue: mpsc::Sender<Job>,
    instances: usize,
}

impl InstancePool {
    /// Starts one thread per backend, named `<label>-<index>`.
    ///
    /// # Errors
    /// The OS error when a thread cannot be spawned.
    pub fn start(label: &str, backends: Vec<Box<dyn Backend>>) -> std::io::Result<InstancePool> {
        let (queue, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let instances = backends.len();
        for (index, backend) in backends.into_iter().enumerate() {
            let receiver = Arc::clone(&receiver);
            std::thread::Builder::new()
                .name(format!("{label}-{index}"))
                .spawn(move || instance_loop(backend, &receiver))?;
        }
        Ok(InstancePool { queue, instances })
    }

    /// Number of instances serving this pool.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// Runs `inputs` on the next free instance.
    ///
    /// # Errors
    /// The backend's error, or [`BackendError::Run`] if the instances are gone.
    pub async fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { inputs, reply })
            .map_err(|_| BackendError::Run("model instances have stopped".into()))?;
        answer.await.map_err(|_| {
            BackendError::Run("model instance stopped while running the request".into())
        })?
    }
}

fn instance_loop(mut backend: Box<dyn Backend>, queue: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // Hold the lock only while waiting for the next job, never while running one.
        let job = match queue.lock() {
            Ok(receiver) => receiver.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        if job.reply.is_closed() {
            continue; // the caller gave up; skip the work
        }
        let result = catch_unwind(AssertUnwindSafe(|| backend.run(&job.inputs)))
            .unwrap_or_else(|_| Err(BackendError::Run("model instance panicked".into())));
        let _ = job.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::DataType;
    use bytes::Bytes;

    /// Doubles every byte of the first input; fails on an empty input list.
    struct Doubler;

    impl Backend for Doubler {
        fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            let first = inputs
                .first()
                .ok_or_else(|| BackendError::Run("no input".into()))?;
            let data: Vec<u8> = first.data.iter().map(|b| b.wrapping_mul(2)).collect();
            Ok(vec![Tensor::new(
                "out",
                DataType::Uint8,
                first.shape.clone(),
                Bytes::from(data),
            )])
        }
    }

    struct Panicker;

    impl Backend for Panicker {
        fn run(&mut self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            panic!("boom")
        }
    }

    #[tokio::test]
    async fn concurrent_jobs_are_all_answered() {
        let pool =
            Arc::new(InstancePool::start("t", vec![Box::new(Doubler), Box::new(Doubler)]).unwrap());
        assert_eq!(pool.instances(), 2);
        let tasks: Vec<_> = (0..16u8)
            .map(|i| {
                let pool = Arc::clone(&pool);
                tokio::spawn(async move {
                    let input =
                        Tensor::new("in", DataType::Uint8, vec![2], Bytes::from(vec![i, 1]));
                    pool.execute(vec![input]).await
                })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            let out = task.await.unwrap().unwrap();
            assert_eq!(&out[0].data[..], &[2 * i as u8, 2]);
        }
        assert!(pool
            .execute(vec![])
            .await
            .unwrap_err()
            .to_string()
            .contains("no input"));
    }

    #[tokio::test]
    async fn a_panicking_backend_reports_an_error_and_keeps_serving() {
        let pool = InstancePool::start("p", vec![Box::new(Panicker)]).unwrap();
        for _ in 0..2 {
            let err = pool.execute(vec![]).await.unwrap_err();
            assert!(err.to_string().contains("panicked"));
        }
    }
}
