//! Hot reload and unload through the real binary: a model reloaded 20 times under steady load on
//! both protocols fails no request and leaves no thread behind; unloading a large model gives its
//! memory back; the listeners answer while models are still loading.

use crate::common::http_client::{get, post};
use crate::common::lifecycle::{add_bias_request, eventually, Client};
use crate::common::onnx::{add_bias_config, add_bias_config_json, add_bias_model};
use crate::common::TempRepo;
use kiln::proto::inference::model_repository_parameter::ParameterChoice;
use kiln::proto::inference::{
    ModelRepositoryParameter, RepositoryIndexRequest, RepositoryModelLoadRequest,
    RepositoryModelUnloadRequest, ServerReadyRequest,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

async fn load(client: &mut Client, name: &str, config: Option<String>) {
    let parameters = config
        .map(|json| {
            let value = ModelRepositoryParameter {
                parameter_choice: Some(ParameterChoice::StringParam(json)),
            };
            HashMap::from([("config".to_string(), value)])
        })
        .unwrap_or_default();
    let request = RepositoryModelLoadRequest {
        model_name: name.into(),
        parameters,
        ..Default::default()
    };
    client.repository_model_load(request).await.unwrap();
}

async fn grpc_infer(client: &mut Client, name: &str, n: usize) -> Result<(), String> {
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let request = add_bias_request(name, "", &x);
    let response = client
        .model_infer(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    let y = &response.get_ref().raw_output_contents[0];
    (y.len() == 4 * n)
        .then_some(())
        .ok_or_else(|| "short output".to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_under_load_fail_no_request() {
    let repo = TempRepo::new("reload");
    repo.write("steady/config.pbtxt", add_bias_config("steady", 4, 1));
    repo.write("steady/1/model.onnx", add_bias_model(4, 1.0));
    let args = ["--model-control-mode", "explicit", "--load-model", "steady"];
    let server = repo.serve(&args, true);
    let mut client = server.client().await;
    let baseline_threads = server.threads().len();

    let stop = Arc::new(AtomicBool::new(false));
    let succeeded = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for worker in 0..8 {
        let (stop, succeeded, failures) = (stop.clone(), succeeded.clone(), failures.clone());
        let mut client = client.clone();
        let http = server.http_address.clone();
        workers.push(tokio::spawn(async move {
            let body = json!({"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
                .to_string();
            while !stop.load(Ordering::SeqCst) {
                let result = if worker % 2 == 0 {
                    grpc_infer(&mut client, "steady", 4).await
                } else {
                    let response = post(&http, "/v2/models/steady/infer", body.as_bytes()).await;
                    (response.status == 200)
                        .then_some(())
                        .ok_or_else(|| format!("{}: {}", response.status, response.text()))
                };
                match result {
                    Ok(()) => succeeded.fetch_add(1, Ordering::SeqCst),
                    Err(e) => {
                        failures.lock().unwrap().push(e);
                        0
                    }
                };
            }
        }));
    }
    // 20 reloads, alternating protocols and instance counts (so each one really rebuilds), ending
    // with the start-up configuration.
    for round in 0..20 {
        let instances = if round % 2 == 0 { 2 } else { 1 };
        let config = add_bias_config_json("steady", 4, instances);
        if round % 4 < 2 {
            load(&mut client, "steady", Some(config)).await;
        } else {
            let body = json!({"parameters": {"config": config}}).to_string();
            let response = post(
                &server.http_address,
                "/v2/repository/models/steady/load",
                body.as_bytes(),
            )
            .await;
            assert_eq!(response.status, 200, "{}", response.text());
        }
        let before = succeeded.load(Ordering::SeqCst);
        eventually("requests between reloads", || async {
            succeeded.load(Ordering::SeqCst) > before + 10
        })
        .await;
    }
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    let total = succeeded.load(Ordering::SeqCst);
    eprintln!(
        "reload under load: {total} requests succeeded, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert!(total > 200, "only {total} requests ran");
    // Every replaced version was stopped: the thread count is back where it started.
    eventually("replaced versions to stop their threads", || async {
        server.threads().len() <= baseline_threads
    })
    .await;
    let index = client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap();
    let rows: Vec<(String, String)> = index
        .into_inner()
        .models
        .into_iter()
        .map(|m| (m.version, m.state))
        .collect();
    assert_eq!(rows, vec![("1".to_string(), "READY".to_string())]);
}

/// FP32 elements of the large model's weights: 64 MiB per session.
const BIG: usize = 16 << 20;

#[tokio::test]
async fn unload_gives_memory_back() {
    let repo = TempRepo::new("memory");
    repo.write("small/config.pbtxt", add_bias_config("small", 4, 1));
    repo.write("small/1/model.onnx", add_bias_model(4, 1.0));
    repo.write("big/config.pbtxt", add_bias_config("big", BIG, 2));
    repo.write("big/1/model.onnx", add_bias_model(BIG, 0.5));
    // `small` brings ONNX Runtime into the process first, so the baseline includes it.
    let args = ["--model-control-mode", "explicit", "--load-model", "small"];
    let server = repo.serve(&args, true);
    let mut client = server.client().await;
    grpc_infer(&mut client, "small", 4).await.unwrap();
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut figures = Vec::new();
    for cycle in 1..=3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = server.rss_kib();
        load(&mut client, "big", None).await;
        grpc_infer(&mut client, "big", BIG).await.unwrap();
        let loaded = server.rss_kib();
        let unload = RepositoryModelUnloadRequest {
            model_name: "big".into(),
            ..Default::default()
        };
        client.repository_model_unload(unload).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let index = client
                .repository_index(RepositoryIndexRequest::default())
                .await
                .unwrap();
            let big = index
                .into_inner()
                .models
                .into_iter()
                .find(|m| m.name == "big")
                .unwrap();
            if (big.state.as_str(), big.reason.as_str()) == ("UNAVAILABLE", "unloaded") {
                break;
            }
            assert!(Instant::now() < deadline, "big was not unloaded: {big:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let unloaded = server.rss_kib();
        eprintln!(
            "cycle {cycle}: VmRSS before load {:.1} MiB, after load {:.1} MiB, after unload {:.1} MiB",
            mib(before),
            mib(loaded),
            mib(unloaded)
        );
        figures.push((before, loaded, unloaded));
    }
    let (first_before, ..) = figures[0];
    for &(before, loaded, unloaded) in &figures {
        let grown = loaded.saturating_sub(before);
        assert!(
            grown > 100 * 1024,
            "two 64 MiB sessions should show: grew {grown} KiB"
        );
        let kept = unloaded.saturating_sub(before);
        assert!(kept < grown / 4, "unload kept {kept} KiB of {grown} KiB");
    }
    let (.., last_unloaded) = figures[figures.len() - 1];
    assert!(
        last_unloaded < first_before + 32 * 1024,
        "memory grows across load/unload cycles: {figures:?}"
    );
}

#[tokio::test]
async fn listeners_answer_while_models_load() {
    let repo = TempRepo::new("early");
    repo.write("big/config.pbtxt", add_bias_config("big", BIG, 4));
    repo.write("big/1/model.onnx", add_bias_model(BIG, 0.5));
    let args = ["--model-control-mode", "explicit", "--load-model", "big"];
    let server = repo.serve(&args, false);
    let live = get(&server.http_address, "/v2/health/live").await;
    let ready = get(&server.http_address, "/v2/health/ready").await;
    assert_eq!(live.status, 200, "live at once");
    assert_eq!(
        ready.status, 400,
        "not ready while four 64 MiB sessions load"
    );
    let mut client = server.client().await;
    let index = client
        .repository_index(RepositoryIndexRequest::default())
        .await
        .unwrap();
    assert!(index.into_inner().models.iter().all(|m| m.state != "READY"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client
        .server_ready(ServerReadyRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready
    {
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        get(&server.http_address, "/v2/health/ready").await.status,
        200
    );
}
