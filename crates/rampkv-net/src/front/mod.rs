//! A server group's one-sided front end, of either kind: what `rampkv server`, `rampkv local`
//! and the bench's embedded cluster start beside the TCP servers.
//!
//! A group has at most one (they share its deferred-reply exchange): the write-poll ring front
//! end ([`WritePollGroup`]: `writepoll`, `sendrecv` and, with item slots, `onesided` clients)
//! or the remote-fetch RPC one ([`RfRpcGroup`]). Each server of the group gets its own control
//! address, which clients learn from the cluster file (`ring = ...` / `rfrpc = ...`, see
//! [`rampkv_core::cluster`]) or, in an embedded cluster, directly.

pub(crate) mod control;

use std::net::SocketAddr;

use crate::item_slots::ItemSlotConfig;
use crate::server::ServerGroup;
use crate::server_rfrpc::RfRpcGroup;
use crate::server_writepoll::WritePollGroup;
use rampkv_core::cluster::Front;

/// A running front end. Dropping it stops it.
#[derive(Debug)]
pub enum FrontEnd {
    /// The write-poll ring front end.
    Ring(WritePollGroup),
    /// The remote-fetch RPC front end.
    RfRpc(RfRpcGroup),
}

impl FrontEnd {
    /// Starts `front` for the servers of `group`, one control listener per server on `listen`
    /// (port 0: any free port, each its own; a fixed port suits a group of one server).
    /// `item_slots` gives the ring front end GET\* item regions; RF-RPC has none and ignores it.
    pub fn spawn(
        group: &ServerGroup,
        front: Front,
        listen: SocketAddr,
        item_slots: Option<ItemSlotConfig>,
    ) -> std::io::Result<FrontEnd> {
        match front {
            Front::Ring => WritePollGroup::spawn_with_item_slots(group, listen, item_slots).map(FrontEnd::Ring),
            Front::RfRpc => RfRpcGroup::spawn(group, listen).map(FrontEnd::RfRpc),
        }
    }

    /// The control address of every server of the group, in the group's order.
    pub fn control_addresses(&self) -> &[SocketAddr] {
        match self {
            FrontEnd::Ring(front) => front.control_addresses(),
            FrontEnd::RfRpc(front) => front.control_addresses(),
        }
    }

    /// Which kind it is.
    pub fn kind(&self) -> Front {
        match self {
            FrontEnd::Ring(_) => Front::Ring,
            FrontEnd::RfRpc(_) => Front::RfRpc,
        }
    }
}
