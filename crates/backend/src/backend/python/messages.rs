//! What the stub's messages mean: `pb_utils.TritonError`'s codes, a response's outputs and
//! parameters, a request's parameters as the model sees them, and the errors of a broken pipe.

use super::{channel, Outputs};
use crate::core::{Error, ParamValue, Parameters};
use serde_json::Value;

/// Makes an error of one kind from its message.
pub(super) type MakeError = fn(String) -> Error;

/// `pb_utils.TritonError`'s codes with the errors they stand for; any other code (1 is
/// INTERNAL) is an internal error.
pub(super) const ERROR_CODES: [(i64, MakeError); 5] = [
    (2, Error::NotFound),
    (3, Error::InvalidArgument),
    (4, Error::Unavailable),
    (5, Error::Unsupported),
    (6, Error::AlreadyExists),
];

/// Triton's code for an error a response carries (`pb_utils.TritonError`'s numbering).
pub(super) fn error_code(error: &Error) -> i64 {
    let kind = std::mem::discriminant(error);
    ERROR_CODES
        .iter()
        .find(|(_, make)| std::mem::discriminant(&make(String::new())) == kind)
        .map_or(1, |(code, _)| *code)
}

/// A response's parameters as the stub sends them (`null`: none); the stub checks their types.
pub(super) fn response_parameters(parameters: &Value) -> Result<Parameters, String> {
    let Some(parameters) = parameters.as_object() else {
        return match parameters {
            Value::Null => Ok(Parameters::new()),
            _ => Err("response parameters are not an object".into()),
        };
    };
    parameters
        .iter()
        .map(|(key, value)| match ParamValue::from_json(value.clone()) {
            Some(value) => Ok((key.clone(), value)),
            None => Err(format!("response parameter '{key}' is not a scalar")),
        })
        .collect()
}

/// What went wrong on a stub's pipe, for messages: a closed pipe said as such.
pub(super) fn pipe_error(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::BrokenPipe => {
            "its pipe closed".to_string()
        }
        _ => error.to_string(),
    }
}

/// A protocol error: the stub said something kiln cannot read.
pub(super) fn broken(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

/// The error an exception in `execute` (an `error` message) fails its requests with, in
/// Triton's words.
pub(super) fn execute_failed(instance: &str, message: &channel::Message) -> Error {
    let why = message.header["message"].as_str().unwrap_or("");
    Error::Internal(format!(
        "Failed to process the request(s) for model '{instance}', message: {why}"
    ))
}

/// A response of `model` to a request asking for outputs `asked` (empty: all): its outputs
/// (their data taken from `data`) and parameters, or its error; `Err` when the message does
/// not hold together.
pub(super) fn read_outputs(
    model: &str,
    asked: &[String],
    response: &Value,
    data: &mut impl Iterator<Item = bytes::Bytes>,
) -> std::io::Result<Result<Outputs, Error>> {
    if let Some(why) = response["error"].as_str() {
        let code = response["code"].as_i64().unwrap_or(1);
        return Ok(Ok(Outputs {
            refused: Some(model_error(why.to_string(), code)),
            ..Outputs::default()
        }));
    }
    let described = response["outputs"]
        .as_array()
        .ok_or_else(|| broken("a response without outputs".into()))?;
    let mut outputs = Vec::with_capacity(described.len());
    let mut bad = None;
    for description in described {
        let blob = data
            .next()
            .ok_or_else(|| broken("outputs and their data do not match".into()))?;
        match channel::tensor(description, blob) {
            Ok(tensor) => outputs.push(tensor),
            Err(why) => bad = bad.or(Some(why)),
        }
    }
    let missing = asked
        .iter()
        .find(|name| !outputs.iter().any(|o| &o.name == *name));
    let parameters = response_parameters(&response["parameters"])
        .map_err(|why| broken(format!("model '{model}': {why}")))?;
    Ok(match (bad, missing) {
        (Some(why), _) => Err(Error::Internal(format!("model '{model}': {why}"))),
        (None, Some(missing)) => Err(Error::Internal(format!(
            "model '{model}' did not return the requested output '{missing}'"
        ))),
        (None, None) => Ok(Outputs {
            tensors: outputs,
            parameters,
            ..Outputs::default()
        }),
    })
}

/// The parameters as the JSON object `request.parameters()` gives: without the reserved ones
/// the server acts on ([`crate::core::reserved`]), which Triton takes out (the model has
/// `correlation_id()`, `flags()` and `timeout()` for them).
pub(super) fn parameters_json(parameters: &Parameters) -> String {
    let map: serde_json::Map<String, Value> = parameters
        .iter()
        .filter(|(key, _)| crate::core::reserved::reserved(key).is_none())
        .map(|(key, value)| (key.clone(), value.to_json()))
        .collect();
    Value::Object(map).to_string()
}

/// The error a response's `TritonError` fails its request with.
pub(super) fn model_error(message: String, code: i64) -> Error {
    match ERROR_CODES.iter().find(|(known, _)| *known == code) {
        Some((_, make)) => make(message),
        None => Error::Internal(message),
    }
}
