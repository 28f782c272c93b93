//! `kiln`: a Triton-compatible (KServe v2) inference server for ONNX models.

use clap::Parser;
use kiln::idle_poll::IdlePoll;
use kiln::logging::{self, LogFormat, LogSettings};
use kiln::protocol::access::{AccessPolicy, Secret, GRPC_HEADER_PREFIX};
use kiln::protocol::http::DEFAULT_MAX_INPUT_BYTES;
use kiln::repository::ControlMode;
use kiln::server::{self, Config, Listeners};
use kiln::tls::TlsFiles;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tracing::{error, info, warn};

/// Serve ONNX models over NVIDIA Triton's gRPC and REST protocols (KServe v2 / Open Inference
/// Protocol). Flags follow `tritonserver`.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
struct Args {
    /// Model repository (Triton layout: <model>/config.pbtxt, <model>/<version>/model.onnx): a
    /// directory, or s3://bucket/prefix for an S3-compatible store configured from the AWS_*
    /// environment variables. Repeat to serve several repositories.
    #[arg(
        long = "model-repository",
        env = "KILN_MODEL_REPOSITORY",
        required = true
    )]
    model_repositories: Vec<PathBuf>,

    /// Address the gRPC service binds.
    #[arg(long, env = "KILN_GRPC_ADDRESS", default_value = "0.0.0.0")]
    grpc_address: IpAddr,

    /// Port of the gRPC inference service (0 picks a free port; the log says which).
    #[arg(long, env = "KILN_GRPC_PORT", default_value_t = 8001)]
    grpc_port: u16,

    /// Address the REST API binds.
    #[arg(long, env = "KILN_HTTP_ADDRESS", default_value = "0.0.0.0")]
    http_address: IpAddr,

    /// Port of the REST API (0 picks a free port; the log says which).
    #[arg(long, env = "KILN_HTTP_PORT", default_value_t = 8000)]
    http_port: u16,

    /// Largest REST request body in bytes, checked while reading and again after decompression
    /// (Triton's default: 64 MiB).
    #[arg(long, env = "KILN_HTTP_MAX_INPUT_SIZE", default_value_t = DEFAULT_MAX_INPUT_BYTES)]
    http_max_input_size: usize,

    /// Port of the Prometheus metrics endpoint (`/metrics`; 0 picks a free port).
    #[arg(long, env = "KILN_METRICS_PORT", default_value_t = 8002)]
    metrics_port: u16,

    /// Address the metrics endpoint binds.
    #[arg(long, env = "KILN_METRICS_ADDRESS", default_value = "0.0.0.0")]
    metrics_address: IpAddr,

    /// Serve Prometheus metrics (`--allow-metrics=false` turns the endpoint off).
    #[arg(long, env = "KILN_ALLOW_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    allow_metrics: bool,

    /// Largest gRPC message received or sent, in bytes (Triton allows 2 GiB - 1).
    #[arg(long, env = "KILN_GRPC_MAX_MESSAGE_BYTES", default_value_t = i32::MAX as usize)]
    grpc_max_message_bytes: usize,

    /// Seconds in-flight requests may take to finish after SIGTERM or Ctrl-C.
    #[arg(long, env = "KILN_EXIT_TIMEOUT_SECS", default_value_t = 30)]
    exit_timeout_secs: u64,

    /// Most inference requests in flight at once, server-wide (0: no limit). Requests beyond it
    /// are answered at once with RESOURCE_EXHAUSTED (gRPC) or 429 (REST) instead of queueing.
    /// A model can set a lower bound of its own with the config parameter `max_inflight_requests`.
    #[arg(long, env = "KILN_MAX_INFLIGHT_REQUESTS", default_value_t = 1024)]
    max_inflight_requests: usize,

    /// Restrict gRPC API groups to callers sending a header: `<groups>:<key>=<value>` requires
    /// `triton-grpc-protocol-<key>: <value>` on every API of the comma-separated groups (health,
    /// metadata, inference, shared-memory, model-config, model-repository, statistics, trace,
    /// logging). Repeat for several groups of APIs; a group may appear once. As Triton's flag.
    #[arg(long = "grpc-restricted-protocol", value_name = "GROUPS:KEY=VALUE")]
    grpc_restricted_protocol: Vec<String>,

    /// Restrict REST API groups to callers sending the header `<key>: <value>`; the same form
    /// and groups as --grpc-restricted-protocol. As Triton's flag.
    #[arg(long = "http-restricted-api", value_name = "GROUPS:KEY=VALUE")]
    http_restricted_api: Vec<String>,

    /// Require `Authorization: Bearer <token>` on inference requests (gRPC and REST). Prefer the
    /// environment variable: command lines are visible to other users of the machine.
    #[arg(long, env = "KILN_INFERENCE_BEARER_TOKEN", hide_env_values = true)]
    inference_bearer_token: Option<String>,

    /// Serve gRPC over TLS (Triton's flag; needs --grpc-server-cert and --grpc-server-key).
    #[arg(long, env = "KILN_GRPC_USE_SSL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    grpc_use_ssl: bool,

    /// PEM certificate chain of the gRPC server.
    #[arg(long, env = "KILN_GRPC_SERVER_CERT")]
    grpc_server_cert: Option<PathBuf>,

    /// PEM private key of the gRPC server.
    #[arg(long, env = "KILN_GRPC_SERVER_KEY")]
    grpc_server_key: Option<PathBuf>,

    /// PEM root certificate that gRPC client certificates must chain to (with --grpc-use-ssl-mutual).
    #[arg(long, env = "KILN_GRPC_ROOT_CERT")]
    grpc_root_cert: Option<PathBuf>,

    /// Require a client certificate on gRPC (mutual TLS; implies --grpc-use-ssl).
    #[arg(long, env = "KILN_GRPC_USE_SSL_MUTUAL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    grpc_use_ssl_mutual: bool,

    /// Serve REST over TLS (kiln's flag, shaped like Triton's gRPC one; needs --http-server-cert
    /// and --http-server-key).
    #[arg(long, env = "KILN_HTTP_USE_SSL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    http_use_ssl: bool,

    /// PEM certificate chain of the REST server.
    #[arg(long, env = "KILN_HTTP_SERVER_CERT")]
    http_server_cert: Option<PathBuf>,

    /// PEM private key of the REST server.
    #[arg(long, env = "KILN_HTTP_SERVER_KEY")]
    http_server_key: Option<PathBuf>,

    /// PEM root certificate that REST client certificates must chain to (with --http-use-ssl-mutual).
    #[arg(long, env = "KILN_HTTP_ROOT_CERT")]
    http_root_cert: Option<PathBuf>,

    /// Require a client certificate on REST (mutual TLS; implies --http-use-ssl).
    #[arg(long, env = "KILN_HTTP_USE_SSL_MUTUAL", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    http_use_ssl_mutual: bool,

    /// Verbose logging level: 0 off, 1 kiln's debug messages (and ONNX Runtime's info), 2 kiln's
    /// trace and other crates' debug messages, 3 everything. RUST_LOG, when set, picks the
    /// per-target levels instead. Changeable at run time (`/v2/logging`).
    #[arg(long, env = "KILN_LOG_VERBOSE", default_value_t = 0)]
    log_verbose: u32,

    /// Log informational messages. Changeable at run time.
    #[arg(long, env = "KILN_LOG_INFO", default_value_t = true, action = clap::ArgAction::Set)]
    log_info: bool,

    /// Log warnings. Changeable at run time.
    #[arg(long, env = "KILN_LOG_WARNING", default_value_t = true, action = clap::ArgAction::Set)]
    log_warning: bool,

    /// Log errors. Changeable at run time.
    #[arg(long, env = "KILN_LOG_ERROR", default_value_t = true, action = clap::ArgAction::Set)]
    log_error: bool,

    /// Log line layout: `default` (glog's, as Triton: `I1130 12:05:12.123456 <pid> <file>:<line>]`)
    /// or `ISO8601` (`2026-11-30T12:05:12Z I <pid> <file>:<line>]`). Changeable at run time.
    #[arg(long, env = "KILN_LOG_FORMAT", default_value = "default", value_parser = parse_log_format)]
    log_format: LogFormat,

    /// Append the log to this file instead of writing it to standard error.
    #[arg(long, env = "KILN_LOG_FILE")]
    log_file: Option<PathBuf>,

    /// Use each config.pbtxt as written: do not fill inputs, outputs or max_batch_size from the
    /// ONNX graph.
    #[arg(long, env = "KILN_DISABLE_AUTO_COMPLETE_CONFIG")]
    disable_auto_complete_config: bool,

    /// How models are loaded: `none` loads every model at start-up and ignores later changes;
    /// `poll` does the same, then applies repository changes every --repository-poll-secs;
    /// `explicit` loads only --load-model models, then whatever the load/unload API asks.
    #[arg(
        long,
        env = "KILN_MODEL_CONTROL_MODE",
        value_enum,
        default_value = "none"
    )]
    model_control_mode: ModelControlMode,

    /// A model to load at start-up in explicit mode (repeatable); `*` alone loads every model.
    #[arg(long = "load-model", env = "KILN_LOAD_MODEL", value_delimiter = ',')]
    load_models: Vec<String>,

    /// Seconds between two scans of the repository in poll mode.
    #[arg(long, env = "KILN_REPOSITORY_POLL_SECS", default_value_t = 15)]
    repository_poll_secs: u64,

    /// Ready only when every model that should be loaded is ready (`false`: ready once the
    /// start-up load has run, whatever its outcome). Live is true either way.
    #[arg(long, env = "KILN_STRICT_READINESS", default_value_t = true, action = clap::ArgAction::Set)]
    strict_readiness: bool,

    /// Run KIND_GPU instance groups on CPU when no GPU is usable (no `cuda` feature, no NVIDIA
    /// driver, no device, CUDA libraries missing) instead of failing the model's load. Each such
    /// model logs a warning and its repository index entries give the reason.
    #[arg(long, env = "KILN_GPU_FALLBACK_TO_CPU", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    gpu_fallback_to_cpu: bool,

    /// Report per-GPU metrics (nv_gpu_utilization, nv_gpu_memory_*_bytes) through NVML when the
    /// machine has NVIDIA GPUs. As Triton's flag.
    #[arg(long, env = "KILN_ALLOW_GPU_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    allow_gpu_metrics: bool,

    /// Microseconds that CPUs running out of work keep polling, after the last request activity,
    /// instead of going idle (0: off). Waking an idle CPU is slow, on VMs especially; polling
    /// spends CPU time, at the lowest priority (SCHED_IDLE), to take that off each request's
    /// latency. It counts against a container's CPU quota. On a KVM guest the kernel's own halt
    /// polling (haltpoll's guest_halt_poll_ns) does this better where it can be turned on. At most
    /// 1000000 (1 s).
    #[arg(long, env = "KILN_IDLE_POLL_US", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    idle_poll_us: u64,

    /// Request tracing, as `tritonserver`'s flag (repeatable): `level=OFF|TIMESTAMPS|TENSORS`,
    /// `rate=<one request in N>` (1000), `count=<traces, -1 unlimited>` (-1), `mode=triton`,
    /// `triton,file=<path>` (the JSON trace file), `triton,log-frequency=<traces per numbered
    /// file; 0: all in the file, written when settings change and at exit>` (0). Changeable at
    /// run time (`/v2/trace/setting`).
    #[arg(long = "trace-config", value_name = "[MODE,]SETTING=VALUE")]
    trace_config: Vec<String>,

    /// The response cache, as `tritonserver`'s flag: `local,size=<bytes>` (0 or absent: none).
    /// Models whose config has `response_cache { enable: true }` answer a request identical to
    /// an earlier one (model, version, inputs) from it without running.
    #[arg(long = "cache-config", value_name = "local,size=BYTES")]
    cache_config: Vec<String>,

    /// Triton's older spelling of `--cache-config local,size=<bytes>`.
    #[arg(long = "response-cache-byte-size", value_name = "BYTES")]
    response_cache_byte_size: Option<usize>,
}

/// `--model-control-mode` values, spelled as `tritonserver` spells them.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ModelControlMode {
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

fn parse_log_format(name: &str) -> Result<LogFormat, String> {
    LogFormat::parse(name).ok_or_else(|| format!("expected `default` or `ISO8601`, got `{name}`"))
}

async fn bind(address: SocketAddr, what: &str) -> Option<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => Some(listener),
        Err(e) => {
            error!("cannot bind {what} address {address}: {e}");
            None
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            error!("cannot listen for SIGTERM: {e}");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => info!("received Ctrl-C"),
        _ = term.recv() => info!("received SIGTERM"),
    }
}

/// Blocking work still running once the server has stopped (a model load stuck in ONNX Runtime,
/// say) gets this long before the process exits anyway.
const BLOCKING_GRACE: Duration = Duration::from_secs(2);

/// One idle poller per CPU the process may use (affinity and CPU quota considered), when
/// `--idle-poll-us` is not 0.
fn start_idle_poll(window_us: u64) -> std::io::Result<Option<IdlePoll>> {
    if window_us == 0 {
        return Ok(None);
    }
    if let Some(ns) = kiln::idle_poll::kernel_halt_poll_ns() {
        warn!(
            "the kernel already polls idle CPUs for {} µs before halting them (cpuidle haltpoll, \
             guest_halt_poll_ns); --idle-poll-us only adds cost on top of that, consider leaving \
             it off",
            ns / 1000
        );
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    info!(
        "idle polling: {threads} threads keep idle CPUs polling for {window_us} µs after activity"
    );
    IdlePoll::start(Duration::from_micros(window_us), threads).map(Some)
}

/// Raises the soft limit on open descriptors to the hard limit, as servers do: every connection
/// and every registered shared-memory region holds one, and distributions still start processes
/// with a soft limit of 1,024.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct; results are checked.
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && {
            // An unlimited hard limit still stops at the kernel's `nr_open` (2^20 by default).
            let target = limit.rlim_max.min(1 << 20);
            target <= limit.rlim_cur || {
                limit.rlim_cur = target;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
            }
        }
    };
    if !raised {
        warn!(
            "cannot raise the open-file limit: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let log = LogSettings {
        file: args
            .log_file
            .as_ref()
            .map(|path| path.display().to_string())
            .unwrap_or_default(),
        info: args.log_info,
        warning: args.log_warning,
        error: args.log_error,
        verbose_level: args.log_verbose,
        format: args.log_format,
    };
    if let Err(e) = logging::init(&log) {
        eprintln!("cannot open the log file {}: {e}", log.file);
        return ExitCode::FAILURE;
    }
    raise_open_file_limit();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    // Kept until the process exits.
    let _idle_poll = match start_idle_poll(args.idle_poll_us) {
        Ok(Some(poll)) => {
            let activity = poll.activity();
            builder.on_thread_unpark(move || activity.mark());
            Some(poll)
        }
        Ok(None) => None,
        Err(e) => {
            error!("cannot start idle polling: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(e) => {
            error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(serve(args));
    // Dropping the runtime would wait for every blocking task, however long it takes.
    runtime.shutdown_timeout(BLOCKING_GRACE);
    code
}

async fn serve(args: Args) -> ExitCode {
    let grpc = match bind(SocketAddr::new(args.grpc_address, args.grpc_port), "gRPC").await {
        Some(listener) => listener,
        None => return ExitCode::FAILURE,
    };
    let http = match bind(SocketAddr::new(args.http_address, args.http_port), "HTTP").await {
        Some(listener) => listener,
        None => return ExitCode::FAILURE,
    };
    let metrics = if args.allow_metrics {
        match bind(
            SocketAddr::new(args.metrics_address, args.metrics_port),
            "metrics",
        )
        .await
        {
            Some(listener) => Some(listener),
            None => return ExitCode::FAILURE,
        }
    } else {
        None
    };
    let token = args.inference_bearer_token.map(Secret::new);
    let access = |specs: &[String], flag: &str, prefix: &str| {
        AccessPolicy::parse(specs, flag, prefix).map(|p| p.with_bearer_token(token.clone()))
    };
    let (grpc_access, http_access) = match (
        access(
            &args.grpc_restricted_protocol,
            "grpc-restricted-protocol",
            GRPC_HEADER_PREFIX,
        ),
        access(&args.http_restricted_api, "http-restricted-api", ""),
    ) {
        (Ok(grpc), Ok(http)) => (grpc, http),
        (Err(e), _) | (_, Err(e)) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let tls = |flag: &str, on: bool, cert, key, root, mutual: bool| {
        (on || mutual)
            .then(|| TlsFiles::from_flags(flag, cert, key, root, mutual))
            .transpose()
    };
    let (grpc_tls, http_tls) = match (
        tls(
            "grpc",
            args.grpc_use_ssl,
            args.grpc_server_cert,
            args.grpc_server_key,
            args.grpc_root_cert,
            args.grpc_use_ssl_mutual,
        ),
        tls(
            "http",
            args.http_use_ssl,
            args.http_server_cert,
            args.http_server_key,
            args.http_root_cert,
            args.http_use_ssl_mutual,
        ),
    ) {
        (Ok(grpc), Ok(http)) => (grpc, http),
        (Err(e), _) | (_, Err(e)) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let trace = match kiln::trace::settings::from_flags(&args.trace_config) {
        Ok(trace) => trace,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cache_flags = args.cache_config.clone();
    if let Some(bytes) = args.response_cache_byte_size {
        cache_flags.push(format!("local,size={bytes}"));
    }
    let response_cache = match kiln::engine::CacheConfig::from_flags(&cache_flags) {
        Ok(cache) => cache,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        model_repositories: args.model_repositories,
        max_message_bytes: args.grpc_max_message_bytes,
        http_max_input_bytes: args.http_max_input_size,
        exit_timeout: Duration::from_secs(args.exit_timeout_secs),
        max_inflight_requests: args.max_inflight_requests,
        grpc_access,
        http_access,
        grpc_tls,
        http_tls,
        auto_complete: !args.disable_auto_complete_config,
        control_mode: args.model_control_mode.into(),
        load_models: args.load_models,
        poll_interval: Duration::from_secs(args.repository_poll_secs),
        strict_readiness: args.strict_readiness,
        gpu_fallback_to_cpu: args.gpu_fallback_to_cpu,
        gpu_metrics: args.allow_gpu_metrics,
        trace,
        response_cache,
    };
    match server::run(
        config,
        Listeners {
            grpc,
            http,
            metrics,
        },
        shutdown_signal(),
    )
    .await
    {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
