//! Generates the gRPC services of Triton's `grpc_service.proto` (server and client stubs) over
//! the prost messages kiln-core generates, with kiln's bounded codec
//! (`src/protocol/grpc_codec.rs`).

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "../../proto/grpc_service.proto",
        "../../proto/model_config.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["../../proto"])?;
    let _ = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Every message is kiln-core's.
        .extern_path(".inference", "::kiln_core::proto::inference")
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .codec_path("crate::protocol::grpc_codec::LimitedCodec")
        .compile_fds(fds)?;
    Ok(())
}
