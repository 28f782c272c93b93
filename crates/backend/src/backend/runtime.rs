//! Finding and initialising the ONNX Runtime shared library (`ort` with `load-dynamic`).
//!
//! The library comes from the PyPI `onnxruntime` wheel (`.ci/setup.sh runtime` unpacks it into
//! `.kiln/onnxruntime/`). It is looked up, in order, at `$ORT_DYLIB_PATH`, beside the executable,
//! in `.kiln/onnxruntime/` of the checkout the executable was built in, in `./.kiln/onnxruntime/`,
//! and in the usual system library folders. A failure names every path that was tried.
//!
//! A `cuda` build looks first (after `$ORT_DYLIB_PATH`) for the GPU build of the library in the
//! GPU folder that `.ci/setup.sh gpu` fills (see [`super::cuda::libraries`]): ONNX Runtime loads
//! its CUDA provider from the folder of the library it runs from, and the GPU build runs CPU
//! sessions as well.

use super::BackendError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const LIB_NAME: &str = "libonnxruntime.so";

/// The process-wide ONNX Runtime environment. Cheap to clone.
#[derive(Clone)]
pub struct OnnxRuntime {
    env: ort::environment::Environment,
    /// Where the library was loaded from, for logs.
    pub library: PathBuf,
}

static RUNTIME: OnceLock<Result<OnnxRuntime, String>> = OnceLock::new();

impl OnnxRuntime {
    /// Loads the library once per process (ONNX Runtime allows a single environment); later calls
    /// return the same runtime or the same error.
    ///
    /// # Errors
    /// [`BackendError::Runtime`] listing the candidate paths when none exists or loads.
    pub fn get() -> Result<OnnxRuntime, BackendError> {
        RUNTIME
            .get_or_init(Self::load)
            .clone()
            .map_err(BackendError::Runtime)
    }

    pub(crate) fn environment(&self) -> &ort::environment::Environment {
        &self.env
    }

    fn load() -> Result<OnnxRuntime, String> {
        let candidates = candidate_paths();
        let Some(library) = candidates.iter().find(|p| p.is_file()).cloned() else {
            let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            return Err(format!(
                "ONNX Runtime library not found; tried: {}. Run `.ci/setup.sh runtime` or set ORT_DYLIB_PATH",
                tried.join(", ")
            ));
        };
        let builder = ort::init_from(&library).map_err(|e| {
            format!(
                "failed to load ONNX Runtime from {}: {e}",
                library.display()
            )
        })?;
        let env =
            builder
                .with_name("kiln")
                .with_global_thread_pool(shared_pools().map_err(|e| {
                    format!("cannot set up ONNX Runtime's shared thread pools: {e}")
                })?)
                .build()
                .map_err(|e| {
                    format!(
                        "failed to initialise ONNX Runtime from {}: {e}",
                        library.display()
                    )
                })?;
        tracing::info!("ONNX Runtime loaded from {}", library.display());
        Ok(OnnxRuntime { env, library })
    }
}

/// The pools every session without threads of its own shares (see
/// [`super::onnx::SessionOptions::intra_op_threads`]): one thread per core within an operator
/// (the caller's among them), none between operators, none spinning. A session then costs no
/// thread of its own, however many models are loaded.
fn shared_pools() -> ort::Result<ort::environment::GlobalThreadPoolOptions> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    ort::environment::GlobalThreadPoolOptions::default()
        .with_intra_threads(cores)?
        .with_inter_threads(1)?
        .with_spin_control(false)?
        .with_thread_manager(super::onnx::NamedThreads("ort-shared".into()))
}

fn candidate_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(explicit) = std::env::var_os("ORT_DYLIB_PATH") {
        paths.push(PathBuf::from(explicit));
    }
    #[cfg(feature = "cuda")]
    paths.extend(
        super::cuda::libraries::gpu_dirs()
            .iter()
            .filter_map(|dir| super::cuda::libraries::runtime_in(dir)),
    );
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        paths.push(exe_dir.join(LIB_NAME));
        // target/<profile>/kiln and target/<profile>/deps/<test> sit two or three levels below the
        // checkout that holds .kiln/.
        for up in exe_dir.ancestors().skip(1).take(3) {
            paths.push(up.join(".kiln/onnxruntime").join(LIB_NAME));
        }
    }
    paths.push(PathBuf::from(".kiln/onnxruntime").join(LIB_NAME));
    for dir in ["/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu"] {
        paths.push(Path::new(dir).join(LIB_NAME));
    }
    paths.dedup();
    paths
}
