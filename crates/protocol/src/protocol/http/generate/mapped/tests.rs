use super::*;
use crate::core::tensor::frame_bytes;
use crate::core::Parameters;

fn spec(name: &str, datatype: &str, shape: &[i64]) -> TensorMetadata {
    TensorMetadata {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
    }
}

/// A vLLM-style Python model's inputs (batching, so each has the batch dimension).
fn llm() -> ModelMetadata {
    ModelMetadata {
        name: "llm".into(),
        versions: vec!["1".into()],
        platform: "python".into(),
        inputs: vec![
            spec("text_input", "BYTES", &[-1, 1]),
            spec("stream", "BOOL", &[-1, 1]),
            spec("max_tokens", "INT32", &[-1, 1]),
            spec("weights", "FP32", &[-1, 2, -1]),
        ],
        outputs: vec![spec("text_output", "BYTES", &[-1, -1])],
    }
}

#[test]
fn keys_naming_inputs_become_tensors_and_the_rest_parameters() {
    let body = br#"{"text_input": "What is Triton?", "max_tokens": 7, "temperature": 0.5,
                    "parameters": {"stream": true, "seed": 3, "tag": "a", "greedy": false},
                    "weights": [1, 2, 3, 4, 5, 6]}"#;
    let request = request(&llm(), "1", body).unwrap();
    assert_eq!(
        (request.model_name.as_str(), request.model_version.as_str()),
        ("llm", "1")
    );
    let input = |name: &str| request.inputs.iter().find(|t| t.name == name).unwrap();
    assert_eq!(request.inputs.len(), 4);
    let text = input("text_input");
    assert_eq!(
        (text.datatype, &text.shape[..]),
        (DataType::Bytes, &[1, 1][..])
    );
    assert_eq!(text.data, frame_bytes(["What is Triton?"]));
    let stream = input("stream");
    assert_eq!(
        (stream.datatype, &stream.shape[..], &stream.data[..]),
        (DataType::Bool, &[1, 1][..], &[1u8][..])
    );
    let tokens = input("max_tokens");
    assert_eq!(
        (&tokens.shape[..], &tokens.data[..]),
        (&[1, 1][..], &7i32.to_le_bytes()[..])
    );
    // Fixed dimensions take their share, the innermost variable one the rest, the batch 1.
    let weights = input("weights");
    assert_eq!(weights.shape, vec![1, 2, 3]);
    assert_eq!(weights.data.len(), 24);
    let expected: Parameters = [
        ("temperature", ParamValue::Double(0.5)),
        ("seed", ParamValue::Int64(3)),
        ("tag", ParamValue::String("a".into())),
        ("greedy", ParamValue::Bool(false)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(request.parameters, expected);
}

#[test]
fn shapes_follow_tritons_two_passes() {
    assert_eq!(shape("x", &[-1, 4], 8).unwrap(), vec![2, 4]);
    assert_eq!(shape("x", &[-1, -1, 3], 6).unwrap(), vec![1, 2, 3]);
    assert_eq!(shape("x", &[2, 3], 6).unwrap(), vec![2, 3]);
    // Several texts for a batching model fill the batch.
    assert_eq!(shape("x", &[-1, 1], 2).unwrap(), vec![2, 1]);
    assert_eq!(shape("x", &[-1], 0).unwrap(), vec![0]);
    assert_eq!(shape("x", &[0, 3], 0).unwrap(), vec![0, 3]);
    assert_eq!(shape("x", &[], 1).unwrap(), Vec::<i64>::new());
    for (dims, count) in [
        (&[-1, 4][..], 6),
        (&[2, 3][..], 5),
        (&[3][..], 0),
        (&[0][..], 2),
        (&[][..], 2),
    ] {
        let error = shape("x", dims, count).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)));
        assert_eq!(
            error.message(),
            "The schema can not convert input 'x' to tensor with proper shape"
        );
    }
}

#[test]
fn malformed_bodies_are_refused_with_tritons_texts() {
    let mut with_parameters_input = llm();
    with_parameters_input
        .inputs
        .push(spec("parameters", "BYTES", &[-1, 1]));
    for (metadata, body, message) in [
        (
            llm(),
            &b"[1]"[..],
            "the generate request must be a JSON object",
        ),
        (llm(), b"{", "failed to parse the request JSON buffer"),
        (
            llm(),
            br#"{"parameters": 3}"#,
            "Expected JSON object for keyword: 'parameters'",
        ),
        (
            with_parameters_input,
            br#"{"parameters": {}}"#,
            "Keyword 'parameters' for nested schema also given as input tensor name",
        ),
        (
            llm(),
            br#"{"x": null}"#,
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (
            llm(),
            br#"{"parameters": {"x": [1]}}"#,
            "parameter 'x' has invalid type",
        ),
        (
            llm(),
            br#"{"max_tokens": "7"}"#,
            "expected a signed integer in range for INT32 input 'max_tokens'",
        ),
        (
            llm(),
            br#"{"max_tokens": 3000000000}"#,
            "expected a signed integer in range",
        ),
        (
            llm(),
            br#"{"weights": [1, 2, 3]}"#,
            "can not convert input 'weights'",
        ),
        (
            llm(),
            br#"{"weights": [[1, 2], [3, 4]]}"#,
            "Shape does not match true shape",
        ),
        (llm(), br#"{"stream": 1}"#, "expected true or false"),
    ] {
        let error = request(&metadata, "", body).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
        assert!(
            error.message().contains(message),
            "{} vs {message}",
            error.message()
        );
    }
}

#[test]
fn responses_are_flat_sorted_objects_with_single_elements_bare() {
    let response = InferResponse {
        model_name: "llm".into(),
        model_version: "1".into(),
        id: "r-1".into(),
        parameters: [("cumulative".to_string(), ParamValue::Int64(4))]
            .into_iter()
            .collect(),
        outputs: vec![
            Tensor::new(
                "text_output",
                DataType::Bytes,
                vec![1, 1],
                frame_bytes(["Tri\"ton"]),
            ),
            Tensor::new(
                "scores",
                DataType::Fp32,
                vec![1, 2],
                [0.5f32, -1.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<_>>()
                    .into(),
            ),
            Tensor::new("empty", DataType::Int64, vec![0], Vec::new().into()),
        ],
    };
    let json = String::from_utf8(super::response(&response).unwrap()).unwrap();
    assert_eq!(
        json,
        r#"{"cumulative":4,"empty":[],"id":"r-1","model_name":"llm","model_version":"1","scores":[0.5,-1.0],"text_output":"Tri\"ton"}"#
    );
    // No id: no key; an output that collides with a reserved key does not replace it.
    let response = InferResponse {
        id: String::new(),
        parameters: Parameters::new(),
        outputs: vec![Tensor::new(
            "model_name",
            DataType::Bytes,
            vec![1],
            frame_bytes(["x"]),
        )],
        ..response
    };
    let json = String::from_utf8(super::response(&response).unwrap()).unwrap();
    assert_eq!(json, r#"{"model_name":"llm","model_version":"1"}"#);
}

#[test]
fn half_precision_outputs_are_refused() {
    let response = InferResponse {
        outputs: vec![Tensor::new("h", DataType::Fp16, vec![1], vec![0, 0].into())],
        ..InferResponse::default()
    };
    assert!(matches!(
        super::response(&response),
        Err(Error::InvalidArgument(_))
    ));
}
