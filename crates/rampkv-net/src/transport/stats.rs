//! The counters a [`super::ClientTransport`] reports: GET\* reads ([`GetStarStats`], public
//! as `transport::onesided::GetStarStats`) and the interleaving model
//! ([`InterleaveStats`], public as `transport::interleave::InterleaveStats`). Plain values,
//! below the trait and the transports that fill them.

use serde::Serialize;

/// GET\* counters of one client transport (summed over client threads in the bench).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GetStarStats {
    /// GET requests eligible for GET\* (all selectors LATEST or LATEST_TS).
    pub eligible_gets: u64,
    /// Of those, served by one-sided slot reads alone.
    pub hits: u64,
    /// Slots read and accepted (one per key of a hit, and of partial attempts).
    pub slots_accepted: u64,
    /// Torn attempts that were retried and then succeeded.
    pub torn_retries: u64,
    /// Fallbacks to GET+ because a key was not in the address cache (or the server has no
    /// item region).
    pub fallback_miss: u64,
    /// ... because a slot was torn in every attempt.
    pub fallback_torn: u64,
    /// ... because a slot held another key.
    pub fallback_wrong_key: u64,
    /// ... because a slot held no valid version.
    pub fallback_not_valid: u64,
    /// ... because a slot was over its capacity, had undefined flags, ts 0 or metadata that
    /// does not decode.
    pub fallback_corrupt: u64,
    /// ... because the newer-prepared bit was set and the option is on.
    pub fallback_newer_prepared: u64,
    /// ... because the server's lease word did not cover the read (no lease, or it ends within
    /// `GETSTAR_LEASE_MARGIN_US` of the clock read after the slots).
    pub fallback_unleased: u64,
    /// Address-cache entries evicted after a failed slot check.
    pub evictions: u64,
    /// Address-cache entries learnt (new or changed) from GET_LOCATE replies.
    pub cache_fills: u64,
    /// Lease words read (a region's word is read until it settles what it says for the
    /// region's life, `transport::onesided`: with no lease needed, once per server).
    pub lease_word_reads: u64,
}

impl GetStarStats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &GetStarStats) {
        self.eligible_gets += other.eligible_gets;
        self.hits += other.hits;
        self.slots_accepted += other.slots_accepted;
        self.torn_retries += other.torn_retries;
        self.fallback_miss += other.fallback_miss;
        self.fallback_torn += other.fallback_torn;
        self.fallback_wrong_key += other.fallback_wrong_key;
        self.fallback_not_valid += other.fallback_not_valid;
        self.fallback_corrupt += other.fallback_corrupt;
        self.fallback_newer_prepared += other.fallback_newer_prepared;
        self.fallback_unleased += other.fallback_unleased;
        self.evictions += other.evictions;
        self.cache_fills += other.cache_fills;
        self.lease_word_reads += other.lease_word_reads;
    }

    /// Fallbacks to GET+, all reasons.
    pub fn fallbacks(&self) -> u64 {
        self.fallback_miss
            + self.fallback_torn
            + self.fallback_wrong_key
            + self.fallback_not_valid
            + self.fallback_corrupt
            + self.fallback_newer_prepared
            + self.fallback_unleased
    }
}

/// Counters of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct InterleaveStats {
    /// Requests delivered.
    pub delivered: u64,
    /// Of those, requests delivered to their server after a request posted later (by another
    /// session): the reorderings the model made.
    pub overtaken: u64,
    /// Times the clock jumped ahead instead of waiting ([`Pacing::SkipIdle`]).
    pub idle_skips: u64,
}

impl InterleaveStats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &InterleaveStats) {
        self.delivered += other.delivered;
        self.overtaken += other.overtaken;
        self.idle_skips += other.idle_skips;
    }
}
