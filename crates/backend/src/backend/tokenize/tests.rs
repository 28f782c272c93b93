//! Tokenizer mapping against ids the Python `tokenizers` package produced for the same
//! `tokenizer.json` (tests/fixtures/text_expected.json, written by
//! model_repository/generate_text.py), and the binding of token tensors to graph inputs.
use super::*;
use crate::core::tensor::frame_bytes;
use std::path::PathBuf;

fn fixture(relative: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(relative)
}

fn tokenizer_path() -> PathBuf {
    fixture("tests/fixtures/model_repository/text_tokens/tokenizer.json")
}

fn tokenizer(options: &TokenizerOptions) -> Arc<TextTokenizer> {
    Arc::new(TextTokenizer::load(&tokenizer_path(), options).unwrap())
}

fn expected_cases() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(fixture("tests/fixtures/text_expected.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["tokenizer"].as_array().unwrap().clone()
}

fn flat(rows: &serde_json::Value) -> Vec<i64> {
    rows.as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()))
        .collect()
}

#[test]
fn token_rows_match_the_python_tokenizers_package() {
    let cases = expected_cases();
    assert!(cases.len() >= 4);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let options = TokenizerOptions {
            max_length: Some(case["max_length"].as_u64().unwrap() as usize),
            truncate: true,
            padding: match case["padding"].as_str().unwrap() {
                "max_length" => Padding::MaxLength,
                _ => Padding::Longest,
            },
            add_special_tokens: case["add_special_tokens"].as_bool().unwrap(),
        };
        let texts: Vec<&str> = case["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        let rows = tokenizer(&options).encode("TEXT", &texts).unwrap();
        assert_eq!(rows.rows, texts.len(), "{name}");
        assert_eq!(rows.ids, flat(&case["ids"]), "{name}: ids");
        assert_eq!(
            rows.attention_mask,
            flat(&case["attention_mask"]),
            "{name}: mask"
        );
        assert_eq!(rows.type_ids, flat(&case["type_ids"]), "{name}: types");
        assert_eq!(rows.ids.len(), rows.rows * rows.length, "{name}");
        // The count is the tokens the model sees: every row's mask, padding left out.
        let unpadded: i64 = rows.attention_mask.iter().sum();
        assert_eq!(
            tokenizer(&options).count("TEXT", &texts).unwrap() as i64,
            unpadded,
            "{name}: count"
        );
    }
}

#[test]
fn without_truncation_a_long_text_is_refused() {
    let options = TokenizerOptions {
        max_length: Some(5),
        truncate: false,
        ..Default::default()
    };
    let tokenizer = tokenizer(&options);
    // [CLS] hello world [SEP]: 4 tokens.
    assert_eq!(tokenizer.encode("t", &["hello world"]).unwrap().length, 4);
    assert_eq!(tokenizer.count("t", &["hello world", "hello"]).unwrap(), 7);
    let error = tokenizer
        .encode("t", &["hello world", "the quick brown fox"])
        .unwrap_err();
    assert!(tokenizer
        .count("t", &["hello world", "the quick brown fox"])
        .is_err());
    assert!(
        matches!(&error, BackendError::Input(m) if m.contains("element 1 of input 't' has 6 tokens, more than the maximum of 5")),
        "{error}"
    );
}

#[test]
fn defaults_and_load_errors() {
    let tokenizer = tokenizer(&TokenizerOptions::default());
    assert_eq!(tokenizer.max_length(), DEFAULT_MAX_LENGTH);
    assert_eq!(tokenizer.encode("t", &[]).unwrap().rows, 0);
    let no_room = TextTokenizer::load(
        &tokenizer_path(),
        &TokenizerOptions {
            max_length: Some(2),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(no_room.to_string().contains("leaves no room"), "{no_room}");
    let missing = TextTokenizer::load(
        &fixture("no/such/tokenizer.json"),
        &TokenizerOptions::default(),
    )
    .unwrap_err();
    assert!(
        missing.to_string().contains("failed to load tokenizer"),
        "{missing}"
    );
}

fn info(name: &str, datatype: DataType, shape: &[i64]) -> TensorInfo {
    TensorInfo {
        name: name.into(),
        datatype: Some(datatype),
        shape: shape.to_vec(),
    }
}

fn spec(options: &TokenizerOptions) -> TextSpec {
    TextSpec {
        text_input: "text".into(),
        input_ids: "input_ids".into(),
        attention_mask: TokenSlot::IfPresent("attention_mask".into()),
        token_type_ids: TokenSlot::IfPresent("token_type_ids".into()),
        tokenizer: tokenizer(options),
    }
}

fn bert_inputs() -> Vec<TensorInfo> {
    vec![
        info("input_ids", DataType::Int64, &[-1, -1]),
        info("extra", DataType::Fp32, &[-1, 3]),
        info("attention_mask", DataType::Int32, &[-1, -1]),
        info("token_type_ids", DataType::Int64, &[-1, -1]),
    ]
}

#[test]
fn clients_see_the_text_input_in_place_of_the_token_inputs() {
    let bound = spec(&TokenizerOptions::default())
        .bind(&bert_inputs())
        .unwrap();
    assert_eq!(
        bound.client_inputs(&bert_inputs()),
        vec![
            info("text", DataType::Bytes, &[-1, 1]),
            info("extra", DataType::Fp32, &[-1, 3]),
        ]
    );
    let fed: Vec<&str> = bound.token_inputs().collect();
    assert_eq!(fed, ["input_ids", "attention_mask", "token_type_ids"]);
    // Optional slots follow the graph.
    let ids_only = [info("input_ids", DataType::Int64, &[-1, -1])];
    let bound = spec(&TokenizerOptions::default()).bind(&ids_only).unwrap();
    assert_eq!(bound.token_inputs().count(), 1);
}

#[test]
fn binding_errors_name_the_input_and_the_fix() {
    let options = TokenizerOptions::default();
    let error = |spec: &TextSpec, inputs: &[TensorInfo]| spec.bind(inputs).unwrap_err().to_string();
    let mut named = spec(&options);
    named.attention_mask = TokenSlot::Named("mask".into());
    assert!(error(&named, &bert_inputs()).contains("feeds 'mask', which is not a graph input"));
    let float_ids = [info("input_ids", DataType::Fp32, &[-1, -1])];
    assert!(error(&spec(&options), &float_ids)
        .contains("FP32, but token tensors must be INT64 or INT32"));
    let rank3 = [info("input_ids", DataType::Int64, &[-1, -1, 2])];
    assert!(error(&spec(&options), &rank3).contains("rank 3"));
    let fixed = [info("input_ids", DataType::Int64, &[-1, 128])];
    assert!(error(&spec(&options), &fixed).contains("set tokenizer_padding to \"max_length\""));
    let padded = TokenizerOptions {
        max_length: Some(128),
        padding: Padding::MaxLength,
        ..Default::default()
    };
    assert!(spec(&padded).bind(&fixed).is_ok());
    let clash = [
        info("input_ids", DataType::Int64, &[-1, -1]),
        info("text", DataType::Bytes, &[-1]),
    ];
    assert!(error(&spec(&options), &clash).contains("has the name of a graph input"));
    let mut twice = spec(&options);
    twice.token_type_ids = TokenSlot::Named("attention_mask".into());
    assert!(error(&twice, &bert_inputs()).contains("named for two token tensors"));
}

fn text_tensor(texts: &[&[u8]]) -> Tensor {
    Tensor::new(
        "text",
        DataType::Bytes,
        vec![texts.len() as i64, 1],
        frame_bytes(texts),
    )
}

/// Echoes its inputs, so tests see what a [`TextModel`] hands the graph.
struct Echo;

impl Backend for Echo {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        Ok(inputs.to_vec())
    }
}

#[test]
fn a_text_model_runs_the_graph_on_token_tensors_of_the_graphs_types() {
    let bound = spec(&TokenizerOptions::default())
        .bind(&bert_inputs())
        .unwrap();
    let mut model = TextModel::new(Arc::new(bound), Box::new(Echo));
    let extra = Tensor::new(
        "extra",
        DataType::Fp32,
        vec![2, 3],
        Bytes::from(vec![0u8; 24]),
    );
    let seen = model
        .run(&[text_tensor(&[b"hello world", b"a"]), extra.clone()])
        .unwrap();
    let names: Vec<&str> = seen.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["input_ids", "attention_mask", "token_type_ids", "extra"]
    );
    let ids: &[i64] = bytemuck::cast_slice(&seen[0].data);
    assert_eq!(
        (seen[0].datatype, seen[0].shape.as_slice()),
        (DataType::Int64, &[2, 4][..])
    );
    assert_eq!(ids, [2, 21, 22, 3, 2, 9, 3, 0]);
    assert_eq!(seen[1].datatype, DataType::Int32);
    let mask: Vec<i32> = seen[1]
        .data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(mask, [1, 1, 1, 1, 1, 1, 1, 0]);
    assert_eq!(seen[3], extra);
}

#[test]
fn text_that_is_not_utf8_is_an_input_error() {
    let bound = spec(&TokenizerOptions::default())
        .bind(&bert_inputs())
        .unwrap();
    let error = bound
        .encode(&text_tensor(&[b"ok", b"\xff\xfe"]))
        .unwrap_err();
    assert!(
        matches!(&error, BackendError::Input(m) if m.contains("element 1 of input 'text' is not valid UTF-8")),
        "{error}"
    );
    let mut model = TextModel::new(Arc::new(bound), Box::new(Echo));
    let other = Tensor::new(
        "extra",
        DataType::Fp32,
        vec![1, 3],
        Bytes::from(vec![0u8; 12]),
    );
    assert!(model
        .run(&[other])
        .unwrap_err()
        .to_string()
        .contains("missing text input 'text'"));
}
