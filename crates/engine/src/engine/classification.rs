//! Triton's classification extension: a requested output carrying `classification: k` is replaced
//! by its top `k` entries as BYTES strings `"<value>:<index>[:<label>]"`, highest value first.
//! Both protocols reach it through the engine, so gRPC and REST answer identically. Pure
//! functions: the caller supplies the output, its labels and whether the model batches.

use crate::core::tensor::{element_count, frame_bytes};
use crate::core::{DataType, Error, ParamValue, Tensor};
use crate::invalid_arg;
use std::cmp::Ordering;

/// The requested-output parameter that asks for classification.
pub const CLASSIFICATION: &str = "classification";

/// Most elements one batch item of a classified output may have: Triton's
/// `kMaxClassificationElements` (server src/classification.cc, `TopkClassifications`), which
/// bounds the index it sorts.
pub const MAX_CLASSIFICATION_ELEMENTS: usize = 1_000_000;

/// Reads the `classification` parameter: `Some(k)` for k > 0, `None` when absent or 0 (Triton
/// treats 0 as "no classification").
///
/// # Errors
/// INVALID_ARGUMENT when the value is negative or not an integer.
pub fn requested_count(value: Option<&ParamValue>, output: &str) -> Result<Option<usize>, Error> {
    let count = match value {
        None => return Ok(None),
        Some(ParamValue::Uint64(k)) => *k,
        Some(ParamValue::Int64(k)) if *k >= 0 => *k as u64,
        Some(other) => {
            return Err(invalid_arg!(
                "invalid value {other:?} for 'classification' on output '{output}': expected a non-negative integer"
            ))
        }
    };
    // A count beyond usize is beyond any output's size: [`classify`] refuses it.
    Ok((count > 0).then(|| usize::try_from(count).unwrap_or(usize::MAX)))
}

/// Replaces `output` by its top-`k` classification per batch item.
///
/// Shape: `[batch, k]` when the model batches (the first dim is the batch), else `[k]`.
///
/// # Errors
/// INVALID_ARGUMENT for datatypes Triton cannot classify (BOOL, FP16, BF16, BYTES), for `n`, the
/// element count of one batch item, beyond [`MAX_CLASSIFICATION_ELEMENTS`], and for `k` larger
/// than `n`; INTERNAL for an output whose data does not match its shape.
pub fn classify(
    output: &Tensor,
    k: usize,
    batched: bool,
    labels: Option<&[String]>,
) -> Result<Tensor, Error> {
    let Some(size) = output.datatype.element_size().filter(|_| {
        !matches!(
            output.datatype,
            DataType::Bool | DataType::Fp16 | DataType::Bf16
        )
    }) else {
        return Err(invalid_arg!(
            "class result not available for output due to unsupported type '{}'",
            output.datatype
        ));
    };
    let (batch, item_dims) = match output.shape.split_first() {
        Some((&batch, rest)) if batched => (Some(batch.max(0) as usize), rest),
        _ => (None, &output.shape[..]),
    };
    let mismatch = || {
        Error::Internal(format!(
            "output tensor shape does not match size of output for '{}'",
            output.name
        ))
    };
    let per_item = element_count(item_dims).map_err(|_| mismatch())?;
    let items = batch.unwrap_or(1);
    let total = per_item.checked_mul(items).ok_or_else(mismatch)?;
    if total.checked_mul(size) != Some(output.data.len()) {
        return Err(mismatch());
    }
    if per_item > MAX_CLASSIFICATION_ELEMENTS {
        // Triton's text (server src/classification.cc, TopkClassifications), checked there
        // before the count; qa/L0_parameters test_classification_output_tensor_too_large.
        return Err(invalid_arg!("classification output tensor too large"));
    }
    if k > per_item {
        // Triton's current release refuses what 2.51 clamped to `n` (server
        // src/classification.cc, TopkClassifications, per batch item). Its text was not in the
        // sources searched; kiln's names both numbers.
        return Err(invalid_arg!(
            "requested class count {k} exceeds the {per_item} elements of output '{}'",
            output.name
        ));
    }
    let mut strings = Vec::with_capacity(items * k);
    if per_item > 0 {
        for item in output.data.chunks_exact(per_item * size) {
            top_k(output.datatype, item, k, labels, &mut strings);
        }
    }
    let class_dim = k as i64;
    let shape = match batch {
        Some(b) => vec![b as i64, class_dim],
        None => vec![class_dim],
    };
    let mut result = Tensor::new(
        output.name.clone(),
        DataType::Bytes,
        shape,
        frame_bytes(&strings),
    );
    result.parameters = output.parameters.clone();
    Ok(result)
}

/// One element of a classified tensor, kept in its own type so that integers sort exactly.
#[derive(Clone, Copy)]
enum Score {
    Signed(i64),
    Unsigned(u64),
    Float(f64),
}

impl Score {
    /// Descending order, NaN last; equal values keep index order (a stable sort).
    fn descending(a: &Score, b: &Score) -> Ordering {
        match (a, b) {
            (Score::Signed(x), Score::Signed(y)) => y.cmp(x),
            (Score::Unsigned(x), Score::Unsigned(y)) => y.cmp(x),
            (Score::Float(x), Score::Float(y)) => match (x.is_nan(), y.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => y.partial_cmp(x).unwrap_or(Ordering::Equal),
            },
            // One tensor has one datatype, so mixed kinds never meet.
            _ => Ordering::Equal,
        }
    }

    /// Formats like C++ `std::to_string`: integers in decimal, floats as `%f`.
    fn to_cpp_string(self) -> String {
        match self {
            Score::Signed(v) => v.to_string(),
            Score::Unsigned(v) => v.to_string(),
            Score::Float(v) => format_percent_f(v),
        }
    }
}

/// `printf("%f", v)`: six decimals; glibc's spellings for NaN and infinities.
pub fn format_percent_f(v: f64) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    format!("{v:.6}")
}

fn scores(datatype: DataType, item: &[u8]) -> Vec<Score> {
    fn each<const N: usize>(item: &[u8], f: impl Fn([u8; N]) -> Score) -> Vec<Score> {
        item.chunks_exact(N)
            .map(|c| f(c.try_into().unwrap_or([0; N])))
            .collect()
    }
    match datatype {
        DataType::Uint8 => each::<1>(item, |b| Score::Unsigned(b[0].into())),
        DataType::Uint16 => each::<2>(item, |b| Score::Unsigned(u16::from_le_bytes(b).into())),
        DataType::Uint32 => each::<4>(item, |b| Score::Unsigned(u32::from_le_bytes(b).into())),
        DataType::Uint64 => each::<8>(item, |b| Score::Unsigned(u64::from_le_bytes(b))),
        DataType::Int8 => each::<1>(item, |b| Score::Signed((b[0] as i8).into())),
        DataType::Int16 => each::<2>(item, |b| Score::Signed(i16::from_le_bytes(b).into())),
        DataType::Int32 => each::<4>(item, |b| Score::Signed(i32::from_le_bytes(b).into())),
        DataType::Int64 => each::<8>(item, |b| Score::Signed(i64::from_le_bytes(b))),
        DataType::Fp32 => each::<4>(item, |b| Score::Float(f32::from_le_bytes(b).into())),
        DataType::Fp64 => each::<8>(item, |b| Score::Float(f64::from_le_bytes(b))),
        // Rejected by `classify` before any data is read.
        DataType::Bool | DataType::Fp16 | DataType::Bf16 | DataType::Bytes => Vec::new(),
    }
}

/// Appends the `k` highest entries of one batch item to `out`.
fn top_k(
    datatype: DataType,
    item: &[u8],
    k: usize,
    labels: Option<&[String]>,
    out: &mut Vec<String>,
) {
    let scores = scores(datatype, item);
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| Score::descending(&scores[a], &scores[b]));
    for &index in order.iter().take(k) {
        let mut entry = format!("{}:{index}", scores[index].to_cpp_string());
        // Triton omits the label when the file has no (or an empty) line for this index.
        if let Some(label) = labels.and_then(|l| l.get(index)).filter(|l| !l.is_empty()) {
            entry.push(':');
            entry.push_str(label);
        }
        out.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::BytesElements;
    use bytes::Bytes;

    fn tensor<T: Copy>(
        datatype: DataType,
        shape: &[i64],
        values: &[T],
        le: fn(T) -> Vec<u8>,
    ) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|&v| le(v)).collect();
        Tensor::new("OUT", datatype, shape.to_vec(), Bytes::from(data))
    }

    fn fp32(shape: &[i64], values: &[f32]) -> Tensor {
        tensor(DataType::Fp32, shape, values, |v| v.to_le_bytes().to_vec())
    }

    fn strings(t: &Tensor) -> Vec<String> {
        assert_eq!(t.datatype, DataType::Bytes);
        BytesElements::new(&t.data)
            .map(|e| String::from_utf8(e.unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn count_parameter() {
        assert_eq!(requested_count(None, "o"), Ok(None));
        assert_eq!(requested_count(Some(&ParamValue::Int64(0)), "o"), Ok(None));
        assert_eq!(
            requested_count(Some(&ParamValue::Int64(3)), "o"),
            Ok(Some(3))
        );
        assert_eq!(
            requested_count(Some(&ParamValue::Uint64(2)), "o"),
            Ok(Some(2))
        );
        assert_eq!(
            requested_count(Some(&ParamValue::Uint64(u64::MAX)), "o"),
            Ok(Some(usize::MAX))
        );
        for bad in [
            ParamValue::Int64(-1),
            ParamValue::Double(2.0),
            ParamValue::String("2".into()),
            ParamValue::Bool(true),
        ] {
            let err = requested_count(Some(&bad), "o").unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}");
            assert!(err.message().contains("'classification'"));
        }
    }

    #[test]
    fn top_k_unbatched_with_labels() {
        let out = fp32(&[4], &[0.1, 3.3, 2.0, 0.5]);
        let labels: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let result = classify(&out, 2, false, Some(&labels)).unwrap();
        assert_eq!(result.shape, vec![2]);
        assert_eq!(result.name, "OUT");
        assert_eq!(strings(&result), ["3.300000:1:b", "2.000000:2:c"]);
    }

    #[test]
    fn top_k_batched_per_item() {
        let out = fp32(&[2, 3], &[1.0, 9.0, 5.0, 7.0, 2.0, 8.0]);
        let result = classify(&out, 2, true, None).unwrap();
        assert_eq!(result.shape, vec![2, 2]);
        assert_eq!(
            strings(&result),
            ["9.000000:1", "5.000000:2", "8.000000:2", "7.000000:0"]
        );
    }

    #[test]
    fn k_larger_than_classes_is_refused() {
        let out = fp32(&[1, 3], &[0.2, 0.3, 0.1]);
        let result = classify(&out, 3, true, None).unwrap();
        assert_eq!(result.shape, vec![1, 3]);
        for k in [4, usize::MAX] {
            let err = classify(&out, k, true, None).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)));
            assert_eq!(
                err.message(),
                format!("requested class count {k} exceeds the 3 elements of output 'OUT'")
            );
        }
    }

    #[test]
    fn items_of_more_than_a_million_elements_are_refused() {
        // Triton: server src/classification.cc, TopkClassifications (per batch item).
        let n = MAX_CLASSIFICATION_ELEMENTS;
        let at_limit = fp32(&[2, n as i64], &vec![1.0; 2 * n]);
        assert_eq!(
            classify(&at_limit, 1, true, None).unwrap().shape,
            vec![2, 1]
        );
        let one_past = fp32(&[1, n as i64 + 1], &vec![1.0; n + 1]);
        for (batched, k) in [(true, 5), (false, 5), (true, usize::MAX)] {
            let err = classify(&one_past, k, batched, None).unwrap_err();
            assert_eq!(
                err,
                Error::InvalidArgument("classification output tensor too large".into())
            );
        }
        // Two items at the limit are two classifications; as one unbatched item, too large.
        assert!(classify(&at_limit, 1, false, None).is_err());
        // The datatype is checked first, as in Triton.
        let bools = tensor(DataType::Bool, &[n as i64 + 1], &vec![0u8; n + 1], |v| {
            vec![v]
        });
        assert!(classify(&bools, 1, false, None)
            .unwrap_err()
            .message()
            .starts_with("class result not available"));
    }

    #[test]
    fn unbatched_multi_dim_output_is_one_item() {
        let out = fp32(&[2, 2], &[1.0, 4.0, 3.0, 2.0]);
        let result = classify(&out, 3, false, None).unwrap();
        assert_eq!(result.shape, vec![3]);
        assert_eq!(strings(&result), ["4.000000:1", "3.000000:2", "2.000000:3"]);
    }

    #[test]
    fn empty_batch_and_empty_items() {
        let empty_batch = fp32(&[0, 10], &[]);
        let result = classify(&empty_batch, 3, true, None).unwrap();
        assert_eq!(result.shape, vec![0, 3]);
        assert!(result.data.is_empty());
        let empty_item = fp32(&[2, 0], &[]);
        assert_eq!(
            classify(&empty_item, 3, true, None).unwrap_err(),
            Error::InvalidArgument(
                "requested class count 3 exceeds the 0 elements of output 'OUT'".into()
            )
        );
    }

    #[test]
    fn integers_sort_exactly_and_print_as_integers() {
        let big = tensor(DataType::Int64, &[3], &[i64::MAX - 1, -5, i64::MAX], |v| {
            v.to_le_bytes().to_vec()
        });
        assert_eq!(
            strings(&classify(&big, 3, false, None).unwrap()),
            [
                format!("{}:2", i64::MAX),
                format!("{}:0", i64::MAX - 1),
                "-5:1".to_string()
            ]
        );
        let bytes = tensor(DataType::Uint8, &[3], &[7u8, 255, 0], |v| vec![v]);
        assert_eq!(
            strings(&classify(&bytes, 1, false, None).unwrap()),
            ["255:1"]
        );
        let small = tensor(DataType::Int8, &[2], &[-1i8, -2], |v| vec![v as u8]);
        assert_eq!(
            strings(&classify(&small, 2, false, None).unwrap()),
            ["-1:0", "-2:1"]
        );
        let u64s = tensor(DataType::Uint64, &[2], &[1u64, u64::MAX], |v| {
            v.to_le_bytes().to_vec()
        });
        assert_eq!(
            strings(&classify(&u64s, 1, false, None).unwrap()),
            [format!("{}:1", u64::MAX)]
        );
    }

    #[test]
    fn ties_keep_index_order_and_nan_sorts_last() {
        let out = fp32(&[4], &[1.0, f32::NAN, 1.0, 2.0]);
        assert_eq!(
            strings(&classify(&out, 4, false, None).unwrap()),
            ["2.000000:3", "1.000000:0", "1.000000:2", "nan:1"]
        );
        let fp64 = tensor(DataType::Fp64, &[2], &[f64::NEG_INFINITY, 0.5], |v| {
            v.to_le_bytes().to_vec()
        });
        assert_eq!(
            strings(&classify(&fp64, 2, false, None).unwrap()),
            ["0.500000:1", "-inf:0"]
        );
    }

    #[test]
    fn percent_f_matches_cpp() {
        assert_eq!(format_percent_f(3.3f32 as f64), "3.300000");
        assert_eq!(format_percent_f(0.0078125), "0.007812");
        assert_eq!(format_percent_f(1.0000005), "1.000001");
        assert_eq!(format_percent_f(-0.0), "-0.000000");
        assert_eq!(format_percent_f(1e-9), "0.000000");
        assert_eq!(format_percent_f(f64::INFINITY), "inf");
        assert_eq!(format_percent_f(-f64::NAN), "-nan");
    }

    #[test]
    fn labels_missing_or_empty_are_omitted() {
        let out = fp32(&[3], &[1.0, 2.0, 3.0]);
        let labels = vec!["zero".to_string(), String::new()];
        assert_eq!(
            strings(&classify(&out, 3, false, Some(&labels)).unwrap()),
            ["3.000000:2", "2.000000:1", "1.000000:0:zero"]
        );
    }

    #[test]
    fn unsupported_types_are_rejected() {
        for datatype in [
            DataType::Bool,
            DataType::Fp16,
            DataType::Bf16,
            DataType::Bytes,
        ] {
            let out = Tensor::new("OUT", datatype, vec![1], Bytes::from_static(&[0, 0, 0, 0]));
            let err = classify(&out, 1, false, None).unwrap_err();
            assert_eq!(
                err,
                Error::InvalidArgument(format!(
                    "class result not available for output due to unsupported type '{datatype}'"
                ))
            );
        }
    }

    #[test]
    fn data_that_does_not_match_shape_is_internal() {
        let mut out = fp32(&[3], &[1.0, 2.0, 3.0]);
        out.data = out.data.slice(..8);
        assert!(matches!(
            classify(&out, 1, false, None),
            Err(Error::Internal(_))
        ));
        let negative = fp32(&[-1], &[]);
        assert_eq!(
            classify(&negative, 1, false, None).unwrap_err(),
            Error::Internal("output tensor shape does not match size of output for 'OUT'".into())
        );
    }

    #[test]
    fn parameters_are_kept() {
        let mut out = fp32(&[1], &[1.0]);
        out.parameters
            .insert("content_type".into(), ParamValue::String("str".into()));
        let result = classify(&out, 1, false, None).unwrap();
        assert_eq!(result.parameters, out.parameters);
    }
}
