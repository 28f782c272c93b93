//! `inference.GRPCInferenceService` over the engine. Each RPC decodes its message, calls the
//! engine, and maps an engine [`Error`] to a gRPC status in exactly one place ([`status`]).

use super::codec::{request_from_wire, response_to_wire};
use super::decoupled;
use super::in_flight::Arrived;
use super::lifecycle::Lifecycle;
use crate::core::Error;
use crate::engine::{shared_memory, Answers, Engine, LoadParameter, Stage, Target};
use crate::logging::{self, LogFormat, LogUpdate};
use crate::trace::{Trace, TraceUpdate};

use crate::proto::inference::{
    grpc_inference_service_server::GrpcInferenceService, model_metadata_response::TensorMetadata,
    repository_index_response::ModelIndex, *,
};
use futures_util::stream::{FuturesOrdered, StreamExt};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send + 'static>>;
type RpcResult<T> = Result<Response<T>, Status>;

/// The one mapping from engine errors to gRPC status codes (Triton's table).
pub fn status(error: Error) -> Status {
    match error {
        Error::InvalidArgument(m) => Status::invalid_argument(m),
        Error::NotFound(m) => Status::not_found(m),
        Error::AlreadyExists(m) => Status::already_exists(m),
        Error::Unavailable(m) => Status::unavailable(m),
        Error::ResourceExhausted(m) => Status::resource_exhausted(m),
        Error::DeadlineExceeded(m) => Status::deadline_exceeded(m),
        Error::Unsupported(m) => Status::unimplemented(m),
        Error::Internal(m) => Status::internal(m),
    }
}

/// The deadline a call's `grpc-timeout` header sets, if it has a valid one. It is moved slightly
/// earlier than the header says, so that a request still queued is answered DEADLINE_EXCEEDED by
/// the scheduler before the transport's own timer (started when the headers arrived) cancels the
/// call.
fn grpc_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Instant> {
    let timeout = parse_grpc_timeout(metadata.get("grpc-timeout")?.to_str().ok()?)?;
    let margin = (timeout / 10).min(Duration::from_millis(5));
    Instant::now().checked_add(timeout - margin)
}

/// Parses gRPC's `grpc-timeout` value: at most 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Triton answers UNSUPPORTED for any named repository (a KServe-python client's model name
/// lands in that field, see WIRE.md §a.4).
fn repository_name_unsupported() -> Status {
    Status::unimplemented("'repository_name' specification is not supported")
}

/// A repository parameter as the engine takes it; one without a value is refused.
fn load_parameter(key: &str, value: ModelRepositoryParameter) -> Result<LoadParameter, Error> {
    use model_repository_parameter::ParameterChoice;
    match value.parameter_choice {
        Some(ParameterChoice::BoolParam(v)) => Ok(LoadParameter::Bool(v)),
        Some(ParameterChoice::Int64Param(v)) => Ok(LoadParameter::Int64(v)),
        Some(ParameterChoice::StringParam(v)) => Ok(LoadParameter::String(v)),
        Some(ParameterChoice::BytesParam(v)) => Ok(LoadParameter::Bytes(v)),
        None => Err(crate::invalid_arg!("parameter '{key}' has no value")),
    }
}

/// The update a `LogSettings` request asks for, with Triton's errors for a value of the wrong
/// kind; `log_file` cannot change at run time.
fn log_update(request: LogSettingsRequest) -> Result<LogUpdate, Error> {
    use log_settings_request::setting_value::ParameterChoice;
    let settings = request.settings;
    if settings.contains_key("log_file") {
        return Err(Error::Unsupported(logging::FILE_NOT_UPDATABLE.into()));
    }
    let choice = |key: &str| settings.get(key).map(|v| v.parameter_choice.as_ref());
    let flag = |key: &str| match choice(key) {
        None => Ok(None),
        Some(Some(ParameterChoice::BoolParam(v))) => Ok(Some(*v)),
        Some(_) => Err(crate::invalid_arg!("expect boolean for '{key}'")),
    };
    Ok(LogUpdate {
        info: flag("log_info")?,
        warning: flag("log_warning")?,
        error: flag("log_error")?,
        verbose_level: match choice("log_verbose_level") {
            None => None,
            Some(Some(ParameterChoice::Uint32Param(v))) => Some(*v),
            Some(_) => return Err(crate::invalid_arg!("expect int32 for 'log_verbose_level'")),
        },
        format: match choice("log_format") {
            None => None,
            Some(Some(ParameterChoice::StringParam(name))) => {
                Some(LogFormat::parse(name).ok_or_else(|| {
                    crate::invalid_arg!("invalid argument for --log_format, got: {name}")
                })?)
            }
            Some(_) => return Err(crate::invalid_arg!("expect string for 'log_format'")),
        },
    })
}

/// The caller's W3C trace context (`traceparent` metadata), for OpenTelemetry traces.
fn traceparent(metadata: &tonic::metadata::MetadataMap) -> Option<Arc<str>> {
    metadata
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(Arc::from)
}

/// Requests of one stream that may run at the same time, decoupled ones included. Past it the
/// stream is not read (HTTP/2 flow control then holds the client back) until one finishes: a
/// client that sends requests and never reads their responses holds this many, not more.
const STREAM_CONCURRENCY: usize = 64;

/// When the request reached the server (see [`Arrived`]); now if it does not say.
fn arrived<T>(request: &Request<T>) -> Instant {
    request
        .extensions()
        .get::<Arrived>()
        .map_or_else(Instant::now, |arrived| arrived.0)
}

/// One stream request's answer, as Triton 2.51 writes it: the response flagged final, or its
/// error in `error_message` with the request's id (and, when the model failed it, the model's
/// name and the final flag) so that the client can match it; with the request's trace.
/// `waited`: when the stream began waiting for the request. A model that was not loaded loads
/// first when the server loads models on demand; one that turns out to be decoupled then sends
/// its responses on `responses` itself, and there is no answer to send in order (`None`).
async fn stream_answer(
    engine: Arc<Engine>,
    target: Result<Target, Error>,
    wire: ModelInferRequest,
    deadline: Option<Instant>,
    (traceparent, waited): (Option<Arc<str>>, Instant),
    responses: decoupled::Responses,
) -> Option<(ModelStreamInferResponse, Option<Arc<Trace>>)> {
    let target = match target {
        Err(_) => {
            engine
                .target_loading(&wire.model_name, &wire.model_version)
                .await
        }
        target => target,
    };
    if let Some(target) = target
        .as_ref()
        .ok()
        .filter(|t| t.answers() != Answers::Once)
    {
        let answer = decoupled::answer(
            Arc::clone(&engine),
            target.clone(),
            wire,
            responses,
            traceparent.as_deref(),
            waited,
        );
        answer.await;
        return None;
    }
    let life = Lifecycle::grpc(&engine, &wire.model_name, traceparent.as_deref(), waited)
        .with_deadline(deadline);
    let id = wire.id.clone();
    let model_name = wire.model_name.clone();
    let admitted = life
        .admit(&engine)
        .and_then(|context| Ok((context, request_from_wire(wire)?)));
    let result = match admitted.and_then(|admitted| Ok((target?, admitted))) {
        Ok((target, (context, request))) => engine
            .infer_on(target, request, context)
            .await
            .map_err(|failed| (failed.stage(), failed.error)),
        Err(e) => Err((Stage::Refused, e)),
    };
    let result = life.answered(result);
    let flagged = |mut response: ModelInferResponse| {
        response.parameters.extend([decoupled::final_flag(true)]);
        Some(response)
    };
    let message = match result {
        Ok(response) => ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: flagged(response_to_wire(response)),
        },
        Err((Stage::Refused, e)) => decoupled::refused(id, &e),
        Err((Stage::Failed, e)) => ModelStreamInferResponse {
            error_message: e.message().to_string(),
            infer_response: flagged(ModelInferResponse {
                model_name,
                id,
                ..Default::default()
            }),
        },
    };
    Some((message, life.trace().cloned()))
}

/// The gRPC front end.
#[derive(Clone)]
pub struct InferenceService {
    engine: Arc<Engine>,
}

impl InferenceService {
    pub fn new(engine: Arc<Engine>) -> Self {
        InferenceService { engine }
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> RpcResult<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse {
            live: self.engine.is_live(),
        }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> RpcResult<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.engine.is_ready(),
        }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> RpcResult<ModelReadyResponse> {
        let request = request.into_inner();
        let ready = self.engine.model_ready(&request.name, &request.version);
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> RpcResult<ServerMetadataResponse> {
        let metadata = self.engine.server_metadata();
        Ok(Response::new(ServerMetadataResponse {
            name: metadata.name,
            version: metadata.version,
            extensions: metadata.extensions,
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> RpcResult<ModelMetadataResponse> {
        let request = request.into_inner();
        let metadata = self
            .engine
            .model_metadata(&request.name, &request.version)
            .await
            .map_err(status)?;
        let tensors = |list: Vec<crate::engine::TensorMetadata>| {
            list.into_iter()
                .map(|t| TensorMetadata {
                    name: t.name,
                    datatype: t.datatype,
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: metadata.name,
            versions: metadata.versions,
            platform: metadata.platform,
            inputs: tensors(metadata.inputs),
            outputs: tensors(metadata.outputs),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> RpcResult<ModelInferResponse> {
        let deadline = grpc_deadline(request.metadata());
        // Not copied while tracing is off: this is every unary request's path.
        let traceparent = self
            .engine
            .tracer()
            .is_active()
            .then(|| traceparent(request.metadata()))
            .flatten();
        let arrived = arrived(&request);
        let wire = request.into_inner();
        let life = Lifecycle::grpc(
            &self.engine,
            &wire.model_name,
            traceparent.as_deref(),
            arrived,
        )
        .with_deadline(deadline);
        // Admitted as it has arrived, before any work on it (REST admits at the same point).
        let context = life.admit(&self.engine).map_err(status)?;
        let request = request_from_wire(wire).map_err(status)?;
        let response = self.engine.infer(request, context).await;
        let response = match life.answered(response) {
            Ok(response) => response,
            Err(failed) => {
                // A status alone (trailers only): sent as it is handed over, so its send ends at
                // once.
                drop(life.sending());
                return Err(status(failed.error));
            }
        };
        let mut response = Response::new(response_to_wire(response));
        // The end recorded by the connection layer when the response has gone (`in_flight`).
        if let Some(sent) = life.sending() {
            response.extensions_mut().insert(sent);
        }
        Ok(response)
    }

    /// Runs the requests of a stream concurrently (up to [`STREAM_CONCURRENCY`] at a time, all
    /// kinds together) and answers them in request order, as Triton does for models that are not
    /// decoupled. A failed request is answered with `error_message` and the stream stays open;
    /// when the client goes away, its queued requests are cancelled. Requests to decoupled
    /// (generation) models run on their own and send their responses as they come
    /// ([`decoupled`]); the stream ends once the last of them has.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> RpcResult<BoxStream<ModelStreamInferResponse>> {
        let deadline = grpc_deadline(request.metadata());
        let traceparent = traceparent(request.metadata());
        // When the stream began waiting for its next message (for its trace's
        // GRPC_WAITREAD_START): at first, when the stream came; then when the last one was read.
        let mut waited = arrived(&request);
        let mut inbound = request.into_inner();
        let engine = Arc::clone(&self.engine);
        let (sender, receiver) = tokio::sync::mpsc::channel(STREAM_CONCURRENCY);
        tokio::spawn(async move {
            let mut running = FuturesOrdered::new();
            let mut decoupled_running = tokio::task::JoinSet::new();
            let mut reading = true;
            while reading || !running.is_empty() || !decoupled_running.is_empty() {
                let room = running.len() + decoupled_running.len() < STREAM_CONCURRENCY;
                tokio::select! {
                    message = inbound.next(), if reading && room => match message {
                        Some(Ok(wire)) => {
                            let waited = std::mem::replace(&mut waited, Instant::now());
                            // Looked up once: what answers once is answered in order.
                            match engine.target(&wire.model_name, &wire.model_version) {
                                Ok(target) if target.answers() != Answers::Once => {
                                    let answer = decoupled::answer(Arc::clone(&engine), target, wire, sender.clone(), traceparent.as_deref(), waited);
                                    decoupled_running.spawn(answer);
                                }
                                target => running.push_back(stream_answer(Arc::clone(&engine), target, wire, deadline, (traceparent.clone(), waited), sender.clone())),
                            }
                        }
                        _ => reading = false,
                    },
                    Some(answered) = running.next(), if !running.is_empty() => {
                        let Some((reply, trace)) = answered else { continue };
                        if !decoupled::deliver(&sender, reply, trace.as_ref()).await {
                            return;
                        }
                    }
                    Some(_) = decoupled_running.join_next(), if !decoupled_running.is_empty() => {}
                    () = sender.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(decoupled::outgoing(receiver))))
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> RpcResult<ModelConfigResponse> {
        let request = request.into_inner();
        let config = self
            .engine
            .model_config(&request.name, &request.version)
            .await
            .map_err(status)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some((*config).clone()),
        }))
    }

    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> RpcResult<ModelStatisticsResponse> {
        let request = request.into_inner();
        let model_stats = self
            .engine
            .model_statistics(&request.name, &request.version)
            .map_err(status)?;
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> RpcResult<RepositoryIndexResponse> {
        let request = request.into_inner();
        if !request.repository_name.is_empty() {
            return Err(repository_name_unsupported());
        }
        let models = self
            .engine
            .repository_index(request.ready)
            .into_iter()
            .map(|e| ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state,
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> RpcResult<RepositoryModelLoadResponse> {
        let request = request.into_inner();
        if !request.repository_name.is_empty() {
            return Err(repository_name_unsupported());
        }
        let parameters = request
            .parameters
            .into_iter()
            .map(|(key, value)| load_parameter(&key, value).map(|v| (key, v)))
            .collect::<Result<_, _>>()
            .map_err(status)?;
        self.engine
            .load_model(&request.model_name, parameters)
            .await
            .map_err(status)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> RpcResult<RepositoryModelUnloadResponse> {
        let request = request.into_inner();
        if !request.repository_name.is_empty() {
            return Err(repository_name_unsupported());
        }
        // `unload_dependents` unloads an ensemble's models too; other parameters are ignored.
        let dependents = request
            .parameters
            .get("unload_dependents")
            .is_some_and(|p| {
                matches!(
                    p.parameter_choice,
                    Some(model_repository_parameter::ParameterChoice::BoolParam(true))
                )
            });
        self.engine
            .unload_model(&request.model_name, dependents)
            .await
            .map_err(status)?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> RpcResult<SystemSharedMemoryStatusResponse> {
        let name = request.into_inner().name;
        let regions = self
            .engine
            .shared_memory()
            .status(&name)
            .map_err(status)?
            .into_iter()
            .map(|region| {
                let status = system_shared_memory_status_response::RegionStatus {
                    name: region.name.clone(),
                    key: region.key,
                    offset: region.offset,
                    byte_size: region.byte_size,
                };
                (region.name, status)
            })
            .collect();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> RpcResult<SystemSharedMemoryRegisterResponse> {
        let request = request.into_inner();
        self.engine
            .shared_memory()
            .register(
                &request.name,
                &request.key,
                request.offset,
                request.byte_size,
            )
            .map_err(status)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> RpcResult<SystemSharedMemoryUnregisterResponse> {
        self.engine
            .shared_memory()
            .unregister(&request.into_inner().name)
            .map_err(status)?;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<CudaSharedMemoryStatusRequest>,
    ) -> RpcResult<CudaSharedMemoryStatusResponse> {
        shared_memory::cuda_status(&request.into_inner().name).map_err(status)?;
        Ok(Response::new(CudaSharedMemoryStatusResponse::default()))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<CudaSharedMemoryRegisterRequest>,
    ) -> RpcResult<CudaSharedMemoryRegisterResponse> {
        Err(status(
            self.engine
                .shared_memory()
                .cuda_register(&request.into_inner().name),
        ))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> RpcResult<CudaSharedMemoryUnregisterResponse> {
        // No CUDA region is ever registered: nothing to do, as in Triton without GPUs.
        self.engine
            .shared_memory()
            .cuda_unregister()
            .map_err(status)?;
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    /// Applies the named settings (an empty value list clears one) and answers all of them.
    async fn trace_setting(
        &self,
        request: Request<TraceSettingRequest>,
    ) -> RpcResult<TraceSettingResponse> {
        let request = request.into_inner();
        let update = if request.settings.is_empty() {
            None
        } else {
            let mut update = TraceUpdate::default();
            // In name order, `trace_file` (refused) first, so that the error does not depend on
            // the map's order.
            let mut named: Vec<_> = request.settings.iter().collect();
            named.sort_by_key(|(key, _)| (key.as_str() != "trace_file", key.as_str()));
            for (key, value) in named {
                let values = (!value.value.is_empty()).then_some(value.value.as_slice());
                update.set(key, values).map_err(status)?;
            }
            Some(update)
        };
        let settings = self
            .engine
            .trace_settings(&request.model_name, update.as_ref())
            .map_err(status)?
            .report()
            .into_iter()
            .map(|(key, value)| {
                let value = trace_setting_response::SettingValue { value };
                (key.to_string(), value)
            })
            .collect();
        Ok(Response::new(TraceSettingResponse { settings }))
    }

    /// Checks every named setting before applying any, then answers all six.
    async fn log_settings(
        &self,
        request: Request<LogSettingsRequest>,
    ) -> RpcResult<LogSettingsResponse> {
        let update = log_update(request.into_inner()).map_err(status)?;
        let settings = logging::update(&update);
        let value = |choice| log_settings_response::SettingValue {
            parameter_choice: Some(choice),
        };
        use log_settings_response::setting_value::ParameterChoice as Out;
        let settings = [
            ("log_file", value(Out::StringParam(settings.file))),
            ("log_info", value(Out::BoolParam(settings.info))),
            ("log_warning", value(Out::BoolParam(settings.warning))),
            ("log_error", value(Out::BoolParam(settings.error))),
            (
                "log_verbose_level",
                value(Out::Uint32Param(settings.verbose_level)),
            ),
            (
                "log_format",
                value(Out::StringParam(settings.format.name().into())),
            ),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect();
        Ok(Response::new(LogSettingsResponse { settings }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5M"), Some(Duration::from_secs(300)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "123456789S", "10x", "-1S", "1.5S", "é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
