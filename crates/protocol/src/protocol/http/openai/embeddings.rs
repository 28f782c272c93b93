//! `/v1/embeddings`: the vectors a text model makes of one text or many (see
//! [`crate::engine::Engine::embed`]), as OpenAI's embeddings API answers them:
//!
//! ```text
//! {"object": "list", "model": "...",
//!  "data": [{"object": "embedding", "index": 0, "embedding": [0.1, ...]}, ...],
//!  "usage": {"prompt_tokens": 7, "total_tokens": 7}}
//! ```
//!
//! `encoding_format: "base64"` gives each vector as the base64 of its little-endian `float32`
//! values, which the `openai` package asks for by default and decodes itself. Token ids as input
//! are refused: they would be ids of some other tokenizer (the `openai` package's tiktoken), not
//! the model's.

use super::super::{body, json};
use super::{completion_id, read_model, read_object, AppState, OpenAiError};
use crate::engine::{Embeddings, MAX_TEXTS};
use crate::protocol::lifecycle::{Lifecycle, Wire};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::Value;
use std::sync::Arc;

/// An embeddings request, read.
#[derive(Debug, PartialEq)]
struct EmbeddingRequest {
    model: String,
    texts: Vec<String>,
    base64: bool,
    dimensions: Option<usize>,
}

fn read_request(body: &[u8]) -> Result<EmbeddingRequest, OpenAiError> {
    let fields = read_object(body)?;
    let model = read_model(&fields)?;
    let not_text = || {
        OpenAiError::invalid(
            "input",
            format!(
                "'input' must be a string or a list of 1 to {MAX_TEXTS} strings (token ids are not \
                 served: the model tokenizes text itself)"
            ),
        )
    };
    let texts = match fields.get("input") {
        Some(Value::String(text)) => vec![text.clone()],
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= MAX_TEXTS => items
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(not_text)?,
        _ => return Err(not_text()),
    };
    let base64 = match fields.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(format)) if format == "float" => false,
        Some(Value::String(format)) if format == "base64" => true,
        Some(_) => {
            return Err(OpenAiError::invalid(
                "encoding_format",
                "'encoding_format' must be \"float\" or \"base64\"",
            ))
        }
    };
    let dimensions = match fields.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_u64()
                .filter(|&d| d > 0)
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| {
                    OpenAiError::invalid("dimensions", "'dimensions' must be a positive integer")
                })?,
        ),
    };
    Ok(EmbeddingRequest {
        model,
        texts,
        base64,
        dimensions,
    })
}

/// The answer's JSON, written directly: a request of 2048 texts answers about a million numbers.
fn answer(embeddings: &Embeddings, base64: bool) -> Vec<u8> {
    let per_vector = if base64 {
        embeddings.dimensions * 4 * 4 / 3 + 48
    } else {
        embeddings.dimensions * 12 + 48
    };
    let count = embeddings.values.len() / embeddings.dimensions.max(1);
    let mut out = Vec::with_capacity(count * per_vector + 128);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut raw = Vec::with_capacity(embeddings.dimensions * 4);
    for (index, vector) in embeddings.vectors().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"object":"embedding","index":"#);
        json::write_integer(&mut out, index);
        out.extend_from_slice(br#","embedding":"#);
        if base64 {
            raw.clear();
            raw.extend(vector.iter().flat_map(|v| v.to_le_bytes()));
            out.push(b'"');
            out.extend_from_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(&raw)
                    .as_bytes(),
            );
            out.push(b'"');
        } else {
            out.push(b'[');
            for (i, &value) in vector.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json::write_f32(&mut out, value);
            }
            out.push(b']');
        }
        out.push(b'}');
    }
    out.extend_from_slice(br#"],"model":"#);
    json::write_str(&mut out, &embeddings.model);
    let tokens = embeddings.prompt_tokens;
    out.extend_from_slice(
        format!(r#","usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#).as_bytes(),
    );
    out
}

pub(super) async fn embeddings(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match embed(&state, &headers, body).await {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => error.into_response(),
    }
}

async fn embed(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, OpenAiError> {
    // Admitted once the body has arrived: a stalled body holds no in-flight slot.
    let body = body::read(body, headers, &state.config).await?;
    let context = Lifecycle::untraced(Wire::Http).admit(&state.engine)?;
    let request = read_request(&body)?;
    let id = completion_id("embd");
    let embeddings = state
        .engine
        .embed(
            &context,
            &request.model,
            request.texts,
            request.dimensions,
            &id,
        )
        .await?;
    Ok(answer(&embeddings, request.base64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn requests_read_one_text_or_many() {
        let one = read_request(br#"{"model": "m", "input": "hi", "user": "u"}"#).unwrap();
        assert_eq!(
            one,
            EmbeddingRequest {
                model: "m".into(),
                texts: vec!["hi".into()],
                base64: false,
                dimensions: None,
            }
        );
        let many = read_request(
            br#"{"model": "m", "input": ["a", ""], "encoding_format": "base64", "dimensions": 384}"#,
        )
        .unwrap();
        assert_eq!(many.texts, ["a", ""]);
        assert!(many.base64);
        assert_eq!(many.dimensions, Some(384));
    }

    #[test]
    fn what_is_not_text_or_not_served_is_refused_by_name() {
        let too_many = format!(
            r#"{{"model": "m", "input": [{}]}}"#,
            vec![r#""x""#; MAX_TEXTS + 1].join(",")
        );
        for (body, param) in [
            (r#"{"input": "x"}"#, "model"),
            (r#"{"model": "m"}"#, "input"),
            (r#"{"model": "m", "input": []}"#, "input"),
            (r#"{"model": "m", "input": [1, 2]}"#, "input"),
            (r#"{"model": "m", "input": [[1, 2]]}"#, "input"),
            (r#"{"model": "m", "input": ["a", 1]}"#, "input"),
            (too_many.as_str(), "input"),
            (
                r#"{"model": "m", "input": "x", "encoding_format": "int8"}"#,
                "encoding_format",
            ),
            (
                r#"{"model": "m", "input": "x", "dimensions": 0}"#,
                "dimensions",
            ),
            (
                r#"{"model": "m", "input": "x", "dimensions": -3}"#,
                "dimensions",
            ),
        ] {
            let error = read_request(body.as_bytes()).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(error.param, Some(param), "{body}: {}", error.message);
        }
    }

    #[test]
    fn answers_carry_floats_or_base64_float32() {
        let embeddings = Embeddings {
            model: "m\"".into(),
            values: vec![0.5, -1.25, 3.0e-8, 2.0],
            dimensions: 2,
            prompt_tokens: 5,
        };
        let floats: Value = serde_json::from_slice(&answer(&embeddings, false)).unwrap();
        assert_eq!(
            floats,
            serde_json::json!({"object": "list", "model": "m\"",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.25]},
                         {"object": "embedding", "index": 1, "embedding": [3.0e-8, 2.0]}],
                "usage": {"prompt_tokens": 5, "total_tokens": 5}})
        );
        let encoded: Value = serde_json::from_slice(&answer(&embeddings, true)).unwrap();
        let second = base64::engine::general_purpose::STANDARD
            .decode(encoded["data"][1]["embedding"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            second,
            [3.0e-8f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat()
        );
    }
}
