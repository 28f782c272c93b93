//! The command line: `tritonserver`'s flags, so that a Triton deployment's arguments start kiln
//! unchanged. Each flag either does what Triton's does, or (for the few that name Triton
//! internals kiln does not have, such as backend and memory-pool settings) is accepted and logged
//! as having no effect; a setting kiln cannot honour at all (SageMaker, model namespacing, rate
//! limiting) is refused at start-up with the reason. Every flag also reads a `KILN_*` variable.
//!
//! [`Args::launch`] turns the parsed flags into what `main` needs: the server [`Config`], the
//! log settings and the addresses to bind.

mod browser;
mod code_paths;
mod compat;
mod limits;
mod models;
mod shm;
#[cfg(test)]
mod tests;

pub use compat::{BackendSettings, CompressionLevel};

use crate::backend::python::{StubEnvironment, StubPrivileges, DEFAULT_BACKEND_DIRECTORY};
use crate::logging::{LogFormat, LogSettings};
use crate::metrics::MetricsConfig;
use crate::protocol::access::{AccessPolicy, BrowserPolicy, Secret, GRPC_HEADER_PREFIX};
use crate::protocol::grpc_web::GrpcWebOptions;
use crate::protocol::http::sagemaker::SageMakerConfig;
use crate::protocol::http::vertex::VertexConfig;
use crate::protocol::http::DEFAULT_MAX_INPUT_BYTES;
use crate::repository::op_library::AllowedOpLibraries;
use crate::repository::ControlMode;
use crate::server::{Config, GrpcTransport, MetricsOptions};
use crate::tls::TlsFiles;
use clap::Parser;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

fn bool_value(text: &str) -> Result<bool, String> {
    crate::core::parse_bool(text.trim())
        .ok_or_else(|| format!("expected true or false (or on/off, 1/0), got '{text}'"))
}

/// `--http-max-input-size`: bytes, more than 0 (Triton's check and words, server
/// src/command_line_parser.cc).
fn positive_size(text: &str) -> Result<usize, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if n <= 0 => Err("--http-max-input-size must be greater than 0.".into()),
        Ok(n) => usize::try_from(n).map_err(|e| e.to_string()),
        Err(e) => Err(format!("expected a number of bytes, got '{text}': {e}")),
    }
}

fn parse_log_format(name: &str) -> Result<LogFormat, String> {
    LogFormat::parse(name).ok_or_else(|| format!("expected `default` or `ISO8601`, got `{name}`"))
}

/// Serve ONNX models over NVIDIA Triton's gRPC and REST protocols (KServe v2 / Open Inference
/// Protocol). Flags follow `tritonserver`.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, args_override_self = true)]
pub struct Args {
    /// Model repository (Triton layout: <model>/config.pbtxt, <model>/<version>/model.onnx): a
    /// directory, or an object store: s3://bucket/prefix (S3 or S3-compatible, AWS_* variables),
    /// gs://bucket/prefix (Google Cloud Storage, GOOGLE_APPLICATION_CREDENTIALS) or
    /// as://account/container/prefix (Azure Blob Storage, AZURE_STORAGE_KEY). Repeat to serve
    /// several repositories.
    #[arg(
        long = "model-repository",
        alias = "model-store",
        env = "KILN_MODEL_REPOSITORY",
        required = true
    )]
    pub model_repositories: Vec<PathBuf>,

    /// The server's name in server metadata (Triton's `--id`).
    #[arg(long = "id", env = "KILN_ID", default_value = "kiln")]
    pub id: String,

    /// Serve the gRPC API (`false`: no gRPC listener).
    #[arg(long, env = "KILN_ALLOW_GRPC", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_grpc: bool,

    /// Address the gRPC service binds.
    #[arg(long, env = "KILN_GRPC_ADDRESS", default_value = "0.0.0.0")]
    pub grpc_address: IpAddr,

    /// Port of the gRPC inference service (0 picks a free port; the log says which).
    #[arg(long, env = "KILN_GRPC_PORT", default_value_t = 8001)]
    pub grpc_port: u16,

    /// Let other processes bind the gRPC port too (SO_REUSEPORT; the kernel spreads new
    /// connections over them). Every one of them must set it.
    #[arg(long, env = "KILN_REUSE_GRPC_PORT", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub reuse_grpc_port: bool,

    /// Serve the REST API (`false`: no HTTP listener).
    #[arg(long, env = "KILN_ALLOW_HTTP", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_http: bool,

    /// Address the REST API binds.
    #[arg(long, env = "KILN_HTTP_ADDRESS", default_value = "0.0.0.0")]
    pub http_address: IpAddr,

    /// Port of the REST API (0 picks a free port; the log says which).
    #[arg(long, env = "KILN_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,

    /// Let other processes bind the REST port too (SO_REUSEPORT).
    #[arg(long, env = "KILN_REUSE_HTTP_PORT", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub reuse_http_port: bool,

    /// Largest REST request body in bytes, checked while reading and again after decompression
    /// (Triton's default: 64 MiB).
    #[arg(long, env = "KILN_HTTP_MAX_INPUT_SIZE", default_value_t = DEFAULT_MAX_INPUT_BYTES, value_parser = positive_size)]
    pub http_max_input_size: usize,

    /// Serve Amazon SageMaker's `/ping` and `/invocations` on --sagemaker-port (the model from
    /// SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, or the only one served).
    #[arg(long, env = "KILN_ALLOW_SAGEMAKER", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_sagemaker: bool,

    /// Port of the SageMaker service (on --http-address; 0 picks a free port).
    #[arg(long, env = "KILN_SAGEMAKER_PORT", default_value_t = 8080)]
    pub sagemaker_port: u16,

    /// Serve an OpenAI-compatible API for the generation models (`/v1/models`,
    /// `/v1/completions`, `/v1/chat/completions`) on this port (on --http-address; 0 picks a
    /// free port). Off by default.
    #[arg(long, env = "KILN_OPENAI_PORT")]
    pub openai_port: Option<u16>,

    /// Serve Google Vertex AI's health and predict routes (AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE)
    /// on --vertex-ai-port. Default: true when AIP_MODE=PREDICTION, as in Triton.
    #[arg(long, env = "KILN_ALLOW_VERTEX_AI", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_vertex_ai: Option<bool>,

    /// Port of the Vertex AI service (on --http-address). Default: AIP_HTTP_PORT, else 8080.
    #[arg(long, env = "KILN_VERTEX_AI_PORT")]
    pub vertex_ai_port: Option<u16>,

    /// The model Vertex AI's predict route runs (default: the one model served).
    #[arg(long, env = "KILN_VERTEX_AI_DEFAULT_MODEL")]
    pub vertex_ai_default_model: Option<String>,

    /// Port of the Prometheus metrics endpoint (`/metrics`; 0 picks a free port).
    #[arg(long, env = "KILN_METRICS_PORT", default_value_t = 8002)]
    pub metrics_port: u16,

    /// Address the metrics endpoint binds.
    #[arg(long, env = "KILN_METRICS_ADDRESS", default_value = "0.0.0.0")]
    pub metrics_address: IpAddr,

    /// Serve Prometheus metrics (`--allow-metrics=false` turns the endpoint off).
    #[arg(long, env = "KILN_ALLOW_METRICS", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_metrics: bool,

    /// Report per-GPU metrics (nv_gpu_utilization, nv_gpu_memory_*_bytes) through NVML when the
    /// machine has NVIDIA GPUs.
    #[arg(long, env = "KILN_ALLOW_GPU_METRICS", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_gpu_metrics: bool,

    /// Report the machine's CPU metrics (nv_cpu_utilization, nv_cpu_memory_*_bytes) from /proc.
    #[arg(long, env = "KILN_ALLOW_CPU_METRICS", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_cpu_metrics: bool,

    /// Milliseconds between two readings of the CPU and GPU gauges.
    #[arg(long, env = "KILN_METRICS_INTERVAL_MS", default_value_t = 2000.0)]
    pub metrics_interval_ms: f64,

    /// Which latency series are published (repeatable): `counter_latencies=<bool>` (true),
    /// `summary_latencies=<bool>` (false), `summary_quantiles=<q>:<error>,...`.
    #[arg(long = "metrics-config", value_name = "SETTING=VALUE")]
    pub metrics_config: Vec<String>,

    /// Largest gRPC message received or sent, in bytes (Triton allows 2 GiB - 1).
    #[arg(long, env = "KILN_GRPC_MAX_MESSAGE_BYTES", default_value_t = i32::MAX as usize)]
    pub grpc_max_message_bytes: usize,

    /// Compress gRPC responses for clients that accept it: `none`, or `low`, `medium`, `high`
    /// (gzip or deflate, whichever the client prefers, at one level for all three).
    #[arg(
        long,
        env = "KILN_GRPC_INFER_RESPONSE_COMPRESSION_LEVEL",
        value_enum,
        default_value = "none"
    )]
    pub grpc_infer_response_compression_level: CompressionLevel,

    /// Milliseconds between HTTP/2 keepalive pings on a gRPC connection.
    #[arg(long, env = "KILN_GRPC_KEEPALIVE_TIME", default_value_t = 7_200_000)]
    pub grpc_keepalive_time: u64,

    /// Milliseconds a keepalive ping may go unanswered before the connection is closed.
    #[arg(long, env = "KILN_GRPC_KEEPALIVE_TIMEOUT", default_value_t = 20_000)]
    pub grpc_keepalive_timeout: u64,

    /// Milliseconds a gRPC connection may live; it is then asked to go away (GOAWAY).
    #[arg(long, env = "KILN_GRPC_MAX_CONNECTION_AGE")]
    pub grpc_max_connection_age: Option<u64>,

    /// Milliseconds a connection past its age gets to finish its calls before it is closed.
    #[arg(long, env = "KILN_GRPC_MAX_CONNECTION_AGE_GRACE")]
    pub grpc_max_connection_age_grace: Option<u64>,

    /// Seconds in-flight requests may take to finish after SIGTERM or Ctrl-C.
    #[arg(long, env = "KILN_EXIT_TIMEOUT_SECS", default_value_t = 30)]
    pub exit_timeout_secs: u64,

    /// Exit (status 1) when a model fails to load at start-up. kiln's default is `false`, unlike
    /// Triton's: the server stays up, not ready while --strict-readiness holds, and the
    /// repository index gives each failure's reason.
    #[arg(long, env = "KILN_EXIT_ON_ERROR", default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub exit_on_error: bool,

    /// Most inference requests in flight at once, server-wide (0: no limit). Requests beyond it
    /// are answered at once with RESOURCE_EXHAUSTED (gRPC) or 429 (REST) instead of queueing.
    /// A model can set a lower bound of its own with the config parameter `max_inflight_requests`.
    #[arg(long, env = "KILN_MAX_INFLIGHT_REQUESTS", default_value_t = 1024)]
    pub max_inflight_requests: usize,

    /// Restrict gRPC API groups to callers sending a header: `<groups>:<key>=<value>` requires
    /// `triton-grpc-protocol-<key>: <value>` on every API of the comma-separated groups (health,
    /// metadata, inference, shared-memory, model-config, model-repository, statistics, trace,
    /// logging). Repeat for several groups of APIs; a group may appear once. As Triton's flag.
    #[arg(long = "grpc-restricted-protocol", value_name = "GROUPS:KEY=VALUE")]
    pub grpc_restricted_protocol: Vec<String>,

    /// Restrict REST API groups to callers sending the header `<key>: <value>`; the same form
    /// and groups as --grpc-restricted-protocol. As Triton's flag.
    #[arg(long = "http-restricted-api", value_name = "GROUPS:KEY=VALUE")]
    pub http_restricted_api: Vec<String>,

    /// Require `Authorization: Bearer <token>` on inference requests (gRPC and REST). Prefer the
    /// environment variable: command lines are visible to other users of the machine.
    #[arg(long, env = "KILN_INFERENCE_BEARER_TOKEN", hide_env_values = true)]
    pub inference_bearer_token: Option<String>,

    /// Serve gRPC over TLS (Triton's flag; needs --grpc-server-cert and --grpc-server-key).
    #[arg(long, env = "KILN_GRPC_USE_SSL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub grpc_use_ssl: bool,

    /// PEM certificate chain of the gRPC server.
    #[arg(long, env = "KILN_GRPC_SERVER_CERT")]
    pub grpc_server_cert: Option<PathBuf>,

    /// PEM private key of the gRPC server.
    #[arg(long, env = "KILN_GRPC_SERVER_KEY")]
    pub grpc_server_key: Option<PathBuf>,

    /// PEM root certificate that gRPC client certificates must chain to (with --grpc-use-ssl-mutual).
    #[arg(long, env = "KILN_GRPC_ROOT_CERT")]
    pub grpc_root_cert: Option<PathBuf>,

    /// Require a client certificate on gRPC (mutual TLS; implies --grpc-use-ssl).
    #[arg(long, env = "KILN_GRPC_USE_SSL_MUTUAL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub grpc_use_ssl_mutual: bool,

    /// Serve REST over TLS (kiln's flag, shaped like Triton's gRPC one; needs --http-server-cert
    /// and --http-server-key).
    #[arg(long, env = "KILN_HTTP_USE_SSL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub http_use_ssl: bool,

    /// PEM certificate chain of the REST server.
    #[arg(long, env = "KILN_HTTP_SERVER_CERT")]
    pub http_server_cert: Option<PathBuf>,

    /// PEM private key of the REST server.
    #[arg(long, env = "KILN_HTTP_SERVER_KEY")]
    pub http_server_key: Option<PathBuf>,

    /// PEM root certificate that REST client certificates must chain to (with --http-use-ssl-mutual).
    #[arg(long, env = "KILN_HTTP_ROOT_CERT")]
    pub http_root_cert: Option<PathBuf>,

    /// Require a client certificate on REST (mutual TLS; implies --http-use-ssl).
    #[arg(long, env = "KILN_HTTP_USE_SSL_MUTUAL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub http_use_ssl_mutual: bool,

    /// Verbose logging level: 0 off, 1 kiln's debug messages (and ONNX Runtime's info), 2 kiln's
    /// trace and other crates' debug messages, 3 everything. RUST_LOG, when set, picks the
    /// per-target levels instead. Changeable at run time (`/v2/logging`).
    #[arg(long, env = "KILN_LOG_VERBOSE", default_value_t = 0)]
    pub log_verbose: u32,

    /// Log informational messages. Changeable at run time.
    #[arg(long, env = "KILN_LOG_INFO", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub log_info: bool,

    /// Log warnings. Changeable at run time.
    #[arg(long, env = "KILN_LOG_WARNING", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub log_warning: bool,

    /// Log errors. Changeable at run time.
    #[arg(long, env = "KILN_LOG_ERROR", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub log_error: bool,

    /// Log line layout: `default` (glog's, as Triton: `I1130 12:05:12.123456 <pid> <file>:<line>]`)
    /// or `ISO8601` (`2026-11-30T12:05:12Z I <pid> <file>:<line>]`). Changeable at run time.
    #[arg(long, env = "KILN_LOG_FORMAT", default_value = "default", value_parser = parse_log_format)]
    pub log_format: LogFormat,

    /// Append the log to this file instead of writing it to standard error.
    #[arg(long, env = "KILN_LOG_FILE")]
    pub log_file: Option<PathBuf>,

    /// Use each config.pbtxt as written: do not fill inputs, outputs or max_batch_size from the
    /// ONNX graph.
    #[arg(long, env = "KILN_DISABLE_AUTO_COMPLETE_CONFIG")]
    pub disable_auto_complete_config: bool,

    /// Triton's older spelling: `true` is --disable-auto-complete-config, `false` completes.
    #[arg(long, env = "KILN_STRICT_MODEL_CONFIG", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub strict_model_config: Option<bool>,

    /// Read `<model>/configs/<name>.pbtxt` instead of `<model>/config.pbtxt` where a model has
    /// one (a config per deployment, e.g. `h100`); models without it use config.pbtxt.
    #[arg(long, env = "KILN_MODEL_CONFIG_NAME")]
    pub model_config_name: Option<String>,

    /// Models loaded at once at start-up and by each repository poll.
    #[arg(long, env = "KILN_MODEL_LOAD_THREAD_COUNT", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub model_load_thread_count: u32,

    /// Times a failed model load is tried again before the model is reported failed.
    #[arg(long, env = "KILN_MODEL_LOAD_RETRY_COUNT", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub model_load_retry_count: u32,

    /// How models are loaded: `none` loads every model at start-up and ignores later changes;
    /// `poll` does the same, then applies repository changes every --repository-poll-secs;
    /// `explicit` loads only --load-model models, then whatever the load/unload API asks.
    #[arg(
        long,
        env = "KILN_MODEL_CONTROL_MODE",
        value_enum,
        default_value = "none"
    )]
    pub model_control_mode: ModelControlMode,

    /// A model to load at start-up in explicit mode (repeatable); `*` alone loads every model.
    #[arg(long = "load-model", env = "KILN_LOAD_MODEL", value_delimiter = ',')]
    pub load_models: Vec<String>,

    /// Seconds between two scans of the repository in poll mode.
    #[arg(long, env = "KILN_REPOSITORY_POLL_SECS", default_value_t = 15)]
    pub repository_poll_secs: u64,

    /// Ready only when every model that should be loaded is ready (`false`: ready once the
    /// start-up load has run, whatever its outcome). Live is true either way.
    #[arg(long, env = "KILN_STRICT_READINESS", default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub strict_readiness: bool,

    /// Run KIND_GPU instance groups on CPU when no GPU is usable (no `cuda` feature, no NVIDIA
    /// driver, no device, CUDA libraries missing) instead of failing the model's load. Each such
    /// model logs a warning and its repository index entries give the reason.
    #[arg(long, env = "KILN_GPU_FALLBACK_TO_CPU", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub gpu_fallback_to_cpu: bool,

    /// Let every dynamic batcher send a batch before its `max_queue_delay_microseconds` when
    /// waiting looks useless (kiln's adaptive batching: it assumes closed-loop clients at a
    /// steady concurrency, as a benchmark's load generator is). Off (the default): a batch that
    /// reaches neither `max_batch_size` nor a preferred size waits out its delay, as in Triton.
    /// A model's `adaptive_batching_delay` parameter overrides this for that model.
    #[arg(long, env = "KILN_ADAPTIVE_BATCHING", num_args = 0..=1, default_value_t = false, default_missing_value = "true", value_parser = bool_value, action = clap::ArgAction::Set)]
    pub adaptive_batching: bool,

    /// Where Python-based backends live: a model with `backend: "<name>"` (not onnxruntime or
    /// python) runs `<DIR>/<name>/model.py` in the Python backend, as in Triton.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_BACKEND_DIRECTORY)]
    pub backend_directory: PathBuf,

    /// An environment variable that Python models' stub processes see (repeatable; `NAME*`:
    /// every variable starting with `NAME`). Stubs otherwise see only PATH, HOME, USER,
    /// LOGNAME, TMPDIR, TZ, LANG, LANGUAGE, LC_*, PYTHON*, LD_LIBRARY_PATH,
    /// CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and the OMP/MKL/OpenBLAS thread counts: never
    /// the server's secrets (its bearer token, object-store credentials).
    #[arg(long = "python-env-passthrough", value_name = "NAME")]
    pub python_env_passthrough: Vec<String>,

    /// The user Python stubs run as (a name or `uid[:gid]`; kiln must run as root): the models'
    /// files must be readable by it. Not given: kiln's user.
    #[arg(long = "python-stub-user", value_name = "USER")]
    pub python_stub_user: Option<String>,

    /// Start Python stubs with no capabilities and no new privileges; `false` leaves them kiln's
    /// (Triton's behaviour: a model of a root server may then read the server's memory).
    #[arg(long, default_value_t = true, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub python_stub_drop_privileges: bool,

    /// Leave kiln's process dumpable, so that other processes of its user may read its memory
    /// and environment (debuggers, `perf -p`), as Triton's; off, only root can.
    #[arg(long, default_value_t = false, value_parser = bool_value, action = clap::ArgAction::Set)]
    pub allow_ptrace: bool,

    /// A custom-operator library, or a directory of them, that models may load with
    /// `model_operations { op_library_filename: ... }` (repeatable). A model repository does not
    /// choose the native code kiln runs: a model naming any other library fails its load.
    #[arg(long = "allowed-op-library", value_name = "PATH")]
    pub allowed_op_libraries: Vec<PathBuf>,

    /// `execution_count` turns on the rate limiter: instances whose instance group lists
    /// `rate_limiter` resources run only while they hold them, across all models; `off` (the
    /// default) ignores those settings.
    #[arg(long, env = "KILN_RATE_LIMIT", value_enum, default_value = "off")]
    pub rate_limit: RateLimitMode,

    /// Copies of a rate-limiter resource (repeatable): `<name>:<count>` on every device, or
    /// `<name>:<count>:<device>` on one (CPU instances count as device 0). By default a resource
    /// has as many copies as the most any loaded instance asks for.
    #[arg(long = "rate-limit-resource", value_name = "NAME:COUNT[:DEVICE]")]
    pub rate_limit_resource: Vec<String>,

    /// Backend settings, as Triton's flag (repeatable): `[onnxruntime,]default-max-batch-size=N`
    /// is the max_batch_size that auto-complete gives batchable models (4); other settings are
    /// logged and left alone.
    #[arg(long = "backend-config", value_name = "[BACKEND,]SETTING=VALUE")]
    pub backend_config: Vec<String>,

    /// Microseconds that CPUs running out of work keep polling, after the last request activity,
    /// instead of going idle (0: off). Waking an idle CPU is slow, on VMs especially; polling
    /// spends CPU time, at the lowest priority (SCHED_IDLE), to take that off each request's
    /// latency. It counts against a container's CPU quota. On a KVM guest the kernel's own halt
    /// polling (haltpoll's guest_halt_poll_ns) does this better where it can be turned on. At most
    /// 1000000 (1 s).
    #[arg(long, env = "KILN_IDLE_POLL_US", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub idle_poll_us: u64,

    /// Request tracing, as `tritonserver`'s flag (repeatable): `level=OFF|TIMESTAMPS|TENSORS`,
    /// `rate=<one request in N>` (1000), `count=<traces, -1 unlimited>` (-1),
    /// `mode=triton|opentelemetry`, `triton,file=<path>` (the JSON trace file),
    /// `triton,log-frequency=<traces per numbered file; 0: all in the file, written when
    /// settings change and at exit>` (0), `opentelemetry,url=<OTLP/HTTP traces endpoint>`,
    /// `opentelemetry,resource=<key>=<value>`, `opentelemetry,bsp_max_queue_size|
    /// bsp_schedule_delay|bsp_max_export_batch_size=<n>`. Level, rate and count are changeable
    /// at run time (`/v2/trace/setting`).
    #[arg(long = "trace-config", value_name = "[MODE,]SETTING=VALUE")]
    pub trace_config: Vec<String>,

    /// The response cache, as `tritonserver`'s flag: `local,size=<bytes>` (0 or absent: none).
    /// Models whose config has `response_cache { enable: true }` answer a request identical to
    /// an earlier one (model, version, inputs) from it without running.
    #[arg(long = "cache-config", value_name = "local,size=BYTES")]
    pub cache_config: Vec<String>,

    /// Triton's older spelling of `--cache-config local,size=<bytes>`.
    #[arg(long = "response-cache-byte-size", value_name = "BYTES")]
    pub response_cache_byte_size: Option<usize>,

    #[command(flatten, next_help_heading = "Many models (kiln's own)")]
    pub models: models::ModelFlags,

    #[command(flatten, next_help_heading = "Shared memory")]
    pub shm: shm::ShmFlags,

    #[command(flatten, next_help_heading = "Limits on clients (kiln's own)")]
    pub limits: limits::LimitFlags,

    #[command(
        flatten,
        next_help_heading = "Triton's older tracing flags (use --trace-config)"
    )]
    pub old_trace: compat::OldTraceFlags,

    #[command(flatten, next_help_heading = "Browsers")]
    pub browser: browser::BrowserFlags,

    #[command(
        flatten,
        next_help_heading = "Code and paths clients bring (kiln's own)"
    )]
    pub code_paths: code_paths::CodePathFlags,

    #[command(flatten, next_help_heading = "Accepted for tritonserver compatibility")]
    pub triton: compat::TritonOnlyFlags,
}

/// `--model-control-mode` values, spelled as `tritonserver` spells them.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ModelControlMode {
    None,
    Poll,
    Explicit,
}

impl From<ModelControlMode> for ControlMode {
    fn from(mode: ModelControlMode) -> ControlMode {
        match mode {
            ModelControlMode::None => ControlMode::None,
            ModelControlMode::Poll => ControlMode::Poll,
            ModelControlMode::Explicit => ControlMode::Explicit,
        }
    }
}

/// `--rate-limit` values, spelled as `tritonserver` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RateLimitMode {
    Off,
    #[value(name = "execution_count")]
    ExecutionCount,
}

/// A listener to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind {
    pub address: SocketAddr,
    /// SO_REUSEPORT.
    pub reuse_port: bool,
}

/// What `main` starts from the command line.
#[derive(Debug)]
pub struct Launch {
    pub config: Config,
    pub log: LogSettings,
    pub grpc: Option<Bind>,
    pub http: Option<Bind>,
    pub metrics: Option<Bind>,
    pub sagemaker: Option<Bind>,
    pub vertex: Option<Bind>,
    /// `--openai-port`.
    pub openai: Option<Bind>,
    pub idle_poll_us: u64,
    /// Flags accepted without effect, each with the reason, for the log.
    pub notes: Vec<String>,
}

/// The cloud services the flags and the environment ask for.
struct CloudServices {
    sagemaker: Option<SageMakerConfig>,
    sagemaker_bind: Option<Bind>,
    vertex: Option<VertexConfig>,
    vertex_bind: Option<Bind>,
}

impl Args {
    /// SageMaker (`--allow-sagemaker`) and Vertex AI (`--allow-vertex-ai`, by default on with
    /// `AIP_MODE=PREDICTION`), with the environment variables each reads, as Triton.
    fn cloud_services(&self) -> Result<CloudServices, String> {
        let env = |name: &str| std::env::var(name).ok();
        let sagemaker = self
            .allow_sagemaker
            .then(|| SageMakerConfig::from_env(env))
            .transpose()?
            .map(|config| SageMakerConfig {
                model_roots: self.code_paths.sagemaker_model_roots(),
                ..config
            });
        let allow_vertex = self
            .allow_vertex_ai
            .unwrap_or_else(|| env("AIP_MODE").as_deref() == Some("PREDICTION"));
        let vertex = allow_vertex
            .then(|| VertexConfig::from_env(env, self.vertex_ai_default_model.clone()))
            .transpose()?;
        let vertex_port = match (self.vertex_ai_port, env("AIP_HTTP_PORT")) {
            (Some(port), _) => port,
            (None, Some(port)) => port
                .parse()
                .map_err(|_| format!("AIP_HTTP_PORT must be a port number, got '{port}'"))?,
            (None, None) => 8080,
        };
        let bind = |port| Bind {
            address: SocketAddr::new(self.http_address, port),
            reuse_port: false,
        };
        Ok(CloudServices {
            sagemaker_bind: sagemaker.is_some().then(|| bind(self.sagemaker_port)),
            sagemaker,
            vertex_bind: vertex.is_some().then(|| bind(vertex_port)),
            vertex,
        })
    }

    /// The log settings alone, so that logging can start before anything else is checked.
    pub fn log_settings(&self) -> LogSettings {
        LogSettings {
            file: self
                .log_file
                .as_ref()
                .map(|path| path.display().to_string())
                .unwrap_or_default(),
            info: self.log_info,
            warning: self.log_warning,
            error: self.log_error,
            verbose_level: self.log_verbose,
            format: self.log_format,
        }
    }

    /// The gRPC and REST access policies, with the inference bearer token.
    fn access_policies(&self) -> Result<(AccessPolicy, AccessPolicy), String> {
        let token = self.inference_bearer_token.clone().map(Secret::new);
        let access = |specs: &[String], flag: &str, prefix: &str| {
            AccessPolicy::parse(specs, flag, prefix).map(|p| p.with_bearer_token(token.clone()))
        };
        let browser = &self.browser;
        let grpc_browsers = BrowserPolicy::new(
            &browser.grpc_web_cors_origins,
            "--grpc-web-cors-origin",
            &[],
        )?;
        let http_browsers = BrowserPolicy::new(
            &browser.http_allowed_origins,
            "--http-allowed-origin",
            &browser.http_allowed_hosts,
        )?;
        let grpc_access = access(
            &self.grpc_restricted_protocol,
            "grpc-restricted-protocol",
            GRPC_HEADER_PREFIX,
        )?
        .with_browsers(grpc_browsers);
        let http_access = access(&self.http_restricted_api, "http-restricted-api", "")?
            .with_browsers(http_browsers);
        Ok((grpc_access, http_access))
    }

    /// The gRPC and REST listeners' TLS files, where TLS is on.
    fn tls_files(&self) -> Result<(Option<TlsFiles>, Option<TlsFiles>), String> {
        let tls = |flag: &str,
                   on: bool,
                   cert: &Option<PathBuf>,
                   key: &Option<PathBuf>,
                   root: &Option<PathBuf>,
                   mutual: bool| {
            (on || mutual)
                .then(|| {
                    TlsFiles::from_flags(flag, cert.clone(), key.clone(), root.clone(), mutual)
                })
                .transpose()
                .map_err(|e| e.to_string())
        };
        let grpc_tls = tls(
            "grpc",
            self.grpc_use_ssl,
            &self.grpc_server_cert,
            &self.grpc_server_key,
            &self.grpc_root_cert,
            self.grpc_use_ssl_mutual,
        )?;
        let http_tls = tls(
            "http",
            self.http_use_ssl,
            &self.http_server_cert,
            &self.http_server_key,
            &self.http_root_cert,
            self.http_use_ssl_mutual,
        )?;
        Ok((grpc_tls, http_tls))
    }

    /// `--metrics-interval-ms` is a number of milliseconds, at least 1.
    fn check_metrics_interval(&self) -> Result<(), String> {
        if self.metrics_interval_ms.is_finite() && self.metrics_interval_ms >= 1.0 {
            return Ok(());
        }
        Err(format!(
            "--metrics-interval-ms must be at least 1, got {}",
            self.metrics_interval_ms
        ))
    }

    /// Checks the flags together and turns them into the server's configuration.
    ///
    /// # Errors
    /// A message naming the flag that cannot be honoured.
    pub fn launch(self) -> Result<Launch, String> {
        let mut notes = self.triton.check()?;
        let cloud = self.cloud_services()?;
        if !self.allow_grpc
            && !self.allow_http
            && cloud.sagemaker.is_none()
            && cloud.vertex.is_none()
            && self.openai_port.is_none()
        {
            return Err(
                "--allow-grpc=false and --allow-http=false leave no inference endpoint".into(),
            );
        }
        self.check_metrics_interval()?;
        if let Some(name) = &self.model_config_name {
            compat::check_config_name(name)?;
        }
        let (grpc_access, http_access) = self.access_policies()?;
        let (grpc_tls, http_tls) = self.tls_files()?;
        let mut trace_flags = self.old_trace.as_trace_config();
        trace_flags.extend(self.trace_config.iter().cloned());
        let trace = crate::trace::settings::from_flags(&trace_flags)?;
        let response_cache = self.response_cache()?;
        let backend = BackendSettings::from_flags(&self.backend_config)?;
        let metrics_config = MetricsConfig::from_flags(&self.metrics_config)?;
        notes.extend(backend.notes.iter().cloned());
        let rate_limit = self.rate_limit(&mut notes)?;
        let load_on_demand = self.models.load_on_demand(self.model_control_mode)?;
        let millis = Duration::from_millis;
        let log = self.log_settings();
        let config = Config {
            server_id: self.id,
            model_repositories: self.model_repositories,
            max_message_bytes: self.grpc_max_message_bytes,
            http_max_input_bytes: self.http_max_input_size,
            exit_timeout: Duration::from_secs(self.exit_timeout_secs),
            exit_on_error: self.exit_on_error,
            max_inflight_requests: self.max_inflight_requests,
            grpc_access,
            http_access,
            grpc_tls,
            http_tls,
            limits: self.limits.limits(),
            grpc_transport: GrpcTransport {
                keepalive_time: millis(self.grpc_keepalive_time),
                keepalive_timeout: millis(self.grpc_keepalive_timeout),
                max_connection_age: self.grpc_max_connection_age.map(millis),
                max_connection_age_grace: self.grpc_max_connection_age_grace.map(millis),
                compress_responses: self.grpc_infer_response_compression_level
                    != CompressionLevel::None,
            },
            auto_complete: !(self.disable_auto_complete_config
                || self.strict_model_config == Some(true)),
            default_max_batch_size: backend.default_max_batch_size,
            model_config_name: self.model_config_name,
            load_threads: self.model_load_thread_count as usize,
            load_retries: self.model_load_retry_count,
            control_mode: self.model_control_mode.into(),
            load_models: self.load_models,
            poll_interval: Duration::from_secs(self.repository_poll_secs),
            strict_readiness: self.strict_readiness,
            load_on_demand,
            gpu_fallback_to_cpu: self.gpu_fallback_to_cpu,
            op_libraries: AllowedOpLibraries::from_flags(&self.allowed_op_libraries)?,
            backend_directory: self.backend_directory,
            adaptive_batching: self.adaptive_batching,
            python_env: StubEnvironment::new(self.python_env_passthrough)?
                .with_privileges(StubPrivileges::from_flags(
                    self.python_stub_user.as_deref(),
                    self.python_stub_drop_privileges,
                )?)
                .with_env_roots(self.code_paths.python_env_roots()),
            allow_code_in_load_overrides: self.code_paths.allow_code_in_load_overrides,
            rate_limit,
            sagemaker: cloud.sagemaker,
            vertex: cloud.vertex,
            metrics: MetricsOptions {
                gpu: self.allow_gpu_metrics,
                cpu: self.allow_cpu_metrics,
                interval: Duration::from_secs_f64(self.metrics_interval_ms / 1000.0),
                config: metrics_config,
            },
            trace,
            response_cache,
            console: self.browser.console,
            grpc_web: GrpcWebOptions::from_flags(
                self.browser.grpc_web,
                self.browser.grpc_web_cors_origins,
            )?,
            client_shm: self.shm.policy(),
        };
        Ok(Launch {
            config,
            log,
            grpc: self.allow_grpc.then_some(Bind {
                address: SocketAddr::new(self.grpc_address, self.grpc_port),
                reuse_port: self.reuse_grpc_port,
            }),
            http: self.allow_http.then_some(Bind {
                address: SocketAddr::new(self.http_address, self.http_port),
                reuse_port: self.reuse_http_port,
            }),
            metrics: self.allow_metrics.then_some(Bind {
                address: SocketAddr::new(self.metrics_address, self.metrics_port),
                reuse_port: false,
            }),
            sagemaker: cloud.sagemaker_bind,
            vertex: cloud.vertex_bind,
            openai: self.openai_port.map(|port| Bind {
                address: SocketAddr::new(self.http_address, port),
                reuse_port: false,
            }),
            idle_poll_us: self.idle_poll_us,
            notes,
        })
    }
}
