//! The façade both protocols call: model and version lookup, request validation, execution on the
//! model's instances, and the shaping of the response. Errors leave here as [`Error`] with
//! Triton's texts; each protocol maps them to its status codes once.

mod admission;
mod cache;
mod classification;
mod context;
mod embed;
mod ensemble;
mod ensemble_stream;
mod execution;
pub mod generate;
mod lookup;
mod on_demand;
mod prepare;
pub mod raw_input;
mod record;
mod response;
mod run;
pub mod shared_memory;
mod status;
mod stream;
mod target;
mod traces;
// Requests are checked against their model's inputs and outputs where warmup samples are too,
// in the repository, which knows them; `engine::validate` stays their path.
pub use crate::repository::validate;
use crate::repository::visit_order::visit_order;

use crate::core::{Error, InferRequest};
use crate::invalid_arg;
use crate::proto::inference::{ModelConfig, ModelStatistics};
use crate::repository::{Executor, Model, ModelRepository};
use crate::trace::{TraceSettings, Tracer};
pub use admission::Admission;
pub use cache::CacheConfig;
use cache::ResponseCache;
pub use context::{Context, Origin};
pub use embed::{Embeddings, MAX_TEXTS};
pub use prepare::Reply;
pub use record::{Failed, Stage};
use run::{check_parameters, python_listing, python_sequence, queued, schedule_error};
use shared_memory::{SharedMemory, ShmPolicy};
pub use status::VersionLatencies;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
pub use stream::StreamedResponse;
pub use target::{Answers, Target};

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
    /// The system shared-memory regions clients registered, and what clients may do with them.
    shared_memory: SharedMemory,
    /// Request tracing (`--trace-config`, the `trace` extension).
    tracer: Arc<Tracer>,
    /// The response cache (`--cache-config`), for the versions that enable it.
    cache: Option<ResponseCache>,
    /// The server's name in server metadata (`--id`).
    server_id: String,
    /// When the engine was made (the server started), for the status page's uptime.
    started: Instant,
    /// Loads on first request (`--load-on-demand`), when on.
    on_demand: Option<Arc<on_demand::OnDemand>>,
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
            on_demand: None,
        }
    }

    /// Names the server `id` in server metadata (Triton's `--id`).
    pub fn with_server_id(mut self, id: String) -> Engine {
        self.server_id = id;
        self
    }

    /// Lets clients use shared memory as `policy` says (`--allow-client-shm`; off by default).
    pub fn with_client_shm(mut self, policy: ShmPolicy) -> Engine {
        self.shared_memory = SharedMemory::new(policy);
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
    pub async fn model_metadata(&self, name: &str, version: &str) -> Result<ModelMetadata, Error> {
        let target = self.target_loading(name, version).await?;
        Ok(target.metadata(version.is_empty()))
    }

    /// The effective (normalised, auto-completed) config.
    ///
    /// # Errors
    /// As [`Engine::model_metadata`].
    pub async fn model_config(&self, name: &str, version: &str) -> Result<Arc<ModelConfig>, Error> {
        let target = self.target_loading(name, version).await?;
        let (model, serving) = (&target.model, &target.serving);
        // Triton's config of an ensemble says whether it is decoupled: whether a step is.
        if let (Executor::Ensemble(_), None) =
            (&serving.executor, &model.config.model_transaction_policy)
        {
            let mut config = ModelConfig::clone(&model.config);
            config.model_transaction_policy =
                Some(crate::proto::inference::ModelTransactionPolicy {
                    decoupled: target.answers() == Answers::Stream,
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

    /// Builds the request for Triton's raw binary HTTP request (`Inference-Header-Content-Length:
    /// 0`): the whole body is the data of the model's only input, whose shape follows from the
    /// data size (batch 1 when the model batches; at most one variable dimension; BYTES holds one
    /// element).
    ///
    /// # Errors
    /// Lookup errors as [`Engine::model_ready`]; INVALID_ARGUMENT when the model does not have
    /// exactly one input or the size cannot give a shape.
    pub async fn raw_input_request(
        &self,
        name: &str,
        version: &str,
        data: bytes::Bytes,
    ) -> Result<InferRequest, Error> {
        let target = self.target_loading(name, version).await?;
        let (model, serving) = (&target.model, &target.serving);
        let input = raw_input::raw_input(&model.name, &serving.io, data)?;
        Ok(InferRequest {
            model_name: name.to_string(),
            model_version: version.to_string(),
            inputs: vec![input],
            ..Default::default()
        })
    }
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
