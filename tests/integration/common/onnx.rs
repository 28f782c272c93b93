//! Writes small ONNX models for tests, without any ONNX tooling: `Y = X + W` over FP32 vectors of
//! `n` elements, `W` an initializer filled with `bias`. With a large `n` the model's weights
//! dominate its memory, which is what the unload test measures. Two broken variants (an unknown
//! operator, external data outside the model directory) are hostile model files.

/// Protobuf encoding helpers (wire types 0 = varint, 2 = length-delimited).
fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn field_varint(number: u32, value: u64, out: &mut Vec<u8>) {
    varint(u64::from(number) << 3, out);
    varint(value, out);
}

fn field_bytes(number: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint((u64::from(number) << 3) | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

const FLOAT: u64 = 1;

/// A `ValueInfoProto` for an FP32 vector of `n` elements.
fn value_info(name: &str, n: u64) -> Vec<u8> {
    let mut dim = Vec::new();
    field_varint(1, n, &mut dim); // dim_value
    let mut shape = Vec::new();
    field_bytes(1, &dim, &mut shape); // dim
    let mut tensor = Vec::new();
    field_varint(1, FLOAT, &mut tensor); // elem_type
    field_bytes(2, &shape, &mut tensor); // shape
    let mut type_proto = Vec::new();
    field_bytes(1, &tensor, &mut type_proto); // tensor_type
    let mut info = Vec::new();
    field_bytes(1, name.as_bytes(), &mut info);
    field_bytes(2, &type_proto, &mut info);
    info
}

/// The bytes of an ONNX model computing `Y = X + W` (FP32 `[n]`), `W` all `bias`.
pub fn add_bias_model(n: usize, bias: f32) -> Vec<u8> {
    let raw: Vec<u8> = std::iter::repeat_n(bias.to_le_bytes(), n)
        .flatten()
        .collect();
    let mut initializer = Vec::new();
    field_bytes(9, &raw, &mut initializer); // raw_data
    binary_model(n, "Add", initializer)
}

/// A well-formed model file whose graph is nonsense: `Y = op(X, W)` with an operator that does
/// not exist.
pub fn unknown_op_model(op: &str) -> Vec<u8> {
    let mut initializer = Vec::new();
    field_bytes(9, &[0; 16], &mut initializer); // raw_data
    binary_model(4, op, initializer)
}

/// `Y = X + W` (FP32 `[4]`) whose `W` is external data at `location`, relative to the model file.
pub fn external_data_model(location: &str) -> Vec<u8> {
    let entry = |key: &str, value: &str| {
        let mut entry = Vec::new();
        field_bytes(1, key.as_bytes(), &mut entry);
        field_bytes(2, value.as_bytes(), &mut entry);
        entry
    };
    let mut initializer = Vec::new();
    field_bytes(13, &entry("location", location), &mut initializer); // external_data
    field_bytes(13, &entry("length", "16"), &mut initializer);
    field_varint(14, 1, &mut initializer); // data_location: EXTERNAL
    binary_model(4, "Add", initializer)
}

/// `Y = op(X, W)` over FP32 `[n]`; `initializer_data` holds the fields that give `W` its values.
fn binary_model(n: usize, op: &str, initializer_data: Vec<u8>) -> Vec<u8> {
    let mut node = Vec::new();
    field_bytes(1, b"X", &mut node);
    field_bytes(1, b"W", &mut node);
    field_bytes(2, b"Y", &mut node);
    field_bytes(4, op.as_bytes(), &mut node);
    let mut initializer = Vec::new();
    field_varint(1, n as u64, &mut initializer); // dims
    field_varint(2, FLOAT, &mut initializer); // data_type
    field_bytes(8, b"W", &mut initializer); // name
    initializer.extend_from_slice(&initializer_data);
    let mut graph = Vec::new();
    field_bytes(1, &node, &mut graph);
    field_bytes(2, b"add_bias", &mut graph);
    field_bytes(5, &initializer, &mut graph);
    field_bytes(11, &value_info("X", n as u64), &mut graph);
    field_bytes(12, &value_info("Y", n as u64), &mut graph);
    let mut opset = Vec::new();
    field_bytes(1, b"", &mut opset);
    field_varint(2, 17, &mut opset);
    let mut model = Vec::new();
    field_varint(1, 8, &mut model); // ir_version
    field_bytes(2, b"kiln-test", &mut model); // producer_name
    field_bytes(7, &graph, &mut model);
    field_bytes(8, &opset, &mut model);
    model
}

/// The matching `config.pbtxt` text (no batching, one CPU instance unless `instances` says).
pub fn add_bias_config(name: &str, n: usize, instances: u32) -> String {
    format!(
        "name: \"{name}\"\nbackend: \"onnxruntime\"\nmax_batch_size: 0\n\
         input [ {{ name: \"X\" data_type: TYPE_FP32 dims: [ {n} ] }} ]\n\
         output [ {{ name: \"Y\" data_type: TYPE_FP32 dims: [ {n} ] }} ]\n\
         instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
    )
}

/// The same config as protobuf JSON, as the load API's `config` parameter takes it.
pub fn add_bias_config_json(name: &str, n: usize, instances: u32) -> String {
    serde_json::json!({
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [n]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [n]}],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
    })
    .to_string()
}
