//! Graceful shutdown through the real binary: SIGTERM while 200 requests (gRPC, REST and a
//! stream) are in flight. Readiness goes false at once, new work is refused with a clean
//! UNAVAILABLE / 503 "Server exiting", every admitted request is answered correctly, no response
//! is cut off, and the process exits 0 once the work is done, well before the exit timeout.

use crate::common::http_client;
use crate::common::Server;
use bytes::Bytes;
use kiln::proto::inference::{
    model_infer_request::InferInputTensor, ModelInferRequest, ModelInferResponse,
    ModelStatisticsRequest, ServerReadyRequest,
};
use std::time::{Duration, Instant};
use tonic::Code;

const MODEL: &str = "slow_compute";

/// `slow_compute` runs a 1024 x 1024 matrix product per request on one instance: 200 requests
/// take seconds, so most are still queued when SIGTERM arrives.
fn request(x: f32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: MODEL.into(),
        id: format!("{x}"),
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

fn output(response: &ModelInferResponse) -> f32 {
    f32::from_le_bytes(
        response.raw_output_contents[0][..4]
            .try_into()
            .expect("4 bytes"),
    )
}

/// What one request got: its answer, or a clean refusal.
#[derive(Debug, PartialEq)]
enum Outcome {
    Answered,
    Exiting,
}

async fn rest_infer(address: String, x: f32) -> Outcome {
    let body =
        format!(r#"{{"inputs":[{{"name":"X","datatype":"FP32","shape":[1,1],"data":[{x}]}}]}}"#);
    let response = http_client::post(
        &address,
        &format!("/v2/models/{MODEL}/infer"),
        body.as_bytes(),
    )
    .await;
    match response.status {
        200 => {
            assert_eq!(response.json()["outputs"][0]["data"][0], f64::from(x + 1.0));
            Outcome::Answered
        }
        503 => {
            assert_eq!(response.error(), "Server exiting");
            Outcome::Exiting
        }
        other => panic!("REST request {x}: status {other}: {}", response.text()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_200_requests_in_flight_and_exits_0() {
    let mut server = Server::start_with(
        &["tests/fixtures/drain_repository"],
        &["--exit-timeout-secs", "120"],
    );
    let client = server.client().await;
    assert!(
        client
            .clone()
            .server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );

    let mut grpc = Vec::new();
    for i in 0..90 {
        let mut client = client.clone();
        grpc.push(tokio::spawn(async move {
            match client.model_infer(request(i as f32)).await {
                Ok(response) => {
                    assert_eq!(output(&response.into_inner()), i as f32 + 1.0);
                    Outcome::Answered
                }
                Err(status) => {
                    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                    assert_eq!(status.message(), "Server exiting");
                    Outcome::Exiting
                }
            }
        }));
    }
    let rest: Vec<_> = (0..100)
        .map(|i| tokio::spawn(rest_infer(server.http_address.clone(), 1000.0 + i as f32)))
        .collect();
    let stream = {
        let mut client = client.clone();
        tokio::spawn(async move {
            let requests: Vec<_> = (0..10).map(|i| request(5000.0 + i as f32)).collect();
            let mut responses = client
                .model_stream_infer(tokio_stream::iter(requests))
                .await
                .expect("stream opens")
                .into_inner();
            let mut outcomes = Vec::new();
            while let Some(message) = responses.message().await.expect("stream not cut off") {
                if message.error_message.is_empty() {
                    let response = message.infer_response.expect("a response");
                    let x: f32 = response.id.parse().unwrap();
                    assert_eq!(output(&response), x + 1.0);
                    outcomes.push(Outcome::Answered);
                } else {
                    assert_eq!(message.error_message, "Server exiting");
                    outcomes.push(Outcome::Exiting);
                }
            }
            outcomes
        })
    };

    // Let the first few requests run (the statistics count them), then signal.
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed(&client).await == 0 {
        assert!(Instant::now() < deadline, "no request ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done_before = completed(&client).await;
    server.sigterm();
    let signalled = Instant::now();

    // Readiness goes false at once on both protocols while the work drains.
    let mut ready = true;
    while ready && signalled.elapsed() < Duration::from_secs(2) {
        ready = client
            .clone()
            .server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready;
    }
    assert!(!ready, "gRPC ServerReady still true after SIGTERM");
    let health = http_client::get(&server.http_address, "/v2/health/ready").await;
    assert_eq!(health.status, 400);
    assert_eq!(health.json(), serde_json::json!({"ready": false}));
    // New work is refused cleanly.
    let late = client.clone().model_infer(request(-1.0)).await.unwrap_err();
    assert_eq!(
        (late.code(), late.message()),
        (Code::Unavailable, "Server exiting")
    );
    assert_eq!(
        rest_infer(server.http_address.clone(), -2.0).await,
        Outcome::Exiting
    );
    let still_running = completed(&client).await;

    let mut outcomes = Vec::new();
    for task in grpc.into_iter().chain(rest) {
        outcomes.push(task.await.expect("request task"));
    }
    outcomes.extend(stream.await.expect("stream task"));
    assert_eq!(outcomes.len(), 200);
    let answered = outcomes.iter().filter(|o| **o == Outcome::Answered).count();
    let pid = server.pid();
    let status = tokio::task::spawn_blocking(move || {
        let status = server.wait();
        (status, pid)
    })
    .await
    .unwrap()
    .0;
    let exit_after = signalled.elapsed();
    eprintln!(
        "{done_before} done before SIGTERM, {still_running} soon after; {answered} of 200 answered; exit {exit_after:?} after SIGTERM"
    );
    assert!(status.success(), "exit status {status:?}");
    assert!(
        done_before < 150,
        "too few requests were in flight: {done_before} already done"
    );
    assert!(
        answered as u64 > done_before,
        "work admitted before SIGTERM finished after it"
    );
    assert!(
        exit_after < Duration::from_secs(60),
        "exit took {exit_after:?}"
    );
}

/// Successful requests so far, from the model's statistics (a metadata call, never refused).
async fn completed(
    client: &kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient<
        tonic::transport::Channel,
    >,
) -> u64 {
    let stats = client
        .clone()
        .model_statistics(ModelStatisticsRequest {
            name: MODEL.into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .model_stats;
    stats[0]
        .inference_stats
        .as_ref()
        .and_then(|s| s.success.as_ref())
        .map_or(0, |s| s.count)
}
