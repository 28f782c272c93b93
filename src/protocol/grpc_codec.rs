//! The codec of the generated gRPC services (`build.rs` names it): prost's, except that a
//! received message's entries are counted in its wire bytes before prost builds any of them.
//!
//! Why: prost builds every element of a repeated field as it meets it, and an element costs far
//! more decoded than on the wire. An empty `inputs` entry is two bytes (`2a 00`) and a
//! 300-byte struct, so 47 KB of gzip (24 million entries) asked for 5 GB. The count walks the
//! field tags only (no allocation, no copy: a few nanoseconds per field, and tensor data is one
//! field), guided by the message descriptors, and refuses the message with RESOURCE_EXHAUSTED
//! past `--grpc-max-message-entries`. An entry is an element of a repeated or map field that
//! holds messages (a tensor, a parameter, a requested output) or strings and bytes (a raw input,
//! a BYTES element of `contents`); packed numbers cost at most 8 bytes per wire byte and are left
//! to the size caps. Malformed bytes are left for prost to report.

use prost::{Message, Name};
use prost_reflect::Kind;
use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// `--grpc-max-message-entries`, set once at start-up (the generated services make their codec
/// with `Default`, so it cannot be handed to them).
static MAX_ENTRIES: AtomicUsize = AtomicUsize::new(super::limits::DEFAULT_GRPC_MAX_MESSAGE_ENTRIES);

/// Sets the entry cap of every message decoded from now on.
pub fn set_max_entries(max: usize) {
    MAX_ENTRIES.store(max, Ordering::Relaxed);
}

/// Nesting followed by the count; deeper messages are left to prost's own recursion limit.
const MAX_DEPTH: usize = 32;

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
            max_entries: MAX_ENTRIES.load(Ordering::Relaxed),
        }
    }
}

/// Counts a message's entries, then decodes it with prost.
#[derive(Debug)]
pub struct LimitedDecoder<U> {
    inner: ProstDecoder<U>,
    /// `U` in [`schema`]; `None` for a type it does not know (nothing is counted).
    message: Option<usize>,
    max_entries: usize,
}

impl<U: Message + Default> Decoder for LimitedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if let Some(message) = self.message {
            // The whole message is in one piece: tonic buffers it before decoding.
            check_entries(message, bytes::Buf::chunk(buf), self.max_entries)?;
        }
        self.inner.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// What the count needs to know of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// A message field: followed into; each element counted when `repeated`.
    Message { index: usize, repeated: bool },
    /// A repeated string or bytes field: each element counted.
    Strings,
}

/// Every message of the protos, by index, with the fields the count looks at (sorted by number).
#[derive(Debug, Default)]
pub struct Schema {
    messages: Vec<Vec<(u32, Field)>>,
    by_name: HashMap<String, usize>,
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
                let mut fields: Vec<(u32, Field)> = message
                    .fields()
                    .filter_map(|field| {
                        let repeated = field.is_list() || field.is_map();
                        let kind = match field.kind() {
                            Kind::Message(nested) => Field::Message {
                                index: *by_name.get(nested.full_name())?,
                                repeated,
                            },
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
/// call, and hashing it cost as much as the count itself.
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

/// The count went past the cap.
#[derive(Debug, PartialEq, Eq)]
pub struct TooManyEntries;

/// Counts the entries of `bytes`, a `message`, against `max`.
///
/// # Errors
/// [`TooManyEntries`] past `max`. Malformed bytes end the count without error.
pub fn count_entries(
    schema: &Schema,
    message: usize,
    bytes: &[u8],
    max: usize,
) -> Result<usize, TooManyEntries> {
    let mut left = max;
    walk(schema, message, bytes, 0, &mut left)?;
    Ok(max - left)
}

/// Checks that `bytes`, a message of type `U`, holds at most `max` entries.
///
/// # Errors
/// RESOURCE_EXHAUSTED naming the flag past `max`.
pub fn check_entries_of<U: Name + 'static>(bytes: &[u8], max: usize) -> Result<(), Status> {
    match index_of::<U>() {
        Some(message) => check_entries(message, bytes, max),
        None => Ok(()),
    }
}

fn check_entries(message: usize, bytes: &[u8], max: usize) -> Result<(), Status> {
    count_entries(schema(), message, bytes, max)
        .map(|_| ())
        .map_err(|TooManyEntries| {
            Status::resource_exhausted(format!(
                "the message holds more than {max} entries (tensors, parameters, strings); \
                 the limit is --grpc-max-message-entries"
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
) -> Result<(), TooManyEntries> {
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
                    Some(Field::Message { index, repeated }) => {
                        if repeated {
                            take(left)?;
                        }
                        if depth < MAX_DEPTH {
                            walk(schema, index, body, depth + 1, left)?;
                        }
                    }
                    Some(Field::Strings) => take(left)?,
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

/// One entry more, if the cap allows.
fn take(left: &mut usize) -> Result<(), TooManyEntries> {
    *left = left.checked_sub(1).ok_or(TooManyEntries)?;
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
    use crate::proto::inference::model_infer_request::{
        InferInputTensor, InferRequestedOutputTensor,
    };
    use crate::proto::inference::{InferParameter, InferTensorContents, ModelInferRequest};

    fn count(request: &ModelInferRequest, max: usize) -> Result<usize, TooManyEntries> {
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        count_entries(schema(), index, &request.encode_to_vec(), max)
    }

    fn tensor(name: &str) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            ..Default::default()
        }
    }

    #[test]
    fn counts_tensors_parameters_and_strings_at_every_level() {
        let mut input = tensor("INPUT0");
        input
            .parameters
            .insert("p".into(), InferParameter::default());
        input.contents = Some(InferTensorContents {
            bytes_contents: vec![bytes::Bytes::new(); 3],
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
        // 2 inputs + 1 parameter of the first + 3 BYTES elements + 1 output + 1 raw + 1
        // request parameter; the 1000 packed floats are one field.
        assert_eq!(count(&request, 100), Ok(9));
        assert_eq!(count(&request, 9), Ok(9));
        assert_eq!(count(&request, 8), Err(TooManyEntries));
    }

    #[test]
    fn empty_entries_are_counted_before_any_is_built() {
        // What the issue sent: `2a 00` (an empty `inputs` entry) over and over.
        let wire = [0x2a, 0x00].repeat(100_000);
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        assert_eq!(
            count_entries(schema(), index, &wire, 16_384),
            Err(TooManyEntries)
        );
        assert_eq!(count_entries(schema(), index, &wire, 100_000), Ok(100_000));
    }

    #[test]
    fn malformed_bytes_end_the_count_for_prost_to_refuse() {
        let index = message_index(schema(), "inference.ModelInferRequest").unwrap();
        for wire in [&[0x2a, 0x05, 0x0a][..], &[0xff; 12], &[0x2b], &[0x2a]] {
            assert!(count_entries(schema(), index, wire, 10).is_ok());
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
