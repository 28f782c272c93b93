//! Model lifecycle through the real binary: control modes, the repository API on both protocols
//! (index, load, unload), and readiness that follows what can be served (REST, `ServerReady` and
//! `grpc.health.v1`). Overrides and name checks are in `lifecycle_overrides.rs`.

use crate::common::http_client::{get, post};
use crate::common::lifecycle::*;
use crate::common::onnx::add_bias_config;
use crate::common::Server;
use kiln::proto::inference::{ModelReadyRequest, RepositoryModelLoadRequest};
use serde_json::json;
use tonic::transport::Channel;
use tonic::Code;

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
