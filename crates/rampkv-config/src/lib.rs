#![forbid(unsafe_code)]
//! placeholder
pub mod client;
mod codec;
pub mod configuration;
pub mod core;
pub mod error;
pub mod limits;
pub mod node;
pub mod storage;
pub mod timing;
pub mod wire;
