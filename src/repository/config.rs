//! `config.pbtxt`: parsing the protobuf text format into the typed [`ModelConfig`], filling in the
//! defaults Triton fills, and mapping config datatypes to protocol datatypes.

use crate::core::DataType;
use crate::proto::descriptor_pool;
use crate::proto::inference::{
    model_config::SchedulingChoice, model_version_policy, DataType as ConfigDataType, ModelConfig,
    ModelVersionPolicy,
};
use crate::proto::inference::{model_queue_policy, ModelQueuePolicy};
use crate::scheduler::{BatchingConfig, QueuePolicy, TimeoutAction};
use prost_reflect::DynamicMessage;
use std::time::Duration;

/// The ONNX Runtime platform and backend names; either one in a config selects ONNX Runtime.
pub const ONNX_PLATFORM: &str = "onnxruntime_onnx";
pub const ONNX_BACKEND: &str = "onnxruntime";
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";

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
/// [`ConfigError::Invalid`] when the name differs from the directory or the platform is not ONNX.
pub fn normalize_identity(config: &mut ModelConfig, dir_name: &str) -> Result<(), ConfigError> {
    if config.name.is_empty() {
        config.name = dir_name.to_string();
    } else if config.name != dir_name {
        return Err(ConfigError::Invalid(format!(
            "model name '{}' in config.pbtxt does not match the model directory name '{dir_name}'",
            config.name
        )));
    }
    let platform_ok = matches!(config.platform.as_str(), "" | ONNX_PLATFORM);
    let backend_ok = matches!(config.backend.as_str(), "" | ONNX_BACKEND);
    if !platform_ok || !backend_ok {
        return Err(ConfigError::Invalid(format!(
            "unsupported platform '{}' / backend '{}' for model '{}': kiln serves ONNX models \
             (platform \"{ONNX_PLATFORM}\" or backend \"{ONNX_BACKEND}\")",
            config.platform, config.backend, config.name
        )));
    }
    config.platform = ONNX_PLATFORM.to_string();
    config.backend = ONNX_BACKEND.to_string();
    if config.default_model_filename.is_empty() {
        config.default_model_filename = DEFAULT_MODEL_FILENAME.to_string();
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
    if config.max_batch_size < 0 {
        return Err(ConfigError::Invalid(format!(
            "max_batch_size must be non-negative for model '{}', got {}",
            config.name, config.max_batch_size
        )));
    }
    Ok(())
}

/// Checks every declared input and output has a usable datatype and dims.
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
    let tensors = config
        .input
        .iter()
        .map(|i| ("input", &i.name, i.data_type, &i.dims))
        .chain(
            config
                .output
                .iter()
                .map(|o| ("output", &o.name, o.data_type, &o.dims)),
        );
    for (kind, tensor, data_type, dims) in tensors {
        if datatype_from_config(data_type).is_none() {
            return Err(ConfigError::Invalid(format!(
                "{kind} '{tensor}' of model '{name}' has no valid data_type"
            )));
        }
        if dims.iter().any(|&d| d < -1 || d == 0) && kind == "input" {
            return Err(ConfigError::Invalid(format!(
                "{kind} '{tensor}' of model '{name}' has invalid dims {dims:?}"
            )));
        }
    }
    Ok(())
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

/// The scheduler settings a config asks for: `dynamic_batching` (preferred sizes, delay, priority
/// levels, queue policies per level); without it requests run one at a time. The in-flight bound
/// comes from [`max_inflight_requests`] (checked when the model loads).
pub fn batching_config(config: &ModelConfig) -> BatchingConfig {
    let max_batch_size = config.max_batch_size.max(0) as usize;
    let max_in_flight = max_inflight_requests(config).unwrap_or(0);
    let Some(SchedulingChoice::DynamicBatching(dynamic)) = &config.scheduling_choice else {
        return BatchingConfig {
            max_batch_size,
            max_in_flight,
            ..BatchingConfig::default()
        };
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
mod tests {
    use super::*;
    use crate::proto::inference::model_instance_group::Kind;
    use crate::proto::inference::model_version_policy::PolicyChoice;

    const ADD_SUB: &str = r#"
        name: "add_sub"
        backend: "onnxruntime"
        max_batch_size: 8
        input [
          { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
          { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
        ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "labels.txt" } ]
        # comments are allowed
        instance_group [ { count: 3 kind: KIND_CPU } ]
        version_policy: { specific { versions: [ 1, 3 ] } }
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
        parameters { key: "k" value: { string_value: "v" } }
        reshape_placeholder_ignored_by_test: 0
    "#;

    #[test]
    fn parses_triton_text_format() {
        let text = ADD_SUB.replace("reshape_placeholder_ignored_by_test: 0", "");
        let config = parse_config(&text).unwrap();
        assert_eq!(config.name, "add_sub");
        assert_eq!(config.max_batch_size, 8);
        assert_eq!(config.input.len(), 2);
        assert_eq!(config.input[1].dims, vec![16]);
        assert_eq!(
            datatype_from_config(config.input[0].data_type),
            Some(DataType::Fp32)
        );
        assert_eq!(config.output[0].label_filename, "labels.txt");
        assert_eq!(config.instance_group[0].count, 3);
        assert_eq!(config.instance_group[0].kind, Kind::Cpu as i32);
        assert!(has_dynamic_batching(&config));
        assert_eq!(config.parameters["k"].string_value, "v");
        match config.version_policy.unwrap().policy_choice.unwrap() {
            PolicyChoice::Specific(s) => assert_eq!(s.versions, vec![1, 3]),
            other => panic!("unexpected policy {other:?}"),
        }
    }

    #[test]
    fn rejects_unknown_fields_and_bad_syntax() {
        assert!(matches!(parse_config(ADD_SUB), Err(ConfigError::Parse(_))));
        assert!(matches!(parse_config("name: "), Err(ConfigError::Parse(_))));
        assert!(matches!(
            parse_config("input [ { data_type: TYPE_NOPE } ]"),
            Err(ConfigError::Parse(_))
        ));
        assert!(parse_config("").is_ok());
    }

    #[test]
    fn message_lists_without_colon() {
        assert_eq!(add_list_colons("input [ { } ]"), "input: [ { } ]");
        assert_eq!(add_list_colons("dims: [ 1 ]"), "dims: [ 1 ]");
        assert_eq!(add_list_colons("a # c [\n [ {} ]"), "a: # c [\n [ {} ]");
        assert_eq!(
            add_list_colons("name: \"x [\" output\n[{}]"),
            "name: \"x [\" output:\n[{}]"
        );
        assert_eq!(add_list_colons("kind: KIND_CPU [ ]"), "kind: KIND_CPU [ ]");
        assert_eq!(add_list_colons("s: 'it\\'s' x [ ]"), "s: 'it\\'s' x: [ ]");
        let config = parse_config(
            "input [ { name: \"a\" data_type: TYPE_FP32 dims: [ 1 ] } ]\ninstance_group [ { count: 1 } ]",
        )
        .unwrap();
        assert_eq!(config.input[0].name, "a");
        assert_eq!(config.instance_group[0].count, 1);
    }

    #[test]
    fn batching_settings_from_config() {
        let plain = batching_config(&parse_config("max_batch_size: 8").unwrap());
        assert!(!plain.dynamic);
        assert_eq!(plain.max_batch_size, 8);
        let config = parse_config(
            "max_batch_size: 16 dynamic_batching { preferred_batch_size: [ 8, 4 ] \
             max_queue_delay_microseconds: 500 priority_levels: 3 default_priority_level: 2 \
             default_queue_policy { max_queue_size: 10 default_timeout_microseconds: 2000 } \
             priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } } }",
        )
        .unwrap();
        let batching = batching_config(&config);
        assert!(batching.dynamic);
        assert_eq!(batching.preferred_batch_sizes, vec![8, 4]);
        assert_eq!(batching.max_queue_delay, Duration::from_micros(500));
        assert_eq!(
            (batching.priority_levels, batching.default_priority),
            (3, 2)
        );
        assert_eq!(batching.policies.len(), 3);
        assert_eq!(batching.policies[0].timeout_action, TimeoutAction::Delay);
        assert!(batching.policies[0].allow_timeout_override);
        assert_eq!(batching.policies[1].max_queue_size, 10);
        assert_eq!(
            batching.policies[2].default_timeout,
            Some(Duration::from_millis(2))
        );
        let empty =
            batching_config(&parse_config("max_batch_size: 4 dynamic_batching { }").unwrap());
        assert_eq!(
            (
                empty.priority_levels,
                empty.default_priority,
                empty.policies.len()
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn max_inflight_requests_parameter() {
        let with = |value: &str| {
            parse_config(&format!(
                "name: \"m\" parameters {{ key: \"max_inflight_requests\" value: {{ string_value: \"{value}\" }} }}"
            ))
            .unwrap()
        };
        assert_eq!(max_inflight_requests(&with("8")), Ok(8));
        assert_eq!(batching_config(&with(" 3 ")).max_in_flight, 3);
        assert_eq!(max_inflight_requests(&parse_config("").unwrap()), Ok(0));
        for bad in ["-1", "x", ""] {
            let err = max_inflight_requests(&with(bad)).unwrap_err().to_string();
            assert!(err.contains("must be a non-negative integer"), "{err}");
        }
    }

    #[test]
    fn identity_takes_directory_name_and_fills_platform() {
        let mut config = parse_config("backend: \"onnxruntime\"").unwrap();
        normalize_identity(&mut config, "m").unwrap();
        assert_eq!(config.name, "m");
        assert_eq!(config.platform, ONNX_PLATFORM);
        assert_eq!(config.backend, ONNX_BACKEND);
        assert_eq!(config.default_model_filename, "model.onnx");
        assert!(matches!(
            config.version_policy.unwrap().policy_choice,
            Some(PolicyChoice::Latest(model_version_policy::Latest {
                num_versions: 1
            }))
        ));
    }

    #[test]
    fn identity_rejects_mismatched_name_and_foreign_platform() {
        let mut config = parse_config("name: \"other\"").unwrap();
        assert!(normalize_identity(&mut config, "m").is_err());
        let mut config = parse_config("platform: \"tensorflow_savedmodel\"").unwrap();
        assert!(normalize_identity(&mut config, "m").is_err());
        let mut config = parse_config("platform: \"onnxruntime_onnx\"").unwrap();
        normalize_identity(&mut config, "m").unwrap();
        assert_eq!(config.backend, ONNX_BACKEND);
    }

    #[test]
    fn datatype_mapping_round_trips() {
        for dt in DataType::ALL {
            assert_eq!(
                datatype_from_config(datatype_to_config(dt) as i32),
                Some(dt)
            );
        }
        assert_eq!(datatype_from_config(0), None);
        assert_eq!(datatype_from_config(99), None);
    }

    #[test]
    fn json_uses_proto_names_and_enum_names() {
        let config =
            parse_config(&ADD_SUB.replace("reshape_placeholder_ignored_by_test: 0", "")).unwrap();
        let json = config_to_json(&config);
        assert_eq!(json["max_batch_size"], 8);
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
        assert_eq!(json["input"][0]["dims"][0], 16);
        assert_eq!(json["instance_group"][0]["kind"], "KIND_CPU");
        assert_eq!(json["output"][0]["label_filename"], "labels.txt");
        // Defaults are printed, unset messages are not (protobuf's always_print_primitive_fields).
        assert_eq!(json["input"][0]["optional"], false);
        assert_eq!(json["output"][0]["is_shape_tensor"], false);
        assert_eq!(json["batch_input"], serde_json::json!([]));
        assert!(json.get("sequence_batching").is_none());
        assert!(json["dynamic_batching"]["max_queue_delay_microseconds"].is_u64());
        assert_eq!(
            json["version_policy"]["specific"]["versions"],
            serde_json::json!([1, 3])
        );
    }

    #[test]
    fn validate_io_requires_inputs_outputs_and_types() {
        let config = parse_config("name: \"m\"").unwrap();
        assert!(validate_io(&config).is_err());
        let config = parse_config(
            "name: \"m\" input [{name: \"a\" dims: [1]}] output [{name: \"b\" data_type: TYPE_FP32 dims: [1]}]",
        )
        .unwrap();
        assert!(validate_io(&config).is_err());
    }
}
