//! Tensors in the protocol's raw layout: row-major, little-endian, no padding; BYTES elements are
//! framed as a 4-byte little-endian length followed by the bytes. Keeping one layout everywhere
//! lets a tensor travel from the wire to ONNX Runtime without reshuffling.

use super::request::Parameters;
use bytes::{BufMut, Bytes, BytesMut};
use std::fmt;

/// The KServe v2 / Triton tensor datatypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Bf16,
    Fp32,
    Fp64,
    Bytes,
}

impl DataType {
    /// Every datatype, in Triton's table order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Bf16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
    ];

    /// Parses the protocol name (`"FP32"`, `"BYTES"`, ...).
    pub fn from_wire(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|dt| dt.as_wire() == name)
    }

    /// The protocol name.
    pub fn as_wire(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Bf16 => "BF16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Bytes per element, or `None` for the variable-size BYTES type.
    pub fn element_size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_wire())
    }
}

/// Why a shape cannot describe a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("shape dimension {0} is negative")]
    Negative(i64),
    /// The element count does not fit in an int64, where Triton counts elements.
    #[error("causes total element count to exceed maximum size of {}", i64::MAX)]
    CountOverflow,
    /// The element count fits in an int64 but its byte size does not.
    #[error("byte size exceeds maximum size of {}", i64::MAX)]
    ByteSizeOverflow,
    /// More than [`MAX_ELEMENTS`]: no message kiln accepts can hold the tensor.
    #[error("shape {0} has too many elements")]
    Overflow(String),
}

/// Largest element count a tensor may have; far beyond any message kiln accepts, small enough that
/// `count * 8` cannot overflow.
const MAX_ELEMENTS: u64 = 1 << 56;

/// Number of elements of a concrete shape (the empty shape is a scalar: 1 element). Checked for
/// negative dimensions and overflow before anything is allocated.
pub fn element_count(shape: &[i64]) -> Result<usize, ShapeError> {
    sized_element_count(shape, None)
}

/// [`element_count`] of a tensor whose elements take `element_size` bytes each (`None`: BYTES),
/// checked as Triton checks a request's shape: the count must fit in an int64, then its byte size
/// too, before kiln's own [`MAX_ELEMENTS`].
pub fn sized_element_count(
    shape: &[i64],
    element_size: Option<usize>,
) -> Result<usize, ShapeError> {
    let mut count: i64 = 1;
    for &dim in shape {
        if dim < 0 {
            return Err(ShapeError::Negative(dim));
        }
        count = count.checked_mul(dim).ok_or(ShapeError::CountOverflow)?;
    }
    if let Some(size) = element_size {
        count
            .checked_mul(size as i64)
            .ok_or(ShapeError::ByteSizeOverflow)?;
    }
    usize::try_from(count)
        .ok()
        .filter(|&c| c as u64 <= MAX_ELEMENTS)
        .ok_or_else(|| ShapeError::Overflow(format_dims(shape)))
}

/// The message for an input whose shape [`sized_element_count`] refused: Triton's words for the
/// count and byte size overflows (its HTTP frontend's checks, server PR #8182; frozen by Triton's
/// qa/L0_http/http_test.py `test_buffer_size_overflow`, which matches "causes total element count
/// to exceed maximum size of" and "byte size overflow for input").
pub fn shape_refusal(error: &ShapeError, input: &str, model: &str, shape: &[i64]) -> String {
    let dims = format_dims(shape);
    match error {
        ShapeError::CountOverflow => {
            format!("input '{input}' for model '{model}' with shape {dims} {error}")
        }
        ShapeError::ByteSizeOverflow => {
            format!("byte size overflow for input '{input}' for model '{model}' with shape {dims}: {error}")
        }
        ShapeError::Negative(_) | ShapeError::Overflow(_) => {
            format!("invalid shape {dims} for input '{input}' for model '{model}': {error}")
        }
    }
}

/// Formats dims as Triton does in messages: `[-1,16]`.
pub fn format_dims(dims: &[i64]) -> String {
    let inner: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", inner.join(","))
}

/// Why a BYTES buffer is not a valid sequence of length-prefixed elements.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("element {index} length prefix is truncated")]
    TruncatedPrefix { index: usize },
    #[error("element {index} declares {len} bytes but only {available} remain")]
    TruncatedElement {
        index: usize,
        len: usize,
        available: usize,
    },
    #[error("expected {expected} elements but found {found}")]
    Count { expected: usize, found: usize },
}

/// Iterates the elements of a length-prefixed BYTES buffer, failing on malformed framing.
pub struct BytesElements<'a> {
    rest: &'a [u8],
    index: usize,
}

impl<'a> BytesElements<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        BytesElements {
            rest: buf,
            index: 0,
        }
    }
}

impl<'a> Iterator for BytesElements<'a> {
    type Item = Result<&'a [u8], FramingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let Some((prefix, tail)) = self.rest.split_first_chunk::<4>() else {
            self.rest = &[];
            return Some(Err(FramingError::TruncatedPrefix { index }));
        };
        let len = u32::from_le_bytes(*prefix) as usize;
        if len > tail.len() {
            self.rest = &[];
            return Some(Err(FramingError::TruncatedElement {
                index,
                len,
                available: tail.len(),
            }));
        }
        let (element, rest) = tail.split_at(len);
        self.rest = rest;
        Some(Ok(element))
    }
}

/// Checks that `buf` holds exactly `expected` well-framed BYTES elements.
pub fn check_bytes_framing(buf: &[u8], expected: usize) -> Result<(), FramingError> {
    let mut found = 0usize;
    for element in BytesElements::new(buf) {
        element?;
        found += 1;
    }
    if found != expected {
        return Err(FramingError::Count { expected, found });
    }
    Ok(())
}

/// Frames elements as a BYTES buffer (4-byte LE length + bytes each).
pub fn frame_bytes<I, E>(elements: I) -> Bytes
where
    I: IntoIterator<Item = E>,
    E: AsRef<[u8]>,
{
    let mut out = BytesMut::new();
    for element in elements {
        let element = element.as_ref();
        out.reserve(4 + element.len());
        out.put_u32_le(element.len() as u32);
        out.put_slice(element);
    }
    out.freeze()
}

/// A tensor with its data in the raw layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    /// Raw bytes: little-endian row-major for fixed-size types, length-prefixed for BYTES.
    pub data: Bytes,
    /// Per-tensor parameters carried through (e.g. MLServer's `content_type`).
    pub parameters: Parameters,
}

impl Tensor {
    pub fn new(name: impl Into<String>, datatype: DataType, shape: Vec<i64>, data: Bytes) -> Self {
        Tensor {
            name: name.into(),
            datatype,
            shape,
            data,
            parameters: Parameters::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_round_trip() {
        for dt in DataType::ALL {
            assert_eq!(DataType::from_wire(dt.as_wire()), Some(dt));
        }
        assert_eq!(DataType::from_wire("STRING"), None);
        assert_eq!(DataType::from_wire("fp32"), None);
        assert_eq!(DataType::from_wire(""), None);
    }

    #[test]
    fn element_sizes() {
        assert_eq!(DataType::Bool.element_size(), Some(1));
        assert_eq!(DataType::Bf16.element_size(), Some(2));
        assert_eq!(DataType::Fp16.element_size(), Some(2));
        assert_eq!(DataType::Uint32.element_size(), Some(4));
        assert_eq!(DataType::Fp64.element_size(), Some(8));
        assert_eq!(DataType::Bytes.element_size(), None);
    }

    #[test]
    fn element_count_basic() {
        assert_eq!(element_count(&[]), Ok(1));
        assert_eq!(element_count(&[2, 3, 4]), Ok(24));
        assert_eq!(element_count(&[5, 0, 7]), Ok(0));
    }

    #[test]
    fn element_count_rejects_negative_and_overflow() {
        assert_eq!(element_count(&[2, -1]), Err(ShapeError::Negative(-1)));
        // Triton's order: the count must fit in an int64, then its bytes, then kiln's own cap.
        for shape in [
            &[1 << 40, 1 << 40][..],
            &[i64::MAX, 2],
            &[i64::MAX, i64::MAX, 0],
        ] {
            assert_eq!(
                element_count(shape),
                Err(ShapeError::CountOverflow),
                "{shape:?}"
            );
        }
        assert_eq!(
            sized_element_count(&[4, (1 << 60) + 2], Some(4)),
            Err(ShapeError::ByteSizeOverflow)
        );
        assert_eq!(
            sized_element_count(&[4, (1 << 60) + 2], None),
            Err(ShapeError::Overflow("[4,1152921504606846978]".into()))
        );
        assert_eq!(sized_element_count(&[2, 8], Some(8)), Ok(16));
        assert_eq!(
            shape_refusal(&ShapeError::CountOverflow, "x", "m", &[16, (1 << 60) + 2]),
            "input 'x' for model 'm' with shape [16,1152921504606846978] causes total element \
             count to exceed maximum size of 9223372036854775807"
        );
    }

    #[test]
    fn format_dims_like_triton() {
        assert_eq!(format_dims(&[-1, 16]), "[-1,16]");
        assert_eq!(format_dims(&[]), "[]");
    }

    #[test]
    fn bytes_framing_round_trip() {
        let elements: Vec<&[u8]> = vec![b"abc", b"", "héllo".as_bytes(), &[0, 255, 1]];
        let framed = frame_bytes(&elements);
        assert_eq!(framed.len(), 4 * 4 + 3 + 6 + 3);
        let back: Vec<&[u8]> = BytesElements::new(&framed).map(Result::unwrap).collect();
        assert_eq!(back, elements);
        assert_eq!(check_bytes_framing(&framed, 4), Ok(()));
    }

    #[test]
    fn bytes_framing_errors() {
        assert_eq!(
            check_bytes_framing(&[1, 0], 1),
            Err(FramingError::TruncatedPrefix { index: 0 })
        );
        assert_eq!(
            check_bytes_framing(&[5, 0, 0, 0, b'a'], 1),
            Err(FramingError::TruncatedElement {
                index: 0,
                len: 5,
                available: 1
            })
        );
        let two = frame_bytes([b"a", b"b"]);
        assert_eq!(
            check_bytes_framing(&two, 3),
            Err(FramingError::Count {
                expected: 3,
                found: 2
            })
        );
        assert_eq!(check_bytes_framing(&[], 0), Ok(()));
        // A huge declared length never allocates: it is only compared with what remains.
        assert_eq!(
            check_bytes_framing(&[255, 255, 255, 255], 1),
            Err(FramingError::TruncatedElement {
                index: 0,
                len: u32::MAX as usize,
                available: 0
            })
        );
    }
}
