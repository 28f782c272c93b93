//! The model repository: Triton's directory layout (`<root>/<model>/config.pbtxt`,
//! `<root>/<model>/<version>/model.onnx`) and the lifecycle of the models in it.
//!
//! Layout: `store` is where model directories come from (a [`ModelStore`]: a local directory, or
//! `s3` for an S3-compatible object store) and checks names and paths; `config`, `autocomplete`, `versions` and `io` turn a
//! directory into a complete config and a set of versions; `placement` decides where each
//! instance runs (CPU or a GPU, by the instance groups); `loader` starts the instances;
//! `lifecycle` owns the mutable state ([`ModelRepository`]): control modes, load, unload, poll,
//! readiness, and the snapshot requests read; `overrides` checks the load API's parameters;
//! `index` renders the repository index; `retire` stops replaced versions once their last
//! request has finished; `text` reads the tokenizer parameters of models that take text;
//! `generation` loads decoupled generation models; `tuning` reads the ONNX Runtime settings a
//! config gives (threads, graph level, memory).
//! `limits` bounds what model files may ask for (sizes, counts, dims). `agents` runs the
//! repository agents a config names (Triton's checksum agent) before a load; `op_library`
//! resolves the custom-operator libraries a config names against those the server allows.
//!
//! A model that fails to load is kept with its reason and is not ready; it never takes the server
//! down.

mod agents;
pub mod autocomplete;
pub mod config;
pub mod ensemble;
pub mod generation;
mod index;
mod io;
mod lifecycle;
mod limits;
mod loader;
pub mod mapped;
pub mod op_library;
mod overrides;
pub mod placement;
pub mod python;
mod ragged;
pub mod remote;
mod retire;
pub mod sequence;
pub mod store;
pub mod text;
pub mod tuning;
pub mod validate;
mod versions;
pub mod visit_order;
pub mod warmup;

pub use crate::core::LoadParameter;
pub use index::IndexEntry;
pub use io::{IoSpec, TensorSpec};
pub use lifecycle::{ControlMode, ModelRepository, RepositoryOptions, Slot, Snapshot, Status};
pub use limits::{MAX_BATCH_SIZE, MAX_MODEL_DIR_ENTRIES};
pub use loader::{LoadError, LoadFailure};
pub use overrides::config_from_json;
pub use remote::RemoteStore;
pub use store::{LocalStore, ModelStore, StoreError};

use crate::generate::Generator;
use crate::metrics::ModelStats;
use crate::proto::inference::ModelConfig;
use crate::scheduler::Scheduler;
use std::collections::BTreeMap;
use std::sync::Arc;

/// How models are loaded.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Fill missing inputs/outputs/max_batch_size from the ONNX graph (Triton's default).
    pub auto_complete: bool,
    /// CPU cores to share between the instances of one model.
    pub cores: usize,
    /// `--gpu-fallback-to-cpu`: run `KIND_GPU` groups on CPU when no GPU is usable (and say so)
    /// instead of failing the load.
    pub gpu_fallback_to_cpu: bool,
    /// `--cache-config`: the server has a response cache for models that enable it.
    pub response_cache: bool,
    /// What auto-complete gives batchable models (`--backend-config default-max-batch-size`).
    pub default_max_batch_size: i32,
    /// `--model-config-name`: read `<model>/configs/<name>.pbtxt` instead of `config.pbtxt`
    /// where it exists.
    pub config_name: Option<String>,
    /// `--rate-limit=execution_count`: the server's rate limiter, which instances with
    /// `rate_limiter` resources wait for.
    pub rate_limiter: Option<Arc<crate::scheduler::rate_limit::RateLimiter>>,
    /// `--allowed-op-library`: the custom-operator libraries models may load.
    pub op_libraries: op_library::AllowedOpLibraries,
    /// How Python models call other models (connected to the engine by the server).
    pub python_calls: crate::backend::python::ModelCaller,
    /// Which of the server's environment variables Python stubs see
    /// (`--python-env-passthrough`), and where their `EXECUTION_ENV_PATH` may be
    /// (`--python-env-root`).
    pub python_env: crate::backend::python::StubEnvironment,
    /// `--backend-directory`: a model whose backend is `<name>` runs `<dir>/<name>/model.py`
    /// (Triton's Python-based backends).
    pub backend_directory: std::path::PathBuf,
    /// `--allow-code-in-load-overrides`: a load's `file:` overrides may bring code (a Python
    /// model, Python files); off, such a load is refused (`overrides::Overrides::code`).
    pub allow_code_in_overrides: bool,
    /// `--adaptive-batching`: dynamic batchers take kiln's shortcuts (a batch goes before its
    /// `max_queue_delay_microseconds` when waiting looks useless) where a model's config does
    /// not say otherwise (`adaptive_batching_delay`). Off: Triton's batcher.
    pub adaptive_batching: bool,
}

impl Default for LoadOptions {
    /// Triton's defaults (auto-complete on, a default batch size of 4), one core, no cache, no
    /// rate limiter, no custom-operator library, no variable passed to Python stubs beyond
    /// the usual ones.
    fn default() -> LoadOptions {
        LoadOptions {
            auto_complete: true,
            cores: 1,
            gpu_fallback_to_cpu: false,
            response_cache: false,
            default_max_batch_size: autocomplete::DEFAULT_MAX_BATCH_SIZE,
            config_name: None,
            rate_limiter: None,
            op_libraries: op_library::AllowedOpLibraries::default(),
            python_calls: crate::backend::python::ModelCaller::default(),
            python_env: crate::backend::python::StubEnvironment::default(),
            backend_directory: crate::backend::python::DEFAULT_BACKEND_DIRECTORY.into(),
            allow_code_in_overrides: false,
            adaptive_batching: false,
        }
    }
}

/// A version that is loaded and serving. Requests hold it by `Arc` while they run, so a version
/// replaced or unloaded meanwhile finishes them before it stops.
pub struct ServingVersion {
    pub version: i64,
    /// What requests must look like, and how their shapes map to the model's.
    pub io: IoSpec,
    /// What runs its requests.
    pub executor: Executor,
    /// Triton's statistics and the Prometheus metrics of this version.
    pub stats: Arc<ModelStats>,
    /// Whether its responses go to the server's response cache.
    pub cache: bool,
    /// A stateful model's sequences in progress (`sequence_batching`).
    pub sequences: Option<Arc<sequence::Sequences>>,
    /// A text model's tokenizer, which its instances share (see
    /// [`crate::backend::tokenize`]), for counting what a request's texts cost in tokens.
    pub tokenizer: Option<Arc<crate::backend::tokenize::TextTokenizer>>,
    /// The chat template of a model that takes Triton's LLM tensors (a Python model or an
    /// ensemble), from its model directory, for the OpenAI chat API (`Err`: why it cannot be
    /// used). Generation models keep theirs in their generator.
    pub chat: Option<Result<Arc<crate::generate::chat::ChatTemplate>, String>>,
}

/// What runs a version's requests: the scheduler and its instances for ordinary models, the
/// generation loop for decoupled generation models (see [`generation`]).
pub enum Executor {
    Batched(Scheduler),
    Generate(Generator),
    /// An ensemble runs its steps' models; nothing of its own to stop.
    Ensemble(Arc<ensemble::EnsemblePlan>),
    /// A Python model's instances, each a process running its `model.py`.
    Python(Arc<python::PythonModel>),
}

impl Executor {
    /// Stops the instances or the loop and waits until their sessions are freed. Blocking.
    pub fn stop(self) {
        match self {
            Executor::Batched(scheduler) => scheduler.stop(),
            Executor::Generate(generator) => generator.stop(),
            Executor::Ensemble(_) => {}
            Executor::Python(model) => model.stop(),
        }
    }
}

/// A model that serves: every version its policy selected loaded (loads are all or nothing).
pub struct Model {
    pub name: String,
    /// The effective config (normalised, auto-completed).
    pub config: Arc<ModelConfig>,
    /// Versions selected by the version policy, by number; never empty.
    pub versions: BTreeMap<i64, Arc<ServingVersion>>,
    /// Class labels of each output that names a `label_filename`, one per line, read at load time
    /// for the classification extension.
    pub labels: BTreeMap<String, Vec<String>>,
    /// Why its `KIND_GPU` groups run on CPU (`--gpu-fallback-to-cpu`); the index gives it as the
    /// reason of every READY version.
    pub fallback: Option<String>,
}

impl Model {
    /// The highest version: the one requests without a version get.
    pub fn latest(&self) -> Option<&Arc<ServingVersion>> {
        self.versions.values().next_back()
    }
}
