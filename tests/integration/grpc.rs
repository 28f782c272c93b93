//! The real binary on port 0, driven with the generated tonic client.

use crate::common::{fp32_bytes, fp32_values, model_config, Server};
use bytes::Bytes;
use kiln::proto::inference::{
    model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
    CudaSharedMemoryRegisterRequest, InferTensorContents, ModelInferRequest, ModelMetadataRequest,
    ModelReadyRequest, RepositoryIndexRequest, ServerLiveRequest, ServerMetadataRequest,
    ServerReadyRequest,
};
use tonic::Code;

fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

fn add_sub_request(batch: usize) -> ModelInferRequest {
    let a: Vec<f32> = (0..16 * batch).map(|i| i as f32).collect();
    let b: Vec<f32> = vec![0.5; 16 * batch];
    let shape = [batch as i64, 16];
    ModelInferRequest {
        model_name: "add_sub".into(),
        id: "req-1".into(),
        inputs: vec![
            input("INPUT0", "FP32", &shape),
            input("INPUT1", "FP32", &shape),
        ],
        raw_input_contents: vec![fp32_bytes(&a), fp32_bytes(&b)],
        ..Default::default()
    }
}

#[tokio::test]
async fn health_metadata_and_index() {
    let server = Server::start();
    let mut client = server.client().await;
    assert!(
        client
            .server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    // `broken` and `name_mismatch` fail to load: strict readiness says not ready.
    assert!(
        !client
            .server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let metadata = client
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(metadata.name, "kiln");
    assert!(metadata
        .extensions
        .contains(&"model_configuration".to_string()));

    let ready = |name: &str, version: &str| ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    };
    // As in Triton, ModelReady never fails: unknown or unloadable models are simply not ready.
    for (name, version, expected) in [
        ("add_sub", "", true),
        ("mlp_classifier", "2", true),
        ("nope", "", false),
        ("broken", "1", false),
        ("versioned", "2", false),
        ("add_sub", "abc", false),
    ] {
        let response = client.model_ready(ready(name, version)).await.unwrap();
        assert_eq!(response.into_inner().ready, expected, "{name} {version}");
    }

    let meta = client
        .model_metadata(ModelMetadataRequest {
            name: "mlp_classifier".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.versions, vec!["1", "2"]);
    assert_eq!(meta.platform, "onnxruntime_onnx");
    assert_eq!(meta.inputs[0].shape, vec![-1, 64]);

    let index = client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    let broken = index.models.iter().find(|m| m.name == "broken").unwrap();
    assert_eq!(broken.state, "UNAVAILABLE");
    assert!(
        broken.reason.contains("Protobuf parsing failed"),
        "{}",
        broken.reason
    );
    let versioned: Vec<&str> = index
        .models
        .iter()
        .filter(|m| m.name == "versioned")
        .map(|m| m.version.as_str())
        .collect();
    assert_eq!(versioned, vec!["1", "3"]);
}

#[tokio::test]
async fn auto_completed_config() {
    let server = Server::start();
    let mut client = server.client().await;
    let config = model_config(&mut client, "identity_types").await;
    assert_eq!(config.max_batch_size, 4);
    assert!(config.scheduling_choice.is_some(), "dynamic_batching added");
    assert_eq!(config.instance_group[0].count, 2);
    assert_eq!(config.input.len(), 14);
    let nobatch = model_config(&mut client, "nobatch_dynamic").await;
    assert_eq!(nobatch.max_batch_size, 0);
    assert_eq!(nobatch.input[0].dims, vec![3, -1]);
}

#[tokio::test]
async fn add_sub_raw_and_typed() {
    let server = Server::start();
    let mut client = server.client().await;
    let response = client
        .model_infer(add_sub_request(3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            response.model_name.as_str(),
            response.model_version.as_str(),
            response.id.as_str()
        ),
        ("add_sub", "1", "req-1")
    );
    assert_eq!(response.outputs.len(), 2);
    assert_eq!(response.raw_output_contents.len(), 2);
    assert_eq!(response.outputs[0].shape, vec![3, 16]);
    let sum = fp32_values(&response.raw_output_contents[0]);
    let diff = fp32_values(&response.raw_output_contents[1]);
    assert_eq!(sum[17], 17.5);
    assert_eq!(diff[47], 46.5);

    // Typed contents, and only one requested output.
    let mut typed = add_sub_request(1);
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    typed.raw_input_contents.clear();
    typed.inputs[0].contents = Some(InferTensorContents {
        fp32_contents: a.clone(),
        ..Default::default()
    });
    typed.inputs[1].contents = Some(InferTensorContents {
        fp32_contents: a,
        ..Default::default()
    });
    typed.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT0".into(),
        ..Default::default()
    }];
    let response = client.model_infer(typed).await.unwrap().into_inner();
    assert_eq!(response.outputs.len(), 1);
    assert_eq!(response.outputs[0].name, "OUTPUT0");
    assert_eq!(fp32_values(&response.raw_output_contents[0])[5], 10.0);
}

#[tokio::test]
async fn versions_scalar_and_reshape() {
    let server = Server::start();
    let mut client = server.client().await;
    let one = |model: &str, version: &str| ModelInferRequest {
        model_name: model.into(),
        model_version: version.into(),
        inputs: vec![input("INPUT0", "FP32", &[1])],
        raw_input_contents: vec![fp32_bytes(&[10.0])],
        ..Default::default()
    };
    for (version, expected) in [("", 13.0), ("1", 11.0), ("3", 13.0)] {
        let response = client
            .model_infer(one("versioned", version))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            fp32_values(&response.raw_output_contents[0]),
            vec![expected],
            "version {version:?}"
        );
    }
    let err = client.model_infer(one("versioned", "2")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.message(),
        "Request for unknown model: 'versioned' version 2 is not found"
    );
    let err = client
        .model_infer(one("versioned", "abc"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    let scalar = ModelInferRequest {
        model_name: "scalar".into(),
        inputs: vec![input("X", "FP32", &[1])],
        raw_input_contents: vec![fp32_bytes(&[4.0])],
        ..Default::default()
    };
    let response = client.model_infer(scalar).await.unwrap().into_inner();
    assert_eq!(response.outputs[0].shape, vec![1]);
    assert_eq!(fp32_values(&response.raw_output_contents[0]), vec![8.0]);

    let reshaped = ModelInferRequest {
        model_name: "reshaped".into(),
        inputs: vec![input("X", "FP32", &[2, 2, 2])],
        raw_input_contents: vec![fp32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])],
        ..Default::default()
    };
    let response = client.model_infer(reshaped).await.unwrap().into_inner();
    assert_eq!(response.outputs[0].shape, vec![2, 2, 2]);
    assert_eq!(fp32_values(&response.raw_output_contents[0])[7], 8.0);
}

#[tokio::test]
async fn bad_requests_get_triton_errors_and_the_server_stays_up() {
    let mut server = Server::start_with(
        &["model_repository", "tests/fixtures/model_repository"],
        &["--allow-client-shm=true"],
    );
    let mut client = server.client().await;
    let cases: Vec<(ModelInferRequest, Code, &str)> = vec![
        (
            ModelInferRequest {
                model_name: "nope".into(),
                ..Default::default()
            },
            Code::NotFound,
            "Request for unknown model: 'nope' is not found",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.inputs[0].datatype = "FP64".into();
                r
            },
            Code::InvalidArgument,
            "data-type is 'FP64', but model 'add_sub' expects 'FP32'",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.raw_input_contents[1] = Bytes::from_static(&[0; 8]);
                r
            },
            Code::InvalidArgument,
            "input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 8",
        ),
        (
            {
                let mut r = add_sub_request(9);
                r.id.clear();
                r
            },
            Code::InvalidArgument,
            "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub'",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.inputs[0].shape = vec![1 << 40, 1 << 40];
                r.inputs[1].shape = vec![1 << 40, 1 << 40];
                r
            },
            Code::InvalidArgument,
            "batch-size must be <= 8",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.inputs[0].shape = vec![1, 1 << 62];
                r
            },
            Code::InvalidArgument,
            "unexpected shape for input 'INPUT0'",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.raw_input_contents.pop();
                r
            },
            Code::InvalidArgument,
            "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request.",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.outputs.push(InferRequestedOutputTensor {
                    name: "X".into(),
                    ..Default::default()
                });
                r
            },
            Code::InvalidArgument,
            "unexpected inference output 'X' for model 'add_sub'",
        ),
        (
            {
                let mut r = add_sub_request(1);
                r.model_version = "7".into();
                r
            },
            Code::NotFound,
            "version 7 is not found",
        ),
        (
            ModelInferRequest {
                model_name: "broken".into(),
                ..Default::default()
            },
            Code::NotFound,
            "has no available versions",
        ),
    ];
    for (request, code, text) in cases {
        let err = client.model_infer(request).await.unwrap_err();
        assert_eq!(err.code(), code, "{}", err.message());
        assert!(
            err.message().contains(text),
            "{:?} does not contain {text:?}",
            err.message()
        );
    }
    // A huge shape on a variable-size input fails fast without allocating.
    let huge = ModelInferRequest {
        model_name: "int_div".into(),
        inputs: vec![input("A", "INT32", &[i64::MAX]), input("B", "INT32", &[1])],
        raw_input_contents: vec![Bytes::from_static(&[0; 4]), Bytes::from_static(&[0; 4])],
        ..Default::default()
    };
    assert_eq!(
        client.model_infer(huge).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // Malformed BYTES framing.
    let framing = ModelInferRequest {
        model_name: "string_echo".into(),
        inputs: vec![input("input-1", "BYTES", &[1, 1])],
        raw_input_contents: vec![Bytes::from_static(&[200, 0, 0, 0, b'x'])],
        ..Default::default()
    };
    let err = client.model_infer(framing).await.unwrap_err();
    assert!(
        err.message().contains("declares 200 bytes"),
        "{}",
        err.message()
    );
    let err = client
        .cuda_shared_memory_register(CudaSharedMemoryRegisterRequest {
            name: "r".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert_eq!(
        err.message(),
        "failed to register CUDA shared memory region 'r': kiln does not serve CUDA shared memory"
    );

    assert!(server.is_running());
    assert!(client.model_infer(add_sub_request(2)).await.is_ok());
}

#[tokio::test]
async fn large_bytes_message_round_trips() {
    let server = Server::start();
    let mut client = server.client().await;
    let payload = "k".repeat(8 << 20);
    let mut framed = (payload.len() as u32).to_le_bytes().to_vec();
    framed.extend_from_slice(payload.as_bytes());
    let request = ModelInferRequest {
        model_name: "string_echo".into(),
        inputs: vec![input("input-1", "BYTES", &[1, 1])],
        raw_input_contents: vec![framed.clone().into()],
        ..Default::default()
    };
    let response = client.model_infer(request).await.unwrap().into_inner();
    assert_eq!(&response.raw_output_contents[0][..], &framed[..]);
}

#[tokio::test]
async fn sigterm_stops_cleanly() {
    let mut server = Server::start();
    let mut client = server.client().await;
    assert!(client.server_live(ServerLiveRequest {}).await.is_ok());
    let status = server.terminate();
    assert!(status.success(), "exit status {status:?}");
}

/// `--grpc-infer-response-compression-level`: responses are compressed for a client that accepts
/// gzip, and only when the flag asks.
#[tokio::test]
async fn responses_are_compressed_only_when_asked() {
    use tonic::codec::CompressionEncoding;
    for (level, compressed) in [("none", false), ("high", true)] {
        let flag = format!("--grpc-infer-response-compression-level={level}");
        let server = Server::start_with(&["model_repository"], &[&flag]);
        let mut client = server
            .client()
            .await
            .accept_compressed(CompressionEncoding::Gzip);
        let response = client
            .model_infer(add_sub_request(1))
            .await
            .expect("infers");
        let encoding = response
            .metadata()
            .get("grpc-encoding")
            .map(|v| v.to_str().unwrap_or_default().to_string());
        assert_eq!(
            encoding.as_deref() == Some("gzip"),
            compressed,
            "{level}: {encoding:?}"
        );
        let outputs = &response.get_ref().raw_output_contents;
        let sums = fp32_values(&outputs[0]);
        assert_eq!(sums[..3], [0.5, 1.5, 2.5], "{level}");
    }
}
