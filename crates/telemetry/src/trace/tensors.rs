//! A tensor as Triton's TENSORS trace level writes it: `{"id":N,"activity":"...","tensor":
//! {"name":"...","data":"1,2,3","shape":"1,3","dtype":"FP32"}}`, data and shape as
//! comma-separated text. FP16 and BF16 data are left empty, as Triton leaves them; BYTES elements
//! are quoted strings. A tensor's text stops after [`MAX_TEXT`] bytes with `...` (Triton writes
//! it all, which for a large tensor means gigabytes held in memory for one traced request).

use crate::core::tensor::BytesElements;
use crate::core::{DataType, Tensor};
use std::fmt::Write as _;

/// Text kept of one tensor's data.
pub const MAX_TEXT: usize = 1 << 20;

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
            if out.len() >= MAX_TEXT {
                out.push_str("...");
                return;
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
                if out.len() >= MAX_TEXT {
                    out.push_str("...");
                    break;
                }
                let shown = &element[..element.len().min(MAX_TEXT)];
                let _ = write!(out, "\"{}\"", String::from_utf8_lossy(shown));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn text(datatype: DataType, data: Vec<u8>) -> String {
        let elements = data.len() / datatype.element_size().unwrap_or(1);
        let tensor = Tensor::new("T", datatype, vec![elements as i64], Bytes::from(data));
        let mut out = String::new();
        format_data(&mut out, &tensor);
        out
    }

    #[test]
    fn values_print_as_triton_prints_them() {
        assert_eq!(
            text(
                DataType::Int32,
                [-1i32, 7].iter().flat_map(|v| v.to_le_bytes()).collect()
            ),
            "-1,7"
        );
        assert_eq!(text(DataType::Bool, vec![0, 3]), "0,1");
        assert_eq!(text(DataType::Fp16, vec![0; 4]), "");
        let framed: Vec<u8> = [&2u32.to_le_bytes()[..], b"hi", &0u32.to_le_bytes()].concat();
        let tensor = Tensor::new("S", DataType::Bytes, vec![2], Bytes::from(framed));
        let mut out = String::new();
        format_data(&mut out, &tensor);
        assert_eq!(out, "\"hi\",\"\"");
    }

    #[test]
    fn large_tensors_are_cut_short() {
        let out = text(DataType::Fp64, vec![0; 8 << 20]);
        assert!(
            out.len() < MAX_TEXT + 64 && out.ends_with(",..."),
            "{}",
            out.len()
        );
        let huge = [&((4u32 << 20).to_le_bytes())[..], &vec![b'x'; 4 << 20]].concat();
        let tensor = Tensor::new("S", DataType::Bytes, vec![1], Bytes::from(huge));
        let mut out = String::new();
        format_data(&mut out, &tensor);
        assert!(out.len() <= MAX_TEXT + 2);
    }
}
