//! CUDA execution provider options users may set, checked here and spelled the way ONNX
//! Runtime's `UpdateCUDAProviderOptions` reads them. Keys are ONNX Runtime's own (the names
//! Triton's ONNX Runtime backend passes through from a `gpu_execution_accelerator` named "cuda");
//! values also take Triton's older numeric spellings (`arena_extend_strategy: "1"`,
//! `cudnn_conv_algo_search: "2"`). Unknown keys and bad values are errors, never ignored.

use std::fmt;

/// Validated CUDA EP options, in the order they were first set; setting a key again replaces
/// its value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaOptions {
    pairs: Vec<(&'static str, String)>,
}

/// What a key's value must look like.
#[derive(Debug, Clone, Copy)]
enum Value {
    /// A positive number of bytes.
    Bytes,
    /// `0`/`1`/`true`/`false`, passed on as `0`/`1`.
    Bool,
    /// A non-negative integer.
    Count,
    /// `kNextPowerOfTwo`/`kSameAsRequested` (or Triton's `0`/`1`).
    ArenaStrategy,
    /// `EXHAUSTIVE`/`HEURISTIC`/`DEFAULT` (or Triton's `0`/`1`/`2`).
    ConvSearch,
}

/// Every key accepted, with the shape of its value.
const KNOWN: &[(&str, Value)] = &[
    ("gpu_mem_limit", Value::Bytes),
    ("arena_extend_strategy", Value::ArenaStrategy),
    ("cudnn_conv_algo_search", Value::ConvSearch),
    ("do_copy_in_default_stream", Value::Bool),
    ("cudnn_conv_use_max_workspace", Value::Bool),
    ("cudnn_conv1d_pad_to_nc1d", Value::Bool),
    ("enable_skip_layer_norm_strict_mode", Value::Bool),
    ("prefer_nhwc", Value::Bool),
    ("use_ep_level_unified_stream", Value::Bool),
    ("use_tf32", Value::Bool),
    ("fuse_conv_bias", Value::Bool),
    ("tunable_op_enable", Value::Bool),
    ("tunable_op_tuning_enable", Value::Bool),
    ("tunable_op_max_tuning_duration_ms", Value::Count),
    ("sdpa_kernel", Value::Count),
];

/// Keys ONNX Runtime knows that kiln sets itself or cannot honour, with the reason.
const REFUSED: &[(&str, &str)] = &[
    (
        "device_id",
        "kiln places each instance on the GPUs its instance_group lists (`gpus: [...]`)",
    ),
    (
        "has_user_compute_stream",
        "kiln does not hand ONNX Runtime a CUDA stream of its own",
    ),
    (
        "user_compute_stream",
        "kiln does not hand ONNX Runtime a CUDA stream of its own",
    ),
    (
        "enable_cuda_graph",
        "CUDA graphs need input buffers at fixed addresses, and kiln binds a new buffer per batch",
    ),
];

impl CudaOptions {
    /// Checks `value` for `key` and records it in ONNX Runtime's spelling.
    ///
    /// # Errors
    /// A message naming the key and what is wrong: unknown key, key kiln sets itself, bad value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| *k == key) {
            return Err(format!("CUDA option '{key}' cannot be set: {why}"));
        }
        let Some(&(key, kind)) = KNOWN.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = KNOWN.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "unknown CUDA option '{key}' (known: {})",
                known.join(", ")
            ));
        };
        let normalized = normalize(kind, value.trim()).ok_or_else(|| {
            format!(
                "invalid value '{value}' for CUDA option '{key}': expected {}",
                expected(kind)
            )
        })?;
        match self.pairs.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = normalized,
            None => self.pairs.push((key, normalized)),
        }
        Ok(())
    }

    /// The options as ONNX Runtime provider-option pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.pairs.iter().map(|(k, v)| (*k, v.as_str()))
    }
}

impl fmt::Display for CudaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pairs.is_empty() {
            return f.write_str("defaults");
        }
        let text: Vec<String> = self.pairs().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&text.join(", "))
    }
}

fn normalize(kind: Value, value: &str) -> Option<String> {
    let named = |names: &[&str]| -> Option<String> {
        let index = value
            .parse::<usize>()
            .ok()
            .or_else(|| names.iter().position(|n| n.eq_ignore_ascii_case(value)))?;
        names.get(index).map(|n| n.to_string())
    };
    match kind {
        Value::Bytes => value
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .map(|n| n.to_string()),
        Value::Count => value.parse::<u32>().ok().map(|n| n.to_string()),
        Value::Bool => match value.to_ascii_lowercase().as_str() {
            "1" | "true" => Some("1".into()),
            "0" | "false" => Some("0".into()),
            _ => None,
        },
        Value::ArenaStrategy => named(&["kNextPowerOfTwo", "kSameAsRequested"]),
        Value::ConvSearch => named(&["EXHAUSTIVE", "HEURISTIC", "DEFAULT"]),
    }
}

fn expected(kind: Value) -> &'static str {
    match kind {
        Value::Bytes => "a positive number of bytes",
        Value::Count => "a non-negative integer",
        Value::Bool => "0, 1, true or false",
        Value::ArenaStrategy => "kNextPowerOfTwo (0) or kSameAsRequested (1)",
        Value::ConvSearch => "EXHAUSTIVE (0), HEURISTIC (1) or DEFAULT (2)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> Result<CudaOptions, String> {
        let mut options = CudaOptions::default();
        for (k, v) in pairs {
            options.set(k, v)?;
        }
        Ok(options)
    }

    #[test]
    fn values_take_onnx_runtime_spelling() {
        let options = options(&[
            ("arena_extend_strategy", "1"),
            ("cudnn_conv_algo_search", "heuristic"),
            ("do_copy_in_default_stream", "false"),
            ("gpu_mem_limit", " 4294967296 "),
            ("use_tf32", "TRUE"),
            ("sdpa_kernel", "0"),
        ])
        .unwrap();
        let pairs: Vec<(&str, &str)> = options.pairs().collect();
        assert_eq!(
            pairs,
            vec![
                ("arena_extend_strategy", "kSameAsRequested"),
                ("cudnn_conv_algo_search", "HEURISTIC"),
                ("do_copy_in_default_stream", "0"),
                ("gpu_mem_limit", "4294967296"),
                ("use_tf32", "1"),
                ("sdpa_kernel", "0"),
            ]
        );
        assert_eq!(
            options.to_string(),
            "arena_extend_strategy=kSameAsRequested, cudnn_conv_algo_search=HEURISTIC, \
             do_copy_in_default_stream=0, gpu_mem_limit=4294967296, use_tf32=1, sdpa_kernel=0"
        );
        assert_eq!(CudaOptions::default().to_string(), "defaults");
    }

    #[test]
    fn a_later_value_replaces_an_earlier_one() {
        let options = options(&[
            ("cudnn_conv_algo_search", "0"),
            ("use_tf32", "1"),
            ("cudnn_conv_algo_search", "DEFAULT"),
        ])
        .unwrap();
        let pairs: Vec<(&str, &str)> = options.pairs().collect();
        assert_eq!(
            pairs,
            vec![("cudnn_conv_algo_search", "DEFAULT"), ("use_tf32", "1")]
        );
    }

    #[test]
    fn bad_values_name_the_key_and_what_is_expected() {
        let cases = [
            ("gpu_mem_limit", "0", "a positive number of bytes"),
            ("gpu_mem_limit", "-1", "a positive number of bytes"),
            ("gpu_mem_limit", "4GB", "a positive number of bytes"),
            ("arena_extend_strategy", "2", "kNextPowerOfTwo (0)"),
            ("arena_extend_strategy", "kDouble", "kSameAsRequested (1)"),
            ("cudnn_conv_algo_search", "3", "EXHAUSTIVE (0)"),
            ("do_copy_in_default_stream", "yes", "0, 1, true or false"),
            (
                "tunable_op_max_tuning_duration_ms",
                "-5",
                "non-negative integer",
            ),
        ];
        for (key, value, expected) in cases {
            let err = options(&[(key, value)]).unwrap_err();
            assert!(
                err.contains(&format!("invalid value '{value}' for CUDA option '{key}'"))
                    && err.contains(expected),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_and_reserved_keys_are_refused() {
        let err = options(&[("gpu_memory_limit", "1")]).unwrap_err();
        assert!(
            err.starts_with("unknown CUDA option 'gpu_memory_limit' (known: gpu_mem_limit, "),
            "{err}"
        );
        let err = options(&[("device_id", "1")]).unwrap_err();
        assert!(err.contains("instance_group"), "{err}");
        let err = options(&[("enable_cuda_graph", "1")]).unwrap_err();
        assert!(err.contains("fixed addresses"), "{err}");
    }
}
