//! Tests of config parsing, normalisation and validation.

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
    let plain = batching_config(&parse_config("max_batch_size: 8").unwrap(), false);
    assert!(!plain.dynamic);
    assert_eq!(plain.max_batch_size, 8);
    let config = parse_config(
        "max_batch_size: 16 dynamic_batching { preferred_batch_size: [ 8, 4 ] \
         max_queue_delay_microseconds: 500 priority_levels: 3 default_priority_level: 2 \
         default_queue_policy { max_queue_size: 10 default_timeout_microseconds: 2000 } \
         priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } } }",
    )
    .unwrap();
    let batching = batching_config(&config, false);
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
    let empty = batching_config(
        &parse_config("max_batch_size: 4 dynamic_batching { }").unwrap(),
        false,
    );
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
    assert_eq!(batching_config(&with(" 3 "), false).max_in_flight, 3);
    assert_eq!(max_inflight_requests(&parse_config("").unwrap()), Ok(0));
    for bad in ["-1", "x", ""] {
        let err = max_inflight_requests(&with(bad)).unwrap_err().to_string();
        assert!(err.contains("must be a non-negative integer"), "{err}");
    }
}

#[test]
fn adaptive_batching_delay_parameter() {
    let with = |value: &str| {
        parse_config(&format!(
            "name: \"m\" max_batch_size: 8 dynamic_batching {{ max_queue_delay_microseconds: 100 }} \
             parameters {{ key: \"adaptive_batching_delay\" value: {{ string_value: \"{value}\" }} }}"
        ))
        .unwrap()
    };
    // The parameter wins over the server's default either way.
    assert_eq!(adaptive_batching_delay(&with("false"), true), Ok(false));
    assert_eq!(adaptive_batching_delay(&with(" FALSE "), true), Ok(false));
    assert_eq!(adaptive_batching_delay(&with("true"), false), Ok(true));
    let plain = parse_config("max_batch_size: 8 dynamic_batching { }").unwrap();
    assert_eq!(
        adaptive_batching_delay(&plain, false),
        Ok(false),
        "off by default"
    );
    assert_eq!(
        adaptive_batching_delay(&plain, true),
        Ok(true),
        "--adaptive-batching"
    );
    assert!(batching_config(&plain, true).adaptive_delay);
    assert!(!batching_config(&plain, false).adaptive_delay);
    let err = adaptive_batching_delay(&with("no"), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be \"true\" or \"false\""), "{err}");
}

#[test]
fn identity_takes_directory_name_and_fills_platform() {
    let mut config = parse_config("backend: \"onnxruntime\"").unwrap();
    normalize_identity(&mut config, "m", false).unwrap();
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
    assert_eq!(
        normalize_identity(&mut config, "m", false).unwrap_err(),
        ConfigError::Invalid(
            "model name 'other' in config.pbtxt does not match the model directory name 'm'".into()
        )
    );
    let mut config = parse_config("platform: \"tensorflow_savedmodel\"").unwrap();
    assert_eq!(
        normalize_identity(&mut config, "m", false).unwrap_err(),
        ConfigError::Invalid(
            "unsupported platform 'tensorflow_savedmodel' / backend '' for model 'm': \
             kiln serves ONNX models (platform \"onnxruntime_onnx\" or backend \
             \"onnxruntime\"), Python models (backend \"python\", or a Python-based backend's \
             <backend-directory>/<backend>/model.py) and ensembles (platform \"ensemble\")"
                .into()
        )
    );
    let mut config = parse_config("platform: \"onnxruntime_onnx\"").unwrap();
    normalize_identity(&mut config, "m", false).unwrap();
    assert_eq!(config.backend, ONNX_BACKEND);
    // Ensembles keep their platform and have no backend or model file.
    let mut config = parse_config("platform: \"ensemble\"").unwrap();
    normalize_identity(&mut config, "m", false).unwrap();
    assert_eq!(
        (
            config.platform.as_str(),
            config.backend.as_str(),
            config.default_model_filename.as_str()
        ),
        ("ensemble", "", "")
    );
    let mut config = parse_config("platform: \"ensemble\" backend: \"onnxruntime\"").unwrap();
    assert_eq!(
        normalize_identity(&mut config, "m", false).unwrap_err(),
        ConfigError::Invalid(
            "unsupported platform 'ensemble' / backend 'onnxruntime' for model 'm': \
             kiln serves ONNX models (platform \"onnxruntime_onnx\" or backend \
             \"onnxruntime\"), Python models (backend \"python\", or a Python-based backend's \
             <backend-directory>/<backend>/model.py) and ensembles (platform \"ensemble\")"
                .into()
        )
    );
}

#[test]
fn identity_rejects_schedulers_kiln_does_not_have() {
    for (text, what) in [
        (
            "backend: \"onnxruntime\" ensemble_scheduling { step [ { model_name: \"a\" } ] }",
            "ensemble_scheduling outside an ensemble (platform \"ensemble\")",
        ),
        (
            "platform: \"ensemble\" sequence_batching { }",
            "sequence_batching in an ensemble",
        ),
    ] {
        let mut config = parse_config(text).unwrap();
        assert_eq!(
            normalize_identity(&mut config, "m", false)
                .unwrap_err()
                .to_string(),
            format!("{what} is not supported: kiln cannot serve model 'm'")
        );
    }
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
fn json_fields_follow_the_proto_declaration_order() {
    // protobuf's printer (and so Triton) writes declaration order, not field-number order:
    // `backend` (17) right after `platform` (2), an instance group's `kind` (4) before `count` (2).
    let config =
        parse_config(&ADD_SUB.replace("reshape_placeholder_ignored_by_test: 0", "")).unwrap();
    let json = config_to_json(&config);
    let keys = |value: &serde_json::Value| -> Vec<String> {
        value.as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(
        keys(&json)[..6],
        [
            "name",
            "platform",
            "backend",
            "runtime",
            "version_policy",
            "max_batch_size"
        ]
    );
    assert_eq!(
        keys(&json["instance_group"][0])[..3],
        ["name", "kind", "count"]
    );
    let input = keys(&json["input"][0]);
    assert_eq!(input[..4], ["name", "data_type", "format", "dims"]);
    // Map values are messages too: their fields keep the declared order.
    let mut with_parameter = config.clone();
    with_parameter.parameters.insert(
        "p".to_string(),
        crate::proto::inference::ModelParameter {
            string_value: "v".to_string(),
        },
    );
    let json = config_to_json(&with_parameter);
    assert_eq!(keys(&json["parameters"]["p"]), ["string_value"]);
}

#[test]
fn absurd_dims_and_counts_are_refused() {
    let with = |n: usize, dims: &str| {
        let inputs: Vec<String> = (0..n)
            .map(|i| format!("{{name: \"i{i}\" data_type: TYPE_FP32 dims: {dims}}}"))
            .collect();
        parse_config(&format!(
            "name: \"m\" input [{}] output [{{name: \"o\" data_type: TYPE_FP32 dims: [1] \
             reshape: {{ shape: [0] }}}}]",
            inputs.join(",")
        ))
        .unwrap()
    };
    let refused = |config: ModelConfig| validate_io(&config).unwrap_err().to_string();
    assert!(refused(with(1, "[1099511627776, 1099511627776]"))
        .starts_with("model 'm', input 'i0': dims [1099511627776, 1099511627776] describe"));
    assert!(refused(with(1, "[1]")).starts_with("model 'm', output 'o': reshape dims [0]"));
    assert_eq!(
        refused(with(MAX_TENSORS + 1, "[1]")),
        "model 'm' declares 1025 inputs, more than the 1024 kiln allows"
    );
}

#[test]
fn max_batch_size_is_bounded() {
    let mut config = parse_config(&format!("max_batch_size: {MAX_BATCH_SIZE}")).unwrap();
    normalize_identity(&mut config, "m", false).unwrap();
    let mut config = parse_config("max_batch_size: 2147483647").unwrap();
    assert_eq!(
        normalize_identity(&mut config, "m", false)
            .unwrap_err()
            .to_string(),
        "max_batch_size 2147483647 of model 'm' is larger than the 1048576 kiln allows"
    );
}

#[test]
fn validate_io_requires_inputs_outputs_and_types() {
    let config = parse_config("name: \"m\"").unwrap();
    assert_eq!(
        validate_io(&config).unwrap_err(),
        ConfigError::Invalid(
            "model 'm' must declare at least one input and one output (or leave them out and let \
             auto-complete read them from the model)"
                .into()
        )
    );
    let config = parse_config(
        "name: \"m\" input [{name: \"a\" dims: [1]}] output [{name: \"b\" data_type: TYPE_FP32 dims: [1]}]",
    )
    .unwrap();
    assert_eq!(
        validate_io(&config).unwrap_err(),
        ConfigError::Invalid("input 'a' of model 'm' has no valid data_type".into())
    );
}

#[test]
fn tensorrt_tensor_kinds_are_refused() {
    for (tensor, flag) in [
        ("input", "is_shape_tensor"),
        ("input", "is_non_linear_format_io"),
        ("output", "is_shape_tensor"),
    ] {
        let (input, output) = if tensor == "input" {
            (format!("{flag}: true"), String::new())
        } else {
            (String::new(), format!("{flag}: true"))
        };
        let config = parse_config(&format!(
            "name: \"m\" input [{{name: \"a\" data_type: TYPE_FP32 dims: [1] {input}}}] \
             output [{{name: \"b\" data_type: TYPE_FP32 dims: [1] {output}}}]"
        ))
        .unwrap();
        let error = validate_io(&config).unwrap_err().to_string();
        let named = if tensor == "input" { "'a'" } else { "'b'" };
        assert!(error.contains(named) && error.contains(flag), "{error}");
    }
}

#[test]
fn image_formats_need_three_dims() {
    let config = |format: &str, dims: &str| {
        parse_config(&format!(
            "name: \"m\" input [{{name: \"image\" data_type: TYPE_FP32 format: {format} dims: {dims}}}] \
             output [{{name: \"b\" data_type: TYPE_FP32 dims: [1]}}]"
        ))
        .unwrap()
    };
    for format in ["FORMAT_NCHW", "FORMAT_NHWC"] {
        assert!(validate_io(&config(format, "[3, 224, 224]")).is_ok());
        assert_eq!(
            validate_io(&config(format, "[224, 224]"))
                .unwrap_err()
                .to_string(),
            "input 'image' of model 'm': model input NHWC/NCHW require 3 dims"
        );
    }
    assert!(validate_io(&config("FORMAT_NONE", "[224, 224]")).is_ok());
}

#[test]
fn sequence_batching_batches_requests_of_different_sequences() {
    let config = parse_config(
        "max_batch_size: 4 sequence_batching { oldest { max_queue_delay_microseconds: 300 \
         preferred_batch_size: [ 2, 0 ] } }",
    )
    .unwrap();
    let batching = batching_config(&config, false);
    assert!(batching.dynamic);
    assert_eq!(
        (
            batching.max_batch_size,
            batching.max_queue_delay,
            batching.preferred_batch_sizes
        ),
        (4, Duration::from_micros(300), vec![2])
    );
    let direct = parse_config(
        "max_batch_size: 8 sequence_batching { direct { max_queue_delay_microseconds: 5 } }",
    )
    .unwrap();
    assert_eq!(
        batching_config(&direct, false).max_queue_delay,
        Duration::from_micros(5)
    );
    // A model that cannot batch runs each request alone.
    let single = parse_config("max_batch_size: 1 sequence_batching { }").unwrap();
    assert!(!batching_config(&single, false).dynamic);
}

#[test]
fn scheduler_defaults_are_filled_in_as_triton_fills_them() {
    let filled = |text: &str| {
        let mut config = parse_config(text).unwrap();
        fill_scheduler_defaults(&mut config);
        config.scheduling_choice
    };
    let preferred = |text: &str| match filled(text) {
        Some(SchedulingChoice::DynamicBatching(dynamic)) => dynamic.preferred_batch_size,
        other => panic!("dynamic batching, not {other:?}"),
    };
    assert_eq!(
        preferred(
            r#"name: "m" max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 5 }"#
        ),
        [8]
    );
    // Preferred sizes a config gives are left alone, and so is a model that does not batch.
    assert_eq!(
        preferred(
            r#"name: "m" max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4 ] }"#
        ),
        [2, 4]
    );
    assert!(preferred(r#"name: "m" dynamic_batching { }"#).is_empty());
    let Some(SchedulingChoice::SequenceBatching(sequence)) =
        filled(r#"name: "m" sequence_batching { }"#)
    else {
        panic!("sequence batching");
    };
    assert_eq!(sequence.max_sequence_idle_microseconds, 1_000_000);
}

#[test]
fn integral_floats_are_written_as_protobuf_writes_them() {
    let config = parse_config(
        r#"name: "m" sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1.5 ] } ] } ] }"#,
    )
    .unwrap();
    let json = config_to_json(&config);
    let values = &json["sequence_batching"]["control_input"][0]["control"][0]["fp32_false_true"];
    assert_eq!(values.to_string(), "[0,1.5]");
    assert_eq!(json["max_batch_size"].to_string(), "0");
}
