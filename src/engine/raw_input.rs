//! Triton's raw binary HTTP request (`Inference-Header-Content-Length: 0`): the body is the data
//! of the model's only input, with no JSON to give its shape. Pure function over the model's
//! [`IoSpec`].

use crate::core::tensor::{element_count, format_dims};
use crate::core::{Error, Tensor};
use crate::invalid_arg;
use crate::repository::IoSpec;
use bytes::Bytes;

/// The tensor of Triton's raw binary request: the data of the model's only input, the shape taken
/// from the config with batch 1 prepended when the model batches and the one variable dimension
/// (if any) solved from the data size. BYTES carries one element. The tensor then goes through
/// [`prepare_inputs`](super::validate::prepare_inputs) like any other.
///
/// # Errors
/// [`Error::InvalidArgument`] when the model does not have exactly one input, has more than one
/// variable dimension, or the data size does not divide into whole elements of the fixed dims.
pub fn raw_input(model: &str, io: &IoSpec, data: Bytes) -> Result<Tensor, Error> {
    let [spec] = io.inputs.as_slice() else {
        return Err(invalid_arg!(
            "raw binary request requires model '{model}' to have exactly one input, but it has {}",
            io.inputs.len()
        ));
    };
    let mut shape: Vec<i64> = (io.max_batch_size > 0)
        .then_some(1)
        .into_iter()
        .chain(spec.dims.iter().copied())
        .collect();
    let variable: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
    if variable.len() > 1 {
        return Err(invalid_arg!(
            "raw binary request for model '{model}' cannot infer the shape of input '{}' with dims {}: \
             at most one dimension may be variable",
            spec.name,
            format_dims(&spec.dims)
        ));
    }
    if let Some(&slot) = variable.first() {
        shape[slot] = match spec.datatype.element_size() {
            None => 1,
            Some(size) => {
                let fixed: Vec<i64> = shape.iter().copied().filter(|&d| d != -1).collect();
                let per_slot = element_count(&fixed)
                    .ok()
                    .and_then(|count| count.checked_mul(size))
                    .filter(|&bytes| bytes > 0 && data.len() % bytes == 0)
                    .ok_or_else(|| {
                        invalid_arg!(
                            "raw binary request of {} bytes does not fill whole elements of input '{}' \
                             with dims {} for model '{model}'",
                            data.len(),
                            spec.name,
                            format_dims(&spec.dims)
                        )
                    })?;
                (data.len() / per_slot) as i64
            }
        };
    }
    Ok(Tensor::new(spec.name.clone(), spec.datatype, shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::frame_bytes;
    use crate::core::{DataType, InferRequest};
    use crate::engine::validate::prepare_inputs;
    use crate::repository::TensorSpec;

    #[test]
    fn raw_input_solves_the_variable_dim() {
        let io = IoSpec {
            max_batch_size: 8,
            inputs: vec![TensorSpec::new("X", DataType::Fp32, &[-1, 2])],
            outputs: vec![],
        };
        let tensor = raw_input("m", &io, Bytes::from(vec![0u8; 24])).unwrap();
        assert_eq!(tensor.shape, vec![1, 3, 2]);
        assert_eq!(tensor.name, "X");
        let mut req = InferRequest {
            inputs: vec![tensor],
            ..Default::default()
        };
        assert!(prepare_inputs("m", &io, &mut req).is_ok());
        assert!(raw_input("m", &io, Bytes::from(vec![0u8; 20]))
            .unwrap_err()
            .message()
            .contains("does not fill whole elements"));
        let empty = raw_input("m", &io, Bytes::new()).unwrap();
        assert_eq!(empty.shape, vec![1, 0, 2]);
    }

    #[test]
    fn raw_input_fixed_bytes_and_errors() {
        let fixed = raw_input(
            "add_sub",
            &IoSpec {
                max_batch_size: 8,
                inputs: vec![TensorSpec::new("A", DataType::Fp32, &[16])],
                outputs: vec![],
            },
            Bytes::from(vec![0u8; 64]),
        )
        .unwrap();
        assert_eq!(fixed.shape, vec![1, 16]);
        let strings = IoSpec {
            max_batch_size: 0,
            inputs: vec![TensorSpec::new("S", DataType::Bytes, &[-1])],
            outputs: vec![],
        };
        assert_eq!(
            raw_input("m", &strings, frame_bytes([b"abc"]))
                .unwrap()
                .shape,
            vec![1]
        );
        assert!(raw_input(
            "m",
            &IoSpec {
                max_batch_size: 8,
                inputs: vec![
                    TensorSpec::new("A", DataType::Fp32, &[16]),
                    TensorSpec::new("B", DataType::Fp32, &[16])
                ],
                outputs: vec![],
            },
            Bytes::new()
        )
        .unwrap_err()
        .message()
        .contains("exactly one input, but it has 2"));
        let two_variable = IoSpec {
            max_batch_size: 0,
            inputs: vec![TensorSpec::new("X", DataType::Fp32, &[-1, -1])],
            outputs: vec![],
        };
        assert!(raw_input("m", &two_variable, Bytes::new())
            .unwrap_err()
            .message()
            .contains("at most one dimension may be variable"));
    }
}
