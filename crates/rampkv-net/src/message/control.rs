//! The lines of the fabric's control handshake (like rdma-cm's): the client's hello and
//! response, the server's challenge and verdict or typed refusal, and GET\*'s item region the
//! verdict announces. Only the vocabulary lives here, no I/O: the client's side of the
//! handshake is [`super::fabric::FabricClient`], the server's the fabric front end
//! (`server::front`); `super::fabric` describes the steps, `docs/wire.md` the bytes. Apart from
//! the adapters, so that the channel error ([`super::ChannelError::Refused`]) and the item
//! slots name these types without depending on an adapter.
//!
//! # Fault model
//! Every line comes from outside: the client's lines refuse unknown fields, a token is exactly
//! `2 * CONTROL_CHALLENGE_BYTES` lower-case hex digits, and what a line names (a region, an
//! offset) is checked where it is used.

use rampkv_fabric::RegionDescriptor;
use serde::{Deserialize, Serialize};

use crate::auth::random_bytes;
use rampkv_core::limits::CONTROL_CHALLENGE_BYTES;

/// Version of the control handshake (and of the slot layouts both sides derive from it).
/// 3: the challenge step, one region per connection and the doorbell region. 4: item slots
/// carry an expiry word (their header grew from 40 to 48 bytes: docs/fabric.md).
pub const CONTROL_VERSION: u32 = 4;

/// 32 bytes of the control handshake (a challenge, a nonce, a proof), as lower-case hex on the
/// wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ControlToken(pub [u8; CONTROL_CHALLENGE_BYTES]);

impl std::fmt::Debug for ControlToken {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&hex_encode(&self.0))
    }
}

impl Serialize for ControlToken {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex_encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for ControlToken {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        hex_decode(&text).map(ControlToken).ok_or_else(|| {
            serde::de::Error::custom(format!("expected {} lower-case hex digits", 2 * CONTROL_CHALLENGE_BYTES))
        })
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `N` bytes from exactly `2 * N` lower-case hex digits.
pub(crate) fn hex_decode<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |character: u8| match character {
        b'0'..=b'9' => Some(character - b'0'),
        b'a'..=b'f' => Some(character - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; N];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = digit(digits[2 * index])? << 4 | digit(digits[2 * index + 1])?;
    }
    Some(bytes)
}

impl ControlToken {
    /// Fresh random bytes.
    pub fn random() -> std::io::Result<Self> {
        random_bytes().map(ControlToken)
    }

    /// Word `index` of the challenge (little-endian), as a client stores it in its slot.
    pub fn word(&self, index: usize) -> u64 {
        u64::from_le_bytes(self.0[8 * index..8 * index + 8].try_into().expect("8 bytes"))
    }
}

/// The fabric media.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediumKind {
    Ring,
    SendRecv,
    RfRpc,
}

/// The client's control line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlHello {
    /// Must be [`CONTROL_VERSION`].
    pub version: u32,
    pub medium: MediumKind,
    /// The client's region, and its slot for this server there.
    pub region: RegionDescriptor,
    pub slot_offset_bytes: u64,
    /// The client's random nonce, when it proves the shared secret (absent: it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<ControlToken>,
}

/// The client's second line, after it wrote the challenge at the start of its slot.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlResponse {
    /// With a shared secret: HMAC-SHA-256(secret, "rampkv-control-1 client" || challenge ||
    /// nonce) (`crate::auth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<ControlToken>,
}

/// The server's control lines: a challenge, then the verdict (or a refusal at once).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
// One reply per connection, parsed once on the control path: its size does not matter, and
// region descriptors grew their optional RDMA fields (host, verbs).
#[allow(clippy::large_enum_variant)]
pub enum ControlReply {
    /// Write these bytes at the start of your slot, then answer with a [`ControlResponse`].
    Challenge {
        challenge: ControlToken,
    },
    Accepted {
        /// The connection's region, and its slot there.
        region: RegionDescriptor,
        slot_offset_bytes: u64,
        /// The region holding the server poller's doorbell (at `DOORBELL_OFFSET_BYTES`).
        doorbell: RegionDescriptor,
        /// GET\*: the server's item region (absent when it publishes no item slots).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        items: Option<ItemRegionInfo>,
        /// With a shared secret: HMAC-SHA-256(secret, "rampkv-control-1 server" || nonce ||
        /// challenge).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<ControlToken>,
    },
    Refused {
        refusal: Refusal,
    },
}

/// Why a server refused a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "refusal", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    #[error("control version {version} is not {supported}")]
    Version { version: u32, supported: u32 },
    /// The line did not parse (the parser's words).
    #[error("bad hello: {message}")]
    BadHello { message: String },
    #[error("all {slots} {medium:?} connection slots are in use")]
    NoFreeSlot { medium: MediumKind, slots: u64 },
    /// The client's region or slot cannot be used (the fabric's words).
    #[error("the client's region cannot be used: {message}")]
    Region { message: String },
    /// The hello names a region of this process's servers (an item, doorbell or connection
    /// region), which a client may never be given as its own memory.
    #[error("the hello names the server's own region {name}")]
    OwnRegion { name: String },
    /// The client's region does not hold the challenge at its slot: the client cannot write
    /// the region it named (or did not).
    #[error("the challenge was not written into the client's region")]
    ChallengeNotWritten,
    /// The server has a shared secret and the hello carries no nonce: the client does not
    /// authenticate.
    #[error(
        "authentication required: the server has a shared secret; connect with --secret-file naming the same file"
    )]
    AuthenticationRequired,
    /// The client's proof is missing or wrong: its secret is not the server's.
    #[error("wrong proof: the client's secret is not the server's")]
    Authentication,
    /// No fabric medium joins the two sides (another host, and RDMA missing on one of them):
    /// the client should reach this server over TCP (the fabric's words).
    #[error("no fabric medium reaches the client's region: {reason}")]
    NoMedium { reason: String },
    /// The server could not register the connection's region (the fabric's words).
    #[error("the server cannot register a region for the connection: {message}")]
    ServerRegion { message: String },
}

/// What a client needs to read a server's slots: the region (mapped read-only) and the slot
/// geometry. Travels in the fabric control handshake ([`ControlReply::Accepted`]). Slot `i`
/// starts at byte `i * slot_bytes`; the lease word at
/// `item_slots::lease_word_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemRegionInfo {
    /// The item region (access `ReadOnly`).
    pub region: RegionDescriptor,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Slots in the region.
    pub slots: u64,
}
