//! Triton's generic generate mapping, for every model that is not a generation model (ONNX
//! models, ensembles, Python models such as a vLLM-style `model.py`).
//!
//! Request: each key of the JSON object, and each key of its `parameters` object, that names one
//! of the model's inputs becomes that input: the input's datatype, the value's elements (a scalar
//! is one element, an array its items), laid into the input's shape from the model's metadata:
//! fixed dimensions take their share of the elements, the innermost variable dimension the rest,
//! any other variable dimension (the batch) 1. Every other key becomes a request parameter (a
//! string, an integer, a boolean or a number); `id` is also the request's id.
//!
//! Response: one flat JSON object per model response: `id` (when the request had one),
//! `model_name`, `model_version`, the response's parameters, and each output by name, one element
//! as a scalar, several as a flat array; keys in alphabetical order, as Triton writes them.

use super::super::json::write_str;
use super::super::tensor_json;
use crate::core::{DataType, Error, InferRequest, InferResponse, ParamValue, Tensor};
use crate::engine::{ModelMetadata, TensorMetadata};
use crate::invalid_arg;
use serde_json::Value;
use std::collections::BTreeMap;

/// The key whose object's keys are mapped like top-level ones.
const PARAMETERS: &str = "parameters";

/// The inference request a generate body makes for the model `metadata` describes.
///
/// # Errors
/// INVALID_ARGUMENT for a body that is not a JSON object, a `parameters` that is not one (or
/// that names an input), a value that does not fit its input's datatype or shape, and a
/// parameter that is not a string, number or boolean.
pub fn request(
    metadata: &ModelMetadata,
    version: &str,
    body: &[u8],
) -> Result<InferRequest, Error> {
    let document = super::super::json::bounded_value(body, super::super::json::MAX_TREE_BYTES)
        .map_err(|e| invalid_arg!("failed to parse the request JSON buffer: {e}"))?;
    let Value::Object(fields) = document else {
        return Err(invalid_arg!("the generate request must be a JSON object"));
    };
    let mut request = InferRequest {
        model_name: metadata.name.clone(),
        model_version: version.to_string(),
        ..Default::default()
    };
    let input = |name: &str| metadata.inputs.iter().find(|input| input.name == name);
    for (key, value) in fields {
        if key == PARAMETERS {
            if input(PARAMETERS).is_some() {
                return Err(invalid_arg!(
                    "Keyword '{PARAMETERS}' for nested schema also given as input tensor name"
                ));
            }
            let Value::Object(nested) = value else {
                return Err(invalid_arg!(
                    "Expected JSON object for keyword: '{PARAMETERS}'"
                ));
            };
            for (key, value) in nested {
                map_key(&mut request, input(&key), key, value).map_err(|e| {
                    let message = format!("Converting keyword: '{PARAMETERS}': {}", e.message());
                    e.with_message(message)
                })?;
            }
        } else {
            if key == "id" && input("id").is_none() {
                // The request's id too, which its responses carry.
                let Value::String(id) = &value else {
                    return Err(invalid_arg!("Unable to parse 'id'"));
                };
                request.id.clone_from(id);
            }
            map_key(&mut request, input(&key), key, value)?;
        }
    }
    Ok(request)
}

/// One key: the input it names, or a parameter.
fn map_key(
    request: &mut InferRequest,
    input: Option<&TensorMetadata>,
    key: String,
    value: Value,
) -> Result<(), Error> {
    match input {
        Some(spec) => request.inputs.push(tensor(spec, &value)?),
        None => {
            let parameter = match ParamValue::from_json(value) {
                // Triton's integers are signed: a larger one is a number like any other.
                Some(ParamValue::Uint64(u)) => ParamValue::Double(u as f64),
                Some(parameter) => parameter,
                None => {
                    return Err(invalid_arg!(
                        "parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                    ))
                }
            };
            request.parameters.insert(key, parameter);
        }
    }
    Ok(())
}

/// The input `spec` holding `value`'s elements.
fn tensor(spec: &TensorMetadata, value: &Value) -> Result<Tensor, Error> {
    let datatype = DataType::from_wire(&spec.datatype).ok_or_else(|| {
        Error::Internal(format!(
            "input '{}' has datatype '{}'",
            spec.name, spec.datatype
        ))
    })?;
    let (count, text) = match value {
        Value::Array(items) => (items.len(), serde_json::to_vec(value)),
        scalar => (1, serde_json::to_vec(&[scalar])),
    };
    let text = text.map_err(|e| Error::Internal(format!("cannot write JSON: {e}")))?;
    let shape = shape(&spec.name, &spec.shape, count)?;
    let data = tensor_json::decode(&spec.name, datatype, count, &text)?;
    Ok(Tensor::new(spec.name.clone(), datatype, shape, data))
}

/// Lays `count` elements into `dims` (`-1` variable): fixed dimensions take their share, the
/// innermost variable one the rest, other variable ones 1.
///
/// # Errors
/// INVALID_ARGUMENT when the elements do not fill the fixed dimensions exactly.
pub fn shape(name: &str, dims: &[i64], count: usize) -> Result<Vec<i64>, Error> {
    let unfit =
        || invalid_arg!("The schema can not convert input '{name}' to tensor with proper shape");
    let mut rest = i64::try_from(count).map_err(|_| unfit())?;
    for &dim in dims.iter().rev().filter(|&&dim| dim >= 0) {
        if dim == 0 {
            if rest != 0 {
                return Err(unfit());
            }
        } else if rest % dim != 0 {
            return Err(unfit());
        } else {
            rest /= dim;
        }
    }
    let mut shape = dims.to_vec();
    for dim in shape.iter_mut().rev().filter(|dim| **dim < 0) {
        *dim = std::mem::replace(&mut rest, 1);
    }
    if rest != 1 && !(rest == 0 && dims.contains(&0)) {
        return Err(unfit());
    }
    Ok(shape)
}

/// One response as its generate JSON object.
///
/// # Errors
/// INVALID_ARGUMENT for an FP16/BF16 output (JSON carries neither, as in Triton); INTERNAL for
/// an output whose data does not match its shape.
pub fn response(response: &InferResponse) -> Result<Vec<u8>, Error> {
    let mut fields: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    let string = |s: &str| {
        let mut out = Vec::with_capacity(s.len() + 2);
        write_str(&mut out, s);
        out
    };
    if !response.id.is_empty() {
        fields.insert("id", string(&response.id));
    }
    fields.insert("model_name", string(&response.model_name));
    fields.insert("model_version", string(&response.model_version));
    for (name, value) in &response.parameters {
        let text = serde_json::to_vec(&value.to_json())
            .map_err(|e| Error::Internal(format!("cannot write JSON: {e}")))?;
        fields.entry(name).or_insert(text);
    }
    for output in &response.outputs {
        if fields.contains_key(output.name.as_str()) {
            continue;
        }
        let mut text = Vec::new();
        tensor_json::encode(&mut text, output)?;
        if output.shape.iter().product::<i64>() == 1 {
            // `[x]` → `x`: one element is written bare.
            text.pop();
            text.remove(0);
        }
        fields.insert(&output.name, text);
    }
    let mut out = Vec::with_capacity(fields.values().map(|v| v.len() + 8).sum::<usize>() + 2);
    out.push(b'{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(&mut out, key);
        out.push(b':');
        out.extend_from_slice(value);
    }
    out.push(b'}');
    Ok(out)
}

#[cfg(test)]
mod tests;
