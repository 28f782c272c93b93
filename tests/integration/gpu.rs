//! KIND_GPU instance groups on a machine where no GPU is usable (CI's machines; in a build
//! without the `cuda` feature no GPU ever is): the model's load fails with a reason naming what
//! is missing while the other models serve, or, with `--gpu-fallback-to-cpu`, it serves on CPU
//! and its index entry says why. `bench/gpu_check.sh` checks the GPU path on a GPU machine.

use crate::common::http_client::get;
use crate::common::lifecycle::{grpc_infer, index, ready, row};
use crate::common::onnx::{add_bias_config, add_bias_model};
use crate::common::TempRepo;
use serde_json::json;

/// `cpu_model` (Y = X + 1, one CPU instance) beside `gpu_model` (Y = X + 2) asking for two
/// instances on GPU 0 with CUDA options.
fn repository() -> TempRepo {
    let repo = TempRepo::new("gpu");
    repo.write("cpu_model/config.pbtxt", add_bias_config("cpu_model", 4, 1));
    repo.write("cpu_model/1/model.onnx", add_bias_model(4, 1.0));
    let gpu_config = add_bias_config("gpu_model", 4, 1).replace(
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
        r#"instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
        parameters { key: "gpu_mem_limit" value: { string_value: "1073741824" } }
        optimization { execution_accelerators { gpu_execution_accelerator [ {
          name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" } } ] } }"#,
    );
    assert!(gpu_config.contains("KIND_GPU"));
    repo.write("gpu_model/config.pbtxt", gpu_config);
    repo.write("gpu_model/1/model.onnx", add_bias_model(4, 2.0));
    repo
}

/// What a load of `gpu_model` reports here: the group, then why no GPU is usable.
fn assert_names_what_is_missing(reason: &str) {
    let prefix = "KIND_GPU requested by instance group 'gpu_model_0' of model 'gpu_model', but ";
    assert!(reason.starts_with(prefix), "{reason}");
    let why = &reason[prefix.len()..];
    if cfg!(feature = "cuda") {
        // This test runs where no GPU is usable; the probe names the first thing missing.
        let missing = [
            "libcuda.so.1 not found (no NVIDIA driver)",
            "cuInit failed",
            "the NVIDIA driver shows no CUDA device",
            "CUDA provider library libonnxruntime_providers_cuda.so not found in ",
            "CUDA runtime libraries ",
        ];
        assert!(missing.iter().any(|m| why.starts_with(m)), "{why}");
    } else {
        assert_eq!(
            why,
            "kiln was built without the `cuda` feature (build it with `cargo build --release \
             --features cuda`)"
        );
    }
}

#[tokio::test]
async fn kind_gpu_without_a_usable_gpu_fails_that_model_only() {
    let repo = repository();
    let server = repo.serve(&[], true);
    let mut client = server.client().await;
    assert_eq!(
        grpc_infer(&mut client, "cpu_model").await.unwrap(),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    let rows = index(&mut client).await;
    assert_eq!(rows[0], row("cpu_model", "1", "READY", ""));
    let (name, version, state, reason) = &rows[1];
    // Placement fails before any version is built: one versionless entry, as config errors.
    assert_eq!(
        (name.as_str(), version.as_str(), state.as_str()),
        ("gpu_model", "", "UNAVAILABLE")
    );
    assert_names_what_is_missing(reason);
    // Never a silent CPU run: the model is not there, and the server is not ready.
    let missing = grpc_infer(&mut client, "gpu_model").await.unwrap_err();
    assert_eq!(
        (missing.code(), missing.message()),
        (
            tonic::Code::NotFound,
            "Request for unknown model: 'gpu_model' has no available versions"
        )
    );
    assert!(!ready(&mut client).await);
}

#[tokio::test]
async fn the_fallback_flag_serves_kind_gpu_on_cpu_and_the_index_says_so() {
    let repo = repository();
    let server = repo.serve(&["--gpu-fallback-to-cpu"], true);
    let mut client = server.client().await;
    assert_eq!(
        grpc_infer(&mut client, "gpu_model").await.unwrap(),
        vec![3.0, 4.0, 5.0, 6.0]
    );
    assert!(ready(&mut client).await);
    let rows = index(&mut client).await;
    assert_eq!(rows[0], row("cpu_model", "1", "READY", ""));
    let (name, version, state, reason) = &rows[1];
    assert_eq!(
        (name.as_str(), version.as_str(), state.as_str()),
        ("gpu_model", "1", "READY")
    );
    let why = reason
        .strip_prefix("running on CPU (--gpu-fallback-to-cpu): ")
        .unwrap_or_else(|| panic!("{reason}"));
    assert_names_what_is_missing(why);
    // The effective config shows where the instances run: two on CPU.
    let config = get(&server.http_address, "/v2/models/gpu_model/config")
        .await
        .json();
    let group = &config["instance_group"][0];
    assert_eq!(
        (
            &group["name"],
            &group["kind"],
            &group["count"],
            &group["gpus"]
        ),
        (
            &json!("gpu_model_0"),
            &json!("KIND_CPU"),
            &json!(2),
            &json!([])
        )
    );
    // CPU instances carry no gpu_uuid label; a machine without NVML has no GPU gauges either.
    let metrics = server.metrics_text();
    assert!(
        metrics.contains("nv_inference_count{model=\"gpu_model\",version=\"1\"} 1"),
        "{metrics}"
    );
    // SAFETY: loading NVML runs only its initialisers.
    let nvml = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.is_ok();
    assert_eq!(metrics.contains("gpu_uuid"), nvml, "{metrics}");
    assert_eq!(metrics.contains("nv_gpu_utilization"), nvml, "{metrics}");
}
