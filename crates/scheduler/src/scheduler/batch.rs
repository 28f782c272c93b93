//! Merging requests into one batch along the first dimension, and splitting the model's outputs
//! back per request. The raw layout makes both cheap: fixed-size tensors concatenate and split as
//! byte ranges (splits are zero-copy slices), and length-prefixed BYTES buffers concatenate as they
//! are and split by walking the element frames.

use crate::core::tensor::BytesElements;
use crate::core::Tensor;
use bytes::BytesMut;
use std::borrow::Cow;
use std::hash::{Hash, Hasher};

/// Hash of what must be equal for requests to share a batch: each input's name, datatype and
/// non-batch dims, in order.
pub fn signature(inputs: &[Tensor]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for input in inputs {
        input.name.hash(&mut hasher);
        input.datatype.hash(&mut hasher);
        input.shape.get(1..).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

/// Concatenates the inputs of several requests (same names, order and non-batch dims) along the
/// first dimension. A lone request's inputs are used as they are.
pub fn concat<'a>(requests: &[&'a [Tensor]]) -> Cow<'a, [Tensor]> {
    let Some(&first) = requests.first() else {
        return Cow::Borrowed(&[]);
    };
    if requests.len() == 1 {
        return Cow::Borrowed(first);
    }
    let merged = first
        .iter()
        .enumerate()
        .map(|(index, template)| {
            let parts = requests.iter().map(|inputs| &inputs[index]);
            let rows: i64 = parts
                .clone()
                .map(|t| t.shape.first().copied().unwrap_or(1))
                .sum();
            let mut data = BytesMut::with_capacity(parts.clone().map(|t| t.data.len()).sum());
            for part in parts {
                data.extend_from_slice(&part.data);
            }
            let mut shape = template.shape.clone();
            if let Some(batch) = shape.first_mut() {
                *batch = rows;
            }
            Tensor::new(
                template.name.clone(),
                template.datatype,
                shape,
                data.freeze(),
            )
        })
        .collect();
    Cow::Owned(merged)
}

/// Splits each output along its first dimension into `rows` pieces, one per request.
///
/// # Errors
/// A message when an output's first dimension is not the batch total (the model does not keep
/// the batch dimension first), or a BYTES buffer is malformed.
pub fn split(outputs: Vec<Tensor>, rows: &[usize]) -> Result<Vec<Vec<Tensor>>, String> {
    if rows.len() == 1 {
        return Ok(vec![outputs]);
    }
    let mut per_request: Vec<Vec<Tensor>> = rows
        .iter()
        .map(|_| Vec::with_capacity(outputs.len()))
        .collect();
    for output in outputs {
        for (request, piece) in per_request.iter_mut().zip(split_rows(&output, rows)?) {
            request.push(piece);
        }
    }
    Ok(per_request)
}

/// Splits one output along its first dimension into `rows` pieces (zero-copy slices).
///
/// # Errors
/// As [`split`].
pub fn split_rows(output: &Tensor, rows: &[usize]) -> Result<Vec<Tensor>, String> {
    let total: usize = rows.iter().sum();
    let batch = output.shape.first().copied().unwrap_or(-1);
    if batch < 0 || batch as usize != total {
        return Err(format!(
            "output '{}' has first dimension {batch}, but the batch holds {total} rows",
            output.name
        ));
    }
    let row_elements: usize = output.shape[1..]
        .iter()
        .map(|&d| d.max(0) as usize)
        .product();
    let shapes = rows.iter().map(|&n| {
        let mut shape = output.shape.clone();
        shape[0] = n as i64;
        shape
    });
    let counts: Vec<usize> = rows.iter().map(|&n| n * row_elements).collect();
    pieces(output, &counts, shapes)
}

/// Cuts `output` into consecutive pieces of `counts` elements, shaped `shapes`; every element
/// must be used.
///
/// # Errors
/// A message when the output holds more or fewer elements, or a BYTES buffer is malformed.
pub fn pieces(
    output: &Tensor,
    counts: &[usize],
    shapes: impl Iterator<Item = Vec<i64>>,
) -> Result<Vec<Tensor>, String> {
    let offsets = element_offsets(output, counts)?;
    Ok(offsets
        .windows(2)
        .zip(shapes)
        .map(|(range, shape)| {
            let mut piece = Tensor::new(
                output.name.clone(),
                output.datatype,
                shape,
                output.data.slice(range[0]..range[1]),
            );
            piece.parameters = output.parameters.clone();
            piece
        })
        .collect())
}

/// Byte offsets where each piece of `counts` elements starts, plus the end.
fn element_offsets(output: &Tensor, counts: &[usize]) -> Result<Vec<usize>, String> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    offsets.push(0);
    match output.datatype.element_size() {
        Some(size) => {
            let mut at = 0;
            for &n in counts {
                at += n * size;
                offsets.push(at);
            }
            if at != output.data.len() {
                return Err(format!(
                    "output '{}' holds {} bytes, expected {at}",
                    output.name,
                    output.data.len()
                ));
            }
        }
        None => {
            let mut elements = BytesElements::new(&output.data);
            let mut at = 0;
            for &n in counts {
                for _ in 0..n {
                    let element = elements
                        .next()
                        .ok_or_else(|| format!("output '{}' has too few elements", output.name))?
                        .map_err(|e| format!("output '{}': {e}", output.name))?;
                    at += 4 + element.len();
                }
                offsets.push(at);
            }
            if at != output.data.len() {
                return Err(format!("output '{}' has too many elements", output.name));
            }
        }
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::frame_bytes;
    use crate::core::DataType;
    use bytes::Bytes;

    fn f32s(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DataType::Fp32, shape.to_vec(), data.into())
    }

    /// Whether `b` points into `a`'s buffer (split pieces share it).
    fn shares_buffer(a: &Bytes, b: &Bytes) -> bool {
        let (a0, a1) = (a.as_ptr() as usize, a.as_ptr() as usize + a.len());
        let b0 = b.as_ptr() as usize;
        b0 >= a0 && b0 <= a1
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn signature_ignores_batch_but_not_other_dims() {
        let a = [f32s("x", &[1, 2], &[0.0; 2])];
        let b = [f32s("x", &[3, 2], &[0.0; 6])];
        let c = [f32s("x", &[1, 3], &[0.0; 3])];
        let d = [f32s("y", &[1, 2], &[0.0; 2])];
        assert_eq!(signature(&a), signature(&b));
        assert_ne!(signature(&a), signature(&c));
        assert_ne!(signature(&a), signature(&d));
    }

    #[test]
    fn concat_then_split_round_trips() {
        let r1 = vec![f32s("x", &[1, 2], &[1.0, 2.0])];
        let r2 = vec![f32s("x", &[2, 2], &[3.0, 4.0, 5.0, 6.0])];
        let merged = concat(&[&r1, &r2]);
        assert_eq!(merged[0].shape, vec![3, 2]);
        assert_eq!(values(&merged[0]), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let output = merged[0].clone();
        let pieces = split(vec![output.clone()], &[1, 2]).unwrap();
        assert_eq!(pieces[0][0].shape, vec![1, 2]);
        assert_eq!(values(&pieces[0][0]), vec![1.0, 2.0]);
        assert_eq!(pieces[1][0].shape, vec![2, 2]);
        assert_eq!(values(&pieces[1][0]), vec![3.0, 4.0, 5.0, 6.0]);
        assert!(
            shares_buffer(&output.data, &pieces[1][0].data),
            "split is zero-copy"
        );
    }

    #[test]
    fn bytes_tensors_concat_and_split_by_element() {
        let r1 = vec![Tensor::new(
            "s",
            DataType::Bytes,
            vec![1, 2],
            frame_bytes([&b"a"[..], b"bb"]),
        )];
        let r2 = vec![Tensor::new(
            "s",
            DataType::Bytes,
            vec![1, 2],
            frame_bytes([&b""[..], b"ccc"]),
        )];
        let merged = concat(&[&r1, &r2]);
        assert_eq!(merged[0].shape, vec![2, 2]);
        let pieces = split(merged.into_owned(), &[1, 1]).unwrap();
        assert_eq!(pieces[0][0].data, r1[0].data);
        assert_eq!(pieces[1][0].data, r2[0].data);
    }

    #[test]
    fn single_request_passes_through() {
        let r = vec![f32s("x", &[2], &[1.0, 2.0])];
        assert!(matches!(concat(&[&r]), Cow::Borrowed(inputs) if inputs == r.as_slice()));
        assert_eq!(split(r.clone(), &[2]).unwrap(), vec![r]);
    }

    #[test]
    fn split_rejects_outputs_without_the_batch_first() {
        let wrong = f32s("y", &[2, 1], &[1.0, 2.0]);
        assert!(split(vec![wrong], &[1, 2])
            .unwrap_err()
            .contains("first dimension 2"));
        let scalar = f32s("y", &[], &[1.0]);
        assert_eq!(
            split(vec![scalar], &[1, 1]).unwrap_err(),
            "output 'y' has first dimension -1, but the batch holds 2 rows"
        );
        let truncated = Tensor::new("s", DataType::Bytes, vec![2], frame_bytes([b"a"]));
        assert!(split(vec![truncated], &[1, 1])
            .unwrap_err()
            .contains("too few elements"));
    }

    #[test]
    fn zero_row_requests_split_to_empty_pieces() {
        let out = f32s("y", &[2, 1], &[1.0, 2.0]);
        let pieces = split(vec![out], &[0, 2]).unwrap();
        assert_eq!(pieces[0][0].shape, vec![0, 1]);
        assert!(pieces[0][0].data.is_empty());
        assert_eq!(values(&pieces[1][0]), vec![1.0, 2.0]);
    }
}
