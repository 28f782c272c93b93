//! The model repository: Triton's directory layout (`<root>/<model>/config.pbtxt`,
//! `<root>/<model>/<version>/model.onnx`), read once at start-up. Each model's config is parsed,
//! normalised and auto-completed from its ONNX graph; each version selected by the version policy
//! gets its own instances. A model that fails to load is kept with its reason and is not ready; it
//! never takes the server down.

pub mod autocomplete;
pub mod config;
mod io;
mod versions;

pub use io::{IoSpec, TensorSpec};

use crate::backend::{Backend, OnnxRuntime, OnnxSession, SessionOptions};
use crate::metrics::ModelStats;
use crate::proto::inference::ModelConfig;
use crate::scheduler::Scheduler;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::{info, warn};

/// How models are loaded.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Fill missing inputs/outputs/max_batch_size from the ONNX graph (Triton's default).
    pub auto_complete: bool,
    /// CPU cores to share between the instances of one model.
    pub cores: usize,
}

/// A version that is loaded and serving.
pub struct ServingVersion {
    pub version: i64,
    /// What requests must look like, and how their shapes map to the model's.
    pub io: IoSpec,
    pub scheduler: Scheduler,
    /// Triton's statistics and the Prometheus metrics of this version.
    pub stats: Arc<ModelStats>,
}

/// The state of one version the policy selected.
pub enum VersionState {
    Ready(Arc<ServingVersion>),
    /// Not serving, with the reason (load failure, missing file...).
    Unavailable(String),
}

/// One model directory.
pub struct Model {
    pub name: String,
    /// The effective config; `None` when it could not be read or completed.
    pub config: Option<Arc<ModelConfig>>,
    /// Why the model as a whole failed to load, if it did.
    pub failure: Option<String>,
    /// Versions selected by the version policy, by number.
    pub versions: BTreeMap<i64, VersionState>,
    /// Class labels of each output that names a `label_filename`, one per line, read at load time
    /// for the classification extension.
    pub labels: BTreeMap<String, Vec<String>>,
}

impl Model {
    /// Ready when it loaded and every selected version is serving.
    pub fn is_ready(&self) -> bool {
        self.failure.is_none()
            && !self.versions.is_empty()
            && self
                .versions
                .values()
                .all(|v| matches!(v, VersionState::Ready(_)))
    }

    /// The highest serving version.
    pub fn latest_ready(&self) -> Option<&Arc<ServingVersion>> {
        self.versions.values().rev().find_map(|v| match v {
            VersionState::Ready(serving) => Some(serving),
            VersionState::Unavailable(_) => None,
        })
    }
}

/// Every model found in the repository roots, by name.
#[derive(Default)]
pub struct Repository {
    models: BTreeMap<String, Model>,
}

impl Repository {
    /// Scans `roots` and loads every model. Blocking: ONNX Runtime sessions are built here.
    pub fn load(roots: &[PathBuf], options: &LoadOptions) -> Repository {
        let mut models = BTreeMap::new();
        for root in roots {
            let entries = match list_model_dirs(root) {
                Ok(entries) => entries,
                Err(e) => {
                    warn!(root = %root.display(), "cannot read model repository: {e}");
                    continue;
                }
            };
            for (name, dir) in entries {
                if models.contains_key(&name) {
                    warn!(model = %name, "model name appears in more than one repository; keeping the first");
                    continue;
                }
                let model = load_model(&name, &dir, options);
                match &model.failure {
                    Some(reason) => warn!(model = %name, "failed to load: {reason}"),
                    None => {
                        for (version, state) in &model.versions {
                            match state {
                                VersionState::Ready(_) => info!(model = %name, version, "loaded"),
                                VersionState::Unavailable(reason) => {
                                    warn!(model = %name, version, "failed to load: {reason}")
                                }
                            }
                        }
                    }
                }
                models.insert(name, model);
            }
        }
        Repository { models }
    }

    pub fn get(&self, name: &str) -> Option<&Model> {
        self.models.get(name)
    }

    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.models.values()
    }

    /// Strict readiness: every model in the repository is ready.
    pub fn all_ready(&self) -> bool {
        self.models.values().all(Model::is_ready)
    }
}

fn list_model_dirs(root: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        dirs.push((name, entry.path()));
    }
    dirs.sort();
    Ok(dirs)
}

fn failed(name: &str, config: Option<ModelConfig>, reason: String) -> Model {
    Model {
        name: name.to_string(),
        config: config.map(Arc::new),
        failure: Some(reason),
        versions: BTreeMap::new(),
        labels: BTreeMap::new(),
    }
}

fn load_model(name: &str, dir: &Path, options: &LoadOptions) -> Model {
    let mut config = match read_config(dir) {
        Ok(config) => config,
        Err(reason) => return failed(name, None, reason),
    };
    if let Err(e) = config::normalize_identity(&mut config, name) {
        return failed(name, None, e.to_string());
    }
    let selected = match versions::select(dir, &config) {
        Ok(selected) if selected.is_empty() => {
            return failed(
                name,
                Some(config),
                format!(
                "at least one version must be available under the version policy of model '{name}'"
            ),
            )
        }
        Ok(selected) => selected,
        Err(reason) => return failed(name, Some(config), reason),
    };
    if let Err(e) = config::normalize_instance_groups(&mut config) {
        return failed(name, Some(config), e.to_string());
    }
    let instances: usize = config
        .instance_group
        .iter()
        .map(|g| g.count.max(1) as usize)
        .sum();
    let session_options = SessionOptions {
        intra_op_threads: (options.cores / instances.max(1)).max(1),
    };
    let runtime = match OnnxRuntime::get() {
        Ok(runtime) => runtime,
        Err(e) => return failed(name, Some(config), e.to_string()),
    };
    let model_filename = config.default_model_filename.clone();
    let model_file = |version: i64| model_path(dir, version, &model_filename);

    let complete = !config.input.is_empty() && !config.output.is_empty();
    if options.auto_complete && !complete {
        // Triton completes the config from the newest selected version's graph.
        let Some(&newest) = selected.iter().rev().find(|v| model_file(**v).is_file()) else {
            return failed(
                name,
                Some(config),
                format!("no model file found for model '{name}'"),
            );
        };
        let probe = match OnnxSession::load(&runtime, &model_file(newest), &session_options) {
            Ok(probe) => probe,
            Err(e) => return failed(name, Some(config), e.to_string()),
        };
        if let Err(reason) =
            autocomplete::autocomplete(&mut config, probe.inputs(), probe.outputs())
        {
            return failed(name, Some(config), reason);
        }
    }
    if let Err(e) = config::validate_io(&config) {
        return failed(name, Some(config), e.to_string());
    }
    let labels = match read_labels(dir, &config) {
        Ok(labels) => labels,
        Err(reason) => return failed(name, Some(config), reason),
    };

    let versions = selected
        .iter()
        .map(|&version| {
            let state = load_version(
                name,
                version,
                &model_file(version),
                &config,
                instances,
                &runtime,
                &session_options,
            )
            .map_or_else(VersionState::Unavailable, |v| {
                VersionState::Ready(Arc::new(v))
            });
            (version, state)
        })
        .collect();
    Model {
        name: name.to_string(),
        config: Some(Arc::new(config)),
        failure: None,
        versions,
        labels,
    }
}

/// Reads each output's `label_filename` (relative to the model directory), one label per line as
/// Triton does. A named file that cannot be read fails the model.
fn read_labels(dir: &Path, config: &ModelConfig) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut labels = BTreeMap::new();
    for output in config
        .output
        .iter()
        .filter(|o| !o.label_filename.is_empty())
    {
        let path = dir.join(&output.label_filename);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "failed to read label file {} for output '{}': {e}",
                path.display(),
                output.name
            )
        })?;
        labels.insert(
            output.name.clone(),
            text.lines().map(str::to_string).collect(),
        );
    }
    Ok(labels)
}

fn read_config(dir: &Path) -> Result<ModelConfig, String> {
    let path = dir.join("config.pbtxt");
    match std::fs::read_to_string(&path) {
        Ok(text) => config::parse_config(&text).map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(format!("failed to read {}: {e}", path.display())),
    }
}

/// `<model>/<version>/<file>`, or `<file>/model.onnx` when the file is a directory holding a model
/// with external data.
fn model_path(dir: &Path, version: i64, file: &str) -> PathBuf {
    let path = dir.join(version.to_string()).join(file);
    if path.is_dir() {
        path.join(config::DEFAULT_MODEL_FILENAME)
    } else {
        path
    }
}

fn load_version(
    name: &str,
    version: i64,
    path: &Path,
    config: &ModelConfig,
    instances: usize,
    runtime: &OnnxRuntime,
    options: &SessionOptions,
) -> Result<ServingVersion, String> {
    if !path.is_file() {
        return Err(format!("model file {} not found", path.display()));
    }
    let mut backends: Vec<Box<dyn Backend>> = Vec::with_capacity(instances);
    let mut io = None;
    for _ in 0..instances {
        let session = OnnxSession::load(runtime, path, options).map_err(|e| e.to_string())?;
        if io.is_none() {
            io = Some(IoSpec::new(config, session.inputs(), session.outputs())?);
        }
        backends.push(Box::new(session));
    }
    let io = io.ok_or_else(|| format!("model '{name}' has no instances"))?;
    let stats = Arc::new(ModelStats::new(name, version));
    let scheduler = Scheduler::start(
        &format!("{name}-{version}"),
        config::batching_config(config),
        backends,
        Arc::clone(&stats),
    )
    .map_err(|e| format!("failed to start instances: {e}"))?;
    Ok(ServingVersion {
        version,
        io,
        scheduler,
        stats,
    })
}
