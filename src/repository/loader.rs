//! Loading one model from a local directory, in two steps so the lifecycle can report LOADING
//! versions in between: [`prepare`] reads and completes the config, applies the version policy
//! and reads labels (cheap, except for the auto-complete probe); [`build`] starts the instances of
//! every selected version. A load is all or nothing, as in Triton: if one version fails, the
//! versions built so far are stopped and the model is reported with each version's reason.

use super::agents;
use super::config::{self, DEFAULT_MODEL_FILENAME};
use super::ensemble::{self, EnsemblePlan};
use super::limits::{
    check_sessions, read_text, MAX_CONFIG_BYTES, MAX_LABELS, MAX_LABEL_FILE_BYTES,
};
use super::python::PythonModel;
use super::sequence::{SequenceSpec, Sequences};
use super::store::{contained, plain_relative};
use super::tuning::{self, Tuning};
use super::warmup;
use super::{
    autocomplete, generation, placement, text, versions, Executor, IoSpec, LoadOptions, Model,
    ServingVersion,
};
use crate::backend::python::PythonSpec;
use crate::backend::tokenize::{TextInput, TextModel, TextSpec};
use crate::backend::{cuda, Backend, Device, OnnxRuntime, OnnxSession, SessionOptions, TensorInfo};
use crate::metrics::ModelStats;
use crate::proto::inference::ModelConfig;
use crate::scheduler::layout::BatchLayout;
use crate::scheduler::rate_limit::{InstanceLimit, Limit, RateLimiter};
use crate::scheduler::{Scheduler, Session};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a load failed: the model as a whole (config, policy, auto-complete), or some versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    Model(String),
    /// Every selected version with its state reason; versions that loaded but were discarded
    /// because another failed say so.
    Versions(BTreeMap<i64, String>),
}

impl LoadFailure {
    /// Triton's load error text: `version 1 is at UNAVAILABLE state: <reason>;` per failed version.
    pub fn message(&self, name: &str) -> String {
        match self {
            LoadFailure::Model(reason) => format!("load failed for model '{name}': {reason}"),
            LoadFailure::Versions(reasons) => {
                let detail: String = reasons
                    .iter()
                    .filter(|(_, reason)| reason.as_str() != DISCARDED)
                    .map(|(v, reason)| format!("version {v} is at UNAVAILABLE state: {reason};"))
                    .collect();
                format!("load failed for model '{name}': {detail}")
            }
        }
    }
}

/// The reason given to a version that loaded but was dropped because a sibling failed; Triton
/// reports such versions as unloaded.
pub const DISCARDED: &str = "unloaded";

/// A model whose config is complete and whose versions are chosen, not yet running.
pub struct Prepared {
    pub name: String,
    dir: PathBuf,
    config: ModelConfig,
    /// The versions the policy selected, ascending.
    pub versions: Vec<i64>,
    labels: BTreeMap<String, Vec<String>>,
    /// Where each instance runs, one entry per instance.
    devices: Vec<Device>,
    /// What each instance needs from the rate limiter, when the server has one.
    limits: Vec<Option<InstanceLimit>>,
    rate_limiter: Option<Arc<RateLimiter>>,
    /// Intra-op threads per session: the config's count, or the cores shared between the
    /// instances.
    intra_op_threads: usize,
    /// The ONNX Runtime settings the config tunes.
    tuning: Tuning,
    /// Why GPU groups run on CPU (`--gpu-fallback-to-cpu`).
    fallback: Option<String>,
    /// The tokenizer of a model that takes text.
    text: Option<TextSpec>,
    /// Whether its responses go to the response cache (the config asks, the server has one).
    cache_responses: bool,
    /// An ensemble's checked plan (it has no sessions of its own).
    ensemble: Option<Arc<EnsemblePlan>>,
    /// A stateful model's sequence batching.
    sequence: Option<SequenceSpec>,
    /// A Python model's interpreter and instances.
    python: Option<PythonSpec>,
    /// Whether its dynamic batcher takes kiln's shortcuts (`adaptive_batching_delay`, or
    /// `--adaptive-batching` where the config does not say).
    adaptive_batching: bool,
}

/// Versions of the model being replaced that may serve on unchanged: only when the config is the
/// same and the version's files did not change.
pub type Reuse<'a> = Option<(&'a Model, &'a dyn Fn(i64) -> bool)>;

/// Reads `dir/config.pbtxt` (or takes `config_override`), normalises it, selects versions and
/// completes the config from the newest version's graph.
///
/// # Errors
/// The reason, as the index reports it.
pub fn prepare(
    name: &str,
    dir: &Path,
    config_override: Option<ModelConfig>,
    options: &LoadOptions,
) -> Result<Prepared, String> {
    let mut config = match config_override {
        Some(config) => config,
        None => read_config(dir, options.config_name.as_deref())?,
    };
    // A directory served under another name (a registered repository's mapping: every other
    // store fetches model `m` into a directory named `m`) takes that name, whatever its config
    // was written for.
    let directory = dir.file_name().and_then(|d| d.to_str()).unwrap_or(name);
    if directory != name {
        config.name = name.to_string();
    }
    let backend_code = crate::backend::python::backend_code(&config, &options.backend_directory);
    config::normalize_identity(&mut config, name, backend_code.is_some())
        .map_err(|e| e.to_string())?;
    agents::run(&config, dir)?;
    let selected = versions::select(dir, &config)?;
    if selected.is_empty() {
        return Err(format!(
            "at least one version must be available under the version policy of model '{name}'"
        ));
    }
    if ensemble::is_ensemble(&config) {
        return prepare_ensemble(name, dir, config, selected);
    }
    if config::is_python(&config) || backend_code.is_some() {
        return prepare_python(name, dir, config, selected, options, backend_code);
    }
    let placed = placement::place(&mut config, &cuda::inventory, options.gpu_fallback_to_cpu)?;
    check_sessions(name, selected.len(), placed.devices.len())?;
    if let Some(why) = &placed.fallback {
        tracing::warn!("model '{name}': {why}");
    }
    // Without --rate-limit, rate_limiter settings are left alone, as Triton leaves them.
    let limits = match options.rate_limiter {
        Some(_) => placement::instance_limits(&config, &placed)?,
        None => Vec::new(),
    };
    let generating = generation::is_generation(&config);
    let sequence = SequenceSpec::from_config(&config, dir)?;
    if generating && sequence.is_some() {
        return Err(format!(
            "generation model '{name}' cannot use sequence_batching: it keeps its own state"
        ));
    }
    let wants_cache = config::wants_response_cache(&config);
    let cache_responses =
        wants_cache && options.response_cache && !generating && sequence.is_none();
    if wants_cache && !cache_responses {
        let why = if generating {
            "generation (decoupled) models are not cached"
        } else if sequence.is_some() {
            "stateful (sequence batching) models are not cached"
        } else {
            "the server was started without --cache-config"
        };
        tracing::warn!("model '{name}': response_cache is enabled but {why}: every request runs");
    }
    if generating && placed.devices.iter().any(|d| d.gpu().is_some()) {
        return Err(format!(
            "generation model '{name}' runs on CPU: give it a KIND_CPU instance group"
        ));
    }
    // A generation model runs one loop over one session, whatever the instance groups say, and
    // tokenizes in that loop (see `generation`).
    let mut tuning = tuning::tuning(&config)?;
    tuning.op_libraries = options.op_libraries.resolve(&config)?;
    let intra_op_threads = tuning.intra_op_threads.unwrap_or(if generating {
        options.cores.max(1)
    } else {
        (options.cores / placed.devices.len().max(1)).max(1)
    });
    let text = if generating {
        None
    } else {
        text::text_spec(&config, dir)?
    };
    let complete = !config.input.is_empty() && !config.output.is_empty();
    if generating {
        // The graph's inputs are tokens and caches; clients see Triton's LLM tensors.
        generation::complete_config(&mut config)?;
    } else if options.auto_complete && !complete {
        // Triton completes the config from the newest selected version's graph.
        let runtime = OnnxRuntime::get().map_err(|e| e.to_string())?;
        let newest = selected
            .iter()
            .rev()
            .filter_map(|&v| model_path(dir, v, &config.default_model_filename).ok())
            .find(|path| path.is_file())
            .ok_or_else(|| format!("no model file found for model '{name}'"))?;
        let cpu = SessionOptions {
            intra_op_threads,
            device: Device::Cpu,
            tuning: tuning.session(intra_op_threads, None),
            pool_name: None,
        };
        let probe = OnnxSession::load(&runtime, &newest, &cpu).map_err(|e| e.to_string())?;
        // A text model shows clients its text input in place of the token inputs.
        let inputs = match &text {
            Some(spec) => spec
                .bind(probe.inputs())
                .map_err(|e| e.to_string())?
                .client_inputs(probe.inputs()),
            None => probe.inputs().to_vec(),
        };
        autocomplete::autocomplete(
            &mut config,
            &inputs,
            probe.outputs(),
            options.default_max_batch_size,
        )?;
    }
    config::fill_scheduler_defaults(&mut config);
    config::validate_io(&config).map_err(|e| e.to_string())?;
    config::max_inflight_requests(&config).map_err(|e| e.to_string())?;
    let adaptive_batching = config::adaptive_batching_delay(&config, options.adaptive_batching)
        .map_err(|e| e.to_string())?;
    // Checked for every model, as Triton reads model_metrics, though only generation models
    // have the histogram it sets.
    crate::metrics::histogram::first_response_buckets(&config)?;
    let labels = read_labels(dir, &config)?;
    Ok(Prepared {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        config,
        versions: selected,
        labels,
        limits,
        rate_limiter: options.rate_limiter.clone(),
        devices: placed.devices,
        intra_op_threads,
        tuning,
        fallback: placed.fallback,
        text,
        cache_responses,
        ensemble: None,
        sequence,
        python: None,
        adaptive_batching,
    })
}

/// An ensemble needs no session: its plan, checked, and its declared tensors.
fn prepare_ensemble(
    name: &str,
    dir: &Path,
    config: ModelConfig,
    versions: Vec<i64>,
) -> Result<Prepared, String> {
    let plan = ensemble::plan(&config)?;
    config::validate_io(&config).map_err(|e| e.to_string())?;
    if config::wants_response_cache(&config) {
        tracing::warn!(
            "ensemble '{name}': response_cache is enabled but ensembles are not cached (their \
             composing models may be)"
        );
    }
    Ok(Prepared {
        ensemble: Some(Arc::new(plan)),
        ..Prepared::without_sessions(name, dir, config, versions)?
    })
}

impl Prepared {
    /// A model that runs no ONNX Runtime session of its own (an ensemble, a Python model).
    fn without_sessions(
        name: &str,
        dir: &Path,
        config: ModelConfig,
        versions: Vec<i64>,
    ) -> Result<Prepared, String> {
        Ok(Prepared {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            labels: read_labels(dir, &config)?,
            tuning: tuning::tuning(&config)?,
            config,
            versions,
            devices: Vec::new(),
            limits: Vec::new(),
            rate_limiter: None,
            intra_op_threads: 1,
            fallback: None,
            text: None,
            cache_responses: false,
            ensemble: None,
            sequence: None,
            python: None,
            adaptive_batching: false,
        })
    }
}

/// A Python model runs its own code in processes of its own (see [`crate::backend::python`]):
/// each version's `model.py`, or `code`, the one `model.py` of its Python-based backend. Its
/// tensors come from its config, completed by its `auto_complete_config` when it has one.
fn prepare_python(
    name: &str,
    dir: &Path,
    mut config: ModelConfig,
    versions: Vec<i64>,
    options: &LoadOptions,
    code: Option<PathBuf>,
) -> Result<Prepared, String> {
    if options.auto_complete {
        // Triton completes the config with the newest selected version's model.py.
        let newest = code.clone().or_else(|| {
            versions
                .iter()
                .rev()
                .filter_map(|&v| model_path(dir, v, &config.default_model_filename).ok())
                .find(|path| path.is_file())
        });
        // Only a model that defines the function needs a Python process to run it.
        let defines = |path: &PathBuf| {
            std::fs::read_to_string(path).is_ok_and(|code| code.contains("auto_complete_config"))
        };
        if let Some(path) = newest.filter(defines) {
            super::autocomplete::python(&mut config, dir, &path, &options.python_env)?;
        }
    }
    if config.input.is_empty() && config.output.is_empty() {
        return Err(format!(
            "Python model '{name}' declares no inputs or outputs (in config.pbtxt or with \
             auto_complete_config)"
        ));
    }
    let mut python = PythonSpec {
        code,
        ..PythonSpec::from_config(&mut config, dir, &options.python_calls, &options.python_env)?
    };
    config::fill_scheduler_defaults(&mut config);
    config::validate_io(&config).map_err(|e| e.to_string())?;
    config::max_inflight_requests(&config).map_err(|e| e.to_string())?;
    python.adaptive_batching = config::adaptive_batching_delay(&config, options.adaptive_batching)
        .map_err(|e| e.to_string())?;
    // As Triton: a decoupled model's responses are not cached.
    let decoupled = config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    let sequence = SequenceSpec::from_config(&config, dir)?;
    if let Some(spec) = &sequence {
        if spec.has_states() {
            return Err(format!(
                "Python model '{name}': sequence_batching state (implicit state) is not served for \
                 Python models: the model keeps a sequence's state itself, by correlation_id()"
            ));
        }
    }
    let wants_cache = config::wants_response_cache(&config);
    let cache_responses = wants_cache && options.response_cache && !decoupled && sequence.is_none();
    if wants_cache && !cache_responses {
        let why = if decoupled {
            "decoupled models are not cached"
        } else if sequence.is_some() {
            "stateful (sequence batching) models are not cached"
        } else {
            "the server was started without --cache-config"
        };
        tracing::warn!("Python model '{name}': response_cache is enabled but {why}");
    }
    // Without --rate-limit, rate_limiter settings are left alone, as Triton leaves them.
    let limits = match options.rate_limiter {
        Some(_) => python
            .instances
            .iter()
            .map(|instance| placement::group_limit(&config, instance.group, instance.device))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    Ok(Prepared {
        python: Some(python),
        cache_responses,
        sequence,
        limits,
        rate_limiter: options.rate_limiter.clone(),
        ..Prepared::without_sessions(name, dir, config, versions)?
    })
}

/// Starts every selected version (or takes it over from `reuse`).
///
/// # Errors
/// [`LoadFailure::Versions`] when any version fails; nothing built here keeps running then.
pub fn build(prepared: Prepared, reuse: Reuse<'_>) -> Result<Model, LoadFailure> {
    let Prepared {
        name,
        dir,
        config,
        versions,
        labels,
        devices,
        limits,
        rate_limiter,
        intra_op_threads,
        tuning,
        fallback,
        text,
        cache_responses,
        ensemble,
        sequence,
        python,
        adaptive_batching,
    } = prepared;
    let runtime = OnnxRuntime::get().map_err(|e| LoadFailure::Model(e.to_string()))?;
    let reusable = |version: i64| -> Option<Arc<ServingVersion>> {
        let (old, unchanged) = reuse?;
        if *old.config != config || !unchanged(version) {
            return None;
        }
        old.versions.get(&version).cloned()
    };
    let mut built = BTreeMap::new();
    let mut failures = BTreeMap::new();
    for &version in &versions {
        if let Some(serving) = reusable(version) {
            built.insert(version, serving);
            continue;
        }
        if let Some(plan) = &ensemble {
            match IoSpec::from_config(&config) {
                Ok(io) => {
                    let chat = llm_chat_template(&name, &dir, &io);
                    let serving = ServingVersion {
                        version,
                        io,
                        executor: Executor::Ensemble(Arc::clone(plan)),
                        stats: Arc::new(ModelStats::new(&name, version)),
                        cache: false,
                        sequences: None,
                        tokenizer: None,
                        chat,
                    };
                    built.insert(version, Arc::new(serving));
                }
                Err(reason) => {
                    failures.insert(version, reason);
                }
            }
            continue;
        }
        let file = match python.as_ref().and_then(|spec| spec.code.clone()) {
            Some(code) => Ok(code),
            None => model_path(&dir, version, &config.default_model_filename),
        };
        let started = file.and_then(|path| {
            if let Some(spec) = &python {
                let limited = (rate_limiter.as_ref(), limits.as_slice());
                let files = (dir.as_path(), path.as_path());
                return start_python(
                    &name,
                    version,
                    files,
                    &config,
                    spec,
                    limited,
                    cache_responses,
                )
                .map(|serving| ServingVersion {
                    sequences: sequence.as_ref().map(|sequence| {
                        let slots = spec.instances.len();
                        Arc::new(Sequences::with_slots(sequence.clone(), slots))
                    }),
                    ..serving
                });
            }
            if generation::is_generation(&config) {
                let options = SessionOptions {
                    intra_op_threads,
                    device: Device::Cpu,
                    tuning: tuning.session(intra_op_threads, None),
                    pool_name: Some(format!("ort-{name}-{version}")),
                };
                return generation::start_version(
                    &name, version, &dir, &path, &config, &runtime, &options,
                );
            }
            let instances = Instances {
                devices: &devices,
                limits: &limits,
                rate_limiter: rate_limiter.as_ref(),
                intra_op_threads,
                tuning: &tuning,
                runtime: &runtime,
                text: text.as_ref(),
                cache_responses,
                sequence: sequence.as_ref(),
                adaptive_batching,
            };
            start_version(&name, version, &dir, &path, &config, &instances)
        });
        match started {
            Ok(serving) => {
                built.insert(version, Arc::new(serving));
            }
            Err(reason) => {
                failures.insert(version, reason);
            }
        }
    }
    if !failures.is_empty() {
        for (version, serving) in built {
            failures.insert(version, DISCARDED.to_string());
            // Stop only what this load started; reused versions still serve the old model.
            if let Ok(serving) = Arc::try_unwrap(serving) {
                serving.executor.stop();
            }
        }
        return Err(LoadFailure::Versions(failures));
    }
    Ok(Model {
        name,
        config: Arc::new(config),
        versions: built,
        labels,
        fallback,
    })
}

/// Reads each output's `label_filename` (inside the model directory), one label per line as
/// Triton does. A named file that cannot be read fails the model.
fn read_labels(dir: &Path, config: &ModelConfig) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut labels = BTreeMap::new();
    for output in config
        .output
        .iter()
        .filter(|o| !o.label_filename.is_empty())
    {
        let path = contained(dir, &output.label_filename)
            .map_err(|e| format!("label file of output '{}': {e}", output.name))?;
        let text = read_text(&path, MAX_LABEL_FILE_BYTES).map_err(|e| {
            format!(
                "failed to read label file {} for output '{}': {e}",
                path.display(),
                output.name
            )
        })?;
        if text.lines().count() > MAX_LABELS {
            return Err(format!(
                "label file {} for output '{}' holds more than the {MAX_LABELS} labels kiln reads",
                path.display(),
                output.name
            ));
        }
        labels.insert(
            output.name.clone(),
            text.lines().map(str::to_string).collect(),
        );
    }
    Ok(labels)
}

/// `configs/<config_name>.pbtxt` where the model has it, else `config.pbtxt`; a model without
/// either gets an empty config, for auto-complete to fill.
fn read_config(dir: &Path, config_name: Option<&str>) -> Result<ModelConfig, String> {
    let custom = config_name
        .map(|name| contained(dir, &format!("configs/{name}.pbtxt")))
        .transpose()?
        .filter(|path| path.is_file());
    let path = match custom {
        Some(path) => path,
        None => contained(dir, "config.pbtxt")?,
    };
    match read_text(&path, MAX_CONFIG_BYTES) {
        Ok(text) => config::parse_config(&text).map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(format!("failed to read {}: {e}", path.display())),
    }
}

/// `<model>/<version>/<file>`, or `<file>/model.onnx` when the file is a directory holding a model
/// with external data. The file name comes from the config, so it must stay inside the model
/// directory.
fn model_path(dir: &Path, version: i64, file: &str) -> Result<PathBuf, String> {
    if !plain_relative(file) {
        return Err(format!(
            "default_model_filename '{file}' must be a relative path inside the version directory"
        ));
    }
    let path = contained(dir, &format!("{version}/{file}"))
        .map_err(|e| format!("default_model_filename: {e}"))?;
    Ok(if path.is_dir() {
        path.join(DEFAULT_MODEL_FILENAME)
    } else {
        path
    })
}

/// How the instances of each version are made.
struct Instances<'a> {
    /// Where each instance runs.
    devices: &'a [Device],
    /// What each instance needs from `rate_limiter`.
    limits: &'a [Option<InstanceLimit>],
    rate_limiter: Option<&'a Arc<RateLimiter>>,
    intra_op_threads: usize,
    tuning: &'a Tuning,
    runtime: &'a OnnxRuntime,
    /// A text model's tokenizer, wrapped around each session.
    text: Option<&'a TextSpec>,
    /// Whether the version's responses go to the response cache.
    cache_responses: bool,
    /// A stateful model's sequence batching.
    sequence: Option<&'a SequenceSpec>,
    /// Whether the dynamic batcher takes kiln's shortcuts.
    adaptive_batching: bool,
}

/// Starts one version: its instances' sessions, their warmup, then its scheduler. `dir` is the
/// model's directory, `path` the version's model file.
fn start_version(
    name: &str,
    version: i64,
    dir: &Path,
    path: &Path,
    config: &ModelConfig,
    instances: &Instances<'_>,
) -> Result<ServingVersion, String> {
    if !path.is_file() {
        return Err(format!("model file {} not found", path.display()));
    }
    let Instances {
        devices,
        limits,
        rate_limiter,
        intra_op_threads,
        tuning,
        runtime,
        text,
        cache_responses,
        sequence,
        adaptive_batching,
    } = *instances;
    let started = std::time::Instant::now();
    // An instance that asks for more than the rate limiter has fails before any session loads.
    let limits = (0..devices.len())
        .map(|index| Limit::for_instance(rate_limiter, limits.get(index).and_then(Option::as_ref)))
        .collect::<Result<Vec<_>, _>>()?;
    // Checked against the graph with the first session, then the scheduler's and warmup's.
    let layout = Arc::new(super::ragged::layout(config)?);
    let mut backends: Vec<Box<dyn Backend>> = Vec::with_capacity(devices.len());
    let mut io = None;
    let mut text_input = None;
    for (index, device) in devices.iter().enumerate() {
        let options = SessionOptions {
            intra_op_threads,
            device: device.clone(),
            tuning: tuning.session(intra_op_threads, device.gpu().map(|gpu| gpu.id)),
            // The instance's own thread is `{name}-{version}-{index}` (the scheduler's).
            pool_name: Some(format!("ort-{name}-{version}-{index}")),
        };
        let session = OnnxSession::load(runtime, path, &options).map_err(|e| e.to_string())?;
        if io.is_none() {
            let (spec, bound) = io_spec(config, &layout, &session, text, sequence)?;
            io = Some(spec);
            text_input = bound;
        }
        let backend = session.into_backend().map_err(|e| e.to_string())?;
        let backend: Box<dyn Backend> = match &text_input {
            Some(text) => Box::new(TextModel::new(Arc::clone(text), backend)),
            None => backend,
        };
        backends.push(backend);
    }
    let io = io.ok_or_else(|| format!("model '{name}' has no instances"))?;
    let mut gpus: Vec<(i32, String)> = Vec::new();
    for device in devices {
        if let Device::Cuda { gpu, options } = device {
            if !gpus.iter().any(|(id, _)| *id == gpu.id) {
                tracing::info!(
                    "model '{name}' version {version}: instances on GPU {} ({}), CUDA options: {options}",
                    gpu.id,
                    gpu.uuid
                );
                gpus.push((gpu.id, gpu.uuid.clone()));
            }
        }
    }
    let stats = Arc::new(ModelStats::with_gpus(name, version, &gpus, cache_responses));
    let gpu = |index: usize| devices[index].gpu().map(|gpu| gpu.id);
    warmup::run(dir, config, &io, &layout, &mut backends, &stats, gpu)?;
    let sessions = backends
        .into_iter()
        .zip(limits)
        .map(|(backend, limit)| Session::new(backend, Arc::clone(&layout), limit))
        .collect();
    let mut batching = config::batching_config(config, adaptive_batching);
    batching.layout = layout;
    let scheduler = Scheduler::launch(
        &format!("{name}-{version}"),
        batching,
        sessions,
        Arc::clone(&stats),
    )
    .map_err(|e| format!("failed to start instances: {e}"))?;
    stats.record_load(started.elapsed());
    Ok(ServingVersion {
        version,
        io,
        executor: Executor::Batched(scheduler),
        stats,
        cache: cache_responses,
        sequences: sequence.map(|spec| Arc::new(Sequences::new(spec.clone()))),
        tokenizer: text_input.map(|text| Arc::clone(text.tokenizer())),
        chat: None,
    })
}

/// Starts one version of a Python model: a process per instance, each through `initialize`;
/// `cached`: its responses go to the response cache.
fn start_python(
    name: &str,
    version: i64,
    (dir, path): (&Path, &Path),
    config: &ModelConfig,
    spec: &PythonSpec,
    (rate_limiter, limits): (Option<&Arc<RateLimiter>>, &[Option<InstanceLimit>]),
    cached: bool,
) -> Result<ServingVersion, String> {
    if !path.is_file() {
        return Err(format!("model file {} not found", path.display()));
    }
    let started = std::time::Instant::now();
    let io = IoSpec::from_config(config)?;
    // A version whose responses are cached has the cache's series too.
    let stats = Arc::new(ModelStats::with_gpus(name, version, &[], cached));
    let samples = super::warmup::samples(dir, config, &io)?;
    let limits = limits
        .iter()
        .map(|limit| Limit::for_instance(rate_limiter, limit.as_ref()))
        .collect::<Result<_, _>>()?;
    let model = PythonModel::start(config, version, (dir, path), spec, &samples, &stats, limits)?;
    stats.record_load(started.elapsed());
    Ok(ServingVersion {
        version,
        chat: llm_chat_template(name, dir, &io),
        io,
        executor: Executor::Python(Arc::new(model)),
        stats,
        cache: cached,
        sequences: None,
        tokenizer: None,
    })
}

/// The chat template in `dir` of a model whose contract is Triton's LLM tensors (BYTES
/// `text_input` in, BYTES `text_output` out); none for other models.
fn llm_chat_template(
    name: &str,
    dir: &Path,
    io: &IoSpec,
) -> Option<Result<Arc<crate::generate::chat::ChatTemplate>, String>> {
    if !io.is_llm() {
        return None;
    }
    Some(crate::generate::chat::ChatTemplate::load_for(name, dir)?.map(Arc::new))
}

/// The version's contract, checked against its graph; a text model's text input is bound to the
/// graph's token inputs, and its spec replaces them.
fn io_spec(
    config: &ModelConfig,
    layout: &BatchLayout,
    session: &OnnxSession,
    text: Option<&TextSpec>,
    sequence: Option<&SequenceSpec>,
) -> Result<(IoSpec, Option<Arc<TextInput>>), String> {
    // The inputs a stateful model's sequence batcher fills are not the clients'.
    let client_inputs: Vec<TensorInfo> = match sequence {
        Some(spec) => {
            spec.check_graph(&config.name, session.inputs(), session.outputs())?;
            session
                .inputs()
                .iter()
                .filter(|t| !spec.fills(&t.name))
                .cloned()
                .collect()
        }
        None => session.inputs().to_vec(),
    };
    // A text model shows clients its text input in place of the token inputs.
    let bound = text
        .map(|text| {
            let bound = text.bind(session.inputs()).map_err(|e| e.to_string())?;
            text::check_config(config, &bound)?;
            Ok::<_, String>(bound)
        })
        .transpose()?;
    let inputs = match &bound {
        Some(bound) => bound.client_inputs(&client_inputs),
        None => client_inputs,
    };
    let mut spec = IoSpec::with_defaults(
        config,
        layout,
        &inputs,
        session.defaults(),
        session.outputs(),
    )?;
    if let Some(bound) = &bound {
        for input in spec
            .inputs
            .iter_mut()
            .filter(|i| i.name == bound.text_input())
        {
            input.text = true;
        }
    }
    Ok((spec, bound.map(Arc::new)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_messages_follow_triton() {
        let failure = LoadFailure::Versions(BTreeMap::from([
            (1, "bad graph".to_string()),
            (2, DISCARDED.to_string()),
        ]));
        assert_eq!(
            failure.message("m"),
            "load failed for model 'm': version 1 is at UNAVAILABLE state: bad graph;"
        );
        assert_eq!(
            LoadFailure::Model("no config".into()).message("m"),
            "load failed for model 'm': no config"
        );
    }

    #[test]
    fn model_files_stay_inside_the_model_directory() {
        let dir = std::env::temp_dir();
        assert!(model_path(&dir, 1, "model.onnx").is_ok());
        for bad in ["../../etc/passwd", "/etc/passwd"] {
            assert_eq!(
                model_path(&dir, 1, bad).unwrap_err(),
                format!(
                    "default_model_filename '{bad}' must be a relative path inside the version \
                     directory"
                )
            );
        }
    }
}
