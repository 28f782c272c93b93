//! Hostile and malformed REST requests against the real binary: each gets Triton's status and a
//! JSON error, and the server stays up.

use crate::common::http_client::{get, request, Response};
use crate::common::Server;

const INFER: &str = "/v2/models/add_sub/infer";

async fn assert_alive(server: &Server) {
    let live = get(&server.http_address, "/v2/health/live").await;
    assert_eq!(live.status, 200, "server should survive: {}", live.text());
}

async fn infer(server: &Server, headers: &[(&str, &str)], body: &[u8]) -> Response {
    request(&server.http_address, "POST", INFER, headers, body).await
}

fn input(shape: &str, datatype: &str, source: &str) -> String {
    format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":{shape},"datatype":"{datatype}",{source}}}]}}"#
    )
}

#[tokio::test]
async fn malformed_bodies_get_400_and_the_server_lives() {
    let server = Server::start();
    let deep_bomb = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1],"datatype":"FP32","data":{}1{}}}]}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let object_bomb = "{\"a\":".repeat(200_000);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", b"\x00\xffnot json at all".to_vec(), "failed to parse the request JSON buffer"),
        // No JSON at all: a raw request, which add_sub's two inputs refuse.
        ("empty", Vec::new(), "Raw request must only have 1 input (found 1)"),
        ("truncated", br#"{"inputs": [{"name": "INPUT0""#.to_vec(), "failed to parse"),
        ("negative shape", input("[-1, 16]", "FP32", r#""data":[1]"#).into_bytes(), "Unable to parse 'shape'"),
        (
            "overflowing shape",
            input("[4294967296, 4294967296, 4294967296]", "FP32", r#""data":[1]"#).into_bytes(),
            "causes total element count to exceed maximum size of 9223372036854775807",
        ),
        (
            "shape beyond i64",
            input("[18446744073709551615]", "FP32", r#""data":[1]"#).into_bytes(),
            "Unable to parse 'shape'",
        ),
        // Read to the end without recursing, as Triton's iterative parser reads it; `data`
        // nests at most Triton's 100 levels.
        (
            "nested depth bomb",
            deep_bomb.into_bytes(),
            "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)",
        ),
        ("object depth bomb", object_bomb.into_bytes(), "Invalid value. at 1000000"),
        (
            "wrong datatype",
            format!(
                r#"{{"inputs":[{{"name":"INPUT0","shape":[1,16],"datatype":"FP64","data":{d}}},{{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":{d}}}]}}"#,
                d = serde_json::json!(vec![1.0; 16])
            )
            .into_bytes(),
            "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'",
        ),
        ("unknown datatype", input("[1,16]", "FLOAT", r#""data":[1]"#).into_bytes(), "invalid datatype for input INPUT0"),
        ("data count", input("[1,16]", "FP32", r#""data":[1,2]"#).into_bytes(), "Shape does not match"),
        ("data kind", input("[1,1]", "FP32", r#""data":["x"]"#).into_bytes(), "expected a number"),
        ("fp16 as json", input("[1,1]", "FP16", r#""data":[1]"#).into_bytes(), "receiving FP16 data via JSON is not supported"),
        (
            "binary without header length",
            input("[1,16]", "FP32", r#""parameters":{"binary_data_size":64}"#).into_bytes(),
            "unexpected size for input 'INPUT0', expecting 64 additional bytes",
        ),
        ("no data", input("[1,16]", "FP32", r#""parameters":{}"#).into_bytes(), "But no field is set"),
    ];
    for (what, body, expected) in cases {
        let response = infer(&server, &[], &body).await;
        // Triton main's INTERNAL for a dimension that is not an unsigned integer (TritonJson's
        // IndexAsUInt; qa/L0_http test_negative_dimensions).
        let status = if what == "negative shape" { 500 } else { 400 };
        assert_eq!(response.status, status, "{what}: {}", response.text());
        assert_eq!(
            response.header("content-type"),
            Some("application/json"),
            "{what}"
        );
        let message = response.error();
        assert!(message.contains(expected), "{what}: {message}");
        assert_alive(&server).await;
    }
}

#[tokio::test]
async fn binary_extension_abuse() {
    let server = Server::start();
    let header = input("[1,16]", "FP32", r#""parameters":{"binary_data_size":64}"#);
    let mut body = header.clone().into_bytes();
    body.extend_from_slice(&[0; 64]);

    // Header length larger than the body.
    let too_long = (body.len() + 1).to_string();
    let response = infer(
        &server,
        &[("Inference-Header-Content-Length", &too_long)],
        &body,
    )
    .await;
    assert_eq!(response.status, 400);
    assert!(
        response
            .error()
            .contains("inference header size should be in range"),
        "{}",
        response.error()
    );
    assert_alive(&server).await;

    for bad in ["-5", "abc", "99999999999999999999999"] {
        let response = infer(&server, &[("Inference-Header-Content-Length", bad)], &body).await;
        assert_eq!(response.status, 400, "{bad}");
        assert_alive(&server).await;
    }

    // Header length cutting the JSON short.
    let response = infer(&server, &[("Inference-Header-Content-Length", "10")], &body).await;
    assert_eq!(response.status, 400);
    assert!(response
        .error()
        .contains("failed to parse the request JSON buffer"));
    assert_alive(&server).await;

    // A huge binary_data_size: refused without allocating it.
    let huge = input(
        "[1,16]",
        "FP32",
        r#""parameters":{"binary_data_size":18446744073709551615}"#,
    );
    let mut huge_body = huge.clone().into_bytes();
    huge_body.extend_from_slice(&[0; 64]);
    let length = huge.len().to_string();
    let response = infer(
        &server,
        &[("Inference-Header-Content-Length", &length)],
        &huge_body,
    )
    .await;
    assert_eq!(response.status, 400);
    assert!(
        response
            .error()
            .contains("expecting 18446744073709551551 additional bytes"),
        "{}",
        response.error()
    );
    assert_alive(&server).await;

    // More binary data than the inputs declare.
    let mut extra = body.clone();
    extra.extend_from_slice(&[1, 2, 3]);
    let length = header.len().to_string();
    let response = infer(
        &server,
        &[("Inference-Header-Content-Length", &length)],
        &extra,
    )
    .await;
    assert_eq!(response.status, 400);
    assert_eq!(
        response.error(),
        "unexpected additional input data for model 'add_sub'"
    );
    assert_alive(&server).await;
}

#[tokio::test]
async fn limits_and_encodings() {
    let server = Server::start_with(
        &["model_repository", "tests/fixtures/model_repository"],
        &["--http-max-input-size", "4096"],
    );
    let too_big = vec![b' '; 5000];
    let response = infer(&server, &[], &too_big).await;
    assert_eq!(response.status, 413);
    assert!(response
        .error()
        .contains("maximum input size of 4096 bytes"));
    assert_alive(&server).await;

    // Declared too big: refused before the body is read.
    let response = infer(&server, &[("Content-Length", "1000000000")], b"").await;
    assert_eq!(response.status, 413);
    assert_alive(&server).await;

    // A gzip bomb: small on the wire, far past the limit inflated.
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gzip, &vec![b' '; 1_000_000]).unwrap();
    let bomb = gzip.finish().unwrap();
    assert!(bomb.len() < 4096);
    let response = infer(&server, &[("Content-Encoding", "gzip")], &bomb).await;
    // Triton: server src/data_compressor.h, DataCompressor::DecompressData.
    assert_eq!(response.status, 400);
    assert_eq!(
        response.error(),
        "Decompressed data size exceeds the maximum allowed value of 4096 bytes. Use \
         --http-max-input-size to increase the limit."
    );
    assert_alive(&server).await;

    let response = infer(&server, &[("Content-Encoding", "gzip")], b"not gzip").await;
    assert_eq!(response.status, 400);
    assert!(response.error().contains("failed to decompress"));
    assert_alive(&server).await;

    let response = infer(&server, &[("Content-Encoding", "br")], b"{}").await;
    assert_eq!(response.status, 501);
    assert_eq!(response.error(), "Unsupported compression type");
    assert_eq!(response.header("accept-encoding"), Some("gzip, deflate"));
    assert_alive(&server).await;
}

#[tokio::test]
async fn lookup_and_validation_statuses() {
    let server = Server::start();
    let body = br#"{"inputs":[]}"#;
    let unknown = request(
        &server.http_address,
        "POST",
        "/v2/models/nope/infer",
        &[],
        body,
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.error(),
        "Request for unknown model: 'nope' is not found"
    );
    let unavailable = request(
        &server.http_address,
        "POST",
        "/v2/models/broken/versions/1/infer",
        &[],
        body,
    )
    .await;
    assert_eq!(unavailable.status, 503, "{}", unavailable.text());
    let missing = infer(&server, &[], body).await;
    assert_eq!(missing.status, 400);
    assert!(missing
        .error()
        .contains("expected 2 inputs but got 0 inputs"));
    let reserved = infer(
        &server,
        &[],
        br#"{"parameters":{"triton_x":1},"inputs":[]}"#,
    )
    .await;
    assert_eq!(reserved.status, 400);
    assert!(reserved.error().contains("reserved for Triton usage"));
    let shm = infer(
        &server,
        &[],
        input(
            "[1,16]",
            "FP32",
            r#""parameters":{"shared_memory_region":"r","shared_memory_byte_size":64}"#,
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(shm.status, 404);
    assert_eq!(shm.error(), "Unable to find shared memory region: 'r'");
    let classify_bytes = request(
        &server.http_address,
        "POST",
        "/v2/models/string_echo/infer",
        &[],
        br#"{"inputs":[{"name":"input-1","shape":[1,1],"datatype":"BYTES","data":["a"]}],"outputs":[{"name":"output-1","parameters":{"classification":1}}]}"#,
    )
    .await;
    assert_eq!(classify_bytes.status, 400);
    assert_eq!(
        classify_bytes.error(),
        "class result not available for output due to unsupported type 'BYTES'"
    );
    assert_alive(&server).await;
}
