//! Overload through the real binary: a flood beyond a model's `max_inflight_requests` or the
//! server's `--max-inflight-requests` is refused at once (RESOURCE_EXHAUSTED / 429) while the
//! admitted requests still succeed with correct results, and the model takes new work as soon as
//! the admitted requests finish.

use crate::common::http_client;
use crate::common::Server;
use bytes::Bytes;
use kiln::proto::inference::{
    model_infer_request::InferInputTensor, ModelInferRequest, ServerReadyRequest,
};
use std::time::{Duration, Instant};
use tonic::Code;

/// A single-row request to a `Y = X + 1` model.
fn plus_one(model: &str, x: f32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "X".into(),
            datatype: "FP32".into(),
            shape: vec![1, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::copy_from_slice(&x.to_le_bytes())],
        ..Default::default()
    }
}

fn output(response: &kiln::proto::inference::ModelInferResponse) -> f32 {
    let raw = &response.raw_output_contents[0];
    f32::from_le_bytes(raw[..4].try_into().expect("4 bytes"))
}

/// Waits until `model` has `count` requests queued (its pending-request gauge): they hold their
/// in-flight slots, waiting for a batch.
async fn wait_queued(server: &Server, model: &str, count: usize) {
    let series =
        format!("nv_inference_pending_request_count{{model=\"{model}\",version=\"1\"}} {count}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server.metrics_text().lines().any(|line| line == series) {
        assert!(
            Instant::now() < deadline,
            "{model} never had {count} requests queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn rest_body(x: f32) -> Vec<u8> {
    format!(r#"{{"inputs":[{{"name":"X","datatype":"FP32","shape":[1,1],"data":[{x}]}}]}}"#)
        .into_bytes()
}

#[tokio::test]
async fn a_model_bound_refuses_the_flood_at_once_and_recovers() {
    let server = Server::start_with(&["tests/fixtures/model_repository"], &[]);
    let client = server.client().await;
    // bounded_batcher admits 4 requests; they wait up to 2 s for a batch of 8 that never forms.
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let result = client
                    .model_infer(plus_one("bounded_batcher", i as f32))
                    .await;
                (i, result, Instant::now())
            })
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    let mut answers = Vec::new();
    for task in tasks {
        let (i, result, at) = task.await.unwrap();
        answers.push((result.is_ok(), at));
        match result {
            Ok(response) => {
                admitted += 1;
                assert_eq!(output(&response.into_inner()), i as f32 + 1.0);
            }
            Err(status) => {
                refused += 1;
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert_eq!(
                    status.message(),
                    "[request id: <id_unknown>] Exceeds maximum in-flight requests (4) for model 'bounded_batcher'"
                );
            }
        }
    }
    assert_eq!((admitted, refused), (4, 16));
    // Refused at once: every refusal came before any admitted request was answered (those wait
    // for their batch's delay), not after a queue.
    let first_answer = answers.iter().filter(|a| a.0).map(|a| a.1).min();
    let last_refusal = answers.iter().filter(|a| !a.0).map(|a| a.1).max();
    assert!(
        last_refusal < first_answer,
        "a refusal waited for an admitted request"
    );

    // Recovered: four more are admitted; meanwhile REST is refused with 429 and Retry-After.
    let again: Vec<_> = (0..4)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .model_infer(plus_one("bounded_batcher", 100.0 + i as f32))
                    .await
            })
        })
        .collect();
    wait_queued(&server, "bounded_batcher", 4).await;
    let path = "/v2/models/bounded_batcher/infer";
    let rest = http_client::post(&server.http_address, path, &rest_body(1.0)).await;
    assert_eq!(rest.status, 429, "{}", rest.text());
    assert_eq!(rest.header("retry-after"), Some("1"));
    assert!(rest
        .error()
        .contains("Exceeds maximum in-flight requests (4)"));
    for (i, task) in again.into_iter().enumerate() {
        let response = task.await.unwrap().expect("admitted after recovery");
        assert_eq!(output(&response.into_inner()), 101.0 + i as f32);
    }
    let rest = http_client::post(&server.http_address, path, &rest_body(5.0)).await;
    assert_eq!(rest.status, 200, "{}", rest.text());
    assert_eq!(rest.json()["outputs"][0]["data"][0], 6.0);
}

#[tokio::test]
async fn the_server_bound_refuses_any_model_and_spares_other_apis() {
    let server = Server::start_with(
        &["tests/fixtures/model_repository"],
        &["--max-inflight-requests", "3"],
    );
    let client = server.client().await;
    // Three single-row requests to slow_batcher wait up to 2 s for a batch of 4: they hold every
    // server-wide slot.
    let held: Vec<_> = (0..3)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(
                async move { client.model_infer(plus_one("slow_batcher", i as f32)).await },
            )
        })
        .collect();
    wait_queued(&server, "slow_batcher", 3).await;
    let mut other = client.clone();
    let status = other
        .model_infer(plus_one("bounded_batcher", 1.0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "Exceeds maximum in-flight requests (3) for the server"
    );
    // Refused while the held requests still wait: none of them has been answered.
    assert!(held.iter().all(|task| !task.is_finished()));
    let rest = http_client::post(
        &server.http_address,
        "/v2/models/bounded_batcher/infer",
        &rest_body(1.0),
    )
    .await;
    assert_eq!(rest.status, 429);
    // Health, metadata and statistics are not inference: never refused for load.
    assert!(other.server_ready(ServerReadyRequest {}).await.is_ok());
    for (i, task) in held.into_iter().enumerate() {
        let response = task.await.unwrap().expect("held requests succeed");
        assert_eq!(output(&response.into_inner()), i as f32 + 1.0);
    }
    let response = other
        .model_infer(plus_one("bounded_batcher", 7.0))
        .await
        .expect("admitted again once the slots are free");
    assert_eq!(output(&response.into_inner()), 8.0);
}
