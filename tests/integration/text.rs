//! Text models through the real binary: the token tensors kiln builds match the Python
//! `tokenizers` package (tests/fixtures/text_expected.json), batches of strings form under
//! concurrency and are padded and split back, the tiny BERT's embeddings match the numpy
//! reference, and bad input or a bad configuration gets a clear error.

use crate::common::lifecycle::index;
use crate::common::{fp32_values, model_config, repo_path, Server, TempRepo};
use kiln::core::tensor::frame_bytes;
use kiln::proto::inference::{
    model_infer_request::InferInputTensor, ModelInferRequest, ModelInferResponse,
    ModelMetadataRequest, ModelStatisticsRequest,
};
use serde_json::Value;
use tonic::Code;

fn fixtures() -> Server {
    Server::start_with(&["tests/fixtures/model_repository"], &[])
}

fn expected() -> Value {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/text_expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn rows(value: &Value) -> Vec<Vec<i64>> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect()
        })
        .collect()
}

/// A request with one BYTES input of `[texts.len(), 1]`.
fn text_request(model: &str, input: &str, texts: &[&[u8]]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: input.into(),
            datatype: "BYTES".into(),
            shape: vec![texts.len() as i64, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![frame_bytes(texts)],
        ..Default::default()
    }
}

fn int64_rows(bytes: &[u8], width: usize) -> Vec<Vec<i64>> {
    let values: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    values.chunks(width).map(<[i64]>::to_vec).collect()
}

fn int32_rows(bytes: &[u8], width: usize) -> Vec<Vec<i64>> {
    let values: Vec<i64> = bytes
        .chunks_exact(4)
        .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())))
        .collect();
    values.chunks(width).map(<[i64]>::to_vec).collect()
}

/// ids, mask and types of a token-echo response (ids and types INT64, mask INT32).
fn tokens(response: &ModelInferResponse) -> [Vec<Vec<i64>>; 3] {
    let width = response.outputs[0].shape[1] as usize;
    [
        int64_rows(&response.raw_output_contents[0], width),
        int32_rows(&response.raw_output_contents[1], width),
        int64_rows(&response.raw_output_contents[2], width),
    ]
}

#[tokio::test]
async fn clients_see_a_text_input_and_the_graph_gets_python_identical_tokens() {
    let server = fixtures();
    let mut client = server.client().await;
    let metadata = client
        .model_metadata(ModelMetadataRequest {
            name: "text_tokens".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let inputs: Vec<_> = metadata
        .inputs
        .iter()
        .map(|t| (t.name.as_str(), t.datatype.as_str(), t.shape.clone()))
        .collect();
    assert_eq!(inputs, [("TEXT", "BYTES", vec![-1, 1])]);
    let config = model_config(&mut client, "text_tokens").await;
    assert_eq!(
        config.input.len(),
        1,
        "auto-complete hides the token inputs"
    );
    assert_eq!(
        (
            config.input[0].name.as_str(),
            config.input[0].dims.as_slice()
        ),
        ("TEXT", &[1][..])
    );

    let case = expected()["tokenizer"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "text_tokens")
        .cloned()
        .unwrap();
    let texts = strings(&case["texts"]);
    let texts: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
    let response = client
        .model_infer(text_request("text_tokens", "TEXT", &texts))
        .await
        .unwrap()
        .into_inner();
    let [ids, mask, types] = tokens(&response);
    assert_eq!(ids, rows(&case["ids"]));
    assert_eq!(mask, rows(&case["attention_mask"]));
    assert_eq!(types, rows(&case["type_ids"]));
}

#[tokio::test]
async fn concurrent_text_requests_form_one_batch_padded_to_its_longest_text() {
    let server = fixtures();
    let client = server.client().await;
    let case = expected()["tokenizer"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "text_tokens")
        .cloned()
        .unwrap();
    let texts = strings(&case["texts"]);
    let want_ids = rows(&case["ids"]);
    let want_masks = rows(&case["attention_mask"]);
    // Four single-text requests reach text_batcher's preferred batch of 4 and run as one batch.
    let chosen = [0usize, 1, 2, 5];
    let tasks: Vec<_> = chosen
        .iter()
        .map(|&i| {
            let mut client = client.clone();
            let text = texts[i].clone();
            tokio::spawn(async move {
                client
                    .model_infer(text_request("text_batcher", "TEXT", &[text.as_bytes()]))
                    .await
            })
        })
        .collect();
    // The longest of the four (text 1) is 12 tokens: every answer is padded to it.
    for (task, &i) in tasks.into_iter().zip(&chosen) {
        let response = task.await.unwrap().unwrap().into_inner();
        assert_eq!(response.outputs[0].shape, vec![1, 12]);
        let [ids, mask, _] = tokens(&response);
        assert_eq!(ids, vec![want_ids[i].clone()], "text {i}");
        assert_eq!(mask, vec![want_masks[i].clone()], "text {i}");
    }
    let stats = client
        .clone()
        .model_statistics(ModelStatisticsRequest {
            name: "text_batcher".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .model_stats
        .remove(0);
    assert_eq!((stats.inference_count, stats.execution_count), (4, 1));
    assert_eq!(stats.batch_stats[0].batch_size, 4);
}

#[tokio::test]
async fn tiny_bert_embeddings_match_the_numpy_reference() {
    let server = fixtures();
    let mut client = server.client().await;
    let expected = &expected()["tiny_embed"];
    let texts = strings(&expected["texts"]);
    let texts: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
    let response = client
        .model_infer(text_request("tiny_embed", "text", &texts))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.outputs[0].shape, vec![texts.len() as i64, 16]);
    let got = fp32_values(&response.raw_output_contents[0]);
    for (row, want) in got
        .chunks(16)
        .zip(expected["embedding"].as_array().unwrap())
    {
        let want: Vec<f64> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let dot: f64 = row.iter().zip(&want).map(|(&a, b)| f64::from(a) * b).sum();
        let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        let cosine =
            dot / norm(&mut row.iter().map(|&x| f64::from(x))) / norm(&mut want.iter().copied());
        assert!(cosine >= 0.999, "cosine {cosine}");
    }
}

#[tokio::test]
async fn bad_text_input_gets_a_clear_error() {
    let server = fixtures();
    let mut client = server.client().await;
    let status = client
        .model_infer(text_request("tiny_embed", "text", &[b"fine", b"\xc3\x28"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains(
            "element 1 of inference input 'text' for model 'tiny_embed' is not valid UTF-8 text"
        ),
        "{}",
        status.message()
    );
    let mut wrong_type = text_request("tiny_embed", "text", &[b"x"]);
    wrong_type.inputs[0].datatype = "INT64".into();
    wrong_type.raw_input_contents[0] = vec![0u8; 8].into();
    let status = client.model_infer(wrong_type).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status
        .message()
        .contains("data-type is 'INT64', but model 'tiny_embed' expects 'BYTES'"));
    let mut flat = text_request("tiny_embed", "text", &[b"a", b"b"]);
    flat.inputs[0].shape = vec![2];
    let status = client.model_infer(flat).await.unwrap_err();
    assert!(
        status.message().contains("Expected [-1,1], got [2]"),
        "{}",
        status.message()
    );
}

const ECHO_PARAMS: &str = r#"parameters { key: "tokenizer_text_input" value: { string_value: "text" } }
"#;

/// A temporary repository of token-echo models (the text_tokens fixture's graph and tokenizer),
/// one per `(name, config)`.
fn echo_repo(models: &[(&str, String)]) -> TempRepo {
    let repo = TempRepo::new("text");
    let graph = std::fs::read(repo_path(
        "tests/fixtures/model_repository/text_tokens/1/model.onnx",
    ))
    .unwrap();
    let tokenizer = std::fs::read(repo_path(
        "tests/fixtures/model_repository/text_tokens/tokenizer.json",
    ))
    .unwrap();
    for (name, config) in models {
        repo.write(&format!("{name}/config.pbtxt"), config);
        repo.write(&format!("{name}/1/model.onnx"), &graph);
        if *name != "no_tokenizer" {
            repo.write(&format!("{name}/tokenizer.json"), &tokenizer);
        }
    }
    repo
}

#[tokio::test]
async fn configuration_mistakes_fail_the_load_with_the_reason() {
    let param = |key: &str, value: &str| {
        format!("parameters {{ key: \"{key}\" value: {{ string_value: \"{value}\" }} }}\n")
    };
    let listed =
        "max_batch_size: 4\ninput [ { name: \"input_ids\" data_type: TYPE_INT64 dims: [ -1 ] } ]\n\
                  output [ { name: \"ids\" data_type: TYPE_INT64 dims: [ -1 ] } ]\n";
    let flat_text =
        "max_batch_size: 4\ninput [ { name: \"text\" data_type: TYPE_STRING dims: [ -1 ] } ]\n\
                     output [ { name: \"ids\" data_type: TYPE_INT64 dims: [ -1 ] } ]\n";
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "typo",
            ECHO_PARAMS.to_string() + &param("tokenizer_max_len", "8"),
            "unknown parameter 'tokenizer_max_len'",
        ),
        (
            "orphan",
            param("tokenizer_max_length", "8"),
            "needs 'tokenizer_text_input'",
        ),
        (
            "no_tokenizer",
            ECHO_PARAMS.to_string(),
            "the model directory has no tokenizer.json",
        ),
        (
            "bad_flag",
            ECHO_PARAMS.to_string() + &param("tokenizer_truncation", "yes"),
            "must be \"true\" or \"false\", got 'yes'",
        ),
        (
            "bad_length",
            ECHO_PARAMS.to_string() + &param("tokenizer_max_length", "0"),
            "must be an integer from 1",
        ),
        (
            "bad_padding",
            ECHO_PARAMS.to_string() + &param("tokenizer_padding", "left"),
            "must be \"longest\" or \"max_length\"",
        ),
        (
            "no_mask",
            ECHO_PARAMS.to_string() + &param("tokenizer_attention_mask", "mask"),
            "feeds 'mask', which is not a graph input",
        ),
        (
            "listed",
            ECHO_PARAMS.to_string() + listed,
            "input 'input_ids' is fed by the tokenizer from 'text'",
        ),
        (
            "flat_text",
            ECHO_PARAMS.to_string() + flat_text,
            "must be TYPE_STRING with dims: [ 1 ]",
        ),
    ];
    let models: Vec<(&str, String)> = cases
        .iter()
        .map(|(name, config, _)| (*name, format!("backend: \"onnxruntime\"\n{config}")))
        .collect();
    let repo = echo_repo(&models);
    let server = repo.serve(&[], true);
    let mut client = server.client().await;
    let rows = index(&mut client).await;
    for (name, _, reason) in &cases {
        let row = rows
            .iter()
            .find(|r| r.0 == *name)
            .unwrap_or_else(|| panic!("{name} listed"));
        assert_eq!(row.2, "UNAVAILABLE", "{name}: {row:?}");
        assert!(row.3.contains(reason), "{name}: {}", row.3);
    }
}

#[tokio::test]
async fn without_truncation_a_long_text_fails_alone() {
    let config = format!(
        "backend: \"onnxruntime\"\nmax_batch_size: 8\ndynamic_batching {{ max_queue_delay_microseconds: 200000 }}\n\
         instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{ECHO_PARAMS}\
         parameters {{ key: \"tokenizer_truncation\" value: {{ string_value: \"false\" }} }}\n\
         parameters {{ key: \"tokenizer_max_length\" value: {{ string_value: \"5\" }} }}\n"
    );
    let repo = echo_repo(&[("strict", config)]);
    let server = repo.serve(&[], true);
    let client = server.client().await;
    let texts: [&[u8]; 3] = [b"hello world", b"the quick brown fox jumps", b"a"];
    let tasks: Vec<_> = texts
        .iter()
        .map(|text| {
            let mut client = client.clone();
            let request = text_request("strict", "text", &[text]);
            tokio::spawn(async move { client.model_infer(request).await })
        })
        .collect();
    let results: Vec<_> = futures_util::future::join_all(tasks).await;
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        tokens(results[0].as_ref().unwrap().get_ref())[0][0],
        [2, 21, 22, 3]
    );
    let status = results[1].as_ref().unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("element 0 of input 'text' has 8 tokens, more than the maximum of 5"),
        "{}",
        status.message()
    );
    assert_eq!(
        tokens(results[2].as_ref().unwrap().get_ref())[0][0],
        [2, 9, 3]
    );
}
