//! A tensor as Triton's TENSORS trace level writes it: `{"id":N,"activity":"...","tensor":
//! {"name":"...","data":"1,2,3","shape":"1,3","dtype":"FP32"}}`, data and shape as
//! comma-separated text. FP16 and BF16 data are left empty, as Triton leaves them; BYTES elements
//! are quoted strings.

use crate::core::tensor::BytesElements;
use crate::core::{DataType, Tensor};
use std::fmt::Write as _;

pub fn write(out: &mut String, id: u64, activity: &str, tensor: &Tensor) {
    let mut data = String::new();
    format_data(&mut data, tensor);
    let shape = tensor
        .shape
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let _ = write!(
        out,
        r#"{{"id":{id},"activity":"{activity}","tensor":{{"name":{},"data":{},"shape":"{shape}","dtype":"{}"}}}}"#,
        serde_json::Value::from(tensor.name.as_str()),
        serde_json::Value::from(data),
        tensor.datatype.as_wire(),
    );
}

fn format_data(out: &mut String, tensor: &Tensor) {
    let bytes = &tensor.data[..];
    fn join<const N: usize, T: std::fmt::Display>(
        out: &mut String,
        bytes: &[u8],
        decode: fn([u8; N]) -> T,
    ) {
        for (i, chunk) in bytes.chunks_exact(N).enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{}", decode(chunk.try_into().expect("chunks of N")));
        }
    }
    match tensor.datatype {
        DataType::Bool => join(out, bytes, |[b]: [u8; 1]| u8::from(b != 0)),
        DataType::Uint8 => join(out, bytes, u8::from_le_bytes),
        DataType::Uint16 => join(out, bytes, u16::from_le_bytes),
        DataType::Uint32 => join(out, bytes, u32::from_le_bytes),
        DataType::Uint64 => join(out, bytes, u64::from_le_bytes),
        DataType::Int8 => join(out, bytes, i8::from_le_bytes),
        DataType::Int16 => join(out, bytes, i16::from_le_bytes),
        DataType::Int32 => join(out, bytes, i32::from_le_bytes),
        DataType::Int64 => join(out, bytes, i64::from_le_bytes),
        DataType::Fp32 => join(out, bytes, f32::from_le_bytes),
        DataType::Fp64 => join(out, bytes, f64::from_le_bytes),
        DataType::Fp16 | DataType::Bf16 => {}
        DataType::Bytes => {
            for (i, element) in BytesElements::new(bytes).enumerate() {
                let Ok(element) = element else { break };
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "\"{}\"", String::from_utf8_lossy(element));
            }
        }
    }
}
