//! The generate extension for generation models: the request is `{"text_input": "...",
//! "parameters": {...}}`, other top-level keys are settings too; a list of strings (e.g. the
//! Open Inference Protocol's `"stop": ["a", "b"]`), at the top level or in `parameters`, becomes
//! a BYTES tensor of that name, as Triton makes a key naming one of the model's inputs that
//! input. Each answer is `{"model_name", "model_version", "text_output"}`, one per generated
//! token on `generate_stream` (one with the whole text when the request sets `"stream": false`),
//! the whole text on `generate`.
//!
//! `"details": true` (the Open Inference Protocol's flag; neither Triton nor kiln answers it
//! otherwise) adds `details` to each answer: on a streamed token `{"finish_reason", "token"}`
//! (`finish_reason` null before the last), on a whole text `{"finish_reason", "logprobs"}`, every
//! token as `{"id", "text", "logprob", "special"}`; `finish_reason` is `length`, `eos_token` or
//! `stop_sequence`.

use super::error_event;
use crate::core::tensor::frame_bytes;
use crate::core::{DataType, Error, InferRequest, ParamValue, Tensor};
use crate::engine::generate::{Finish, Finished, Generation, TokenDetails};
use crate::invalid_arg;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};

/// The events of `generate_stream`: one per generated token, or one with the whole text; an
/// error event when generation fails.
pub(super) fn events(generation: Generation) -> BoxStream<'static, Vec<u8>> {
    stream::unfold(Some(generation), |state| async move {
        let mut generation = state?;
        let (data, more) = if generation.request.stream {
            match generation.next().await? {
                Ok(chunk) => {
                    let mut data = event(&generation, &chunk.text);
                    if generation.request.params.details {
                        data["details"] = json!({
                            "finish_reason": chunk.finished.map(finish_reason),
                            "token": chunk.details.as_ref().map(token),
                        });
                    }
                    (data, !chunk.last())
                }
                Err(error) => return Some((error_event(&error), None)),
            }
        } else {
            match whole(&mut generation).await {
                Ok(data) => (data, false),
                Err(error) => return Some((error_event(&error), None)),
            }
        };
        Some((data.to_string().into_bytes(), more.then_some(generation)))
    })
    .boxed()
}

/// One response object.
fn event(generation: &Generation, text: &str) -> Value {
    json!({
        "model_name": generation.model_name,
        "model_version": generation.model_version,
        "text_output": text,
    })
}

/// The one response object with the whole text (and its `details` when asked).
///
/// # Errors
/// The generation's.
pub(super) async fn whole(generation: &mut Generation) -> Result<Value, Error> {
    let whole = generation.whole().await?;
    let mut data = event(generation, &whole.text);
    if generation.request.params.details {
        data["details"] = json!({
            "finish_reason": whole.finished.map(finish_reason),
            "logprobs": whole.tokens.iter().map(token).collect::<Vec<_>>(),
        });
    }
    Ok(data)
}

/// The Open Inference Protocol's `finish_reason`.
fn finish_reason(finished: Finished) -> &'static str {
    match finished.reason {
        Finish::Length => "length",
        Finish::Eos => "eos_token",
        Finish::Stop => "stop_sequence",
    }
}

/// The Open Inference Protocol's `Token`.
fn token(details: &TokenDetails) -> Value {
    json!({
        "id": details.id,
        "text": details.text,
        "logprob": details.logprob,
        "special": details.special,
    })
}

/// A generate request as the engine takes it: `text_input` a BYTES tensor; every other key, at the
/// top level or in `parameters`, a request parameter when it is a scalar and a BYTES tensor when
/// it is a list of strings.
///
/// # Errors
/// INVALID_ARGUMENT for a body that is not such a JSON object.
pub fn decode(model: &str, version: &str, body: &[u8]) -> Result<InferRequest, Error> {
    let document = super::super::json::bounded_value(body, super::super::json::MAX_TREE_BYTES)
        .map_err(|e| invalid_arg!("failed to parse the request JSON buffer: {e}"))?;
    let Value::Object(fields) = document else {
        return Err(invalid_arg!("the generate request must be a JSON object"));
    };
    let mut request = InferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        ..Default::default()
    };
    for (key, value) in fields {
        match (key.as_str(), value) {
            ("parameters", Value::Object(parameters)) => {
                for (key, value) in parameters {
                    setting(&mut request, key, value)?;
                }
            }
            ("parameters", _) => {
                return Err(invalid_arg!("'parameters' must be a JSON object"));
            }
            ("text_input", Value::String(text)) => request.inputs.push(strings(&key, &[text])),
            ("text_input", _) => return Err(invalid_arg!("'text_input' must be a string")),
            (_, value) => setting(&mut request, key, value)?,
        }
    }
    Ok(request)
}

/// One setting: a list of strings as a BYTES tensor, a scalar as a request parameter.
fn setting(request: &mut InferRequest, key: String, value: Value) -> Result<(), Error> {
    match value {
        Value::Array(items) => {
            let texts = items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(text),
                    _ => Err(invalid_arg!("'{key}' must be a list of strings")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            request.inputs.push(strings(&key, &texts));
        }
        value => {
            let parameter = scalar(&key, value)?;
            request.parameters.insert(key, parameter);
        }
    }
    Ok(())
}

fn strings(name: &str, texts: &[String]) -> Tensor {
    Tensor::new(
        name,
        DataType::Bytes,
        vec![texts.len() as i64],
        frame_bytes(texts),
    )
}

/// A JSON scalar as a request parameter (Triton's parameters are strings, numbers or booleans).
fn scalar(key: &str, value: Value) -> Result<ParamValue, Error> {
    ParamValue::from_json(value)
        .ok_or_else(|| invalid_arg!("parameter '{key}' must be a string, a number or a boolean"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_become_inputs_and_parameters() {
        let body = br#"{"text_input": "hi", "max_tokens": 4, "stop": ["a", "b"],
                        "parameters": {"temperature": 0.5, "stream": false, "seed": 18446744073709551615,
                                       "bad_words": ["x"]}}"#;
        let request = decode("m", "2", body).unwrap();
        assert_eq!(
            (request.model_name.as_str(), request.model_version.as_str()),
            ("m", "2")
        );
        let input = |name: &str| request.inputs.iter().find(|t| t.name == name).unwrap();
        assert_eq!(request.inputs.len(), 3);
        assert_eq!(input("stop").shape, vec![2]);
        // A list in `parameters` is a tensor too (the Open Inference Protocol puts `stop` there).
        assert_eq!(input("bad_words").data, frame_bytes(["x"]));
        assert_eq!(input("stop").data, frame_bytes(["a", "b"]));
        assert_eq!(input("text_input").data, frame_bytes(["hi"]));
        assert_eq!(request.parameters["max_tokens"], ParamValue::Int64(4));
        assert_eq!(request.parameters["temperature"], ParamValue::Double(0.5));
        assert_eq!(request.parameters["stream"], ParamValue::Bool(false));
        assert_eq!(request.parameters["seed"], ParamValue::Uint64(u64::MAX));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for (body, message) in [
            (&b"[1]"[..], "must be a JSON object"),
            (b"{", "failed to parse the request JSON buffer"),
            (br#"{"text_input": ["a"]}"#, "'text_input' must be a string"),
            (
                br#"{"parameters": 3}"#,
                "'parameters' must be a JSON object",
            ),
            (
                br#"{"parameters": {"x": null}}"#,
                "parameter 'x' must be a string, a number or a boolean",
            ),
            (br#"{"stop": [1]}"#, "'stop' must be a list of strings"),
            (
                br#"{"parameters": {"stop": [["a"]]}}"#,
                "'stop' must be a list of strings",
            ),
            (br#"{"nested": {"a": 1}}"#, "parameter 'nested' must be"),
        ] {
            let error = decode("m", "", body).unwrap_err();
            assert!(matches!(error, Error::InvalidArgument(_)));
            assert!(error.message().contains(message), "{}", error.message());
        }
    }
}
