//! ONNX Runtime sessions through `ort`: loading a model file, describing its inputs and outputs,
//! and running raw-layout tensors through it. Inputs whose bytes are suitably aligned are handed
//! to ONNX Runtime without a copy. A session on a GPU is built here too (the CUDA execution
//! provider is registered on it) and then run by [`super::cuda`]'s instance.

use super::cuda::Device;
use super::{Backend, BackendError, OnnxRuntime, TensorInfo};
use crate::core::tensor::BytesElements;
use crate::core::{DataType, Tensor};
use bytes::Bytes;
use half::{bf16, f16};
use ort::environment::ThreadManager;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{DynValue, TensorElementType, TensorRef, ValueType};
use std::borrow::Cow;
use std::path::Path;

/// Session settings chosen by the caller from the model configuration and the machine.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Threads ONNX Runtime may use inside one operator, in a pool of the session's own (its
    /// independent operators get theirs too); `None`: the process's pools, which every session
    /// without threads of its own shares (see [`super::runtime::OnnxRuntime`]).
    pub intra_op_threads: Option<usize>,
    /// CPU, or the CUDA execution provider on one GPU.
    pub device: Device,
    /// What the model's config tunes; the default leaves ONNX Runtime's own behaviour.
    pub tuning: SessionTuning,
    /// The name of the session's own ONNX Runtime threads (its operator pools), so that `top -H`
    /// or `/proc/<pid>/task` tell them apart; `None` leaves them the name of the loading thread.
    pub pool_name: Option<String>,
}

/// Spawns ONNX Runtime's pool threads under a name of ours.
pub(super) struct NamedThreads(pub(super) String);

impl ThreadManager for NamedThreads {
    type Thread = std::thread::JoinHandle<()>;

    fn create(&self, work: impl FnOnce() + Send + 'static) -> ort::Result<Self::Thread> {
        std::thread::Builder::new()
            .name(self.0.clone())
            // What ONNX Runtime's own threads get on Linux (glibc's default), not std's 2 MiB.
            .stack_size(8 << 20)
            .spawn(work)
            .map_err(|e| ort::Error::new(format!("cannot start an ONNX Runtime thread: {e}")))
    }

    fn join(thread: Self::Thread) -> ort::Result<()> {
        thread
            .join()
            .map_err(|_| ort::Error::new("an ONNX Runtime thread panicked"))
    }
}

/// ONNX Runtime session settings a model config may set (read by `repository::tuning`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionTuning {
    pub graph_level: GraphLevel,
    /// `Some(threads)`: independent operators run in parallel on that many threads;
    /// `None`: one operator after another (ONNX Runtime's default).
    pub parallel_execution: Option<usize>,
    /// The CPU memory arena on (ONNX Runtime's default) or off.
    pub mem_arena: Option<bool>,
    /// Memory pattern planning on (ONNX Runtime's default) or off.
    pub mem_pattern: Option<bool>,
    /// `session.use_device_allocator_for_initializers`.
    pub device_allocator_for_initializers: Option<bool>,
    /// The arenas to shrink after every run, in ONNX Runtime's `memory.enable_memory_arena_shrinkage`
    /// spelling (`cpu:0;gpu:1`), already narrowed to the devices this session has arenas on.
    pub arena_shrinkage: Option<String>,
    /// Custom-operator libraries to register (canonical paths, already allowed by the server).
    pub op_libraries: Vec<std::path::PathBuf>,
}

/// How far ONNX Runtime rewrites the graph before running it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GraphLevel {
    #[default]
    All,
    Extended,
    Basic,
    Disabled,
}

impl From<GraphLevel> for GraphOptimizationLevel {
    fn from(level: GraphLevel) -> Self {
        match level {
            GraphLevel::All => GraphOptimizationLevel::All,
            GraphLevel::Extended => GraphOptimizationLevel::Level2,
            GraphLevel::Basic => GraphOptimizationLevel::Level1,
            GraphLevel::Disabled => GraphOptimizationLevel::Disable,
        }
    }
}

/// One ONNX Runtime session: a model instance.
pub struct OnnxSession {
    pub(super) session: Session,
    pub(super) inputs: Vec<TensorInfo>,
    /// Inputs with a default value (overridable initializers), which a run may leave out.
    pub(super) defaults: Vec<TensorInfo>,
    pub(super) outputs: Vec<TensorInfo>,
    /// The CUDA ordinal of the GPU the session runs on.
    pub(super) gpu: Option<i32>,
    /// Options for every run, when the config asks for any (arena shrinkage).
    pub(super) run_options: Option<RunOptions>,
}

impl OnnxSession {
    /// Loads `path` into a new session.
    ///
    /// # Errors
    /// [`BackendError::Load`] with ONNX Runtime's message when the file is missing or invalid.
    pub fn load(
        runtime: &OnnxRuntime,
        path: &Path,
        options: &SessionOptions,
    ) -> Result<OnnxSession, BackendError> {
        let load_error = |e: String| {
            BackendError::Load(format!("failed to load ONNX model {}: {e}", path.display()))
        };
        let session = build_session(runtime, path, options).map_err(load_error)?;
        let run_options = run_options(&options.tuning).map_err(load_error)?;
        let inputs = session
            .inputs()
            .iter()
            .map(|o| tensor_info(o.name(), o.dtype()))
            .collect();
        let outputs = session
            .outputs()
            .iter()
            .map(|o| tensor_info(o.name(), o.dtype()))
            .collect();
        let defaults = session
            .overridable_initializers()
            .iter()
            .map(|o| tensor_info(o.name(), o.dtype()))
            .collect();
        Ok(OnnxSession {
            session,
            inputs,
            defaults,
            outputs,
            gpu: options.device.gpu().map(|g| g.id),
            run_options,
        })
    }

    /// The instance that runs this session: the session itself on CPU; on a GPU, the CUDA
    /// instance that binds its inputs and outputs.
    ///
    /// # Errors
    /// [`BackendError::Load`] when the GPU instance cannot set up its bindings.
    pub fn into_backend(self) -> Result<Box<dyn Backend>, BackendError> {
        match self.gpu {
            None => Ok(Box::new(self)),
            Some(_gpu) => {
                #[cfg(feature = "cuda")]
                {
                    Ok(Box::new(super::cuda::CudaInstance::new(self, _gpu)?))
                }
                #[cfg(not(feature = "cuda"))]
                {
                    Err(BackendError::Load(super::cuda::NOT_BUILT.to_string()))
                }
            }
        }
    }

    /// The model's inputs, in graph order.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    /// The model's inputs that have a default value (overridable initializers), in graph order.
    pub fn defaults(&self) -> &[TensorInfo] {
        &self.defaults
    }

    /// The model's outputs, in graph order.
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }
}

// The builder's errors carry the (non-Send, large) builder; drop it at each step and keep text.
pub(super) fn build_session(
    runtime: &OnnxRuntime,
    path: &Path,
    options: &SessionOptions,
) -> Result<Session, String> {
    let text = |e: ort::Error<ort::session::builder::SessionBuilder>| e.to_string();
    let tuning = &options.tuning;
    // Creating a session whose library adds an operator domain, ONNX Runtime checks ONNX's
    // process-wide domain map and adds the domain without a lock: two such sessions created at
    // once (models loading in parallel) can both add it, and the second fails ("Trying to add
    // a domain to DomainToVersion map, but the domain is already exist"). They are created one
    // at a time.
    static CUSTOM_OPERATORS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = (!tuning.op_libraries.is_empty()).then(|| {
        CUSTOM_OPERATORS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    });
    let mut builder = Session::builder(runtime.environment())
        .map_err(|e| e.to_string())?
        .with_optimization_level(tuning.graph_level.into())
        .map_err(text)?;
    if let Some(threads) = options.intra_op_threads {
        builder = builder
            .with_independent_thread_pool()
            .map_err(text)?
            .with_intra_threads(threads.max(1))
            .map_err(text)?
            .with_intra_op_spinning(false)
            .map_err(text)?;
        builder = match tuning.parallel_execution {
            None => builder.with_inter_threads(1).map_err(text)?,
            Some(threads) => builder
                .with_parallel_execution(true)
                .map_err(text)?
                .with_inter_threads(threads.max(1))
                .map_err(text)?
                .with_inter_op_spinning(false)
                .map_err(text)?,
        };
        if let Some(name) = &options.pool_name {
            builder = builder
                .with_thread_manager(NamedThreads(name.clone()))
                .map_err(text)?;
        }
    }
    if let Some(enable) = tuning.mem_pattern {
        builder = builder.with_memory_pattern(enable).map_err(text)?;
    }
    if let Some(enable) = tuning.device_allocator_for_initializers {
        builder = builder
            .with_config_entry(
                "session.use_device_allocator_for_initializers",
                if enable { "1" } else { "0" },
            )
            .map_err(text)?;
    }
    for library in &tuning.op_libraries {
        builder = builder
            .with_operator_library(library)
            .map_err(|e| format!("custom-operator library {}: {e}", library.display()))?;
    }
    if let Device::Cuda { gpu, options } = &options.device {
        #[cfg(feature = "cuda")]
        {
            builder = builder
                .with_execution_providers([super::cuda::provider(gpu, options)])
                .map_err(|e| format!("CUDA execution provider on GPU {}: {e}", gpu.id))?;
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (gpu, options);
            return Err(super::cuda::NOT_BUILT.to_string());
        }
    }
    if let Some(enable) = tuning.mem_arena {
        // The CPU provider is where ONNX Runtime's C API switches its arena.
        builder = builder
            .with_execution_providers([ort::ep::CPU::default()
                .with_arena_allocator(enable)
                .build()
                .error_on_failure()])
            .map_err(text)?;
    }
    builder.commit_from_file(path).map_err(|e| e.to_string())
}

/// The options every run of a session takes, when its tuning needs any.
pub(super) fn run_options(tuning: &SessionTuning) -> Result<Option<RunOptions>, String> {
    let Some(arenas) = &tuning.arena_shrinkage else {
        return Ok(None);
    };
    let mut options = RunOptions::new().map_err(|e| e.to_string())?;
    options
        .set("memory.enable_memory_arena_shrinkage", arenas)
        .map_err(|e| e.to_string())?;
    Ok(Some(options))
}

fn tensor_info(name: &str, value_type: &ValueType) -> TensorInfo {
    match value_type {
        ValueType::Tensor { ty, shape, .. } => TensorInfo {
            name: name.to_string(),
            datatype: datatype_from_ort(*ty),
            shape: shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect(),
        },
        _ => TensorInfo {
            name: name.to_string(),
            datatype: None,
            shape: Vec::new(),
        },
    }
}

/// ONNX element type → protocol datatype (ONNX strings are BYTES).
pub fn datatype_from_ort(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

impl Backend for OnnxSession {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let mut values: Vec<(Cow<'_, str>, SessionInputValue<'_>)> =
            Vec::with_capacity(inputs.len());
        for tensor in inputs {
            values.push((Cow::Borrowed(tensor.name.as_str()), input_value(tensor)?));
        }
        let outputs = match &self.run_options {
            None => self.session.run(values),
            Some(options) => self.session.run_with_options(values, options),
        }
        .map_err(|e| BackendError::Run(format!("onnx runtime error: {e}")))?;
        outputs
            .into_iter()
            .map(|(name, value)| output_tensor(name, &value))
            .collect()
    }
}

/// Views (or, when misaligned, copies) raw bytes as a typed slice for ONNX Runtime.
macro_rules! numeric_input {
    ($tensor:expr, $ty:ty) => {{
        let shape = $tensor.shape.clone();
        match bytemuck::try_cast_slice::<u8, $ty>(&$tensor.data) {
            Ok(slice) => TensorRef::from_array_view((shape, slice)).map(SessionInputValue::from),
            Err(_) => {
                let owned: Vec<$ty> = read_unaligned(&$tensor.data);
                ort::value::Tensor::from_array((shape, owned)).map(SessionInputValue::from)
            }
        }
    }};
}

/// Copies elements out of bytes that are not aligned for them (raw contents sit wherever the
/// client's message put them). One pass: no zero-filled buffer first.
fn read_unaligned<T: bytemuck::Pod>(data: &[u8]) -> Vec<T> {
    data.chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

fn input_value(tensor: &Tensor) -> Result<SessionInputValue<'_>, BackendError> {
    let value = match tensor.datatype {
        DataType::Bool => {
            let owned: Vec<bool> = tensor.data.iter().map(|&b| b != 0).collect();
            ort::value::Tensor::from_array((tensor.shape.clone(), owned))
                .map(SessionInputValue::from)
        }
        DataType::Uint8 => numeric_input!(tensor, u8),
        DataType::Uint16 => numeric_input!(tensor, u16),
        DataType::Uint32 => numeric_input!(tensor, u32),
        DataType::Uint64 => numeric_input!(tensor, u64),
        DataType::Int8 => numeric_input!(tensor, i8),
        DataType::Int16 => numeric_input!(tensor, i16),
        DataType::Int32 => numeric_input!(tensor, i32),
        DataType::Int64 => numeric_input!(tensor, i64),
        DataType::Fp16 => numeric_input!(tensor, f16),
        DataType::Bf16 => numeric_input!(tensor, bf16),
        DataType::Fp32 => numeric_input!(tensor, f32),
        DataType::Fp64 => numeric_input!(tensor, f64),
        DataType::Bytes => return string_input(tensor).map(SessionInputValue::from),
    };
    value.map_err(|e| {
        BackendError::Input(format!(
            "failed to create input tensor '{}': {e}",
            tensor.name
        ))
    })
}

/// A BYTES tensor as an ONNX string tensor (always in host memory).
pub(super) fn string_input(tensor: &Tensor) -> Result<DynValue, BackendError> {
    let elements = BytesElements::new(&tensor.data)
        .collect::<Result<Vec<&[u8]>, _>>()
        .map_err(|e| BackendError::Input(e.to_string()))?;
    string_tensor(&tensor.shape, &elements).map_err(|e| {
        BackendError::Input(format!(
            "failed to create input tensor '{}': {e}",
            tensor.name
        ))
    })
}

/// An ONNX string tensor of `shape` holding `elements` byte for byte. Each element is written
/// into a buffer of its own length (`GetResizedStringTensorElementBuffer`), so any bytes pass,
/// NULs included: `ort`'s `from_string_array` goes through C strings and cannot take a NUL.
fn string_tensor(shape: &[i64], elements: &[&[u8]]) -> Result<DynValue, String> {
    use ort::AsPointer;
    let count = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
    if count != Some(elements.len()) {
        return Err(format!(
            "{} elements do not fill shape {shape:?}",
            elements.len()
        ));
    }
    let api = ort::api();
    let mut allocator = ort::memory::Allocator::default();
    let mut ptr = std::ptr::null_mut();
    // SAFETY: the allocator and the shape outlive the call, which writes one value pointer.
    status(unsafe {
        (api.CreateTensorAsOrtValue)(
            allocator.ptr_mut(),
            shape.as_ptr(),
            shape.len(),
            ort::sys::ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING,
            &mut ptr,
        )
    })?;
    let ptr = std::ptr::NonNull::new(ptr).ok_or("ONNX Runtime made no string tensor")?;
    // SAFETY: `ptr` is the tensor just made with `allocator`; `value` owns it from here and
    // releases it when dropped, on the error paths below too.
    let mut value: DynValue = unsafe { DynValue::from_ptr(ptr, Some(&allocator)) };
    for (index, element) in elements.iter().enumerate() {
        let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: `value` is a live string tensor of `elements.len()` elements; the call resizes
        // element `index` to `element.len()` bytes and gives its buffer.
        status(unsafe {
            (api.GetResizedStringTensorElementBuffer)(
                value.ptr_mut(),
                index,
                element.len(),
                &mut buffer,
            )
        })?;
        if !element.is_empty() {
            if buffer.is_null() {
                return Err(format!("ONNX Runtime gave no buffer for element {index}"));
            }
            // SAFETY: `buffer` holds `element.len()` bytes, owned by the tensor, apart from
            // `element`.
            unsafe {
                std::ptr::copy_nonoverlapping(element.as_ptr(), buffer.cast(), element.len())
            };
        }
    }
    Ok(value)
}

/// A failed ONNX Runtime C API status as its message (the status is released).
fn status(status: ort::sys::OrtStatusPtr) -> Result<(), String> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status from the C API is a valid OrtStatus until released below.
    let message = unsafe {
        let text = std::ffi::CStr::from_ptr((api.GetErrorMessage)(status.0))
            .to_string_lossy()
            .into_owned();
        (api.ReleaseStatus)(status.0);
        text
    };
    Err(message)
}

/// Reads a string tensor's elements as raw bytes and frames them as BYTES. (`ort`'s own
/// extraction insists on UTF-8; Triton passes arbitrary bytes through.)
fn string_output(value: &DynValue, count: usize) -> Result<Bytes, BackendError> {
    use ort::AsPointer;
    if count == 0 {
        return Ok(Bytes::new());
    }
    let api = ort::api();
    let ptr = value.ptr();
    let read_error = |e: String| BackendError::Run(format!("failed to read string output: {e}"));
    let mut total = 0usize;
    // SAFETY: `ptr` is a live string tensor owned by `value`; the buffers have the sizes passed.
    status(unsafe { (api.GetStringTensorDataLength)(ptr, &mut total) }).map_err(read_error)?;
    let mut content = vec![0u8; total];
    let mut offsets = vec![0usize; count];
    status(unsafe {
        (api.GetStringTensorContent)(
            ptr,
            content.as_mut_ptr().cast(),
            total,
            offsets.as_mut_ptr(),
            count,
        )
    })
    .map_err(read_error)?;
    offsets.push(total);
    let elements = offsets
        .windows(2)
        .map(|w| content.get(w[0]..w[1]).unwrap_or_default());
    Ok(crate::core::tensor::frame_bytes(elements))
}

macro_rules! numeric_output {
    ($value:expr, $ty:ty) => {{
        let (shape, slice) = $value.try_extract_tensor::<$ty>().map_err(run_error)?;
        (
            shape.to_vec(),
            Bytes::copy_from_slice(bytemuck::cast_slice::<$ty, u8>(slice)),
        )
    }};
}

fn run_error(e: ort::Error) -> BackendError {
    BackendError::Run(format!("failed to read model output: {e}"))
}

/// Copies one output (in host memory) into a raw-layout tensor.
pub(super) fn output_tensor(name: &str, value: &DynValue) -> Result<Tensor, BackendError> {
    let ty = match value.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        other => {
            return Err(BackendError::Run(format!(
                "output '{name}' is not a tensor ({other:?})"
            )))
        }
    };
    let datatype = datatype_from_ort(ty).ok_or_else(|| {
        BackendError::Run(format!(
            "output '{name}' has unsupported element type {ty:?}"
        ))
    })?;
    let (shape, data) = match datatype {
        DataType::Bool => numeric_output!(value, bool),
        DataType::Uint8 => numeric_output!(value, u8),
        DataType::Uint16 => numeric_output!(value, u16),
        DataType::Uint32 => numeric_output!(value, u32),
        DataType::Uint64 => numeric_output!(value, u64),
        DataType::Int8 => numeric_output!(value, i8),
        DataType::Int16 => numeric_output!(value, i16),
        DataType::Int32 => numeric_output!(value, i32),
        DataType::Int64 => numeric_output!(value, i64),
        DataType::Fp16 => numeric_output!(value, f16),
        DataType::Bf16 => numeric_output!(value, bf16),
        DataType::Fp32 => numeric_output!(value, f32),
        DataType::Fp64 => numeric_output!(value, f64),
        DataType::Bytes => {
            let shape = value.shape().to_vec();
            let count = shape.iter().map(|&d| d.max(0) as usize).product();
            let data = string_output(value, count)?;
            (shape, data)
        }
    };
    Ok(Tensor::new(name, datatype, shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::frame_bytes;

    /// Byte strings a C string cannot hold, and some that are not UTF-8.
    fn awkward_elements() -> Vec<Vec<u8>> {
        vec![
            b"\x00\xffraw".to_vec(),
            Vec::new(),
            b"\x00".to_vec(),
            b"a\x00b".to_vec(),
            (0..=255u8).collect(),
            b"trailing\x00\x00".to_vec(),
        ]
    }

    #[test]
    fn string_tensors_hold_any_bytes() {
        if OnnxRuntime::get().is_err() {
            eprintln!("skipped: no ONNX Runtime library (.ci/setup.sh runtime)");
            return;
        }
        let elements = awkward_elements();
        let data = frame_bytes(&elements);
        let tensor = Tensor::new("s", DataType::Bytes, vec![2, 3], data.clone());
        let value = string_input(&tensor).unwrap();
        assert_eq!(value.shape().to_vec(), vec![2, 3]);
        assert_eq!(string_output(&value, elements.len()).unwrap(), data);
        // An empty tensor, and one whose elements do not fill its shape.
        let empty = Tensor::new("e", DataType::Bytes, vec![0, 4], Bytes::new());
        assert_eq!(
            string_output(&string_input(&empty).unwrap(), 0).unwrap(),
            Bytes::new()
        );
        for shape in [vec![7], vec![2, -1]] {
            let short = Tensor::new("short", DataType::Bytes, shape, data.clone());
            let error = string_input(&short).unwrap_err().to_string();
            assert!(error.contains("do not fill shape"), "{error}");
        }
        let torn = Tensor::new("torn", DataType::Bytes, vec![1], data.slice(..6));
        assert!(matches!(
            string_input(&torn),
            Err(BackendError::Input(why)) if why == "element 0 declares 5 bytes but only 2 remain"
        ));
    }

    #[test]
    fn a_string_model_echoes_any_bytes() {
        let Ok(runtime) = OnnxRuntime::get() else {
            eprintln!("skipped: no ONNX Runtime library (.ci/setup.sh runtime)");
            return;
        };
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("model_repository/string_echo/1/model.onnx");
        let options = SessionOptions {
            intra_op_threads: Some(1),
            device: Device::Cpu,
            tuning: SessionTuning::default(),
            pool_name: None,
        };
        let mut session = OnnxSession::load(&runtime, &path, &options).unwrap();
        let data = frame_bytes(awkward_elements());
        let input = Tensor::new("input-1", DataType::Bytes, vec![1, 6], data.clone());
        let outputs = session.run(&[input]).unwrap();
        assert_eq!(outputs.len(), 1);
        assert_eq!(outputs[0].shape, vec![1, 6]);
        assert_eq!(outputs[0].data, data);
    }

    #[test]
    fn unaligned_bytes_read_as_the_same_elements() {
        // Places the elements' bytes at an address that is not a multiple of 4.
        fn misaligned(elements: &[u8]) -> (Vec<u8>, usize) {
            let mut buffer = vec![0u8; elements.len() + 4];
            let start = (1..4)
                .find(|offset| (buffer.as_ptr() as usize + offset) % 4 != 0)
                .expect("one of three consecutive addresses is not a multiple of 4");
            buffer[start..start + elements.len()].copy_from_slice(elements);
            (buffer, start)
        }
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.25).collect();
        let (buffer, start) = misaligned(bytemuck::cast_slice(&values));
        let unaligned = &buffer[start..start + values.len() * 4];
        assert!(bytemuck::try_cast_slice::<u8, f32>(unaligned).is_err());
        assert_eq!(read_unaligned::<f32>(unaligned), values);
        let wide: Vec<u64> = (0..7).map(|i| u64::MAX - i).collect();
        let (buffer, start) = misaligned(bytemuck::cast_slice(&wide));
        assert_eq!(read_unaligned::<u64>(&buffer[start..start + 56]), wide);
        assert!(read_unaligned::<f64>(&[]).is_empty());
    }
}
