//! Keys, values, timestamps and the timestamp clock.
//!
//! # Timestamps
//! A transaction timestamp is 64 bits: `(clock_us << 16) | client_id`. `clock_us` is a hybrid
//! logical clock in microseconds since [`CLOCK_EPOCH_UNIX_US`] that never goes backwards and
//! never repeats for one client, and `client_id` (16 bits, never 0) is unique among live clients
//! of a cluster (handed out by the cluster's first server, see `wire::Request::Hello`). Hence two
//! transactions never share a timestamp, and timestamps from one client increase. Timestamp 0
//! means "the initial value, never written". 48 bits of microseconds last 8.9 years from the
//! epoch ([`CLOCK_US_MAX`]: until December 2033).
//!
//! # Hostile input
//! Timestamps arrive from other clients (through the versions a read returns) and, at servers,
//! from clients; any of them may be forged. The clock never panics on any input:
//! - [`TimestampClock::observe`] ignores a timestamp further ahead of the caller's wall clock
//!   than [`TIMESTAMP_FUTURE_SKEW_MS`] ([`timestamp_too_far_ahead`]), so one forged timestamp
//!   (`u64::MAX`, say) cannot drag a client's clock to the end of its range, nor spread through
//!   the clients that read it. What such a client then writes to a key pinned by a forged
//!   version stays below it (invisible): servers refuse such timestamps before they are stored
//!   (`timestamp_too_far_ahead`, the same rule, is the server's check).
//! - [`TimestampClock::next`] returns [`ClockError`] instead of a timestamp when the wall clock
//!   reads beyond [`CLOCK_US_MAX`] or the clock has no timestamp left; never a repeated or
//!   smaller one.

/// A value as reads return it: shared with the stored version when the server is in the same
/// process (no copy), owned when decoded from a frame. `bytes`'s `Bytes`, re-exported so that
/// every crate names the same type.
pub use bytes::Bytes;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::limits::TIMESTAMP_FUTURE_SKEW_MS;

/// A name (of a protocol, a transport, a figure ...) that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}; choose one of {}", choices.join(", "))]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
    pub choices: Vec<&'static str>,
}

/// A transaction timestamp. See the module docs for the layout.
pub type Timestamp = u64;

/// The timestamp of the initial (never written) value of every key; its value is empty.
pub const TIMESTAMP_INITIAL: Timestamp = 0;

/// Bits of the timestamp that carry the client id.
pub const CLIENT_ID_BITS: u32 = 16;

/// The largest clock reading (microseconds since [`CLOCK_EPOCH_UNIX_US`]) a timestamp can carry:
/// 48 bits, about 8.9 years.
pub const CLOCK_US_MAX: u64 = (1 << (64 - CLIENT_ID_BITS)) - 1;

/// 2025-01-01T00:00:00Z in microseconds since the Unix epoch.
pub const CLOCK_EPOCH_UNIX_US: u64 = 1_735_689_600_000_000;

/// The client id a timestamp was issued by.
pub fn timestamp_client_id(ts: Timestamp) -> u16 {
    (ts & ((1 << CLIENT_ID_BITS) - 1)) as u16
}

/// The clock reading (microseconds since [`CLOCK_EPOCH_UNIX_US`]) a timestamp carries.
pub fn timestamp_clock_us(ts: Timestamp) -> u64 {
    ts >> CLIENT_ID_BITS
}

/// Whether `ts` claims a time further ahead of `wall_clock_us` (microseconds since
/// [`CLOCK_EPOCH_UNIX_US`], the reader's own [`wall_clock_us`]) than [`TIMESTAMP_FUTURE_SKEW_MS`].
///
/// Honest timestamps are never that far ahead: a client's clock follows its wall clock, moved on
/// only by timestamps it observed, which were themselves within the bound of their issuer's wall
/// clock. A server refuses a PREPARE or COMMIT whose timestamp is too far ahead of its clock;
/// a client's clock ignores such a timestamp when it observes one. Total: no input overflows.
pub fn timestamp_too_far_ahead(ts: Timestamp, wall_clock_us: u64) -> bool {
    timestamp_clock_us(ts) > wall_clock_us.saturating_add(TIMESTAMP_FUTURE_SKEW_MS.saturating_mul(1_000))
}

/// Why a server refuses a transaction timestamp a client sent (a PREPARE, PREPARE_COMMIT, PUT, LOCK_WRITE,
/// COMMIT or COMMIT_LOCKED): no honest client issues it ([`check_client_timestamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimestampError {
    #[error("timestamp 0 is the initial value of every key; no transaction writes at it")]
    Initial,
    #[error("timestamp {ts} carries client id 0, which is never handed out")]
    ClientIdZero { ts: Timestamp },
    #[error(
        "timestamp {ts} is {ahead_us} µs ahead of this server's wall clock, beyond the bound of \
         {TIMESTAMP_FUTURE_SKEW_MS} ms (TIMESTAMP_FUTURE_SKEW_MS): forged, or the client's clock is wrong"
    )]
    TooFarAhead { ts: Timestamp, ahead_us: u64 },
}

/// Checks a timestamp a client asks a server to write at, against the server's wall clock
/// (`wall_clock_us`, microseconds since [`CLOCK_EPOCH_UNIX_US`]): not 0, not client id 0, and not
/// [`timestamp_too_far_ahead`]. A stored forged timestamp would pin its key (every later write
/// is older, hence invisible) and spread to the clients that read it. Total: no input panics.
pub fn check_client_timestamp(ts: Timestamp, wall_clock_us: u64) -> Result<(), TimestampError> {
    if ts == TIMESTAMP_INITIAL {
        return Err(TimestampError::Initial);
    }
    if timestamp_client_id(ts) == 0 {
        return Err(TimestampError::ClientIdZero { ts });
    }
    if timestamp_too_far_ahead(ts, wall_clock_us) {
        return Err(TimestampError::TooFarAhead { ts, ahead_us: timestamp_clock_us(ts) - wall_clock_us });
    }
    Ok(())
}

/// Microseconds since [`CLOCK_EPOCH_UNIX_US`], from the wall clock (0 if the clock is before it).
pub fn wall_clock_us() -> u64 {
    let since_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    since_unix.saturating_sub(CLOCK_EPOCH_UNIX_US)
}

/// Milliseconds since the Unix epoch of a [`wall_clock_us`] reading (microseconds since
/// [`CLOCK_EPOCH_UNIX_US`]): the unit of expiry deadlines ([`Expiry`]).
pub fn unix_ms_of_wall_clock_us(wall_clock_us: u64) -> u64 {
    wall_clock_us.saturating_add(CLOCK_EPOCH_UNIX_US) / 1_000
}

/// Milliseconds since the Unix epoch, from the wall clock: what a writer turns a relative
/// expiry into a deadline with, and what a reader judges deadlines by.
pub fn wall_clock_unix_ms() -> u64 {
    unix_ms_of_wall_clock_us(wall_clock_us())
}

/// When a version stops being visible: a deadline in milliseconds since the Unix epoch, and
/// whether the server dropped the version's value because it expired long ago ("reclaimed").
///
/// # Who decides (docs/architecture.md, "Expiry and deletion")
/// The writer's clock sets the deadline (a relative expiry becomes absolute once per
/// transaction); the reader's clock decides, at one instant per read transaction, whether a
/// version it got is expired (`0 < deadline <= now`: the key reads as absent); the server's
/// clock decides when an expired version's value is reclaimed (`EXPIRY_RECLAIM_MARGIN_MS` after
/// its deadline). A reclaimed version still carries its timestamp, metadata and deadline, and
/// a reader that gets one takes its deadline as a lower bound of its own clock, so a server
/// whose clock runs ahead never makes a reader see part of a transaction expired.
///
/// # Format (one little-endian u64 wherever it travels: wire, log, snapshot, item slot)
/// Bits 0..63: the deadline, ms since the Unix epoch; 0 = never expires; 1 = deleted (expired
/// since the epoch's first millisecond: [`Expiry::DELETED`]). Bit 63: reclaimed, set only by a
/// server on a version whose value it dropped; a client never writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Expiry(u64);

impl Expiry {
    /// Never expires.
    pub const NEVER: Expiry = Expiry(0);
    /// A deletion: a version expired since the Unix epoch (its value is empty).
    pub const DELETED: Expiry = Expiry(1);
    /// The bit of the word that marks a reclaimed version.
    pub const RECLAIMED_BIT: u64 = 1 << 63;
    /// The largest deadline (ms since the Unix epoch) a version can carry.
    pub const DEADLINE_MS_MAX: u64 = Self::RECLAIMED_BIT - 1;

    /// Expires at `deadline_ms` (ms since the Unix epoch; 0: never), or `None` past
    /// [`Expiry::DEADLINE_MS_MAX`].
    pub fn at_ms(deadline_ms: u64) -> Option<Expiry> {
        (deadline_ms <= Self::DEADLINE_MS_MAX).then_some(Expiry(deadline_ms))
    }

    /// The word as it travels (see the format).
    pub fn to_word(self) -> u64 {
        self.0
    }

    /// The expiry a word carries (any word is one: total).
    pub fn from_word(word: u64) -> Expiry {
        Expiry(word)
    }

    /// The deadline in ms since the Unix epoch (0: never).
    pub fn deadline_ms(self) -> u64 {
        self.0 & Self::DEADLINE_MS_MAX
    }

    /// Whether the version expires at all.
    pub fn expires(self) -> bool {
        self.deadline_ms() != 0
    }

    /// Whether a server dropped the version's value (it expired long ago by the server's
    /// clock); the reader must treat its deadline as passed.
    pub fn is_reclaimed(self) -> bool {
        self.0 & Self::RECLAIMED_BIT != 0
    }

    /// The same deadline, marked reclaimed.
    pub fn reclaimed(self) -> Expiry {
        Expiry(self.0 | Self::RECLAIMED_BIT)
    }

    /// Whether the version is expired at `now_ms` (ms since the Unix epoch): reclaimed, or a
    /// deadline at or before `now_ms`.
    pub fn is_expired_at(self, now_ms: u64) -> bool {
        self.is_reclaimed() || (self.expires() && self.deadline_ms() <= now_ms)
    }
}

/// Why a [`TimestampClock`] could not be made or could not issue a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClockError {
    #[error("client id 0 is reserved for the initial value of every key")]
    ReservedClientId,
    #[error(
        "the wall clock reads {now_us} µs after 2025-01-01, beyond the {CLOCK_US_MAX} µs a timestamp can carry \
         (December 2033): set the system clock right"
    )]
    WallClockBeyondRange { now_us: u64 },
    #[error("client {client_id}'s timestamp clock has no timestamp left after {last_us} µs")]
    Exhausted { client_id: u16, last_us: u64 },
}

/// A per-client hybrid logical clock issuing unique, increasing timestamps.
///
/// Wall time keeps clients' timestamps near each other (so a later write usually wins the
/// `lastCommit` max); the logical part guarantees increase even if the wall clock stalls or
/// steps back; the client id makes timestamps of different clients distinct. Invariant:
/// `last_us <= CLOCK_US_MAX`.
#[derive(Debug, Clone)]
pub struct TimestampClock {
    client_id: u16,
    last_us: u64,
}

impl TimestampClock {
    /// A clock for `client_id`.
    ///
    /// # Panics
    /// If `client_id` is 0 (reserved for the initial value). [`TimestampClock::try_new`] returns
    /// an error instead, for ids that come from outside.
    pub fn new(client_id: u16) -> Self {
        Self::try_new(client_id).expect("client id 0 is reserved")
    }

    /// A clock for `client_id`, or [`ClockError::ReservedClientId`] for 0.
    pub fn try_new(client_id: u16) -> Result<Self, ClockError> {
        if client_id == 0 {
            return Err(ClockError::ReservedClientId);
        }
        Ok(Self { client_id, last_us: 0 })
    }

    /// The client id stamped into every timestamp.
    pub fn client_id(&self) -> u16 {
        self.client_id
    }

    /// The next timestamp, given the current wall clock reading (microseconds since
    /// [`CLOCK_EPOCH_UNIX_US`]): above every timestamp issued before and every one observed.
    ///
    /// # Errors
    /// [`ClockError::WallClockBeyondRange`] if `now_us` exceeds [`CLOCK_US_MAX`];
    /// [`ClockError::Exhausted`] if the clock already issued its largest timestamp. The clock
    /// is unchanged by an error.
    pub fn next(&mut self, now_us: u64) -> Result<Timestamp, ClockError> {
        if now_us > CLOCK_US_MAX {
            return Err(ClockError::WallClockBeyondRange { now_us });
        }
        debug_assert!(self.last_us <= CLOCK_US_MAX);
        let next_us = now_us.max(self.last_us + 1); // no overflow: last_us <= CLOCK_US_MAX < u64::MAX
        if next_us > CLOCK_US_MAX {
            return Err(ClockError::Exhausted { client_id: self.client_id, last_us: self.last_us });
        }
        self.last_us = next_us;
        let ts = (next_us << CLIENT_ID_BITS) | u64::from(self.client_id);
        debug_assert!(ts != TIMESTAMP_INITIAL && timestamp_clock_us(ts) == next_us);
        Ok(ts)
    }

    /// Whether `ts` is past what this clock has issued or observed (observing it would move
    /// the clock).
    pub fn is_behind(&self, ts: Timestamp) -> bool {
        timestamp_clock_us(ts) > self.last_us
    }

    /// Moves the clock past everything `earlier` issued or observed: a client that replaces its
    /// sessions (reconnecting after a failover, with new client ids) keeps each one's next
    /// timestamp above its last, even where its clock had run ahead of the wall clock.
    pub fn follow(&mut self, earlier: &TimestampClock) {
        self.last_us = self.last_us.max(earlier.last_us);
    }

    /// Moves the clock past a timestamp seen from another client, so that this client's next
    /// write is newer than anything it has read (a Lamport step). A timestamp too far ahead of
    /// `now_us` (the caller's wall clock, see [`timestamp_too_far_ahead`]) is ignored and false
    /// returned: it is forged or from a clock gone wrong, and following it would carry it into
    /// every later write of this client.
    pub fn observe(&mut self, ts: Timestamp, now_us: u64) -> bool {
        if timestamp_too_far_ahead(ts, now_us) {
            return false;
        }
        // timestamp_clock_us(ts) <= CLOCK_US_MAX for every u64, so the invariant holds.
        self.last_us = self.last_us.max(timestamp_clock_us(ts));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const SKEW_US: u64 = TIMESTAMP_FUTURE_SKEW_MS * 1_000;

    #[test]
    fn timestamps_increase_and_carry_the_client_id_even_when_the_wall_clock_stalls() {
        let mut clock = TimestampClock::new(7);
        let first = clock.next(1_000).unwrap();
        let second = clock.next(1_000).unwrap();
        let third = clock.next(500).unwrap();
        assert!(first < second && second < third);
        for ts in [first, second, third] {
            assert_eq!(timestamp_client_id(ts), 7);
        }
    }

    #[test]
    fn observing_a_newer_timestamp_moves_the_clock_past_it() {
        let mut writer = TimestampClock::new(1);
        let mut reader = TimestampClock::new(2);
        let seen = writer.next(1_000_000).unwrap();
        assert!(reader.observe(seen, 1_000_000));
        assert!(reader.next(10).unwrap() > seen);
    }

    #[test]
    fn a_clock_that_follows_another_issues_above_everything_it_issued() {
        let mut old = TimestampClock::new(3);
        let ahead = old.next(5_000_000).unwrap(); // ahead of the wall clock below
        let mut new = TimestampClock::new(9);
        new.follow(&old);
        let next = new.next(1_000_000).unwrap();
        assert!(timestamp_clock_us(next) > timestamp_clock_us(ahead), "{next} after {ahead}");
        assert_eq!(timestamp_client_id(next), 9);
    }

    #[test]
    fn two_clients_never_share_a_timestamp() {
        let mut a = TimestampClock::new(1);
        let mut b = TimestampClock::new(2);
        for now in 0..1000 {
            assert_ne!(a.next(now).unwrap(), b.next(now).unwrap());
        }
    }

    /// Issue 15: one raw PUT with timestamp u64::MAX pinned its key, and every client that read
    /// the key and then wrote panicked with `clock overflow` (the gateway thread died with it).
    /// The reader's clock now ignores the forged timestamp and keeps issuing ordinary ones.
    #[test]
    fn observing_u64_max_is_ignored_and_the_next_write_still_gets_a_timestamp() {
        let now_us = 1_000_000;
        let mut clock = TimestampClock::new(3);
        assert!(!clock.observe(u64::MAX, now_us));
        let ts = clock.next(now_us).unwrap();
        assert_eq!((timestamp_clock_us(ts), timestamp_client_id(ts)), (now_us, 3));
        // Also when the clock has no wall-clock reading to speak of (0: before the epoch).
        let mut early = TimestampClock::new(4);
        assert!(!early.observe(u64::MAX, 0));
        assert!(early.next(0).is_ok());
    }

    #[test]
    fn a_timestamp_within_the_skew_bound_is_followed_and_one_beyond_is_not() {
        let now_us = 5_000_000;
        let at_bound = ((now_us + SKEW_US) << CLIENT_ID_BITS) | 9;
        let beyond = ((now_us + SKEW_US + 1) << CLIENT_ID_BITS) | 9;
        assert!(!timestamp_too_far_ahead(at_bound, now_us));
        assert!(timestamp_too_far_ahead(beyond, now_us));
        let mut clock = TimestampClock::new(1);
        assert!(!clock.observe(beyond, now_us));
        assert_eq!(timestamp_clock_us(clock.next(now_us).unwrap()), now_us);
        assert!(clock.observe(at_bound, now_us));
        assert_eq!(timestamp_clock_us(clock.next(now_us).unwrap()), now_us + SKEW_US + 1);
    }

    #[test]
    fn the_skew_check_is_total() {
        assert!(!timestamp_too_far_ahead(u64::MAX, u64::MAX));
        assert!(!timestamp_too_far_ahead(0, 0));
        assert!(timestamp_too_far_ahead(u64::MAX, 0));
        assert!(!timestamp_too_far_ahead(TIMESTAMP_INITIAL, 0));
    }

    #[test]
    fn a_wall_clock_beyond_the_range_is_an_error_and_the_last_timestamp_is_issued_once() {
        let mut clock = TimestampClock::new(2);
        for now_us in [CLOCK_US_MAX + 1, u64::MAX] {
            assert_eq!(clock.next(now_us), Err(ClockError::WallClockBeyondRange { now_us }));
        }
        let last = clock.next(CLOCK_US_MAX).unwrap();
        assert_eq!(last, (CLOCK_US_MAX << CLIENT_ID_BITS) | 2);
        let exhausted = ClockError::Exhausted { client_id: 2, last_us: CLOCK_US_MAX };
        assert_eq!(clock.next(CLOCK_US_MAX), Err(exhausted));
        assert_eq!(clock.next(0), Err(exhausted), "an error leaves the clock as it was");
        assert!(clock.observe(last, CLOCK_US_MAX));
        assert_eq!(clock.next(1), Err(exhausted));
    }

    /// Issue 15: a raw PUT at `u64::MAX` pinned its key. The server's check refuses it, and
    /// 0, client id 0 and anything beyond the skew bound; it admits what honest clocks issue.
    #[test]
    fn a_server_refuses_timestamps_no_honest_client_issues() {
        let now_us = 7_000_000;
        assert_eq!(check_client_timestamp(0, now_us), Err(TimestampError::Initial));
        assert_eq!(
            check_client_timestamp(now_us << CLIENT_ID_BITS, now_us),
            Err(TimestampError::ClientIdZero { ts: now_us << CLIENT_ID_BITS })
        );
        let ahead_us = CLOCK_US_MAX - now_us;
        assert_eq!(
            check_client_timestamp(u64::MAX, now_us),
            Err(TimestampError::TooFarAhead { ts: u64::MAX, ahead_us })
        );
        let message = check_client_timestamp(u64::MAX, now_us).unwrap_err().to_string();
        assert!(
            message.contains(&u64::MAX.to_string())
                && message.contains(&ahead_us.to_string())
                && message.contains("1000 ms"),
            "{message}"
        );
        let beyond = ((now_us + SKEW_US + 1) << CLIENT_ID_BITS) | 4;
        assert_eq!(
            check_client_timestamp(beyond, now_us),
            Err(TimestampError::TooFarAhead { ts: beyond, ahead_us: SKEW_US + 1 })
        );
        assert_eq!(check_client_timestamp(((now_us + SKEW_US) << CLIENT_ID_BITS) | 4, now_us), Ok(()));
        let mut clock = TimestampClock::new(u16::MAX);
        assert_eq!(check_client_timestamp(clock.next(now_us).unwrap(), now_us), Ok(()));
        assert_eq!(check_client_timestamp(1, 0), Ok(()), "client 1 at the epoch");
        for wall_clock_us in [0, 1, CLOCK_US_MAX, u64::MAX] {
            for ts in [0, 1, 1 << CLIENT_ID_BITS, u64::MAX - 1, u64::MAX] {
                let _ = check_client_timestamp(ts, wall_clock_us);
            }
        }
    }

    #[test]
    fn client_id_zero_is_an_error_from_try_new() {
        assert_eq!(TimestampClock::try_new(0).unwrap_err(), ClockError::ReservedClientId);
        assert_eq!(TimestampClock::try_new(9).unwrap().client_id(), 9);
    }

    /// Random observations and wall-clock readings, forged and honest, near the ends of the
    /// range: the clock never panics, and what it issues stays unique and increasing.
    #[test]
    fn random_inputs_never_panic_and_issued_timestamps_keep_increasing() {
        let seed = std::env::var("RAMPKV_CLOCK_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_nanos() as u64)
        });
        println!("seed {seed} (replay with RAMPKV_CLOCK_SEED={seed})");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let interesting = [0, 1, CLOCK_US_MAX - 1, CLOCK_US_MAX, CLOCK_US_MAX + 1, u64::MAX - 1, u64::MAX];
        let pick = |rng: &mut rand::rngs::SmallRng| match rng.gen_range(0..4) {
            0 => interesting[rng.gen_range(0..interesting.len())],
            1 => rng.gen(),
            2 => rng.gen_range(0..=CLOCK_US_MAX),
            _ => rng.gen_range(0..1 << 40),
        };
        for _ in 0..200 {
            let client_id = rng.gen_range(1..=u16::MAX);
            let mut clock = TimestampClock::new(client_id);
            // Every later timestamp must exceed what was issued and what was followed.
            let mut floor = TIMESTAMP_INITIAL;
            let mut last_issued = TIMESTAMP_INITIAL;
            for _ in 0..500 {
                let now_us = pick(&mut rng);
                if rng.gen_bool(0.5) {
                    let ts = pick(&mut rng);
                    let followed = clock.observe(ts, now_us);
                    assert_eq!(followed, !timestamp_too_far_ahead(ts, now_us));
                    if followed {
                        floor = floor.max(ts | u64::from(u16::MAX)); // any id at that microsecond
                    }
                } else if let Ok(ts) = clock.next(now_us) {
                    assert!(ts > last_issued && ts > floor, "seed {seed}: {ts} after {last_issued} / {floor}");
                    assert_eq!(timestamp_client_id(ts), client_id);
                    last_issued = ts;
                    floor = ts;
                }
            }
        }
    }
}
