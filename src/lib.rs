pub mod backend;
pub mod cli;
pub mod core;
pub mod engine;
pub mod generate;
pub mod idle_poll;
#[cfg(test)]
mod layers;
pub mod logging;
pub mod metrics;
pub mod proto;
pub mod protocol;
pub mod repository;
pub mod scheduler;
pub mod scratch;
pub mod server;
pub mod tls;
pub mod trace;
