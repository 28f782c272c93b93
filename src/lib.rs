pub mod backend;
pub mod core;
pub mod engine;
pub mod proto;
pub mod protocol;
pub mod repository;
pub mod scheduler;
pub mod server;
