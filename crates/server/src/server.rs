//! Wiring: serves gRPC (inference service, reflection v1 and v1alpha, `grpc.health.v1`), the REST
//! API and Prometheus metrics on the given listeners, over one engine, until the shutdown future
//! completes; in-flight requests then get up to `exit_timeout` to finish.
//!
//! Listeners answer before any model has loaded: live is true at once, while the start-up load
//! runs in the background and readiness (REST, `ServerReady`, and the gRPC health service, which
//! follows every change) turns true when it may. In poll mode the repository is re-scanned every
//! `poll_interval` after that.

mod python_calls;

use crate::engine::{CacheConfig, Engine};
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::protocol::access::grpc::GrpcAccessLayer;
use crate::protocol::access::AccessPolicy;
use crate::protocol::connection::{grpc_incoming, serve_http, Transport};
use crate::protocol::grpc::InferenceService;
use crate::protocol::grpc_frames::InflateLayer;
use crate::protocol::grpc_web::GrpcWebLayer;
use crate::protocol::http::{self, HttpConfig};
use crate::protocol::in_flight::ResponsesInFlight;
use crate::protocol::limits::TransportLimits;
use crate::repository::{
    store, ControlMode, LoadOptions, ModelRepository, ModelStore, RepositoryOptions,
};
use crate::tls::{TlsError, TlsFiles, TlsListener};
use crate::trace::{TraceConfig, Tracer};
use axum::serve::ListenerExt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::codec::CompressionEncoding;
use tonic_health::ServingStatus;
use tracing::{info, warn};

/// Everything `run` needs besides its listeners.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server's name in server metadata (`--id`).
    pub server_id: String,
    /// Model repository roots (directories or `s3://`, `gs://`, `as://` URLs); a model name must
    /// be unique across them.
    pub model_repositories: Vec<PathBuf>,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Largest REST request body, in bytes, before and after decompression.
    pub http_max_input_bytes: usize,
    /// How long in-flight requests may run after shutdown starts.
    pub exit_timeout: Duration,
    /// `--exit-on-error`: stop (with an error) when a model fails its start-up load.
    pub exit_on_error: bool,
    /// Most inference requests in flight at once, server-wide; 0 means no limit.
    pub max_inflight_requests: usize,
    /// What gRPC callers must present, per API group (`--grpc-restricted-protocol`, bearer token).
    pub grpc_access: AccessPolicy,
    /// What REST callers must present, per API group (`--http-restricted-api`, bearer token).
    pub http_access: AccessPolicy,
    /// Serve gRPC over TLS (`--grpc-use-ssl` and its files).
    pub grpc_tls: Option<TlsFiles>,
    /// Serve REST over TLS (`--http-use-ssl` and its files).
    pub http_tls: Option<TlsFiles>,
    /// HTTP/2 settings of the gRPC listener.
    pub grpc_transport: GrpcTransport,
    /// Timeouts, connection and decoding limits of every listener.
    pub limits: TransportLimits,
    /// Complete configs from the ONNX graph.
    pub auto_complete: bool,
    /// What auto-complete gives batchable models (`--backend-config default-max-batch-size`).
    pub default_max_batch_size: i32,
    /// `--model-config-name`: read `<model>/configs/<name>.pbtxt` where it exists.
    pub model_config_name: Option<String>,
    /// Models loaded at once at start-up and by a poll.
    pub load_threads: usize,
    /// Times a failed load is tried again.
    pub load_retries: u32,
    /// `--model-control-mode`.
    pub control_mode: ControlMode,
    /// `--load-model` names (explicit mode); `*` alone loads every model.
    pub load_models: Vec<String>,
    /// `--repository-poll-secs` (poll mode).
    pub poll_interval: Duration,
    /// `--strict-readiness`: ready only when every model that should be loaded is ready.
    pub strict_readiness: bool,
    /// `--load-on-demand`: a request for a model not loaded loads it (explicit mode).
    pub load_on_demand: bool,
    /// `--gpu-fallback-to-cpu`: KIND_GPU groups run on CPU when no GPU is usable.
    pub gpu_fallback_to_cpu: bool,
    /// `--allowed-op-library`: the custom-operator libraries models may load.
    pub op_libraries: crate::repository::op_library::AllowedOpLibraries,
    /// `--backend-directory`: where Python-based backends' `model.py` files live.
    pub backend_directory: std::path::PathBuf,
    /// `--adaptive-batching`: dynamic batchers take kiln's shortcuts unless a config says not to.
    pub adaptive_batching: bool,
    /// `--python-env-passthrough`: which environment variables Python stubs see (and
    /// `--python-env-root`: where their `EXECUTION_ENV_PATH` may be).
    pub python_env: crate::backend::python::StubEnvironment,
    /// `--allow-code-in-load-overrides`: a load's `file:` overrides may bring code.
    pub allow_code_in_load_overrides: bool,
    /// `--allow-sagemaker`: what SageMaker's `/invocations` runs.
    pub sagemaker: Option<http::sagemaker::SageMakerConfig>,
    /// `--allow-vertex-ai`: Vertex AI's routes and default model.
    pub vertex: Option<http::vertex::VertexConfig>,
    /// `--rate-limit=execution_count` with the `--rate-limit-resource` copies; `None`: off.
    pub rate_limit: Option<crate::scheduler::rate_limit::ResourceFlags>,
    /// What the metrics endpoint reports besides the per-model series.
    pub metrics: MetricsOptions,
    /// `--trace-config`: the start-up trace settings, and the collector in OpenTelemetry mode.
    pub trace: TraceConfig,
    /// `--cache-config`: the response cache, if any.
    pub response_cache: Option<CacheConfig>,
    /// `--console`: the status and documentation pages on the REST listener.
    pub console: bool,
    /// `--grpc-web`: gRPC-Web (and CORS) on the gRPC listener.
    pub grpc_web: crate::protocol::grpc_web::GrpcWebOptions,
    /// `--allow-client-shm` and the objects clients may name (`--client-shm-*`).
    pub client_shm: crate::engine::shared_memory::ShmPolicy,
}

/// The gRPC listener's connection settings (Triton's `--grpc-*` flags).
#[derive(Debug, Clone)]
pub struct GrpcTransport {
    /// Interval of HTTP/2 keepalive pings.
    pub keepalive_time: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// Connections older than this are asked to go away.
    pub max_connection_age: Option<Duration>,
    /// How long an aged connection may finish its calls.
    pub max_connection_age_grace: Option<Duration>,
    /// Compress responses (gzip or deflate) for clients that accept it.
    pub compress_responses: bool,
}

/// What the metrics endpoint reports besides the per-model series.
#[derive(Debug, Clone)]
pub struct MetricsOptions {
    /// `--allow-gpu-metrics`: per-GPU gauges through NVML, when there is a GPU.
    pub gpu: bool,
    /// `--allow-cpu-metrics`: the machine's CPU gauges.
    pub cpu: bool,
    /// `--metrics-interval-ms`: how often those gauges are read.
    pub interval: Duration,
    /// `--metrics-config`: which latency series are published.
    pub config: crate::metrics::MetricsConfig,
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("HTTP server failed: {0}")]
    Http(#[from] std::io::Error),
    #[error("model loading failed: {0}")]
    Load(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("metrics endpoint: {0}")]
    Metrics(String),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
}

/// gRPC service names answered by the health service.
const HEALTH_SERVICES: &[&str] = &["", "inference.GRPCInferenceService"];

/// The sockets `run` serves on, bound by the caller (so tests can bind port 0).
#[derive(Debug)]
pub struct Listeners {
    /// `inference.GRPCInferenceService`, health and reflection; `None` with `--allow-grpc=false`.
    pub grpc: Option<TcpListener>,
    /// The KServe v2 / Triton REST API; `None` with `--allow-http=false`.
    pub http: Option<TcpListener>,
    /// Prometheus metrics; `None` when metrics are disabled.
    pub metrics: Option<TcpListener>,
    /// SageMaker's `/ping` and `/invocations` (`--allow-sagemaker`); `None` when off.
    pub sagemaker: Option<TcpListener>,
    /// Vertex AI's health and predict routes (`--allow-vertex-ai`); `None` when off.
    pub vertex: Option<TcpListener>,
    /// The OpenAI-compatible API (`--openai-port`); `None` when off.
    pub openai: Option<TcpListener>,
}

/// Serves on `listeners` until `shutdown` resolves, loading models in the background.
///
/// # Errors
/// [`ServerError`] when the configuration is inconsistent, a transport fails or loading cannot
/// run at all (a model that fails to load is not an error: it is reported not ready).
pub async fn run(
    config: Config,
    mut listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    // The metrics config, then the recorder, must exist before models register their series.
    crate::metrics::config::configure(config.metrics.config.clone());
    let metrics = listeners
        .metrics
        .take()
        .map(|listener| {
            crate::metrics::prometheus()
                .map(|handle| (listener, handle))
                .ok_or_else(|| ServerError::Metrics("another metrics recorder is installed".into()))
        })
        .transpose()?;
    let (repository, engine) = start_engine(&config)?;

    let (health, health_service) = tonic_health::server::health_reporter();
    for service in HEALTH_SERVICES {
        health
            .set_service_status(*service, ServingStatus::NotServing)
            .await;
    }
    let health_watch = tokio::spawn(follow_readiness(Arc::clone(&engine), health.clone()));

    // Every listener, metrics included, shares the connection slots and timeouts.
    let transport = Transport::new(config.limits.clone());
    crate::protocol::grpc_codec::set_max_decode_bytes(config.limits.grpc_max_decode_bytes);
    // Vertex AI's `metrics` redirect renders the same text.
    let metrics_handle = metrics.as_ref().map(|(_, handle)| handle.clone());
    if let Some((listener, handle)) = metrics {
        serve_metrics(listener, handle, transport.clone())?;
        start_samplers(&config);
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for (protocol, policy) in [("gRPC", &config.grpc_access), ("HTTP", &config.http_access)] {
        for line in policy.describe() {
            info!("{protocol} access: {line}");
        }
    }
    let responses = ResponsesInFlight::default();
    let grpc_serve = match listeners.grpc.take() {
        Some(listener) => {
            let services = GrpcServices {
                inference: inference_service(&engine, &config),
                health: health_service,
            };
            serve_grpc(
                listener, &config, services, &responses, &transport, &stopped,
            )?
        }
        None => {
            info!("gRPC is off (--allow-grpc=false)");
            when_stopped(&stopped)
        }
    };
    let listening = Listening {
        config: &config,
        engine: &engine,
        responses: &responses,
        transport: &transport,
        stopped: &stopped,
        // One budget for every REST listener's inflated bodies.
        inflate_budget: http::body::InflateBudget::new(config.limits.http_max_inflated_bytes),
    };
    let [http_serve, sagemaker_serve, vertex_serve, openai_serve] =
        listening.serve_http(listeners, metrics_handle)?;
    let (startup_failed, mut failed) = tokio::sync::oneshot::channel();
    let lifecycle = tokio::spawn(manage_models(
        repository,
        config.poll_interval,
        config.exit_on_error.then_some(startup_failed),
    ));
    let servers = async {
        tokio::try_join!(
            grpc_serve,
            http_serve,
            sagemaker_serve,
            vertex_serve,
            openai_serve
        )
        .map(|_| ())
    };
    tokio::pin!(servers);
    let mut outcome = Ok(());
    tokio::select! {
        result = &mut servers => {
            engine.tracer().flush();
            return result;
        }
        () = shutdown => {}
        Ok(failures) = &mut failed => {
            outcome = Err(ServerError::Load(format!(
                "failed to load all models (--exit-on-error): {}",
                failures.join("; ")
            )));
        }
    }
    info!(
        "shutting down: waiting up to {:?} for in-flight requests",
        config.exit_timeout
    );
    lifecycle.abort();
    health_watch.abort();
    let shutdown = Shutdown {
        engine: &engine,
        responses: &responses,
        health: &health,
        stop: &stop,
    };
    let result = shutdown.drain(servers, config.exit_timeout).await;
    // Traces still held by their settings (all of them, without a log frequency).
    engine.tracer().flush();
    outcome.and(result)
}

/// Opens the model repository and the engine over it, which Python models call back into.
///
/// # Errors
/// A repository that cannot be opened or a trace setting that cannot be followed.
fn start_engine(config: &Config) -> Result<(Arc<ModelRepository>, Arc<Engine>), ServerError> {
    let repository = Arc::new(open_repository(config)?);
    let engine = Arc::new(
        Engine::new(Arc::clone(&repository), config.strict_readiness)
            .with_server_id(config.server_id.clone())
            .with_max_in_flight(config.max_inflight_requests)
            .with_tracer(tracer(&config.trace)?)
            .with_response_cache(config.response_cache)
            .with_client_shm(config.client_shm.clone())
            .with_load_on_demand(config.load_on_demand),
    );
    python_calls::connect(&engine);
    Ok((repository, engine))
}

/// Starts the GPU and CPU samplers the metrics config asks for.
fn start_samplers(config: &Config) {
    if config.metrics.gpu {
        crate::metrics::gpu::start(config.metrics.interval);
    }
    if config.metrics.cpu {
        crate::metrics::cpu::start(config.metrics.interval);
    }
}

/// What the HTTP listeners' serving shares: the engine, the connection slots and timeouts, the
/// responses in flight that shutdown drains, and the signal that closes them.
struct Listening<'a> {
    config: &'a Config,
    engine: &'a Arc<Engine>,
    responses: &'a ResponsesInFlight,
    transport: &'a Transport,
    stopped: &'a tokio::sync::watch::Receiver<bool>,
    /// What compressed REST bodies may take once inflated, shared by every REST listener.
    inflate_budget: Arc<http::body::InflateBudget>,
}

impl Listening<'_> {
    fn http_config(&self) -> HttpConfig {
        HttpConfig {
            max_input_bytes: self.config.http_max_input_bytes,
            body_timeout: self.config.limits.body_timeout,
            access: Arc::new(self.config.http_access.clone()),
            console: self.config.console,
            inflate_budget: Arc::clone(&self.inflate_budget),
        }
    }

    /// Serves REST and the cloud services (SageMaker, Vertex AI, OpenAI-compatible) on their
    /// `listeners`, each a future that resolves when stopped (at once when it is off); Vertex
    /// AI's `metrics` redirect renders `metrics`' text.
    ///
    /// # Errors
    /// A listener whose address or TLS cannot be set up.
    fn serve_http(
        &self,
        listeners: Listeners,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> Result<[Serving; 4], ServerError> {
        let (config, engine) = (self.config, self.engine);
        let http_serve = match listeners.http {
            Some(listener) => {
                let router = http::router(Arc::clone(engine), self.http_config())
                    .layer(self.responses.clone());
                let (tls, transport) = (config.http_tls.as_ref(), self.transport.clone());
                serve_rest(listener, router, tls, self.stopped, transport, "")?
            }
            None => {
                info!("HTTP is off (--allow-http=false)");
                when_stopped(self.stopped)
            }
        };
        let sagemaker_serve = self.serve_cloud(
            listeners.sagemaker,
            config.sagemaker.clone().map(|sagemaker| {
                http::sagemaker::router(Arc::clone(engine), self.http_config(), sagemaker)
            }),
            "Sagemaker",
        )?;
        let vertex_serve = self.serve_cloud(
            listeners.vertex,
            config.vertex.clone().map(|vertex| {
                let rest = http::router(Arc::clone(engine), self.http_config());
                let engine = Arc::clone(engine);
                http::vertex::router(engine, self.http_config(), rest, metrics, vertex)
            }),
            "Vertex AI",
        )?;
        let openai_serve = self.serve_cloud(
            listeners.openai,
            Some(http::openai::router(Arc::clone(engine), self.http_config())),
            "OpenAI-compatible",
        )?;
        Ok([http_serve, sagemaker_serve, vertex_serve, openai_serve])
    }

    /// A cloud service: an HTTP listener of its own, over the same engine, with REST's TLS.
    fn serve_cloud(
        &self,
        listener: Option<TcpListener>,
        router: Option<axum::Router>,
        what: &str,
    ) -> Result<Serving, ServerError> {
        let (Some(listener), Some(router)) = (listener, router) else {
            return Ok(when_stopped(self.stopped));
        };
        let router = router.layer(self.responses.clone());
        let tls = self.config.http_tls.as_ref();
        serve_rest(
            listener,
            router,
            tls,
            self.stopped,
            self.transport.clone(),
            what,
        )
    }
}

/// One listener's serving future.
type Serving = std::pin::Pin<Box<dyn Future<Output = Result<(), ServerError>> + Send>>;

/// Resolves once shutdown tells the listeners to close.
fn stopped_signal(stopped: &tokio::sync::watch::Receiver<bool>) -> impl Future<Output = ()> {
    let mut stopped = stopped.clone();
    async move {
        let _ = stopped.wait_for(|s| *s).await;
    }
}

/// The stand-in for a listener that is turned off: it finishes when the others are told to stop.
fn when_stopped(stopped: &tokio::sync::watch::Receiver<bool>) -> Serving {
    let stopped = stopped_signal(stopped);
    Box::pin(async move {
        stopped.await;
        Ok(())
    })
}

/// The inference service with its message limits and compression.
fn inference_service(
    engine: &Arc<Engine>,
    config: &Config,
) -> GrpcInferenceServiceServer<InferenceService> {
    let inference = GrpcInferenceServiceServer::new(InferenceService::new(Arc::clone(engine)))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    // Responses stay uncompressed unless asked (Triton's default too): gRPC clients advertise
    // gzip by default, and compressing every response costs CPU that inference needs. When
    // asked, tonic picks gzip or deflate by the client's preference, at one level.
    if config.grpc_transport.compress_responses {
        inference
            .send_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Deflate)
    } else {
        inference
    }
}

/// What the gRPC listener serves besides reflection.
struct GrpcServices<H> {
    inference: GrpcInferenceServiceServer<InferenceService>,
    health: tonic_health::pb::health_server::HealthServer<H>,
}

/// Serves the inference, health and reflection services on `listener`, with the configured
/// transport settings, limits, TLS and access policy.
fn serve_grpc<H: tonic_health::pb::health_server::Health>(
    listener: TcpListener,
    config: &Config,
    services: GrpcServices<H>,
    responses: &ResponsesInFlight,
    connections: &Transport,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<Serving, ServerError> {
    let address = listener.local_addr()?;
    let incoming = grpc_incoming(listener, connections);
    let transport = &config.grpc_transport;
    let limits = &config.limits;
    // tonic leaves the stream count unbounded and turns hyper's limit on locally reset streams
    // off unless told.
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(transport.keepalive_time))
        .http2_keepalive_timeout(Some(transport.keepalive_timeout))
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(limits.http2_max_pending_reset_streams))
        .http2_max_local_error_reset_streams(Some(limits.http2_max_local_error_reset_streams));
    if let Some(age) = transport.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(grace) = transport.max_connection_age_grace {
        builder = builder.max_connection_age_grace(grace);
    }
    if let Some(files) = &config.grpc_tls {
        builder = builder.tls_config(files.grpc_config()?)?;
        info!("gRPC uses TLS{}", client_certificates(files));
    }
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let inflate = InflateLayer {
        max_wire: config.max_message_bytes,
        max_decompressed: limits.grpc_max_decompressed_bytes,
    };
    let serving = builder
        .accept_http1(config.grpc_web.enabled)
        .layer(GrpcWebLayer::new(&config.grpc_web))
        .layer(responses.clone())
        .layer(GrpcAccessLayer::new(Arc::new(config.grpc_access.clone())))
        .layer(inflate)
        .add_service(services.inference)
        .add_service(services.health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .serve_with_incoming_shutdown(incoming, stopped_signal(stopped));
    info!("Started GRPCInferenceService at {address}");
    Ok(Box::pin(
        async move { serving.await.map_err(ServerError::from) },
    ))
}

/// Serves a REST router on `listener`, over TLS when configured: kiln's REST API (`what` empty)
/// or a cloud service's (SageMaker, Vertex AI, OpenAI), which takes REST's certificates (and
/// client certificates): these services run inference too, so they must not be a plaintext way
/// around `--http-use-ssl`.
fn serve_rest(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<&TlsFiles>,
    stopped: &tokio::sync::watch::Receiver<bool>,
    transport: Transport,
    what: &str,
) -> Result<Serving, ServerError> {
    let address = listener.local_addr()?;
    let router = http::with_nosniff(router);
    let stop = stopped_signal(stopped);
    let serving: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match tls {
        Some(files) => {
            let listener = TlsListener::new(listener, files.server_config()?)?;
            let service = if what.is_empty() { "HTTP" } else { what };
            info!("{service} uses TLS{}", client_certificates(files));
            Box::pin(serve_http(listener, router, stop, transport))
        }
        None => {
            let listener = listener.tap_io(|stream| {
                if let Err(e) = stream.set_nodelay(true) {
                    warn!("cannot set TCP_NODELAY on an HTTP connection: {e}");
                }
            });
            Box::pin(serve_http(listener, router, stop, transport))
        }
    };
    let prefix = if what.is_empty() {
        String::new()
    } else {
        format!("{what} ")
    };
    info!("Started {prefix}HTTPService at {address}");
    Ok(Box::pin(async move {
        serving.await;
        Ok(())
    }))
}

fn client_certificates(files: &TlsFiles) -> &'static str {
    if files.mutual {
        " with client certificates"
    } else {
        ""
    }
}

/// How long closing listeners and idle connections may take once nothing is in flight.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// What graceful shutdown acts on.
struct Shutdown<'a> {
    engine: &'a Engine,
    responses: &'a ResponsesInFlight,
    health: &'a tonic_health::server::HealthReporter,
    stop: &'a tokio::sync::watch::Sender<bool>,
}

impl Shutdown<'_> {
    /// Graceful shutdown, as Triton does it: readiness goes false and new inference requests are
    /// answered UNAVAILABLE "Server exiting" at once, while the listeners stay open (so probes and
    /// clients get clean answers, not refused connections); admitted and queued requests finish
    /// and every response is sent in full; only then do the listeners and connections close.
    /// Nothing is cut off unless the exit timeout passes first.
    async fn drain(
        &self,
        mut servers: std::pin::Pin<&mut impl Future<Output = Result<(), ServerError>>>,
        exit_timeout: Duration,
    ) -> Result<(), ServerError> {
        let deadline = tokio::time::Instant::now() + exit_timeout;
        self.engine.begin_shutdown();
        for service in HEALTH_SERVICES {
            self.health
                .set_service_status(*service, ServingStatus::NotServing)
                .await;
        }
        let drained = async {
            while self.engine.in_flight() > 0 || self.responses.count() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            result = &mut servers => return result,
            finished = tokio::time::timeout_at(deadline, drained) => if finished.is_err() {
                warn!(
                    "exit timeout reached with {} requests and {} responses in flight",
                    self.engine.in_flight(),
                    self.responses.count()
                );
                return Ok(());
            },
        }
        info!("every request answered; closing connections");
        let _ = self.stop.send(true);
        // Idle keep-alive connections may outlive the grace: they carry nothing.
        let close_by = deadline.min(tokio::time::Instant::now() + CLOSE_GRACE);
        tokio::time::timeout_at(close_by, servers)
            .await
            .unwrap_or(Ok(()))
    }
}

/// Traces to files, or (OpenTelemetry mode) to a collector through a started exporter.
fn tracer(config: &TraceConfig) -> Result<Tracer, ServerError> {
    let exporter = config
        .otel
        .clone()
        .map(crate::trace::otel::Exporter::start)
        .transpose()
        .map_err(|e| {
            ServerError::Config(format!("cannot start the OpenTelemetry exporter: {e}"))
        })?;
    Ok(Tracer::with_exporter(config.settings.clone(), exporter))
}

/// The repository over the configured roots, checked against the control mode's rules.
fn open_repository(config: &Config) -> Result<ModelRepository, ServerError> {
    let wildcard = config.load_models.iter().any(|m| m == "*");
    if wildcard && config.load_models.len() > 1 {
        return Err(ServerError::Config(
            "Wildcard model name '*' must be the ONLY startup model if specified at all.".into(),
        ));
    }
    if config.control_mode != ControlMode::Explicit && !config.load_models.is_empty() {
        warn!("--load-model is only used with --model-control-mode=explicit; ignoring it");
    }
    if config.control_mode == ControlMode::Poll && config.poll_interval.is_zero() {
        return Err(ServerError::Config(
            "--repository-poll-secs must be greater than 0 in poll mode".into(),
        ));
    }
    let stores: Vec<Box<dyn ModelStore>> = config
        .model_repositories
        .iter()
        .map(|location| store::open(location))
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let options = RepositoryOptions {
        mode: config.control_mode,
        startup_models: config.load_models.clone(),
        load: LoadOptions {
            auto_complete: config.auto_complete,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            gpu_fallback_to_cpu: config.gpu_fallback_to_cpu,
            op_libraries: config.op_libraries.clone(),
            backend_directory: config.backend_directory.clone(),
            adaptive_batching: config.adaptive_batching,
            python_env: config.python_env.clone(),
            allow_code_in_overrides: config.allow_code_in_load_overrides,
            response_cache: config.response_cache.is_some(),
            default_max_batch_size: config.default_max_batch_size,
            config_name: config.model_config_name.clone(),
            rate_limiter: config
                .rate_limit
                .clone()
                .map(|flags| Arc::new(crate::scheduler::rate_limit::RateLimiter::new(flags))),
            python_calls: crate::backend::python::ModelCaller::default(),
        },
        load_threads: config.load_threads,
        load_retries: config.load_retries,
        load_on_demand: config.load_on_demand,
    };
    ModelRepository::new(stores, options).map_err(|e| ServerError::Load(e.to_string()))
}

/// Runs the start-up load, then (poll mode) a poll every `interval`, each on a blocking thread.
/// With `exit_on_error`, the start-up load's failures (if any) are sent there instead.
async fn manage_models(
    repository: Arc<ModelRepository>,
    interval: Duration,
    exit_on_error: Option<tokio::sync::oneshot::Sender<Vec<String>>>,
) {
    let startup = Arc::clone(&repository);
    let failures = match tokio::task::spawn_blocking(move || startup.load_startup()).await {
        Ok(failures) => failures,
        Err(e) => {
            warn!("start-up model loading stopped: {e}");
            return;
        }
    };
    if let Some(exit) = exit_on_error {
        if !failures.is_empty() {
            let _ = exit.send(failures);
            return;
        }
    }
    if repository.mode() != ControlMode::Poll {
        return;
    }
    loop {
        tokio::time::sleep(interval).await;
        let polling = Arc::clone(&repository);
        if let Err(e) = tokio::task::spawn_blocking(move || polling.poll()).await {
            warn!("repository poll failed: {e}");
        }
    }
}

/// Keeps the gRPC health service in step with readiness: re-evaluated on every model change.
async fn follow_readiness(engine: Arc<Engine>, health: tonic_health::server::HealthReporter) {
    let mut changes = engine.repository().subscribe();
    let mut last = Some(false); // run() starts the health service at NOT_SERVING
    loop {
        let ready = engine.is_ready();
        if last != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in HEALTH_SERVICES {
                health.set_service_status(*service, status).await;
            }
            info!(ready, "server readiness changed");
            last = Some(ready);
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Serves Prometheus metrics at `/metrics` (and `/metrics/`, as Triton) until the process ends,
/// with the other listeners' connection limits.
fn serve_metrics(
    listener: TcpListener,
    handle: metrics_exporter_prometheus::PrometheusHandle,
    transport: Transport,
) -> Result<(), ServerError> {
    let address = listener
        .local_addr()
        .map_err(|e| ServerError::Metrics(e.to_string()))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let render = move || {
        let handle = handle.clone();
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; charset=utf-8",
                )],
                crate::metrics::render(&handle),
            )
        }
    };
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(render.clone()))
        .route("/metrics/", axum::routing::get(render));
    info!("Started Metrics Service at {address}");
    tokio::spawn(serve_http(listener, app, std::future::pending(), transport));
    Ok(())
}
