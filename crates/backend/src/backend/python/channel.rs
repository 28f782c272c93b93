//! The messages between kiln and a Python stub (see `stub.py` for the other end): a 12-byte head
//! (the JSON header's length as a little-endian `u32`, the binary part's as a `u64`), the JSON
//! header, then the data of the tensors the header lists, one after another, whose lengths the
//! header's `sizes` gives.

use crate::core::tensor::{check_bytes_framing, element_count};
use crate::core::{DataType, Tensor};
use bytes::Bytes;
use serde_json::{json, Value};
use std::io::{Read, Write};

/// Largest JSON header a stub may send (its tensor list and messages).
const MAX_HEADER: usize = 64 << 20;
/// Largest binary part a stub may send: the outputs of one execute call.
const MAX_BLOBS: u64 = 16 << 30;

/// A message: its header and the tensor data that follows it.
#[derive(Debug, Default, PartialEq)]
pub struct Message {
    pub header: Value,
    pub blobs: Vec<Bytes>,
}

/// Writes `header` (its `sizes` filled in) and `blobs`.
///
/// # Errors
/// The pipe's.
pub fn send(writer: &mut impl Write, mut header: Value, blobs: &[&[u8]]) -> std::io::Result<()> {
    header["sizes"] = json!(blobs.iter().map(|b| b.len()).collect::<Vec<_>>());
    let encoded = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let total: u64 = blobs.iter().map(|b| b.len() as u64).sum();
    let mut head = Vec::with_capacity(12);
    head.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    head.extend_from_slice(&total.to_le_bytes());
    writer.write_all(&head)?;
    writer.write_all(&encoded)?;
    for blob in blobs {
        writer.write_all(blob)?;
    }
    writer.flush()
}

/// Reads one message.
///
/// # Errors
/// The pipe's (`UnexpectedEof` when the stub has gone), or `InvalidData` for a message that does
/// not parse or is larger than kiln takes.
pub fn receive(reader: &mut impl Read) -> std::io::Result<Message> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let mut head = [0u8; 12];
    reader.read_exact(&mut head)?;
    let header_len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let blob_len = u64::from_le_bytes(head[4..].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER || blob_len > MAX_BLOBS {
        return Err(invalid(format!(
            "a message of {header_len} + {blob_len} bytes is larger than kiln takes"
        )));
    }
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header)?;
    let header: Value = serde_json::from_slice(&header)
        .map_err(|e| invalid(format!("a message header is not JSON: {e}")))?;
    let mut data = vec![0u8; blob_len as usize];
    reader.read_exact(&mut data)?;
    let data = Bytes::from(data);
    let sizes: Vec<u64> = match &header["sizes"] {
        Value::Null => Vec::new(),
        sizes => serde_json::from_value(sizes.clone())
            .map_err(|e| invalid(format!("a message's sizes do not parse: {e}")))?,
    };
    if sizes.iter().try_fold(0u64, |a, &s| a.checked_add(s)) != Some(blob_len) {
        return Err(invalid(
            "a message's sizes do not add up to its data".to_string(),
        ));
    }
    let mut blobs = Vec::with_capacity(sizes.len());
    let mut start = 0usize;
    for size in sizes {
        let end = start + size as usize;
        blobs.push(data.slice(start..end));
        start = end;
    }
    Ok(Message { header, blobs })
}

/// A tensor's description in a header (its data goes in the binary part).
pub fn describe(tensor: &Tensor) -> Value {
    json!({"name": tensor.name, "datatype": tensor.datatype.as_wire(), "shape": tensor.shape})
}

/// The tensor a header's `description` and its `data` make, checked: a known datatype, a shape
/// that fits, as much data as the shape holds.
///
/// # Errors
/// What is wrong, naming the tensor.
pub fn tensor(description: &Value, data: Bytes) -> Result<Tensor, String> {
    let name = description["name"]
        .as_str()
        .ok_or("a tensor without a name")?;
    let datatype = description["datatype"]
        .as_str()
        .and_then(DataType::from_wire)
        .ok_or_else(|| format!("tensor '{name}' has no datatype kiln knows"))?;
    let shape: Vec<i64> = serde_json::from_value(description["shape"].clone())
        .map_err(|_| format!("tensor '{name}' has no shape"))?;
    let count = element_count(&shape).map_err(|e| format!("tensor '{name}': {e}"))?;
    match datatype.element_size() {
        Some(size) if count.checked_mul(size) != Some(data.len()) => {
            return Err(format!(
                "tensor '{name}' of shape {shape:?} holds {} bytes, not {}",
                data.len(),
                count.saturating_mul(size)
            ))
        }
        Some(_) => {}
        None => check_bytes_framing(&data, count).map_err(|e| format!("tensor '{name}': {e}"))?,
    }
    Ok(Tensor::new(name, datatype, shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_go_and_come_back_whole() {
        let mut pipe = Vec::new();
        send(&mut pipe, json!({"op": "execute"}), &[b"abc", b"", b"de"]).unwrap();
        let message = receive(&mut pipe.as_slice()).unwrap();
        assert_eq!(message.header["op"], "execute");
        assert_eq!(message.blobs, [&b"abc"[..], b"", b"de"]);
        assert_eq!(message.header["sizes"], json!([3, 0, 2]));
    }

    #[test]
    fn broken_messages_are_errors_not_allocations() {
        let mut huge = vec![0xff; 4];
        huge.extend_from_slice(&0u64.to_le_bytes());
        let error = receive(&mut huge.as_slice()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        let mut short = Vec::new();
        send(&mut short, json!({}), &[b"abcd"]).unwrap();
        short.truncate(short.len() - 1);
        let error = receive(&mut short.as_slice()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        // Sizes that claim more than the data.
        let header = br#"{"sizes": [5]}"#;
        let mut lying = (header.len() as u32).to_le_bytes().to_vec();
        lying.extend_from_slice(&4u64.to_le_bytes());
        lying.extend_from_slice(header);
        lying.extend_from_slice(b"abcd");
        assert!(receive(&mut lying.as_slice()).is_err());
        assert!(receive(&mut &b"garbage"[..]).is_err());
    }

    #[test]
    fn output_tensors_are_checked_against_their_data() {
        let fp32 = json!({"name": "y", "datatype": "FP32", "shape": [2]});
        let tensor = tensor(&fp32, Bytes::from(vec![0u8; 8])).unwrap();
        assert_eq!((tensor.datatype, tensor.shape), (DataType::Fp32, vec![2]));
        assert_eq!(
            super::tensor(&fp32, Bytes::from(vec![0u8; 7])).unwrap_err(),
            "tensor 'y' of shape [2] holds 7 bytes, not 8"
        );
        let text = json!({"name": "s", "datatype": "BYTES", "shape": [1, 2]});
        let framed = crate::core::tensor::frame_bytes(["a", "bc"]);
        assert!(super::tensor(&text, framed.clone()).is_ok());
        assert_eq!(
            super::tensor(&text, framed.slice(..framed.len() - 1)).unwrap_err(),
            "tensor 's': element 1 declares 2 bytes but only 1 remain"
        );
        for (bad, why) in [
            (
                json!({"datatype": "FP32", "shape": [1]}),
                "a tensor without a name",
            ),
            (
                json!({"name": "y", "datatype": "COMPLEX", "shape": [1]}),
                "tensor 'y' has no datatype kiln knows",
            ),
            (
                json!({"name": "y", "datatype": "FP32"}),
                "tensor 'y' has no shape",
            ),
            (
                json!({"name": "y", "datatype": "FP32", "shape": [-1]}),
                "tensor 'y': shape dimension -1 is negative",
            ),
            (
                json!({"name": "y", "datatype": "FP32", "shape": [1i64 << 40, 1i64 << 40]}),
                "tensor 'y': causes total element count to exceed maximum size of \
                 9223372036854775807",
            ),
        ] {
            assert_eq!(super::tensor(&bad, Bytes::new()).unwrap_err(), why, "{bad}");
        }
    }
}
