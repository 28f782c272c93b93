//! Reading a generation request: the prompt from `text_input` and the decoding settings from
//! input tensors, request parameters or a vLLM-style `sampling_parameters` JSON string, in that
//! order of precedence, as Triton's LLM backends take them. Types are read leniently (any integer
//! type for `max_tokens`, any number for `temperature`...) but values are checked strictly.

use crate::core::tensor::BytesElements;
use crate::core::{DataType, Error, InferRequest, ParamValue, Tensor};
use crate::generate::sampling::SamplingParams;
use crate::generate::GenerateParams;
use crate::invalid_arg;
use crate::repository::generation::{INPUTS, TEXT_OUTPUT};
use crate::repository::IoSpec;

/// Tokens generated when the request does not say (vLLM's default).
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// A request read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub prompt: String,
    pub params: GenerateParams,
    /// Stream token by token (the default), or answer once with the whole text.
    pub stream: bool,
    /// Leave the prompt out of a whole-text answer (Triton's LLM backends put it in by default).
    pub exclude_input: bool,
    /// `triton_enable_empty_final_response`: end with an empty response flagged final.
    pub empty_final: bool,
}

/// One setting as given, whatever carried it.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Bool(bool),
    Int(i128),
    Float(f64),
    Strings(Vec<String>),
}

/// Reads `request` for generation model `model`.
///
/// # Errors
/// INVALID_ARGUMENT naming the first tensor or setting that is missing, unknown or out of range.
pub fn parse(model: &str, io: &IoSpec, request: &InferRequest) -> Result<Parsed, Error> {
    let prefix = crate::engine::validate::request_prefix(&request.id);
    let tensors = read_tensors(model, io, request, &prefix)?;
    if let Some(output) = request.outputs.iter().find(|o| o.name != TEXT_OUTPUT) {
        return Err(invalid_arg!(
            "unexpected inference output '{}' for model '{model}'",
            output.name
        ));
    }
    let sampling_json = match lookup(&tensors, request, "sampling_parameters", &[]) {
        Some(Value::Strings(s)) if s.len() == 1 => sampling_parameters(&s[0], &prefix)?,
        Some(_) => {
            return Err(invalid_arg!(
                "{prefix}'sampling_parameters' must be one JSON string"
            ))
        }
        None => Vec::new(),
    };
    let get = |key: &str| lookup(&tensors, request, key, &sampling_json);
    let prompt = prompt(&tensors, model, io, request, &prefix)?;
    let bad = |key: &str, expected: &str, value: &Value| {
        invalid_arg!("{prefix}'{key}' must be {expected}, got {}", show(value))
    };
    let integer = |key: &str, min: i128, max: i128| -> Result<Option<i128>, Error> {
        let Some(value) = get(key) else {
            return Ok(None);
        };
        let n = match value {
            Value::Int(n) => Some(n),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 1e30 => Some(f as i128),
            _ => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(bad(
                key,
                &format!("an integer between {min} and {max}"),
                &value,
            )),
        }
    };
    let number = |key: &str| -> Result<Option<f64>, Error> {
        match get(key) {
            None => Ok(None),
            Some(Value::Int(n)) => Ok(Some(n as f64)),
            Some(Value::Float(f)) if f.is_finite() => Ok(Some(f)),
            Some(other) => Err(bad(key, "a number", &other)),
        }
    };
    let flag = |key: &str| -> Result<Option<bool>, Error> {
        match get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(bad(key, "a boolean", &other)),
        }
    };
    let max_tokens =
        integer("max_tokens", 1, u32::MAX as i128)?.map_or(DEFAULT_MAX_TOKENS, |n| n as usize);
    let temperature = number("temperature")?.unwrap_or(0.0);
    if temperature < 0.0 {
        return Err(bad(
            "temperature",
            "a number >= 0",
            &Value::Float(temperature),
        ));
    }
    // vLLM spells "no top-k" as -1.
    let top_k = integer("top_k", -1, u32::MAX as i128)?.map_or(0, |k| k.max(0) as usize);
    let top_p = number("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p", "a number in (0, 1]", &Value::Float(top_p)));
    }
    let seed = integer("seed", 0, u64::MAX as i128)?.map(|s| s as u64);
    let stop = match get("stop") {
        None => Vec::new(),
        Some(Value::Strings(stops)) => stops,
        Some(other) => return Err(bad("stop", "a string or a list of strings", &other)),
    };
    let empty_final = match request
        .parameters
        .get(crate::core::reserved::EMPTY_FINAL_RESPONSE)
    {
        None => false,
        Some(ParamValue::Bool(b)) => *b,
        Some(_) => {
            return Err(invalid_arg!(
                "{prefix}'triton_enable_empty_final_response' must be a boolean"
            ))
        }
    };
    Ok(Parsed {
        prompt,
        params: GenerateParams {
            max_tokens,
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_k,
                top_p: top_p as f32,
                seed,
            },
            stop,
            ignore_eos: flag("ignore_eos")?.unwrap_or(false),
            details: flag("details")?.unwrap_or(false),
        },
        stream: flag("stream")?.unwrap_or(true),
        exclude_input: flag("exclude_input_in_output")?.unwrap_or(false),
        empty_final,
    })
}

/// The request's input tensors as settings, by name: each one the model declares, once.
fn read_tensors(
    model: &str,
    io: &IoSpec,
    request: &InferRequest,
    prefix: &str,
) -> Result<Vec<(String, Value)>, Error> {
    let mut tensors = Vec::with_capacity(request.inputs.len());
    for tensor in &request.inputs {
        if io.input(&tensor.name).is_none() {
            return Err(invalid_arg!(
                "unexpected inference input '{}' for model '{model}'",
                tensor.name
            ));
        }
        if tensors.iter().any(|(name, _)| name == &tensor.name) {
            return Err(invalid_arg!(
                "{prefix}input '{}' is specified more than once for model '{model}'",
                tensor.name
            ));
        }
        tensors.push((tensor.name.clone(), tensor_value(tensor, model, prefix)?));
    }
    Ok(tensors)
}

/// The prompt: the one string of `text_input`, which a request must send.
fn prompt(
    tensors: &[(String, Value)],
    model: &str,
    io: &IoSpec,
    request: &InferRequest,
    prefix: &str,
) -> Result<String, Error> {
    match tensors.iter().find(|(n, _)| n == "text_input") {
        Some((_, Value::Strings(s))) if s.len() == 1 => Ok(s[0].clone()),
        Some(_) => Err(invalid_arg!(
            "{prefix}input 'text_input' for model '{model}' must hold exactly one string; \
             send one request per prompt"
        )),
        None => Err(invalid_arg!(
            "{prefix}expected number of inputs between 1 and {} but got {} inputs for model '{model}'. \
             Got input(s) {:?}, but missing required input(s) ['text_input']. Please provide all required input(s).",
            io.inputs.len(),
            request.inputs.len(),
            request.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>()
        )),
    }
}

/// The setting `key`: an input tensor, else a request parameter, else `sampling_parameters`.
fn lookup(
    tensors: &[(String, Value)],
    request: &InferRequest,
    key: &str,
    sampling: &[(String, Value)],
) -> Option<Value> {
    if let Some((_, value)) = tensors.iter().find(|(n, _)| n == key) {
        return Some(value.clone());
    }
    if let Some(parameter) = request.parameters.get(key) {
        return Some(match parameter {
            ParamValue::Bool(b) => Value::Bool(*b),
            ParamValue::Int64(n) => Value::Int(i128::from(*n)),
            ParamValue::Uint64(n) => Value::Int(i128::from(*n)),
            ParamValue::Double(f) => Value::Float(*f),
            ParamValue::String(s) => Value::Strings(vec![s.clone()]),
        });
    }
    sampling
        .iter()
        .find(|(n, _)| n == key)
        .map(|(_, v)| v.clone())
}

/// The settings of a vLLM `sampling_parameters` JSON object.
fn sampling_parameters(text: &str, prefix: &str) -> Result<Vec<(String, Value)>, Error> {
    let parsed: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| invalid_arg!("{prefix}'sampling_parameters' is not valid JSON: {e}"))?;
    let serde_json::Value::Object(object) = parsed else {
        return Err(invalid_arg!(
            "{prefix}'sampling_parameters' must be a JSON object"
        ));
    };
    object
        .into_iter()
        .map(|(key, value)| {
            let value = match value {
                serde_json::Value::Bool(b) => Value::Bool(b),
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => Value::Int(i128::from(i)),
                    None => match n.as_u64() {
                        Some(u) => Value::Int(i128::from(u)),
                        None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
                    },
                },
                serde_json::Value::String(s) => Value::Strings(vec![s]),
                serde_json::Value::Array(items) => Value::Strings(
                    items
                        .into_iter()
                        .map(|item| match item {
                            serde_json::Value::String(s) => Ok(s),
                            _ => Err(invalid_arg!(
                                "{prefix}'{key}' in 'sampling_parameters' must hold strings"
                            )),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                _ => {
                    return Err(invalid_arg!(
                        "{prefix}'{key}' in 'sampling_parameters' has an unsupported type"
                    ))
                }
            };
            Ok((key, value))
        })
        .collect()
}

/// A tensor's elements as one setting: BYTES as strings (UTF-8), other types as one scalar.
fn tensor_value(tensor: &Tensor, model: &str, prefix: &str) -> Result<Value, Error> {
    let name = &tensor.name;
    let known = INPUTS.iter().any(|(n, _)| n == name);
    let size = match tensor.datatype.element_size() {
        Some(size) => size,
        None => {
            return BytesElements::new(&tensor.data)
                .map(|element| {
                    let bytes = element.map_err(|e| {
                        invalid_arg!("{prefix}input '{name}' for model '{model}': {e}")
                    })?;
                    String::from_utf8(bytes.to_vec()).map_err(|_| {
                        invalid_arg!(
                            "{prefix}input '{name}' for model '{model}' is not valid UTF-8"
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Strings)
        }
    };
    if !known || tensor.data.len() != size {
        return Err(invalid_arg!(
            "{prefix}input '{name}' for model '{model}' must hold exactly one {} element",
            tensor.datatype
        ));
    }
    let bytes = &tensor.data[..];
    let array = |n: usize| -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..n].copy_from_slice(&bytes[..n]);
        out
    };
    Ok(match tensor.datatype {
        DataType::Bool => Value::Bool(bytes[0] != 0),
        DataType::Int8 => Value::Int(i128::from(bytes[0] as i8)),
        DataType::Int16 => Value::Int(i128::from(i16::from_le_bytes([bytes[0], bytes[1]]))),
        DataType::Int32 => Value::Int(i128::from(i32::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3],
        ]))),
        DataType::Int64 => Value::Int(i128::from(i64::from_le_bytes(array(8)))),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
            Value::Int(i128::from(u64::from_le_bytes(array(size))))
        }
        DataType::Fp32 => Value::Float(f64::from(f32::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3],
        ]))),
        DataType::Fp64 => Value::Float(f64::from_le_bytes(array(8))),
        DataType::Fp16 => Value::Float(f64::from(
            half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
        )),
        DataType::Bf16 => Value::Float(f64::from(
            half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
        )),
        DataType::Bytes => Value::Strings(Vec::new()),
    })
}

fn show(value: &Value) -> String {
    match value {
        Value::Bool(b) => b.to_string(),
        Value::Int(n) => n.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Strings(s) if s.len() == 1 => format!("'{}'", s[0]),
        Value::Strings(s) => format!("{s:?}"),
    }
}

#[cfg(test)]
mod tests;
