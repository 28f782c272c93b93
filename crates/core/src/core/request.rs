//! Inference requests and responses as the engine sees them, independent of the wire format.

use super::tensor::Tensor;

/// A request or tensor parameter value. Triton's protocol carries five kinds; all are accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int64(i64),
    Uint64(u64),
    Double(f64),
    String(String),
}

impl ParamValue {
    /// The value as a string, if it is one (e.g. MLServer's `content_type`).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ParamValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a non-negative integer, from either integer kind (`priority`, `timeout`).
    pub fn as_unsigned(&self) -> Option<u64> {
        match self {
            ParamValue::Uint64(v) => Some(*v),
            ParamValue::Int64(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// A JSON scalar as a parameter (integers as `Int64`, or `Uint64` beyond it; other numbers
    /// as `Double`); `None` for null, arrays and objects, which parameters cannot be.
    pub fn from_json(value: serde_json::Value) -> Option<ParamValue> {
        use serde_json::Value;
        Some(match value {
            Value::Bool(b) => ParamValue::Bool(b),
            Value::String(s) => ParamValue::String(s),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => ParamValue::Int64(i),
                (None, Some(u)) => ParamValue::Uint64(u),
                _ => ParamValue::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::Null | Value::Array(_) | Value::Object(_) => return None,
        })
    }

    /// The parameter as a JSON value.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            ParamValue::Bool(b) => serde_json::Value::from(*b),
            ParamValue::Int64(i) => serde_json::Value::from(*i),
            ParamValue::Uint64(u) => serde_json::Value::from(*u),
            ParamValue::Double(d) => serde_json::Value::from(*d),
            ParamValue::String(s) => serde_json::Value::from(s.as_str()),
        }
    }
}

/// Named parameters of a request, a tensor or a response, in the order they came: a Python
/// model's `request.parameters()` lists them so, as Triton keeps them.
pub type Parameters = indexmap::IndexMap<String, ParamValue>;

/// An output the client asked for, with its per-output parameters.
#[derive(Debug, Clone, Default)]
pub struct RequestedOutput {
    pub name: String,
    pub parameters: Parameters,
}

/// One inference request, already decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    pub model_name: String,
    /// The version string exactly as sent; empty means "let the server choose".
    pub model_version: String,
    /// Echoed in the response; may be empty.
    pub id: String,
    pub parameters: Parameters,
    /// Inputs in request order; each tensor's bytes are the raw (little-endian) layout.
    pub inputs: Vec<Tensor>,
    /// Empty means "every output of the model".
    pub outputs: Vec<RequestedOutput>,
}

/// The answer to one [`InferRequest`].
#[derive(Debug, Clone, Default)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    pub parameters: Parameters,
    /// Outputs in the order the model produced them, raw layout.
    pub outputs: Vec<Tensor>,
}

/// One load or unload parameter as either protocol sends it.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadParameter {
    Bool(bool),
    Int64(i64),
    String(String),
    /// gRPC `bytes_param`; REST sends `file:` contents base64-encoded and the front end decodes it.
    Bytes(bytes::Bytes),
}

impl LoadParameter {
    /// Triton's name for the parameter type, used in its error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            LoadParameter::Bool(_) => "BOOL",
            LoadParameter::Int64(_) => "INT",
            LoadParameter::String(_) => "STRING",
            LoadParameter::Bytes(_) => "BYTES",
        }
    }
}
