//! Generated protocol types: Triton's `grpc_service.proto` and `model_config.proto` (package
//! `inference`), plus the encoded file-descriptor set used by gRPC reflection and by the
//! `config.pbtxt` text-format parser. A leaf module: every layer may use these types.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod inference {
    tonic::include_proto!("inference");
}

/// `FileDescriptorSet` of both protos, as written by `build.rs`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/inference_descriptor.bin"));
