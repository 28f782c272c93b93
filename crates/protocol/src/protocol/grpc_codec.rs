//! The codec of the generated gRPC services (`build.rs` names it): prost's, except that what
//! decoding a received message would allocate is estimated from its wire bytes before prost
//! builds any of it.
//!
//! Why: prost builds every element of a repeated field as it meets it, and an element costs far
//! more decoded than on the wire. An empty `inputs` entry is two bytes (`2a 00`) and a
//! 300-byte struct (twice that while its `Vec` grows), so 47 KB of gzip (24 million entries)
//! asked for 5 GB. The estimate walks the field tags only (no allocation, no copy: a few
//! nanoseconds per field, and tensor data is one field), guided by the message descriptors, and
//! charges each element of a repeated message or string field (a tensor, a parameter, a
//! requested output, a raw input) the memory its Rust struct takes, twice over for the growth
//! of its `Vec` or map. Past `--grpc-max-decode-bytes` the message is refused with
//! RESOURCE_EXHAUSTED. What is bounded is memory, not a count: a message of ten million BYTES
//! strings decodes (Triton answers it), one of ten million empty tensors does not.
//!
//! Not charged, since they cost at most a few times their wire bytes, which the size caps
//! bound: packed numbers (at most 8 bytes per wire byte), string and bytes payloads (the bytes
//! themselves; a `Bytes` field is a slice of the received buffer), and the elements of
//! `contents.bytes_contents`, which decode into one buffer in Triton's BYTES layout (4 bytes of
//! length for the 2 or more of tag and length on the wire; see `crate::proto::contents`).
//! Malformed bytes are left for prost to report.

use crate::proto::inference::{
    model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
    InferParameter, ModelRepositoryParameter,
};
use prost::{Message, Name};
use prost_reflect::{Kind, MessageDescriptor};
use std::any::TypeId;
use std::collections::HashMap;
use std::mem::size_of;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// `--grpc-max-decode-bytes`, set once at start-up (the generated services make their codec
/// with `Default`, so it cannot be handed to them).
static MAX_DECODE_BYTES: AtomicUsize =
    AtomicUsize::new(super::limits::DEFAULT_GRPC_MAX_DECODE_BYTES);

/// Sets the decode budget of every message decoded from now on.
pub fn set_max_decode_bytes(max: usize) {
    MAX_DECODE_BYTES.store(max, Ordering::Relaxed);
}

/// Nesting followed by the estimate; deeper messages are left to prost's own recursion limit.
const MAX_DEPTH: usize = 32;

/// What an element of a repeated message field costs when its Rust struct is not in
/// [`struct_size`]: more than any struct of the protos' request messages.
const UNKNOWN_STRUCT_BYTES: usize = 1024;

/// A `String` or `Bytes` of a repeated string or bytes field (the larger of the two).
const STRING_BYTES: usize = size_of::<bytes::Bytes>();

/// A map entry beyond its key and value: hashbrown's control byte and spare capacity.
const MAP_ENTRY_OVERHEAD: usize = 16;

/// prost's codec with [`LimitedDecoder`].
#[derive(Debug)]
pub struct LimitedCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for LimitedCodec<T, U> {
    fn default() -> Self {
        LimitedCodec(ProstCodec::default())
    }
}

impl<T, U> Codec for LimitedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Name + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LimitedDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        self.0.encoder()
    }

    fn decoder(&mut self) -> LimitedDecoder<U> {
        LimitedDecoder {
            inner: self.0.decoder(),
            message: index_of::<U>(),
            max_bytes: MAX_DECODE_BYTES.load(Ordering::Relaxed),
        }
    }
}

/// Estimates what a message's decoding takes, then decodes it with prost.
#[derive(Debug)]
pub struct LimitedDecoder<U> {
    inner: ProstDecoder<U>,
    /// `U` in [`schema`]; `None` for a type it does not know (nothing is estimated).
    message: Option<usize>,
    max_bytes: usize,
}

impl<U: Message + Default> Decoder for LimitedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if let Some(message) = self.message {
            // The whole message is in one piece: tonic buffers it before decoding.
            check_decode_cost(message, bytes::Buf::chunk(buf), self.max_bytes)?;
        }
        self.inner.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// What the estimate needs to know of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// A message field: followed into; each element charged `cost` bytes (0 when singular:
    /// prost merges a repeated singular field into one struct).
    Message { index: usize, cost: usize },
    /// A repeated string or bytes field: each element charged its struct.
    Strings,
}

/// Every message of the protos, by index, with the fields the estimate looks at (sorted by
/// number).
#[derive(Debug, Default)]
pub struct Schema {
    messages: Vec<Vec<(u32, Field)>>,
    by_name: HashMap<String, usize>,
}

/// The Rust struct of a message that arrives as an element of a repeated field or map of a
/// request: its size, for the estimate.
fn struct_size(full_name: &str) -> Option<usize> {
    Some(match full_name {
        "inference.ModelInferRequest.InferInputTensor" => size_of::<InferInputTensor>(),
        "inference.ModelInferRequest.InferRequestedOutputTensor" => {
            size_of::<InferRequestedOutputTensor>()
        }
        "inference.InferParameter" => size_of::<InferParameter>(),
        "inference.ModelRepositoryParameter" => size_of::<ModelRepositoryParameter>(),
        _ => return None,
    })
}

/// What one element of a repeated (or map) field of messages costs decoded: its struct (a map
/// entry: its key and value, and the table's overhead), twice over for the growth of its `Vec`
/// or table.
fn element_cost(element: &MessageDescriptor, map: bool) -> usize {
    let size = |message: &MessageDescriptor| {
        struct_size(message.full_name()).unwrap_or(UNKNOWN_STRUCT_BYTES)
    };
    let one = if map {
        let value = element.map_entry_value_field();
        let value = match value.kind() {
            Kind::Message(message) => size(&message),
            _ => STRING_BYTES,
        };
        STRING_BYTES + value + MAP_ENTRY_OVERHEAD
    } else {
        size(element)
    };
    2 * one
}

impl Schema {
    fn index(&self, full_name: &str) -> Option<usize> {
        self.by_name.get(full_name).copied()
    }

    fn field(&self, message: usize, number: u32) -> Option<Field> {
        let fields = &self.messages[message];
        fields
            .binary_search_by_key(&number, |(n, _)| *n)
            .ok()
            .map(|at| fields[at].1)
    }

    fn from_pool(pool: &prost_reflect::DescriptorPool) -> Schema {
        let by_name: HashMap<String, usize> = pool
            .all_messages()
            .enumerate()
            .map(|(index, message)| (message.full_name().to_string(), index))
            .collect();
        let messages = pool
            .all_messages()
            .map(|message| {
                let framed = message.full_name() == crate::proto::contents::FRAMED_MESSAGE;
                let mut fields: Vec<(u32, Field)> = message
                    .fields()
                    .filter_map(|field| {
                        let repeated = field.is_list() || field.is_map();
                        let kind = match field.kind() {
                            Kind::Message(nested) => Field::Message {
                                index: *by_name.get(nested.full_name())?,
                                cost: if repeated {
                                    element_cost(&nested, field.is_map())
                                } else {
                                    0
                                },
                            },
                            Kind::Bytes
                                if framed
                                    && field.number() == crate::proto::contents::FRAMED_FIELD =>
                            {
                                return None
                            }
                            Kind::String | Kind::Bytes if repeated => Field::Strings,
                            _ => return None,
                        };
                        Some((field.number(), kind))
                    })
                    .collect();
                fields.sort_by_key(|(number, _)| *number);
                fields
            })
            .collect();
        Schema { messages, by_name }
    }
}

/// `U`'s index in [`schema`], remembered by type: its full name is a `String` built on each
/// call, and hashing it cost as much as the estimate itself.
fn index_of<U: Name + 'static>() -> Option<usize> {
    type Cache = RwLock<HashMap<TypeId, Option<usize>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let id = TypeId::of::<U>();
    if let Some(found) = cache
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
    {
        return *found;
    }
    let found = schema().index(&U::full_name());
    cache
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, found);
    found
}

/// The schema of the compiled protos, built once.
pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema::from_pool(crate::proto::descriptor_pool()))
}

/// The estimate went past the budget.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget;

/// Estimates the bytes that decoding `bytes`, a `message`, allocates beyond the message's own
/// bytes, against `max`.
///
/// # Errors
/// [`OverBudget`] past `max`. Malformed bytes end the estimate without error.
pub fn decode_cost(
    schema: &Schema,
    message: usize,
    bytes: &[u8],
    max: usize,
) -> Result<usize, OverBudget> {
    let mut left = max;
    walk(schema, message, bytes, 0, &mut left)?;
    Ok(max - left)
}

/// Checks that decoding `bytes`, a message of type `U`, takes at most `max` bytes beyond them.
///
/// # Errors
/// RESOURCE_EXHAUSTED naming the flag past `max`.
pub fn check_decode_cost_of<U: Name + 'static>(bytes: &[u8], max: usize) -> Result<(), Status> {
    match index_of::<U>() {
        Some(message) => check_decode_cost(message, bytes, max),
        None => Ok(()),
    }
}

fn check_decode_cost(message: usize, bytes: &[u8], max: usize) -> Result<(), Status> {
    decode_cost(schema(), message, bytes, max)
        .map(|_| ())
        .map_err(|OverBudget| {
            Status::resource_exhausted(format!(
                "decoding the message would take more than {max} bytes of memory for its \
                 tensors, parameters and strings; the limit is --grpc-max-decode-bytes"
            ))
        })
}

/// The index of a message type by its full name (`inference.ModelInferRequest`).
pub fn message_index(schema: &Schema, full_name: &str) -> Option<usize> {
    schema.index(full_name)
}

fn walk(
    schema: &Schema,
    message: usize,
    mut bytes: &[u8],
    depth: usize,
    left: &mut usize,
) -> Result<(), OverBudget> {
    while !bytes.is_empty() {
        let Some(key) = varint(&mut bytes) else {
            return Ok(());
        };
        let skip = match key & 7 {
            0 => {
                if varint(&mut bytes).is_none() {
                    return Ok(());
                }
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let Some(len) = varint(&mut bytes).and_then(|l| usize::try_from(l).ok()) else {
                    return Ok(());
                };
                let Some(body) = bytes.get(..len) else {
                    return Ok(());
                };
                match u32::try_from(key >> 3)
                    .ok()
                    .and_then(|n| schema.field(message, n))
                {
                    Some(Field::Message { index, cost }) => {
                        take(left, cost)?;
                        if depth < MAX_DEPTH {
                            walk(schema, index, body, depth + 1, left)?;
                        }
                    }
                    Some(Field::Strings) => take(left, 2 * STRING_BYTES)?,
                    None => {}
                }
                len
            }
            // Groups (3, 4) and unknown wire types: prost refuses them.
            _ => return Ok(()),
        };
        let Some(rest) = bytes.get(skip..) else {
            return Ok(());
        };
        bytes = rest;
    }
    Ok(())
}

/// `cost` bytes more, if the budget allows.
fn take(left: &mut usize, cost: usize) -> Result<(), OverBudget> {
    *left = left.checked_sub(cost).ok_or(OverBudget)?;
    Ok(())
}

/// Reads a base-128 varint; `None` when truncated or longer than 10 bytes.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::{InferTensorContents, ModelInferRequest};

    fn cost(request: &ModelInferRequest, max: usize) -> Result<usize, OverBudget> {
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        decode_cost(schema(), index, &request.encode_to_vec(), max)
    }

    fn tensor(name: &str) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            ..Default::default()
        }
    }

    const TENSOR: usize = 2 * size_of::<InferInputTensor>();
    const OUTPUT: usize = 2 * size_of::<InferRequestedOutputTensor>();
    const PARAMETER: usize = 2 * (STRING_BYTES + size_of::<InferParameter>() + MAP_ENTRY_OVERHEAD);

    #[test]
    fn charges_tensors_parameters_and_strings_at_every_level() {
        let mut input = tensor("INPUT0");
        input
            .parameters
            .insert("p".into(), InferParameter::default());
        input.contents = Some(InferTensorContents {
            bytes_contents: vec![bytes::Bytes::new(); 3].into(),
            fp32_contents: vec![1.0; 1000],
            ..Default::default()
        });
        let request = ModelInferRequest {
            model_name: "add_sub".into(),
            inputs: vec![input, tensor("INPUT1")],
            outputs: vec![InferRequestedOutputTensor::default()],
            raw_input_contents: vec![bytes::Bytes::from_static(&[0; 64])],
            parameters: [("q".to_string(), InferParameter::default())].into(),
            ..Default::default()
        };
        // 2 inputs, 2 parameters, 1 output, 1 raw input; the 3 BYTES elements (framed) and the
        // 1000 packed floats (one field) cost nothing beyond their bytes.
        let expected = 2 * TENSOR + 2 * PARAMETER + OUTPUT + 2 * STRING_BYTES;
        assert_eq!(cost(&request, usize::MAX), Ok(expected));
        assert_eq!(cost(&request, expected), Ok(expected));
        assert_eq!(cost(&request, expected - 1), Err(OverBudget));
    }

    #[test]
    fn the_struct_sizes_are_what_prost_builds() {
        // A tensor's struct (name, datatype, shape, parameters, contents) is a few hundred
        // bytes; the table must know it, not fall back to the unknown size.
        for name in [
            "inference.ModelInferRequest.InferInputTensor",
            "inference.ModelInferRequest.InferRequestedOutputTensor",
            "inference.InferParameter",
            "inference.ModelRepositoryParameter",
        ] {
            let size = struct_size(name).unwrap();
            assert!(size > 0 && size < UNKNOWN_STRUCT_BYTES, "{name}: {size}");
            assert!(schema().index(name).is_some(), "{name}");
        }
    }

    #[test]
    fn empty_entries_are_charged_before_any_is_built() {
        // What the hostile client sent: `2a 00` (an empty `inputs` entry) over and over.
        let wire = [0x2a, 0x00].repeat(100_000);
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        assert_eq!(
            decode_cost(schema(), index, &wire, 100_000 * TENSOR - 1),
            Err(OverBudget)
        );
        assert_eq!(
            decode_cost(schema(), index, &wire, usize::MAX),
            Ok(100_000 * TENSOR)
        );
        // 8 million of them (the hostile suite's 16 MB message) pass no sane budget.
        const { assert!(8_000_000 * TENSOR > 4 << 30) };
    }

    #[test]
    fn ten_million_bytes_strings_cost_only_their_tensor() {
        // Triton's QA (L0_grpc test_bytes_contents_many_elements_serialization): 10,485,760
        // one-byte strings in `bytes_contents`, 31 MB on the wire.
        let strings: Vec<u8> = [0x42, 0x01, b'A'].repeat(10 * 1024 * 1024);
        let mut contents = Vec::new();
        prost::encoding::encode_key(5, prost::encoding::WireType::LengthDelimited, &mut contents);
        let mut input = tensor("INPUT0").encode_to_vec();
        prost::encoding::encode_varint(strings.len() as u64, &mut contents);
        contents.extend_from_slice(&strings);
        input.extend_from_slice(&contents);
        let mut wire = Vec::new();
        prost::encoding::encode_key(5, prost::encoding::WireType::LengthDelimited, &mut wire);
        prost::encoding::encode_varint(input.len() as u64, &mut wire);
        wire.extend_from_slice(&input);
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        assert_eq!(
            decode_cost(schema(), index, &wire, DEFAULT_BUDGET),
            Ok(TENSOR)
        );
        let decoded = ModelInferRequest::decode(&wire[..]).unwrap();
        let strings = &decoded.inputs[0].contents.as_ref().unwrap().bytes_contents;
        assert_eq!(strings.len(), 10 * 1024 * 1024);
    }

    const DEFAULT_BUDGET: usize = crate::protocol::limits::DEFAULT_GRPC_MAX_DECODE_BYTES;

    #[test]
    fn malformed_bytes_end_the_estimate_for_prost_to_refuse() {
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        for wire in [&[0x2a, 0x05, 0x0a][..], &[0xff; 12], &[0x2b], &[0x2a]] {
            assert!(decode_cost(schema(), index, wire, 10_000).is_ok());
        }
    }

    #[test]
    fn every_service_message_is_known() {
        for name in [
            "inference.ModelInferRequest",
            "inference.RepositoryModelLoadRequest",
            "inference.TraceSettingRequest",
            "inference.LogSettingsRequest",
        ] {
            assert!(message_index(schema(), name).is_some(), "{name}");
        }
    }
}
