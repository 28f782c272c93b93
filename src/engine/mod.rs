//! The façade both protocols call: model and version lookup, request validation, execution on the
//! model's instances, and the shaping of the response. Errors leave here as [`Error`] with
//! Triton's texts; each protocol maps them to its status codes once.

mod admission;
mod cache;
mod classification;
mod embed;
mod ensemble;
mod ensemble_stream;
pub mod generate;
mod lookup;
pub mod raw_input;
mod response;
pub mod shared_memory;
mod status;
mod stream;
mod traces;
// Requests are checked against their model's inputs and outputs where warmup samples are too,
// in the repository, which knows them; `engine::validate` stays their path.
pub use crate::repository::validate;
use crate::repository::visit_order::{self, visit_order};

use crate::backend::BackendError;
use crate::core::{Error, InferRequest, InferResponse};
use crate::invalid_arg;
use crate::metrics::{FailureReason, ModelStats};
use crate::proto::inference::{ModelConfig, ModelStatistics};
use crate::repository::sequence::SequenceFlags;
use crate::repository::{Executor, Model, ModelRepository};
use crate::scheduler::{self, ScheduleError};
use crate::trace::{Activity, TensorActivity, TraceSettings, Tracer};
pub use admission::Admission;
pub use cache::CacheConfig;
use cache::ResponseCache;
pub use embed::{Embeddings, MAX_TEXTS};
use shared_memory::tensors;
use shared_memory::SharedMemory;
pub use status::VersionLatencies;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use stream::StreamedResponse;

pub use crate::repository::{IndexEntry, LoadParameter};

/// Protocol extensions kiln implements, as reported by server metadata, in Triton's order. Clients
/// act on this list: perf_analyzer, for one, reads the server's statistics only when it names
/// `statistics`. Not listed because not served: `cuda_shared_memory`.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    // Stateful models: `sequence_batching`, the `sequence_id` / `sequence_start` /
    // `sequence_end` request parameters.
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    // The `priority` and `timeout` request parameters, with the config's queue policies.
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    // ModelStatistics and `/v2/models[/{m}[/versions/{v}]]/stats`.
    "statistics",
    // Request traces (`--trace-config`, TraceSetting and `/v2[/models/{m}]/trace/setting`).
    "trace",
    // Log settings at run time (LogSettings and `/v2/logging`).
    "logging",
];

/// Server name and version for `ServerMetadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMetadata {
    pub name: String,
    pub version: String,
    pub extensions: Vec<String>,
}

/// One input or output in model metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: String,
    /// Includes a leading -1 for models that batch.
    pub shape: Vec<i64>,
}

/// `ModelMetadata` contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

/// The inference engine: serves from the repository's current snapshot.
pub struct Engine {
    repository: Arc<ModelRepository>,
    /// `--strict-readiness`: ready only when every expected model serves (otherwise ready once
    /// the start-up load has run).
    strict_readiness: bool,
    /// Inference requests between admission and response, for the admission limit and for
    /// graceful shutdown.
    in_flight: Arc<AtomicUsize>,
    /// Most inference requests admitted at once, server-wide (`--max-inflight-requests`); 0 means
    /// no limit. Each model version may set its own, lower bound.
    max_in_flight: usize,
    /// Set when shutdown starts: the server reports not ready and refuses new requests while the
    /// admitted ones finish.
    exiting: AtomicBool,
    /// The system shared-memory regions clients registered.
    shared_memory: SharedMemory,
    /// Request tracing (`--trace-config`, the `trace` extension).
    tracer: Arc<Tracer>,
    /// The response cache (`--cache-config`), for the versions that enable it.
    cache: Option<ResponseCache>,
    /// The server's name in server metadata (`--id`).
    server_id: String,
    /// When the engine was made (the server started), for the status page's uptime.
    started: Instant,
}

impl Engine {
    pub fn new(repository: Arc<ModelRepository>, strict_readiness: bool) -> Engine {
        Engine {
            repository,
            strict_readiness,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: 0,
            exiting: AtomicBool::new(false),
            shared_memory: SharedMemory::default(),
            tracer: Arc::new(Tracer::new(TraceSettings::default())),
            cache: None,
            server_id: "kiln".to_string(),
            started: Instant::now(),
        }
    }

    /// Names the server `id` in server metadata (Triton's `--id`).
    pub fn with_server_id(mut self, id: String) -> Engine {
        self.server_id = id;
        self
    }

    /// Answers requests to models that enable it from a response cache of `config`'s size.
    pub fn with_response_cache(mut self, config: Option<CacheConfig>) -> Engine {
        self.cache = config.map(ResponseCache::new);
        self
    }

    /// The system shared-memory regions (register, status, unregister).
    pub fn shared_memory(&self) -> &SharedMemory {
        &self.shared_memory
    }

    /// The repository, for the server's start-up load, polling and readiness watch.
    pub fn repository(&self) -> &Arc<ModelRepository> {
        &self.repository
    }

    /// The process is up and answering.
    pub fn is_live(&self) -> bool {
        true
    }

    /// Strict (the default): the start-up load has run and every model that should be loaded
    /// serves. Otherwise: the start-up load has run. Never while shutting down.
    pub fn is_ready(&self) -> bool {
        if self.exiting.load(Ordering::SeqCst) {
            return false;
        }
        if self.strict_readiness {
            self.repository.all_expected_ready()
        } else {
            self.repository.started()
        }
    }

    pub fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.server_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }
    }

    /// Whether a model (or one version of it) is ready to serve. As in Triton this never fails:
    /// an unknown model, version or version string is simply not ready.
    pub fn model_ready(&self, name: &str, version: &str) -> bool {
        self.resolve(name, version)
            .is_ok_and(|(_, serving)| self.serves(&serving, 0))
    }

    /// Model metadata for a model, or one version of it.
    ///
    /// # Errors
    /// NOT_FOUND / UNAVAILABLE / INVALID_ARGUMENT, as for inference, when the model or version is
    /// unknown, not ready, or the version string is not a number.
    pub fn model_metadata(&self, name: &str, version: &str) -> Result<ModelMetadata, Error> {
        let (model, serving) = self.resolve(name, version)?;
        let versions = if version.is_empty() {
            model.versions.keys().map(i64::to_string).collect()
        } else {
            vec![serving.version.to_string()]
        };
        let batched = serving.io.max_batch_size > 0;
        let describe = |spec: &crate::repository::TensorSpec| TensorMetadata {
            name: spec.name.clone(),
            datatype: spec.datatype.as_wire().to_string(),
            shape: batched
                .then_some(-1)
                .into_iter()
                .chain(spec.dims.iter().copied())
                .collect(),
        };
        Ok(ModelMetadata {
            name: model.name.clone(),
            versions,
            // A backend model without a platform (a Python model) names its backend, as in
            // Triton.
            platform: if model.config.platform.is_empty() {
                model.config.backend.clone()
            } else {
                model.config.platform.clone()
            },
            inputs: serving.io.inputs.iter().map(describe).collect(),
            outputs: serving.io.outputs.iter().map(describe).collect(),
        })
    }

    /// The effective (normalised, auto-completed) config.
    ///
    /// # Errors
    /// As [`Engine::model_metadata`].
    pub fn model_config(&self, name: &str, version: &str) -> Result<Arc<ModelConfig>, Error> {
        let (model, serving) = self.resolve(name, version)?;
        // Triton's config of an ensemble says whether it is decoupled: whether a step is.
        if let (Executor::Ensemble(plan), None) =
            (&serving.executor, &model.config.model_transaction_policy)
        {
            let mut config = ModelConfig::clone(&model.config);
            config.model_transaction_policy =
                Some(crate::proto::inference::ModelTransactionPolicy {
                    decoupled: self.has_decoupled_step(plan, 0),
                });
            return Ok(Arc::new(config));
        }
        Ok(Arc::clone(&model.config))
    }

    /// Triton's statistics for every serving version of every model (`name` empty), of one model
    /// (`version` empty), or of one version.
    ///
    /// # Errors
    /// As [`Engine::model_metadata`] when a named model or version is not serving.
    pub fn model_statistics(
        &self,
        name: &str,
        version: &str,
    ) -> Result<Vec<ModelStatistics>, Error> {
        // Versions an ensemble's unserved step makes unavailable are left out, as Triton has
        // unloaded them.
        let serving_versions = |model: &Model| -> Vec<ModelStatistics> {
            model
                .versions
                .values()
                .filter(|v| self.serves(v, 0))
                .map(|v| v.stats.snapshot())
                .collect()
        };
        if name.is_empty() {
            return Ok(self
                .repository
                .snapshot()
                .values()
                .filter_map(|slot| slot.serving.as_deref())
                .flat_map(serving_versions)
                .collect());
        }
        // Triton looks the name up among the models with a ready version, in its words
        // (checked against 2.51).
        let snapshot = self.repository.snapshot();
        let model = snapshot
            .get(name)
            .and_then(|slot| slot.serving.as_deref())
            .filter(|model| model.versions.values().any(|v| self.serves(v, 0)))
            .ok_or_else(|| invalid_arg!("requested model '{name}' is not available"))?;
        if version.is_empty() {
            return Ok(serving_versions(model));
        }
        let serving = model
            .versions
            .get(&lookup::parse_version(version)?)
            .filter(|v| self.serves(v, 0))
            .ok_or_else(|| {
                invalid_arg!("requested model version is not available for model '{name}'")
            })?;
        Ok(vec![serving.stats.snapshot()])
    }

    /// Every model in the repository with the state of each known version. `ready_only` keeps
    /// only READY versions.
    pub fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let mut index = self.repository.index(false);
        // A loaded ensemble a step of which is not served is listed as Triton lists the ensemble
        // it unloaded with the step.
        let snapshot = self.repository.snapshot();
        for entry in &mut index {
            let serving = snapshot
                .get(&entry.name)
                .and_then(|slot| slot.serving.as_deref())
                .and_then(|model| model.versions.get(&entry.version.parse().ok()?));
            if entry.state == "READY" && serving.is_some_and(|v| !self.serves(v, 0)) {
                entry.state = "UNAVAILABLE".into();
                entry.reason = "unloaded".into();
            }
        }
        if ready_only {
            index.retain(|entry| entry.state == "READY");
        }
        index
    }

    /// Loads or reloads a model (explicit model-control mode), off the async runtime.
    ///
    /// # Errors
    /// As [`ModelRepository::load`].
    pub async fn load_model(
        &self,
        name: &str,
        parameters: BTreeMap<String, LoadParameter>,
    ) -> Result<(), Error> {
        let repository = Arc::clone(&self.repository);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || repository.load(&name, parameters))
            .await
            .map_err(|e| Error::Internal(format!("model load task failed: {e}")))?
    }

    /// Adds a model repository while running (Triton's RegisterModelRepository), off the async
    /// runtime (it lists the repository).
    ///
    /// # Errors
    /// As [`ModelRepository::register_store`].
    pub async fn register_repository(
        &self,
        store: Arc<dyn crate::repository::ModelStore>,
    ) -> Result<(), Error> {
        let repository = Arc::clone(&self.repository);
        tokio::task::spawn_blocking(move || repository.register_store(store))
            .await
            .map_err(|e| Error::Internal(format!("repository registration failed: {e}")))?
    }

    /// Removes a repository added with [`Engine::register_repository`].
    ///
    /// # Errors
    /// As [`ModelRepository::unregister_store`].
    pub fn unregister_repository(&self, location: &str) -> Result<(), Error> {
        self.repository.unregister_store(location)
    }

    /// Unloads a model (explicit model-control mode); with `unload_dependents`, an ensemble's
    /// models too.
    ///
    /// # Errors
    /// As [`ModelRepository::unload`].
    pub async fn unload_model(&self, name: &str, unload_dependents: bool) -> Result<(), Error> {
        let repository = Arc::clone(&self.repository);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || repository.unload(&name, unload_dependents))
            .await
            .map_err(|e| Error::Internal(format!("model unload task failed: {e}")))?
    }

    /// Admits and runs one inference request.
    ///
    /// # Errors
    /// Admission errors as [`Engine::admit`]; lookup errors as [`Engine::model_metadata`];
    /// INVALID_ARGUMENT for a request that does not fit the model; RESOURCE_EXHAUSTED when the
    /// model version is at its `max_inflight_requests`; INTERNAL when the model fails while running.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, Error> {
        self.infer_staged(request).await.map_err(|(error, _)| error)
    }

    /// Runs one inference request admitted earlier with [`Engine::admit`].
    ///
    /// # Errors
    /// As [`Engine::infer`], admission aside.
    pub async fn infer_admitted(
        &self,
        _admission: &Admission,
        request: InferRequest,
    ) -> Result<InferResponse, Error> {
        self.run(request, 0).await
    }

    /// Runs one request of a gRPC stream: on failure, also whether its model had it (and
    /// failed it) or it was refused before, which Triton's stream answers tell apart.
    ///
    /// # Errors
    /// As [`Engine::infer`], with [`Stage`].
    pub async fn infer_staged(
        &self,
        request: InferRequest,
    ) -> Result<InferResponse, (Error, Stage)> {
        let _admission = self.admit().map_err(|e| (e, Stage::Refused))?;
        self.run_staged(request, 0).await
    }

    /// Runs one request; `depth` counts the ensembles it is a step of.
    async fn run(&self, request: InferRequest, depth: usize) -> Result<InferResponse, Error> {
        self.run_staged(request, depth)
            .await
            .map_err(|(error, _)| error)
    }

    /// [`Engine::run`], telling where a failure happened.
    async fn run_staged(
        &self,
        mut request: InferRequest,
        depth: usize,
    ) -> Result<InferResponse, (Error, Stage)> {
        let arrived = Instant::now();
        let trace = request.trace.take();
        let (model, serving) = self
            .resolve(&request.model_name, &request.model_version)
            .map_err(|e| (e, Stage::Refused))?;
        if let Some(trace) = &trace {
            trace.describe(&model.name, serving.version, &request.id);
            trace.record(Activity::RequestStart, arrived);
        }
        let mut record = Recorder {
            stats: &serving.stats,
            arrived,
            finished: false,
        };
        let prefix = validate::request_prefix(&request.id);
        let memory = &self.shared_memory;
        let mut output_slots = tensors::OutputSlots::new();
        // A stateful model's request belongs to a sequence.
        let flags = serving
            .sequences
            .as_ref()
            .map(|sequences| sequences.flags(&request, &model.name))
            .transpose();
        let arrival = arrival(&serving.executor, &request);
        let scheduled = check_parameters(&request)
            .and_then(|()| flags.as_ref().map(|_| ()).map_err(Clone::clone))
            .and_then(|()| tensors::read_inputs(memory, &model.name, &prefix, &mut request))
            .and_then(|()| {
                output_slots = tensors::output_slots(memory, &request)?;
                validate::prepare_inputs(&model.name, &serving.io, &mut request)
            })
            // Refused before the model's scheduler had it: counted nowhere, as in Triton.
            .map_err(|e| (e, Counted::Nowhere))
            .inspect(|inputs| {
                if let Some(trace) = &trace {
                    trace.tensors(TensorActivity::QueueInput, inputs);
                }
            })
            .map(|inputs| queued(&request, validate::rows(&serving.io, &inputs), inputs));
        // The response cache, for versions that use it: a hit answers without running.
        let lookup = match (&scheduled, self.cache.as_ref().filter(|_| serving.cache)) {
            (Ok(job), Some(cache)) => {
                let started = Instant::now();
                let key = cache.key(&model.name, serving.version, &job.inputs);
                let hit = cache.get(key);
                Some((cache, key, hit, started))
            }
            _ => None,
        };
        // Parameters a Python model gave its response.
        let mut model_parameters = crate::core::Parameters::new();
        let result = match (scheduled, lookup, &serving.executor) {
            (Ok(_), Some((_, _, Some(outputs), started)), _) => {
                // Queued and answered, as Triton traces a hit: no compute.
                if let Some(trace) = &trace {
                    trace.record(Activity::QueueStart, started);
                    traces::record_outputs(trace, &request, &outputs);
                }
                Ok((
                    outputs.to_vec(),
                    Ran::Cached {
                        queue: started.duration_since(arrived),
                        lookup: started.elapsed(),
                    },
                ))
            }
            (Ok(mut job), lookup, Executor::Batched(scheduler)) => 'arm: {
                let looked = lookup.as_ref().map(|(.., started)| started.elapsed());
                let rows = job.rows;
                // A sequence's requests run one at a time, with the states its last one left.
                let sequence = flags.as_ref().ok().and_then(Option::as_ref);
                let turn =
                    match take_turn(&serving, sequence, rows, &model.name, &mut job.inputs).await {
                        Ok(turn) => turn,
                        // Its sequence refused it: counted nowhere, as in Triton.
                        Err(e) => break 'arm Err((e, Counted::Nowhere)),
                    };
                let mut ran = scheduler.submit(job).await.map_err(|e| {
                    let (error, reason) = schedule_error(e, &prefix, &model.name);
                    (error, Counted::from(reason))
                });
                if let Some((sequences, turn)) = turn {
                    if let Ok(outcome) = &mut ran {
                        sequences.finish(turn, &mut outcome.outputs);
                    }
                }
                if let (Some((cache, key, None, _)), Some(looked), Ok(outcome)) =
                    (lookup, looked, &ran)
                {
                    let stored = Instant::now();
                    cache.insert(key, Arc::from(outcome.outputs.clone()));
                    serving.stats.record_cache_miss(looked + stored.elapsed());
                }
                if let (Some(trace), Ok(outcome)) = (&trace, &ran) {
                    traces::record_outcome(trace, outcome);
                    traces::record_outputs(trace, &request, &outcome.outputs);
                }
                ran.map(|outcome| {
                    let ran = Ran::Executed {
                        rows,
                        timing: outcome.timing(),
                    };
                    (outcome.outputs, ran)
                })
            }
            (Ok(job), _, Executor::Ensemble(plan)) => {
                let rows = job.rows;
                if let Some(trace) = &trace {
                    trace.record(Activity::QueueStart, Instant::now());
                }
                let caller = (&request, trace.as_ref());
                let ran = self
                    .run_ensemble(&model.name, plan, &serving.io, job.inputs, caller, depth)
                    .await;
                if let (Some(trace), Ok(outputs)) = (&trace, &ran) {
                    traces::record_outputs(trace, &request, outputs);
                }
                ran.map(|outputs| (outputs, Ran::Composed { rows }))
                    .map_err(|e| (e, Counted::Failure(FailureReason::Other)))
            }
            (Ok(_), _, Executor::Python(python)) if python.decoupled() => Err((
                Error::Unsupported(format!(
                    "model '{}' is decoupled: use ModelStreamInfer",
                    model.name
                )),
                Counted::Nowhere,
            )),
            (Ok(mut job), lookup, Executor::Python(python)) => 'arm: {
                let looked = lookup.as_ref().map(|(.., started)| started.elapsed());
                let rows = job.rows;
                let asked_all = request.outputs.is_empty();
                // A sequence's requests run one at a time, in order, on one instance, with the
                // control inputs the config asks for; its state is the model's to keep.
                let sequence = flags.as_ref().ok().and_then(Option::as_ref);
                let turn =
                    match take_turn(&serving, sequence, rows, &model.name, &mut job.inputs).await {
                        Ok(turn) => turn,
                        // Its sequence refused it: counted nowhere, as in Triton.
                        Err(e) => break 'arm Err((e, Counted::Nowhere)),
                    };
                let sequence = sequence
                    .zip(turn.as_ref())
                    .map(|(flags, (_, turn))| python_sequence(flags, turn.slot()));
                let job = job.map(|inputs| crate::backend::python::Request {
                    id: request.id.clone(),
                    parameters: request.parameters.clone(),
                    outputs: request.outputs.iter().map(|o| o.name.clone()).collect(),
                    listed: python_listing(&arrival, &inputs),
                    inputs,
                    sequence,
                    trace: trace.clone(),
                });
                let executed = python.execute(job).await;
                if let (Some(trace), Ok(outcome)) = (&trace, &executed) {
                    traces::record_outcome(trace, outcome);
                }
                let mut ran = match executed {
                    Ok(outcome) => {
                        let timing = outcome.timing();
                        match outcome.outputs {
                            Ok(mut outputs) => match outputs.refused.take() {
                                Some(error) => {
                                    let ran = Ran::Executed { rows, timing };
                                    Err((error, Counted::Answered(ran)))
                                }
                                None => Ok((outputs, timing)),
                            },
                            Err(error) => Err((error, Counted::Failure(FailureReason::Backend))),
                        }
                    }
                    Err(error) => {
                        let (error, reason) = schedule_error(error, &prefix, &model.name);
                        Err((error, Counted::from(reason)))
                    }
                };
                if let Some((sequences, turn)) = turn {
                    if let Ok((outputs, ..)) = &mut ran {
                        sequences.finish(turn, &mut outputs.tensors);
                    }
                }
                if let (Some(trace), Ok((outputs, ..))) = (&trace, &ran) {
                    traces::record_outputs(trace, &request, &outputs.tensors);
                }
                // Cached: a response with every output (the model may leave out outputs a
                // request did not ask for) and no parameters of its own (the cache keeps
                // tensors only).
                if let (Some((cache, key, None, _)), Some(looked), Ok((outputs, ..)), true) =
                    (lookup, looked, &ran, asked_all)
                {
                    if outputs.parameters.is_empty() {
                        let stored = Instant::now();
                        cache.insert(key, Arc::from(outputs.tensors.clone()));
                        serving.stats.record_cache_miss(looked + stored.elapsed());
                    }
                }
                ran.map(|(outputs, timing)| {
                    let ran = Ran::Executed { rows, timing };
                    model_parameters = outputs.parameters;
                    (outputs.tensors, ran)
                })
            }
            (Ok(_), _, Executor::Generate(_)) => Err((
                Error::Unsupported(format!(
                    "model '{}' is decoupled: use ModelStreamInfer or the generate endpoints",
                    model.name
                )),
                Counted::Nowhere,
            )),
            (Err(failure), _, _) => Err(failure),
        };
        record.finished = true;
        let _end = trace.map(|trace| crate::trace::RecordOnDrop {
            trace,
            activity: Activity::RequestEnd,
        });
        let (outputs, ran) = match result {
            Ok(done) => done,
            Err((error, counted)) => {
                let total = arrived.elapsed();
                let stage = match counted {
                    Counted::Nowhere => Stage::Refused,
                    Counted::Failure(reason) => {
                        serving.stats.record_failure(total, reason);
                        // The model (or an ensemble's step) had it: its answer says so. A
                        // timeout in the queue or a cancellation is a refusal.
                        match reason {
                            FailureReason::Backend | FailureReason::Other => Stage::Failed,
                            FailureReason::Rejected | FailureReason::Canceled => Stage::Refused,
                        }
                    }
                    Counted::Answered(ran) => {
                        ran.record_success(&serving.stats, total);
                        Stage::Failed
                    }
                };
                return Err((error, stage));
            }
        };
        let answer =
            response::response(&model, &serving, request, outputs).and_then(|mut answer| {
                tensors::write_outputs(&output_slots, &mut answer)?;
                answer.parameters.extend(model_parameters);
                Ok(answer)
            });
        // The model answered: a success, even when its outputs cannot be written as asked (a
        // shared memory region too small), as Triton counts it.
        ran.record_success(&serving.stats, arrived.elapsed());
        answer.map_err(|e| (e, Stage::Failed))
    }

    /// Builds the request for Triton's raw binary HTTP request (`Inference-Header-Content-Length:
    /// 0`): the whole body is the data of the model's only input, whose shape follows from the
    /// data size (batch 1 when the model batches; at most one variable dimension; BYTES holds one
    /// element).
    ///
    /// # Errors
    /// Lookup errors as [`Engine::model_ready`]; INVALID_ARGUMENT when the model does not have
    /// exactly one input or the size cannot give a shape.
    pub fn raw_input_request(
        &self,
        name: &str,
        version: &str,
        data: bytes::Bytes,
    ) -> Result<InferRequest, Error> {
        let (model, serving) = self.resolve(name, version)?;
        let input = raw_input::raw_input(&model.name, &serving.io, data)?;
        Ok(InferRequest {
            model_name: name.to_string(),
            model_version: version.to_string(),
            inputs: vec![input],
            ..Default::default()
        })
    }
}

/// Where a failed request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Refused before its model had it: lookup, validation, admission, its sequence, the queue.
    Refused,
    /// Its model had it and failed it (or its outputs could not be answered).
    Failed,
}

/// How a request that failed counts in its model's statistics, as Triton counts it.
enum Counted {
    /// Refused before its model's scheduler had it: nowhere.
    Nowhere,
    /// A failure, for this reason.
    Failure(FailureReason),
    /// A success: its model answered it, with an error (a Python model's error response, which
    /// Triton's Python backend counts as a response sent).
    Answered(Ran),
}

impl From<Option<FailureReason>> for Counted {
    fn from(reason: Option<FailureReason>) -> Counted {
        reason.map_or(Counted::Nowhere, Counted::Failure)
    }
}

/// How a request got its outputs, for its statistics.
enum Ran {
    /// Its model ran it (in a batch, possibly).
    Executed {
        rows: usize,
        timing: crate::metrics::Timing,
    },
    /// The response cache held them; the request reached it after `queue` (checks, as Triton
    /// counts a hit's time queued) and finding them took `lookup`.
    Cached { queue: Duration, lookup: Duration },
    /// An ensemble's steps made them.
    Composed { rows: usize },
}

impl Ran {
    /// Statistics of a request answered in `total`.
    fn record_success(&self, stats: &ModelStats, total: Duration) {
        match self {
            Ran::Executed { rows, timing } => stats.record_success(*rows, total, *timing),
            Ran::Cached { queue, lookup } => stats.record_cache_hit(total, *queue, *lookup),
            // Triton counts an ensemble's request as one execution of its rows too.
            Ran::Composed { rows } => {
                stats.record_execution(*rows, Default::default(), None);
                stats.record_success(*rows, total, Default::default());
            }
        }
    }
}

/// Records a request whose caller stopped waiting as CANCELED.
struct Recorder<'a> {
    stats: &'a ModelStats,
    arrived: Instant,
    finished: bool,
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.stats
                .record_failure(self.arrived.elapsed(), FailureReason::Canceled);
        }
    }
}

/// `inputs` (`rows` of them) as the scheduler queues them, with the request's `priority` and
/// `timeout` parameters and its client's deadline.
fn queued<T>(request: &InferRequest, rows: usize, inputs: T) -> scheduler::Request<T> {
    scheduler::Request {
        inputs,
        rows,
        priority: unsigned_param(request, "priority"),
        timeout: unsigned_param(request, "timeout")
            .filter(|&t| t > 0)
            .map(Duration::from_micros),
        deadline: request.deadline,
    }
}

/// A non-negative integer request parameter (`priority`, `timeout`), from either integer kind.
fn unsigned_param(request: &InferRequest, key: &str) -> Option<u64> {
    request.parameters.get(key)?.as_unsigned()
}

/// Scheduler outcomes in Triton's words, with the failure reason for metrics: `None` for a
/// request refused as it was queued (a full queue, an overload), which Triton counts nowhere.
fn schedule_error(
    error: ScheduleError,
    prefix: &str,
    model: &str,
) -> (Error, Option<FailureReason>) {
    match error {
        ScheduleError::QueueFull => (Error::Unavailable(format!("{prefix}{error}")), None),
        // Triton says this one without the request's id.
        ScheduleError::Timeout => (
            Error::Unavailable(error.to_string()),
            Some(FailureReason::Rejected),
        ),
        ScheduleError::Overloaded(_) => (
            Error::ResourceExhausted(format!("{prefix}{error} for model '{model}'")),
            None,
        ),
        ScheduleError::Deadline => (
            Error::DeadlineExceeded(format!("{prefix}{error}")),
            Some(FailureReason::Rejected),
        ),
        ScheduleError::Backend(BackendError::Input(message)) => (
            invalid_arg!("{message} (model '{model}')"),
            Some(FailureReason::Other),
        ),
        ScheduleError::Backend(other) => (
            Error::Internal(other.to_string()),
            Some(FailureReason::Backend),
        ),
        ScheduleError::Stopped => (
            Error::Unavailable(format!("{prefix}{error}")),
            Some(FailureReason::Other),
        ),
    }
}

/// A stateful version's request takes its turn in its sequence (waiting for the one before),
/// its control inputs and states joining `inputs`; `None` for other versions.
///
/// # Errors
/// The sequence's refusal (see [`crate::repository::sequence::Sequences::begin`]).
async fn take_turn<'s>(
    serving: &'s crate::repository::ServingVersion,
    flags: Option<&SequenceFlags>,
    rows: usize,
    model: &str,
    inputs: &mut Vec<crate::core::Tensor>,
) -> Result<
    Option<(
        &'s Arc<crate::repository::sequence::Sequences>,
        crate::repository::sequence::Turn,
    )>,
    Error,
> {
    let (Some(sequences), Some(flags)) = (&serving.sequences, flags) else {
        return Ok(None);
    };
    let turn = sequences.begin(flags.clone(), rows, model).await?;
    inputs.extend(sequences.inputs(&turn));
    Ok(Some((sequences, turn)))
}

/// The names of the inputs a request sent, in its order, where they matter: a Python model lists
/// them in an order that follows it ([`python_listing`]).
fn arrival(executor: &Executor, request: &InferRequest) -> Vec<String> {
    match executor {
        Executor::Python(_) => request.inputs.iter().map(|i| i.name.clone()).collect(),
        _ => Vec::new(),
    }
}

/// The order a Python model's `request.inputs()` lists a request's validated `inputs` in, those
/// it sent in `arrival` order and the sequence controls the server added: Triton's.
fn python_listing(arrival: &[String], inputs: &[crate::core::Tensor]) -> Vec<usize> {
    let arrival: Vec<&str> = arrival.iter().map(String::as_str).collect();
    let names: Vec<&str> = inputs.iter().map(|input| input.name.as_str()).collect();
    visit_order::listed_order(&arrival, &names)
}

/// Where a stateful Python model's request stands in its sequence: its correlation ID, its
/// START / END flags (Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_*`), and the slot (instance)
/// its sequence was given.
fn python_sequence(flags: &SequenceFlags, slot: usize) -> crate::backend::python::SequenceOf {
    use crate::repository::sequence::CorrId;
    crate::backend::python::SequenceOf {
        correlation_id: match &flags.id {
            CorrId::Number(n) => serde_json::json!(n),
            CorrId::Text(s) => serde_json::json!(s),
        },
        flags: u32::from(flags.start) | (u32::from(flags.end) << 1),
        slot,
    }
}

/// Rejects reserved `triton_*` keys and malformed `classification` counts before the model runs.
/// Triton's other reserved keys (`priority`, `timeout`, `sequence_*`) are accepted.
fn check_parameters(request: &InferRequest) -> Result<(), Error> {
    for key in request.parameters.keys() {
        if key.starts_with("triton_") && key != "triton_enable_empty_final_response" {
            // Triton's REST words; its gRPC front end words it otherwise (protocol::codec).
            return Err(invalid_arg!(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            ));
        }
    }
    for output in &request.outputs {
        classification::requested_count(
            output.parameters.get(classification::CLASSIFICATION),
            &output.name,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ParamValue;

    #[test]
    fn reserved_triton_parameters_are_rejected() {
        let mut request = InferRequest::default();
        request
            .parameters
            .insert("triton_foo".into(), ParamValue::Bool(true));
        assert!(check_parameters(&request)
            .unwrap_err()
            .message()
            .contains("reserved for Triton usage"));
        let mut request = InferRequest::default();
        request.parameters.insert(
            "triton_enable_empty_final_response".into(),
            ParamValue::Bool(true),
        );
        request
            .parameters
            .insert("priority".into(), ParamValue::Uint64(1));
        request
            .parameters
            .insert("custom".into(), ParamValue::Double(0.5));
        assert!(check_parameters(&request).is_ok());
    }

    #[test]
    fn classification_counts_are_checked_before_running() {
        let mut request = InferRequest::default();
        let mut output = crate::core::RequestedOutput {
            name: "OUT".into(),
            ..Default::default()
        };
        output
            .parameters
            .insert("classification".into(), ParamValue::Int64(3));
        request.outputs.push(output.clone());
        assert!(check_parameters(&request).is_ok());
        output
            .parameters
            .insert("classification".into(), ParamValue::Int64(-1));
        request.outputs.push(output);
        assert!(matches!(
            check_parameters(&request),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn extensions_advertise_what_is_served() {
        for extension in [
            "classification",
            "binary_tensor_data",
            "model_configuration",
            "schedule_policy",
            "statistics",
            "system_shared_memory",
            "trace",
            "logging",
            "sequence",
        ] {
            assert!(EXTENSIONS.contains(&extension));
        }
        // Answered UNIMPLEMENTED (gRPC) and 501 (REST): a client must not be told otherwise.
        assert!(!EXTENSIONS.contains(&"cuda_shared_memory"));
    }
}
