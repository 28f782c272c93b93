//! Wire protocols over the engine: gRPC ([`grpc`], with the wire ⇄ core conversions in
//! [`codec`], decoupled generation responses in [`decoupled`]) and REST ([`http`]). Both decode to the engine's types and call the same façade.
//! In front of both: [`access`] (restricted APIs, bearer token), [`grpc_web`] (browsers on the gRPC listener) and [`in_flight`] (responses
//! not yet sent, which graceful shutdown waits for).

pub mod access;
pub mod codec;
pub mod connection;
pub mod decoupled;
pub mod grpc;
pub mod grpc_codec;
pub mod grpc_frames;
pub mod grpc_web;
pub mod http;
pub mod in_flight;
pub mod lifecycle;
pub mod limits;
