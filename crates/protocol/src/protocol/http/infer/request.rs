//! Inference request header (JSON) plus binary tensor data → the engine's [`InferRequest`].
//!
//! Follows Triton's `http_server.cc`: each input carries exactly one of `data`,
//! `parameters.binary_data_size` or `parameters.shared_memory_region`; binary blobs follow the
//! JSON in input order and must be consumed exactly; `binary_data` (per output) and
//! `binary_data_output` (request default) choose how outputs come back and are not passed on.

use super::super::json::{self, Number, Value};
use super::super::tensor_json;
use crate::core::reserved::{self, Reserved};
use crate::core::tensor::{shape_refusal, sized_element_count};
use crate::core::{DataType, Error, InferRequest, ParamValue, Parameters, RequestedOutput, Tensor};
use crate::invalid_arg;
use bytes::Bytes;

/// How each output should come back: binary blob or JSON `data`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputFormats {
    /// For outputs without their own `binary_data` (request `binary_data_output`).
    pub default_binary: bool,
    /// Outputs that set `binary_data` explicitly.
    pub explicit: Vec<(String, bool)>,
}

impl OutputFormats {
    /// Every output binary: Triton's answer to a raw binary request.
    pub fn all_binary() -> OutputFormats {
        OutputFormats {
            default_binary: true,
            explicit: Vec::new(),
        }
    }

    pub fn is_binary(&self, output: &str) -> bool {
        self.explicit
            .iter()
            .find(|(name, _)| name == output)
            .map_or(self.default_binary, |(_, binary)| *binary)
    }
}

/// Parameters of the binary extension, consumed here.
const BINARY_DATA_SIZE: &str = "binary_data_size";
const BINARY_DATA: &str = "binary_data";
const BINARY_DATA_OUTPUT: &str = "binary_data_output";
use crate::engine::shared_memory::REGION as SHARED_MEMORY_REGION;

/// Decodes a request body. `header_length` is the `Inference-Header-Content-Length` (already
/// checked to be within the body and non-zero); without it the whole body is JSON.
///
/// # Errors
/// INVALID_ARGUMENT with Triton's messages for malformed JSON, fields of the wrong type, binary
/// sizes that do not match the body, or `data` that does not match its shape; UNSUPPORTED for
/// shared memory.
pub fn decode(
    model: &str,
    version: &str,
    body: Bytes,
    header_length: Option<usize>,
) -> Result<(InferRequest, OutputFormats), Error> {
    let split = header_length.unwrap_or(body.len()).min(body.len());
    let header = body.slice(..split);
    let mut binary = body.slice(split..);
    let doc = json::parse(&header, Some("data"))
        .map_err(|e| invalid_arg!("failed to parse the request JSON buffer: {e}"))?;
    if doc.as_object().is_none() {
        return Err(invalid_arg!(
            "failed to parse the request JSON buffer: the request must be a JSON object"
        ));
    }
    let id = match doc.get("id") {
        None => String::new(),
        Some(id) => id
            .as_str()
            .ok_or_else(|| invalid_arg!("Unable to parse 'id': expected a string"))?
            .to_string(),
    };
    let mut formats = OutputFormats::default();
    let parameters = request_parameters(doc.get("parameters"), &mut formats)?;
    let inputs = doc
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid_arg!("Unable to parse 'inputs': expected an array"))?;
    let mut tensors = Vec::with_capacity(inputs.len());
    for input in inputs {
        tensors.push(decode_input(model, input, &mut binary)?);
    }
    if !binary.is_empty() {
        return Err(invalid_arg!(
            "unexpected additional input data for model '{model}'"
        ));
    }
    let outputs = match doc.get("outputs") {
        None => Vec::new(),
        Some(outputs) => outputs
            .as_array()
            .ok_or_else(|| invalid_arg!("Unable to parse 'outputs': expected an array"))?
            .iter()
            .map(|output| decode_output(output, &mut formats))
            .collect::<Result<_, _>>()?,
    };
    let request = InferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        id,
        parameters,
        inputs: tensors,
        outputs,
    };
    Ok((request, formats))
}

fn decode_input(model: &str, input: &Value<'_>, binary: &mut Bytes) -> Result<Tensor, Error> {
    if input.as_object().is_none() {
        return Err(invalid_arg!("Unable to parse 'inputs': expected objects"));
    }
    let params = input.get("parameters");
    let has_data = input.get("data").is_some();
    let has_binary = params.and_then(|p| p.get(BINARY_DATA_SIZE)).is_some();
    let has_shm = params.and_then(|p| p.get(SHARED_MEMORY_REGION)).is_some();
    if usize::from(has_data) + usize::from(has_binary) + usize::from(has_shm) != 1 {
        let mut message = String::from(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in \
             'parameters', 'shared_memory_region' in 'parameters'. But",
        );
        if !(has_data || has_binary || has_shm) {
            message.push_str(" no field is set");
        } else {
            message.push_str(" set");
            for (set, field) in [
                (has_data, " 'data'"),
                (has_binary, " 'binary_data_size'"),
                (has_shm, " 'shared_memory_region'"),
            ] {
                if set {
                    message.push_str(field);
                }
            }
        }
        return Err(Error::InvalidArgument(message));
    }
    let name = input
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_arg!("Unable to parse 'name': expected a string"))?
        .to_string();
    let datatype_name = input
        .get("datatype")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_arg!("Unable to parse 'datatype': expected a string"))?;
    // Triton's words (checked against 2.51).
    let datatype = DataType::from_wire(datatype_name)
        .ok_or_else(|| invalid_arg!("invalid datatype for input {name}"))?;
    let shape = shape(input.get("shape"))?;
    let data = if has_shm {
        // The engine reads it out of the region its parameters name.
        Bytes::new()
    } else if has_binary {
        let size = params
            .and_then(|p| p.get(BINARY_DATA_SIZE))
            .and_then(Value::as_u64)
            .ok_or_else(|| {
                invalid_arg!("Unable to parse 'binary_data_size': expected an unsigned integer")
            })?;
        take_binary(model, &name, size, binary)?
    } else {
        // Triton's HTTP frontend checks the count and its byte size before reading `data`.
        let count = sized_element_count(&shape, datatype.element_size())
            .map_err(|e| Error::InvalidArgument(shape_refusal(&e, &name, model, &shape)))?;
        match input.get("data") {
            // Triton does not read `data` of an empty tensor.
            _ if count == 0 => Bytes::new(),
            Some(Value::Raw(text)) => tensor_json::decode(&name, datatype, count, text)?,
            _ => return Err(invalid_arg!("Unable to parse 'data': expected an array")),
        }
    };
    let parameters = match params {
        // binary_data_size is the protocol's, read above.
        Some(p) => tensor_parameters(p, BINARY_DATA_SIZE)?.0,
        None => Parameters::new(),
    };
    Ok(Tensor {
        name,
        datatype,
        shape,
        data,
        parameters,
    })
}

/// The next `size` bytes of binary data, without copying. Without an
/// `Inference-Header-Content-Length` the whole body is JSON and there are none: Triton's
/// message names the bytes missing.
fn take_binary(model: &str, name: &str, size: u64, binary: &mut Bytes) -> Result<Bytes, Error> {
    match usize::try_from(size) {
        Ok(size) if size <= binary.len() => Ok(binary.split_to(size)),
        _ => Err(invalid_arg!(
            "unexpected size for input '{name}', expecting {} additional bytes for model '{model}'",
            size - binary.len() as u64
        )),
    }
}

/// `shape`: an array of non-negative integers (Triton parses them as unsigned).
///
/// An element that is not an unsigned integer (`-5`, `1.5`, `"2"`) is Triton's INTERNAL, 500,
/// in its words: server src/http_server.cc parses each with TritonJson's `IndexAsUInt`, whose
/// errors are INTERNAL, under "Unable to parse 'shape'" (qa/L0_http `test_negative_dimensions`).
/// A shape that is not an array, or a dimension past int64, stays kiln's INVALID_ARGUMENT.
fn shape(value: Option<&Value<'_>>) -> Result<Vec<i64>, Error> {
    let bad =
        || invalid_arg!("Unable to parse 'shape': expected an array of non-negative integers");
    value
        .and_then(Value::as_array)
        .ok_or_else(bad)?
        .iter()
        .map(|d| match d.as_u64() {
            Some(d) => i64::try_from(d).map_err(|_| bad()),
            None => Err(Error::Internal(
                "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as \
                 unsigned-integer"
                    .into(),
            )),
        })
        .collect()
}

/// Request-level parameters: Triton's reserved keys are type-checked, `binary_data_output`
/// is consumed, `triton_*` keys are refused, the rest are passed on.
fn request_parameters(
    value: Option<&Value<'_>>,
    formats: &mut OutputFormats,
) -> Result<Parameters, Error> {
    let Some(value) = value else {
        return Ok(Parameters::new());
    };
    let members = value
        .as_object()
        .ok_or_else(|| invalid_arg!("failed to get request params: expected an object"))?;
    let mut parameters = Parameters::new();
    for (key, value) in members {
        let unable = || invalid_arg!("Unable to parse '{key}'");
        if &**key == BINARY_DATA_OUTPUT {
            formats.default_binary = value.as_bool().ok_or_else(unable)?;
            continue;
        }
        let param = match reserved::reserved(key) {
            Some(Reserved::SequenceFlag) => ParamValue::Bool(value.as_bool().ok_or_else(unable)?),
            Some(Reserved::Priority | Reserved::Timeout) => {
                ParamValue::Uint64(value.as_u64().ok_or_else(unable)?)
            }
            Some(Reserved::SequenceId) => match value {
                Value::String(s) => ParamValue::String(s.to_string()),
                _ => ParamValue::Uint64(value.as_u64().ok_or_else(unable)?),
            },
            // Triton's REST front end refuses every such key, `triton_enable_empty_final_response`
            // too (server src/http_server.cc, ParseJsonTritonParams); gRPC allows that one.
            _ if reserved::has_triton_prefix(key) => {
                return Err(invalid_arg!(
                    "parameter keys starting with 'triton_' are reserved for Triton usage and \
                     should not be specified."
                ))
            }
            _ => param_value(key, value)?,
        };
        parameters.insert(key.to_string(), param);
    }
    Ok(parameters)
}

/// Parameters of an input or requested output, passed on as they are, except the protocol's own
/// `consumed` (`binary_data_size`, `binary_data`), whose value is returned apart (the last one
/// given, as for any repeated key). A tensor whose only parameter is that one gets an empty map,
/// which allocates nothing.
fn tensor_parameters(
    value: &Value<'_>,
    consumed: &str,
) -> Result<(Parameters, Option<ParamValue>), Error> {
    let members = value
        .as_object()
        .ok_or_else(|| invalid_arg!("Unable to parse 'parameters': expected an object"))?;
    let mut parameters = Parameters::new();
    let mut own = None;
    for (key, value) in members {
        let value = param_value(key, value)?;
        if key == consumed {
            own = Some(value);
        } else {
            parameters.insert(key.to_string(), value);
        }
    }
    Ok((parameters, own))
}

/// A JSON parameter value: string, boolean, integer or other number.
fn param_value(key: &str, value: &Value<'_>) -> Result<ParamValue, Error> {
    Ok(match value {
        Value::String(s) => ParamValue::String(s.to_string()),
        Value::Bool(b) => ParamValue::Bool(*b),
        Value::Number(Number::Unsigned(v)) => match i64::try_from(*v) {
            Ok(v) => ParamValue::Int64(v),
            Err(_) => ParamValue::Uint64(*v),
        },
        Value::Number(Number::Negative(v)) => ParamValue::Int64(*v),
        Value::Number(Number::Float(v)) => ParamValue::Double(*v),
        _ => {
            return Err(invalid_arg!(
                "parameter '{key}' has invalid type. It should be either 'int', 'bool', 'float' or 'string'."
            ))
        }
    })
}

fn decode_output(
    output: &Value<'_>,
    formats: &mut OutputFormats,
) -> Result<RequestedOutput, Error> {
    let name = output
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_arg!("Unable to parse 'name': expected a string"))?
        .to_string();
    let (parameters, binary) = match output.get("parameters") {
        Some(p) => tensor_parameters(p, BINARY_DATA)?,
        None => (Parameters::new(), None),
    };
    // An output written to shared memory has no data in the body, binary or classified.
    if parameters.contains_key(SHARED_MEMORY_REGION) {
        if parameters.contains_key("classification") {
            return Err(invalid_arg!(
                "Output can't set both 'shared_memory_region' and 'classification'"
            ));
        }
        if binary == Some(ParamValue::Bool(true)) {
            return Err(invalid_arg!(
                "Output can't set both 'shared_memory_region' and 'binary_data'"
            ));
        }
    }
    if let Some(binary) = binary {
        let ParamValue::Bool(binary) = binary else {
            return Err(invalid_arg!(
                "Unable to parse 'binary_data': expected a boolean"
            ));
        };
        formats.explicit.push((name.clone(), binary));
    }
    if let Some(count) = parameters.get("classification") {
        // Triton reads the count as an unsigned integer.
        if !matches!(count, ParamValue::Int64(k) if *k >= 0)
            && !matches!(count, ParamValue::Uint64(_))
        {
            return Err(invalid_arg!(
                "Unable to set 'classification': expected an unsigned integer"
            ));
        }
    }
    Ok(RequestedOutput { name, parameters })
}
