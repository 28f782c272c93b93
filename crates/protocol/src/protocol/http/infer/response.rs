//! The engine's [`InferResponse`] → a REST body: the JSON header, then the binary blobs of the
//! outputs asked for as binary, in output order (Triton's `FinalizeResponse`).

use super::super::json;
use super::super::tensor_json;
use super::request::OutputFormats;
use crate::core::{Error, InferResponse, ParamValue, Parameters};
use crate::engine::shared_memory;

/// An encoded response body.
#[derive(Debug)]
pub struct Encoded {
    pub body: Vec<u8>,
    /// Length of the JSON header when non-empty binary blobs follow it; the response then has
    /// `Content-Type: application/octet-stream` and `Inference-Header-Content-Length`.
    pub header_length: Option<usize>,
}

/// Encodes a response. `model_name` and `model_version` are always present, `id` when set;
/// JSON `data` is flat; binary outputs carry `binary_data_size` (0-byte ones add no blob); outputs
/// written to shared memory carry neither, nor any parameters.
///
/// # Errors
/// INVALID_ARGUMENT for FP16/BF16 outputs asked for as JSON (Triton's rule), INTERNAL for output
/// data that does not match its datatype.
pub fn encode(response: &InferResponse, formats: &OutputFormats) -> Result<Encoded, Error> {
    let mut out = Vec::with_capacity(256);
    out.push(b'{');
    if !response.id.is_empty() {
        out.extend_from_slice(b"\"id\":");
        json::write_str(&mut out, &response.id);
        out.push(b',');
    }
    out.extend_from_slice(b"\"model_name\":");
    json::write_str(&mut out, &response.model_name);
    out.extend_from_slice(b",\"model_version\":");
    json::write_str(&mut out, &response.model_version);
    if !response.parameters.is_empty() {
        out.extend_from_slice(b",\"parameters\":");
        write_parameters(&mut out, &response.parameters, None);
    }
    out.extend_from_slice(b",\"outputs\":[");
    let mut blobs = Vec::new();
    for (index, output) in response.outputs.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"name\":");
        json::write_str(&mut out, &output.name);
        out.extend_from_slice(b",\"datatype\":");
        json::write_str(&mut out, output.datatype.as_wire());
        out.extend_from_slice(b",\"shape\":[");
        for (i, dim) in output.shape.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json::write_integer(&mut out, dim);
        }
        out.push(b']');
        // An output written to shared memory goes without data and without parameters, as
        // Triton writes it (Triton's C++ client reads `binary_data_size` from any `parameters`).
        let in_shared_memory = output.parameters.contains_key(shared_memory::REGION);
        let binary = !in_shared_memory && formats.is_binary(&output.name);
        let size = binary.then_some(output.data.len());
        if !in_shared_memory && (size.is_some() || !output.parameters.is_empty()) {
            out.extend_from_slice(b",\"parameters\":");
            write_parameters(&mut out, &output.parameters, size);
        }
        if binary {
            if !output.data.is_empty() {
                blobs.push(&output.data);
            }
        } else if !in_shared_memory {
            out.extend_from_slice(b",\"data\":");
            tensor_json::encode(&mut out, output)?;
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    if blobs.is_empty() {
        return Ok(Encoded {
            body: out,
            header_length: None,
        });
    }
    let header_length = out.len();
    out.reserve_exact(blobs.iter().map(|b| b.len()).sum());
    for blob in blobs {
        out.extend_from_slice(blob);
    }
    Ok(Encoded {
        body: out,
        header_length: Some(header_length),
    })
}

/// Writes a parameters object, with `binary_data_size` added last when given.
fn write_parameters(out: &mut Vec<u8>, parameters: &Parameters, binary_size: Option<usize>) {
    out.push(b'{');
    // Sorted keys keep responses byte-for-byte reproducible (the map itself is unordered).
    let mut keys: Vec<&String> = parameters.keys().collect();
    keys.sort();
    let mut first = true;
    for key in keys {
        if !first {
            out.push(b',');
        }
        first = false;
        json::write_str(out, key);
        out.push(b':');
        match &parameters[key] {
            ParamValue::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            ParamValue::Int64(v) => json::write_integer(out, v),
            ParamValue::Uint64(v) => json::write_integer(out, v),
            ParamValue::Double(v) => json::write_f64(out, *v),
            ParamValue::String(s) => json::write_str(out, s),
        }
    }
    if let Some(size) = binary_size {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(b"\"binary_data_size\":");
        json::write_integer(out, size);
    }
    out.push(b'}');
}
