//! Scheduling through the real binary: batches form under concurrent load and are split back
//! correctly, queues fill, deadlines expire without running, streams answer in order, and
//! statistics and metrics report what happened.

use crate::common::lifecycle::eventually;
use crate::common::{fp32_bytes, fp32_values, repo_path, Server, TempRepo};
use bytes::Bytes;
use kiln::proto::inference::{
    grpc_inference_service_client::GrpcInferenceServiceClient, infer_parameter::ParameterChoice,
    model_infer_request::InferInputTensor, InferParameter, ModelInferRequest, ModelStatistics,
    ModelStatisticsRequest,
};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

/// A request to `slow_batcher` (Y = X + 1) with `rows` rows starting at `first`.
fn slow(first: f32, rows: usize) -> ModelInferRequest {
    let values: Vec<f32> = (0..rows).map(|r| first + r as f32).collect();
    ModelInferRequest {
        model_name: "slow_batcher".into(),
        id: format!("r{first}"),
        inputs: vec![InferInputTensor {
            name: "X".into(),
            datatype: "FP32".into(),
            shape: vec![rows as i64, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![fp32_bytes(&values)],
        ..Default::default()
    }
}

async fn stats(client: &mut GrpcInferenceServiceClient<Channel>, model: &str) -> ModelStatistics {
    let request = ModelStatisticsRequest {
        name: model.into(),
        version: String::new(),
    };
    let mut all = client
        .model_statistics(request)
        .await
        .unwrap()
        .into_inner()
        .model_stats;
    assert_eq!(all.len(), 1);
    all.remove(0)
}

#[tokio::test]
async fn concurrent_requests_form_a_preferred_batch_and_split_back() {
    let server = Server::start();
    let client = server.client().await;
    // Four single-row requests reach the preferred batch size of 4 and run together.
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.model_infer(slow(i as f32 * 10.0, 1)).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let response = task.await.unwrap().unwrap().into_inner();
        assert_eq!(response.id, format!("r{}", i as f32 * 10.0));
        assert_eq!(response.outputs[0].shape, vec![1, 1]);
        assert_eq!(
            fp32_values(&response.raw_output_contents[0]),
            vec![i as f32 * 10.0 + 1.0]
        );
    }
    let stats = stats(&mut client.clone(), "slow_batcher").await;
    assert_eq!(stats.inference_count, 4);
    assert_eq!(stats.execution_count, 1);
    assert_eq!(stats.batch_stats.len(), 1);
    assert_eq!(stats.batch_stats[0].batch_size, 4);
    let inference = stats.inference_stats.unwrap();
    assert_eq!(inference.success.unwrap().count, 4);
    assert_eq!(inference.queue.unwrap().count, 4);
    assert!(stats.last_inference > 0);
}

/// `slow_batcher` (Y = X + 1) whose requests all wait: a batch goes at 8 rows (its preferred
/// size) or after 2 s, and at most 4 requests queue.
fn queue_of_four() -> TempRepo {
    let repo = TempRepo::new("queue-of-four");
    let source = repo_path("tests/fixtures/model_repository/slow_batcher");
    let config = std::fs::read_to_string(source.join("config.pbtxt")).unwrap();
    let config = config.replace("preferred_batch_size: [ 4 ]", "preferred_batch_size: [ 8 ]");
    assert!(config.contains("preferred_batch_size: [ 8 ]") && config.contains("max_queue_size: 4"));
    repo.write("slow_batcher/config.pbtxt", config);
    repo.write(
        "slow_batcher/1/model.onnx",
        std::fs::read(source.join("1/model.onnx")).unwrap(),
    );
    repo
}

#[tokio::test]
async fn full_queue_rejects_and_waiting_requests_still_complete() {
    let repo = queue_of_four();
    let server = repo.serve(&[], true);
    let client = server.client().await;
    // Four single-row requests never make the preferred size (8), and none would pass it, so
    // all four wait for the 2 s delay (Triton's batcher): the queue (max 4) is full.
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.model_infer(slow(i as f32 * 3.0, 1)).await })
        })
        .collect();
    let mut client = client.clone();
    // Wait until the server reports all four queued, then one more must be refused.
    let queued = "nv_inference_pending_request_count{model=\"slow_batcher\",version=\"1\"} 4";
    eventually("four requests queued", || {
        let queued = server.metrics_text().lines().any(|l| l == queued);
        async move { queued }
    })
    .await;
    let rejected = client.model_infer(slow(100.0, 1)).await.err();
    let rejected = rejected.expect("the fifth request is refused");
    assert_eq!(rejected.code(), Code::Unavailable);
    assert_eq!(
        rejected.message(),
        "[request id: r100] Exceeds maximum queue size"
    );
    for (i, task) in waiting.into_iter().enumerate() {
        let response = task.await.unwrap().unwrap().into_inner();
        let first = i as f32 * 3.0;
        assert_eq!(
            fp32_values(&response.raw_output_contents[0]),
            vec![first + 1.0]
        );
    }
    let batches: Vec<(u64, u64)> = stats(&mut client, "slow_batcher")
        .await
        .batch_stats
        .iter()
        .map(|b| {
            (
                b.batch_size,
                b.compute_infer.as_ref().map_or(0, |d| d.count),
            )
        })
        .collect();
    assert_eq!(batches, [(4, 1)], "the four that waited ran as one batch");
    // Triton 2.51 counts a request its full queue refused nowhere (measured: its statistics and
    // nv_inference_request_failure stay at 0).
    let fail = stats(&mut client, "slow_batcher")
        .await
        .inference_stats
        .unwrap()
        .fail
        .map_or(0, |fail| fail.count);
    assert_eq!(fail, 0);
}

#[tokio::test]
async fn expired_requests_never_run() {
    let server = Server::start();
    let mut client = server.client().await;
    // A gRPC deadline that passes while the request waits for a batch: refused, never run.
    let mut request = tonic::Request::new(slow(2.0, 1));
    request.set_timeout(Duration::from_millis(100));
    let status = client.model_infer(request).await.unwrap_err();
    // kiln answers DEADLINE_EXCEEDED a little before the deadline; on a very busy machine the
    // transport's own timer (CANCELLED) can still win. Either way the request never runs.
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    // The failure is counted once the server has given the request up (polled, not slept for).
    eventually("the expired request to count as failed", || {
        let mut client = client.clone();
        async move {
            let stats = stats(&mut client, "slow_batcher").await;
            stats.inference_stats.unwrap().fail.map_or(0, |f| f.count) == 1
        }
    })
    .await;
    assert_eq!(stats(&mut client, "slow_batcher").await.execution_count, 0);
    // The request's own timeout (µs) cannot give a queue policy without one a timeout (Triton's
    // rule: it only shortens the policy's): the request waits out its batch delay and runs.
    // It runs alone: had the expired request stayed queued, it would have run beside it.
    let mut request = slow(1.0, 1);
    request.parameters.insert(
        "timeout".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(100_000)),
        },
    );
    let response = client.model_infer(request).await.unwrap().into_inner();
    assert_eq!(fp32_values(&response.raw_output_contents[0]), vec![2.0]);
    let stats = stats(&mut client, "slow_batcher").await;
    assert_eq!((stats.execution_count, stats.inference_count), (1, 1));
    let batches: Vec<(u64, u64)> = stats
        .batch_stats
        .iter()
        .map(|b| {
            (
                b.batch_size,
                b.compute_infer.as_ref().map_or(0, |d| d.count),
            )
        })
        .collect();
    assert_eq!(
        batches,
        [(1, 1)],
        "one batch of one row: the expired request never ran"
    );
}

#[tokio::test]
async fn streams_answer_every_request_in_order() {
    let server = Server::start();
    let mut client = server.client().await;
    let requests: Vec<ModelInferRequest> = (0..12)
        .map(|i| {
            let mut request = ModelInferRequest {
                model_name: if i == 5 {
                    "nope".into()
                } else {
                    "add_sub".into()
                },
                id: format!("s{i}"),
                inputs: ["INPUT0", "INPUT1"]
                    .map(|name| InferInputTensor {
                        name: name.into(),
                        datatype: "FP32".into(),
                        shape: vec![1, 16],
                        ..Default::default()
                    })
                    .to_vec(),
                ..Default::default()
            };
            request.raw_input_contents = vec![fp32_bytes(&[i as f32; 16]), fp32_bytes(&[1.0; 16])];
            request
        })
        .collect();
    let mut responses = client
        .model_stream_infer(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut seen = 0;
    while let Some(item) = responses.message().await.unwrap() {
        let response = item.infer_response.unwrap();
        assert_eq!(response.id, format!("s{seen}"), "in request order");
        if seen == 5 {
            assert_eq!(
                item.error_message,
                "Request for unknown model: 'nope' is not found"
            );
        } else {
            assert!(item.error_message.is_empty());
            assert_eq!(
                fp32_values(&response.raw_output_contents[0])[0],
                seen as f32 + 1.0
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 12);
}

#[tokio::test]
async fn statistics_cover_all_models_and_metrics_use_triton_names() {
    let server = Server::start();
    let mut client = server.client().await;
    let request = ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: ["INPUT0", "INPUT1"]
            .map(|name| InferInputTensor {
                name: name.into(),
                datatype: "FP32".into(),
                shape: vec![2, 16],
                ..Default::default()
            })
            .to_vec(),
        raw_input_contents: vec![fp32_bytes(&[1.0; 32]), fp32_bytes(&[2.0; 32])],
        ..Default::default()
    };
    for _ in 0..3 {
        client.model_infer(request.clone()).await.unwrap();
    }
    let mut bad = request.clone();
    bad.raw_input_contents[0] = Bytes::from_static(&[0; 4]);
    assert!(client.model_infer(bad).await.is_err());

    let all = client
        .model_statistics(ModelStatisticsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let versions: Vec<(&str, &str)> = all
        .model_stats
        .iter()
        .map(|s| (s.name.as_str(), s.version.as_str()))
        .collect();
    assert!(
        versions.contains(&("mlp_classifier", "1")) && versions.contains(&("mlp_classifier", "2"))
    );
    assert!(
        !versions.iter().any(|(name, _)| *name == "broken"),
        "only serving versions"
    );
    let add_sub = all
        .model_stats
        .iter()
        .find(|s| s.name == "add_sub")
        .unwrap();
    assert_eq!((add_sub.inference_count, add_sub.execution_count), (6, 3));
    assert_eq!(add_sub.batch_stats[0].batch_size, 2);
    let idle = all
        .model_stats
        .iter()
        .find(|s| s.name == "string_echo")
        .unwrap();
    assert_eq!(
        (
            idle.inference_count,
            idle.execution_count,
            idle.last_inference
        ),
        (0, 0, 0)
    );
    let unknown = ModelStatisticsRequest {
        name: "nope".into(),
        version: String::new(),
    };
    let refused = client.model_statistics(unknown).await.unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (
            Code::InvalidArgument,
            "requested model 'nope' is not available"
        )
    );

    let text = server.metrics_text();
    for line in [
        "nv_inference_request_success{model=\"add_sub\",version=\"1\"} 3",
        // The bad request was refused before it was queued: Triton counts it nowhere.
        "nv_inference_request_failure{model=\"add_sub\",reason=\"OTHER\",version=\"1\"} 0",
        "nv_inference_count{model=\"add_sub\",version=\"1\"} 6",
        "nv_inference_exec_count{model=\"add_sub\",version=\"1\"} 3",
        "nv_inference_pending_request_count{model=\"add_sub\",version=\"1\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    for name in [
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ] {
        assert!(text.contains(&format!("# TYPE {name} counter")), "{name}");
    }
    // Latency summaries are off unless --metrics-config asks for them, as in Triton.
    assert!(!text.contains("nv_inference_request_summary_us"));
    assert!(text.contains("# TYPE nv_model_load_duration_secs gauge"));
    assert!(text.contains("nv_model_load_duration_secs{model=\"add_sub\",version=\"1\"}"));
}
