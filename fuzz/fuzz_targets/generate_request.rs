//! Generate requests from arbitrary bytes, by the selector's low bits:
//! 0. Triton's generic mapping (`/generate` of a non-generation model): a JSON body laid into the
//!    inputs of one of three fixed contracts; an accepted input's data must fill its shape exactly;
//! 1. a generation model's REST body (`text_input`, parameters) read into its settings;
//! 2. a gRPC `ModelInferRequest` to a generation model (LLM tensors, `sampling_parameters` JSON)
//!    read into its settings.
#![no_main]

// Only its invariant (`assert_filled`); the request contracts are the other targets'.
#[allow(dead_code)]
mod spec;

use kiln::core::InferRequest;
use kiln::engine::generate::params;
use kiln::engine::{ModelMetadata, TensorMetadata};
use kiln::proto::inference::{ModelConfig, ModelInferRequest};
use kiln::protocol::codec::request_from_wire;
use kiln::protocol::http::generate::{mapped, text};
use kiln::repository::{generation, IoSpec};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector % 3 {
        0 => {
            if let Ok(request) = mapped::request(&metadata(selector / 3), "1", body) {
                // Every input the mapping accepted holds exactly its shape's elements.
                request.inputs.iter().for_each(spec::assert_filled);
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

/// The LLM tensors as the server gives them to a generation model whose config lists none
/// (`generation::complete_config`), built once.
fn llm_io() -> &'static IoSpec {
    static IO: OnceLock<IoSpec> = OnceLock::new();
    IO.get_or_init(|| {
        let mut config = ModelConfig {
            name: "m".to_string(),
            ..Default::default()
        };
        generation::complete_config(&mut config).expect("an empty config takes the LLM tensors");
        IoSpec::from_config(&config).expect("the LLM tensors make an IoSpec")
    })
}

/// A generation request read into its settings: whatever it holds, no panic.
fn settings(request: &InferRequest) {
    let _ = params::parse("m", llm_io(), request);
}
