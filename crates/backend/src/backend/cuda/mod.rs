//! GPU instances on ONNX Runtime's CUDA execution provider (the `cuda` feature).
//!
//! Layout: `options` checks the CUDA EP options a config may set; `libraries` says where the
//! provider library and the NVIDIA runtime wheels are; `driver` asks `libcuda.so.1` which devices
//! exist; `instance` runs a session on a device with its inputs and outputs bound (IoBinding).
//!
//! [`inventory`] answers once per process whether GPU sessions can run and on which devices; it
//! loads the NVIDIA runtime libraries as part of that answer, so nothing of CUDA is touched until a
//! model asks for a GPU (`KIND_GPU`, or `KIND_AUTO` which takes a GPU when one is usable). Without
//! the `cuda` feature the answer is always "unusable", with that reason.

pub mod libraries;
mod options;

#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod instance;

pub use options::CudaOptions;

#[cfg(feature = "cuda")]
pub(super) use instance::CudaInstance;

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// The CUDA ordinal (after `CUDA_VISIBLE_DEVICES`), as instance groups' `gpus` name it.
    pub id: i32,
    /// `GPU-xxxxxxxx-...`, the `gpu_uuid` label of its metrics.
    pub uuid: String,
}

/// Whether GPU sessions can run in this process, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuInventory {
    /// The devices sessions can be created on, by CUDA ordinal.
    Usable(Vec<Gpu>),
    /// Why not, naming what is missing.
    Unusable(String),
}

/// Where one instance's session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// ONNX Runtime's CUDA execution provider on `gpu`, with these options.
    Cuda {
        gpu: Gpu,
        options: CudaOptions,
    },
}

impl Device {
    /// The GPU this instance runs on, if any.
    pub fn gpu(&self) -> Option<&Gpu> {
        match self {
            Device::Cpu => None,
            Device::Cuda { gpu, .. } => Some(gpu),
        }
    }
}

/// The reason every GPU request fails in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub const NOT_BUILT: &str = "kiln was built without the `cuda` feature \
                             (build it with `cargo build --release --features cuda`)";

/// Whether GPU sessions can run, probed once per process: the driver and its devices, the CUDA
/// provider beside the loaded ONNX Runtime, and the NVIDIA runtime libraries (which are loaded
/// here, so that sessions find them).
pub fn inventory() -> GpuInventory {
    #[cfg(not(feature = "cuda"))]
    {
        GpuInventory::Unusable(NOT_BUILT.to_string())
    }
    #[cfg(feature = "cuda")]
    {
        static INVENTORY: std::sync::OnceLock<GpuInventory> = std::sync::OnceLock::new();
        INVENTORY
            .get_or_init(|| match probe() {
                Ok(gpus) => {
                    let listed: Vec<String> = gpus
                        .iter()
                        .map(|g| format!("{} ({})", g.id, g.uuid))
                        .collect();
                    tracing::info!("CUDA devices usable: {}", listed.join(", "));
                    GpuInventory::Usable(gpus)
                }
                Err(reason) => {
                    tracing::info!("no GPU usable: {reason}");
                    GpuInventory::Unusable(reason)
                }
            })
            .clone()
    }
}

#[cfg(feature = "cuda")]
fn probe() -> Result<Vec<Gpu>, String> {
    let gpus = driver::devices()?;
    let runtime = super::OnnxRuntime::get().map_err(|e| e.to_string())?;
    libraries::provider_beside(&runtime.library)?;
    // What `ort::ep::cuda::preload_dylibs` loads, in its order, one by one with ort's helper so
    // that each may come from its own folder and a failure says why.
    let found = libraries::locate_from_env()?;
    for path in &found.files {
        ort::util::preload_dylib(path)
            .map_err(|e| format!("failed to load {}: {}", path.display(), dl_error(&e)))?;
    }
    let mut folders: Vec<String> = found
        .files
        .iter()
        .filter_map(|f| f.parent().map(|d| d.display().to_string()))
        .collect();
    folders.dedup();
    tracing::info!("CUDA runtime libraries loaded from {}", folders.join(", "));
    Ok(gpus)
}

/// A `libloading` error with the system's reason (its `Display` alone says only "dlopen failed").
#[cfg(feature = "cuda")]
fn dl_error(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(reason) => format!("{e}: {reason}"),
        None => e.to_string(),
    }
}

/// The CUDA execution provider for one session: on `gpu`, with `options`; a registration
/// failure fails the session instead of falling back to CPU silently.
#[cfg(feature = "cuda")]
pub(super) fn provider(gpu: &Gpu, options: &CudaOptions) -> ort::ep::ExecutionProviderDispatch {
    use ort::ep::ArbitrarilyConfigurableExecutionProvider;
    let mut cuda = ort::ep::CUDA::default().with_device_id(gpu.id);
    for (key, value) in options.pairs() {
        cuda = cuda.with_arbitrary_config(key, value);
    }
    cuda.build().error_on_failure()
}
