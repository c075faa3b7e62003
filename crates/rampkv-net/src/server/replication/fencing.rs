//! Fencing: what a failed link holds, and how a takeover fences the copy's primary.
//!
//! # Fault model (what is built today)
//! A link that fails (the backup died, refused, or stayed `REPLICATION_FULL_WAIT_MS_MAX` behind)
//! is failed for good: the primary's later writes are held until a committed configuration
//! removes that backup from the primary's replica sets ([`Replicator::retain_backups`], called
//! by failover), because acknowledging them without the backup before that would break "every
//! acknowledged write is on f + 1 servers". A backup that takes a copy over
//! ([`BackupService::take_over`](super::BackupService::take_over), failover) fences the copy's
//! primary first: its stream stops before its next record and its hellos are refused from then
//! on, unless a catch-up hello of a newer epoch (a new incarnation of that server, primary again
//! after it caught up).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::copy::{BackupShared, BackupStore};
use super::primary::Replicator;
use super::ReplicationError;

impl Replicator {
    /// Keeps waiting only for the backups in `keep` (server index and process incarnation):
    /// the others were removed from every replica set of this primary by a committed
    /// configuration (they failed), so a write they do not hold is still on every copy the
    /// configuration counts. Never undone (a removed backup comes back only by rejoining, with
    /// a new link). Wakes the front ends: replies held only for a removed backup may go.
    pub fn retain_backups(&self, keep: &[(usize, u64)]) {
        for link in self.shared.links.read().iter() {
            if !keep.contains(&(link.backup, link.incarnation)) && !link.removed.swap(true, Ordering::AcqRel) {
                log::warn!(
                    "replication: backup {} ({}) left the replica sets of primary {}; its acknowledgements are no \
                     longer waited for",
                    link.backup,
                    link.address,
                    self.shared.primary
                );
                link.fail(ReplicationError::Removed { backup: link.backup }, &self.shared);
            }
        }
        self.shared.wake();
    }
}

/// [`BackupService::take_over`](super::BackupService::take_over) for a thread that does not own
/// the service.
pub(crate) struct BackupTakeover {
    pub(super) shared: Arc<BackupShared>,
}

impl std::fmt::Debug for BackupTakeover {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("BackupTakeover").finish_non_exhaustive()
    }
}

impl BackupTakeover {
    /// As [`BackupService::failure`](super::BackupService::failure).
    pub(crate) fn failure(&self) -> Option<String> {
        self.shared.failure.get().cloned()
    }

    /// As [`BackupService::take_over`](super::BackupService::take_over).
    pub(crate) fn take_over(&self, primary: u16, epoch: u64) -> Option<Arc<BackupStore>> {
        let copy = {
            let stores = self.shared.stores.lock();
            let copies = stores.get(&primary)?;
            // A copy still catching up is fenced too (its stream stops), but not taken.
            for copy in copies.current.iter().chain(&copies.staging) {
                copy.epoch.fetch_max(epoch, Ordering::AcqRel);
                copy.fenced.store(true, Ordering::Release);
            }
            copies.current.clone()?
        };
        // The stream thread sees the flag before its next record or at its next read timeout.
        drop(copy.streaming.lock());
        Some(copy)
    }
}
