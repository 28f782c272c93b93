//! Streamed generation against the real binary: decoupled responses on `ModelStreamInfer` with
//! the generated tonic client, Triton's refusal of plain inference, and the continuous-batching
//! switch (a copy of the bundled `tiny_decoder` with `continuous_batching: "false"` runs every
//! step with one sequence; the bundled one batches concurrent sequences together).

use crate::common::http_client::{get, post};
use crate::common::{repo_path, Server, TempRepo};
use futures_util::StreamExt;
use kiln::proto::inference::{
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor, InferParameter,
    ModelInferRequest, ModelStreamInferResponse,
};
use serde_json::{json, Value};
use std::collections::HashMap;

/// A request for `tiny_decoder` with `text_input` and `max_tokens` as tensors.
fn request(id: &str, prompt: &str, max_tokens: i32) -> ModelInferRequest {
    let text = kiln::core::tensor::frame_bytes([prompt]);
    ModelInferRequest {
        model_name: "tiny_decoder".into(),
        id: id.into(),
        inputs: vec![
            InferInputTensor {
                name: "text_input".into(),
                datatype: "BYTES".into(),
                shape: vec![1],
                ..Default::default()
            },
            InferInputTensor {
                name: "max_tokens".into(),
                datatype: "INT32".into(),
                shape: vec![1],
                ..Default::default()
            },
        ],
        raw_input_contents: vec![text, max_tokens.to_le_bytes().to_vec().into()],
        ..Default::default()
    }
}

fn is_final(response: &ModelStreamInferResponse) -> bool {
    let parameter = response
        .infer_response
        .as_ref()
        .and_then(|r| r.parameters.get("triton_final_response"));
    matches!(
        parameter,
        Some(InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(true))
        })
    )
}

/// The text of a one-element BYTES `text_output`.
fn text(response: &ModelStreamInferResponse) -> String {
    let raw = &response
        .infer_response
        .as_ref()
        .unwrap()
        .raw_output_contents[0];
    String::from_utf8(raw[4..].to_vec()).unwrap()
}

async fn generate(http: &str, prompt: &str, max_tokens: usize) -> String {
    let body =
        json!({"text_input": prompt, "max_tokens": max_tokens, "exclude_input_in_output": true});
    let reply = post(
        http,
        "/v2/models/tiny_decoder/generate",
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["text_output"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn decoupled_stream_answers_token_by_token_and_interleaves_requests() {
    let server = Server::start_with(&["model_repository"], &[]);
    let mut client = server.client().await;
    let prompts = [("a", "The potter", 12), ("b", "Wood kilns", 7)];
    let outbound = futures_util::stream::iter(
        prompts
            .iter()
            .map(|(id, prompt, n)| request(id, prompt, *n))
            .collect::<Vec<_>>(),
    );
    let mut inbound = client
        .model_stream_infer(outbound)
        .await
        .unwrap()
        .into_inner();
    let mut texts: HashMap<String, Vec<String>> = HashMap::new();
    let mut finished = 0;
    while finished < prompts.len() {
        let response = inbound.next().await.expect("a response").expect("no error");
        assert!(response.error_message.is_empty());
        let id = response.infer_response.as_ref().unwrap().id.clone();
        texts.entry(id).or_default().push(text(&response));
        finished += usize::from(is_final(&response));
    }
    for (id, prompt, n) in prompts {
        let pieces = &texts[id];
        assert_eq!(pieces.len(), n as usize, "one response per token for {id}");
        assert_eq!(
            pieces.concat(),
            generate(&server.http_address, prompt, n as usize).await
        );
    }
    assert!(
        inbound.next().await.is_none(),
        "the stream ends once every request is answered"
    );

    let refused = client
        .model_infer(request("x", "The potter", 2))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
    assert_eq!(
        refused.message(),
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    );
}

/// Largest batch any step of `tiny_decoder` ran, from the statistics.
async fn largest_batch(http: &str) -> u64 {
    let stats: Value = get(http, "/v2/models/tiny_decoder/stats").await.json();
    stats["model_stats"][0]["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch_size"].as_u64().unwrap())
        .max()
        .unwrap_or(0)
}

async fn concurrent(http: &str, count: usize) -> Vec<String> {
    let jobs: Vec<_> = (0..count)
        .map(|_| {
            let http = http.to_string();
            tokio::spawn(async move { generate(&http, "The potter", 24).await })
        })
        .collect();
    let mut texts = Vec::new();
    for job in jobs {
        texts.push(job.await.unwrap());
    }
    texts
}

#[tokio::test]
async fn continuous_batching_can_be_switched_off() {
    let repo = TempRepo::new("no-batching");
    let source = repo_path("model_repository/tiny_decoder");
    let config = std::fs::read_to_string(source.join("config.pbtxt")).unwrap();
    repo.write(
        "tiny_decoder/config.pbtxt",
        config.replace(
            r#"key: "continuous_batching" value: { string_value: "true" }"#,
            r#"key: "continuous_batching" value: { string_value: "false" }"#,
        ),
    );
    for file in ["tokenizer.json", "1/model.onnx"] {
        repo.write(
            &format!("tiny_decoder/{file}"),
            std::fs::read(source.join(file)).unwrap(),
        );
    }
    let single = repo.serve(&[], true);
    let texts = concurrent(&single.http_address, 6).await;
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:?}");
    assert_eq!(largest_batch(&single.http_address).await, 1);

    let batched = Server::start_with(&["model_repository"], &[]);
    assert_eq!(concurrent(&batched.http_address, 6).await, texts);
    assert!(largest_batch(&batched.http_address).await > 1);
}
