use super::request::{decode, OutputFormats};
use super::response::encode;
use super::*;
use crate::core::tensor::frame_bytes;
use crate::core::{DataType, InferResponse, ParamValue, Tensor};
use bytes::Bytes;

fn json_only(text: &str) -> Result<(crate::core::InferRequest, OutputFormats), Error> {
    decode("m", "", Bytes::from(text.to_string()), None)
}

fn with_binary(
    header: &str,
    blobs: &[&[u8]],
) -> Result<(crate::core::InferRequest, OutputFormats), Error> {
    let mut body = header.as_bytes().to_vec();
    for blob in blobs {
        body.extend_from_slice(blob);
    }
    decode("m", "1", Bytes::from(body), Some(header.len()))
}

fn message<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    result.unwrap_err().message().to_string()
}

#[test]
fn json_request_with_everything() {
    let (request, formats) = json_only(
        r#"{"id": "r1", "parameters": {"priority": 2, "custom": 0.5, "flag": true, "s": "x",
            "big": 18446744073709551615, "neg": -3, "binary_data_output": true},
           "inputs": [{"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]],
                       "parameters": {"content_type": "np"}}],
           "outputs": [{"name": "o", "parameters": {"binary_data": false, "classification": 3}}]}"#,
    )
    .unwrap();
    assert_eq!(request.id, "r1");
    assert_eq!(request.model_name, "m");
    let p = &request.parameters;
    assert_eq!(p["priority"], ParamValue::Uint64(2));
    assert_eq!(p["custom"], ParamValue::Double(0.5));
    assert_eq!(p["flag"], ParamValue::Bool(true));
    assert_eq!(p["s"], ParamValue::String("x".into()));
    assert_eq!(p["big"], ParamValue::Uint64(u64::MAX));
    assert_eq!(p["neg"], ParamValue::Int64(-3));
    assert!(!p.contains_key("binary_data_output"));
    let input = &request.inputs[0];
    assert_eq!(
        (input.datatype, input.shape.clone()),
        (DataType::Int32, vec![2, 2])
    );
    assert_eq!(input.data.len(), 16);
    assert_eq!(
        input.parameters["content_type"],
        ParamValue::String("np".into())
    );
    assert_eq!(
        request.outputs[0].parameters["classification"],
        ParamValue::Int64(3)
    );
    assert!(!request.outputs[0].parameters.contains_key("binary_data"));
    assert!(formats.default_binary);
    assert!(!formats.is_binary("o"));
    assert!(formats.is_binary("other"));
}

#[test]
fn binary_inputs_are_sliced_in_order() {
    let header = r#"{"inputs": [
        {"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "e", "shape": [0], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
        {"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 11}}]}"#;
    let strings = frame_bytes([&b"ab"[..], b"c"]);
    let floats = [0, 0, 128, 63, 0, 0, 0, 64];
    let (request, formats) = with_binary(header, &[&floats, &strings]).unwrap();
    assert_eq!(&request.inputs[0].data[..], &floats);
    assert!(request.inputs[1].data.is_empty());
    assert_eq!(request.inputs[2].data, strings);
    assert!(!request.inputs[0]
        .parameters
        .contains_key("binary_data_size"));
    assert_eq!(request.model_version, "1");
    assert_eq!(formats, OutputFormats::default());
}

#[test]
fn binary_sizes_must_match_the_body() {
    let header = r#"{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}"#;
    assert!(message(with_binary(header, &[&[0; 4]])).contains("expecting 4 additional bytes"));
    assert_eq!(
        message(with_binary(header, &[&[0; 12]])),
        "unexpected additional input data for model 'm'"
    );
    let huge = r#"{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 18446744073709551615}}]}"#;
    assert!(message(with_binary(huge, &[&[0; 8]]))
        .contains("expecting 18446744073709551607 additional bytes"));
    // Without a header length the whole body is JSON: the binary data is all missing.
    assert_eq!(
        message(json_only(header)),
        "unexpected size for input 'x', expecting 8 additional bytes for model 'm'"
    );
    let negative = r#"{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": -8}}]}"#;
    assert!(message(with_binary(negative, &[])).contains("Unable to parse 'binary_data_size'"));
}

#[test]
fn exactly_one_data_source_per_input() {
    let both = r#"{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                  "parameters": {"binary_data_size": 4}}]}"#;
    assert_eq!(
        message(json_only(both)),
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', \
         'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'"
    );
    let none = r#"{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}"#;
    assert!(message(json_only(none)).ends_with("But no field is set"));
    // A shared-memory input has no data here: the engine reads it from the region.
    let shm = r#"{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                 "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]}"#;
    let (request, _) = json_only(shm).unwrap();
    assert!(request.inputs[0].data.is_empty());
    assert_eq!(
        request.inputs[0].parameters["shared_memory_region"],
        ParamValue::String("r".into())
    );
    assert_eq!(
        request.inputs[0].parameters["shared_memory_byte_size"],
        ParamValue::Int64(4)
    );
}

#[test]
fn malformed_fields() {
    let cases = [
        (
            "",
            "failed to parse the request JSON buffer: The document is empty.",
        ),
        ("[]", "the request must be a JSON object"),
        (
            "garbage",
            "failed to parse the request JSON buffer: Invalid value. at 0",
        ),
        (r#"{"id": 5, "inputs": []}"#, "Unable to parse 'id'"),
        (r#"{}"#, "Unable to parse 'inputs'"),
        (r#"{"inputs": {}}"#, "Unable to parse 'inputs'"),
        (r#"{"inputs": [1]}"#, "Unable to parse 'inputs'"),
        (
            r#"{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}"#,
            "Unable to parse 'name'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [1], "data": [1]}]}"#,
            "Unable to parse 'datatype'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1]}]}"#,
            "invalid datatype for input x",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}"#,
            "Unable to parse 'shape'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [1.5], "datatype": "FP32", "data": [1]}]}"#,
            "Unable to parse 'shape'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [9223372036854775808], "datatype": "FP32", "data": [1]}]}"#,
            "Unable to parse 'shape'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [4294967296, 4294967296], "datatype": "FP32", "data": [1]}]}"#,
            "causes total element count to exceed maximum size of 9223372036854775807",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [4, 1152921504606846978], "datatype": "FP32", "data": [1]}]}"#,
            "byte size overflow for input 'x'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [4, 1152921504606846978], "datatype": "BYTES", "data": ["a"]}]}"#,
            "too many elements",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": "12"}]}"#,
            "Unable to parse 'data'",
        ),
        (
            r#"{"inputs": [{"name": "x", "shape": [2], "datatype": "FP16", "data": [1, 2]}]}"#,
            "receiving FP16 data via JSON is not supported",
        ),
        (
            r#"{"parameters": [], "inputs": []}"#,
            "failed to get request params",
        ),
        (
            r#"{"parameters": {"priority": -1}, "inputs": []}"#,
            "Unable to parse 'priority'",
        ),
        (
            r#"{"parameters": {"sequence_start": 1}, "inputs": []}"#,
            "Unable to parse 'sequence_start'",
        ),
        (
            r#"{"parameters": {"binary_data_output": "yes"}, "inputs": []}"#,
            "Unable to parse 'binary_data_output'",
        ),
        (
            r#"{"parameters": {"k": null}, "inputs": []}"#,
            "parameter 'k' has invalid type",
        ),
        (
            r#"{"parameters": {"k": [1]}, "inputs": []}"#,
            "parameter 'k' has invalid type",
        ),
        (
            r#"{"inputs": [], "outputs": {}}"#,
            "Unable to parse 'outputs'",
        ),
        (
            r#"{"inputs": [], "outputs": [{"parameters": {}}]}"#,
            "Unable to parse 'name'",
        ),
        (
            r#"{"inputs": [], "outputs": [{"name": "o", "parameters": {"binary_data": 1}}]}"#,
            "Unable to parse 'binary_data'",
        ),
        (
            r#"{"inputs": [], "outputs": [{"name": "o", "parameters": {"classification": -2}}]}"#,
            "Unable to set 'classification'",
        ),
        (
            r#"{"inputs": [], "outputs": [{"name": "o", "parameters": {"classification": 1.5}}]}"#,
            "Unable to set 'classification'",
        ),
    ];
    for (body, expected) in cases {
        let got = message(json_only(body));
        assert!(got.contains(expected), "{body}: {got}");
    }
    // Triton's words, before the region is looked up.
    for (parameter, refused) in [
        (r#""binary_data": true"#, "'binary_data'"),
        (r#""classification": 2"#, "'classification'"),
    ] {
        let body = format!(
            r#"{{"inputs": [], "outputs": [{{"name": "o", "parameters": {{"shared_memory_region": "r", {parameter}}}}}]}}"#
        );
        assert_eq!(
            message(json_only(&body)),
            format!("Output can't set both 'shared_memory_region' and {refused}")
        );
    }
    let shm_out = r#"{"inputs": [], "outputs": [{"name": "o", "parameters": {"shared_memory_region": "r", "binary_data": false}}]}"#;
    let (request, _) = json_only(shm_out).unwrap();
    assert_eq!(
        request.outputs[0].parameters["shared_memory_region"],
        ParamValue::String("r".into())
    );
}

#[test]
fn triton_keys_are_all_refused_over_rest() {
    // Triton: server src/http_server.cc, ParseJsonTritonParams (every 'triton_' key, the one
    // gRPC allows too).
    for key in ["triton_x", "triton_enable_empty_final_response", "triton_"] {
        assert_eq!(
            message(json_only(&format!(
                r#"{{"parameters": {{"{key}": true}}, "inputs": []}}"#
            ))),
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not \
             be specified.",
            "{key}"
        );
    }
    // The other reserved keys are Triton's own settings, taken as such; `headers` is a custom
    // parameter to the server (tritonclient refuses it, the server does not).
    let (request, _) = json_only(
        r#"{"parameters": {"sequence_id": 3, "priority": 1, "timeout": 5, "headers": "h",
            "tritonx": 1}, "inputs": []}"#,
    )
    .unwrap();
    assert_eq!(request.parameters.len(), 5);
}

#[test]
fn sequence_ids_and_empty_tensors() {
    let (request, _) = json_only(
        r#"{"parameters": {"sequence_id": "abc", "sequence_end": false, "timeout": 10},
            "inputs": [{"name": "x", "shape": [0, 3], "datatype": "FP32", "data": "ignored"}]}"#,
    )
    .unwrap();
    assert_eq!(
        request.parameters["sequence_id"],
        ParamValue::String("abc".into())
    );
    assert_eq!(request.parameters["timeout"], ParamValue::Uint64(10));
    assert!(request.inputs[0].data.is_empty());
    let (request, _) = json_only(r#"{"parameters": {"sequence_id": 7}, "inputs": []}"#).unwrap();
    assert_eq!(request.parameters["sequence_id"], ParamValue::Uint64(7));
}

fn response(outputs: Vec<Tensor>) -> InferResponse {
    InferResponse {
        model_name: "m".into(),
        model_version: "2".into(),
        outputs,
        ..Default::default()
    }
}

fn fp32(name: &str, values: &[f32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new(
        name,
        DataType::Fp32,
        vec![1, values.len() as i64],
        Bytes::from(data),
    )
}

#[test]
fn json_response_shape() {
    let mut reply = response(vec![fp32("y", &[1.5, f32::NAN])]);
    reply.id = "r\"1".into();
    reply
        .parameters
        .insert("content_type".into(), ParamValue::String("np".into()));
    reply.outputs[0]
        .parameters
        .insert("content_type".into(), ParamValue::String("np".into()));
    let encoded = encode(&reply, &OutputFormats::default()).unwrap();
    assert_eq!(encoded.header_length, None);
    assert_eq!(
        String::from_utf8(encoded.body).unwrap(),
        r#"{"id":"r\"1","model_name":"m","model_version":"2","parameters":{"content_type":"np"},"outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"parameters":{"content_type":"np"},"data":[1.5,NaN]}]}"#
    );
}

#[test]
fn binary_response_puts_blobs_after_the_header() {
    let reply = response(vec![
        fp32("a", &[1.0]),
        fp32("b", &[2.0]),
        Tensor::new("e", DataType::Fp32, vec![0], Bytes::new()),
        fp32("c", &[3.0]),
    ]);
    let formats = OutputFormats {
        default_binary: true,
        explicit: vec![("b".into(), false)],
    };
    let encoded = encode(&reply, &formats).unwrap();
    let header_length = encoded.header_length.unwrap();
    let header = std::str::from_utf8(&encoded.body[..header_length]).unwrap();
    assert!(header.contains(
        r#"{"name":"a","datatype":"FP32","shape":[1,1],"parameters":{"binary_data_size":4}}"#
    ));
    assert!(header.contains(r#""name":"b","datatype":"FP32","shape":[1,1],"data":[2.0]"#));
    assert!(header.contains(
        r#""name":"e","datatype":"FP32","shape":[0],"parameters":{"binary_data_size":0}"#
    ));
    let blobs = &encoded.body[header_length..];
    assert_eq!(blobs, [1.0f32.to_le_bytes(), 3.0f32.to_le_bytes()].concat());
}

#[test]
fn empty_binary_outputs_keep_the_response_json() {
    let reply = response(vec![Tensor::new(
        "e",
        DataType::Fp32,
        vec![0],
        Bytes::new(),
    )]);
    let encoded = encode(&reply, &OutputFormats::all_binary()).unwrap();
    assert_eq!(encoded.header_length, None);
}

#[test]
fn outputs_in_shared_memory_carry_no_data_and_no_parameters() {
    let mut output = Tensor::new("o", DataType::Fp32, vec![1, 2], Bytes::new());
    output.parameters.insert(
        "shared_memory_region".into(),
        ParamValue::String("r".into()),
    );
    output
        .parameters
        .insert("shared_memory_byte_size".into(), ParamValue::Int64(8));
    for formats in [OutputFormats::default(), OutputFormats::all_binary()] {
        let encoded = encode(&response(vec![output.clone()]), &formats).unwrap();
        assert_eq!(encoded.header_length, None);
        assert_eq!(
            String::from_utf8(encoded.body).unwrap(),
            r#"{"model_name":"m","model_version":"2","outputs":[{"name":"o","datatype":"FP32","shape":[1,2]}]}"#
        );
    }
}

#[test]
fn half_precision_outputs_need_binary() {
    let reply = response(vec![Tensor::new(
        "h",
        DataType::Fp16,
        vec![1],
        Bytes::from_static(&[0, 60]),
    )]);
    assert!(matches!(
        encode(&reply, &OutputFormats::default()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(encode(&reply, &OutputFormats::all_binary()).is_ok());
}

#[test]
fn header_length_parsing() {
    let headers = |v: &'static str| {
        let mut map = HeaderMap::new();
        map.insert(INFERENCE_HEADER_CONTENT_LENGTH, HeaderValue::from_static(v));
        map
    };
    assert_eq!(header_length(&HeaderMap::new(), 10), Ok(None));
    assert_eq!(header_length(&headers("4"), 10), Ok(Some(4)));
    assert_eq!(header_length(&headers("0"), 10), Ok(Some(0)));
    assert_eq!(header_length(&headers("10"), 10), Ok(Some(10)));
    assert_eq!(
        message(header_length(&headers("11"), 10)),
        "inference header size should be in range (0, 10), got: 11"
    );
    assert!(message(header_length(&headers("-1"), 10)).contains("should be in range"));
    assert!(
        message(header_length(&headers("99999999999999999999999999"), 10))
            .contains("should be in range")
    );
    assert!(message(header_length(&headers("abc"), 10)).contains("Unable to parse"));
}
