//! Pure types shared by every layer: tensors, requests and responses, and the façade error.
//! Nothing here knows about gRPC, HTTP, ONNX Runtime or the scheduler.

pub mod error;
pub mod path;
pub mod request;
pub mod reserved;
pub mod tensor;

pub use error::Error;
pub use request::{
    InferRequest, InferResponse, LoadParameter, ParamValue, Parameters, RequestedOutput,
};
pub use tensor::{DataType, Tensor};

/// Triton's boolean spellings, in any case: `true`/`on`/`1` and `false`/`off`/`0` (command-line
/// flags and config parameters alike).
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Some(true),
        "false" | "off" | "0" => Some(false),
        _ => None,
    }
}
