//! The NVIDIA driver through `libcuda.so.1`, loaded at run time: is there one, and which devices
//! does it show. CUDA numbers devices after `CUDA_VISIBLE_DEVICES`, so instance groups and
//! `gpus: [...]` mean what they mean to every other CUDA program.

use super::Gpu;
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, CStr};

type CuResult = c_int;

/// `CUuuid`: 16 bytes.
#[repr(C)]
struct CuUuid {
    bytes: [u8; 16],
}

/// The devices the driver shows, by CUDA ordinal, with their UUIDs (`GPU-xxxxxxxx-...`, as
/// `nvidia-smi` and NVML print them).
///
/// # Errors
/// What is missing: the driver library, a device, or the reason `cuInit` gives.
pub fn devices() -> Result<Vec<Gpu>, String> {
    // SAFETY: loading the driver library runs only its initialisers.
    let library = unsafe { Library::new("libcuda.so.1") }.map_err(|e| {
        format!(
            "libcuda.so.1 not found (no NVIDIA driver): {}",
            super::dl_error(&e)
        )
    })?;
    let found = query(&library);
    // The driver stays loaded for the life of the process (ONNX Runtime's CUDA runtime uses it
    // too); unloading an initialised driver is not supported.
    std::mem::forget(library);
    found
}

fn query(library: &Library) -> Result<Vec<Gpu>, String> {
    // SAFETY: the signatures are the CUDA driver API's (cuda.h); every pointer passed points to a
    // live local of the declared type.
    unsafe {
        let symbol_error = |name: &str, e: libloading::Error| {
            format!(
                "libcuda.so.1 lacks {name} (driver too old for CUDA 13?): {}",
                super::dl_error(&e)
            )
        };
        let init = library
            .get::<unsafe extern "C" fn(c_uint) -> CuResult>(b"cuInit\0")
            .map_err(|e| symbol_error("cuInit", e))?;
        let count = library
            .get::<unsafe extern "C" fn(*mut c_int) -> CuResult>(b"cuDeviceGetCount\0")
            .map_err(|e| symbol_error("cuDeviceGetCount", e))?;
        let get = library
            .get::<unsafe extern "C" fn(*mut c_int, c_int) -> CuResult>(b"cuDeviceGet\0")
            .map_err(|e| symbol_error("cuDeviceGet", e))?;
        let uuid = library
            .get::<unsafe extern "C" fn(*mut CuUuid, c_int) -> CuResult>(b"cuDeviceGetUuid_v2\0")
            .or_else(|_| library.get(b"cuDeviceGetUuid\0"))
            .map_err(|e| symbol_error("cuDeviceGetUuid", e))?;
        let error_name = library
            .get::<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>(
                b"cuGetErrorName\0",
            )
            .ok();
        let describe = |code: CuResult| {
            let mut name: *const c_char = std::ptr::null();
            match &error_name {
                Some(f) if f(code, &mut name) == 0 && !name.is_null() => {
                    format!("{} ({code})", CStr::from_ptr(name).to_string_lossy())
                }
                _ => format!("CUDA error {code}"),
            }
        };
        let code = init(0);
        if code != 0 {
            return Err(format!("cuInit failed: {}", describe(code)));
        }
        let mut n: c_int = 0;
        let code = count(&mut n);
        if code != 0 {
            return Err(format!("cuDeviceGetCount failed: {}", describe(code)));
        }
        if n <= 0 {
            return Err(format!(
                "the NVIDIA driver shows no CUDA device (CUDA_VISIBLE_DEVICES={})",
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "<unset>".into())
            ));
        }
        let mut gpus = Vec::with_capacity(n as usize);
        for ordinal in 0..n {
            let mut device: c_int = 0;
            let code = get(&mut device, ordinal);
            if code != 0 {
                return Err(format!("cuDeviceGet({ordinal}) failed: {}", describe(code)));
            }
            let mut id = CuUuid { bytes: [0; 16] };
            let code = uuid(&mut id, device);
            if code != 0 {
                return Err(format!(
                    "cuDeviceGetUuid({ordinal}) failed: {}",
                    describe(code)
                ));
            }
            gpus.push(Gpu {
                id: ordinal,
                uuid: format_uuid(&id.bytes),
            });
        }
        Ok(gpus)
    }
}

/// `GPU-` and the 16 bytes as 8-4-4-4-12 hex digits, NVML's spelling.
fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_as_nvml_spells_them() {
        let bytes = [
            0x4a, 0xd1, 0xf3, 0xc6, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23,
            0x45, 0x67,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-4ad1f3c6-1234-5678-9abc-def001234567"
        );
    }
}
