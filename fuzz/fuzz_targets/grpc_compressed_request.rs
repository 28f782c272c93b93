//! A compressed gRPC `ModelInferRequest`, through the server's decode path: inflated under the
//! decompressed cap (`grpc_frames::inflate`), its entries counted before decoding
//! (`grpc_codec::check_entries_of`), then prost, the wire → core conversion and validation.
//! Checks that the count never undercounts what prost then builds.
#![no_main]

mod spec;

use kiln::proto::inference::ModelInferRequest;
use kiln::protocol::codec::request_from_wire;
use kiln::protocol::grpc_codec::check_entries_of;
use kiln::protocol::grpc_frames::{inflate, Encoding};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Small caps, so that the fuzzer reaches them.
const MAX_DECOMPRESSED: usize = 1 << 20;
const MAX_ENTRIES: usize = 64;

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
    if check_entries_of::<ModelInferRequest>(message, MAX_ENTRIES).is_err() {
        return;
    }
    let Ok(wire) = ModelInferRequest::decode(message) else {
        return;
    };
    assert!(
        entries(&wire) <= MAX_ENTRIES,
        "the count let through a message of {} entries",
        entries(&wire)
    );
    if let Ok(mut request) = request_from_wire(wire) {
        spec::validate(*selector, &mut request);
    }
});

/// The entries prost built: what the count bounds.
fn entries(wire: &ModelInferRequest) -> usize {
    let inputs: usize = wire
        .inputs
        .iter()
        .map(|input| {
            1 + input.parameters.len()
                + input.contents.as_ref().map_or(0, |c| c.bytes_contents.len())
        })
        .sum();
    let outputs: usize = wire.outputs.iter().map(|o| 1 + o.parameters.len()).sum();
    inputs + outputs + wire.raw_input_contents.len() + wire.parameters.len()
}
