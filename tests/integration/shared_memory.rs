//! System shared memory under churn, through the real binary: clients infer through regions
//! while another registers and unregisters the region they use. Every request either answers
//! with the right data or fails with Triton's "Unable to find shared memory region"; the server
//! stays up, and once everything is unregistered it holds no descriptor of the object.
//! (Triton's own clients drive the happy paths in conformance/test_shared_memory.py.)

use crate::common::{fp32_bytes, fp32_values, Server};
use kiln::proto::inference::infer_parameter::ParameterChoice;
use kiln::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use kiln::proto::inference::{
    InferParameter, ModelInferRequest, SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryUnregisterRequest,
};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// A POSIX shared-memory object, as a client makes it (on Linux, `shm_open("/k")` is the file
/// `/dev/shm/k`); removed on drop.
struct Object {
    key: String,
    file: File,
}

impl Object {
    fn new(size: u64) -> Object {
        let key = format!("/kiln-it-{}", std::process::id());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(format!("/dev/shm{key}"))
            .expect("/dev/shm is writable");
        file.set_len(size).unwrap();
        Object { key, file }
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/dev/shm{}", self.key));
    }
}

fn shm_parameters(region: &str, offset: i64) -> HashMap<String, InferParameter> {
    let param = |choice| InferParameter {
        parameter_choice: Some(choice),
    };
    HashMap::from([
        (
            "shared_memory_region".to_string(),
            param(ParameterChoice::StringParam(region.into())),
        ),
        (
            "shared_memory_byte_size".to_string(),
            param(ParameterChoice::Int64Param(64)),
        ),
        (
            "shared_memory_offset".to_string(),
            param(ParameterChoice::Int64Param(offset)),
        ),
    ])
}

/// add_sub with INPUT0 from `region` at 0, INPUT1 inline (`b`), OUTPUT0 inline.
fn request(region: &str, b: f32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![
            InferInputTensor {
                name: "INPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![1, 16],
                parameters: shm_parameters(region, 0),
                ..Default::default()
            },
            InferInputTensor {
                name: "INPUT1".into(),
                datatype: "FP32".into(),
                shape: vec![1, 16],
                ..Default::default()
            },
        ],
        outputs: vec![InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            ..Default::default()
        }],
        raw_input_contents: vec![fp32_bytes(&[b; 16])],
        ..Default::default()
    }
}

/// How many of the server's descriptors point at the object.
fn descriptors_of(server: &Server, key: &str) -> usize {
    let target = format!("/dev/shm{key}");
    std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .expect("/proc is readable")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|link| link.to_string_lossy().starts_with(&target))
        .count()
}

#[tokio::test]
async fn regions_churn_under_load_without_losing_the_server() {
    let server = Server::start_with(
        &["model_repository", "tests/fixtures/model_repository"],
        &["--allow-client-shm=true"],
    );
    let object = Object::new(4096);
    let input: Vec<f32> = (0..16).map(|i| i as f32).collect();
    object.file.write_all_at(&fp32_bytes(&input), 0).unwrap();

    let mut admin = server.client().await;
    let register = |name: &str| SystemSharedMemoryRegisterRequest {
        name: name.into(),
        key: object.key.clone(),
        offset: 0,
        byte_size: 4096,
    };
    admin
        .system_shared_memory_register(register("steady"))
        .await
        .unwrap();

    let mut clients = Vec::new();
    for worker in 0..8 {
        let mut client = server.client().await;
        let input = input.clone();
        clients.push(tokio::spawn(async move {
            let (mut answered, mut missing) = (0, 0);
            for round in 0..40 {
                // Odd workers read the region that comes and goes.
                let region = if worker % 2 == 0 { "steady" } else { "churn" };
                let b = (worker * 100 + round) as f32;
                match client.model_infer(request(region, b)).await {
                    Ok(response) => {
                        let sum = fp32_values(&response.into_inner().raw_output_contents[0]);
                        let expected: Vec<f32> = input.iter().map(|a| a + b).collect();
                        assert_eq!(sum, expected, "worker {worker} round {round}");
                        answered += 1;
                    }
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
                        assert_eq!(
                            status.message(),
                            "Unable to find shared memory region: 'churn'"
                        );
                        assert_eq!(region, "churn");
                        missing += 1;
                    }
                }
            }
            (answered, missing)
        }));
    }
    for _ in 0..100 {
        // Already registered or not: either answer is fine while the others infer.
        let _ = admin.system_shared_memory_register(register("churn")).await;
        admin
            .system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest {
                name: "churn".into(),
            })
            .await
            .unwrap();
    }
    let mut steady = 0;
    for (worker, joined) in futures_util::future::join_all(clients)
        .await
        .into_iter()
        .enumerate()
    {
        let (answered, missing) = joined.expect("worker finished");
        assert_eq!(answered + missing, 40);
        if worker % 2 == 0 {
            steady += answered;
        }
    }
    assert_eq!(steady, 4 * 40, "the steady region never went away");

    assert!(descriptors_of(&server, &object.key) >= 1);
    admin
        .system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest::default())
        .await
        .unwrap();
    assert_eq!(descriptors_of(&server, &object.key), 0);
    assert!(admin
        .model_infer(crate::common::add_sub_row(&input, &[1.0; 16]))
        .await
        .is_ok());
}
