//! [`TransportError`], why a transport failed, and [`ItemRegionError`], why an announced item
//! region cannot be read (public as `transport::onesided::ItemRegionError`).

use rampkv_core::wire::WireError;
use rampkv_fabric::FabricError;

use crate::message::ChannelError;

/// Why a transport failed. A failed transport is broken for good: the caller reconnects.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("cannot set up the client's side of the medium: {0}")]
    Open(ChannelError),
    #[error("cannot connect to server {server} at {address}: {error}")]
    Connect { server: usize, address: String, error: ChannelError },
    #[error("server {server}: {error}")]
    Channel { server: usize, error: ChannelError },
    #[error("server {server} closed the connection")]
    Closed { server: usize },
    #[error("server {server} sent bytes that are not a valid reply: {error}")]
    Malformed { server: usize, error: WireError },
    #[error("server {server} sent a message that ends inside a frame")]
    CutFrame { server: usize },
    #[error("waiting for the servers failed: {0}")]
    Wait(ChannelError),
    #[error("no server {server} (the cluster has {servers})")]
    NoSuchServer { server: usize, servers: usize },
    #[error("a frame of {frame_bytes} bytes for server {server} exceeds the message maximum {message_bytes_max}")]
    MessageTooLarge { server: usize, frame_bytes: usize, message_bytes_max: usize },
    #[error("server {server} announced an item region that cannot be read: {error}")]
    ItemRegion { server: usize, error: ItemRegionError },
}

impl TransportError {
    /// A channel error of `server`, with the end of the connection told apart.
    pub fn channel(server: usize, error: ChannelError) -> TransportError {
        match error {
            ChannelError::Closed => TransportError::Closed { server },
            error => TransportError::Channel { server, error },
        }
    }
}

/// Why an announced item region cannot be read (input from the server).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ItemRegionError {
    #[error("an item region must be read-only for clients")]
    Writable,
    #[error("slots of {slot_bytes} bytes (need a multiple of 8 within the slot bounds)")]
    SlotBytes { slot_bytes: u64 },
    #[error("{slots} slots of {slot_bytes} bytes do not fit the region")]
    TooLarge { slots: u64, slot_bytes: u64 },
    #[error(transparent)]
    Map(#[from] FabricError),
}
