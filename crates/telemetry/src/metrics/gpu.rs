//! Per-GPU gauges with Triton's names, labels and help texts, read from NVML
//! (`libnvidia-ml.so.1`, the driver's management library, loaded at run time):
//!
//! - `nv_gpu_utilization` — GPU utilization rate [0.0 - 1.0)
//! - `nv_gpu_memory_total_bytes` — GPU total memory, in bytes
//! - `nv_gpu_memory_used_bytes` — GPU used memory, in bytes
//! - `nv_gpu_power_usage` — GPU power usage in watts
//! - `nv_gpu_power_limit` — GPU power management limit in watts
//! - `nv_energy_consumption` — GPU energy consumption in joules since the server started
//!
//! each labelled `gpu_uuid`, refreshed every metrics interval (`--metrics-interval-ms`) by a
//! thread of their own. Only the GPUs CUDA shows are reported: with `CUDA_VISIBLE_DEVICES` set,
//! those it names (by index or UUID). Without NVML — no NVIDIA driver, as on CPU-only machines —
//! there are no GPU metrics, and no error.

use libloading::Library;
use metrics::{counter, describe_counter, describe_gauge, gauge, Counter, Gauge};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::time::Duration;

/// Starts refreshing the GPU gauges every `interval`, if NVML is there and shows a GPU (once per
/// process; later calls change nothing); returns how many GPUs are reported.
pub fn start(interval: Duration) -> usize {
    static STARTED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| start_once(interval))
}

fn start_once(interval: Duration) -> usize {
    let nvml = match Nvml::open() {
        Ok(nvml) => nvml,
        Err(reason) => {
            tracing::debug!("no GPU metrics: {reason}");
            return 0;
        }
    };
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let devices: Vec<Device> = nvml
        .devices()
        .into_iter()
        .enumerate()
        .filter(|(index, (_, uuid))| is_visible(*index, uuid, visible.as_deref()))
        .map(|(_, (handle, uuid))| Device::new(handle, uuid, &nvml))
        .collect();
    if devices.is_empty() {
        return 0;
    }
    describe_gauge!("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)");
    describe_gauge!("nv_gpu_memory_total_bytes", "GPU total memory, in bytes");
    describe_gauge!("nv_gpu_memory_used_bytes", "GPU used memory, in bytes");
    describe_gauge!("nv_gpu_power_usage", "GPU power usage in watts");
    describe_gauge!("nv_gpu_power_limit", "GPU power management limit in watts");
    describe_counter!(
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started"
    );
    let count = devices.len();
    let spawned = std::thread::Builder::new()
        .name("gpu-metrics".into())
        .spawn(move || loop {
            for device in &devices {
                device.refresh(&nvml);
            }
            std::thread::sleep(interval);
        });
    match spawned {
        Ok(_) => {
            tracing::info!("Collecting metrics for {count} GPU(s)");
            count
        }
        Err(e) => {
            tracing::warn!("no GPU metrics: cannot start their thread: {e}");
            0
        }
    }
}

/// Whether the GPU at NVML `index` with `uuid` is one CUDA shows under `CUDA_VISIBLE_DEVICES`
/// (`None`: every GPU). Entries are indices or (prefixes of) UUIDs; CUDA stops at the first entry
/// that is neither.
fn is_visible(index: usize, uuid: &str, visible: Option<&str>) -> bool {
    let Some(visible) = visible else {
        return true;
    };
    for entry in visible.split(',').map(str::trim) {
        if let Ok(wanted) = entry.parse::<usize>() {
            if wanted == index {
                return true;
            }
        } else if entry.starts_with("GPU-") && uuid.starts_with(entry) {
            return true;
        } else if !entry.starts_with("GPU-") {
            return false;
        }
    }
    false
}

/// The gauges of one GPU.
struct Device {
    handle: DeviceHandle,
    utilization: Gauge,
    memory_total: Gauge,
    memory_used: Gauge,
    power_usage: Gauge,
    power_limit: Gauge,
    energy: Counter,
    /// The energy counter's reading when the server started, in millijoules.
    energy_start: Option<u64>,
}

impl Device {
    fn new(handle: DeviceHandle, uuid: String, nvml: &Nvml) -> Device {
        let labels = [("gpu_uuid", uuid)];
        Device {
            handle,
            utilization: gauge!("nv_gpu_utilization", &labels),
            memory_total: gauge!("nv_gpu_memory_total_bytes", &labels),
            memory_used: gauge!("nv_gpu_memory_used_bytes", &labels),
            power_usage: gauge!("nv_gpu_power_usage", &labels),
            power_limit: gauge!("nv_gpu_power_limit", &labels),
            energy: counter!("nv_energy_consumption", &labels),
            energy_start: nvml.energy(handle),
        }
    }

    /// Reads the current values; a failed read leaves the last ones (as a GPU that stops
    /// answering keeps its last sample in Triton until its failure count trips).
    fn refresh(&self, nvml: &Nvml) {
        if let Some(percent) = nvml.utilization(self.handle) {
            self.utilization.set(f64::from(percent) * 0.01);
        }
        if let Some((total, used)) = nvml.memory(self.handle) {
            self.memory_total.set(total as f64);
            self.memory_used.set(used as f64);
        }
        // Power is in milliwatts and energy in millijoules; GPUs without them report nothing.
        if let Some(milliwatts) = nvml.power(self.handle) {
            self.power_usage.set(f64::from(milliwatts) / 1000.0);
        }
        if let Some(milliwatts) = nvml.power_limit(self.handle) {
            self.power_limit.set(f64::from(milliwatts) / 1000.0);
        }
        if let (Some(start), Some(now)) = (self.energy_start, nvml.energy(self.handle)) {
            self.energy.absolute(now.saturating_sub(start) / 1000);
        }
    }
}

/// `nvmlDevice_t`, valid as long as NVML stays initialised (for the life of the process here).
#[derive(Clone, Copy)]
struct DeviceHandle(*mut c_void);

// SAFETY: NVML device handles are process-wide identifiers, usable from any thread.
unsafe impl Send for DeviceHandle {}

#[repr(C)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

type Status = c_int;

/// A function of `library`, copied out as a plain function pointer.
///
/// # Safety
/// `T` must be the symbol's true C signature, and `library` must outlive every call through it.
unsafe fn symbol<T: Copy>(library: &Library, name: &[u8]) -> Result<T, String> {
    library.get::<T>(name).map(|s| *s).map_err(|e| {
        let reason = std::error::Error::source(&e).map(|r| r.to_string());
        format!(
            "NVML lacks {}: {}",
            String::from_utf8_lossy(name),
            reason.unwrap_or(e.to_string())
        )
    })
}

/// The NVML functions kiln uses, resolved once.
struct Nvml {
    /// Keeps the library mapped while the function pointers below are in use.
    _library: Library,
    device_count: unsafe extern "C" fn(*mut c_uint) -> Status,
    device_by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> Status,
    device_uuid: unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> Status,
    utilization_rates: unsafe extern "C" fn(*mut c_void, *mut Utilization) -> Status,
    memory_info: unsafe extern "C" fn(*mut c_void, *mut Memory) -> Status,
    /// Not every driver has these: their gauges are then absent.
    power_usage: Option<unsafe extern "C" fn(*mut c_void, *mut c_uint) -> Status>,
    power_limit: Option<unsafe extern "C" fn(*mut c_void, *mut c_uint) -> Status>,
    total_energy: Option<unsafe extern "C" fn(*mut c_void, *mut u64) -> Status>,
}

// SAFETY: NVML is thread-safe (NVIDIA documents every entry point as such).
unsafe impl Send for Nvml {}

impl Nvml {
    fn open() -> Result<Nvml, String> {
        // SAFETY: loading the driver's NVML runs only its initialisers; the symbols are NVML's
        // documented C API with the signatures declared here (nvml.h).
        unsafe {
            let library = Library::new("libnvidia-ml.so.1").map_err(|e| {
                let reason = std::error::Error::source(&e).map(|r| r.to_string());
                format!(
                    "libnvidia-ml.so.1 not found: {}",
                    reason.unwrap_or(e.to_string())
                )
            })?;
            let init: unsafe extern "C" fn() -> Status = symbol(&library, b"nvmlInit_v2\0")?;
            let status = init();
            if status != 0 {
                return Err(format!("nvmlInit failed with NVML error {status}"));
            }
            Ok(Nvml {
                device_count: symbol(&library, b"nvmlDeviceGetCount_v2\0")?,
                device_by_index: symbol(&library, b"nvmlDeviceGetHandleByIndex_v2\0")?,
                device_uuid: symbol(&library, b"nvmlDeviceGetUUID\0")?,
                utilization_rates: symbol(&library, b"nvmlDeviceGetUtilizationRates\0")?,
                memory_info: symbol(&library, b"nvmlDeviceGetMemoryInfo\0")?,
                power_usage: symbol(&library, b"nvmlDeviceGetPowerUsage\0").ok(),
                power_limit: symbol(&library, b"nvmlDeviceGetEnforcedPowerLimit\0").ok(),
                total_energy: symbol(&library, b"nvmlDeviceGetTotalEnergyConsumption\0").ok(),
                _library: library,
            })
        }
    }

    /// Every GPU NVML shows, in NVML's order, with its UUID.
    fn devices(&self) -> Vec<(DeviceHandle, String)> {
        let mut count: c_uint = 0;
        // SAFETY: NVML is initialised; every pointer is to a live local of the declared type,
        // and the UUID buffer's length is passed.
        unsafe {
            if (self.device_count)(&mut count) != 0 {
                return Vec::new();
            }
            (0..count)
                .filter_map(|index| {
                    let mut handle = std::ptr::null_mut();
                    if (self.device_by_index)(index, &mut handle) != 0 {
                        return None;
                    }
                    let mut buffer = [0 as c_char; 96];
                    if (self.device_uuid)(handle, buffer.as_mut_ptr(), buffer.len() as c_uint) != 0
                    {
                        return None;
                    }
                    let uuid = CStr::from_ptr(buffer.as_ptr())
                        .to_string_lossy()
                        .into_owned();
                    Some((DeviceHandle(handle), uuid))
                })
                .collect()
        }
    }

    /// GPU utilization over the last sample period, in percent.
    fn utilization(&self, device: DeviceHandle) -> Option<u32> {
        let mut rates = Utilization { gpu: 0, memory: 0 };
        // SAFETY: a handle from `devices` and a live local.
        let status = unsafe { (self.utilization_rates)(device.0, &mut rates) };
        (status == 0).then_some(rates.gpu)
    }

    /// Total and used device memory, in bytes.
    fn memory(&self, device: DeviceHandle) -> Option<(u64, u64)> {
        let mut memory = Memory {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a handle from `devices` and a live local.
        let status = unsafe { (self.memory_info)(device.0, &mut memory) };
        (status == 0).then_some((memory.total, memory.used))
    }

    /// Power drawn now, in milliwatts.
    fn power(&self, device: DeviceHandle) -> Option<u32> {
        let read = self.power_usage?;
        let mut milliwatts: c_uint = 0;
        // SAFETY: a handle from `devices` and a live local.
        (unsafe { read(device.0, &mut milliwatts) } == 0).then_some(milliwatts)
    }

    /// The enforced power limit, in milliwatts.
    fn power_limit(&self, device: DeviceHandle) -> Option<u32> {
        let read = self.power_limit?;
        let mut milliwatts: c_uint = 0;
        // SAFETY: a handle from `devices` and a live local.
        (unsafe { read(device.0, &mut milliwatts) } == 0).then_some(milliwatts)
    }

    /// Energy used since the driver loaded, in millijoules.
    fn energy(&self, device: DeviceHandle) -> Option<u64> {
        let read = self.total_energy?;
        let mut millijoules: u64 = 0;
        // SAFETY: a handle from `devices` and a live local.
        (unsafe { read(device.0, &mut millijoules) } == 0).then_some(millijoules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices_selects_by_index_or_uuid() {
        let uuid = "GPU-4ad1f3c6-1234-5678-9abc-def001234567";
        assert!(is_visible(3, uuid, None));
        assert!(is_visible(1, uuid, Some("0, 1")));
        assert!(!is_visible(2, uuid, Some("0,1")));
        assert!(is_visible(5, uuid, Some("GPU-4ad1f3c6")));
        assert!(!is_visible(0, uuid, Some("GPU-ffff")));
        // CUDA ignores everything from the first invalid entry on.
        assert!(!is_visible(1, uuid, Some("0,x,1")));
        assert!(!is_visible(0, uuid, Some("")));
    }

    #[test]
    fn without_nvml_there_are_no_gpu_metrics_and_no_error() {
        // SAFETY: as in `Nvml::open`.
        if unsafe { Library::new("libnvidia-ml.so.1") }.is_err() {
            assert_eq!(start(Duration::from_secs(2)), 0);
        }
    }
}
