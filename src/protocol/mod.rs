//! Wire protocols over the engine: gRPC today ([`grpc`]), with the wire ⇄ core conversions in
//! [`codec`] so that every front end shares them.

pub mod codec;
pub mod grpc;
