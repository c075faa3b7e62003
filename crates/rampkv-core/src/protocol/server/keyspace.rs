//! The server core's key space requests: LIST_KEYS (a page of a partition's live keys, in
//! key-hash order) and COUNT_KEYS (how many live keys some partitions hold), over the store's
//! listing (`storage::listing`, whose contract gives SCAN's guarantee).
//!
//! # Contract
//! A request names partitions of a cluster of `partitions`; a server with a cluster file
//! serves it only if its count agrees and it serves every partition named (with failover: it
//! is their primary now, else `NotPrimary`, which sends the client to the configuration), so a
//! deposed primary never lists or counts what it no longer owns. A server without a cluster
//! file lists what its store holds of the partition (`key_hash % partitions`). Liveness is
//! judged at the request's wall clock (`Now::wall_clock_us`). Nothing is changed or logged.

use super::{Now, Ownership, OwnershipError, Reply, ServerCore};
use crate::storage::ListBounds;
use crate::wire::{CountKeys, ErrorCode, KeyPage, ListKeys, Response};

impl ServerCore {
    /// Serves LIST_KEYS.
    pub(super) fn list_keys(&self, list: ListKeys, now: Now) -> Reply {
        if let Err(refusal) = self.check_partitions(list.partitions, &[list.partition]) {
            return Reply::Response(refusal);
        }
        let (partitions, partition) = (u64::from(list.partitions), u64::from(list.partition));
        let wanted = |hash: u64| hash % partitions == partition;
        let bounds = ListBounds::keys(list.keys_max as usize);
        let listing = self.store.list_keys(list.after, wanted, now.wall_clock_us, bounds);
        let keys = listing.keys.into_iter().map(Vec::from).collect();
        Reply::Response(Response::Keys(KeyPage { keys, resume: listing.resume }))
    }

    /// Serves COUNT_KEYS.
    pub(super) fn count_keys(&self, count: CountKeys, now: Now) -> Reply {
        if let Err(refusal) = self.check_partitions(count.partitions, &count.of) {
            return Reply::Response(refusal);
        }
        let partitions = u64::from(count.partitions);
        let mut counted = vec![false; count.partitions as usize];
        for partition in &count.of {
            counted[*partition as usize] = true; // below `partitions`: the decoder checked
        }
        let wanted = |hash: u64| counted[(hash % partitions) as usize];
        let live = self.store.count_live_keys(wanted, now.wall_clock_us);
        Reply::Response(Response::KeyCount { count: live })
    }

    /// The refusal of a key space request for `of` (partitions of a cluster of `partitions`)
    /// that this server must not answer (module contract).
    fn check_partitions(&self, partitions: u32, of: &[u32]) -> Result<(), Response> {
        let Some(ownership) = self.ownership.get() else { return Ok(()) };
        let own = ownership.cluster.partition_count();
        if partitions != own {
            let message = format!(
                "cluster files differ: the client's has {partitions} partitions, this server's ({}) {own}",
                ownership.index
            );
            return Err(Response::bad_request(message));
        }
        let refusal = of.iter().find_map(|partition| ownership.check_partition(*partition, self.gate.get()).err());
        match refusal {
            None => Ok(()),
            Some(error @ OwnershipError::NotPrimary { .. }) => {
                Err(Response::Error { code: ErrorCode::NotPrimary, message: error.to_string() })
            }
            Some(error) => Err(Response::bad_request(error.to_string())),
        }
    }
}

impl Ownership {
    /// The refusal of `partition` if this server does not own it (with a gate: does not serve
    /// it now), as [`Ownership::check`] for a key.
    fn check_partition(
        &self,
        partition: u32,
        gate: Option<&std::sync::Arc<dyn super::PartitionGate>>,
    ) -> Result<(), OwnershipError> {
        if let Some(gate) = gate {
            return match gate.serves(partition) {
                true => Ok(()),
                false => Err(OwnershipError::NotPrimary { partition, index: self.index }),
            };
        }
        let owner = self.cluster.owner_of_partition(partition).unwrap_or(usize::MAX);
        if owner == self.index {
            return Ok(());
        }
        let owner_address = self.cluster.servers().get(owner).cloned().unwrap_or_default();
        let key = format!("(partition {partition})");
        Err(OwnershipError::NotOwned { key, partition, owner, owner_address, index: self.index })
    }
}
