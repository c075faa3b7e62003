//! What two queue pairs exchange to connect, and how a queue pair is made: plain values.
//!
//! An [`Endpoint`] travels to the peer over any control channel (it is checked there, never
//! trusted); [`QueuePairOptions`] bound the queues and set the transport's timers, each field
//! checked against its range before anything is created.

use super::error::VerbsError;
use super::limits::{
    MIN_RNR_TIMER_DEFAULT, QUEUE_DEPTH_MAX, RECEIVE_DEPTH_DEFAULT, RETRY_COUNT_DEFAULT, RNR_RETRY_DEFAULT,
    SEND_DEPTH_DEFAULT, SIGNAL_INTERVAL_DEFAULT, TIMEOUT_EXPONENT_DEFAULT,
};
use serde::{Deserialize, Serialize};
use std::ffi::c_uint;

/// Largest queue pair number and packet sequence number (24 bits).
pub(crate) const TWENTY_FOUR_BITS: u32 = (1 << 24) - 1;

/// What a queue pair tells its peer so that the peer can connect to it: a plain value for any
/// control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qp_num: u32,
    /// First packet sequence number it sends (24 bits).
    pub psn: u32,
    /// Its port's GID (RoCE: the IP address it sends from).
    pub gid: [u8; 16],
    /// Its port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Its port's active MTU in bytes (256, 512, 1024, 2048 or 4096).
    pub mtu_bytes: u32,
    /// Most RDMA READs and atomics it accepts outstanding from us (and issues to us).
    pub read_atomic_depth: u8,
}

impl Endpoint {
    /// Checks an endpoint that came from a peer.
    ///
    /// # Errors
    /// `InvalidPeer` naming the rule broken.
    pub fn check(&self) -> Result<(), VerbsError> {
        if self.qp_num > TWENTY_FOUR_BITS || self.qp_num < 2 {
            return Err(VerbsError::InvalidPeer { reason: "queue pair number outside 2..2^24" });
        }
        if self.psn > TWENTY_FOUR_BITS {
            return Err(VerbsError::InvalidPeer { reason: "packet sequence number above 2^24" });
        }
        if mtu_code(self.mtu_bytes).is_none() {
            return Err(VerbsError::InvalidPeer { reason: "MTU is not 256, 512, 1024, 2048 or 4096" });
        }
        if self.read_atomic_depth == 0 {
            return Err(VerbsError::InvalidPeer { reason: "read/atomic depth is zero" });
        }
        Ok(())
    }
}

pub(crate) fn mtu_code(bytes: u32) -> Option<c_uint> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// How a queue pair is made and connected. `Default` gives the bounds of `verbs::limits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePairOptions {
    /// Send requests posted and not yet known complete, at most (1 to `QUEUE_DEPTH_MAX`).
    pub send_depth: u32,
    /// Receive buffers posted at once, at most (1 to `QUEUE_DEPTH_MAX`).
    pub receive_depth: u32,
    /// At least one send in this many is signalled (1 to `send_depth`).
    pub signal_interval: u32,
    /// Whether to create a completion channel (an fd to sleep on when idle).
    pub completion_channel: bool,
    /// Local ACK timeout exponent (4.096 µs * 2^n per attempt; 1 to 31).
    pub timeout_exponent: u8,
    /// Transport retries before `RETRY_EXC_ERR` (0 to 6; Soft-RoCE takes 7 as "forever").
    pub retry_count: u8,
    /// Receiver-not-ready retries (0 to 6; 7, "forever", is refused: it could hang).
    pub rnr_retry: u8,
    /// The RNR NAK timer code this side asks senders to wait (0 to 31).
    pub min_rnr_timer: u8,
}

impl Default for QueuePairOptions {
    fn default() -> Self {
        QueuePairOptions {
            send_depth: SEND_DEPTH_DEFAULT,
            receive_depth: RECEIVE_DEPTH_DEFAULT,
            signal_interval: SIGNAL_INTERVAL_DEFAULT,
            completion_channel: true,
            timeout_exponent: TIMEOUT_EXPONENT_DEFAULT,
            retry_count: RETRY_COUNT_DEFAULT,
            rnr_retry: RNR_RETRY_DEFAULT,
            min_rnr_timer: MIN_RNR_TIMER_DEFAULT,
        }
    }
}

impl QueuePairOptions {
    /// Checks every field against its range.
    ///
    /// # Errors
    /// `InvalidArgument` naming the rule broken.
    pub fn validate(&self) -> Result<(), VerbsError> {
        let invalid = |reason| Err(VerbsError::InvalidArgument { reason });
        if self.send_depth == 0 || self.send_depth > QUEUE_DEPTH_MAX {
            return invalid("send_depth must be 1 to QUEUE_DEPTH_MAX");
        }
        if self.receive_depth == 0 || self.receive_depth > QUEUE_DEPTH_MAX {
            return invalid("receive_depth must be 1 to QUEUE_DEPTH_MAX");
        }
        if self.signal_interval == 0 || self.signal_interval > self.send_depth {
            return invalid("signal_interval must be 1 to send_depth");
        }
        if self.timeout_exponent == 0 || self.timeout_exponent > 31 {
            return invalid("timeout_exponent must be 1 to 31 (0 would mean: wait forever)");
        }
        if self.retry_count > 6 {
            return invalid("retry_count must be 0 to 6 (7 means retry forever on Soft-RoCE)");
        }
        if self.rnr_retry > 6 {
            return invalid("rnr_retry must be 0 to 6 (7 means retry forever)");
        }
        if self.min_rnr_timer > 31 {
            return invalid("min_rnr_timer must be 0 to 31");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint { qp_num: 17, psn: 0x12_3456, gid: [7; 16], lid: 0, mtu_bytes: 1024, read_atomic_depth: 16 }
    }

    #[test]
    fn an_endpoint_is_a_plain_value_that_round_trips() {
        let json = serde_json::to_string(&endpoint()).expect("serialize");
        assert_eq!(serde_json::from_str::<Endpoint>(&json).expect("deserialize"), endpoint());
        endpoint().check().expect("valid");
    }

    #[test]
    fn a_malformed_peer_endpoint_is_refused() {
        let cases = [
            Endpoint { qp_num: 1 << 24, ..endpoint() },
            Endpoint { qp_num: 1, ..endpoint() },
            Endpoint { psn: 1 << 24, ..endpoint() },
            Endpoint { mtu_bytes: 1500, ..endpoint() },
            Endpoint { read_atomic_depth: 0, ..endpoint() },
        ];
        for case in cases {
            assert!(matches!(case.check(), Err(VerbsError::InvalidPeer { .. })), "{case:?}");
        }
    }

    #[test]
    fn options_out_of_range_are_refused() {
        QueuePairOptions::default().validate().expect("defaults are valid");
        let defaults = QueuePairOptions::default();
        let cases = [
            QueuePairOptions { send_depth: 0, ..defaults.clone() },
            QueuePairOptions { receive_depth: QUEUE_DEPTH_MAX + 1, ..defaults.clone() },
            QueuePairOptions { signal_interval: defaults.send_depth + 1, ..defaults.clone() },
            QueuePairOptions { signal_interval: 0, ..defaults.clone() },
            QueuePairOptions { timeout_exponent: 0, ..defaults.clone() },
            QueuePairOptions { retry_count: 7, ..defaults.clone() },
            QueuePairOptions { rnr_retry: 7, ..defaults.clone() },
            QueuePairOptions { min_rnr_timer: 32, ..defaults.clone() },
        ];
        for case in cases {
            assert!(matches!(case.validate(), Err(VerbsError::InvalidArgument { .. })), "{case:?}");
        }
    }
}
