//! Pure types shared by every layer: tensors, requests and responses, and the façade error.
//! Nothing here knows about gRPC, HTTP, ONNX Runtime or the scheduler.

pub mod error;
pub mod request;
pub mod tensor;

pub use error::Error;
pub use request::{InferRequest, InferResponse, ParamValue, Parameters, RequestedOutput};
pub use tensor::{DataType, Tensor};
