//! ONNX Runtime settings from config.pbtxt, under the keys of Triton's ONNX Runtime backend,
//! through the real binary: thread counts show as the sessions' own named threads (sessions
//! without one share the process's pool), every other
//! setting still answers correctly, and a value that does not parse fails that model's load with
//! a message naming it while the other models serve.

use crate::common::lifecycle::{grpc_infer, index, rest_infer, row};
use crate::common::onnx::{add_bias_config, add_bias_model};
use crate::common::TempRepo;
use std::collections::BTreeMap;

/// An add-bias model (`Y = X + 1`, FP32 `[4]`) with `instances` CPU instances and `extra`
/// appended to its config.
fn write_model(repo: &TempRepo, name: &str, instances: u32, extra: &str) {
    repo.write(
        &format!("{name}/config.pbtxt"),
        format!("{}{extra}", add_bias_config(name, 4, instances)),
    );
    repo.write(&format!("{name}/1/model.onnx"), add_bias_model(4, 1.0));
}

fn parameter(key: &str, value: &str) -> String {
    format!("parameters {{ key: \"{key}\" value: {{ string_value: \"{value}\" }} }}\n")
}

#[tokio::test]
async fn config_settings_reach_onnx_runtime() {
    let repo = TempRepo::new("tuning");
    // 3 threads per operator and 2 for independent operators: ONNX Runtime starts 2 + 1
    // threads of its own (the calling thread is one of each pool's).
    write_model(
        &repo,
        "tuned",
        1,
        &[
            parameter("intra_op_thread_count", "3"),
            parameter("execution_mode", "1"),
            parameter("inter_op_thread_count", "2"),
            parameter("enable_mem_arena", "0"),
            parameter("enable_mem_pattern", "false"),
            parameter("session.use_device_allocator_for_initializers", "1"),
            "optimization { graph { level: 2 } }\n".to_string(),
        ]
        .concat(),
    );
    // Shrinks the CPU arena after every run, at basic graph rewrites, on the shared pool.
    write_model(
        &repo,
        "shrink",
        2,
        &[
            parameter("memory.enable_memory_arena_shrinkage", "cpu:0"),
            parameter("intra_op_thread_count", "0"),
            "optimization { graph { level: -1 } }\n".to_string(),
        ]
        .concat(),
    );
    write_model(&repo, "plain", 2, "");
    write_model(&repo, "bad_mode", 1, &parameter("execution_mode", "2"));
    write_model(
        &repo,
        "bad_arena",
        1,
        &parameter("memory.enable_memory_arena_shrinkage", "tpu:0"),
    );
    let server = repo.serve(&[], true);
    let mut client = server.client().await;

    for name in ["tuned", "shrink", "plain"] {
        assert_eq!(
            grpc_infer(&mut client, name).await.unwrap(),
            [2.0, 3.0, 4.0, 5.0],
            "{name}"
        );
        let (status, body) = rest_infer(&server.http_address, name).await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(
            body["outputs"][0]["data"],
            serde_json::json!([2.0, 3.0, 4.0, 5.0])
        );
    }

    let mut pools: BTreeMap<String, usize> = BTreeMap::new();
    for (name, _) in server.threads() {
        if name.starts_with("ort-") {
            *pools.entry(name).or_default() += 1;
        }
    }
    // Without a count the sessions share the process's pool, one thread per core (the caller
    // is one of them), and start no thread of their own.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut expected = BTreeMap::from([("ort-tuned-1-0".to_string(), 2 + 1)]);
    if cpus > 1 {
        expected.insert("ort-shared".to_string(), cpus - 1);
    }
    assert_eq!(pools, expected);

    let rows = index(&mut client).await;
    for (name, reason) in [
        (
            "bad_mode",
            "parameter 'execution_mode' of model 'bad_mode': expected 0 (sequential) or 1 \
             (parallel), got '2'",
        ),
        (
            "bad_arena",
            "parameter 'memory.enable_memory_arena_shrinkage' of model 'bad_arena': expected \
             arenas such as 'cpu:0' or 'cpu:0;gpu:0', got 'tpu:0'",
        ),
    ] {
        assert!(
            rows.contains(&row(name, "", "UNAVAILABLE", reason)),
            "{name}: {rows:?}"
        );
    }
}
