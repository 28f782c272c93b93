//! Triton's raw binary HTTP request (`Inference-Header-Content-Length: 0`, or an empty body
//! without the header): the body is the data of the model's only input, with no JSON to give
//! its shape. Pure function over the model's [`IoSpec`]; the rules and messages are Triton's
//! (checked against 2.51).

use crate::core::tensor::{element_count, frame_bytes};
use crate::core::{DataType, Error, Tensor};
use crate::invalid_arg;
use crate::repository::IoSpec;
use bytes::Bytes;

/// Raw requests carry no ID.
const PREFIX: &str = "[request id: <id_unknown>] ";

/// The tensor of Triton's raw binary request: the data of the model's only input, the shape taken
/// from the config with batch 1 prepended when the model batches and the one variable dimension
/// (if any) solved from the data size. A BYTES input must be of shape `[1]`: the body is its one
/// string, unframed. The tensor then goes through
/// [`prepare_inputs`](super::validate::prepare_inputs) like any other.
///
/// # Errors
/// [`Error::InvalidArgument`] when the model does not have exactly one input, has more than one
/// variable dimension, is a BYTES input of another shape, or the data size does not give whole
/// elements of that shape.
pub fn raw_input(model: &str, io: &IoSpec, data: Bytes) -> Result<Tensor, Error> {
    let [spec] = io.inputs.as_slice() else {
        return Err(invalid_arg!(
            "{PREFIX}Raw request must only have 1 input (found 1) to be deduced but got {} \
             inputs in '{model}' model configuration",
            io.inputs.len()
        ));
    };
    let batch = usize::from(io.max_batch_size > 0);
    let mut shape: Vec<i64> = std::iter::repeat_n(1, batch)
        .chain(spec.dims.iter().copied())
        .collect();
    let mut variable = (batch..shape.len()).filter(|&i| shape[i] == -1);
    let axis = variable.next();
    if variable.next().is_some() {
        return Err(invalid_arg!(
            "{PREFIX}The shape of the raw input '{}' can not be deduced because there are more \
             than one variable-sized dimension",
            spec.name
        ));
    }
    let fixed: Vec<i64> = spec.dims.iter().copied().filter(|&d| d != -1).collect();
    let Some(size) = spec.datatype.element_size() else {
        if axis.is_some() || element_count(&fixed).ok() != Some(1) {
            return Err(invalid_arg!(
                "{PREFIX}For BYTE datatype raw input '{}', the model must have input shape [1]",
                spec.name
            ));
        }
        // The one string, length-prefixed as every BYTES element is.
        return Ok(Tensor::new(
            spec.name.clone(),
            DataType::Bytes,
            shape,
            frame_bytes([&data[..]]),
        ));
    };
    let per_row = element_count(&fixed).map_or(0, |count| count.saturating_mul(size));
    if let Some(axis) = axis {
        shape[axis] = (data.len().checked_div(per_row).unwrap_or(0)) as i64;
    }
    let expected = element_count(&shape).map_or(usize::MAX, |count| count.saturating_mul(size));
    if expected != data.len() {
        // Triton checks the size under the name its HTTP front end gives the raw input.
        return Err(invalid_arg!(
            "{PREFIX}input byte size mismatch for input 'raw_input' for model '{model}'. \
             Expected {expected}, got {}",
            data.len()
        ));
    }
    Ok(Tensor::new(spec.name.clone(), spec.datatype, shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::InferRequest;
    use crate::engine::validate::prepare_inputs;
    use crate::repository::TensorSpec;

    fn one(max_batch_size: usize, datatype: DataType, dims: &[i64]) -> IoSpec {
        IoSpec {
            max_batch_size,
            inputs: vec![TensorSpec::new("X", datatype, dims)],
            outputs: vec![],
        }
    }

    fn refusal(io: &IoSpec, data: &[u8]) -> String {
        raw_input("m", io, Bytes::copy_from_slice(data))
            .unwrap_err()
            .message()
            .to_string()
    }

    #[test]
    fn raw_input_solves_the_variable_dim() {
        let io = one(8, DataType::Fp32, &[-1, 2]);
        let tensor = raw_input("m", &io, Bytes::from(vec![0u8; 24])).unwrap();
        assert_eq!(tensor.shape, vec![1, 3, 2]);
        assert_eq!(tensor.name, "X");
        let mut req = InferRequest {
            inputs: vec![tensor],
            ..Default::default()
        };
        assert!(prepare_inputs("m", &io, &mut req).is_ok());
        // Triton's size check, under the name its front end gives the raw input.
        assert_eq!(
            refusal(&io, &[0; 20]),
            "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for \
             model 'm'. Expected 16, got 20"
        );
        let empty = raw_input("m", &io, Bytes::new()).unwrap();
        assert_eq!(empty.shape, vec![1, 0, 2]);
        // A fixed dimension of 0 takes no bytes, whatever the variable one.
        let zero = one(0, DataType::Fp32, &[0, -1]);
        assert_eq!(raw_input("m", &zero, Bytes::new()).unwrap().shape, [0, 0]);
        assert!(refusal(&zero, &[0; 4]).contains("Expected 0, got 4"));
    }

    #[test]
    fn raw_input_fixed_bytes_and_errors() {
        let fixed = raw_input(
            "add_sub",
            &one(8, DataType::Fp32, &[16]),
            Bytes::from(vec![0u8; 64]),
        )
        .unwrap();
        assert_eq!(fixed.shape, vec![1, 16]);
        assert!(refusal(&one(8, DataType::Fp32, &[16]), &[0; 60]).contains("Expected 64, got 60"));
        let two = IoSpec {
            max_batch_size: 8,
            inputs: vec![
                TensorSpec::new("A", DataType::Fp32, &[16]),
                TensorSpec::new("B", DataType::Fp32, &[16]),
            ],
            outputs: vec![],
        };
        assert_eq!(
            refusal(&two, &[]),
            "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be \
             deduced but got 2 inputs in 'm' model configuration"
        );
        assert_eq!(
            refusal(&one(0, DataType::Fp32, &[-1, -1]), &[]),
            "[request id: <id_unknown>] The shape of the raw input 'X' can not be deduced \
             because there are more than one variable-sized dimension"
        );
    }

    #[test]
    fn a_raw_string_is_the_one_element_of_a_shape_one_input() {
        // The body is the string itself; the tensor frames it as every BYTES element.
        let text = raw_input(
            "m",
            &one(4, DataType::Bytes, &[1]),
            Bytes::from_static(b"hi"),
        )
        .unwrap();
        assert_eq!(text.shape, [1, 1]);
        assert_eq!(&text.data[..], b"\x02\0\0\0hi");
        let empty = raw_input("m", &one(0, DataType::Bytes, &[1]), Bytes::new()).unwrap();
        assert_eq!(
            (&empty.shape[..], &empty.data[..]),
            (&[1i64][..], &[0u8; 4][..])
        );
        for dims in [&[-1][..], &[2], &[1, 1, 2]] {
            assert_eq!(
                refusal(&one(0, DataType::Bytes, dims), b"hi"),
                "[request id: <id_unknown>] For BYTE datatype raw input 'X', the model must \
                 have input shape [1]"
            );
        }
    }
}
