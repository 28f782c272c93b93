//! The REST JSON reader (`protocol::http::json`) and the tensor `data` decoder on arbitrary text:
//! documents, nested scalar arrays, and `data` of every datatype and a chosen element count.
#![no_main]

use kiln::core::tensor::check_bytes_framing;
use kiln::core::DataType;
use kiln::protocol::http::{json, tensor_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&[kind, count], text)) = data.split_first_chunk::<2>() else {
        return;
    };
    let _ = json::parse(text, Some("data"));
    let _ = json::parse(text, None);
    let _ = json::visit_scalars(text, |_| Ok(()));
    let datatype = DataType::ALL[usize::from(kind) % DataType::ALL.len()];
    let count = usize::from(count);
    if let Ok(raw) = tensor_json::decode("x", datatype, count, text) {
        match datatype.element_size() {
            Some(size) => assert_eq!(raw.len(), count * size),
            None => assert_eq!(check_bytes_framing(&raw, count), Ok(())),
        }
    }
});
