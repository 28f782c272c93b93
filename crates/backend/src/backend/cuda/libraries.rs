//! Where the CUDA pieces come from. Everything but the driver's `libcuda.so.1` comes from PyPI
//! wheels, installed by `.ci/setup.sh gpu` with `pip install --target` into one folder (the "GPU
//! folder", `.kiln/onnxruntime-gpu/` by default):
//!
//! ```text
//! onnxruntime/capi/libonnxruntime.so            the GPU build of ONNX Runtime (onnxruntime-gpu)
//! onnxruntime/capi/libonnxruntime_providers_cuda.so, ..._shared.so
//! nvidia/cu13/lib/   libcudart, libcublas(Lt), libnvrtc, libcurand, libcufft (nvidia-* wheels)
//! nvidia/cudnn/lib/  libcudnn*.so.9 (nvidia-cudnn-cu13)
//! ```
//!
//! The GPU folder is looked up at `$KILN_ONNXRUNTIME_GPU_DIR`, then in `.kiln/onnxruntime-gpu/` of
//! the checkout the executable was built in, then in `./.kiln/onnxruntime-gpu/`.
//! `$KILN_CUDA_LIB_DIR` and `$KILN_CUDNN_LIB_DIR` name the NVIDIA folders directly, `:`-separated
//! when the libraries are spread over several (e.g. the `nvidia/cu13/lib` and `nvidia/cudnn/lib` of
//! a Python environment that already has the wheels). ONNX Runtime loads
//! its CUDA provider from the folder of the `libonnxruntime.so` kiln loaded, so that is where the
//! provider library must be.
//!
//! Compiled in every build (the checks are plain file lookups, unit-tested in CI); only a `cuda`
//! build calls them.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::path::{Path, PathBuf};

/// The CUDA provider library, beside `libonnxruntime.so`.
pub const PROVIDER: &str = "libonnxruntime_providers_cuda.so";

/// The CUDA 13 runtime libraries ONNX Runtime's CUDA provider needs, in load order (the list
/// `ort::ep::cuda::preload_dylibs` loads).
pub const CUDA_LIBRARIES: &[&str] = &[
    "libcudart.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libnvrtc.so.13",
    "libcurand.so.10",
    "libcufft.so.12",
];

/// The cuDNN 9 libraries, in load order (as `ort::ep::cuda::preload_dylibs`).
pub const CUDNN_LIBRARIES: &[&str] = &[
    "libcudnn.so.9",
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
];

const HINT: &str = "run `.ci/setup.sh gpu` (the onnxruntime-gpu[cuda,cudnn] wheels), or set \
                    KILN_ONNXRUNTIME_GPU_DIR, or KILN_CUDA_LIB_DIR and KILN_CUDNN_LIB_DIR";

/// The NVIDIA runtime libraries found, in the order they must be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaLibraries {
    pub files: Vec<PathBuf>,
}

/// GPU folders to try, in order (see the module docs).
pub fn gpu_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(explicit) = std::env::var_os("KILN_ONNXRUNTIME_GPU_DIR") {
        dirs.push(PathBuf::from(explicit));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        // target/<profile>/kiln and target/<profile>/deps/<test> sit two or three levels below
        // the checkout.
        for up in exe_dir.ancestors().skip(1).take(3) {
            dirs.push(up.join(".kiln/onnxruntime-gpu"));
        }
    }
    dirs.push(PathBuf::from(".kiln/onnxruntime-gpu"));
    dirs.dedup();
    dirs
}

/// The ONNX Runtime library of a GPU folder: `onnxruntime/capi/libonnxruntime.so` (the setup
/// links it), else the wheel's own `libonnxruntime.so.<version>`.
pub fn runtime_in(gpu_dir: &Path) -> Option<PathBuf> {
    let capi = gpu_dir.join("onnxruntime/capi");
    let plain = capi.join("libonnxruntime.so");
    if plain.is_file() {
        return Some(plain);
    }
    let mut versioned: Vec<PathBuf> = std::fs::read_dir(&capi)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
        .collect();
    versioned.sort();
    versioned.pop()
}

/// The CUDA provider library beside `runtime` (the `libonnxruntime.so` kiln loaded).
///
/// # Errors
/// A message naming the folder searched and how to install the provider.
pub fn provider_beside(runtime: &Path) -> Result<PathBuf, String> {
    let dir = runtime.parent().unwrap_or(Path::new("."));
    let provider = dir.join(PROVIDER);
    if provider.is_file() {
        return Ok(provider);
    }
    Err(format!(
        "CUDA provider library {PROVIDER} not found in {} (the folder of the ONNX Runtime library \
         kiln loaded, {}; the CPU-only onnxruntime wheel has none): {HINT}",
        dir.display(),
        runtime.display()
    ))
}

/// Finds the NVIDIA libraries from the environment and the GPU folders.
///
/// # Errors
/// As [`locate`].
pub fn locate_from_env() -> Result<CudaLibraries, String> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(|v| std::env::split_paths(&v).collect::<Vec<PathBuf>>())
    };
    locate(
        var("KILN_CUDA_LIB_DIR"),
        var("KILN_CUDNN_LIB_DIR"),
        &gpu_dirs(),
    )
}

/// Finds every CUDA runtime library in `cuda` (folders, searched in order; by default the first
/// `<gpu dir>/nvidia/cu13/lib` holding `libcudart.so.13`) and every cuDNN library in `cudnn` (by
/// default the first `<gpu dir>/nvidia/cudnn/lib` holding `libcudnn.so.9`).
///
/// # Errors
/// A message naming each missing library and the folders it was looked for in.
pub fn locate(
    cuda: Option<Vec<PathBuf>>,
    cudnn: Option<Vec<PathBuf>>,
    gpu_dirs: &[PathBuf],
) -> Result<CudaLibraries, String> {
    let default = |sub: &str, marker: &str| {
        gpu_dirs
            .iter()
            .map(|dir| dir.join(sub))
            .find(|dir| dir.join(marker).is_file())
            .map(|dir| vec![dir])
    };
    let cuda = cuda.or_else(|| default("nvidia/cu13/lib", CUDA_LIBRARIES[0]));
    let cudnn = cudnn.or_else(|| default("nvidia/cudnn/lib", CUDNN_LIBRARIES[0]));
    let (Some(cuda), Some(cudnn)) = (cuda, cudnn) else {
        let tried: Vec<String> = gpu_dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "CUDA runtime libraries not found (looked for nvidia/cu13/lib/{} and \
             nvidia/cudnn/lib/{} under {}): {HINT}",
            CUDA_LIBRARIES[0],
            CUDNN_LIBRARIES[0],
            tried.join(", ")
        ));
    };
    let mut files = Vec::new();
    let mut missing = Vec::new();
    for (dirs, names) in [(&cuda, CUDA_LIBRARIES), (&cudnn, CUDNN_LIBRARIES)] {
        let mut absent = Vec::new();
        for name in names {
            match dirs.iter().map(|dir| dir.join(name)).find(|f| f.is_file()) {
                Some(file) => files.push(file),
                None => absent.push(*name),
            }
        }
        if !absent.is_empty() {
            let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            missing.push(format!("{} in {}", absent.join(", "), searched.join(":")));
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "CUDA runtime libraries missing: {}: {HINT}",
            missing.join("; ")
        ));
    }
    Ok(CudaLibraries { files })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let path =
                std::env::temp_dir().join(format!("kiln-cuda-libs-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }

        fn touch(&self, relative: &str) {
            let path = self.0.join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn wheels(dir: &Dir) {
        for name in CUDA_LIBRARIES {
            dir.touch(&format!("nvidia/cu13/lib/{name}"));
        }
        for name in CUDNN_LIBRARIES {
            dir.touch(&format!("nvidia/cudnn/lib/{name}"));
        }
    }

    #[test]
    fn finds_the_wheel_folders_of_the_first_complete_gpu_dir() {
        let empty = Dir::new("empty");
        let full = Dir::new("full");
        wheels(&full);
        let found = locate(None, None, &[empty.0.clone(), full.0.clone()]).unwrap();
        assert_eq!(
            found.files.len(),
            CUDA_LIBRARIES.len() + CUDNN_LIBRARIES.len()
        );
        assert_eq!(
            found.files[0],
            full.0.join("nvidia/cu13/lib/libcudart.so.13")
        );
        assert_eq!(
            found.files[CUDA_LIBRARIES.len()],
            full.0.join("nvidia/cudnn/lib/libcudnn.so.9")
        );
    }

    #[test]
    fn explicit_folders_win_and_missing_libraries_are_named() {
        let full = Dir::new("explicit");
        wheels(&full);
        let cudnn = Dir::new("partial-cudnn");
        cudnn.touch("libcudnn.so.9");
        let err = locate(
            None,
            Some(vec![cudnn.0.clone()]),
            std::slice::from_ref(&full.0),
        )
        .unwrap_err();
        assert!(
            err.starts_with("CUDA runtime libraries missing: libcudnn_graph.so.9, "),
            "{err}"
        );
        assert!(err.contains(&cudnn.0.display().to_string()), "{err}");
        assert!(err.contains(".ci/setup.sh gpu"), "{err}");
        let err = locate(None, None, &[Dir::new("nothing").0.clone()]).unwrap_err();
        assert!(
            err.starts_with(
                "CUDA runtime libraries not found (looked for nvidia/cu13/lib/libcudart.so.13"
            ),
            "{err}"
        );
    }

    #[test]
    fn libraries_may_be_spread_over_several_folders() {
        let runtime = Dir::new("spread-runtime");
        let blas = Dir::new("spread-blas");
        for name in CUDA_LIBRARIES {
            let dir = if name.contains("cublas") {
                &blas
            } else {
                &runtime
            };
            dir.touch(name);
        }
        let cudnn = Dir::new("spread-cudnn");
        for name in CUDNN_LIBRARIES {
            cudnn.touch(name);
        }
        let found = locate(
            Some(vec![runtime.0.clone(), blas.0.clone()]),
            Some(vec![cudnn.0.clone()]),
            &[],
        )
        .unwrap();
        assert_eq!(found.files[1], blas.0.join("libcublasLt.so.13"));
        assert_eq!(found.files[3], runtime.0.join("libnvrtc.so.13"));
    }

    #[test]
    fn the_runtime_and_its_provider_come_from_the_capi_folder() {
        let dir = Dir::new("capi");
        assert_eq!(runtime_in(&dir.0), None);
        dir.touch("onnxruntime/capi/libonnxruntime.so.1.31.1");
        let runtime = runtime_in(&dir.0).unwrap();
        assert_eq!(
            runtime,
            dir.0.join("onnxruntime/capi/libonnxruntime.so.1.31.1")
        );
        let err = provider_beside(&runtime).unwrap_err();
        assert!(
            err.starts_with("CUDA provider library libonnxruntime_providers_cuda.so not found in "),
            "{err}"
        );
        dir.touch("onnxruntime/capi/libonnxruntime.so");
        dir.touch("onnxruntime/capi/libonnxruntime_providers_cuda.so");
        let runtime = runtime_in(&dir.0).unwrap();
        assert_eq!(runtime, dir.0.join("onnxruntime/capi/libonnxruntime.so"));
        assert_eq!(
            provider_beside(&runtime).unwrap(),
            dir.0
                .join("onnxruntime/capi/libonnxruntime_providers_cuda.so")
        );
    }

    /// kiln's lists are the ones `ort` preloads, so a missing file is reported before ort fails.
    #[cfg(feature = "cuda")]
    #[test]
    fn the_library_lists_match_ort() {
        assert_eq!(CUDA_LIBRARIES, ort::ep::cuda::CUDA_DYLIBS);
        assert_eq!(CUDNN_LIBRARIES, ort::ep::cuda::CUDNN_DYLIBS);
    }
}
