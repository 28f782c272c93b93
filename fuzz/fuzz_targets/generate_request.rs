//! Generate requests from arbitrary bytes, by the selector's low bits:
//! 0. Triton's generic mapping (`/generate` of a non-generation model): a JSON body laid into the
//!    inputs of one of three fixed contracts; an accepted input's data must fill its shape exactly;
//! 1. a generation model's REST body (`text_input`, parameters) read into its settings;
//! 2. a gRPC `ModelInferRequest` to a generation model (LLM tensors, `sampling_parameters` JSON)
//!    read into its settings.
#![no_main]

use kiln::core::tensor::{check_bytes_framing, element_count};
use kiln::core::{DataType, InferRequest};
use kiln::engine::generate::params;
use kiln::engine::{ModelMetadata, TensorMetadata};
use kiln::proto::inference::ModelInferRequest;
use kiln::protocol::codec::request_from_wire;
use kiln::protocol::http::generate::{mapped, text};
use kiln::repository::{IoSpec, TensorSpec};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector % 3 {
        0 => {
            if let Ok(request) = mapped::request(&metadata(selector / 3), "1", body) {
                check_inputs(&request);
            }
        }
        1 => {
            if let Ok(request) = text::decode("m", "1", body) {
                settings(&request);
            }
        }
        _ => {
            let Ok(message) = ModelInferRequest::decode(body) else {
                return;
            };
            if let Ok(request) = request_from_wire(message) {
                settings(&request);
            }
        }
    }
});

fn input(name: &str, datatype: &str, shape: &[i64]) -> TensorMetadata {
    TensorMetadata {
        name: name.to_string(),
        datatype: datatype.to_string(),
        shape: shape.to_vec(),
    }
}

/// Batched FP32 [-1, 4] + INT32 [-1, 1] + BOOL [-1, 1]; unbatched BYTES [-1] + UINT64 [2, -1];
/// a zero-sized dimension and two variable ones: FP64 [-1, 0, 3] + INT8 [-1, -1, 2].
fn metadata(selector: u8) -> ModelMetadata {
    let inputs = match selector % 3 {
        0 => vec![
            input("x", "FP32", &[-1, 4]),
            input("n", "INT32", &[-1, 1]),
            input("flag", "BOOL", &[-1, 1]),
        ],
        1 => vec![input("text", "BYTES", &[-1]), input("ids", "UINT64", &[2, -1])],
        _ => vec![input("empty", "FP64", &[-1, 0, 3]), input("grid", "INT8", &[-1, -1, 2])],
    };
    ModelMetadata {
        name: "m".to_string(),
        versions: vec!["1".to_string()],
        platform: "onnxruntime_onnx".to_string(),
        inputs,
        outputs: vec![input("y", "FP32", &[-1, 4])],
    }
}

/// Every input the mapping accepted holds exactly its shape's elements.
fn check_inputs(request: &InferRequest) {
    for tensor in &request.inputs {
        let count = element_count(&tensor.shape).expect("mapped shapes have a count");
        match tensor.datatype.element_size() {
            Some(size) => assert_eq!(tensor.data.len(), count * size, "{}", tensor.name),
            None => assert_eq!(check_bytes_framing(&tensor.data, count), Ok(())),
        }
    }
}

/// The LLM tensors of the bundled tiny_decoder's config.
fn llm_io() -> IoSpec {
    let tensor = |name: &str, datatype: DataType, dims: &[i64]| TensorSpec::new(name, datatype, dims);
    IoSpec {
        max_batch_size: 0,
        inputs: vec![
            tensor("text_input", DataType::Bytes, &[1]),
            tensor("max_tokens", DataType::Int32, &[1]),
            tensor("stream", DataType::Bool, &[1]),
            tensor("temperature", DataType::Fp32, &[1]),
            tensor("top_k", DataType::Int32, &[1]),
            tensor("top_p", DataType::Fp32, &[1]),
            tensor("seed", DataType::Uint64, &[1]),
            tensor("stop", DataType::Bytes, &[-1]),
            tensor("exclude_input_in_output", DataType::Bool, &[1]),
            tensor("sampling_parameters", DataType::Bytes, &[1]),
        ],
        outputs: vec![tensor("text_output", DataType::Bytes, &[-1])],
    }
}

/// A generation request read into its settings: whatever it holds, no panic.
fn settings(request: &InferRequest) {
    let _ = params::parse("m", &llm_io(), request);
}
