//! Wire protocols over the engine: gRPC ([`grpc`], with the wire ⇄ core conversions in
//! [`codec`]) and REST ([`http`]). Both decode to the engine's types and call the same façade.

pub mod codec;
pub mod grpc;
pub mod http;
