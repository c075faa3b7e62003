//! rampkv-fabric: registered regions and one-sided remote-memory operations, as RDMA offers
//! them, emulated honestly over shared memory.
//!
//! A server registers regions; a client maps them and reads, writes and runs 8-byte atomics on
//! them with no server thread taking part. RDMA's hard parts stay real: a read can race a write
//! and see a torn item, only aligned 8-byte words are atomic, and the target does nothing. The
//! byte formats and the ordering argument are in `docs/fabric.md`.
//!
//! # Layout (bottom up: a module names only those above it in this list, never one below)
//! - [`limits`]: every bound of the crate.
//! - `error`: [`FabricError`], the layer's one error enum (public as `fabric::FabricError`).
//! - `futex`: process-shared futex waits and wakes on a word (the doorbells' sleep; with
//!   [`shm`] and [`verbs`], the only `unsafe` of the crate).
//! - `region`: [`Access`], [`RegionDescriptor`] and the region length rule (public under
//!   [`fabric`]).
//! - [`clock`]: the host's monotonic clock, shared by its processes (GET\* lease words).
//! - [`words`]: memory as 64-bit atomic words ([`Words`]), and the one-sided operations written
//!   once over it.
//! - [`fabric`]: the [`Fabric`] (control path: register, describe, map) and [`OneSided`] (data
//!   path: read, write, compare-and-swap, fetch-add, word read/write, wake) traits.
//! - [`memory`]: an in-process fabric over heap memory, for tests and loom models.
//! - [`shm`]: the shared-memory fabric (files under /dev/shm; with `futex` and [`verbs`], all
//!   `unsafe` of the crate).
//! - [`slot`]: self-verifying item slots for one-sided GET\* reads (a seqlock with checksum).
//! - [`ring`]: message rings for GET+/PUT+ with credit flow control and a cross-process
//!   futex doorbell shared by all rings of a poller.
//! - [`rpc`]: remote-fetch RPC (RF-RPC): requests into the server's ring, replies fetched
//!   from a slot in the server's memory, hybrid fallback to pushed replies, batching.
//! - [`sendrecv`]: two-sided send/recv emulated as RDMA does it: the receiver posts buffers to
//!   a receive queue, the sender (playing the receiving NIC) places each message into the next
//!   posted buffer and appends a completion the receiver polls.
//! - [`verbs`]: real RDMA through libibverbs, loaded at run time (devices, registered regions,
//!   RC queue pairs, batched READ/WRITE/atomics/SEND, completions; with `shm` and `futex`, the
//!   crate's `unsafe`); the lab that runs it on Soft-RoCE is `scripts/rdma-lab.sh`.
//! - [`verbs_fabric`]: the fabric traits over [`verbs`]: shm regions registered with the device,
//!   one RC queue pair per pair of processes set up through a rendezvous, wakes as SENDs.
//! - [`any`]: the product's fabric: shm on one host, verbs across hosts, chosen per peer.

#[cfg(not(target_os = "linux"))]
compile_error!("rampkv-fabric needs Linux: /dev/shm regions and futex doorbells");

pub mod any;
pub mod clock;
mod error;
pub mod fabric;
mod futex;
pub mod limits;
pub mod memory;
mod region;
pub mod ring;
pub mod rpc;
pub mod sendrecv;
pub mod shm;
pub mod slot;
pub mod verbs;
pub mod verbs_fabric;
pub mod words;

pub use any::{AnyFabric, AnyLocalRegion, AnyRemoteRegion, Capabilities, FabricChoice, Medium, ParseFabricChoiceError};
pub use fabric::{Access, Fabric, FabricError, OneSided, RegionDescriptor, VerbsRegionInfo};
pub use memory::{MemoryFabric, MemoryLocalRegion, MemoryRemoteRegion};
pub use region::host_identity;
pub use ring::{
    Doorbell, Doorbells, MessageView, RingAddresses, RingError, RingLayout, RingReceiver, RingSender, SendError,
    WaitError,
};
pub use sendrecv::{Completion, PostError, QueueAddresses, QueueError, QueueLayout, ReceiveQueue, SendQueue};
pub use shm::{cleanup_stale, ShmFabric, ShmLocalRegion, ShmRemoteRegion, StaleCleanup};
pub use slot::{read_slot, slot_bytes, verify_image, SlotReadError, SlotView, SlotWriteError, SlotWriter};
pub use verbs_fabric::{VerbsConfig, VerbsFabric, VerbsLocalRegion, VerbsPort, VerbsRemoteRegion};
pub use words::{FenceOrdering, HeapWords, LoadOrdering, StoreOrdering, Words};
