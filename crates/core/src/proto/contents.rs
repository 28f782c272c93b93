//! `inference.InferTensorContents`, written by hand (`build.rs` maps the message here with
//! `extern_path`) so that `bytes_contents` decodes into one buffer.
//!
//! prost's derive would build one `Bytes` per element of `bytes_contents`: 32 bytes of struct
//! (and twice that while its `Vec` grows) for an element that is three bytes on the wire, so the
//! 10,485,760 one-byte strings of Triton's QA (`L0_grpc` `test_bytes_contents_many_elements_
//! serialization`) would take 670 MB before the tensor was even framed. Here every element is
//! appended, as it is read, to one buffer in Triton's BYTES layout (a 4-byte little-endian
//! length, then the bytes): at most twice its wire size (an empty element is 2 bytes on the wire
//! and 4 framed), already the tensor's raw data, so nothing is framed again. The other fields
//! are prost's packed numbers, encoded and decoded as the derive does.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{
    self, check_wire_type, decode_varint, encode_key, encode_varint, encoded_len_varint, key_len,
    DecodeContext, WireType,
};
use prost::DecodeError;
use std::fmt;

/// The full name of the message decoded here, and the number of its framed field: the decode
/// estimate of `protocol::grpc_codec` charges that field no struct per element.
pub const FRAMED_MESSAGE: &str = "inference.InferTensorContents";
/// `bytes_contents`.
pub const FRAMED_FIELD: u32 = 8;

/// The proto's `InferTensorContents`, field for field; `bytes_contents` already framed.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct InferTensorContents {
    /// Field 1.
    pub bool_contents: Vec<bool>,
    /// Field 2: INT8, INT16 and INT32 values.
    pub int_contents: Vec<i32>,
    /// Field 3.
    pub int64_contents: Vec<i64>,
    /// Field 4: UINT8, UINT16 and UINT32 values.
    pub uint_contents: Vec<u32>,
    /// Field 5.
    pub uint64_contents: Vec<u64>,
    /// Field 6.
    pub fp32_contents: Vec<f32>,
    /// Field 7.
    pub fp64_contents: Vec<f64>,
    /// Field 8, one element per string.
    pub bytes_contents: FramedBytes,
}

/// Byte strings in Triton's BYTES layout, in one buffer: each a 4-byte little-endian length,
/// then its bytes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct FramedBytes {
    framed: Vec<u8>,
    count: usize,
}

impl FramedBytes {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one element.
    ///
    /// # Panics
    /// When `element` is 4 GiB or longer (the layout's length is 32 bits; a gRPC message is
    /// under 2 GiB).
    pub fn push(&mut self, element: &[u8]) {
        let len = u32::try_from(element.len()).expect("a BYTES element is under 4 GiB");
        self.framed.reserve(4 + element.len());
        self.framed.extend_from_slice(&len.to_le_bytes());
        self.framed.extend_from_slice(element);
        self.count += 1;
    }

    /// The elements, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut rest = &self.framed[..];
        std::iter::from_fn(move || {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let (element, tail) = tail.split_at(u32::from_le_bytes(*len) as usize);
            rest = tail;
            Some(element)
        })
    }

    /// The framed bytes: a BYTES tensor's raw data, without a copy.
    pub fn into_framed(self) -> Bytes {
        Bytes::from(self.framed)
    }

    /// Reads an element of `len` bytes from `buf` onto the end.
    fn read(&mut self, buf: &mut impl Buf, len: usize) -> Result<(), DecodeError> {
        let Ok(prefix) = u32::try_from(len) else {
            return Err(underflow());
        };
        if len > buf.remaining() {
            return Err(underflow());
        }
        self.framed.reserve(4 + len);
        self.framed.extend_from_slice(&prefix.to_le_bytes());
        let mut left = len;
        while left > 0 {
            let chunk = buf.chunk();
            let n = chunk.len().min(left);
            self.framed.extend_from_slice(&chunk[..n]);
            buf.advance(n);
            left -= n;
        }
        self.count += 1;
        Ok(())
    }

    fn encoded_len(&self, tag: u32) -> usize {
        self.iter()
            .map(|e| key_len(tag) + encoded_len_varint(e.len() as u64) + e.len())
            .sum()
    }
}

/// prost's own text for a length past the end of the message.
#[allow(deprecated)] // prost has no public constructor for its error kinds
fn underflow() -> DecodeError {
    DecodeError::new("buffer underflow")
}

impl fmt::Debug for FramedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().take(16)).finish()?;
        if self.count > 16 {
            write!(f, " (+{} more)", self.count - 16)?;
        }
        Ok(())
    }
}

impl<E: AsRef<[u8]>> FromIterator<E> for FramedBytes {
    fn from_iter<I: IntoIterator<Item = E>>(elements: I) -> Self {
        let mut out = FramedBytes::default();
        for element in elements {
            out.push(element.as_ref());
        }
        out
    }
}

impl<E: AsRef<[u8]>> From<Vec<E>> for FramedBytes {
    fn from(elements: Vec<E>) -> Self {
        elements.into_iter().collect()
    }
}

const STRUCT: &str = "InferTensorContents";

impl prost::Message for InferTensorContents {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encoding::bool::encode_packed(1, &self.bool_contents, buf);
        encoding::int32::encode_packed(2, &self.int_contents, buf);
        encoding::int64::encode_packed(3, &self.int64_contents, buf);
        encoding::uint32::encode_packed(4, &self.uint_contents, buf);
        encoding::uint64::encode_packed(5, &self.uint64_contents, buf);
        encoding::float::encode_packed(6, &self.fp32_contents, buf);
        encoding::double::encode_packed(7, &self.fp64_contents, buf);
        for element in self.bytes_contents.iter() {
            encode_key(8, WireType::LengthDelimited, buf);
            encode_varint(element.len() as u64, buf);
            buf.put_slice(element);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let (result, field) = match tag {
            1 => (
                encoding::bool::merge_repeated(wire_type, &mut self.bool_contents, buf, ctx),
                "bool_contents",
            ),
            2 => (
                encoding::int32::merge_repeated(wire_type, &mut self.int_contents, buf, ctx),
                "int_contents",
            ),
            3 => (
                encoding::int64::merge_repeated(wire_type, &mut self.int64_contents, buf, ctx),
                "int64_contents",
            ),
            4 => (
                encoding::uint32::merge_repeated(wire_type, &mut self.uint_contents, buf, ctx),
                "uint_contents",
            ),
            5 => (
                encoding::uint64::merge_repeated(wire_type, &mut self.uint64_contents, buf, ctx),
                "uint64_contents",
            ),
            6 => (
                encoding::float::merge_repeated(wire_type, &mut self.fp32_contents, buf, ctx),
                "fp32_contents",
            ),
            7 => (
                encoding::double::merge_repeated(wire_type, &mut self.fp64_contents, buf, ctx),
                "fp64_contents",
            ),
            8 => (
                check_wire_type(WireType::LengthDelimited, wire_type)
                    .and_then(|()| decode_varint(buf))
                    .and_then(|len| {
                        let len = usize::try_from(len).map_err(|_| underflow())?;
                        self.bytes_contents.read(buf, len)
                    }),
                "bytes_contents",
            ),
            _ => return encoding::skip_field(wire_type, tag, buf, ctx),
        };
        result.map_err(|mut error| {
            error.push(STRUCT, field);
            error
        })
    }

    fn encoded_len(&self) -> usize {
        encoding::bool::encoded_len_packed(1, &self.bool_contents)
            + encoding::int32::encoded_len_packed(2, &self.int_contents)
            + encoding::int64::encoded_len_packed(3, &self.int64_contents)
            + encoding::uint32::encoded_len_packed(4, &self.uint_contents)
            + encoding::uint64::encoded_len_packed(5, &self.uint64_contents)
            + encoding::float::encoded_len_packed(6, &self.fp32_contents)
            + encoding::double::encoded_len_packed(7, &self.fp64_contents)
            + self.bytes_contents.encoded_len(8)
    }

    fn clear(&mut self) {
        *self = InferTensorContents::default();
    }
}

impl prost::Name for InferTensorContents {
    const NAME: &'static str = STRUCT;
    const PACKAGE: &'static str = "inference";
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use prost_reflect::{DynamicMessage, Value};

    fn sample() -> InferTensorContents {
        InferTensorContents {
            bool_contents: vec![true, false],
            int_contents: vec![-1, 2, i32::MIN],
            int64_contents: vec![i64::MAX],
            uint_contents: vec![7],
            uint64_contents: vec![u64::MAX, 0],
            fp32_contents: vec![1.5, -0.0],
            fp64_contents: vec![f64::MIN_POSITIVE],
            bytes_contents: FramedBytes::from(vec![&b"abc"[..], b"", &[0xff; 300]]),
        }
    }

    fn descriptor() -> prost_reflect::MessageDescriptor {
        crate::proto::descriptor_pool()
            .get_message_by_name("inference.InferTensorContents")
            .unwrap()
    }

    #[test]
    fn round_trips_and_matches_the_proto_wire_format() {
        let contents = sample();
        let wire = contents.encode_to_vec();
        assert_eq!(wire.len(), contents.encoded_len());
        assert_eq!(InferTensorContents::decode(&wire[..]).unwrap(), contents);
        // The descriptor's decoder (the proto itself) reads the same fields from our bytes,
        // and its encoding decodes back to ours.
        let dynamic = DynamicMessage::decode(descriptor(), &wire[..]).unwrap();
        let Value::List(strings) = dynamic
            .get_field_by_name("bytes_contents")
            .unwrap()
            .into_owned()
        else {
            panic!("bytes_contents is a list");
        };
        assert_eq!(strings.len(), 3);
        assert_eq!(strings[0], Value::Bytes(Bytes::from_static(b"abc")));
        assert_eq!(
            InferTensorContents::decode(&dynamic.encode_to_vec()[..]).unwrap(),
            contents
        );
    }

    #[test]
    fn bytes_contents_decode_into_tritons_layout() {
        let wire = sample().encode_to_vec();
        let decoded = InferTensorContents::decode(&wire[..]).unwrap();
        let framed = decoded.bytes_contents.into_framed();
        let mut expected = Vec::new();
        for element in [&b"abc"[..], b"", &[0xff; 300]] {
            expected.extend_from_slice(&(element.len() as u32).to_le_bytes());
            expected.extend_from_slice(element);
        }
        assert_eq!(&framed[..], &expected[..]);
        assert_eq!(
            framed,
            crate::core::tensor::frame_bytes([&b"abc"[..], b"", &[0xff; 300]])
        );
    }

    #[test]
    fn unpacked_numbers_and_unknown_fields_are_read_as_prost_reads_them() {
        // Field 2 unpacked (varint per element), then an unknown field 9.
        let wire = [0x10, 0x05, 0x10, 0x06, 0x48, 0x01];
        let decoded = InferTensorContents::decode(&wire[..]).unwrap();
        assert_eq!(decoded.int_contents, vec![5, 6]);
    }

    #[test]
    fn a_truncated_element_is_refused_as_prost_refuses_it() {
        // bytes_contents announces 5 bytes, 2 follow.
        let error = InferTensorContents::decode(&[0x42, 0x05, b'a', b'b'][..]).unwrap_err();
        assert!(error.to_string().contains("buffer underflow"), "{error}");
        assert!(error.to_string().contains("bytes_contents"), "{error}");
        // A wrong wire type for the field.
        assert!(InferTensorContents::decode(&[0x40, 0x01][..]).is_err());
    }

    #[test]
    fn many_elements_cost_their_framed_size() {
        let count = 100_000;
        let mut wire = Vec::with_capacity(count * 3);
        for _ in 0..count {
            wire.extend_from_slice(&[0x42, 0x01, b'A']);
        }
        let decoded = InferTensorContents::decode(&wire[..]).unwrap();
        assert_eq!(decoded.bytes_contents.len(), count);
        assert!(decoded.bytes_contents.iter().all(|e| e == b"A"));
        assert_eq!(decoded.bytes_contents.into_framed().len(), count * 5);
    }
}
