//! A gRPC `ModelInferRequest` from arbitrary bytes: prost decoding, the wire → core conversion
//! (raw and typed contents, parameters) and validation against a small fixed model contract.
#![no_main]

mod spec;

use kiln::proto::inference::ModelInferRequest;
use kiln::protocol::codec::request_from_wire;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, wire)) = data.split_first() else {
        return;
    };
    let Ok(message) = ModelInferRequest::decode(wire) else {
        return;
    };
    if let Ok(mut request) = request_from_wire(message) {
        spec::validate(selector, &mut request);
    }
});
