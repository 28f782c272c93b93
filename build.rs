//! Compiles the Triton protocol contract in `proto/` with the pure-Rust `protox` compiler (no
//! system `protoc`), generates prost messages + tonic stubs, and writes the file-descriptor set
//! that feeds gRPC reflection and the config.pbtxt text-format parser.

use prost::Message;
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/grpc_service.proto", "proto/model_config.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(out.join("inference_descriptor.bin"), fds.encode_to_vec())?;
    // Type names let the codec find a message's descriptor; the codec counts a received
    // message's entries before prost builds them (src/protocol/grpc_codec.rs).
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .bytes(".inference")
        // Written by hand so that `bytes_contents` decodes into one framed buffer
        // (src/proto/contents.rs).
        .extern_path(
            ".inference.InferTensorContents",
            "crate::proto::contents::InferTensorContents",
        )
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .codec_path("crate::protocol::grpc_codec::LimitedCodec")
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
