//! Text models: the `tokenizer_*` parameters of `config.pbtxt` that turn a model with a
//! `tokenizer.json` into one that takes strings (see [`crate::backend::tokenize`]), checked when
//! the model loads.
//!
//! ```text
//! parameters { key: "tokenizer_text_input" value: { string_value: "text" } }
//! parameters { key: "tokenizer_max_length" value: { string_value: "256" } }
//! ```

use super::limits::MAX_TOKENIZER_BYTES;
use super::store::contained;
use crate::backend::tokenize::{
    Padding, TextInput, TextSpec, TextTokenizer, TokenSlot, TokenizerOptions,
};
use crate::core::DataType;
use crate::proto::inference::ModelConfig;
use std::path::Path;
use std::sync::Arc;

/// The file a text model's directory holds its tokenizer in.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Names the BYTES input clients send; setting it makes the model a text model.
pub const TEXT_INPUT: &str = "tokenizer_text_input";
const INPUT_IDS: &str = "tokenizer_input_ids";
const ATTENTION_MASK: &str = "tokenizer_attention_mask";
const TOKEN_TYPE_IDS: &str = "tokenizer_token_type_ids";
const MAX_LENGTH: &str = "tokenizer_max_length";
const TRUNCATION: &str = "tokenizer_truncation";
const PADDING: &str = "tokenizer_padding";
const ADD_SPECIAL_TOKENS: &str = "tokenizer_add_special_tokens";
const KNOWN: [&str; 8] = [
    TEXT_INPUT,
    INPUT_IDS,
    ATTENTION_MASK,
    TOKEN_TYPE_IDS,
    MAX_LENGTH,
    TRUNCATION,
    PADDING,
    ADD_SPECIAL_TOKENS,
];
/// A bound on `tokenizer_max_length` far beyond any model, so a typo cannot ask for huge rows.
const MAX_MAX_LENGTH: usize = 1 << 20;

/// Reads the `tokenizer_*` parameters and loads `<dir>/tokenizer.json`; `None` for a model that
/// does not take text.
///
/// # Errors
/// The reason, as the repository index reports it: an unknown `tokenizer_*` key, a value of the
/// wrong form, a missing or invalid `tokenizer.json`.
pub fn text_spec(config: &ModelConfig, dir: &Path) -> Result<Option<TextSpec>, String> {
    let value = |key: &str| config.parameters.get(key).map(|p| p.string_value.trim());
    let keys: Vec<&str> = config
        .parameters
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("tokenizer_"))
        .collect();
    if let Some(unknown) = keys.iter().find(|k| !KNOWN.contains(k)) {
        return Err(format!(
            "unknown parameter '{unknown}'; the tokenizer parameters are {}",
            KNOWN.join(", ")
        ));
    }
    let Some(text_input) = value(TEXT_INPUT) else {
        return match keys.first() {
            Some(key) => Err(format!(
                "parameter '{key}' needs '{TEXT_INPUT}', the BYTES input that carries the text"
            )),
            None => Ok(None),
        };
    };
    if text_input.is_empty() {
        return Err(format!("parameter '{TEXT_INPUT}' must name an input"));
    }
    let slot = |key: &str, conventional: &str| match value(key) {
        None => TokenSlot::IfPresent(conventional.to_string()),
        Some("") => TokenSlot::Unused,
        Some(name) => TokenSlot::Named(name.to_string()),
    };
    let input_ids = match value(INPUT_IDS) {
        None => "input_ids".to_string(),
        Some("") => return Err(format!("parameter '{INPUT_IDS}' must name a graph input")),
        Some(name) => name.to_string(),
    };
    let options = TokenizerOptions {
        max_length: value(MAX_LENGTH)
            .map(|v| match v.parse::<usize>() {
                Ok(n) if (1..=MAX_MAX_LENGTH).contains(&n) => Ok(n),
                _ => Err(format!(
                    "parameter '{MAX_LENGTH}' must be an integer from 1 to {MAX_MAX_LENGTH}, got '{v}'"
                )),
            })
            .transpose()?,
        truncate: flag(value(TRUNCATION), TRUNCATION, true)?,
        padding: match value(PADDING) {
            None | Some("longest") => Padding::Longest,
            Some("max_length") => Padding::MaxLength,
            Some(other) => {
                return Err(format!(
                    "parameter '{PADDING}' must be \"longest\" or \"max_length\", got '{other}'"
                ))
            }
        },
        add_special_tokens: flag(value(ADD_SPECIAL_TOKENS), ADD_SPECIAL_TOKENS, true)?,
    };
    let path = contained(dir, TOKENIZER_FILE).map_err(|e| format!("{TOKENIZER_FILE}: {e}"))?;
    if !path.is_file() {
        return Err(format!(
            "parameter '{TEXT_INPUT}' is set, but the model directory has no {TOKENIZER_FILE}"
        ));
    }
    if path.metadata().map_or(0, |m| m.len()) > MAX_TOKENIZER_BYTES {
        return Err(format!(
            "{TOKENIZER_FILE} is larger than the {MAX_TOKENIZER_BYTES} bytes kiln reads"
        ));
    }
    let tokenizer = TextTokenizer::load(&path, &options).map_err(|e| e.to_string())?;
    Ok(Some(TextSpec {
        text_input: text_input.to_string(),
        input_ids,
        attention_mask: slot(ATTENTION_MASK, "attention_mask"),
        token_type_ids: slot(TOKEN_TYPE_IDS, "token_type_ids"),
        tokenizer: Arc::new(tokenizer),
    }))
}

fn flag(value: Option<&str>, key: &str, default: bool) -> Result<bool, String> {
    match value {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(format!(
            "parameter '{key}' must be \"true\" or \"false\", got '{other}'"
        )),
    }
}

/// Checks what the (completed) config says about the text input: clients send the text, never
/// the token tensors, one text per row.
///
/// # Errors
/// The first input that does not fit, and what would.
pub fn check_config(config: &ModelConfig, text: &TextInput) -> Result<(), String> {
    if let Some(token) = config
        .input
        .iter()
        .find(|i| text.token_inputs().any(|t| t == i.name))
    {
        return Err(format!(
            "input '{}' is fed by the tokenizer from '{}'; list the text input in the configuration instead",
            token.name,
            text.text_input()
        ));
    }
    let Some(input) = config.input.iter().find(|i| i.name == text.text_input()) else {
        return Err(format!(
            "the text input '{}' is missing from the configuration",
            text.text_input()
        ));
    };
    let one_per_row = match config.max_batch_size {
        0 => input.dims.len() == 2 && input.dims[1] == 1,
        _ => input.dims == [1],
    };
    let is_bytes = super::config::datatype_from_config(input.data_type) == Some(DataType::Bytes);
    if !is_bytes || !one_per_row || input.reshape.is_some() {
        let dims = if config.max_batch_size == 0 {
            "[ -1, 1 ]"
        } else {
            "[ 1 ]"
        };
        return Err(format!(
            "the text input '{}' must be TYPE_STRING with dims: {dims} (one text per row) and no reshape",
            input.name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::TensorInfo;
    use crate::repository::config::parse_config;
    use std::path::PathBuf;

    fn fixture() -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/model_repository/text_tokens")
    }

    fn config(text: &str) -> ModelConfig {
        parse_config(text).unwrap()
    }

    fn param(key: &str, value: &str) -> String {
        format!("parameters {{ key: \"{key}\" value: {{ string_value: \"{value}\" }} }}\n")
    }

    #[test]
    fn a_model_without_tokenizer_parameters_is_not_a_text_model() {
        let plain = config(&param("max_inflight_requests", "4"));
        assert!(text_spec(&plain, &fixture()).unwrap().is_none());
    }

    #[test]
    fn defaults_follow_the_graph_and_the_tokenizer() {
        let spec = text_spec(&config(&param(TEXT_INPUT, " text ")), &fixture())
            .unwrap()
            .unwrap();
        assert_eq!(spec.text_input, "text");
        assert_eq!(spec.input_ids, "input_ids");
        assert_eq!(
            spec.attention_mask,
            TokenSlot::IfPresent("attention_mask".into())
        );
        assert_eq!(
            spec.token_type_ids,
            TokenSlot::IfPresent("token_type_ids".into())
        );
        // The fixture's tokenizer.json has no truncation section.
        assert_eq!(spec.tokenizer.max_length(), 512);
        let named =
            param(TEXT_INPUT, "t") + &param(ATTENTION_MASK, "") + &param(TOKEN_TYPE_IDS, "seg");
        let spec = text_spec(&config(&named), &fixture()).unwrap().unwrap();
        assert_eq!(spec.attention_mask, TokenSlot::Unused);
        assert_eq!(spec.token_type_ids, TokenSlot::Named("seg".into()));
    }

    #[test]
    fn the_text_input_is_one_string_per_row() {
        let spec = text_spec(&config(&param(TEXT_INPUT, "text")), &fixture())
            .unwrap()
            .unwrap();
        let graph = [TensorInfo {
            name: "input_ids".into(),
            datatype: Some(DataType::Int64),
            shape: vec![-1, -1],
        }];
        let bound = spec.bind(&graph).unwrap();
        let unbatched = config(
            "input [ { name: \"text\" data_type: TYPE_STRING dims: [ -1, 1 ] } ] \
             output [ { name: \"y\" data_type: TYPE_FP32 dims: [ -1 ] } ]",
        );
        assert_eq!(check_config(&unbatched, &bound), Ok(()));
        let wrong = config(
            "max_batch_size: 4 input [ { name: \"text\" data_type: TYPE_STRING dims: [ 2 ] } ] \
             output [ { name: \"y\" data_type: TYPE_FP32 dims: [ -1 ] } ]",
        );
        assert!(check_config(&wrong, &bound)
            .unwrap_err()
            .contains("dims: [ 1 ]"));
        let missing = config(
            "max_batch_size: 4 output [ { name: \"y\" data_type: TYPE_FP32 dims: [ -1 ] } ]",
        );
        assert!(check_config(&missing, &bound)
            .unwrap_err()
            .contains("missing from the configuration"));
    }
}
