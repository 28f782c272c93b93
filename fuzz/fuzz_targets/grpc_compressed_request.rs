//! A compressed gRPC `ModelInferRequest`, through the server's decode path: inflated under the
//! decompressed cap (`grpc_frames::inflate`), its entries counted before decoding
//! (`grpc_codec::check_decode_cost_of`), then prost, the wire → core conversion and validation.
//! Checks that the estimate never undercounts the structs prost then builds.
#![no_main]

mod spec;

use kiln::proto::inference::ModelInferRequest;
use kiln::protocol::codec::request_from_wire;
use kiln::protocol::grpc_codec::check_decode_cost_of;
use kiln::protocol::grpc_frames::{inflate, Encoding};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Small caps, so that the fuzzer reaches them.
const MAX_DECOMPRESSED: usize = 1 << 20;
const MAX_DECODE_BYTES: usize = 16 * 1024;

fuzz_target!(|data: &[u8]| {
    let [encoding, selector, payload @ ..] = data else {
        return;
    };
    let inflated;
    let message = match encoding % 3 {
        0 => payload,
        1 => match inflate(Encoding::Gzip, payload, MAX_DECOMPRESSED) {
            Ok(bytes) => {
                inflated = bytes;
                &inflated[..]
            }
            Err(_) => return,
        },
        _ => match inflate(Encoding::Deflate, payload, MAX_DECOMPRESSED) {
            Ok(bytes) => {
                inflated = bytes;
                &inflated[..]
            }
            Err(_) => return,
        },
    };
    assert!(message.len() <= MAX_DECOMPRESSED);
    if check_decode_cost_of::<ModelInferRequest>(message, MAX_DECODE_BYTES).is_err() {
        return;
    }
    let Ok(wire) = ModelInferRequest::decode(message) else {
        return;
    };
    assert!(
        structs(&wire) <= MAX_DECODE_BYTES,
        "the estimate let through a message whose structs take {} bytes",
        structs(&wire)
    );
    if let Ok(mut request) = request_from_wire(wire) {
        spec::validate(*selector, &mut request);
    }
});

/// The bytes of the structs prost built for the repeated fields: what the estimate bounds
/// (it charges each twice over, for the growth of its `Vec` or map).
fn structs(wire: &ModelInferRequest) -> usize {
    use kiln::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
    use kiln::proto::inference::InferParameter;
    use std::mem::size_of;
    let parameter = size_of::<(String, InferParameter)>();
    let inputs: usize = wire
        .inputs
        .iter()
        .map(|input| size_of::<InferInputTensor>() + input.parameters.len() * parameter)
        .sum();
    let outputs: usize = wire
        .outputs
        .iter()
        .map(|o| size_of::<InferRequestedOutputTensor>() + o.parameters.len() * parameter)
        .sum();
    inputs
        + outputs
        + wire.raw_input_contents.len() * size_of::<bytes::Bytes>()
        + wire.parameters.len() * parameter
}
