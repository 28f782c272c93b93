//! The real binary on port 0, driven over real HTTP with a hand-written client.

use crate::common::http_client::{get, post, request, Response};
use crate::common::{fp32_bytes, fp32_values, Server};
use kiln::proto::inference::{
    model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
    InferParameter, ModelInferRequest,
};
use serde_json::{json, Value};

/// JSON header followed by binary blobs, with the header's length.
fn binary_body(header: &Value, blobs: &[&[u8]]) -> (Vec<u8>, String) {
    let mut body = header.to_string().into_bytes();
    let length = body.len().to_string();
    for blob in blobs {
        body.extend_from_slice(blob);
    }
    (body, length)
}

/// Splits a binary-extension response into its JSON header and the blob after it.
fn split_binary(response: &Response) -> (Value, Vec<u8>) {
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        response.header("content-type"),
        Some("application/octet-stream")
    );
    let length: usize = response
        .header("inference-header-content-length")
        .expect("header length")
        .parse()
        .unwrap();
    let header = serde_json::from_slice(&response.body[..length]).unwrap();
    (header, response.body[length..].to_vec())
}

#[tokio::test]
async fn health_metadata_config_and_index() {
    let server = Server::start();
    let http = &server.http_address;
    let live = get(http, "/v2/health/live").await;
    assert_eq!((live.status, live.json()), (200, json!({"live": true})));
    // `broken` and `name_mismatch` fail to load: strict readiness says not ready.
    let ready = get(http, "/v2/health/ready").await;
    assert_eq!((ready.status, ready.json()), (400, json!({"ready": false})));

    let metadata = get(http, "/v2").await.json();
    assert_eq!(metadata["name"], "kiln");
    for extension in [
        "binary_tensor_data",
        "classification",
        "model_configuration",
    ] {
        assert!(metadata["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!(extension)));
    }

    let model = get(http, "/v2/models/mlp_classifier").await.json();
    assert_eq!(model["versions"], json!(["1", "2"]));
    assert_eq!(model["platform"], "onnxruntime_onnx");
    assert_eq!(
        model["inputs"][0],
        json!({"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]})
    );
    let v1 = get(http, "/v2/models/mlp_classifier/versions/1")
        .await
        .json();
    assert_eq!(v1["versions"], json!(["1"]));

    let ok = get(http, "/v2/models/add_sub/ready").await;
    assert_eq!((ok.status, ok.body.len()), (200, 0));
    assert_eq!(
        get(http, "/v2/models/mlp_classifier/versions/2/ready")
            .await
            .status,
        200
    );
    // As Triton's HTTP front end: anything not ready is 400 "Model version not ready".
    for path in [
        "/v2/models/nope/ready",
        "/v2/models/broken/versions/1/ready",
        "/v2/models/add_sub/versions/7/ready",
    ] {
        let response = get(http, path).await;
        assert_eq!(response.status, 400, "{path}");
        assert_eq!(response.error(), "Model version not ready");
    }
    let unknown = get(http, "/v2/models/nope").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.error(),
        "Request for unknown model: 'nope' is not found"
    );
    let broken = get(http, "/v2/models/broken/versions/1").await;
    assert_eq!(broken.status, 503, "{}", broken.text());
    let no_version = get(http, "/v2/models/add_sub/versions/9").await;
    assert_eq!(no_version.status, 404);
    assert!(no_version.error().contains("version 9 is not found"));
    let not_digits = get(http, "/v2/models/add_sub/versions/abc").await;
    assert_eq!(
        (not_digits.status, not_digits.error()),
        (404, "Not Found".into())
    );

    let config = get(http, "/v2/models/mlp_classifier/config").await.json();
    assert_eq!(config["name"], "mlp_classifier");
    assert_eq!(config["max_batch_size"], 32);
    assert_eq!(config["input"][0]["data_type"], "TYPE_FP32");
    assert_eq!(config["input"][0]["dims"], json!([64]));
    assert_eq!(config["output"][0]["label_filename"], "labels.txt");
    assert_eq!(config["instance_group"][0]["kind"], "KIND_CPU");
    let auto = get(http, "/v2/models/identity_types/config").await.json();
    assert_eq!(auto["max_batch_size"], 4);
    assert_eq!(auto["input"].as_array().unwrap().len(), 14);

    let index = post(http, "/v2/repository/index", b"").await;
    assert_eq!(index.status, 200);
    let entries = index.json();
    let broken = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "broken")
        .unwrap();
    assert_eq!(broken["state"], "UNAVAILABLE");
    let ready_only = post(http, "/v2/repository/index", br#"{"ready": true}"#)
        .await
        .json();
    assert!(ready_only
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["state"] == "READY"));
    assert!(ready_only.as_array().unwrap().len() < entries.as_array().unwrap().len());
}

#[tokio::test]
async fn routes_methods_and_placeholders() {
    let server = Server::start();
    let http = &server.http_address;
    let wrong_method = request(http, "DELETE", "/v2/models/add_sub", &[], b"").await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.json(), json!({"error": "Method Not Allowed"}));
    assert_eq!(get(http, "/v2/models/add_sub/infer").await.status, 405);
    let missing = get(http, "/v2/nothing/here").await;
    assert_eq!(
        (missing.status, missing.json()),
        (404, json!({"error": "Not Found"}))
    );
    // `stats` is not taken for a model name: every serving version is listed.
    let all = get(http, "/v2/models/stats").await.json();
    let names: Vec<&str> = all["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"add_sub") && names.contains(&"mlp_classifier"));
    let one = get(http, "/v2/models/mlp_classifier/versions/1/stats")
        .await
        .json();
    assert_eq!(one["model_stats"].as_array().unwrap().len(), 1);
    assert_eq!(one["model_stats"][0]["version"], "1");
    assert!(one["model_stats"][0]["inference_stats"]["success"]["count"].is_u64());
    // Triton's answer for a model without a ready version.
    let unknown = get(http, "/v2/models/nope/stats").await;
    assert_eq!(
        (unknown.status, unknown.error()),
        (400, "requested model 'nope' is not available".to_string())
    );
    // CUDA shared memory as Triton without GPUs answers it: no regions.
    assert_eq!(
        get(http, "/v2/cudasharedmemory/status").await.json(),
        json!([])
    );
    let cuda = get(http, "/v2/cudasharedmemory/region/r/status").await;
    assert_eq!(
        (cuda.status, cuda.error()),
        (
            404,
            "Unable to find cuda shared memory region: 'r'".to_string()
        )
    );
    // Tracing is off unless asked for; a model's settings are the global ones until it has its
    // own.
    for path in ["/v2/trace/setting", "/v2/models/add_sub/trace/setting"] {
        let response = get(http, path).await;
        assert_eq!(response.status, 200, "{path}: {}", response.text());
        assert_eq!(
            response.json(),
            json!({"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                   "log_frequency": "0", "trace_file": "", "trace_mode": "triton"})
        );
    }
    let unknown = get(http, "/v2/models/nope/trace/setting").await;
    assert_eq!(
        (unknown.status, unknown.error()),
        (400, "Request for unknown model : nope".to_string())
    );
    let log = get(http, "/v2/logging").await;
    assert_eq!(log.status, 200);
    assert_eq!(log.json()["log_format"], "default");
    assert_eq!(log.json()["log_file"], "");
    let load = post(http, "/v2/repository/models/add_sub/load", b"").await;
    assert_eq!(load.status, 503);
    assert!(load
        .error()
        .contains("explicit model load / unload is not allowed"));
    let named = post(http, "/v2/repository/other/models/add_sub/unload", b"{}").await;
    assert_eq!(named.status, 501);
    assert_eq!(
        named.error(),
        "'repository_name' specification is not supported"
    );
}

#[tokio::test]
async fn json_infer_flat_and_nested() {
    let server = Server::start();
    let a: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let nested: Vec<Vec<f32>> = vec![vec![0.5; 16], vec![1.5; 16]];
    let request = json!({
        "id": "req-7",
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "FP32", "data": nested},
        ],
        "outputs": [{"name": "OUTPUT1"}],
    });
    let response = post(
        &server.http_address,
        "/v2/models/add_sub/infer",
        request.to_string().as_bytes(),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body = response.json();
    assert_eq!(body["id"], "req-7");
    assert_eq!(
        (body["model_name"].as_str(), body["model_version"].as_str()),
        (Some("add_sub"), Some("1"))
    );
    let outputs = body["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0]["name"], "OUTPUT1");
    assert_eq!(outputs[0]["shape"], json!([2, 16]));
    let data: Vec<f64> = outputs[0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let expected: Vec<f64> = (0..32)
        .map(|i| i as f64 - if i < 16 { 0.5 } else { 1.5 })
        .collect();
    assert_eq!(data, expected);
}

#[tokio::test]
async fn binary_infer_as_tritonclient_sends_it() {
    let server = Server::start();
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b = vec![2.0f32; 16];
    let header = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": true}},
            {"name": "OUTPUT1", "parameters": {"binary_data": false}},
        ],
    });
    let (body, length) = binary_body(&header, &[&fp32_bytes(&a), &fp32_bytes(&b)]);
    // No Content-Type, as tritonclient sends.
    let headers = [("Inference-Header-Content-Length", length.as_str())];
    let response = request(
        &server.http_address,
        "POST",
        "/v2/models/add_sub/infer",
        &headers,
        &body,
    )
    .await;
    let (json, blob) = split_binary(&response);
    assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 64);
    assert!(json["outputs"][0].get("data").is_none());
    assert_eq!(
        fp32_values(&blob),
        a.iter().map(|x| x + 2.0).collect::<Vec<_>>()
    );
    let minus: Vec<f64> = json["outputs"][1]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(
        minus,
        a.iter().map(|x| f64::from(x - 2.0)).collect::<Vec<_>>()
    );

    // No outputs listed: binary_data_output makes every output binary, in model order.
    let header = json!({
        "inputs": header["inputs"],
        "parameters": {"binary_data_output": true},
    });
    let (body, length) = binary_body(&header, &[&fp32_bytes(&a), &fp32_bytes(&b)]);
    let headers = [("Inference-Header-Content-Length", length.as_str())];
    let response = request(
        &server.http_address,
        "POST",
        "/v2/models/add_sub/infer",
        &headers,
        &body,
    )
    .await;
    let (json, blob) = split_binary(&response);
    assert_eq!(json["outputs"].as_array().unwrap().len(), 2);
    assert_eq!(blob.len(), 128);
    assert_eq!(
        fp32_values(&blob[64..]),
        a.iter().map(|x| x - 2.0).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn raw_binary_request() {
    let server = Server::start();
    let input: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
    let headers = [("Inference-Header-Content-Length", "0")];
    let response = request(
        &server.http_address,
        "POST",
        "/v2/models/mlp_classifier/versions/1/infer",
        &headers,
        &fp32_bytes(&input),
    )
    .await;
    let (json, blob) = split_binary(&response);
    assert_eq!(json["model_version"], "1");
    assert_eq!(json["outputs"][0]["shape"], json!([1, 10]));
    let probabilities = fp32_values(&blob);
    assert!((probabilities.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    let two_inputs = request(
        &server.http_address,
        "POST",
        "/v2/models/add_sub/infer",
        &headers,
        &[0; 64],
    )
    .await;
    assert_eq!(two_inputs.status, 400);
    assert!(two_inputs
        .error()
        .contains("Raw request must only have 1 input (found 1) to be deduced but got 2 inputs"));
}

fn classification_strings(values: &[Value]) -> Vec<String> {
    values
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn classification_matches_grpc() {
    let server = Server::start();
    let input: Vec<f32> = (0..128).map(|i| ((i * 37) % 64) as f32 / 64.0).collect();
    let request_json = json!({
        "inputs": [{"name": "INPUT0", "shape": [2, 64], "datatype": "FP32", "data": input}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 3}}],
    });
    let response = post(
        &server.http_address,
        "/v2/models/mlp_classifier/infer",
        request_json.to_string().as_bytes(),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let output = &response.json()["outputs"][0];
    assert_eq!(output["datatype"], "BYTES");
    assert_eq!(output["shape"], json!([2, 3]));
    let http = classification_strings(output["data"].as_array().unwrap());
    let labels = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ];
    for entry in &http {
        let parts: Vec<&str> = entry.split(':').collect();
        assert_eq!(parts.len(), 3, "{entry}");
        assert_eq!(
            parts[0].split('.').nth(1).map(str::len),
            Some(6),
            "printf %f: {entry}"
        );
        let index: usize = parts[1].parse().unwrap();
        assert_eq!(parts[2], labels[index]);
    }

    let mut client = server.client().await;
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "classification".to_string(),
        InferParameter {
            parameter_choice: Some(
                kiln::proto::inference::infer_parameter::ParameterChoice::Int64Param(3),
            ),
        },
    );
    let grpc = client
        .model_infer(ModelInferRequest {
            model_name: "mlp_classifier".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![2, 64],
                ..Default::default()
            }],
            raw_input_contents: vec![fp32_bytes(&input)],
            outputs: vec![InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                parameters,
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc.outputs[0].datatype, "BYTES");
    assert_eq!(grpc.outputs[0].shape, vec![2, 3]);
    let raw = &grpc.raw_output_contents[0];
    let mut grpc_strings = Vec::new();
    let mut rest = &raw[..];
    while !rest.is_empty() {
        let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        grpc_strings.push(String::from_utf8(rest[4..4 + len].to_vec()).unwrap());
        rest = &rest[4 + len..];
    }
    assert_eq!(grpc_strings, http);
}

#[tokio::test]
async fn sigterm_stops_both_listeners() {
    let mut server = Server::start();
    assert_eq!(
        get(&server.http_address, "/v2/health/live").await.status,
        200
    );
    assert!(server.terminate().success());
    assert!(tokio::net::TcpStream::connect(&server.http_address)
        .await
        .is_err());
}
