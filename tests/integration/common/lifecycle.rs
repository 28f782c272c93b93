//! Helpers for the lifecycle tests: a two-model repository, the repository API over gRPC, the
//! index as rows, and add-bias inference on both protocols.

use super::http_client::post;
use super::onnx::{add_bias_config, add_bias_model};
use super::{fp32_bytes, fp32_values, Server, TempRepo};
use kiln::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::proto::inference::model_repository_parameter::ParameterChoice;
use kiln::proto::inference::{
    model_infer_request::InferInputTensor, ModelInferRequest, ModelRepositoryParameter,
    RepositoryIndexRequest, RepositoryModelLoadRequest, RepositoryModelUnloadRequest,
    ServerReadyRequest,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub type Client = GrpcInferenceServiceClient<Channel>;

/// A repository with `alpha` (Y = X + 1) and `beta` (Y = X + 2), FP32 [4], one instance each.
pub fn two_models() -> TempRepo {
    let repo = TempRepo::new("lifecycle");
    for (name, bias) in [("alpha", 1.0), ("beta", 2.0)] {
        repo.write(&format!("{name}/config.pbtxt"), add_bias_config(name, 4, 1));
        repo.write(&format!("{name}/1/model.onnx"), add_bias_model(4, bias));
    }
    repo
}

pub fn explicit(repo: &TempRepo, extra: &[&str]) -> Server {
    let mut args = vec!["--model-control-mode", "explicit"];
    args.extend_from_slice(extra);
    repo.serve(&args, true)
}

pub fn param(choice: ParameterChoice) -> ModelRepositoryParameter {
    ModelRepositoryParameter {
        parameter_choice: Some(choice),
    }
}

pub async fn grpc_load(
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

pub async fn grpc_unload(client: &mut Client, name: &str) -> Result<(), tonic::Status> {
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
pub async fn index(client: &mut Client) -> Vec<(String, String, String, String)> {
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

pub fn row(
    name: &str,
    version: &str,
    state: &str,
    reason: &str,
) -> (String, String, String, String) {
    (name.into(), version.into(), state.into(), reason.into())
}

/// An inference request for an add-bias model: `X` is `x`, FP32 `[x.len()]`.
pub fn add_bias_request(name: &str, version: &str, x: &[f32]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: name.into(),
        model_version: version.into(),
        inputs: vec![InferInputTensor {
            name: "X".into(),
            datatype: "FP32".into(),
            shape: vec![x.len() as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![fp32_bytes(x)],
        ..Default::default()
    }
}

/// Infers `Y = X + bias` for X = [1, 2, 3, 4] over gRPC and returns Y.
pub async fn grpc_infer(client: &mut Client, name: &str) -> Result<Vec<f32>, tonic::Status> {
    let request = add_bias_request(name, "", &[1.0, 2.0, 3.0, 4.0]);
    let response = client.model_infer(request).await?.into_inner();
    Ok(fp32_values(&response.raw_output_contents[0]))
}

pub async fn rest_infer(address: &str, name: &str) -> (u16, Value) {
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

pub async fn ready(client: &mut Client) -> bool {
    client
        .server_ready(ServerReadyRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready
}

/// Polls `check` every 50 ms until it holds, for up to 30 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
