//! A REST inference body: the `Inference-Header-Content-Length` split between the JSON header and
//! binary tensor data, request decoding, Triton's raw binary request (length 0), and validation
//! against a small fixed model contract.
#![no_main]

mod spec;

use bytes::Bytes;
use kiln::engine::raw_input::raw_input;
use kiln::protocol::http::infer::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&[selector, high, low], body)) = data.split_first_chunk::<3>() else {
        return;
    };
    let body = Bytes::copy_from_slice(body);
    // 0xFFFF: no header (all JSON); otherwise a length within the body, 0 being the raw request.
    let header_length = match u16::from_be_bytes([high, low]) {
        u16::MAX => None,
        n => Some(usize::from(n) % (body.len() + 1)),
    };
    let mut request = match header_length {
        Some(0) => match raw_input("m", &spec::io_spec(selector), body) {
            Ok(input) => kiln::core::InferRequest {
                model_name: "m".into(),
                inputs: vec![input],
                ..Default::default()
            },
            Err(_) => return,
        },
        _ => match decode("m", "", body, header_length) {
            Ok((request, _formats)) => request,
            Err(_) => return,
        },
    };
    spec::validate(selector, &mut request);
});
