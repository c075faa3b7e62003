//! UPDATE: a single-key conditional write, served at the key's primary.
//!
//! # Contract
//! The store does the read, the decision and the write in one step under the key's lock
//! (`storage::update`): a key with a prepared, uncommitted version answers `Busy`, a key with
//! a version at or above the request's timestamp `TsTooLow`, and otherwise the op
//! (`protocol::update::apply`) decides from the newest committed value. A version it writes is
//! a one-key write transaction at the request's timestamp, carrying the request's metadata
//! (which must name no key but this one), and is logged as exactly what a PREPARE_COMMIT of
//! that key logs: a PREPARE record and a COMMIT record. So a server's log, its recovery and its
//! backups (the replication stream ships the same records) need nothing new, and the reply is
//! held until those records are durable and replicated, like any write's. An update that wrote
//! nothing logs nothing. The key is republished (GET\* item slots) when it wrote.

use crate::wire::WriteSet;

use super::{Effects, LogRecord, Now, ServerCore};
use crate::protocol::update::{apply, present_value};
use crate::storage::{Key, StoredWrites, UpdateCheck, Version};
use crate::types::{unix_ms_of_wall_clock_us, Expiry, Timestamp};
use crate::wire::{Metadata, Response, UpdateOp, UpdateResult};

impl ServerCore {
    /// Serves UPDATE (its timestamp and ownership already checked by `handle`).
    pub(super) fn update(
        &self,
        ts: Timestamp,
        metadata: Metadata,
        key: Vec<u8>,
        op: &UpdateOp,
        now: Now,
        effects: &mut Effects,
    ) -> Response {
        // The wall clock in the deadlines' unit, ms since the Unix epoch (`Now::wall_clock_us`
        // counts from 2025: divided alone, every deadline looked decades away and an expired
        // key stayed present to updates). 0 (a caller without a clock): nothing has expired.
        let now_ms = now.monotonic_ms;
        let wall_ms = if now.wall_clock_us == 0 { 0 } else { unix_ms_of_wall_clock_us(now.wall_clock_us) };
        let names_other_keys = match &metadata {
            Metadata::WriteSet(write_set) => write_set.len() != 1 || write_set.iter().next() != Some(key.as_slice()),
            Metadata::None | Metadata::Bloom(_) => false,
        };
        if names_other_keys {
            return Response::bad_request(
                "an UPDATE writes its key alone: its write set must name exactly that key (no other key has a \
                 version at its timestamp)",
            );
        }
        let metadata = super::stored_metadata(metadata);
        let key: Key = key.into_boxed_slice();
        let logged = effects.logging().then(|| metadata.clone());
        let mut stored = StoredWrites::new();
        // The primary's clock decides whether the current version has expired (docs/resp.md,
        // "Expiry"): an expired key is absent to the op; and it judges the op's deadlines (one at
        // or before now deletes the key). What each op does to the deadline is `apply`'s.
        let decide = |latest: Option<&Version>| {
            let live =
                latest.filter(|version| version.expiry != Expiry::DELETED && !version.expiry.is_expired_at(wall_ms));
            let current = live.and_then(|version| Some((present_value(version.ts, &version.value)?, version.expiry)));
            apply(op, current, wall_ms)
        };
        let keeping = logged.is_some().then_some(&mut stored);
        let checked = self.store.update_keeping(ts, key.clone(), metadata, decide, now_ms, keeping);
        let result = match checked {
            Err(error) => return Response::bad_request(error.to_string()),
            Ok(UpdateCheck::Busy { prepared }) => UpdateResult::Busy { prepared },
            Ok(UpdateCheck::TsTooLow { newest }) => UpdateResult::TsTooLow { newest },
            Ok(UpdateCheck::Decided { written: false, outcome }) => outcome,
            Ok(UpdateCheck::Decided { written: true, outcome }) => {
                if let Some(metadata) = logged {
                    // The store wrote the key, so it is within `KEY_BYTES_MAX`: the one-key
                    // write set always builds.
                    let write_set =
                        WriteSet::from_keys(&[&key[..]]).expect("a key the store accepted fits a write set");
                    effects.logged.push(LogRecord::Prepare { ts, metadata, write_set, writes: stored });
                    effects.logged.push(LogRecord::Commit { ts });
                }
                effects.note_committed([key]);
                match outcome {
                    UpdateResult::Done { old, integer, .. } => UpdateResult::Done { written: Some(ts), old, integer },
                    other => other,
                }
            }
        };
        Response::Updated(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::server::{Now, Reply};
    use crate::protocol::ConnectionId;
    use crate::storage::Store;
    use crate::wire::{ExpireCondition, GetExExpiry, Request, SetCondition, SetExpiry, Write, WriteSet};

    fn ts(clock: u64) -> Timestamp {
        clock << 16 | 1
    }

    fn alone(key: &[u8]) -> Metadata {
        Metadata::WriteSet(WriteSet::from_keys(&[key]).unwrap())
    }

    fn update(core: &ServerCore, effects: &mut Effects, at: Timestamp, op: UpdateOp) -> Response {
        effects.clear();
        let request = Request::Update { ts: at, metadata: alone(b"k"), key: b"k".to_vec(), op };
        match core.handle(ConnectionId::default(), request, 1, Now::default(), effects) {
            Some(Reply::Response(response)) => response,
            other => panic!("{other:?}"),
        }
    }

    fn value(core: &ServerCore) -> Option<Vec<u8>> {
        core.store().get_latest(b"k").map(|version| version.value.to_vec())
    }

    /// The lead's design (issue 31 item 4): an update decides from the newest committed value
    /// under the key's lock, answers Busy while a write in flight has the key prepared and
    /// TsTooLow below the key's newest version, and logs what it wrote as a PREPARE and a
    /// COMMIT, which replayed on an empty store (recovery, a backup) give the same key.
    #[test]
    fn an_update_decides_from_the_newest_commit_waits_for_prepares_and_logs_a_one_key_write() {
        let core = ServerCore::new(10);
        let mut effects = Effects::new(true);
        effects.set_logging(true);
        let done = |written, integer| Response::Updated(UpdateResult::Done { written, old: None, integer });
        assert_eq!(update(&core, &mut effects, ts(10), UpdateOp::IncrBy(5)), done(Some(ts(10)), 5));
        assert_eq!(value(&core).as_deref(), Some(&b"5"[..]));
        assert_eq!(effects.committed, vec![Key::from(&b"k"[..])], "republished");
        let records = std::mem::take(&mut effects.logged);
        assert!(
            matches!(&records[..], [LogRecord::Prepare { .. }, LogRecord::Commit { ts: committed }] if *committed == ts(10))
        );

        // A multi-key write prepares the key: Busy, nothing changes, nothing is logged.
        let writes = vec![Write::new(b"k".to_vec(), b"100".to_vec())];
        let metadata = Metadata::WriteSet(WriteSet::from_keys(&[&b"k"[..], b"other"]).unwrap());
        let prepare = Request::Prepare { ts: ts(20), metadata, write_set: Vec::new(), writes };
        core.handle(ConnectionId::default(), prepare, 2, Now::default(), &mut effects);
        let busy = update(&core, &mut effects, ts(30), UpdateOp::IncrBy(1));
        assert_eq!(busy, Response::Updated(UpdateResult::Busy { prepared: ts(20) }));
        assert!(effects.logged.is_empty());
        assert_eq!(value(&core).as_deref(), Some(&b"5"[..]));
        // Committed: below its timestamp an update is too low; above, it reads the commit.
        core.handle(ConnectionId::default(), Request::Commit { ts: ts(20) }, 3, Now::default(), &mut effects);
        let too_low = update(&core, &mut effects, ts(15), UpdateOp::IncrBy(1));
        assert_eq!(too_low, Response::Updated(UpdateResult::TsTooLow { newest: ts(20) }));
        assert_eq!(update(&core, &mut effects, ts(30), UpdateOp::IncrBy(1)), done(Some(ts(30)), 101));
        records_replay_to(&core, records.into_iter().chain(std::mem::take(&mut effects.logged)));

        // An op that writes nothing logs nothing; its refusals are results, not errors.
        let nx = UpdateOp::Set {
            value: b"v".to_vec(),
            condition: SetCondition::IfAbsent,
            get_old: true,
            expiry: SetExpiry::Clear,
        };
        let kept = Response::Updated(UpdateResult::Done { written: None, old: Some(b"101".to_vec()), integer: 0 });
        assert_eq!(update(&core, &mut effects, ts(40), nx), kept);
        assert!(effects.logged.is_empty() && effects.committed.is_empty());
        let set = UpdateOp::Set {
            value: b"x".to_vec(),
            condition: SetCondition::Always,
            get_old: false,
            expiry: SetExpiry::Clear,
        };
        update(&core, &mut effects, ts(41), set);
        assert_eq!(
            update(&core, &mut effects, ts(42), UpdateOp::IncrBy(1)),
            Response::Updated(UpdateResult::NotAnInteger)
        );
        // GETDEL: the key reads absent to the next update.
        let getdel = update(&core, &mut effects, ts(43), UpdateOp::GetDel);
        let deleted = UpdateResult::Done { written: Some(ts(43)), old: Some(b"x".to_vec()), integer: 1 };
        assert_eq!(getdel, Response::Updated(deleted));
        assert_eq!(update(&core, &mut effects, ts(44), UpdateOp::IncrBy(-2)), done(Some(ts(44)), -2));
    }

    /// Issue 31: the primary judges expiry by its wall clock in the deadlines' unit (ms since
    /// the Unix epoch). Before, it divided `Now::wall_clock_us` (which counts from 2025) by a
    /// thousand, so every deadline looked decades away: an INCR after a key expired still
    /// counted from the expired value. The expiry ops run on the same judgement.
    #[test]
    fn the_primary_judges_deadlines_by_its_wall_clock_in_unix_milliseconds() {
        let core = ServerCore::new(10);
        let mut effects = Effects::default();
        let wall_clock_us = 100_000_000; // 100 s after the clock's epoch (2025)
        let unix_ms = unix_ms_of_wall_clock_us(wall_clock_us);
        let at =
            |elapsed_ms: u64| Now { monotonic_ms: 1 + elapsed_ms, wall_clock_us: wall_clock_us + elapsed_ms * 1_000 };
        let run = |effects: &mut Effects, elapsed_ms: u64, op: UpdateOp| {
            effects.clear();
            let now = at(elapsed_ms);
            let request =
                Request::Update { ts: now.wall_clock_us << 16 | 1, metadata: alone(b"k"), key: b"k".to_vec(), op };
            match core.handle(ConnectionId::default(), request, 1, now, effects) {
                Some(Reply::Response(Response::Updated(UpdateResult::Done { integer, old, .. }))) => (integer, old),
                other => panic!("{other:?}"),
            }
        };
        let expiry = || core.store().get_latest(b"k").map(|version| version.expiry);
        let expiring = SetExpiry::At(unix_ms + 5_000);
        let set =
            UpdateOp::Set { value: b"7".to_vec(), condition: SetCondition::Always, get_old: false, expiry: expiring };
        assert_eq!(run(&mut effects, 0, set), (1, None));
        assert_eq!(run(&mut effects, 1, UpdateOp::IncrBy(1)), (8, None), "INCR keeps the deadline");
        assert_eq!(expiry(), Expiry::at_ms(unix_ms + 5_000));
        assert_eq!(run(&mut effects, 6_000, UpdateOp::IncrBy(1)), (1, None), "expired: counts from 0");
        assert_eq!(expiry(), Some(Expiry::NEVER));

        // EXPIRE NX, then GT; PERSIST; GETEX; a deadline in the past deletes.
        let expire = |deadline_ms, condition| UpdateOp::Expire { deadline_ms, condition };
        assert_eq!(run(&mut effects, 6_001, expire(unix_ms + 60_000, ExpireCondition::IfNone)), (1, None));
        assert_eq!(expiry(), Expiry::at_ms(unix_ms + 60_000));
        assert_eq!(run(&mut effects, 6_002, expire(unix_ms + 50_000, ExpireCondition::IfLater)), (0, None));
        assert_eq!(run(&mut effects, 6_003, UpdateOp::Persist), (1, None));
        assert_eq!(expiry(), Some(Expiry::NEVER));
        let get_ex = UpdateOp::GetEx(GetExExpiry::At(unix_ms + 7_000));
        assert_eq!(run(&mut effects, 6_004, get_ex), (1, Some(b"1".to_vec())));
        assert_eq!(expiry(), Expiry::at_ms(unix_ms + 7_000));
        assert_eq!(run(&mut effects, 6_005, expire(unix_ms + 6_005, ExpireCondition::Always)), (1, None));
        let deleted = core.store().get_latest(b"k").unwrap();
        assert_eq!((deleted.expiry, &deleted.value[..]), (Expiry::DELETED, &b""[..]), "what DEL writes");
        assert_eq!(run(&mut effects, 6_006, UpdateOp::Persist), (0, None), "absent now");
    }

    /// Every record an update logged, replayed as recovery and backups do (PREPARE then
    /// COMMIT), leaves the key as the server has it.
    fn records_replay_to(core: &ServerCore, records: impl IntoIterator<Item = LogRecord>) {
        let replayed = Store::new(10);
        for record in records {
            match record {
                LogRecord::Prepare { ts, metadata, write_set, writes } => {
                    let writes = writes.into_iter().map(|(key, version)| (key, version.value.clone())).collect();
                    replayed.prepare(ts, metadata, write_set, writes, 0).unwrap();
                }
                LogRecord::Commit { ts } => {
                    replayed.commit(ts);
                }
                other => panic!("an update logs no {other:?}"),
            }
        }
        let latest = |store: &Store| store.get_latest(b"k").map(|version| (version.ts, version.value.clone()));
        assert_eq!(latest(&replayed), latest(core.store()));
    }

    #[test]
    fn an_update_naming_other_keys_or_a_forged_timestamp_is_refused_and_changes_nothing() {
        let core = ServerCore::new(10);
        let mut effects = Effects::default();
        effects.set_logging(true);
        for metadata in [
            Metadata::WriteSet(WriteSet::from_keys(&[&b"k"[..], b"j"]).unwrap()),
            Metadata::WriteSet(WriteSet::from_keys(&[&b"j"[..]]).unwrap()),
        ] {
            let request = Request::Update { ts: ts(5), metadata, key: b"k".to_vec(), op: UpdateOp::IncrBy(1) };
            let reply = core.handle(ConnectionId::default(), request, 1, Now::default(), &mut effects);
            assert!(matches!(reply, Some(Reply::Response(Response::Error { .. }))), "{reply:?}");
        }
        let forged = Request::Update { ts: u64::MAX, metadata: alone(b"k"), key: b"k".to_vec(), op: UpdateOp::GetDel };
        let reply = core.handle(ConnectionId::default(), forged, 1, Now::default(), &mut effects);
        assert!(matches!(reply, Some(Reply::Response(Response::Error { .. }))), "{reply:?}");
        assert!(effects.logged.is_empty() && value(&core).is_none());
    }
}
