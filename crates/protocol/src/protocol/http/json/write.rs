//! Writing JSON text, with Triton's spellings for non-finite numbers.

use super::Number;
use std::io::Write as _;

/// Appends `s` as a JSON string.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    write_bytes_str(out, s.as_bytes());
}

/// Appends arbitrary bytes (a BYTES element) as a JSON string the way Triton writes one: quotes,
/// backslashes and control characters escaped as rapidjson escapes them (`\n`, `\b`, ..., else
/// `\u001F` with upper-case digits; NUL as `\u0000`), every other byte as it is.
/// Bytes that are not UTF-8 stay as they are too, as rapidjson's writer (which Triton uses,
/// without encoding validation) copies them: such a body is not strictly UTF-8, and a client that
/// wants them reads it leniently or asks for the output as binary data.
pub fn write_bytes_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    let mut run_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run_start..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04X}");
        } else {
            out.extend_from_slice(escape);
        }
        run_start = i + 1;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

/// Appends an integer, formatted in place (no `to_string` allocation).
pub fn write_integer(out: &mut Vec<u8>, value: impl std::fmt::Display) {
    let _ = write!(out, "{value}");
}

/// Appends a double the way Triton writes it: shortest round-trip form, `NaN`, `Infinity`,
/// `-Infinity`.
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if v.is_infinite() {
        out.extend_from_slice(if v < 0.0 { b"-Infinity" } else { b"Infinity" });
    } else {
        // `{:?}` is the shortest representation that reads back to the same value, with an
        // exponent for very large or small magnitudes: always a valid JSON number.
        let _ = write!(out, "{v:?}");
    }
}

/// Appends a float as its shortest single-precision form (reads back to the same f32).
pub fn write_f32(out: &mut Vec<u8>, v: f32) {
    if v.is_finite() {
        let _ = write!(out, "{v:?}");
    } else {
        write_f64(out, v.into());
    }
}

/// Appends a number.
pub fn write_number(out: &mut Vec<u8>, n: Number) {
    match n {
        Number::Unsigned(v) => {
            let _ = write!(out, "{v}");
        }
        Number::Negative(v) => {
            let _ = write!(out, "{v}");
        }
        Number::Float(v) => write_f64(out, v),
    }
}
