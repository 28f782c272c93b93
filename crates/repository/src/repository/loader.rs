//! Loading one model from a local directory, in two steps so the lifecycle can report LOADING
//! versions in between: [`prepare`] reads and completes the config, applies the version policy
//! and reads labels (cheap, except for the auto-complete probe); [`build`] starts the instances of
//! every selected version. A load is all or nothing, as in Triton: if one version fails, the
//! versions built so far are stopped and the model is reported with each version's reason.
//! Every failure is a [`LoadError`]: the store's, the model's config and files', or the backend's.

use super::agents;
use super::config::{self, DEFAULT_MODEL_FILENAME};
use super::ensemble::{self, EnsemblePlan};
use super::limits::{
    check_sessions, read_text, MAX_CONFIG_BYTES, MAX_LABELS, MAX_LABEL_FILE_BYTES,
};
use super::sequence::SequenceSpec;
use super::store::{contained, plain_relative, StoreError};
use super::tuning::{self, Tuning};
use super::{
    autocomplete, generation, placement, text, versions, LoadOptions, Model, ServingVersion,
};
use crate::backend::python::PythonSpec;
use crate::backend::tokenize::TextSpec;
use crate::backend::{cuda, Device, OnnxRuntime, OnnxSession, SessionOptions};
use crate::proto::inference::ModelConfig;
use crate::scheduler::rate_limit::{InstanceLimit, RateLimiter};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod error;
mod sessionless;
mod start;

pub use error::LoadError;
use sessionless::{prepare_ensemble, prepare_python};

/// Why a load failed: the model as a whole (store, config, policy, auto-complete), or some
/// versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    Model(LoadError),
    /// Every selected version with what became of it.
    Versions(BTreeMap<i64, VersionFailure>),
}

/// What became of one version of a load that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionFailure {
    /// It failed, for this reason.
    Failed(LoadError),
    /// It loaded but was dropped because a sibling failed; Triton reports such versions as
    /// unloaded.
    Discarded,
}

impl VersionFailure {
    /// The version's state reason, as the repository index reports it.
    pub fn reason(&self) -> &str {
        match self {
            VersionFailure::Failed(reason) => reason.message(),
            VersionFailure::Discarded => "unloaded",
        }
    }
}

impl LoadFailure {
    /// Triton's load error text: `version 1 is at UNAVAILABLE state: <reason>;` per failed version.
    pub fn message(&self, name: &str) -> String {
        match self {
            LoadFailure::Model(reason) => format!("load failed for model '{name}': {reason}"),
            LoadFailure::Versions(reasons) => {
                let detail: String = reasons
                    .iter()
                    .filter_map(|(v, failure)| match failure {
                        VersionFailure::Failed(reason) => {
                            Some(format!("version {v} is at UNAVAILABLE state: {reason};"))
                        }
                        VersionFailure::Discarded => None,
                    })
                    .collect();
                format!("load failed for model '{name}': {detail}")
            }
        }
    }
}

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
    /// Intra-op threads per session in a pool of its own: the config's count (or, for a
    /// generation model or independent operators run in parallel, a share of the cores);
    /// `None`: the sessions share the process's pool.
    intra_op_threads: Option<usize>,
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
/// The reason, as the index reports it: [`LoadError::Config`], except for an auto-complete probe
/// that could not run (a graph ONNX Runtime does not load, a Python model's
/// `auto_complete_config`): [`LoadError::Backend`].
pub fn prepare(
    name: &str,
    dir: &Path,
    config_override: Option<ModelConfig>,
    options: &LoadOptions,
) -> Result<Prepared, LoadError> {
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
        .map_err(|e| LoadError::Config(e.to_string()))?;
    agents::run(&config, dir).map_err(LoadError::Config)?;
    let selected = versions::select(dir, &config).map_err(LoadError::Config)?;
    if selected.is_empty() {
        return Err(LoadError::Config(format!(
            "at least one version must be available under the version policy of model '{name}'"
        )));
    }
    if ensemble::is_ensemble(&config) {
        return prepare_ensemble(name, dir, config, selected);
    }
    if config::is_python(&config) || backend_code.is_some() {
        return prepare_python(name, dir, config, selected, options, backend_code);
    }
    let placed = placement::place(&mut config, &cuda::inventory, options.gpu_fallback_to_cpu)
        .map_err(LoadError::Config)?;
    check_sessions(name, selected.len(), placed.devices.len()).map_err(LoadError::Config)?;
    if let Some(why) = &placed.fallback {
        tracing::warn!("model '{name}': {why}");
    }
    // Without --rate-limit, rate_limiter settings are left alone, as Triton leaves them.
    let limits = match options.rate_limiter {
        Some(_) => placement::instance_limits(&config, &placed).map_err(LoadError::Config)?,
        None => Vec::new(),
    };
    let generating = generation::is_generation(&config);
    let sequence = SequenceSpec::from_config(&config, dir).map_err(LoadError::Config)?;
    if generating && sequence.is_some() {
        return Err(LoadError::Config(format!(
            "generation model '{name}' cannot use sequence_batching: it keeps its own state"
        )));
    }
    let cache_responses = caches_responses(name, &config, options, generating, sequence.is_some());
    if generating && placed.devices.iter().any(|d| d.gpu().is_some()) {
        return Err(LoadError::Config(format!(
            "generation model '{name}' runs on CPU: give it a KIND_CPU instance group"
        )));
    }
    // A generation model runs one loop over one session, whatever the instance groups say, and
    // tokenizes in that loop (see `generation`).
    let mut tuning = tuning::tuning(&config).map_err(LoadError::Config)?;
    tuning.op_libraries = options
        .op_libraries
        .resolve(&config)
        .map_err(LoadError::Config)?;
    let intra_op_threads = own_threads(&tuning, generating, options.cores, placed.devices.len());
    let text = if generating {
        None
    } else {
        text::text_spec(&config, dir).map_err(LoadError::Config)?
    };
    let complete = !config.input.is_empty() && !config.output.is_empty();
    if generating {
        // The graph's inputs are tokens and caches; clients see Triton's LLM tensors.
        generation::complete_config(&mut config).map_err(LoadError::Config)?;
    } else if options.auto_complete && !complete {
        let cpu = SessionOptions {
            intra_op_threads,
            device: Device::Cpu,
            tuning: tuning.session(intra_op_threads.unwrap_or(1), None),
            pool_name: None,
        };
        let newest = (dir, selected.as_slice());
        complete_from_graph(name, newest, &mut config, text.as_ref(), &cpu, options)?;
    }
    config::fill_scheduler_defaults(&mut config);
    config::validate_io(&config).map_err(|e| LoadError::Config(e.to_string()))?;
    config::max_inflight_requests(&config).map_err(|e| LoadError::Config(e.to_string()))?;
    let adaptive_batching = config::adaptive_batching_delay(&config, options.adaptive_batching)
        .map_err(|e| LoadError::Config(e.to_string()))?;
    // Checked for every model, as Triton reads model_metrics, though only generation models
    // have the histogram it sets.
    crate::metrics::histogram::first_response_buckets(&config).map_err(LoadError::Config)?;
    let labels = read_labels(dir, &config).map_err(LoadError::Config)?;
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

/// Whether a version of a model (not an ensemble or a Python model) caches its responses: when
/// its config asks and the server has a cache, unless it generates or is stateful (a warning
/// says why a config's ask is not followed).
fn caches_responses(
    name: &str,
    config: &ModelConfig,
    options: &LoadOptions,
    generating: bool,
    stateful: bool,
) -> bool {
    let wants_cache = config::wants_response_cache(config);
    let cache_responses = wants_cache && options.response_cache && !generating && !stateful;
    if wants_cache && !cache_responses {
        let why = if generating {
            "generation (decoupled) models are not cached"
        } else if stateful {
            "stateful (sequence batching) models are not cached"
        } else {
            "the server was started without --cache-config"
        };
        tracing::warn!("model '{name}': response_cache is enabled but {why}: every request runs");
    }
    cache_responses
}

/// Completes `config` as Triton does, from the graph of the newest selected version (`(dir,
/// selected)`) loaded on the CPU with `cpu`.
///
/// # Errors
/// No model file, or a graph the config cannot be completed from ([`LoadError::Config`]); a
/// graph that does not load ([`LoadError::Backend`]).
fn complete_from_graph(
    name: &str,
    (dir, selected): (&Path, &[i64]),
    config: &mut ModelConfig,
    text: Option<&TextSpec>,
    cpu: &SessionOptions,
    options: &LoadOptions,
) -> Result<(), LoadError> {
    let runtime = OnnxRuntime::get().map_err(|e| LoadError::Backend(e.to_string()))?;
    let newest = selected
        .iter()
        .rev()
        .filter_map(|&v| model_path(dir, v, &config.default_model_filename).ok())
        .find(|path| path.is_file())
        .ok_or_else(|| LoadError::Config(format!("no model file found for model '{name}'")))?;
    let probe =
        OnnxSession::load(&runtime, &newest, cpu).map_err(|e| LoadError::Backend(e.to_string()))?;
    // A text model shows clients its text input in place of the token inputs.
    let inputs = match text {
        Some(spec) => spec
            .bind(probe.inputs())
            .map_err(|e| LoadError::Config(e.to_string()))?
            .client_inputs(probe.inputs()),
        None => probe.inputs().to_vec(),
    };
    autocomplete::autocomplete(
        config,
        &inputs,
        probe.outputs(),
        options.default_max_batch_size,
    )
    .map_err(LoadError::Config)
}

/// Starts every selected version (or takes it over from `reuse`).
///
/// # Errors
/// [`LoadFailure::Versions`] when any version fails; nothing built here keeps running then.
pub fn build(prepared: Prepared, reuse: Reuse<'_>) -> Result<Model, LoadFailure> {
    let runtime =
        OnnxRuntime::get().map_err(|e| LoadFailure::Model(LoadError::Backend(e.to_string())))?;
    let reusable = |version: i64| -> Option<Arc<ServingVersion>> {
        let (old, unchanged) = reuse?;
        if *old.config != prepared.config || !unchanged(version) {
            return None;
        }
        old.versions.get(&version).cloned()
    };
    let mut built = BTreeMap::new();
    let mut failures = BTreeMap::new();
    for &version in &prepared.versions {
        if let Some(serving) = reusable(version) {
            built.insert(version, serving);
            continue;
        }
        match prepared.start(version, &runtime) {
            Ok(serving) => {
                built.insert(version, Arc::new(serving));
            }
            Err(reason) => {
                failures.insert(version, VersionFailure::Failed(reason));
            }
        }
    }
    if !failures.is_empty() {
        for (version, serving) in built {
            failures.insert(version, VersionFailure::Discarded);
            // Stop only what this load started; reused versions still serve the old model.
            if let Ok(serving) = Arc::try_unwrap(serving) {
                serving.executor.stop();
            }
        }
        return Err(LoadFailure::Versions(failures));
    }
    let Prepared {
        name,
        config,
        labels,
        fallback,
        ..
    } = prepared;
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
/// The intra-op threads of each session's own pool, if it gets one. Sessions share the
/// process's ONNX Runtime pools, sized to the cores, so that a version that runs nothing costs
/// no thread; a config that asks for threads of its own gets them (`intra_op_thread_count`), and
/// so do a generation model (one loop on all the cores) and a config that runs independent
/// operators in parallel (a share of the cores among its `instances`).
fn own_threads(tuning: &Tuning, generating: bool, cores: usize, instances: usize) -> Option<usize> {
    match tuning.intra_op_threads {
        Some(threads) => Some(threads),
        None if generating => Some(cores.max(1)),
        None if tuning.runs_operators_in_parallel() => Some((cores / instances.max(1)).max(1)),
        None => None,
    }
}

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
///
/// # Errors
/// [`LoadError::Config`]: a config name that leaves the model directory, a config that cannot
/// be read or does not parse.
fn read_config(dir: &Path, config_name: Option<&str>) -> Result<ModelConfig, LoadError> {
    let refused = |e: StoreError| LoadError::Config(e.to_string());
    let custom = config_name
        .map(|name| contained(dir, &format!("configs/{name}.pbtxt")))
        .transpose()
        .map_err(refused)?
        .filter(|path| path.is_file());
    let path = match custom {
        Some(path) => path,
        None => contained(dir, "config.pbtxt").map_err(refused)?,
    };
    match read_text(&path, MAX_CONFIG_BYTES) {
        Ok(text) => config::parse_config(&text).map_err(|e| LoadError::Config(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(LoadError::Config(format!(
            "failed to read {}: {e}",
            path.display()
        ))),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_messages_follow_triton() {
        let failure = LoadFailure::Versions(BTreeMap::from([
            (
                1,
                VersionFailure::Failed(LoadError::Backend("bad graph".into())),
            ),
            (2, VersionFailure::Discarded),
        ]));
        assert_eq!(
            failure.message("m"),
            "load failed for model 'm': version 1 is at UNAVAILABLE state: bad graph;"
        );
        assert_eq!(
            LoadFailure::Model(LoadError::Config("no config".into())).message("m"),
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
