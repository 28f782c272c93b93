//! `config.pbtxt`: parsing the protobuf text format into the typed [`ModelConfig`], filling in the
//! defaults Triton fills, and mapping config datatypes to protocol datatypes.

use super::limits::{check_dims, MAX_BATCH_SIZE, MAX_TENSORS};
use crate::core::DataType;
use crate::proto::descriptor_pool;
use crate::proto::inference::model_input::Format as ModelInputFormat;
use crate::proto::inference::{
    model_config::SchedulingChoice, model_version_policy, DataType as ConfigDataType, ModelConfig,
    ModelTensorReshape, ModelVersionPolicy,
};
use crate::proto::inference::{model_queue_policy, ModelQueuePolicy};
use crate::scheduler::{BatchingConfig, QueuePolicy, TimeoutAction};
use prost_reflect::DynamicMessage;
use std::time::Duration;

/// The ONNX Runtime platform and backend names; either one in a config selects ONNX Runtime.
pub const ONNX_PLATFORM: &str = "onnxruntime_onnx";
pub const ONNX_BACKEND: &str = "onnxruntime";
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";
use crate::backend::python::{
    BACKEND as PYTHON_BACKEND, DEFAULT_MODEL_FILENAME as PYTHON_MODEL_FILENAME,
};

/// Whether `config` is a Python model's (`backend: "python"`, Triton's Python backend).
pub fn is_python(config: &ModelConfig) -> bool {
    config.backend == PYTHON_BACKEND
}

/// Why a configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to parse config.pbtxt: {0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

/// Parses protobuf text format into a [`ModelConfig`].
///
/// # Errors
/// [`ConfigError::Parse`] with the parser's position and reason.
pub fn parse_config(text: &str) -> Result<ModelConfig, ConfigError> {
    let descriptor = descriptor_pool()
        .get_message_by_name("inference.ModelConfig")
        .expect("inference.ModelConfig is in the descriptor set");
    let text = add_list_colons(text);
    let message = DynamicMessage::parse_text_format(descriptor, &text)
        .map_err(|e| ConfigError::Parse(e.to_string()))?;
    message
        .transcode_to::<ModelConfig>()
        .map_err(|e| ConfigError::Parse(e.to_string()))
}

/// The text-format grammar lets a list of messages follow its field name without a colon
/// (`input [ { ... } ]`), which is how Triton's configs are written; prost-reflect's parser insists
/// on the colon. This inserts it: after an identifier in field-name position (not preceded by
/// `:`) that is followed by `[`. Strings and `#` comments are skipped, so their contents never
/// change.
fn add_list_colons(text: &str) -> std::borrow::Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut insert_at = Vec::new();
    let mut previous: Option<u8> = None; // last significant byte outside strings and comments
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' | b'\'' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                previous = Some(b'"');
                continue;
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.')
                {
                    i += 1;
                }
                let field_position = previous != Some(b':');
                previous = Some(b'a');
                if field_position && next_significant(bytes, i) == Some(b'[') {
                    insert_at.push(i);
                }
                continue;
            }
            b if b.is_ascii_whitespace() => {}
            other => previous = Some(other),
        }
        i += 1;
    }
    if insert_at.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + insert_at.len());
    let mut last = 0;
    for at in insert_at {
        out.push_str(&text[last..at]);
        out.push(':');
        last = at;
    }
    out.push_str(&text[last..]);
    std::borrow::Cow::Owned(out)
}

/// The next byte that is neither whitespace nor inside a `#` comment.
fn next_significant(bytes: &[u8], mut i: usize) -> Option<u8> {
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b if b.is_ascii_whitespace() => i += 1,
            b => return Some(b),
        }
    }
    None
}

/// Renders a config as protobuf JSON the way Triton's REST `/config` does (see
/// [`crate::proto::to_json`]), so clients find e.g. `"max_batch_size": 0`.
pub fn config_to_json(config: &ModelConfig) -> serde_json::Value {
    crate::proto::to_json(config, "inference.ModelConfig")
}

/// Config datatype (`TYPE_FP32`) → protocol datatype (`FP32`); `TYPE_STRING` is `BYTES`.
pub fn datatype_from_config(value: i32) -> Option<DataType> {
    Some(match ConfigDataType::try_from(value).ok()? {
        ConfigDataType::TypeInvalid => return None,
        ConfigDataType::TypeBool => DataType::Bool,
        ConfigDataType::TypeUint8 => DataType::Uint8,
        ConfigDataType::TypeUint16 => DataType::Uint16,
        ConfigDataType::TypeUint32 => DataType::Uint32,
        ConfigDataType::TypeUint64 => DataType::Uint64,
        ConfigDataType::TypeInt8 => DataType::Int8,
        ConfigDataType::TypeInt16 => DataType::Int16,
        ConfigDataType::TypeInt32 => DataType::Int32,
        ConfigDataType::TypeInt64 => DataType::Int64,
        ConfigDataType::TypeFp16 => DataType::Fp16,
        ConfigDataType::TypeFp32 => DataType::Fp32,
        ConfigDataType::TypeFp64 => DataType::Fp64,
        ConfigDataType::TypeString => DataType::Bytes,
        ConfigDataType::TypeBf16 => DataType::Bf16,
    })
}

/// Protocol datatype → config datatype.
pub fn datatype_to_config(datatype: DataType) -> ConfigDataType {
    match datatype {
        DataType::Bool => ConfigDataType::TypeBool,
        DataType::Uint8 => ConfigDataType::TypeUint8,
        DataType::Uint16 => ConfigDataType::TypeUint16,
        DataType::Uint32 => ConfigDataType::TypeUint32,
        DataType::Uint64 => ConfigDataType::TypeUint64,
        DataType::Int8 => ConfigDataType::TypeInt8,
        DataType::Int16 => ConfigDataType::TypeInt16,
        DataType::Int32 => ConfigDataType::TypeInt32,
        DataType::Int64 => ConfigDataType::TypeInt64,
        DataType::Fp16 => ConfigDataType::TypeFp16,
        DataType::Bf16 => ConfigDataType::TypeBf16,
        DataType::Fp32 => ConfigDataType::TypeFp32,
        DataType::Fp64 => ConfigDataType::TypeFp64,
        DataType::Bytes => ConfigDataType::TypeString,
    }
}

/// Checks the name and platform and fills what Triton fills before loading: the name from the
/// directory, both platform and backend, the default model filename and the version policy.
///
/// # Errors
/// [`ConfigError::Invalid`] when the name differs from the directory, the platform is not ONNX
/// or the config asks for a scheduler kiln does not have (ensemble scheduling outside an
/// ensemble, sequence batching of an ensemble). `python_based`: the backend is a Python-based
/// one (see [`crate::backend::python::backend_code`]), served like `backend: "python"`.
pub fn normalize_identity(
    config: &mut ModelConfig,
    dir_name: &str,
    python_based: bool,
) -> Result<(), ConfigError> {
    if config.name.is_empty() {
        config.name = dir_name.to_string();
    } else if config.name != dir_name {
        return Err(ConfigError::Invalid(format!(
            "model name '{}' in config.pbtxt does not match the model directory name '{dir_name}'",
            config.name
        )));
    }
    let ensemble = super::ensemble::is_ensemble(config);
    let python = is_python(config) || python_based;
    let platform_ok = ensemble
        || (python && config.platform.is_empty())
        || matches!(config.platform.as_str(), "" | ONNX_PLATFORM);
    let backend_ok = if ensemble {
        config.backend.is_empty()
    } else {
        python || matches!(config.backend.as_str(), "" | ONNX_BACKEND)
    };
    if !platform_ok || !backend_ok {
        return Err(ConfigError::Invalid(format!(
            "unsupported platform '{}' / backend '{}' for model '{}': kiln serves ONNX models \
             (platform \"{ONNX_PLATFORM}\" or backend \"{ONNX_BACKEND}\"), Python models (backend \
             \"{PYTHON_BACKEND}\", or a Python-based backend's <backend-directory>/<backend>/model.py) \
             and ensembles (platform \"{}\")",
            config.platform,
            config.backend,
            config.name,
            super::ensemble::PLATFORM
        )));
    }
    let unsupported = match &config.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(_)) if ensemble => {
            Some("sequence_batching in an ensemble")
        }
        Some(SchedulingChoice::EnsembleScheduling(_)) if !ensemble => {
            Some("ensemble_scheduling outside an ensemble (platform \"ensemble\")")
        }
        _ => None,
    };
    if let Some(what) = unsupported {
        return Err(ConfigError::Invalid(format!(
            "{what} is not supported: kiln cannot serve model '{}'",
            config.name
        )));
    }
    if python {
        if config.default_model_filename.is_empty() {
            config.default_model_filename = PYTHON_MODEL_FILENAME.to_string();
        }
    } else if !ensemble {
        config.platform = ONNX_PLATFORM.to_string();
        config.backend = ONNX_BACKEND.to_string();
        if config.default_model_filename.is_empty() {
            config.default_model_filename = DEFAULT_MODEL_FILENAME.to_string();
        }
    }
    if config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
        .is_none()
    {
        config.version_policy = Some(ModelVersionPolicy {
            policy_choice: Some(model_version_policy::PolicyChoice::Latest(
                model_version_policy::Latest { num_versions: 1 },
            )),
        });
    }
    // Triton's defaults, which its effective config shows: pinned host buffers on (an
    // ensemble's config has none: it runs nothing itself).
    if !ensemble {
        let optimization = config.optimization.get_or_insert_with(Default::default);
        let pinned = || crate::proto::inference::model_optimization_policy::PinnedMemoryBuffer {
            enable: true,
        };
        optimization.input_pinned_memory.get_or_insert_with(pinned);
        optimization.output_pinned_memory.get_or_insert_with(pinned);
    }
    if config.max_batch_size < 0 {
        return Err(ConfigError::Invalid(format!(
            "max_batch_size must be non-negative for model '{}', got {}",
            config.name, config.max_batch_size
        )));
    }
    if config.max_batch_size > MAX_BATCH_SIZE {
        return Err(ConfigError::Invalid(format!(
            "max_batch_size {} of model '{}' is larger than the {MAX_BATCH_SIZE} kiln allows",
            config.max_batch_size, config.name
        )));
    }
    Ok(())
}

/// Checks every declared input and output has a usable datatype and dims (see
/// [`check_dims`]; a `reshape` too), and that there are at most [`MAX_TENSORS`] of each.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the first offending tensor.
pub fn validate_io(config: &ModelConfig) -> Result<(), ConfigError> {
    let name = &config.name;
    if config.input.is_empty() || config.output.is_empty() {
        return Err(ConfigError::Invalid(format!(
            "model '{name}' must declare at least one input and one output \
             (or leave them out and let auto-complete read them from the model)"
        )));
    }
    for (kind, count) in [
        ("inputs", config.input.len()),
        ("outputs", config.output.len()),
    ] {
        if count > MAX_TENSORS {
            return Err(ConfigError::Invalid(format!(
                "model '{name}' declares {count} {kind}, more than the {MAX_TENSORS} kiln allows"
            )));
        }
    }
    // TensorRT's tensor kinds: an ONNX Runtime model has none, so a config asking for one is
    // refused rather than served as if it did not.
    let tensorrt_only = config
        .input
        .iter()
        .map(|i| (&i.name, i.is_shape_tensor, i.is_non_linear_format_io))
        .chain(
            config
                .output
                .iter()
                .map(|o| (&o.name, o.is_shape_tensor, o.is_non_linear_format_io)),
        )
        .find(|(_, shape, non_linear)| *shape || *non_linear);
    if let Some((tensor, shape, _)) = tensorrt_only {
        let what = if shape {
            "is_shape_tensor"
        } else {
            "is_non_linear_format_io"
        };
        return Err(ConfigError::Invalid(format!(
            "tensor '{tensor}' of model '{name}' sets {what}, which only TensorRT models use"
        )));
    }
    // Triton's rule: an image format describes a [C, H, W] or [H, W, C] tensor.
    if let Some(input) = config
        .input
        .iter()
        .find(|i| i.format != ModelInputFormat::None as i32 && i.dims.len() != 3)
    {
        return Err(ConfigError::Invalid(format!(
            "input '{}' of model '{name}': model input NHWC/NCHW require 3 dims",
            input.name
        )));
    }
    let tensors = config
        .input
        .iter()
        .map(|i| {
            (
                "input",
                &i.name,
                i.data_type,
                &i.dims,
                reshape_dims(&i.reshape),
            )
        })
        .chain(config.output.iter().map(|o| {
            (
                "output",
                &o.name,
                o.data_type,
                &o.dims,
                reshape_dims(&o.reshape),
            )
        }));
    for (kind, tensor, data_type, dims, reshape) in tensors {
        let prefix = format!("model '{name}', {kind} '{tensor}'");
        if datatype_from_config(data_type).is_none() {
            return Err(ConfigError::Invalid(format!(
                "{kind} '{tensor}' of model '{name}' has no valid data_type"
            )));
        }
        check_dims(&prefix, "dims", dims).map_err(ConfigError::Invalid)?;
        if let Some(reshape) = reshape {
            check_dims(&prefix, "reshape dims", reshape).map_err(ConfigError::Invalid)?;
        }
    }
    Ok(())
}

fn reshape_dims(reshape: &Option<ModelTensorReshape>) -> Option<&[i64]> {
    reshape.as_ref().map(|r| r.shape.as_slice())
}

/// The config parameter that bounds a model version's requests in flight (queued or running).
pub const MAX_INFLIGHT_REQUESTS: &str = "max_inflight_requests";

/// The model's `max_inflight_requests` parameter (`parameters { key: "max_inflight_requests"
/// value: { string_value: "N" } }`, a string as every Triton parameter); 0 when absent.
///
/// # Errors
/// [`ConfigError::Invalid`] when the value is not a non-negative integer.
pub fn max_inflight_requests(config: &ModelConfig) -> Result<usize, ConfigError> {
    let Some(parameter) = config.parameters.get(MAX_INFLIGHT_REQUESTS) else {
        return Ok(0);
    };
    parameter.string_value.trim().parse().map_err(|_| {
        ConfigError::Invalid(format!(
            "parameter '{MAX_INFLIGHT_REQUESTS}' of model '{}' must be a non-negative integer, got '{}'",
            config.name, parameter.string_value
        ))
    })
}

/// The config parameter that turns the batcher's opt-in shortcuts on or off for one model (see
/// [`BatchingConfig::adaptive_delay`]): `"true"` lets a batch go before its
/// `max_queue_delay_microseconds` when waiting looks useless to closed-loop clients; `"false"`
/// keeps Triton's batcher (every batch that reaches no preferred size waits out its delay)
/// whatever `--adaptive-batching` says.
pub const ADAPTIVE_BATCHING_DELAY: &str = "adaptive_batching_delay";

/// The model's `adaptive_batching_delay` parameter; `server_default` (`--adaptive-batching`,
/// off unless given) when absent.
///
/// # Errors
/// [`ConfigError::Invalid`] when the value is neither `true` nor `false`.
pub fn adaptive_batching_delay(
    config: &ModelConfig,
    server_default: bool,
) -> Result<bool, ConfigError> {
    let Some(parameter) = config.parameters.get(ADAPTIVE_BATCHING_DELAY) else {
        return Ok(server_default);
    };
    match parameter.string_value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ConfigError::Invalid(format!(
            "parameter '{ADAPTIVE_BATCHING_DELAY}' of model '{}' must be \"true\" or \"false\", got '{}'",
            config.name, parameter.string_value
        ))),
    }
}

/// The scheduler settings a config asks for: `dynamic_batching` (preferred sizes, delay, priority
/// levels, queue policies per level); without it requests run one at a time. The in-flight bound
/// comes from [`max_inflight_requests`]; `adaptive` turns on the delay's shortcuts (the
/// model's [`adaptive_batching_delay`], checked when the model loads).
pub fn batching_config(config: &ModelConfig, adaptive: bool) -> BatchingConfig {
    let max_batch_size = config.max_batch_size.max(0) as usize;
    let max_in_flight = max_inflight_requests(config).unwrap_or(0);
    let dynamic = match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(dynamic)) => dynamic,
        // The sequence batcher: one request of a sequence at a time, but requests of different
        // sequences batch together, by the strategy's delay and preferred sizes.
        Some(SchedulingChoice::SequenceBatching(sequence)) if max_batch_size > 1 => {
            use crate::proto::inference::model_sequence_batching::StrategyChoice;
            let (delay, preferred) = match &sequence.strategy_choice {
                Some(StrategyChoice::Oldest(oldest)) => (
                    oldest.max_queue_delay_microseconds,
                    oldest.preferred_batch_size.clone(),
                ),
                Some(StrategyChoice::Direct(direct)) => {
                    (direct.max_queue_delay_microseconds, Vec::new())
                }
                None => (0, Vec::new()),
            };
            return BatchingConfig {
                dynamic: true,
                max_batch_size,
                preferred_batch_sizes: preferred
                    .into_iter()
                    .filter(|&size| size > 0)
                    .map(|size| size as usize)
                    .collect(),
                max_queue_delay: Duration::from_micros(delay),
                max_in_flight,
                adaptive_delay: adaptive,
                ..BatchingConfig::default()
            };
        }
        _ => {
            return BatchingConfig {
                max_batch_size,
                max_in_flight,
                ..BatchingConfig::default()
            };
        }
    };
    let levels = (dynamic.priority_levels as usize).max(1);
    let policy = |p: Option<&ModelQueuePolicy>| {
        p.map_or_else(QueuePolicy::default, |p| QueuePolicy {
            max_queue_size: p.max_queue_size as usize,
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            timeout_action: if p.timeout_action == model_queue_policy::TimeoutAction::Delay as i32 {
                TimeoutAction::Delay
            } else {
                TimeoutAction::Reject
            },
            allow_timeout_override: p.allow_timeout_override,
        })
    };
    let default_policy = dynamic.default_queue_policy.as_ref();
    BatchingConfig {
        dynamic: true,
        max_batch_size,
        preferred_batch_sizes: dynamic
            .preferred_batch_size
            .iter()
            .filter(|&&size| size > 0)
            .map(|&size| size as usize)
            .collect(),
        max_queue_delay: Duration::from_micros(dynamic.max_queue_delay_microseconds),
        priority_levels: levels,
        default_priority: (dynamic.default_priority_level as usize).clamp(1, levels),
        policies: (1..=levels as u64)
            .map(|level| policy(dynamic.priority_queue_policy.get(&level).or(default_policy)))
            .collect(),
        max_in_flight,
        adaptive_delay: adaptive,
        layout: Default::default(),
    }
}

/// Whether the config asks for its responses to be cached (`response_cache { enable: true }`).
pub fn wants_response_cache(config: &ModelConfig) -> bool {
    config
        .response_cache
        .as_ref()
        .is_some_and(|cache| cache.enable)
}

/// Fills in the scheduler settings Triton completes every config with, so that the config
/// clients read says what runs: a dynamic batcher without preferred batch sizes prefers
/// `max_batch_size` (batching is the same: a full batch goes at once either way); a sequence
/// batcher without an idle time drops sequences after the default 1 s.
pub fn fill_scheduler_defaults(config: &mut ModelConfig) {
    let max_batch_size = config.max_batch_size;
    match &mut config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(batching))
            if batching.preferred_batch_size.is_empty() && max_batch_size > 0 =>
        {
            batching.preferred_batch_size.push(max_batch_size);
        }
        Some(SchedulingChoice::SequenceBatching(batching))
            if batching.max_sequence_idle_microseconds == 0 =>
        {
            batching.max_sequence_idle_microseconds =
                u64::try_from(super::sequence::DEFAULT_IDLE.as_micros()).unwrap_or(u64::MAX);
        }
        _ => {}
    }
}

/// Whether the config asks for the dynamic batcher.
pub fn has_dynamic_batching(config: &ModelConfig) -> bool {
    matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(_))
    )
}

#[cfg(test)]
mod tests;
