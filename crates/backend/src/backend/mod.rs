//! Model execution. A [`Backend`] turns input tensors into output tensors and knows nothing of
//! protocols, queues or model configuration; today the only one is ONNX Runtime ([`onnx`]), on
//! CPU or on a GPU through its CUDA execution provider ([`cuda`]), which [`tokenize`] wraps for
//! models that take text. [`decoder`] runs decoder-only language models one forward pass at a
//! time, for generation.

pub mod cuda;
pub mod decoder;
pub mod onnx;
pub mod python;
pub mod runtime;
pub mod tokenize;

use crate::core::{DataType, Tensor};

pub use cuda::{CudaOptions, Device, Gpu, GpuInventory};
pub use onnx::{GraphLevel, OnnxSession, SessionOptions, SessionTuning};
pub use runtime::OnnxRuntime;

/// Errors raised while loading or running a model.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The runtime library could not be found or initialised.
    #[error("{0}")]
    Runtime(String),
    /// The model file could not be turned into a session.
    #[error("{0}")]
    Load(String),
    /// An input could not be handed to the runtime (e.g. a BYTES tensor whose framing is broken).
    #[error("{0}")]
    Input(String),
    /// The runtime failed while executing.
    #[error("{0}")]
    Run(String),
}

/// Name, datatype and shape of a model input or output as the model file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// `None` when the model uses a type the protocol cannot carry (e.g. complex numbers).
    pub datatype: Option<DataType>,
    /// -1 marks a dynamic dimension.
    pub shape: Vec<i64>,
}

/// One loaded model instance. `run` takes `&mut self`: an instance runs one request at a time, so
/// concurrency comes from several instances, each on its own thread.
pub trait Backend: Send {
    /// Runs the model on `inputs` (shapes already in the model's own layout) and returns every
    /// model output in the model's order.
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError>;

    /// Whether a lone request may run on the caller's (network) thread when the model is quick
    /// (see `kiln-scheduler`). False for backends whose per-request work must stay on the
    /// instance threads, such as tokenization.
    fn may_run_inline(&self) -> bool {
        true
    }

    /// The CUDA ordinal of the GPU this instance runs on (`None`: CPU); its metrics carry that
    /// GPU's `gpu_uuid` label.
    fn gpu(&self) -> Option<i32> {
        None
    }
}
