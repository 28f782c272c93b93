//! Model lifecycle through the real binary: control modes, the repository API on both protocols
//! (index, load with config and file overrides, unload), name validation, and readiness that
//! follows what can be served (REST, `ServerReady` and `grpc.health.v1`).

mod common;

use common::http_client::{get, post};
use common::onnx::{add_bias_config, add_bias_config_json, add_bias_model};
use common::{Server, TempRepo};
use kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::proto::inference::model_repository_parameter::ParameterChoice;
use kiln::proto::inference::{
    model_infer_request::InferInputTensor, ModelConfigRequest, ModelInferRequest,
    ModelReadyRequest, ModelRepositoryParameter, RepositoryIndexRequest,
    RepositoryModelLoadRequest, RepositoryModelUnloadRequest, ServerReadyRequest,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

type Client = GrpcInferenceServiceClient<Channel>;

/// A repository with `alpha` (Y = X + 1) and `beta` (Y = X + 2), FP32 [4], one instance each.
fn two_models() -> TempRepo {
    let repo = TempRepo::new("lifecycle");
    for (name, bias) in [("alpha", 1.0), ("beta", 2.0)] {
        repo.write(&format!("{name}/config.pbtxt"), add_bias_config(name, 4, 1));
        repo.write(&format!("{name}/1/model.onnx"), add_bias_model(4, bias));
    }
    repo
}

fn explicit(repo: &TempRepo, extra: &[&str]) -> Server {
    let mut args = vec!["--model-control-mode", "explicit"];
    args.extend_from_slice(extra);
    Server::launch(&[repo.path.clone()], &args, true)
}

fn param(choice: ParameterChoice) -> ModelRepositoryParameter {
    ModelRepositoryParameter {
        parameter_choice: Some(choice),
    }
}

async fn grpc_load(
    client: &mut Client,
    name: &str,
    parameters: Vec<(&str, ParameterChoice)>,
) -> Result<(), tonic::Status> {
    let parameters: HashMap<String, ModelRepositoryParameter> = parameters
        .into_iter()
        .map(|(k, v)| (k.to_string(), param(v)))
        .collect();
    client
        .repository_model_load(RepositoryModelLoadRequest {
            model_name: name.into(),
            parameters,
            ..Default::default()
        })
        .await
        .map(|_| ())
}

async fn grpc_unload(client: &mut Client, name: &str) -> Result<(), tonic::Status> {
    let parameters = HashMap::from([(
        "unload_dependents".to_string(),
        param(ParameterChoice::BoolParam(true)),
    )]);
    client
        .repository_model_unload(RepositoryModelUnloadRequest {
            model_name: name.into(),
            parameters,
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// `(name, version, state, reason)` rows of the gRPC index.
async fn index(client: &mut Client) -> Vec<(String, String, String, String)> {
    let response = client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    response
        .models
        .into_iter()
        .map(|m| (m.name, m.version, m.state, m.reason))
        .collect()
}

fn row(name: &str, version: &str, state: &str, reason: &str) -> (String, String, String, String) {
    (name.into(), version.into(), state.into(), reason.into())
}

/// Infers `Y = X + bias` on an add-bias model over gRPC and returns Y.
async fn grpc_infer(client: &mut Client, name: &str) -> Result<Vec<f32>, tonic::Status> {
    let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let response = client
        .model_infer(ModelInferRequest {
            model_name: name.into(),
            inputs: vec![InferInputTensor {
                name: "X".into(),
                datatype: "FP32".into(),
                shape: vec![4],
                ..Default::default()
            }],
            raw_input_contents: vec![x.into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(response.raw_output_contents[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

async fn rest_infer(address: &str, name: &str) -> (u16, Value) {
    let body =
        json!({"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]});
    let response = post(
        address,
        &format!("/v2/models/{name}/infer"),
        body.to_string().as_bytes(),
    )
    .await;
    (response.status, response.json())
}

async fn ready(client: &mut Client) -> bool {
    client
        .server_ready(ServerReadyRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready
}

/// Polls `check` until it holds, for up to 20 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn explicit_mode_loads_and_unloads_on_both_protocols() {
    let repo = two_models();
    let server = explicit(&repo, &[]);
    let mut client = server.client().await;
    // Nothing is loaded and nothing has to be: ready, every directory listed by name alone.
    assert!(ready(&mut client).await);
    assert_eq!(
        index(&mut client).await,
        vec![row("alpha", "", "", ""), row("beta", "", "", "")]
    );
    let rest_index = post(&server.http_address, "/v2/repository/index", b"").await;
    assert_eq!(
        rest_index.json(),
        json!([{"name": "alpha"}, {"name": "beta"}])
    );
    let missing = grpc_infer(&mut client, "alpha").await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        missing.message(),
        "Request for unknown model: 'alpha' is not found"
    );

    grpc_load(&mut client, "alpha", vec![]).await.unwrap();
    assert_eq!(
        grpc_infer(&mut client, "alpha").await.unwrap(),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    let loaded = post(&server.http_address, "/v2/repository/models/beta/load", b"").await;
    assert_eq!(
        (loaded.status, loaded.body.len()),
        (200, 0),
        "{}",
        loaded.text()
    );
    let (status, body) = rest_infer(&server.http_address, "beta").await;
    assert_eq!(
        (status, &body["outputs"][0]["data"]),
        (200, &json!([3.0, 4.0, 5.0, 6.0]))
    );
    assert_eq!(
        index(&mut client).await,
        vec![
            row("alpha", "1", "READY", ""),
            row("beta", "1", "READY", "")
        ]
    );

    grpc_unload(&mut client, "alpha").await.unwrap();
    let unloaded = post(
        &server.http_address,
        "/v2/repository/models/beta/unload",
        br#"{"parameters": {"unload_dependents": true}}"#,
    )
    .await;
    assert_eq!(unloaded.status, 200, "{}", unloaded.text());
    eventually("both models to be unloaded", || {
        let mut client = client.clone();
        async move {
            index(&mut client).await
                == vec![
                    row("alpha", "1", "UNAVAILABLE", "unloaded"),
                    row("beta", "1", "UNAVAILABLE", "unloaded"),
                ]
        }
    })
    .await;
    let gone = grpc_infer(&mut client, "alpha").await.unwrap_err();
    assert_eq!(
        gone.message(),
        "Request for unknown model: 'alpha' has no available versions"
    );
    let ready_alpha = ModelReadyRequest {
        name: "alpha".into(),
        version: "1".into(),
    };
    assert!(
        !client
            .model_ready(ready_alpha)
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert!(
        ready(&mut client).await,
        "unloaded models are not expected to serve"
    );
    // Unloading what is not loaded succeeds, as in Triton.
    grpc_unload(&mut client, "alpha").await.unwrap();

    let unknown = grpc_load(&mut client, "gamma", vec![]).await.unwrap_err();
    assert_eq!(unknown.code(), Code::Internal);
    assert_eq!(
        unknown.message(),
        "failed to load 'gamma', failed to poll from model repository"
    );
    let unknown = post(
        &server.http_address,
        "/v2/repository/models/gamma/load",
        b"{}",
    )
    .await;
    assert_eq!(unknown.status, 500);
    let named = client
        .repository_model_load(RepositoryModelLoadRequest {
            repository_name: "models".into(),
            model_name: "alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(named.code(), Code::Unimplemented);
    assert_eq!(
        named.message(),
        "'repository_name' specification is not supported"
    );
}

#[tokio::test]
async fn startup_models_follow_load_model() {
    let repo = two_models();
    let one = explicit(&repo, &["--load-model", "alpha"]);
    let mut client = one.client().await;
    assert_eq!(
        index(&mut client).await,
        vec![row("alpha", "1", "READY", ""), row("beta", "", "", "")]
    );
    assert!(ready(&mut client).await);

    let all = explicit(&repo, &["--load-model=*"]);
    let mut client = all.client().await;
    let states: Vec<String> = index(&mut client).await.into_iter().map(|r| r.2).collect();
    assert_eq!(states, vec!["READY", "READY"]);

    // A start-up model that does not exist: live, not ready, and the index says why.
    let missing = explicit(&repo, &["--load-model", "nope"]);
    let mut client = missing.client().await;
    assert!(!ready(&mut client).await);
    let nope = index(&mut client)
        .await
        .into_iter()
        .find(|r| r.0 == "nope")
        .unwrap();
    assert_eq!(
        (nope.2.as_str(), nope.3.as_str()),
        ("UNAVAILABLE", "model not found in any model repository")
    );
    assert_eq!(
        get(&missing.http_address, "/v2/health/live").await.status,
        200
    );

    // `*` must come alone, as tritonserver insists.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--model-repository")
        .arg(&repo.path)
        .args([
            "--model-control-mode",
            "explicit",
            "--load-model",
            "*",
            "--load-model",
            "alpha",
        ])
        .args([
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            "--allow-metrics",
            "false",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("must be the ONLY startup model"));
}

#[tokio::test]
async fn load_and_unload_need_explicit_mode() {
    let server = Server::start_with(&["model_repository"], &[]);
    let mut client = server.client().await;
    let expected = "explicit model load / unload is not allowed if polling is enabled";
    let load = grpc_load(&mut client, "add_sub", vec![]).await.unwrap_err();
    assert_eq!((load.code(), load.message()), (Code::Unavailable, expected));
    let unload = grpc_unload(&mut client, "add_sub").await.unwrap_err();
    assert_eq!(
        (unload.code(), unload.message()),
        (Code::Unavailable, expected)
    );
    let rest = post(
        &server.http_address,
        "/v2/repository/models/add_sub/unload",
        b"",
    )
    .await;
    assert_eq!((rest.status, rest.error()), (503, expected.to_string()));
}

#[tokio::test]
async fn config_and_file_overrides() {
    let repo = two_models();
    let server = explicit(&repo, &["--load-model", "alpha"]);
    let mut client = server.client().await;
    let instances = |client: &mut Client| {
        let mut client = client.clone();
        async move {
            let config = client
                .model_config(ModelConfigRequest {
                    name: "alpha".into(),
                    version: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .config
                .unwrap();
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
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("Invalid config override: "),
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
        ("", "model name must not be empty"),
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
    // A model directory that is a symlink out of the repository is listed but never loaded.
    let refused = grpc_load(&mut client, "linked", vec![]).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("outside the model repository"),
        "{}",
        refused.message()
    );
    let linked = index(&mut client)
        .await
        .into_iter()
        .find(|r| r.0 == "linked")
        .unwrap();
    assert_eq!(linked.2, "UNAVAILABLE");
}

#[tokio::test]
async fn readiness_follows_what_can_be_served() {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let repo = two_models();
    repo.write("broken/config.pbtxt", add_bias_config("broken", 4, 1));
    repo.write("broken/1/model.onnx", b"not an onnx model");
    let server = explicit(&repo, &["--load-model", "alpha", "--load-model", "broken"]);
    let mut client = server.client().await;
    let channel = Channel::from_shared(format!("http://{}", server.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let serving = |health: &mut HealthClient<Channel>| {
        let mut health = health.clone();
        async move {
            let request = HealthCheckRequest {
                service: String::new(),
            };
            health.check(request).await.unwrap().into_inner().status == 1
        }
    };
    assert!(!ready(&mut client).await);
    assert_eq!(
        get(&server.http_address, "/v2/health/ready").await.status,
        400
    );
    assert!(!serving(&mut health).await);
    let broken = index(&mut client)
        .await
        .into_iter()
        .find(|r| r.0 == "broken")
        .unwrap();
    assert_eq!(broken.2, "UNAVAILABLE");
    assert!(broken.3.contains("Protobuf parsing failed"), "{}", broken.3);
    // Unloading the broken model means it is no longer expected: the server becomes ready, and
    // the health service follows without a restart.
    grpc_unload(&mut client, "broken").await.unwrap();
    assert!(ready(&mut client).await);
    assert_eq!(
        get(&server.http_address, "/v2/health/ready").await.status,
        200
    );
    eventually("health to say SERVING", || serving(&mut health)).await;
    // Loading it again (still broken) fails and does not make it expected again.
    assert!(grpc_load(&mut client, "broken", vec![]).await.is_err());
    assert!(ready(&mut client).await);

    let lenient = explicit(
        &repo,
        &["--load-model", "broken", "--strict-readiness", "false"],
    );
    let mut client = lenient.client().await;
    assert!(
        ready(&mut client).await,
        "not strict: ready once the start-up load has run"
    );
}
