#![forbid(unsafe_code)]
//! placeholder
pub mod codec;
pub mod configuration;
pub mod error;
pub mod limits;
pub mod timing;
pub mod wire;
