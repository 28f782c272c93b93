//! The load API's overrides through the real binary: `config` (JSON) and `file:` parameters on
//! both protocols, and every way a name or path could leave the repository, refused.

use crate::common::http_client::post;
use crate::common::lifecycle::*;
use crate::common::onnx::{add_bias_config, add_bias_config_json, add_bias_model};
use crate::common::{model_config, TempRepo};
use kiln::proto::inference::model_repository_parameter::ParameterChoice;
use serde_json::{json, Value};
use tonic::Code;

#[tokio::test]
async fn config_and_file_overrides() {
    let repo = two_models();
    let server = explicit(&repo, &["--load-model", "alpha"]);
    let mut client = server.client().await;
    let instances = |client: &mut Client| {
        let mut client = client.clone();
        async move {
            let config = model_config(&mut client, "alpha").await;
            config.instance_group[0].count
        }
    };
    assert_eq!(instances(&mut client).await, 1);
    let config = ParameterChoice::StringParam(add_bias_config_json("alpha", 4, 2));
    grpc_load(&mut client, "alpha", vec![("config", config)])
        .await
        .unwrap();
    assert_eq!(instances(&mut client).await, 2);
    let body = json!({"parameters": {"config": add_bias_config_json("alpha", 4, 3)}});
    let rest = post(
        &server.http_address,
        "/v2/repository/models/alpha/load",
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(rest.status, 200, "{}", rest.text());
    assert_eq!(instances(&mut client).await, 3);

    // A bad override is refused and the loaded model keeps serving.
    let bad = ParameterChoice::StringParam("{\"max_batch_size\": \"many\"}".into());
    let refused = grpc_load(&mut client, "alpha", vec![("config", bad)])
        .await
        .unwrap_err();
    // Triton main: the override is read while polling the model (core InitializeModelInfo), so
    // the answer is its poll failure, kiln's reason after it.
    assert_eq!(refused.code(), Code::Internal);
    assert!(
        refused.message().starts_with(
            "failed to load 'alpha', failed to poll from model repository: Invalid config override: "
        ),
        "{}",
        refused.message()
    );
    let mut renamed: Value = serde_json::from_str(&add_bias_config_json("alpha", 4, 1)).unwrap();
    renamed["input"][0]["name"] = json!("Z");
    let wrong_model = ParameterChoice::StringParam(renamed.to_string());
    let failed = grpc_load(&mut client, "alpha", vec![("config", wrong_model)])
        .await
        .unwrap_err();
    assert!(
        failed
            .message()
            .starts_with("load failed for model 'alpha': version 1 is at UNAVAILABLE state"),
        "{}",
        failed.message()
    );
    assert_eq!(
        grpc_infer(&mut client, "alpha").await.unwrap(),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(instances(&mut client).await, 3);

    // A model made only of uploaded files (gRPC bytes, REST base64).
    let files = vec![
        (
            "config",
            ParameterChoice::StringParam(add_bias_config_json("uploaded", 4, 1)),
        ),
        (
            "file:1/model.onnx",
            ParameterChoice::BytesParam(add_bias_model(4, 5.0).into()),
        ),
    ];
    grpc_load(&mut client, "uploaded", files).await.unwrap();
    assert_eq!(
        grpc_infer(&mut client, "uploaded").await.unwrap(),
        vec![6.0, 7.0, 8.0, 9.0]
    );
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(add_bias_model(4, 7.0));
    let body = json!({"parameters": {
        "config": add_bias_config_json("uploaded_rest", 4, 1),
        "file:1/model.onnx": encoded,
    }});
    let rest = post(
        &server.http_address,
        "/v2/repository/models/uploaded_rest/load",
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(rest.status, 200, "{}", rest.text());
    let (_, answer) = rest_infer(&server.http_address, "uploaded_rest").await;
    assert_eq!(answer["outputs"][0]["data"], json!([8.0, 9.0, 10.0, 11.0]));
    let names: Vec<String> = index(&mut client).await.into_iter().map(|r| r.0).collect();
    assert!(
        names.contains(&"uploaded".to_string()) && names.contains(&"uploaded_rest".to_string())
    );

    // Files without a config, files outside the model directory, labels outside it.
    let alone = vec![(
        "file:1/model.onnx",
        ParameterChoice::BytesParam(add_bias_model(4, 1.0).into()),
    )];
    let refused = grpc_load(&mut client, "lonely", alone).await.unwrap_err();
    assert_eq!(
        refused.message(),
        "Load parameter 'config' must be specified for model file override"
    );
    for path in [
        "file:../escaped/1/model.onnx",
        "file:/tmp/escaped.onnx",
        "file:1/../../x",
    ] {
        let files = vec![
            (
                "config",
                ParameterChoice::StringParam(add_bias_config_json("evil", 4, 1)),
            ),
            (
                path,
                ParameterChoice::BytesParam(add_bias_model(4, 1.0).into()),
            ),
        ];
        let refused = grpc_load(&mut client, "evil", files).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{path}");
        assert!(
            refused
                .message()
                .contains("must stay within model directory"),
            "{}",
            refused.message()
        );
    }
    let mut labelled: Value = serde_json::from_str(&add_bias_config_json("alpha", 4, 1)).unwrap();
    labelled["output"][0]["label_filename"] = json!("../../../../../../etc/hostname");
    let labels = ParameterChoice::StringParam(labelled.to_string());
    let refused = grpc_load(&mut client, "alpha", vec![("config", labels)])
        .await
        .unwrap_err();
    assert!(
        refused
            .message()
            .contains("must be relative and stay within the model directory"),
        "{}",
        refused.message()
    );
}

#[tokio::test]
async fn names_that_leave_the_repository_are_refused() {
    let repo = two_models();
    let elsewhere = TempRepo::new("elsewhere");
    elsewhere.write("outside/config.pbtxt", add_bias_config("linked", 4, 1));
    elsewhere.write("outside/1/model.onnx", add_bias_model(4, 1.0));
    std::os::unix::fs::symlink(elsewhere.path.join("outside"), repo.path.join("linked")).unwrap();
    let server = explicit(&repo, &[]);
    let mut client = server.client().await;
    for (name, message) in [
        (
            "../alpha",
            "invalid model name '../alpha', model name must not contain path traversal characters",
        ),
        (
            "alpha/1",
            "invalid model name 'alpha/1', model name must not contain path traversal characters",
        ),
        (
            "a\\b",
            "invalid model name 'a\\b', model name must not contain path traversal characters",
        ),
        (
            "",
            "Model name cannot be empty. Please enter a valid name to deploy.",
        ),
    ] {
        let refused = grpc_load(&mut client, name, vec![]).await.unwrap_err();
        assert_eq!(
            (refused.code(), refused.message()),
            (Code::InvalidArgument, message)
        );
    }
    for path in [
        "/v2/repository/models/..%2Falpha/load",
        "/v2/repository/models/%2E%2E/load",
    ] {
        let refused = post(&server.http_address, path, b"").await;
        assert_eq!(refused.status, 400, "{path}: {}", refused.text());
    }
    // A model directory that is a symlink out of the repository is the operator's link: it is
    // followed, and the model loads (kiln issue #48).
    grpc_load(&mut client, "linked", vec![]).await.unwrap();
    let linked = index(&mut client)
        .await
        .into_iter()
        .find(|r| r.0 == "linked")
        .unwrap();
    assert_eq!(linked.2, "READY");
}
