//! Single-key conditional writes (INCR, SETNX, SET NX|XX|GET|KEEPTTL, GETSET, GETDEL, APPEND,
//! EXPIRE, PERSIST, GETEX): what an [`UpdateOp`] does to a value and its deadline, and the
//! client's machine that sends one UPDATE and retries it.
//!
//! # Contract
//! An update runs at its key's server in one step under the key's lock
//! (`protocol::server::update`, `storage::update`): it reads the newest committed version, and
//! stores and commits the new one at the request's timestamp, which must be above every version
//! of the key, with no prepared write of the key in flight. So the updates of one key are
//! linearizable at that server, and an update is, for RAMP, a one-key write transaction like
//! any other (docs/architecture.md, "Single-key conditional writes", has the argument).
//!
//! # Values
//! Updates read and write values in the convention the RESP gateway stores them in
//! (`rampkv_resp::value`), so that INCR sees what SET wrote and GET sees what INCR wrote: a
//! version with the single byte `0x00` is a deleted key (absent, as is a key never written), a
//! value starting with `0x01` is the rest of it, any other value is all its bytes. GETDEL, and an
//! expiry op given a deadline already past, write a deletion as DEL does ([`deletion`]: no
//! value, `Expiry::DELETED`). A Rust client that writes raw bytes starting with `0x00` or
//! `0x01` and then updates them sees them so.
//!
//! # Retries ([`UpdateTxn`])
//! `Busy` (a multi-key write prepared the key and has not committed): the same request again
//! after a backoff that doubles from `UPDATE_BUSY_BACKOFF_US_MIN` to `UPDATE_BUSY_BACKOFF_US_MAX`,
//! at most `UPDATE_BUSY_RETRIES_MAX` times (its writer commits within a round trip, or
//! cooperative termination resolves it). `TsTooLow`: the session's clock observes the newest
//! timestamp (a Lamport step) and the request goes again at once with a new timestamp, at most
//! `UPDATE_TS_RETRIES_MAX` times. Both are bounded too by the transaction timeout.

use std::time::Duration;

use super::ramp::{metadata_for, validate_keys, Algorithm, TxnOptions};
use super::{make_tag, split_tag, InvalidTransaction, MalformedReply, Outgoing, ProtocolError};
use crate::cluster::Cluster;
use crate::limits::{
    UPDATE_BUSY_BACKOFF_US_MAX, UPDATE_BUSY_BACKOFF_US_MIN, UPDATE_BUSY_RETRIES_MAX, UPDATE_TS_LEAD_US,
    UPDATE_TS_RETRIES_MAX, VALUE_BYTES_MAX,
};
use crate::types::{Expiry, Timestamp, CLIENT_ID_BITS, TIMESTAMP_INITIAL};
use crate::wire::{
    ExpireCondition, GetExExpiry, Metadata, Request, Response, SetCondition, SetExpiry, UpdateOp, UpdateResult,
};

/// The whole stored value of a deleted key (the RESP gateway's tombstone).
pub const STORED_DELETED: u8 = 0x00;
/// First byte of a present value stored escaped (empty, or starting with `0x00` or `0x01`).
pub const STORED_ESCAPE: u8 = 0x01;

/// Longest value an update may leave (one byte of the stored form may be the escape).
pub const UPDATE_VALUE_BYTES_MAX: usize = VALUE_BYTES_MAX - 1;

/// The value a stored version holds in the convention of the module docs (`None`: absent).
pub fn present_value(ts: Timestamp, stored: &[u8]) -> Option<&[u8]> {
    if ts == TIMESTAMP_INITIAL {
        return None;
    }
    match stored.split_first() {
        Some((&STORED_DELETED, [])) => None,
        Some((&STORED_ESCAPE, value)) => Some(value),
        _ => Some(stored),
    }
}

/// The stored form of a present `value` (escaped when it is empty or starts with `0x00` or
/// `0x01`).
pub fn stored_form(value: &[u8]) -> Box<[u8]> {
    match value.first() {
        Some(&first) if first != STORED_DELETED && first != STORED_ESCAPE => value.into(),
        _ => [&[STORED_ESCAPE][..], value].concat().into_boxed_slice(),
    }
}

/// Parses a value as Redis reads an integer (`string2ll`): an optional `-`, then decimal digits
/// with no leading zero (except "0" itself), no sign `+`, no spaces, within i64.
pub fn parse_integer(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    if bytes == b"0" {
        return Some(0);
    }
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Accumulated negative: i64::MIN has no positive counterpart.
    let mut value: i64 = 0;
    for digit in digits {
        value = value.checked_mul(10)?.checked_sub(i64::from(digit - b'0'))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

/// The newest committed version of a key as an op reads it: its value (in the convention of the
/// module docs) and its expiry. `None` for an op: absent (never written, deleted, or expired by
/// the primary's clock).
pub type Current<'a> = Option<(&'a [u8], Expiry)>;

/// A version an op writes: its stored form and its expiry.
pub type Written = (Box<[u8]>, Expiry);

/// The version that deletes a key: no value, expired since the epoch (what DEL writes).
pub fn deletion() -> Written {
    (Box::default(), Expiry::DELETED)
}

/// What an op decided for the version it read (`current`), at `now_ms` (ms since the Unix
/// epoch, the primary's clock: it judges the op's deadlines): the version to write (`None`:
/// write nothing) and the result for the client (its `written` filled in by the server once
/// stored).
///
/// # Deadlines (Redis 7's rules)
/// INCR_BY and APPEND keep the key's deadline; SET clears it, keeps it (KEEPTTL) or sets one;
/// EXPIRE sets one if its condition holds; PERSIST clears one; GET_EX sets or clears one or
/// leaves it; GET_DEL deletes. A deadline at or before `now_ms` (SET, EXPIRE, GET_EX) deletes
/// the key instead, as Redis deletes a key given a deadline in the past.
pub fn apply(op: &UpdateOp, current: Current<'_>, now_ms: u64) -> (Option<Written>, UpdateResult) {
    let done = |old: Option<Vec<u8>>, integer: i64| UpdateResult::Done { written: None, old, integer };
    let value = current.map(|(value, _)| value);
    let expiry = current.map_or(Expiry::NEVER, |(_, expiry)| expiry);
    // A version holding `value` that expires at `deadline_ms`, or the deletion if that is past.
    let expiring = |value: &[u8], deadline_ms: u64| match Expiry::at_ms(deadline_ms) {
        Some(expiry) if deadline_ms > now_ms => (stored_form(value), expiry),
        _ => deletion(),
    };
    match op {
        UpdateOp::IncrBy(delta) => {
            let Some(before) = value.map_or(Some(0), parse_integer) else {
                return (None, UpdateResult::NotAnInteger);
            };
            match before.checked_add(*delta) {
                Some(after) => (Some((after.to_string().into_bytes().into(), expiry)), done(None, after)),
                None => (None, UpdateResult::Overflow),
            }
        }
        UpdateOp::Set { value: new, condition, get_old, expiry: set_expiry } => {
            let old = get_old.then(|| value.map(<[u8]>::to_vec)).flatten();
            let writes = match condition {
                SetCondition::Always => true,
                SetCondition::IfAbsent => value.is_none(),
                SetCondition::IfPresent => value.is_some(),
            };
            if !writes {
                return (None, done(old, 0));
            }
            if new.len() > UPDATE_VALUE_BYTES_MAX {
                return (None, UpdateResult::TooLarge { bytes: new.len() as u64 });
            }
            let written = match set_expiry {
                SetExpiry::Clear => (stored_form(new), Expiry::NEVER),
                SetExpiry::Keep => (stored_form(new), expiry),
                SetExpiry::At(deadline_ms) => expiring(new, *deadline_ms),
            };
            (Some(written), done(old, 1))
        }
        UpdateOp::GetDel => match value {
            None => (None, done(None, 0)),
            Some(old) => (Some(deletion()), done(Some(old.to_vec()), 1)),
        },
        UpdateOp::Append(suffix) => {
            let before = value.unwrap_or_default();
            let length = before.len() + suffix.len();
            if length > UPDATE_VALUE_BYTES_MAX {
                return (None, UpdateResult::TooLarge { bytes: length as u64 });
            }
            let after = [before, &suffix[..]].concat();
            (Some((stored_form(&after), expiry)), done(None, length as i64))
        }
        UpdateOp::Expire { deadline_ms, condition } => {
            let Some(value) = value else {
                return (None, done(None, 0));
            };
            // The key's deadline; none is an infinite TTL to GT and LT, as in Redis.
            let has = expiry.expires().then(|| expiry.deadline_ms());
            let holds = match condition {
                ExpireCondition::Always => true,
                ExpireCondition::IfNone => has.is_none(),
                ExpireCondition::IfSome => has.is_some(),
                ExpireCondition::IfLater => has.is_some_and(|has| *deadline_ms > has),
                ExpireCondition::IfEarlier => has.is_none_or(|has| *deadline_ms < has),
                ExpireCondition::IfSomeAndEarlier => has.is_some_and(|has| *deadline_ms < has),
            };
            if !holds {
                return (None, done(None, 0));
            }
            (Some(expiring(value, *deadline_ms)), done(None, 1))
        }
        UpdateOp::Persist => match value {
            Some(value) if expiry.expires() => (Some((stored_form(value), Expiry::NEVER)), done(None, 1)),
            _ => (None, done(None, 0)),
        },
        UpdateOp::GetEx(get_ex) => {
            let Some(value) = value else {
                return (None, done(None, 0));
            };
            let old = Some(value.to_vec());
            let written = match get_ex {
                GetExExpiry::Keep => None,
                GetExExpiry::Persist => expiry.expires().then(|| (stored_form(value), Expiry::NEVER)),
                GetExExpiry::At(deadline_ms) => Some(expiring(value, *deadline_ms)),
            };
            (written, done(old, 1))
        }
    }
}

/// What the session does after an UPDATE's reply.
#[derive(Debug, PartialEq, Eq)]
pub enum UpdateStep {
    /// Finished: the op's result (never `Busy` or `TsTooLow`).
    Done(UpdateResult),
    /// Busy: call [`UpdateTxn::restart`] after this long.
    Backoff(Duration),
    /// Too low a timestamp: observe `newest` with the session's clock, then call
    /// [`UpdateTxn::restart_at`] with the clock's next timestamp.
    NewTimestamp { newest: Timestamp },
}

/// One single-key update: one UPDATE request at a time to the key's server.
#[derive(Debug)]
pub struct UpdateTxn {
    server: usize,
    key: Vec<u8>,
    op: UpdateOp,
    metadata: Metadata,
    ts: Timestamp,
    attempt: u16,
    /// Whether the current attempt's reply came (a second one is ignored).
    answered: bool,
    busy_replies: u32,
    ts_replies: u32,
}

impl UpdateTxn {
    /// Plans `op` on `key` at timestamp `ts`, with what `options`' algorithm attaches to a
    /// write of `key` alone. Refused before anything is sent for an invalid key or timestamp,
    /// and under S2PL (an update takes no lock, so it would slip past a locking transaction).
    pub fn new(
        cluster: &Cluster,
        ts: Timestamp,
        key: Vec<u8>,
        op: UpdateOp,
        options: &TxnOptions,
    ) -> Result<UpdateTxn, ProtocolError> {
        validate_keys(std::iter::once(key.as_slice()))?;
        if options.algorithm == Algorithm::S2pl {
            return Err(InvalidTransaction::LockingAlgorithm.into());
        }
        if ts == TIMESTAMP_INITIAL {
            return Err(InvalidTransaction::ReservedTimestamp.into());
        }
        let value_bytes = match &op {
            UpdateOp::Set { value, .. } | UpdateOp::Append(value) => value.len(),
            _ => 0,
        };
        if value_bytes > UPDATE_VALUE_BYTES_MAX {
            return Err(InvalidTransaction::ValueTooLarge { bytes: value_bytes }.into());
        }
        let metadata = metadata_for(options, std::slice::from_ref(&key))?;
        let server = cluster.server_of(&key);
        Ok(UpdateTxn { server, key, op, metadata, ts, attempt: 0, answered: false, busy_replies: 0, ts_replies: 0 })
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The timestamp of the current attempt.
    pub fn ts(&self) -> Timestamp {
        self.ts
    }

    /// Sends the request (again: a new attempt, so a late reply to the last one is ignored).
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.attempt = self.attempt.wrapping_add(1);
        self.answered = false;
        let request = Request::Update {
            ts: self.ts,
            metadata: self.metadata.clone(),
            key: self.key.clone(),
            op: self.op.clone(),
        };
        out.push(Outgoing { server: self.server, tag: make_tag(self.attempt, 0), request });
    }

    /// Sends the request again after a `Busy` backoff (same timestamp).
    pub fn restart(&mut self, out: &mut Vec<Outgoing>) {
        self.start(out);
    }

    /// Sends the request again with timestamp `ts` (above the newest the server named).
    pub fn restart_at(&mut self, ts: Timestamp, out: &mut Vec<Outgoing>) {
        debug_assert!(ts > self.ts, "a new attempt's timestamp increases");
        self.ts = ts;
        self.start(out);
    }

    /// Takes the reply of the current attempt (`None`: a late reply to an earlier one, or a
    /// second reply to this one).
    pub fn on_reply(&mut self, tag: u32, response: Response) -> Result<Option<UpdateStep>, ProtocolError> {
        let (attempt, part) = split_tag(tag);
        if attempt != self.attempt || self.answered {
            return Ok(None);
        }
        if part != 0 {
            return Err(malformed(MalformedReply::UnknownTag { tag }, self.server));
        }
        self.answered = true;
        let result = match response {
            Response::Updated(result) => result,
            Response::Error { code, message } => {
                return Err(ProtocolError::ServerError { server: self.server, code, message });
            }
            other => {
                let why = MalformedReply::UnexpectedKind { kind: other.kind(), expected: "UPDATED" };
                return Err(malformed(why, self.server));
            }
        };
        Ok(Some(match result {
            UpdateResult::Busy { prepared } => {
                self.busy_replies += 1;
                if self.busy_replies > UPDATE_BUSY_RETRIES_MAX {
                    return Err(ProtocolError::UpdateBusy { attempts: self.busy_replies, prepared });
                }
                let shift = (self.busy_replies - 1).min(16);
                let backoff_us = (UPDATE_BUSY_BACKOFF_US_MIN << shift).min(UPDATE_BUSY_BACKOFF_US_MAX);
                UpdateStep::Backoff(Duration::from_micros(backoff_us))
            }
            UpdateResult::TsTooLow { newest } => {
                self.ts_replies += 1;
                if self.ts_replies > UPDATE_TS_RETRIES_MAX {
                    return Err(ProtocolError::UpdateTimestamps { attempts: self.ts_replies, newest });
                }
                // Concurrent writers of a hot key keep writing timestamps from their clocks
                // while the retry travels: the next attempt leads the newest by a margin that
                // grows with each refusal (100 us, 200 us, ...; at most UPDATE_TS_RETRIES_MAX of
                // them, a few ms, far below the servers' future-skew bound), so it overtakes
                // them instead of trailing each by one round trip.
                let lead_us = u64::from(self.ts_replies) * UPDATE_TS_LEAD_US;
                UpdateStep::NewTimestamp { newest: newest.saturating_add(lead_us << CLIENT_ID_BITS) }
            }
            UpdateResult::Done { written: Some(written), .. } if written != self.ts => {
                return Err(malformed(MalformedReply::WrongVersion { asked: self.ts, got: written }, self.server));
            }
            done => UpdateStep::Done(done),
        }))
    }
}

fn malformed(why: MalformedReply, server: usize) -> ProtocolError {
    ProtocolError::MalformedReply { server, why }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(value: &[u8], condition: SetCondition, get_old: bool) -> UpdateOp {
        UpdateOp::Set { value: value.to_vec(), condition, get_old, expiry: SetExpiry::Clear }
    }

    /// A present value that never expires.
    fn lasting(value: &[u8]) -> Current<'_> {
        Some((value, Expiry::NEVER))
    }

    fn done(old: Option<&[u8]>, integer: i64) -> UpdateResult {
        UpdateResult::Done { written: None, old: old.map(<[u8]>::to_vec), integer }
    }

    #[test]
    fn integers_parse_as_redis_reads_them() {
        for (text, value) in [("0", 0), ("-1", -1), ("42", 42), ("9223372036854775807", i64::MAX)] {
            assert_eq!(parse_integer(text.as_bytes()), Some(value), "{text}");
        }
        assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
        for text in ["", "-", "-0", "007", "+1", " 1", "1 ", "1.0", "9223372036854775808", "abc", "0x10", "١"] {
            assert_eq!(parse_integer(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn each_op_reads_the_value_and_decides_as_redis_does() {
        let incr = |current: Option<&[u8]>, by| apply(&UpdateOp::IncrBy(by), current.and_then(lasting), NOW);
        let number = |text: &[u8]| Some((Box::from(text), Expiry::NEVER));
        assert_eq!(incr(None, 1), (number(b"1"), done(None, 1)));
        assert_eq!(incr(Some(b"41"), 1), (number(b"42"), done(None, 42)));
        assert_eq!(incr(Some(b"-5"), -5), (number(b"-10"), done(None, -10)));
        assert_eq!(incr(Some(b"x"), 1), (None, UpdateResult::NotAnInteger));
        assert_eq!(incr(Some(b""), 1), (None, UpdateResult::NotAnInteger));
        assert_eq!(incr(Some(b"9223372036854775807"), 1), (None, UpdateResult::Overflow));
        assert_eq!(incr(Some(b"-9223372036854775808"), -1), (None, UpdateResult::Overflow));

        let stored = |value: &[u8]| Some((stored_form(value), Expiry::NEVER));
        let apply = |op: &UpdateOp, current: Option<&[u8]>| apply(op, current.and_then(lasting), NOW);
        assert_eq!(apply(&set(b"v", SetCondition::IfAbsent, false), None), (stored(b"v"), done(None, 1)));
        assert_eq!(apply(&set(b"v", SetCondition::IfAbsent, true), Some(b"o")), (None, done(Some(b"o"), 0)));
        assert_eq!(apply(&set(b"v", SetCondition::IfPresent, false), None), (None, done(None, 0)));
        assert_eq!(apply(&set(b"v", SetCondition::IfPresent, true), Some(b"o")), (stored(b"v"), done(Some(b"o"), 1)));
        assert_eq!(apply(&set(b"", SetCondition::Always, true), None), (stored(b""), done(None, 1)));
        assert_eq!(stored_form(b""), Box::from(&[STORED_ESCAPE][..]), "an empty value is escaped");

        // GETDEL yields the deletion itself (what DEL writes), not a tombstone value to map.
        assert_eq!(apply(&UpdateOp::GetDel, None), (None, done(None, 0)));
        assert_eq!(apply(&UpdateOp::GetDel, Some(b"o")), (Some(deletion()), done(Some(b"o"), 1)));
        assert_eq!(deletion(), (Box::default(), Expiry::DELETED));

        let append = |current: Option<&[u8]>, suffix: &[u8]| apply(&UpdateOp::Append(suffix.to_vec()), current);
        assert_eq!(append(None, b"ab"), (stored(b"ab"), done(None, 2)));
        assert_eq!(append(Some(b"ab"), b"cd"), (stored(b"abcd"), done(None, 4)));
        assert_eq!(append(Some(b""), b"\x00"), (stored(b"\x00"), done(None, 1)), "escaped: not a deletion");
        let big = vec![b'x'; UPDATE_VALUE_BYTES_MAX];
        assert_eq!(append(Some(&big), b"y"), (None, UpdateResult::TooLarge { bytes: big.len() as u64 + 1 }));
    }

    /// The primary's clock in these tests (ms since the Unix epoch).
    const NOW: u64 = 1_800_000_000_000;

    fn at(deadline_ms: u64) -> Expiry {
        Expiry::at_ms(deadline_ms).unwrap()
    }

    /// Issue 31: what each op does to a key's deadline, as Redis 7 does (checked against
    /// redis-server 7.0's expireGenericCommand, setGenericCommand and getexCommand).
    #[test]
    fn each_op_keeps_sets_or_clears_the_deadline_as_redis_does() {
        let later = NOW + 10_000;
        let expiring = Some((&b"7"[..], at(later)));
        // INCR and APPEND keep the deadline; a SET clears it unless KEEPTTL; SET with an expiry
        // sets it, and one already past deletes the key.
        let (written, _) = apply(&UpdateOp::IncrBy(1), expiring, NOW);
        assert_eq!(written, Some((Box::from(&b"8"[..]), at(later))));
        let (written, _) = apply(&UpdateOp::Append(b"x".to_vec()), expiring, NOW);
        assert_eq!(written, Some((stored_form(b"7x"), at(later))));
        let set_with =
            |expiry| UpdateOp::Set { value: b"v".to_vec(), condition: SetCondition::Always, get_old: true, expiry };
        assert_eq!(apply(&set_with(SetExpiry::Clear), expiring, NOW).0, Some((stored_form(b"v"), Expiry::NEVER)));
        assert_eq!(apply(&set_with(SetExpiry::Keep), expiring, NOW).0, Some((stored_form(b"v"), at(later))));
        assert_eq!(apply(&set_with(SetExpiry::Keep), None, NOW).0, Some((stored_form(b"v"), Expiry::NEVER)));
        assert_eq!(apply(&set_with(SetExpiry::At(NOW + 5)), expiring, NOW).0, Some((stored_form(b"v"), at(NOW + 5))));
        let (written, result) = apply(&set_with(SetExpiry::At(NOW)), expiring, NOW);
        assert_eq!((written, result), (Some(deletion()), done(Some(b"7"), 1)), "a deadline at now is past");
        let nx_past = UpdateOp::Set {
            value: b"v".to_vec(),
            condition: SetCondition::IfAbsent,
            get_old: false,
            expiry: SetExpiry::At(0),
        };
        assert_eq!(apply(&nx_past, expiring, NOW), (None, done(None, 0)), "NX on a present key writes nothing");

        // EXPIRE: absent keys are never given a deadline; the conditions compare deadlines,
        // none being an infinite TTL; a deadline in the past deletes.
        let expire = |deadline_ms, condition| UpdateOp::Expire { deadline_ms, condition };
        let lasting = lasting(b"7");
        let sets = |current, deadline_ms, condition| {
            let (written, result) = apply(&expire(deadline_ms, condition), current, NOW);
            match result {
                UpdateResult::Done { integer: 1, old: None, .. } => Some(written.expect("1: written").1),
                UpdateResult::Done { integer: 0, old: None, .. } => {
                    assert_eq!(written, None, "0: nothing written");
                    None
                }
                other => panic!("{other:?}"),
            }
        };
        use ExpireCondition::*;
        assert_eq!(sets(None, later, Always), None);
        assert_eq!(sets(lasting, later, Always), Some(at(later)));
        assert_eq!(sets(expiring, later + 1, Always), Some(at(later + 1)));
        assert_eq!(sets(lasting, later, IfNone), Some(at(later)));
        assert_eq!(sets(expiring, later + 1, IfNone), None);
        assert_eq!(sets(lasting, later, IfSome), None);
        assert_eq!(sets(expiring, later - 1, IfSome), Some(at(later - 1)));
        assert_eq!(sets(lasting, later, IfLater), None, "GT: no deadline is infinite");
        assert_eq!(sets(expiring, later, IfLater), None);
        assert_eq!(sets(expiring, later + 1, IfLater), Some(at(later + 1)));
        assert_eq!(sets(lasting, later, IfEarlier), Some(at(later)), "LT: anything is below infinite");
        assert_eq!(sets(expiring, later, IfEarlier), None);
        assert_eq!(sets(expiring, later - 1, IfEarlier), Some(at(later - 1)));
        assert_eq!(sets(lasting, later, IfSomeAndEarlier), None);
        assert_eq!(sets(expiring, later - 1, IfSomeAndEarlier), Some(at(later - 1)));
        assert_eq!(sets(lasting, NOW, Always), Some(Expiry::DELETED), "past: deleted");
        assert_eq!(sets(expiring, 0, IfEarlier), Some(Expiry::DELETED));
        assert_eq!(sets(expiring, 0, IfLater), None);
        let (written, _) = apply(&expire(NOW - 1, Always), lasting, NOW);
        assert_eq!(written, Some(deletion()), "the deletion carries no value");

        // PERSIST: 1 and a lasting version only if there was a deadline.
        assert_eq!(apply(&UpdateOp::Persist, expiring, NOW), (Some((stored_form(b"7"), Expiry::NEVER)), done(None, 1)));
        assert_eq!(apply(&UpdateOp::Persist, lasting, NOW), (None, done(None, 0)));
        assert_eq!(apply(&UpdateOp::Persist, None, NOW), (None, done(None, 0)));

        // GETEX: the value, and the deadline changed as asked.
        let get_ex = |expiry, current| apply(&UpdateOp::GetEx(expiry), current, NOW);
        assert_eq!(get_ex(GetExExpiry::Keep, expiring), (None, done(Some(b"7"), 1)));
        assert_eq!(get_ex(GetExExpiry::At(later), None), (None, done(None, 0)));
        assert_eq!(
            get_ex(GetExExpiry::At(later + 9), lasting),
            (Some((stored_form(b"7"), at(later + 9))), done(Some(b"7"), 1))
        );
        assert_eq!(get_ex(GetExExpiry::At(1), expiring), (Some(deletion()), done(Some(b"7"), 1)));
        assert_eq!(
            get_ex(GetExExpiry::Persist, expiring),
            (Some((stored_form(b"7"), Expiry::NEVER)), done(Some(b"7"), 1))
        );
        assert_eq!(get_ex(GetExExpiry::Persist, lasting), (None, done(Some(b"7"), 1)), "nothing to persist");
    }

    #[test]
    fn stored_values_read_back_through_the_convention() {
        for value in [&b""[..], b"v", b"\x00", b"\x01", b"\x01\x00", b"12"] {
            assert_eq!(present_value(5, &stored_form(value)), Some(value), "{value:?}");
        }
        assert_eq!(present_value(5, &[STORED_DELETED]), None);
        assert_eq!(present_value(TIMESTAMP_INITIAL, b""), None);
    }

    #[test]
    fn busy_backs_off_and_too_low_asks_for_a_new_timestamp_both_bounded() {
        let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
        let options = TxnOptions::default();
        let mut txn = UpdateTxn::new(&cluster, 10 << 16 | 1, b"k".to_vec(), UpdateOp::IncrBy(1), &options).unwrap();
        let mut out = Vec::new();
        txn.start(&mut out);
        let tag = out[0].tag;
        let busy = Response::Updated(UpdateResult::Busy { prepared: 3 });
        let Some(UpdateStep::Backoff(first)) = txn.on_reply(tag, busy.clone()).unwrap() else { panic!() };
        assert_eq!(txn.on_reply(tag, busy.clone()).unwrap(), None, "a second reply to one attempt is ignored");
        txn.restart(&mut out);
        let Some(UpdateStep::Backoff(second)) = txn.on_reply(out[1].tag, busy.clone()).unwrap() else { panic!() };
        assert!(second > first, "{first:?} then {second:?}");
        let too_low = Response::Updated(UpdateResult::TsTooLow { newest: 20 << 16 | 2 });
        txn.restart(&mut out);
        let step = txn.on_reply(out[2].tag, too_low.clone()).unwrap();
        // The first refusal: the next attempt leads the newest by one margin.
        let led = (20 + UPDATE_TS_LEAD_US) << 16 | 2;
        assert_eq!(step, Some(UpdateStep::NewTimestamp { newest: led }));
        txn.restart_at(21 << 16 | 1, &mut out);
        let Request::Update { ts, .. } = &out[3].request else { panic!() };
        assert_eq!(*ts, 21 << 16 | 1);
        let done = Response::Updated(UpdateResult::Done { written: Some(*ts), old: None, integer: 1 });
        assert!(matches!(txn.on_reply(out[3].tag, done).unwrap(), Some(UpdateStep::Done(_))));
        for _ in 0..=UPDATE_TS_RETRIES_MAX {
            txn.restart(&mut out);
            if let Err(error) = txn.on_reply(out.last().unwrap().tag, too_low.clone()) {
                assert!(matches!(error, ProtocolError::UpdateTimestamps { .. }), "{error}");
                return;
            }
        }
        panic!("TsTooLow retried without a bound");
    }

    #[test]
    fn updates_are_refused_under_s2pl_and_for_bad_input_before_anything_is_sent() {
        let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
        let s2pl = TxnOptions { algorithm: Algorithm::S2pl, ..TxnOptions::default() };
        assert!(UpdateTxn::new(&cluster, 1 << 16 | 1, b"k".to_vec(), UpdateOp::GetDel, &s2pl).is_err());
        let options = TxnOptions::default();
        assert!(UpdateTxn::new(&cluster, 0, b"k".to_vec(), UpdateOp::GetDel, &options).is_err());
        assert!(UpdateTxn::new(&cluster, 1 << 16 | 1, vec![b'k'; 300], UpdateOp::GetDel, &options).is_err());
        let huge = UpdateOp::Append(vec![0; VALUE_BYTES_MAX]);
        assert!(UpdateTxn::new(&cluster, 1 << 16 | 1, b"k".to_vec(), huge, &options).is_err());
    }
}
