//! `tritonserver` flags that need more than a value copied into the config: backend settings,
//! Triton's older tracing flags, and the flags that name Triton internals kiln does not have.

use clap::Args;
use std::path::PathBuf;

/// `--grpc-infer-response-compression-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressionLevel {
    None,
    Low,
    Medium,
    High,
}

/// What `--backend-config` sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSettings {
    /// `default-max-batch-size`: what auto-complete gives a batchable model.
    pub default_max_batch_size: i32,
    /// Settings accepted without effect, for the log.
    pub notes: Vec<String>,
}

impl BackendSettings {
    /// `[<backend>,]<setting>=<value>`, Triton's form: without a backend the setting is global;
    /// the `onnxruntime` backend's own value wins over a global one, whatever their order.
    ///
    /// # Errors
    /// A message naming the flag that does not parse.
    pub fn from_flags(values: &[String]) -> Result<BackendSettings, String> {
        let mut global = None;
        let mut onnxruntime = None;
        let mut notes = Vec::new();
        for value in values {
            let (backend, setting) = match (value.find(','), value.find('=')) {
                (Some(comma), Some(equals)) if comma < equals => {
                    (Some(&value[..comma]), &value[comma + 1..])
                }
                _ => (None, value.as_str()),
            };
            let Some((key, text)) = setting.split_once('=') else {
                return Err(format!(
                    "--backend-config {value}: expected [<backend>,]<setting>=<value>"
                ));
            };
            match (backend, key) {
                (None | Some("onnxruntime"), "default-max-batch-size") => {
                    let size = text
                        .trim()
                        .parse::<i32>()
                        .ok()
                        .filter(|size| (0..=crate::repository::MAX_BATCH_SIZE).contains(size))
                        .ok_or_else(|| {
                            format!(
                                "--backend-config {value}: default-max-batch-size must be an \
                                 integer from 0 to {}",
                                crate::repository::MAX_BATCH_SIZE
                            )
                        })?;
                    if backend.is_some() {
                        onnxruntime = Some(size);
                    } else {
                        global = Some(size);
                    }
                }
                (Some("onnxruntime"), _) | (None, _) => notes.push(format!(
                    "--backend-config {value} has no effect: kiln reads ONNX Runtime settings \
                     from each model's config (parameters and optimization)"
                )),
                (Some(other), _) => notes.push(format!(
                    "--backend-config {value} has no effect: kiln has no '{other}' backend, only \
                     onnxruntime"
                )),
            }
        }
        Ok(BackendSettings {
            default_max_batch_size: onnxruntime
                .or(global)
                .unwrap_or(crate::repository::autocomplete::DEFAULT_MAX_BATCH_SIZE),
            notes,
        })
    }
}

/// `--model-config-name`: a file name under `<model>/configs/`, without `.pbtxt`.
///
/// # Errors
/// A name with a space (Triton's rule) or one that is not a plain file name.
pub fn check_config_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(format!(
            "--model-config-name '{name}' must be a non-empty name without spaces"
        ));
    }
    if name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(format!(
            "--model-config-name '{name}' must be a file name under <model>/configs/, not a path"
        ));
    }
    Ok(())
}

/// Triton's deprecated tracing flags, read as the `--trace-config` settings they stand for
/// (which come after them, so `--trace-config` wins).
#[derive(Debug, Clone, Default, Args)]
pub struct OldTraceFlags {
    /// `--trace-config triton,file=<path>`.
    #[arg(long = "trace-file", value_name = "PATH")]
    pub trace_file: Option<String>,
    /// `--trace-config level=<level>` (repeatable).
    #[arg(long = "trace-level", value_name = "LEVEL")]
    pub trace_level: Vec<String>,
    /// `--trace-config rate=<n>`.
    #[arg(long = "trace-rate", value_name = "N")]
    pub trace_rate: Option<String>,
    /// `--trace-config count=<n>`.
    #[arg(long = "trace-count", value_name = "N")]
    pub trace_count: Option<String>,
    /// `--trace-config triton,log-frequency=<n>`.
    #[arg(long = "trace-log-frequency", value_name = "N")]
    pub trace_log_frequency: Option<String>,
}

impl OldTraceFlags {
    pub fn as_trace_config(&self) -> Vec<String> {
        let mut settings: Vec<String> = self
            .trace_level
            .iter()
            .map(|level| format!("level={level}"))
            .collect();
        let mut add = |value: &Option<String>, prefix: &str| {
            if let Some(value) = value {
                settings.push(format!("{prefix}{value}"));
            }
        };
        add(&self.trace_rate, "rate=");
        add(&self.trace_count, "count=");
        add(&self.trace_file, "triton,file=");
        add(&self.trace_log_frequency, "triton,log-frequency=");
        settings
    }
}

/// Flags of `tritonserver` about parts of Triton kiln does not have. Those that only tune such a
/// part are accepted and logged as having no effect; those that would change what clients see
/// (another API, namespaced models, rate limiting) are refused when they ask for it.
#[derive(Debug, Clone, Default, Args)]
pub struct TritonOnlyFlags {
    /// No effect: REST and gRPC share the runtime's worker threads, one per core.
    #[arg(long, value_name = "N")]
    pub http_thread_count: Option<u32>,
    /// No effect: ONNX models read no request parameters, so headers are not forwarded.
    #[arg(long, value_name = "REGEX")]
    pub http_header_forward_pattern: Option<String>,
    /// No effect (as --http-header-forward-pattern).
    #[arg(long, value_name = "REGEX")]
    pub grpc_header_forward_pattern: Option<String>,
    /// No effect: kiln keeps no pool of request objects.
    #[arg(long, value_name = "N")]
    pub grpc_infer_allocation_pool_size: Option<u32>,
    /// No effect (as --http-thread-count).
    #[arg(long, value_name = "N")]
    pub grpc_infer_thread_count: Option<u32>,
    /// No effect: kiln keeps no pool of response objects.
    #[arg(long, value_name = "N")]
    pub grpc_max_response_pool_size: Option<u32>,
    /// No effect: kiln answers every keepalive ping and counts no ping strikes.
    #[arg(long, value_name = "BOOL", value_parser = super::bool_value)]
    pub grpc_keepalive_permit_without_calls: Option<bool>,
    /// No effect (see --grpc-keepalive-permit-without-calls).
    #[arg(long, value_name = "N")]
    pub grpc_http2_max_pings_without_data: Option<u32>,
    /// No effect (see --grpc-keepalive-permit-without-calls).
    #[arg(long, value_name = "MS")]
    pub grpc_http2_min_recv_ping_interval_without_data: Option<u64>,
    /// No effect (see --grpc-keepalive-permit-without-calls).
    #[arg(long, value_name = "N")]
    pub grpc_http2_max_ping_strikes: Option<u32>,
    /// No effect: kiln has no repository agents.
    #[arg(long, value_name = "DIR")]
    pub repoagent_directory: Option<PathBuf>,
    /// No effect: the local response cache is built in.
    #[arg(long, value_name = "DIR")]
    pub cache_directory: Option<PathBuf>,
    /// No effect: ONNX Runtime allocates host buffers itself.
    #[arg(long, value_name = "BYTES")]
    pub pinned_memory_pool_byte_size: Option<u64>,
    /// No effect: ONNX Runtime allocates device memory itself.
    #[arg(long, value_name = "GPU:BYTES")]
    pub cuda_memory_pool_byte_size: Vec<String>,
    /// No effect: implicit state does not grow on the device.
    #[arg(long, value_name = "GPU:BYTES")]
    pub cuda_virtual_address_size: Vec<String>,
    /// No effect: every GPU CUDA shows is usable.
    #[arg(long, value_name = "VERSION")]
    pub min_supported_compute_capability: Option<f64>,
    /// No effect: tensors are copied on the thread that handles the request.
    #[arg(long, value_name = "N")]
    pub buffer_manager_thread_count: Option<u32>,
    /// No effect: instances are not pinned to NUMA nodes or cores.
    #[arg(long, value_name = "NAME,SETTING=VALUE")]
    pub host_policy: Vec<String>,
    /// No effect: GPU memory is not checked before a load.
    #[arg(long, value_name = "GPU:FRACTION")]
    pub model_load_gpu_limit: Vec<String>,
    /// No effect: ONNX Runtime's CUDA provider manages peer access.
    #[arg(long, value_name = "BOOL", value_parser = super::bool_value)]
    pub enable_peer_access: Option<bool>,
    /// Only `false`: model names are unique across repositories.
    #[arg(long, value_name = "BOOL", value_parser = super::bool_value)]
    pub model_namespacing: Option<bool>,
    /// No effect: the SageMaker service serves on `--sagemaker-port` alone.
    #[arg(long, value_name = "LOW-HIGH")]
    pub sagemaker_safe_port_range: Option<String>,
    /// No effect (as --http-thread-count).
    #[arg(long, value_name = "N")]
    pub sagemaker_thread_count: Option<u32>,
    /// No effect (as --http-thread-count).
    #[arg(long, value_name = "N")]
    pub vertex_ai_thread_count: Option<u32>,
}

impl TritonOnlyFlags {
    /// Refuses what kiln cannot do; returns a note for each flag given that has no effect.
    ///
    /// # Errors
    /// A message naming the flag.
    pub fn check(&self) -> Result<Vec<String>, String> {
        let refuse = |flag: &str, value: bool, why: &str| {
            if value {
                Err(format!("--{flag}=true is not supported: {why}"))
            } else {
                Ok(())
            }
        };
        refuse(
            "model-namespacing",
            self.model_namespacing == Some(true),
            "model names must be unique across repositories",
        )?;
        let notes = self
            .network_notes()
            .into_iter()
            .chain(self.resource_notes())
            .filter(|&(_, given, _)| given)
            .map(|(flag, _, why)| format!("--{flag} has no effect: {why}"))
            .collect();
        Ok(notes)
    }

    /// The listeners', pools' and keepalive flags that have no effect: (flag, given, why), in the
    /// order their notes are printed.
    fn network_notes(&self) -> [(&'static str, bool, &'static str); 13] {
        let threads = "every listener shares the async runtime's worker threads, one per core";
        let forward = "ONNX models read no request parameters, so headers are not forwarded";
        let pings = "kiln answers every keepalive ping and counts no ping strikes (as Triton with \
                     --grpc-http2-max-ping-strikes=0)";
        [
            (
                "http-thread-count",
                self.http_thread_count.is_some(),
                threads,
            ),
            (
                "grpc-infer-thread-count",
                self.grpc_infer_thread_count.is_some(),
                threads,
            ),
            (
                "sagemaker-thread-count",
                self.sagemaker_thread_count.is_some(),
                threads,
            ),
            (
                "vertex-ai-thread-count",
                self.vertex_ai_thread_count.is_some(),
                threads,
            ),
            (
                "sagemaker-safe-port-range",
                self.sagemaker_safe_port_range.is_some(),
                "the other listeners bind the ports their own flags give",
            ),
            (
                "http-header-forward-pattern",
                self.http_header_forward_pattern.is_some(),
                forward,
            ),
            (
                "grpc-header-forward-pattern",
                self.grpc_header_forward_pattern.is_some(),
                forward,
            ),
            (
                "grpc-infer-allocation-pool-size",
                self.grpc_infer_allocation_pool_size.is_some(),
                "kiln keeps no pool of request objects",
            ),
            (
                "grpc-max-response-pool-size",
                self.grpc_max_response_pool_size.is_some(),
                "kiln keeps no pool of response objects",
            ),
            (
                "grpc-keepalive-permit-without-calls",
                self.grpc_keepalive_permit_without_calls.is_some(),
                pings,
            ),
            (
                "grpc-http2-max-pings-without-data",
                self.grpc_http2_max_pings_without_data.is_some(),
                pings,
            ),
            (
                "grpc-http2-min-recv-ping-interval-without-data",
                self.grpc_http2_min_recv_ping_interval_without_data
                    .is_some(),
                pings,
            ),
            (
                "grpc-http2-max-ping-strikes",
                self.grpc_http2_max_ping_strikes.is_some(),
                pings,
            ),
        ]
    }

    /// The repository, memory and device flags that have no effect, as [`Self::network_notes`].
    fn resource_notes(&self) -> [(&'static str, bool, &'static str); 10] {
        let built_in = "kiln's local cache is built in";
        let allocation = "ONNX Runtime allocates kiln's host and device buffers itself";
        [
            (
                "repoagent-directory",
                self.repoagent_directory.is_some(),
                "kiln has no repository agents",
            ),
            ("cache-directory", self.cache_directory.is_some(), built_in),
            (
                "pinned-memory-pool-byte-size",
                self.pinned_memory_pool_byte_size.is_some(),
                allocation,
            ),
            (
                "cuda-memory-pool-byte-size",
                !self.cuda_memory_pool_byte_size.is_empty(),
                allocation,
            ),
            (
                "cuda-virtual-address-size",
                !self.cuda_virtual_address_size.is_empty(),
                "implicit state is kept in host memory",
            ),
            (
                "min-supported-compute-capability",
                self.min_supported_compute_capability.is_some(),
                "every GPU that CUDA shows is used",
            ),
            (
                "buffer-manager-thread-count",
                self.buffer_manager_thread_count.is_some(),
                "tensors are copied on the thread that handles the request",
            ),
            (
                "host-policy",
                !self.host_policy.is_empty(),
                "instances are not pinned to NUMA nodes or cores",
            ),
            (
                "model-load-gpu-limit",
                !self.model_load_gpu_limit.is_empty(),
                "GPU memory is not checked before a load",
            ),
            (
                "enable-peer-access",
                self.enable_peer_access.is_some(),
                "ONNX Runtime's CUDA provider manages peer access",
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(values: &[&str]) -> Result<BackendSettings, String> {
        BackendSettings::from_flags(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn triton_booleans_are_read() {
        for (text, value) in [
            ("true", true),
            ("ON", true),
            ("1", true),
            ("False", false),
            ("off", false),
            ("0", false),
        ] {
            assert_eq!(crate::core::parse_bool(text), Some(value), "{text}");
        }
        assert_eq!(crate::core::parse_bool("yes"), None);
        assert_eq!(crate::core::parse_bool(""), None);
    }

    #[test]
    fn default_max_batch_size_is_read_and_onnxruntime_wins_over_global() {
        assert_eq!(backend(&[]).unwrap().default_max_batch_size, 4);
        assert_eq!(
            backend(&["default-max-batch-size=8"])
                .unwrap()
                .default_max_batch_size,
            8
        );
        let both = [
            "onnxruntime,default-max-batch-size=2",
            "default-max-batch-size=16",
        ];
        assert_eq!(backend(&both).unwrap().default_max_batch_size, 2);
        assert_eq!(
            backend(&["default-max-batch-size=0"])
                .unwrap()
                .default_max_batch_size,
            0
        );
        assert!(backend(&both).unwrap().notes.is_empty());
    }

    #[test]
    fn other_backend_settings_are_noted_and_malformed_ones_refused() {
        let settings = backend(&[
            "onnxruntime,enable-global-threadpool=1",
            "tensorflow,version=2",
            "python,shm-default-byte-size=1,2",
        ])
        .unwrap();
        assert_eq!(settings.notes.len(), 3);
        assert!(
            settings.notes[0].contains("each model's config"),
            "{:?}",
            settings.notes
        );
        assert!(
            settings.notes[1].contains("no 'tensorflow' backend"),
            "{:?}",
            settings.notes
        );
        for bad in [
            "onnxruntime",
            "default-max-batch-size=-1",
            "default-max-batch-size=x",
            "default-max-batch-size=1000000000",
        ] {
            let error = backend(&[bad]).unwrap_err();
            assert!(
                error.starts_with(&format!("--backend-config {bad}: ")),
                "{error}"
            );
        }
    }

    #[test]
    fn config_names_are_plain_file_names() {
        assert!(check_config_name("h100").is_ok());
        assert!(check_config_name("a.b-c_d").is_ok());
        for bad in ["", "with space", "tab\t"] {
            assert_eq!(
                check_config_name(bad).unwrap_err(),
                format!("--model-config-name '{bad}' must be a non-empty name without spaces")
            );
        }
        for bad in ["../x", "a/b", ".."] {
            assert_eq!(
                check_config_name(bad).unwrap_err(),
                format!(
                    "--model-config-name '{bad}' must be a file name under <model>/configs/, not a \
                     path"
                )
            );
        }
    }

    #[test]
    fn old_trace_flags_become_trace_config_settings() {
        let flags = OldTraceFlags {
            trace_file: Some("/tmp/t.json".into()),
            trace_level: vec!["TIMESTAMPS".into(), "TENSORS".into()],
            trace_rate: Some("1".into()),
            trace_count: Some("-1".into()),
            trace_log_frequency: Some("10".into()),
        };
        assert_eq!(
            flags.as_trace_config(),
            [
                "level=TIMESTAMPS",
                "level=TENSORS",
                "rate=1",
                "count=-1",
                "triton,file=/tmp/t.json",
                "triton,log-frequency=10"
            ]
        );
        assert!(OldTraceFlags::default().as_trace_config().is_empty());
    }

    #[test]
    fn triton_only_flags_are_noted_or_refused() {
        assert!(TritonOnlyFlags::default().check().unwrap().is_empty());
        let inert = TritonOnlyFlags {
            http_thread_count: Some(8),
            pinned_memory_pool_byte_size: Some(1),
            model_namespacing: Some(false),
            ..TritonOnlyFlags::default()
        };
        let notes = inert.check().unwrap();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("--http-thread-count has no effect: "));
        let namespacing = TritonOnlyFlags {
            model_namespacing: Some(true),
            ..TritonOnlyFlags::default()
        };
        assert!(namespacing
            .check()
            .unwrap_err()
            .contains("is not supported"));
    }
}
