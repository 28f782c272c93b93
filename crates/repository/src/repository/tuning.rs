//! ONNX Runtime session settings from a model config, under the keys Triton's ONNX Runtime
//! backend reads, so that a Triton repository tuned for it is tuned the same way here:
//!
//! - `optimization { graph { level } }`: `-1` basic rewrites only, `1` basic and extended, `2`
//!   none; any other value (and no `graph`) all of them, ONNX Runtime's default.
//! - `parameters` (strings, as every Triton parameter):
//!   - `intra_op_thread_count`: threads per operator in each instance's session, in a pool of
//!     the session's own. `0` (or no key) keeps kiln's default: every such session shares the
//!     process's pool, one thread per core, and starts no thread of its own.
//!   - `execution_mode`: `0` runs one operator after another (the default), `1` runs independent
//!     operators in parallel on `inter_op_thread_count` threads (`0` or none: as many as
//!     `intra_op_thread_count`'s).
//!   - `enable_mem_arena`, `enable_mem_pattern`, `session.use_device_allocator_for_initializers`:
//!     booleans (`1`/`0`, `true`/`false`, `on`/`off`) switching ONNX Runtime's CPU memory arena,
//!     its memory pattern planning, and device allocation of initializers.
//!   - `memory.enable_memory_arena_shrinkage`: the arenas to shrink after every run, as ONNX
//!     Runtime spells them (`cpu:0`, `gpu:1`, joined by `;`). Each instance shrinks the ones it
//!     has: `cpu:0` (unless its CPU arena is off) and the GPU it runs on.
//!
//! A value that does not parse fails the model's load with a message naming the key, where
//! Triton's backend would also refuse it, and never reaches ONNX Runtime. Unknown keys are left
//! alone, as Triton leaves them (other parts of kiln read theirs).

use crate::backend::{GraphLevel, SessionTuning};
use crate::proto::inference::ModelConfig;

/// Most threads one pool of one session may ask for: far more than any machine's cores, far
/// fewer than would exhaust the process's threads.
pub const MAX_THREADS: usize = 1024;

/// What a model config tunes in each of its sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Threads per operator, when the config overrides kiln's share of the cores.
    pub intra_op_threads: Option<usize>,
    /// Threads for independent operators, when `execution_mode` is 1 (`Some(None)`: as many as
    /// per operator).
    parallel_execution: Option<Option<usize>>,
    graph_level: GraphLevel,
    mem_arena: Option<bool>,
    mem_pattern: Option<bool>,
    device_allocator_for_initializers: Option<bool>,
    /// `(device is a GPU, device id)` for each arena to shrink.
    arena_shrinkage: Vec<(bool, i32)>,
    /// `model_operations`' libraries, resolved and allowed (see `op_library`).
    pub op_libraries: Vec<std::path::PathBuf>,
}

impl Tuning {
    /// Whether independent operators run in parallel (`execution_mode` 1), on threads of the
    /// session's own.
    pub fn runs_operators_in_parallel(&self) -> bool {
        self.parallel_execution.is_some()
    }

    /// The settings of one session that runs with `intra_op_threads` threads per operator, on
    /// the GPU `gpu` (or on CPU).
    pub fn session(&self, intra_op_threads: usize, gpu: Option<i32>) -> SessionTuning {
        let shrink: Vec<String> = self
            .arena_shrinkage
            .iter()
            .filter(|&&(on_gpu, id)| {
                if on_gpu {
                    gpu == Some(id)
                } else {
                    self.mem_arena != Some(false)
                }
            })
            .map(|&(on_gpu, id)| format!("{}:{id}", if on_gpu { "gpu" } else { "cpu" }))
            .collect();
        SessionTuning {
            graph_level: self.graph_level,
            parallel_execution: self
                .parallel_execution
                .map(|threads| threads.unwrap_or(intra_op_threads)),
            mem_arena: self.mem_arena,
            mem_pattern: self.mem_pattern,
            device_allocator_for_initializers: self.device_allocator_for_initializers,
            arena_shrinkage: (!shrink.is_empty()).then(|| shrink.join(";")),
            op_libraries: self.op_libraries.clone(),
        }
    }
}

/// Reads the settings `config` gives (see the module docs).
///
/// # Errors
/// The first value that does not parse, naming its key and the model.
pub fn tuning(config: &ModelConfig) -> Result<Tuning, String> {
    let model = &config.name;
    let parameter = |key: &str| config.parameters.get(key).map(|p| p.string_value.trim());
    let fail = |key: &str, value: &str, expected: &str| {
        format!("parameter '{key}' of model '{model}': expected {expected}, got '{value}'")
    };
    let threads = |key: &str| -> Result<Option<usize>, String> {
        let Some(value) = parameter(key) else {
            return Ok(None);
        };
        match value.parse::<usize>() {
            Ok(0) => Ok(None),
            Ok(n) if n <= MAX_THREADS => Ok(Some(n)),
            _ => Err(fail(
                key,
                value,
                &format!("a number of threads from 0 (kiln's default) to {MAX_THREADS}"),
            )),
        }
    };
    let boolean = |key: &str| -> Result<Option<bool>, String> {
        parameter(key)
            .map(|value| {
                crate::core::parse_bool(value)
                    .ok_or_else(|| fail(key, value, "1/0, true/false or on/off"))
            })
            .transpose()
    };
    let parallel_execution = match parameter("execution_mode") {
        None | Some("0") => None,
        Some("1") => Some(threads("inter_op_thread_count")?),
        Some(value) => {
            return Err(fail(
                "execution_mode",
                value,
                "0 (sequential) or 1 (parallel)",
            ))
        }
    };
    let arena_shrinkage = match parameter("memory.enable_memory_arena_shrinkage") {
        None => Vec::new(),
        Some(value) => arenas(value).ok_or_else(|| {
            fail(
                "memory.enable_memory_arena_shrinkage",
                value,
                "arenas such as 'cpu:0' or 'cpu:0;gpu:0'",
            )
        })?,
    };
    Ok(Tuning {
        intra_op_threads: threads("intra_op_thread_count")?,
        parallel_execution,
        graph_level: graph_level(config),
        mem_arena: boolean("enable_mem_arena")?,
        mem_pattern: boolean("enable_mem_pattern")?,
        device_allocator_for_initializers: boolean(
            "session.use_device_allocator_for_initializers",
        )?,
        arena_shrinkage,
        op_libraries: Vec::new(),
    })
}

/// Triton's numbering of `optimization.graph.level`.
fn graph_level(config: &ModelConfig) -> GraphLevel {
    let level = config
        .optimization
        .as_ref()
        .and_then(|o| o.graph.as_ref())
        .map(|g| g.level);
    match level {
        Some(-1) => GraphLevel::Basic,
        Some(1) => GraphLevel::Extended,
        Some(2) => GraphLevel::Disabled,
        _ => GraphLevel::All,
    }
}

/// `cpu:0;gpu:1` as `(is a GPU, id)` pairs; the CPU has only device 0.
fn arenas(value: &str) -> Option<Vec<(bool, i32)>> {
    let mut found = Vec::new();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (device, id) = entry.split_once(':')?;
        let id: i32 = id.trim().parse().ok().filter(|&id| id >= 0)?;
        let arena = match device.trim() {
            "cpu" if id == 0 => (false, 0),
            "gpu" => (true, id),
            _ => return None,
        };
        if !found.contains(&arena) {
            found.push(arena);
        }
    }
    (!found.is_empty()).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::config::parse_config;

    fn config(parameters: &[(&str, &str)], extra: &str) -> ModelConfig {
        let mut text = format!("name: \"m\"\n{extra}\n");
        for (key, value) in parameters {
            text.push_str(&format!(
                "parameters {{ key: \"{key}\" value: {{ string_value: \"{value}\" }} }}\n"
            ));
        }
        parse_config(&text).expect("test config parses")
    }

    fn read(parameters: &[(&str, &str)]) -> Result<Tuning, String> {
        tuning(&config(parameters, ""))
    }

    #[test]
    fn no_settings_leave_onnx_runtime_alone() {
        let tuning = read(&[]).unwrap();
        assert_eq!(tuning, Tuning::default());
        assert_eq!(tuning.session(2, None), SessionTuning::default());
        assert_eq!(tuning.session(1, Some(0)), SessionTuning::default());
    }

    #[test]
    fn graph_levels_follow_tritons_numbering() {
        for (extra, level) in [
            ("optimization { graph { level: -1 } }", GraphLevel::Basic),
            ("optimization { graph { level: 1 } }", GraphLevel::Extended),
            ("optimization { graph { level: 2 } }", GraphLevel::Disabled),
            ("optimization { graph { level: 0 } }", GraphLevel::All),
            ("optimization { graph { level: 3 } }", GraphLevel::All),
            ("optimization { priority: PRIORITY_MAX }", GraphLevel::All),
        ] {
            let tuning = tuning(&config(&[], extra)).unwrap();
            assert_eq!(tuning.session(1, None).graph_level, level, "{extra}");
        }
    }

    #[test]
    fn thread_counts_override_the_share_and_zero_keeps_it() {
        assert_eq!(
            read(&[("intra_op_thread_count", "3")])
                .unwrap()
                .intra_op_threads,
            Some(3)
        );
        assert_eq!(
            read(&[("intra_op_thread_count", " 0 ")])
                .unwrap()
                .intra_op_threads,
            None
        );
        let limit = MAX_THREADS.to_string();
        assert_eq!(
            read(&[("intra_op_thread_count", &limit)])
                .unwrap()
                .intra_op_threads,
            Some(MAX_THREADS)
        );
        for bad in ["-1", "two", "1.5", "", "1025", "99999999999999999999999"] {
            assert_eq!(
                read(&[("intra_op_thread_count", bad)]).unwrap_err(),
                format!(
                    "parameter 'intra_op_thread_count' of model 'm': expected a number of \
                     threads from 0 (kiln's default) to 1024, got '{}'",
                    bad.trim()
                )
            );
        }
    }

    #[test]
    fn parallel_execution_takes_its_own_threads_or_the_operators_count() {
        let sequential = read(&[("execution_mode", "0"), ("inter_op_thread_count", "4")]).unwrap();
        assert_eq!(sequential.session(2, None).parallel_execution, None);

        let parallel = read(&[("execution_mode", "1"), ("inter_op_thread_count", "4")]).unwrap();
        assert_eq!(parallel.session(2, None).parallel_execution, Some(4));

        let share = read(&[("execution_mode", "1")]).unwrap();
        assert_eq!(share.session(2, None).parallel_execution, Some(2));
        let zero = read(&[("execution_mode", "1"), ("inter_op_thread_count", "0")]).unwrap();
        assert_eq!(zero.session(3, None).parallel_execution, Some(3));

        assert_eq!(
            read(&[("execution_mode", "2")]).unwrap_err(),
            "parameter 'execution_mode' of model 'm': expected 0 (sequential) or 1 (parallel), \
             got '2'"
        );
        assert!(
            read(&[("execution_mode", "1"), ("inter_op_thread_count", "x")])
                .unwrap_err()
                .starts_with("parameter 'inter_op_thread_count' of model 'm': expected")
        );
    }

    #[test]
    fn booleans_take_tritons_spellings() {
        for ([arena, pattern, initializers], expected) in
            [(["TRUE", "on", "1"], true), (["0", "False", "off"], false)]
        {
            let tuning = read(&[
                ("enable_mem_arena", arena),
                ("enable_mem_pattern", pattern),
                (
                    "session.use_device_allocator_for_initializers",
                    initializers,
                ),
            ])
            .unwrap()
            .session(1, None);
            assert_eq!(
                (
                    tuning.mem_arena,
                    tuning.mem_pattern,
                    tuning.device_allocator_for_initializers
                ),
                (Some(expected), Some(expected), Some(expected))
            );
        }
        assert_eq!(
            read(&[("enable_mem_pattern", "yes")]).unwrap_err(),
            "parameter 'enable_mem_pattern' of model 'm': expected 1/0, true/false or on/off, \
             got 'yes'"
        );
    }

    #[test]
    fn each_session_shrinks_the_arenas_it_has() {
        let key = "memory.enable_memory_arena_shrinkage";
        let both = read(&[(key, "cpu:0;gpu:1")]).unwrap();
        assert_eq!(
            both.session(1, None).arena_shrinkage.as_deref(),
            Some("cpu:0")
        );
        assert_eq!(
            both.session(1, Some(1)).arena_shrinkage.as_deref(),
            Some("cpu:0;gpu:1")
        );
        assert_eq!(
            both.session(1, Some(0)).arena_shrinkage.as_deref(),
            Some("cpu:0")
        );

        let gpu_only = read(&[(key, " gpu:0 ; gpu:0 ;")]).unwrap();
        assert_eq!(gpu_only.session(1, None).arena_shrinkage, None);
        assert_eq!(
            gpu_only.session(1, Some(0)).arena_shrinkage.as_deref(),
            Some("gpu:0")
        );

        // No CPU arena, nothing to shrink on the CPU.
        let no_arena = read(&[(key, "cpu:0"), ("enable_mem_arena", "0")]).unwrap();
        assert_eq!(no_arena.session(1, None).arena_shrinkage, None);

        for bad in [
            "",
            "cpu",
            "cpu:1",
            "gpu:-1",
            "tpu:0",
            "cpu:0;gpu",
            "cpu:0,gpu:0",
        ] {
            assert_eq!(
                read(&[(key, bad)]).unwrap_err(),
                format!(
                    "parameter '{key}' of model 'm': expected arenas such as 'cpu:0' or \
                     'cpu:0;gpu:0', got '{bad}'"
                )
            );
        }
    }
}
