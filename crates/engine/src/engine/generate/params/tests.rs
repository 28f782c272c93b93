use super::*;
use crate::core::tensor::frame_bytes;
use crate::proto::inference::{ModelConfig, ModelTransactionPolicy};
use crate::repository::generation::complete_config;
use bytes::Bytes;

fn io() -> IoSpec {
    let mut config = ModelConfig {
        name: "llm".into(),
        model_transaction_policy: Some(ModelTransactionPolicy { decoupled: true }),
        ..Default::default()
    };
    complete_config(&mut config).unwrap();
    let spec = |name: &str, data_type: i32, dims: &[i64]| {
        crate::repository::TensorSpec::new(
            name,
            crate::repository::config::datatype_from_config(data_type).unwrap(),
            dims,
        )
    };
    IoSpec {
        max_batch_size: 0,
        inputs: config
            .input
            .iter()
            .map(|i| spec(&i.name, i.data_type, &i.dims))
            .collect(),
        outputs: config
            .output
            .iter()
            .map(|o| spec(&o.name, o.data_type, &o.dims))
            .collect(),
    }
}

fn text(name: &str, values: &[&str]) -> Tensor {
    Tensor::new(
        name,
        DataType::Bytes,
        vec![values.len() as i64],
        frame_bytes(values),
    )
}

fn scalar(name: &str, datatype: DataType, bytes: &[u8]) -> Tensor {
    Tensor::new(name, datatype, vec![1], Bytes::copy_from_slice(bytes))
}

fn request(inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        model_name: "llm".into(),
        inputs,
        ..Default::default()
    }
}

#[test]
fn defaults_stream_greedy_sixteen_tokens() {
    let parsed = parse("llm", &io(), &request(vec![text("text_input", &["hi"])])).unwrap();
    assert_eq!(parsed.prompt, "hi");
    assert_eq!(parsed.params.max_tokens, DEFAULT_MAX_TOKENS);
    assert!(parsed.params.sampling.is_greedy());
    assert!(parsed.stream && !parsed.exclude_input && !parsed.empty_final);
    assert!(parsed.params.stop.is_empty());
}

#[test]
fn tensors_win_over_parameters_which_win_over_sampling_parameters() {
    let mut req = request(vec![
        text("text_input", &["hi"]),
        scalar("max_tokens", DataType::Int32, &7i32.to_le_bytes()),
        scalar("temperature", DataType::Fp32, &0.5f32.to_le_bytes()),
        scalar("stream", DataType::Bool, &[0]),
        text("stop", &["a", "bc"]),
        text(
            "sampling_parameters",
            &[r#"{"max_tokens": 99, "top_p": 0.5, "top_k": -1, "seed": 3}"#],
        ),
    ]);
    req.parameters
        .insert("max_tokens".into(), ParamValue::Int64(50));
    req.parameters.insert("seed".into(), ParamValue::Uint64(11));
    req.parameters.insert(
        "triton_enable_empty_final_response".into(),
        ParamValue::Bool(true),
    );
    let parsed = parse("llm", &io(), &req).unwrap();
    assert_eq!(parsed.params.max_tokens, 7);
    assert_eq!(parsed.params.sampling.temperature, 0.5);
    assert_eq!(parsed.params.sampling.top_p, 0.5);
    assert_eq!(parsed.params.sampling.top_k, 0);
    assert_eq!(parsed.params.sampling.seed, Some(11));
    assert_eq!(parsed.params.stop, vec!["a", "bc"]);
    assert!(!parsed.stream && parsed.empty_final);
}

#[test]
fn parameters_alone_configure_a_request() {
    let mut req = request(vec![text("text_input", &["hi"])]);
    for (key, value) in [
        ("max_tokens", ParamValue::Double(4.0)),
        ("top_k", ParamValue::Int64(5)),
        ("stop", ParamValue::String("END".into())),
        ("exclude_input_in_output", ParamValue::Bool(true)),
        ("ignore_eos", ParamValue::Bool(true)),
        ("details", ParamValue::Bool(true)),
        ("custom", ParamValue::String("ignored".into())),
    ] {
        req.parameters.insert(key.into(), value);
    }
    let parsed = parse("llm", &io(), &req).unwrap();
    assert_eq!(parsed.params.max_tokens, 4);
    assert_eq!(parsed.params.sampling.top_k, 5);
    assert_eq!(parsed.params.stop, vec!["END"]);
    assert!(parsed.exclude_input && parsed.params.ignore_eos && parsed.params.details);
    let plain = parse("llm", &io(), &request(vec![text("text_input", &["hi"])])).unwrap();
    assert!(!plain.params.details);
}

#[test]
fn bad_settings_are_named() {
    let cases: Vec<(&str, ParamValue, &str)> = vec![
        (
            "max_tokens",
            ParamValue::Int64(0),
            "'max_tokens' must be an integer between 1",
        ),
        (
            "max_tokens",
            ParamValue::Double(1.5),
            "'max_tokens' must be an integer",
        ),
        (
            "temperature",
            ParamValue::Double(-1.0),
            "'temperature' must be a number >= 0, got -1",
        ),
        (
            "temperature",
            ParamValue::String("hot".into()),
            "'temperature' must be a number, got 'hot'",
        ),
        (
            "top_p",
            ParamValue::Double(0.0),
            "'top_p' must be a number in (0, 1]",
        ),
        (
            "top_p",
            ParamValue::Double(1.5),
            "'top_p' must be a number in (0, 1]",
        ),
        (
            "top_k",
            ParamValue::Int64(-2),
            "'top_k' must be an integer between -1",
        ),
        (
            "seed",
            ParamValue::Int64(-5),
            "'seed' must be an integer between 0",
        ),
        ("stream", ParamValue::Int64(1), "'stream' must be a boolean"),
        (
            "stop",
            ParamValue::Bool(true),
            "'stop' must be a string or a list of strings",
        ),
        (
            "sampling_parameters",
            ParamValue::String("{".into()),
            "not valid JSON",
        ),
        (
            "sampling_parameters",
            ParamValue::String("[1]".into()),
            "must be a JSON object",
        ),
    ];
    for (key, value, expected) in cases {
        let mut req = request(vec![text("text_input", &["hi"])]);
        req.parameters.insert(key.into(), value);
        let error = parse("llm", &io(), &req).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{key}");
        assert!(
            error.message().contains(expected),
            "{key}: {}",
            error.message()
        );
    }
}

#[test]
fn inputs_and_outputs_are_checked() {
    let io = io();
    let missing = parse("llm", &io, &request(vec![])).unwrap_err();
    assert!(
        missing
            .message()
            .contains("missing required input(s) ['text_input']"),
        "{missing}"
    );
    let two = parse("llm", &io, &request(vec![text("text_input", &["a", "b"])])).unwrap_err();
    assert!(two.message().contains("exactly one string"), "{two}");
    let unknown = parse("llm", &io, &request(vec![text("prompt", &["a"])])).unwrap_err();
    assert_eq!(
        unknown.message(),
        "unexpected inference input 'prompt' for model 'llm'"
    );
    let wide = scalar("max_tokens", DataType::Int32, &[1, 0, 0, 0, 2, 0, 0, 0]);
    let error = parse("llm", &io, &request(vec![text("text_input", &["a"]), wide])).unwrap_err();
    assert!(
        error.message().contains("exactly one INT32 element"),
        "{error}"
    );
    let bad_utf8 = Tensor::new(
        "text_input",
        DataType::Bytes,
        vec![1],
        frame_bytes([[0xff, 0xfe]]),
    );
    assert!(parse("llm", &io, &request(vec![bad_utf8]))
        .unwrap_err()
        .message()
        .contains("UTF-8"));
    let mut req = request(vec![text("text_input", &["a"])]);
    req.outputs.push(crate::core::RequestedOutput {
        name: "logits".into(),
        ..Default::default()
    });
    assert_eq!(
        parse("llm", &io, &req).unwrap_err().message(),
        "unexpected inference output 'logits' for model 'llm'"
    );
}
