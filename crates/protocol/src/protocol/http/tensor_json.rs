//! Tensor `data` in JSON ⇄ the raw tensor layout, for every datatype Triton allows in JSON.
//!
//! Requests: a flat or nested array (flattened row-major, as Triton does) is decoded element by
//! element straight into the raw little-endian buffer; the element count must equal the shape's.
//! Integers must fit their type (Triton silently truncates; a clear error is kinder), floats accept
//! any number and the `NaN` / `Infinity` tokens, BYTES elements are strings. FP16 and BF16 travel
//! only as binary data, as in Triton.
//!
//! Responses: `data` is always a flat array (MLServer's string codec breaks on nested lists).

use super::json::{self, Number, Scalar};
use crate::core::tensor::BytesElements;
use crate::core::{DataType, Error, Tensor};
use crate::invalid_arg;
use bytes::{BufMut, Bytes, BytesMut};

/// Decodes the JSON `data` of input `name` (its source text, already syntax-checked) holding
/// `count` elements of `datatype`.
///
/// # Errors
/// INVALID_ARGUMENT for FP16/BF16, a wrong element count, or an element of the wrong kind or
/// range. Nothing is allocated beyond what the JSON text itself can hold.
pub fn decode(name: &str, datatype: DataType, count: usize, src: &[u8]) -> Result<Bytes, Error> {
    if matches!(datatype, DataType::Fp16 | DataType::Bf16) {
        return Err(invalid_arg!(
            "receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        ));
    }
    // Each element needs at least one character and a separator, so the text bounds the count
    // whatever the (client-controlled) shape claims.
    let plausible = count.min(src.len() / 2 + 1);
    let mut out = BytesMut::with_capacity(plausible * datatype.element_size().unwrap_or(8));
    let mut seen = 0usize;
    let shape_mismatch = || {
        format!("Unable to parse 'data': Shape does not match true shape of 'data' field for input '{name}'")
    };
    json::visit_scalars(src, |scalar| {
        if seen == count {
            return Err(shape_mismatch());
        }
        seen += 1;
        put(&mut out, datatype, scalar).map_err(|expected| {
            format!(
                "Unable to parse 'data': expected {expected} for {datatype} input '{name}', got {}",
                describe(scalar)
            )
        })
    })
    .map_err(|e| match e {
        json::VisitError::Visitor(message) => Error::InvalidArgument(message),
        json::VisitError::Syntax(e) => {
            invalid_arg!("Unable to parse 'data' for input '{name}': {e}")
        }
        // Triton's text (server src/http_server.cc, ReadDataFromJson wrapping
        // ReadDataFromJsonHelper's depth check), frozen in conformance/test_triton_validation.py.
        json::VisitError::TooDeep => invalid_arg!(
            "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit ({})",
            json::MAX_DATA_DEPTH
        ),
    })?;
    if seen != count {
        return Err(Error::InvalidArgument(shape_mismatch()));
    }
    Ok(out.freeze())
}

/// Appends one element; on a mismatch returns what was expected.
fn put(out: &mut BytesMut, datatype: DataType, scalar: Scalar<'_>) -> Result<(), &'static str> {
    const UNSIGNED: &str = "an unsigned integer in range";
    const SIGNED: &str = "a signed integer in range";
    let number = match scalar {
        Scalar::Number(n) => Some(n),
        _ => None,
    };
    let unsigned = |max: u64| number.and_then(Number::as_u64).filter(|&v| v <= max);
    let signed = |min: i64, max: i64| {
        number
            .and_then(Number::as_i64)
            .filter(|&v| (min..=max).contains(&v))
    };
    match datatype {
        DataType::Bool => match scalar {
            Scalar::Bool(b) => out.put_u8(u8::from(b)),
            _ => return Err("true or false"),
        },
        DataType::Uint8 => out.put_u8(unsigned(u8::MAX.into()).ok_or(UNSIGNED)? as u8),
        DataType::Uint16 => out.put_u16_le(unsigned(u16::MAX.into()).ok_or(UNSIGNED)? as u16),
        DataType::Uint32 => out.put_u32_le(unsigned(u32::MAX.into()).ok_or(UNSIGNED)? as u32),
        DataType::Uint64 => out.put_u64_le(unsigned(u64::MAX).ok_or(UNSIGNED)?),
        DataType::Int8 => out.put_i8(signed(i8::MIN.into(), i8::MAX.into()).ok_or(SIGNED)? as i8),
        DataType::Int16 => {
            out.put_i16_le(signed(i16::MIN.into(), i16::MAX.into()).ok_or(SIGNED)? as i16)
        }
        DataType::Int32 => {
            out.put_i32_le(signed(i32::MIN.into(), i32::MAX.into()).ok_or(SIGNED)? as i32)
        }
        DataType::Int64 => out.put_i64_le(signed(i64::MIN, i64::MAX).ok_or(SIGNED)?),
        DataType::Fp32 => out.put_f32_le(number.ok_or("a number")?.as_f64() as f32),
        DataType::Fp64 => out.put_f64_le(number.ok_or("a number")?.as_f64()),
        DataType::Bytes => match scalar {
            Scalar::String(bytes) => {
                let len = u32::try_from(bytes.len()).map_err(|_| "a string under 4 GiB")?;
                out.put_u32_le(len);
                out.put_slice(bytes);
            }
            _ => return Err("a string"),
        },
        DataType::Fp16 | DataType::Bf16 => return Err("binary data"),
    }
    Ok(())
}

/// A short description of an offending element for error messages.
fn describe(scalar: Scalar<'_>) -> String {
    match scalar {
        Scalar::Null => "null".into(),
        Scalar::Bool(b) => b.to_string(),
        Scalar::Number(n) => n.to_string(),
        Scalar::String(_) => "a string".into(),
    }
}

/// Appends the flat JSON array of an output's elements.
///
/// # Errors
/// INVALID_ARGUMENT for FP16/BF16 (binary only, as in Triton); INTERNAL when the data does not
/// match the datatype's layout.
pub fn encode(out: &mut Vec<u8>, tensor: &Tensor) -> Result<(), Error> {
    let name = &tensor.name;
    let malformed = || {
        Error::Internal(format!(
            "output tensor shape does not match size of output for '{name}'"
        ))
    };
    let data = &tensor.data[..];
    if let Some(size) = tensor.datatype.element_size() {
        if data.len() % size != 0 {
            return Err(malformed());
        }
    }
    out.push(b'[');
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !first {
            out.push(b',');
        }
        first = false;
    };
    macro_rules! each {
        ($n:literal, |$b:ident| $write:expr) => {
            for chunk in data.chunks_exact($n) {
                sep(out);
                let $b: [u8; $n] = chunk.try_into().map_err(|_| malformed())?;
                $write;
            }
        };
    }
    match tensor.datatype {
        DataType::Bool => each!(1, |b| out.extend_from_slice(if b[0] != 0 {
            b"true"
        } else {
            b"false"
        })),
        DataType::Uint8 => each!(1, |b| json::write_number(out, Number::Unsigned(b[0].into()))),
        DataType::Uint16 => each!(2, |b| json::write_number(
            out,
            Number::Unsigned(u16::from_le_bytes(b).into())
        )),
        DataType::Uint32 => each!(4, |b| json::write_number(
            out,
            Number::Unsigned(u32::from_le_bytes(b).into())
        )),
        DataType::Uint64 => each!(8, |b| json::write_number(
            out,
            Number::Unsigned(u64::from_le_bytes(b))
        )),
        DataType::Int8 => each!(1, |b| write_signed(out, (b[0] as i8).into())),
        DataType::Int16 => each!(2, |b| write_signed(out, i16::from_le_bytes(b).into())),
        DataType::Int32 => each!(4, |b| write_signed(out, i32::from_le_bytes(b).into())),
        DataType::Int64 => each!(8, |b| write_signed(out, i64::from_le_bytes(b))),
        DataType::Fp32 => each!(4, |b| json::write_f32(out, f32::from_le_bytes(b))),
        DataType::Fp64 => each!(8, |b| json::write_f64(out, f64::from_le_bytes(b))),
        DataType::Bytes => {
            for element in BytesElements::new(data) {
                sep(out);
                json::write_bytes_str(out, element.map_err(|_| malformed())?);
            }
        }
        DataType::Fp16 | DataType::Bf16 => {
            return Err(invalid_arg!(
                "sending {} data via JSON is not supported. Please use the binary data format for output '{name}'",
                tensor.datatype
            ))
        }
    }
    out.push(b']');
    Ok(())
}

fn write_signed(out: &mut Vec<u8>, v: i64) {
    let n = if v < 0 {
        Number::Negative(v)
    } else {
        Number::Unsigned(v as u64)
    };
    json::write_number(out, n);
}

#[cfg(test)]
mod tests;
