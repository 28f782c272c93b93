//! A model instance on a GPU: one session with the CUDA execution provider, run through an
//! IoBinding so that ONNX Runtime moves each batch's data once per direction.
//!
//! - Inputs: each batch is copied once into page-locked ("pinned") host memory from the
//!   session's own CUDA-pinned allocator, which ONNX Runtime then copies to the device with a
//!   DMA transfer (pageable memory would be staged by the driver first). Where ONNX Runtime offers
//!   no pinned allocator, ordinary host memory is used. BYTES inputs stay in host memory as
//!   string tensors: the CUDA provider has no string kernels, ONNX Runtime runs those nodes on CPU.
//! - Outputs: bound to host memory before each run (ONNX Runtime allocates them at the batch's
//!   shape: a binding kept from the previous run would hand it that run's buffers, and a batch of
//!   another size fails); after the run ONNX Runtime has copied the whole batch's outputs there
//!   (one device-to-host copy per output per batch, not per request), and they are read out as
//!   raw bytes before the next run.

use super::super::onnx::{self, OnnxSession};
use super::super::{Backend, BackendError, TensorInfo};
use crate::core::{DataType, Tensor};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{DynTensor, TensorElementType};

/// A session on one GPU with its bindings.
pub struct CudaInstance {
    session: OnnxSession,
    binding: IoBinding,
    /// Where ONNX Runtime puts the outputs: host memory.
    host: MemoryInfo<'static>,
    /// Where input batches are written: CUDA-pinned host memory when ONNX Runtime has an
    /// allocator for it, else the default host allocator.
    staging: Allocator,
    gpu: i32,
}

impl CudaInstance {
    /// Creates the binding of `session` (created with the CUDA provider on GPU `gpu`), checks
    /// that ONNX Runtime accepts its outputs in host memory, and picks the allocator for inputs.
    ///
    /// # Errors
    /// [`BackendError::Load`] when ONNX Runtime refuses the binding.
    pub fn new(session: OnnxSession, gpu: i32) -> Result<CudaInstance, BackendError> {
        let error = |what: &str, e: ort::Error| {
            BackendError::Load(format!("GPU {gpu} instance: failed to {what}: {e}"))
        };
        let mut binding = session
            .session
            .create_binding()
            .map_err(|e| error("create the IoBinding", e))?;
        let host = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::CPUOutput,
        )
        .map_err(|e| error("describe host memory", e))?;
        bind_outputs(&mut binding, &session.outputs, &host)
            .map_err(|e| error("bind outputs", e))?;
        let staging = pinned_allocator(&session.session, gpu).unwrap_or_default();
        Ok(CudaInstance {
            session,
            binding,
            host,
            staging,
            gpu,
        })
    }
}

/// Binds every output to `host`, to be allocated by ONNX Runtime at the next run's shapes.
fn bind_outputs(
    binding: &mut IoBinding,
    outputs: &[TensorInfo],
    host: &MemoryInfo<'_>,
) -> ort::Result<()> {
    binding.clear_outputs();
    outputs
        .iter()
        .try_for_each(|output| binding.bind_output_to_device(output.name.as_str(), host))
}

/// The session's CUDA-pinned host allocator. ONNX Runtime registers it with the GPU's ordinal in
/// recent releases and with 0 in older ones, so both are asked.
fn pinned_allocator(session: &Session, gpu: i32) -> Option<Allocator> {
    let mut last_error = None;
    for device_id in [gpu, 0] {
        let allocator = MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            device_id,
            AllocatorType::Device,
            MemoryType::CPUInput,
        )
        .and_then(|info| Allocator::new(session, info));
        match allocator {
            Ok(allocator) => return Some(allocator),
            Err(e) => last_error = Some(e),
        }
    }
    tracing::warn!(
        "GPU {gpu}: ONNX Runtime offers no CUDA-pinned allocator ({}); inputs are staged in \
         pageable host memory",
        last_error.map(|e| e.to_string()).unwrap_or_default()
    );
    None
}

impl Backend for CudaInstance {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        // The previous batch's buffers are released here, once ONNX Runtime no longer needs them.
        self.binding.clear_inputs();
        for tensor in inputs {
            let bound = if tensor.datatype == DataType::Bytes {
                let value = onnx::string_input(tensor)?;
                self.binding.bind_input(tensor.name.as_str(), &value)
            } else {
                let value = staged_input(&self.staging, tensor)?;
                self.binding.bind_input(tensor.name.as_str(), &value)
            };
            bound.map_err(|e| {
                BackendError::Input(format!("failed to bind input '{}': {e}", tensor.name))
            })?;
        }
        bind_outputs(&mut self.binding, &self.session.outputs, &self.host)
            .map_err(|e| BackendError::Run(format!("failed to bind outputs: {e}")))?;
        let session = &mut self.session;
        let outputs = match &session.run_options {
            None => session.session.run_binding(&self.binding),
            Some(options) => session
                .session
                .run_binding_with_options(&self.binding, options),
        }
        .map_err(|e| BackendError::Run(format!("onnx runtime error: {e}")))?;
        outputs
            .into_iter()
            .map(|(name, value)| onnx::output_tensor(name, &value))
            .collect()
    }

    fn gpu(&self) -> Option<i32> {
        Some(self.gpu)
    }
}

/// Copies a fixed-size tensor into a new host buffer from `allocator` (pinned where possible).
fn staged_input(allocator: &Allocator, tensor: &Tensor) -> Result<DynTensor, BackendError> {
    let error = |what: String| {
        BackendError::Input(format!(
            "failed to stage input '{}' for the GPU: {what}",
            tensor.name
        ))
    };
    let mut value = DynTensor::new(
        allocator,
        element_type(tensor.datatype),
        tensor.shape.clone(),
    )
    .map_err(|e| error(e.to_string()))?;
    if !value.memory_info().is_cpu_accessible() {
        return Err(error("the staging buffer is not host memory".into()));
    }
    let len = tensor.data.len();
    if value.size() != Some(len) {
        return Err(error(format!(
            "{len} bytes do not fill a {:?} tensor of shape {:?}",
            tensor.datatype, tensor.shape
        )));
    }
    if len > 0 {
        let target = value.data_ptr_mut().cast::<u8>();
        // SAFETY: `target` is the host-accessible buffer of the tensor just allocated, exactly
        // `len` bytes long (checked above), and nothing else refers to it yet.
        let target = unsafe { std::slice::from_raw_parts_mut(target, len) };
        target.copy_from_slice(&tensor.data);
        if tensor.datatype == DataType::Bool {
            // ONNX booleans are one byte, 0 or 1; the protocol allows any non-zero byte.
            for byte in target.iter_mut() {
                *byte = u8::from(*byte != 0);
            }
        }
    }
    Ok(value)
}

/// Protocol datatype → ONNX element type, for the fixed-size types.
fn element_type(datatype: DataType) -> TensorElementType {
    match datatype {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp16 => TensorElementType::Float16,
        DataType::Bf16 => TensorElementType::Bfloat16,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
        DataType::Bytes => TensorElementType::String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_round_trip_through_ort() {
        for datatype in DataType::ALL {
            assert_eq!(
                onnx::datatype_from_ort(element_type(datatype)),
                Some(datatype)
            );
        }
    }

    /// A GPU instance's binding over a CPU session of a bundled model (the binding logic is the
    /// provider's alike); `None`, said, without the ONNX Runtime library.
    fn cpu_instance(model: &str) -> Option<CudaInstance> {
        let Ok(runtime) = crate::backend::OnnxRuntime::get() else {
            eprintln!("skipped: no ONNX Runtime library (.ci/setup.sh runtime)");
            return None;
        };
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join(format!("model_repository/{model}/1/model.onnx"));
        let options = onnx::SessionOptions {
            intra_op_threads: Some(1),
            device: crate::backend::cuda::Device::Cpu,
            tuning: Default::default(),
            pool_name: None,
        };
        let session = OnnxSession::load(&runtime, &path, &options).unwrap();
        Some(CudaInstance::new(session, 0).unwrap())
    }

    /// Batches of different sizes through one binding, on a CPU session (the binding logic is
    /// the provider's alike): outputs bound once were kept at the first run's shape, so a batch
    /// of 4 after a batch of 1 failed with "Tensor size mismatch" on the GPU.
    #[test]
    fn batches_of_any_size_run_through_one_binding() {
        let Some(mut instance) = cpu_instance("add_sub") else {
            return;
        };
        for rows in [1usize, 4, 2, 4] {
            let values = |scale: f32| -> Vec<u8> {
                (0..rows * 16)
                    .flat_map(|i| (i as f32 * scale).to_le_bytes())
                    .collect()
            };
            let inputs = [
                Tensor::new(
                    "INPUT0",
                    DataType::Fp32,
                    vec![rows as i64, 16],
                    values(2.0).into(),
                ),
                Tensor::new(
                    "INPUT1",
                    DataType::Fp32,
                    vec![rows as i64, 16],
                    values(1.0).into(),
                ),
            ];
            let outputs = instance.run(&inputs).unwrap();
            let sum = outputs.iter().find(|t| t.name == "OUTPUT0").unwrap();
            assert_eq!(sum.shape, vec![rows as i64, 16], "batch of {rows}");
            assert_eq!(&sum.data[..], &values(3.0)[..], "batch of {rows}");
        }
    }

    /// BYTES inputs stay on the host and are bound as ONNX string tensors, every byte kept
    /// (NULs, non-UTF-8), on a CPU session through the same binding a GPU instance uses.
    #[test]
    fn string_inputs_keep_every_byte_through_the_binding() {
        let Some(mut instance) = cpu_instance("string_echo") else {
            return;
        };
        let elements: [&[u8]; 4] = [b"\x00\xffraw", b"", b"a\x00b", &[0xc3, 0x28, 0]];
        let data = crate::core::tensor::frame_bytes(elements);
        let input = Tensor::new("input-1", DataType::Bytes, vec![1, 4], data.clone());
        let outputs = instance.run(&[input]).unwrap();
        assert_eq!((&outputs[0].shape, &outputs[0].data), (&vec![1, 4], &data));
    }

    /// The staging path on the default (host) allocator: what a GPU instance does when ONNX
    /// Runtime offers no pinned allocator, checked without a GPU.
    #[test]
    fn staged_inputs_hold_the_request_bytes() {
        if crate::backend::OnnxRuntime::get().is_err() {
            eprintln!("skipped: no ONNX Runtime library (.ci/setup.sh runtime)");
            return;
        }
        let allocator = Allocator::default();
        let data: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let tensor = Tensor::new("x", DataType::Fp32, vec![1, 3], data.into());
        let value = staged_input(&allocator, &tensor).unwrap();
        let (shape, values) = value.try_extract_tensor::<f32>().unwrap();
        assert_eq!(
            (shape.to_vec(), values),
            (vec![1, 3], &[1.5, -2.0, 3.25][..])
        );
        let flags = Tensor::new("b", DataType::Bool, vec![3], vec![0u8, 7, 1].into());
        let value = staged_input(&allocator, &flags).unwrap();
        let (_, values) = value.try_extract_tensor::<bool>().unwrap();
        assert_eq!(values, &[false, true, true]);
        let short = Tensor::new("s", DataType::Int64, vec![2], vec![0u8; 8].into());
        let err = staged_input(&allocator, &short).unwrap_err().to_string();
        assert!(err.contains("8 bytes do not fill"), "{err}");
    }
}
