//! Generated protocol types: Triton's `grpc_service.proto` and `model_config.proto` (package
//! `inference`), plus the encoded file-descriptor set used by gRPC reflection, by the
//! `config.pbtxt` text-format parser and by the REST API's protobuf JSON. A leaf module: every
//! layer may use these types.

use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MessageDescriptor};
use std::sync::OnceLock;

pub mod contents;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod inference {
    tonic::include_proto!("inference");
    pub use super::contents::InferTensorContents;
}

/// `FileDescriptorSet` of both protos, as written by `build.rs`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/inference_descriptor.bin"));

/// The descriptors of both protos, decoded once.
pub fn descriptor_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(FILE_DESCRIPTOR_SET)
            .expect("build.rs writes a valid descriptor set for the compiled protos")
    })
}

/// A message as Triton's REST API prints it (`/config`, `/stats`): protobuf JSON with proto field
/// names, enum names, 64-bit integers as numbers, every field without presence printed even at
/// its default (`always_print_primitive_fields`), and fields in the order the `.proto` declares
/// them, as protobuf's printer writes them (prost-reflect writes field-number order).
///
/// # Panics
/// When `type_name` is not the full name of `T` in the protos (a programming error).
pub fn to_json<T: prost::Message>(message: &T, type_name: &str) -> serde_json::Value {
    let descriptor = descriptor_pool()
        .get_message_by_name(type_name)
        .unwrap_or_else(|| panic!("{type_name} is in the descriptor set"));
    let mut dynamic = DynamicMessage::new(descriptor.clone());
    dynamic
        .transcode_from(message)
        .unwrap_or_else(|e| panic!("a prost message transcodes into its own descriptor: {e}"));
    let options = prost_reflect::SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    let mut json = dynamic
        .serialize_with_options(serde_json::value::Serializer, &options)
        .unwrap_or(serde_json::Value::Null);
    integral_floats(&mut json);
    declaration_order(&mut json, &descriptor);
    json
}

/// Rewrites `value`, a `message` as prost-reflect serialized it, with each object's fields in the
/// order `message` declares them (nested messages too: single, repeated and map values), and
/// map entries by key (prost-reflect keeps maps in hash order, which changes from run to run;
/// Triton's order is its own hash map's).
fn declaration_order(value: &mut serde_json::Value, message: &MessageDescriptor) {
    let serde_json::Value::Object(fields) = value else {
        return;
    };
    let mut ordered = serde_json::Map::with_capacity(fields.len());
    for declared in &message.descriptor_proto().field {
        let name = declared.name();
        let Some(mut field_value) = fields.shift_remove(name) else {
            continue;
        };
        if let Some(Kind::Message(nested)) = message.get_field_by_name(name).map(|f| f.kind()) {
            if nested.is_map_entry() {
                if let serde_json::Value::Object(entries) = &mut field_value {
                    entries.sort_keys();
                    if let Kind::Message(entry) = nested.map_entry_value_field().kind() {
                        entries
                            .values_mut()
                            .for_each(|v| declaration_order(v, &entry));
                    }
                }
            } else if let serde_json::Value::Array(items) = &mut field_value {
                items.iter_mut().for_each(|v| declaration_order(v, &nested));
            } else {
                declaration_order(&mut field_value, &nested);
            }
        }
        ordered.insert(name.to_string(), field_value);
    }
    ordered.append(fields);
    *fields = ordered;
}

/// Writes floats with integral values as protobuf's JSON printer (and so Triton) writes them:
/// `1`, not `1.0` (a config's `fp32_false_true: [ 0, 1 ]`).
fn integral_floats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(number) if number.is_f64() => {
            if let Some(float) = number.as_f64() {
                if float.fract() == 0.0 && float.abs() < 9.0e15 {
                    *value = serde_json::Value::from(float as i64);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(integral_floats),
        _ => {}
    }
}
