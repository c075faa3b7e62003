//! What the verbs layer reports about its queues: which queue ([`WorkQueue`]), the state a
//! queue pair is in ([`QueuePairState`]) and the status of a failed completion
//! ([`WorkStatus`]). Plain values that name nothing of this module but `ffi`, so that
//! [`super::VerbsError`] and every room can name them.

use super::ffi;
use std::ffi::c_uint;

/// Which queue of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    /// The send queue: READ, WRITE, atomics, SEND.
    Send,
    /// The receive queue: posted receive buffers.
    Receive,
}

/// The state of a queue pair as this process drove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueuePairState {
    /// Created, not yet usable.
    Reset,
    /// May post receives; not connected.
    Init,
    /// Connected for receiving.
    ReadyToReceive,
    /// Connected: may post sends.
    ReadyToSend,
    /// Send queue drained (only [`QueuePair::query_state`](super::QueuePair::query_state) reports it).
    SendQueueDrained,
    /// Send queue error (only [`QueuePair::query_state`](super::QueuePair::query_state) reports it).
    SendQueueError,
    /// A work request failed, or the device moved it to the error state: unusable.
    Error,
}

impl QueuePairState {
    pub(super) fn from_raw(raw: c_uint) -> Option<QueuePairState> {
        Some(match raw {
            ffi::IBV_QPS_RESET => QueuePairState::Reset,
            ffi::IBV_QPS_INIT => QueuePairState::Init,
            ffi::IBV_QPS_RTR => QueuePairState::ReadyToReceive,
            ffi::IBV_QPS_RTS => QueuePairState::ReadyToSend,
            ffi::IBV_QPS_SQD => QueuePairState::SendQueueDrained,
            ffi::IBV_QPS_SQE => QueuePairState::SendQueueError,
            ffi::IBV_QPS_ERR => QueuePairState::Error,
            _ => return None,
        })
    }
}

/// The status of a failed work completion (`enum ibv_wc_status`).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkStatus {
    /// `IBV_WC_LOC_LEN_ERR`: a local buffer too small (a receive shorter than the message).
    LocalLength,
    /// `IBV_WC_LOC_QP_OP_ERR`: the local queue pair found an inconsistent request.
    LocalQueuePairOperation,
    /// `IBV_WC_LOC_PROT_ERR`: a local buffer outside its region, or the wrong protection domain.
    LocalProtection,
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the queue pair was already in the error state.
    Flushed,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response from the peer.
    BadResponse,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local protection error on incoming data.
    LocalAccess,
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid (e.g. a message too long
    /// for its receive buffer).
    RemoteInvalidRequest,
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused access (wrong rkey, out of its region, or a
    /// right the region was not registered with).
    RemoteAccess,
    /// `IBV_WC_REM_OP_ERR`: the peer could not complete the operation.
    RemoteOperation,
    /// `IBV_WC_RETRY_EXC_ERR`: no answer within the transport retries (the peer is gone or
    /// unreachable).
    RetryExceeded,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive buffer posted, retries exhausted.
    ReceiverNotReadyRetryExceeded,
    /// `IBV_WC_REM_ABORT_ERR`: the peer aborted the operation.
    RemoteAborted,
    /// `IBV_WC_FATAL_ERR`: the device failed.
    Fatal,
    /// `IBV_WC_RESP_TIMEOUT_ERR`: the response did not come in time.
    ResponseTimeout,
    /// `IBV_WC_GENERAL_ERR`: any other error the provider reports.
    General,
    /// A status value this crate does not name.
    Other(u32),
}

impl WorkStatus {
    /// The status of a completion's `status` field; `None` for `IBV_WC_SUCCESS`.
    pub fn from_raw(status: u32) -> Option<WorkStatus> {
        Some(match status {
            0 => return None,
            1 => WorkStatus::LocalLength,
            2 => WorkStatus::LocalQueuePairOperation,
            4 => WorkStatus::LocalProtection,
            5 => WorkStatus::Flushed,
            7 => WorkStatus::BadResponse,
            8 => WorkStatus::LocalAccess,
            9 => WorkStatus::RemoteInvalidRequest,
            10 => WorkStatus::RemoteAccess,
            11 => WorkStatus::RemoteOperation,
            12 => WorkStatus::RetryExceeded,
            13 => WorkStatus::ReceiverNotReadyRetryExceeded,
            16 => WorkStatus::RemoteAborted,
            19 => WorkStatus::Fatal,
            20 => WorkStatus::ResponseTimeout,
            21 => WorkStatus::General,
            other => WorkStatus::Other(other),
        })
    }

    /// The libibverbs name of the status.
    pub fn name(self) -> &'static str {
        match self {
            WorkStatus::LocalLength => "IBV_WC_LOC_LEN_ERR",
            WorkStatus::LocalQueuePairOperation => "IBV_WC_LOC_QP_OP_ERR",
            WorkStatus::LocalProtection => "IBV_WC_LOC_PROT_ERR",
            WorkStatus::Flushed => "IBV_WC_WR_FLUSH_ERR",
            WorkStatus::BadResponse => "IBV_WC_BAD_RESP_ERR",
            WorkStatus::LocalAccess => "IBV_WC_LOC_ACCESS_ERR",
            WorkStatus::RemoteInvalidRequest => "IBV_WC_REM_INV_REQ_ERR",
            WorkStatus::RemoteAccess => "IBV_WC_REM_ACCESS_ERR",
            WorkStatus::RemoteOperation => "IBV_WC_REM_OP_ERR",
            WorkStatus::RetryExceeded => "IBV_WC_RETRY_EXC_ERR",
            WorkStatus::ReceiverNotReadyRetryExceeded => "IBV_WC_RNR_RETRY_EXC_ERR",
            WorkStatus::RemoteAborted => "IBV_WC_REM_ABORT_ERR",
            WorkStatus::Fatal => "IBV_WC_FATAL_ERR",
            WorkStatus::ResponseTimeout => "IBV_WC_RESP_TIMEOUT_ERR",
            WorkStatus::General => "IBV_WC_GENERAL_ERR",
            WorkStatus::Other(_) => "unnamed status",
        }
    }

    /// What the status means, for an error message.
    pub fn meaning(self) -> &'static str {
        match self {
            WorkStatus::LocalLength => "local buffer too small",
            WorkStatus::LocalQueuePairOperation => "local queue pair operation error",
            WorkStatus::LocalProtection => "local protection error",
            WorkStatus::Flushed => "flushed: the queue pair had failed",
            WorkStatus::BadResponse => "bad response from the peer",
            WorkStatus::LocalAccess => "local access error",
            WorkStatus::RemoteInvalidRequest => "the peer found the request invalid",
            WorkStatus::RemoteAccess => "the peer refused access to its memory",
            WorkStatus::RemoteOperation => "the peer failed the operation",
            WorkStatus::RetryExceeded => "transport retries exceeded: the peer is gone or unreachable",
            WorkStatus::ReceiverNotReadyRetryExceeded => "the peer posted no receive buffer in time",
            WorkStatus::RemoteAborted => "the peer aborted the operation",
            WorkStatus::Fatal => "fatal device error",
            WorkStatus::ResponseTimeout => "response timeout",
            WorkStatus::General => "general error",
            WorkStatus::Other(_) => "a status this build does not know",
        }
    }
}

impl std::fmt::Display for WorkStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkStatus::Other(raw) => write!(formatter, "status {raw} ({})", self.meaning()),
            _ => write!(formatter, "{} ({})", self.name(), self.meaning()),
        }
    }
}
