//! Tensors over real HTTP: every datatype through `identity_types` (JSON where Triton allows it,
//! binary for FP16/BF16, NaN/Infinity tokens), and compressed and chunked request bodies.

use crate::common::http_client::{chunked, request};
use crate::common::Server;
use serde_json::{json, Value};
use std::io::Read;

#[tokio::test]
async fn every_datatype_through_identity_types() {
    let server = Server::start();
    // JSON for every type JSON can carry, binary for FP16 and BF16 (as Triton requires).
    let json_inputs = [
        ("BOOL", json!([[true, false]])),
        ("UINT8", json!([[0, 255]])),
        ("UINT16", json!([[0, 65535]])),
        ("UINT32", json!([[0, 4294967295u64]])),
        ("UINT64", json!([[0, 18446744073709551615u64]])),
        ("INT8", json!([[-128, 127]])),
        ("INT16", json!([[-32768, 32767]])),
        ("INT32", json!([[-2147483648i64, 2147483647]])),
        (
            "INT64",
            json!([[-9223372036854775808i64, 9223372036854775807i64]]),
        ),
        ("BYTES", json!([["héllo", ""]])),
    ];
    let mut header = String::from(r#"{"inputs":["#);
    for (datatype, data) in &json_inputs {
        header.push_str(&format!(
            r#"{{"name":"IN_{datatype}","shape":[1,2],"datatype":"{datatype}","data":{data}}},"#
        ));
    }
    // Floats use Triton's non-finite tokens, which serde_json cannot write.
    header
        .push_str(r#"{"name":"IN_FP32","shape":[1,2],"datatype":"FP32","data":[NaN,-Infinity]},"#);
    header.push_str(r#"{"name":"IN_FP64","shape":[1,2],"datatype":"FP64","data":[Infinity,0.1]},"#);
    header.push_str(r#"{"name":"IN_FP16","shape":[1,2],"datatype":"FP16","parameters":{"binary_data_size":4}},"#);
    header.push_str(r#"{"name":"IN_BF16","shape":[1,2],"datatype":"BF16","parameters":{"binary_data_size":4}}],"#);
    header.push_str(r#""parameters":{"binary_data_output":false},"outputs":[{"name":"OUT_FP16","parameters":{"binary_data":true}},{"name":"OUT_BF16","parameters":{"binary_data":true}}"#);
    for (datatype, _) in &json_inputs {
        header.push_str(&format!(r#",{{"name":"OUT_{datatype}"}}"#));
    }
    header.push_str(r#",{"name":"OUT_FP32"},{"name":"OUT_FP64"}]}"#);
    let halves = [0x00, 0x3c, 0x00, 0xc0]; // FP16 1.0, -2.0
    let bf16 = [0x80, 0x3f, 0x00, 0x40]; // BF16 1.0, 2.0
    let mut body = header.clone().into_bytes();
    body.extend_from_slice(&halves);
    body.extend_from_slice(&bf16);
    let length = header.len().to_string();
    let headers = [("Inference-Header-Content-Length", length.as_str())];
    let response = request(
        &server.http_address,
        "POST",
        "/v2/models/identity_types/infer",
        &headers,
        &body,
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let length: usize = response
        .header("inference-header-content-length")
        .unwrap()
        .parse()
        .unwrap();
    let text = std::str::from_utf8(&response.body[..length]).unwrap();
    assert!(
        text.contains(
            r#""name":"OUT_FP32","datatype":"FP32","shape":[1,2],"data":[NaN,-Infinity]"#
        ),
        "{text}"
    );
    assert!(text.contains(r#""data":[Infinity,0.1]"#), "{text}");
    assert_eq!(&response.body[length..], [halves, bf16].concat());
    // Everything else parses as standard JSON once the float outputs are dropped.
    let cleaned = text
        .replace("[NaN,-Infinity]", "[]")
        .replace("[Infinity,0.1]", "[]");
    let json: Value = serde_json::from_str(&cleaned).unwrap();
    for (datatype, data) in &json_inputs {
        let output = json["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == format!("OUT_{datatype}"))
            .unwrap();
        assert_eq!(output["datatype"], *datatype);
        assert_eq!(output["shape"], json!([1, 2]));
        assert_eq!(output["data"], data[0], "{datatype}: outputs are flat");
    }
}

#[tokio::test]
async fn compressed_and_chunked_bodies() {
    let server = Server::start();
    let request_json = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": vec![1.0; 16]},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": vec![2.0; 16]},
        ],
    })
    .to_string();
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gzip, request_json.as_bytes()).unwrap();
    let compressed = gzip.finish().unwrap();
    let headers = [("Content-Encoding", "gzip"), ("Accept-Encoding", "gzip")];
    let response = request(
        &server.http_address,
        "POST",
        "/v2/models/add_sub/infer",
        &headers,
        &compressed,
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-encoding"), Some("gzip"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(&response.body[..])
        .read_to_string(&mut text)
        .unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["outputs"][0]["data"][0], 3.0);

    let headers = [("Transfer-Encoding", "chunked")];
    let response = request(
        &server.http_address,
        "POST",
        "/v2/models/add_sub/infer",
        &headers,
        &chunked(request_json.as_bytes(), 7),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["outputs"][1]["data"][0], -1.0);
}
