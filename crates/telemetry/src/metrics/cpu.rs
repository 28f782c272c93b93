//! The machine's CPU gauges with Triton's names and help texts, read from `/proc` (Linux):
//!
//! - `nv_cpu_utilization` — CPU utilization rate [0.0 - 1.0], over all cores since the last
//!   refresh (busy time over all time in `/proc/stat`; idle and I/O wait are not busy)
//! - `nv_cpu_memory_total_bytes` — `MemTotal` of `/proc/meminfo`
//! - `nv_cpu_memory_used_bytes` — `MemTotal - MemAvailable`
//!
//! refreshed every metrics interval by a thread of their own. Without a readable `/proc` there are
//! no CPU metrics, and no error.

use metrics::{describe_gauge, gauge};
use std::time::Duration;

/// Starts refreshing the CPU gauges every `interval` (once per process; later calls change
/// nothing). Returns whether they are reported.
pub fn start(interval: Duration) -> bool {
    static STARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| start_once(interval))
}

fn start_once(interval: Duration) -> bool {
    let (Some(mut last), Some(_)) = (read_times(), read_memory()) else {
        tracing::debug!("no CPU metrics: /proc/stat or /proc/meminfo cannot be read");
        return false;
    };
    describe_gauge!("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]");
    describe_gauge!(
        "nv_cpu_memory_total_bytes",
        "CPU total memory (RAM), in bytes"
    );
    describe_gauge!(
        "nv_cpu_memory_used_bytes",
        "CPU used memory (RAM), in bytes"
    );
    let utilization = gauge!("nv_cpu_utilization");
    let total = gauge!("nv_cpu_memory_total_bytes");
    let used = gauge!("nv_cpu_memory_used_bytes");
    let refresh = move |last: &mut CpuTimes| {
        if let Some(now) = read_times() {
            if let Some(rate) = now.utilization_since(last) {
                utilization.set(rate);
            }
            *last = now;
        }
        if let Some(memory) = read_memory() {
            total.set(memory.total as f64);
            used.set(memory.used() as f64);
        }
    };
    refresh(&mut last);
    let spawned = std::thread::Builder::new()
        .name("cpu-metrics".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            refresh(&mut last);
        });
    match spawned {
        Ok(_) => {
            tracing::info!("Collecting CPU metrics");
            true
        }
        Err(e) => {
            tracing::warn!("no CPU metrics: cannot start their thread: {e}");
            false
        }
    }
}

/// The all-CPU line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    idle: u64,
}

impl CpuTimes {
    /// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`: guest time is
    /// already in user and nice, so only the first eight count.
    fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|line| line.starts_with("cpu "))?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|field| field.parse().ok())
            .collect::<Option<_>>()?;
        if fields.len() < 5 {
            return None;
        }
        let idle = fields[3] + fields[4];
        let busy = fields.iter().sum::<u64>() - idle;
        Some(CpuTimes { busy, idle })
    }

    /// Busy share of the time elapsed since `earlier`; `None` when no tick passed.
    fn utilization_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let busy = self.busy.saturating_sub(earlier.busy);
        let idle = self.idle.saturating_sub(earlier.idle);
        let all = busy + idle;
        (all > 0).then(|| busy as f64 / all as f64)
    }
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memory {
    total: u64,
    available: u64,
}

impl Memory {
    fn parse(meminfo: &str) -> Option<Memory> {
        let field = |name: &str| -> Option<u64> {
            let line = meminfo.lines().find(|line| line.starts_with(name))?;
            let mut words = line[name.len()..].split_whitespace();
            let value: u64 = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") => value.checked_mul(1024),
                None => Some(value),
                Some(_) => None,
            }
        };
        Some(Memory {
            total: field("MemTotal:")?,
            available: field("MemAvailable:")?,
        })
    }

    fn used(&self) -> u64 {
        self.total.saturating_sub(self.available)
    }
}

fn read_times() -> Option<CpuTimes> {
    CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn read_memory() -> Option<Memory> {
    Memory::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilization_is_busy_ticks_over_all_ticks_between_two_reads() {
        let before = CpuTimes::parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5\n").unwrap();
        assert_eq!(
            before,
            CpuTimes {
                busy: 150,
                idle: 850
            }
        );
        // 60 busy ticks (user 40, system 10, irq 5, steal 5) and 140 idle (idle 130, iowait 10).
        let after = CpuTimes::parse("cpu  140 0 60 930 60 5 0 5 99 99\n").unwrap();
        assert_eq!(after.utilization_since(&before), Some(60.0 / 200.0));
        assert_eq!(after.utilization_since(&after), None);
    }

    #[test]
    fn malformed_stat_lines_are_refused() {
        for stat in ["", "cpu0 1 2 3 4 5", "cpu  1 2 3", "cpu  1 2 x 4 5 6"] {
            assert_eq!(CpuTimes::parse(stat), None, "{stat:?}");
        }
    }

    #[test]
    fn memory_is_read_in_bytes_and_used_is_total_less_available() {
        let memory = Memory::parse(
            "MemTotal:       24684092 kB\nMemFree: 1 kB\nMemAvailable:   24227608 kB\n",
        )
        .unwrap();
        assert_eq!(memory.total, 24_684_092 * 1024);
        assert_eq!(memory.used(), (24_684_092 - 24_227_608) * 1024);
        assert_eq!(Memory::parse("MemTotal: 5 kB\n"), None);
        assert_eq!(Memory::parse("MemTotal: 5 MB\nMemAvailable: 1 kB\n"), None);
    }

    #[test]
    fn this_machine_has_readable_cpu_metrics() {
        let times = read_times().expect("/proc/stat");
        assert!(times.busy + times.idle > 0);
        let memory = read_memory().expect("/proc/meminfo");
        assert!(memory.total > 0 && memory.used() <= memory.total);
    }
}
