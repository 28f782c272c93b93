//! Preparing the models that run no ONNX Runtime session of their own: an ensemble (its plan)
//! and a Python model (its processes).

use super::{model_path, read_labels, LoadError, Prepared};
use crate::backend::python::PythonSpec;
use crate::proto::inference::ModelConfig;
use crate::repository::sequence::SequenceSpec;
use crate::repository::{autocomplete, config, ensemble, placement, tuning, LoadOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An ensemble needs no session: its plan, checked, and its declared tensors.
pub(super) fn prepare_ensemble(
    name: &str,
    dir: &Path,
    config: ModelConfig,
    versions: Vec<i64>,
) -> Result<Prepared, LoadError> {
    let plan = ensemble::plan(&config).map_err(LoadError::Config)?;
    config::validate_io(&config).map_err(|e| LoadError::Config(e.to_string()))?;
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
    ) -> Result<Prepared, LoadError> {
        Ok(Prepared {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            labels: read_labels(dir, &config).map_err(LoadError::Config)?,
            tuning: tuning::tuning(&config).map_err(LoadError::Config)?,
            config,
            versions,
            devices: Vec::new(),
            limits: Vec::new(),
            rate_limiter: None,
            intra_op_threads: None,
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
///
/// # Errors
/// [`LoadError::Config`], except for an `auto_complete_config` that could not be run
/// ([`LoadError::Backend`]).
pub(super) fn prepare_python(
    name: &str,
    dir: &Path,
    mut config: ModelConfig,
    versions: Vec<i64>,
    options: &LoadOptions,
    code: Option<PathBuf>,
) -> Result<Prepared, LoadError> {
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
            autocomplete::python(&mut config, dir, &path, &options.python_env)
                .map_err(LoadError::Backend)?;
        }
    }
    if config.input.is_empty() && config.output.is_empty() {
        return Err(LoadError::Config(format!(
            "Python model '{name}' declares no inputs or outputs (in config.pbtxt or with \
             auto_complete_config)"
        )));
    }
    let mut python = PythonSpec {
        code,
        ..PythonSpec::from_config(&mut config, dir, &options.python_calls, &options.python_env)
            .map_err(LoadError::Config)?
    };
    config::fill_scheduler_defaults(&mut config);
    config::validate_io(&config).map_err(|e| LoadError::Config(e.to_string()))?;
    config::max_inflight_requests(&config).map_err(|e| LoadError::Config(e.to_string()))?;
    python.adaptive_batching = config::adaptive_batching_delay(&config, options.adaptive_batching)
        .map_err(|e| LoadError::Config(e.to_string()))?;
    // As Triton: a decoupled model's responses are not cached.
    let decoupled = config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    let sequence = SequenceSpec::from_config(&config, dir).map_err(LoadError::Config)?;
    if let Some(spec) = &sequence {
        if spec.has_states() {
            return Err(LoadError::Config(format!(
                "Python model '{name}': sequence_batching state (implicit state) is not served for \
                 Python models: the model keeps a sequence's state itself, by correlation_id()"
            )));
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
            .collect::<Result<_, _>>()
            .map_err(LoadError::Config)?,
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
