//! The small fixed model contract the request targets validate against, and the invariants a
//! request that passes validation must satisfy.

use kiln::core::tensor::{check_bytes_framing, element_count};
use kiln::core::{DataType, InferRequest, Tensor};
use kiln::engine::validate::{prepare_inputs, rows};
use kiln::repository::{IoSpec, TensorSpec};

fn tensor(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
    TensorSpec::new(name, datatype, dims)
}

/// `selector` picks one of three contracts: batched (FP32 [2] + BYTES [-1]), not batched
/// (INT64 [-1, 3]), or a single FP16 input whose model shape differs (reshape).
pub fn io_spec(selector: u8) -> IoSpec {
    match selector % 3 {
        0 => IoSpec {
            max_batch_size: 8,
            inputs: vec![
                tensor("F", DataType::Fp32, &[2]),
                tensor("S", DataType::Bytes, &[-1]),
            ],
            outputs: vec![tensor("O", DataType::Fp32, &[2])],
        },
        1 => IoSpec {
            max_batch_size: 0,
            inputs: vec![tensor("I", DataType::Int64, &[-1, 3])],
            outputs: vec![tensor("O", DataType::Int64, &[-1, 3])],
        },
        _ => IoSpec {
            max_batch_size: 4,
            inputs: vec![TensorSpec {
                model_dims: Some(vec![4]),
                ..tensor("H", DataType::Fp16, &[2, 2])
            }],
            outputs: vec![tensor("O", DataType::Fp16, &[2, 2])],
        },
    }
}

/// Validates `request` against the contract `selector` picks; when it passes, every tensor's data
/// must match its (model) shape exactly.
pub fn validate(selector: u8, request: &mut InferRequest) {
    let io = io_spec(selector);
    let Ok(inputs) = prepare_inputs("m", &io, request) else {
        return;
    };
    assert_eq!(inputs.len(), io.inputs.len());
    let _ = rows(&io, &inputs);
    inputs.iter().for_each(assert_filled);
}

/// `tensor`'s data holds exactly its shape's elements.
pub fn assert_filled(tensor: &Tensor) {
    let count = element_count(&tensor.shape).expect("accepted shapes have a count");
    match tensor.datatype.element_size() {
        Some(size) => assert_eq!(tensor.data.len(), count * size, "{}", tensor.name),
        None => assert_eq!(check_bytes_framing(&tensor.data, count), Ok(())),
    }
}
