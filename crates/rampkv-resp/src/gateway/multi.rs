//! MULTI / EXEC / DISCARD: the commands a connection queues between MULTI and EXEC run at EXEC
//! as one RAMP transaction.
//!
//! # Contract
//! - **Queueing.** After MULTI each command is checked as it arrives, with every check
//!   `command::parse_request` makes (name, arity, permissions, key and value sizes, options),
//!   and answered `+QUEUED`, or with its error, which dooms the transaction: EXEC then answers
//!   `-EXECABORT Transaction discarded because of previous errors.` (Redis's text). Redis queues
//!   a command whose options are wrong (`SET k v EX`, `SELECT 5`) and fails it alone at EXEC,
//!   running the others; rampkv makes those checks at queue time, so an EXEC runs all of its
//!   commands or none.
//! - **Reads only** (GET, MGET, EXISTS, STRLEN, TYPE): one read-atomic `get_all` over the
//!   distinct keys of the whole queue; each command's reply comes from it, so the replies are
//!   one snapshot across partitions.
//! - **Reads only** also take TTL and PTTL: they are judged at the read's one instant, as
//!   every key of it.
//! - **Writes only** (SET, MSET, DEL, UNLINK; SET EX/PX/EXAT/PXAT, SETEX, PSETEX): one `put_all`
//!   across partitions of the version each key holds after the queue in order (a later command
//!   overrides an earlier one, value and expiry both; a DEL writes a deletion), as executing
//!   the commands one after another would leave them. DEL and UNLINK
//!   answer how many of their keys were present, as if run in sequence: a key an earlier queued
//!   command wrote or deleted is known from the queue; the others are read by one read-atomic
//!   `get_all` at EXEC, just before the write. So an EXEC with such a DEL is two transactions,
//!   a read then the write, as DEL outside MULTI is: a client writing between them can make a
//!   count stale, never the write, which is one atomic `put_all` whatever the counts say.
//! - **Reads and writes**: refused at EXEC, `-EXECABORT Transaction discarded because of: ...`
//!   (Redis's form for an EXEC refused with a reason) naming them: a RAMP transaction is
//!   read-only or write-only, so such a queue could not run as one atomic unit.
//! - **Connection commands** (PING, ECHO, INFO, CLIENT ..., SELECT 0, UNWATCH, AUTH, HELLO, ...)
//!   are neither reads nor writes: they run when the transaction has finished, in queue order,
//!   each reply in its place in EXEC's array (as Redis runs them at EXEC).
//! - At most `TXN_KEYS_MAX` distinct keys per EXEC (more: EXECABORT naming the count). A
//!   transaction that fails answers EXEC with one error (`-CLUSTERDOWN ...`, `-ERR rampkv: ...`)
//!   and the connection commands of its queue do not run; a write that timed out may or may not
//!   have taken effect, as outside MULTI.
//! - **Conditional writes** (INCR, DECR, INCRBY, DECRBY, SETNX, SET NX|XX|GET|KEEPTTL, GETSET,
//!   GETDEL, APPEND; and the expiry updates EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT, PERSIST,
//!   GETEX: every `Request::Update`) are refused as they are queued, with why, and doom the
//!   transaction: each reads its key (value or deadline) and writes it, which one read-only or write-only RAMP transaction cannot
//!   do together with the rest of the queue. Outside MULTI each is atomic on its own.
//! - **WATCH** is refused, with why: an optimistic check-and-set reads keys and then writes them
//!   in one transaction. UNWATCH answers `+OK` (nothing is ever watched). Nested MULTI, EXEC and
//!   DISCARD without MULTI, and WATCH inside MULTI get Redis's errors and, as in Redis, do not
//!   doom the transaction; an EXEC refused before it runs (`EXEC x`) gets Redis's
//!   `-EXECABORT Transaction discarded because of: <why>` and ends it. QUIT is never queued
//!   (nor in Redis).
//! - **Bounds.** The queue holds at most [`MULTI_QUEUED_COMMANDS_MAX`] commands and
//!   [`MULTI_QUEUED_BYTES_MAX`] bytes (counted in the gateway's byte budget too). The command
//!   that would go beyond is answered with an error saying so, the queue is dropped and the
//!   transaction doomed: nothing more is kept until EXEC or DISCARD, so a client can never make
//!   it grow without bound (Redis closes a client past its query-buffer limit; this keeps the
//!   connection and says why). The queue is the connection's: closing it drops the queue.
//!
//! # Expiry
//! Queued commands become the transaction's writes in one place, [`ExecPlan::new`], called
//! once per EXEC with one reading of the gateway's clock (`now_ms`): every relative expiry
//! queued in the MULTI (`SET k v EX 10`, `SETEX`, `PSETEX`) becomes a deadline from that one
//! instant, as Redis computes them from the EXEC's time. So the keys of one EXEC written with
//! the same TTL carry the same deadline, and a read-atomic read judges them alike: it sees all
//! of them or none (docs/resp.md, "Expiry"). The same instant decides DEL's counts of keys the
//! queue wrote with a deadline already past.

use super::event_loop::EventLoop;
use super::plan::{ExecPlan, Step, Transaction};
use super::replies::{write_read_reply, KeyRead};
use super::state::{MultiState, Pending};
use crate::codec::{self, Frame};
use crate::command::Request;
use rampkv_core::protocol::ReadOutcome;
use rampkv_core::types::wall_clock_unix_ms;
use rampkv_net::client::TxnResult;

/// Redis 7.0's texts.
const NESTED_MULTI_REPLY: &str = "ERR MULTI calls can not be nested";
const EXEC_WITHOUT_MULTI_REPLY: &str = "ERR EXEC without MULTI";
const DISCARD_WITHOUT_MULTI_REPLY: &str = "ERR DISCARD without MULTI";
const WATCH_INSIDE_MULTI_REPLY: &str = "ERR WATCH inside MULTI is not allowed";
const EXECABORT_REPLY: &str = "EXECABORT Transaction discarded because of previous errors.";
/// Why WATCH is refused.
pub const WATCH_REFUSAL: &str = "ERR WATCH is not supported by rampkv: an optimistic check-and-set reads keys and \
                                 then writes them in one transaction, and rampkv runs a transaction as read-only or \
                                 write-only (RAMP). MULTI/EXEC without WATCH works, with reads only or writes only";

impl EventLoop {
    /// What MULTI changes about a command of connection `slot`: MULTI, EXEC, DISCARD and WATCH
    /// themselves, and any other command of a connection in MULTI (queued). Returns the
    /// request if it runs as usual.
    pub(super) fn transaction_control(&mut self, slot: usize, request: Request) -> Option<Request> {
        let connection = self.connections[slot].as_mut().expect("executing for an open connection");
        let in_multi = connection.multi.is_some();
        let reply = match request {
            Request::Multi if in_multi => Frame::error(NESTED_MULTI_REPLY),
            Request::Multi => {
                connection.multi = Some(MultiState::default());
                Frame::simple("OK")
            }
            Request::Exec => match connection.multi.take() {
                Some(state) => {
                    self.exec(slot, state);
                    return None;
                }
                None => Frame::error(EXEC_WITHOUT_MULTI_REPLY),
            },
            Request::ExecRefused(reply) => {
                connection.multi = None;
                reply
            }
            Request::Discard => match connection.multi.take() {
                Some(_) => Frame::simple("OK"),
                None => Frame::error(DISCARD_WITHOUT_MULTI_REPLY),
            },
            Request::Watch if in_multi => Frame::error(WATCH_INSIDE_MULTI_REPLY),
            Request::Watch => Frame::error(WATCH_REFUSAL),
            Request::Quit => return Some(request),
            request => match connection.multi.as_mut() {
                Some(state) => state.queue(request),
                None => return Some(request),
            },
        };
        self.reply(slot, &reply);
        None
    }

    /// EXEC: runs the queue of a connection that was in MULTI.
    fn exec(&mut self, slot: usize, state: MultiState) {
        if state.doomed {
            return self.reply(slot, &Frame::error(EXECABORT_REPLY));
        }
        match ExecPlan::new(state.queued, wall_clock_unix_ms()) {
            Err(reason) => {
                self.reply(slot, &Frame::error(format!("EXECABORT Transaction discarded because of: {reason}")))
            }
            Ok(mut plan) => match &mut plan.transaction {
                Transaction::None => self.answer_exec(slot, plan, &[], 0),
                Transaction::Read { keys, .. } => {
                    let keys = std::mem::take(keys);
                    self.begin_read(slot, keys, Pending::Exec(Box::new(plan)));
                }
                Transaction::Write { counted, .. } if !counted.is_empty() => {
                    let keys = std::mem::take(counted);
                    self.begin_read(slot, keys, Pending::Exec(Box::new(plan)));
                }
                Transaction::Write { writes, .. } => {
                    let writes = std::mem::take(writes);
                    self.begin_expiring_writes(slot, writes, Pending::Exec(Box::new(plan)), false);
                }
            },
        }
    }

    /// A transaction of an EXEC finished: answers EXEC, or after the read of DEL's counts
    /// starts the write.
    pub(super) fn exec_finished(&mut self, slot: usize, mut plan: Box<ExecPlan>, result: TxnResult) {
        match (&mut plan.transaction, result) {
            (Transaction::Read { key_count, .. }, TxnResult::Read(outcome)) if outcome.items.len() == *key_count => {
                let values = key_reads(&outcome);
                self.answer_exec(slot, *plan, &values, outcome.read_at_ms);
            }
            (Transaction::Write { writes, counted_count, present, .. }, TxnResult::Read(outcome))
                if outcome.items.len() == *counted_count && present.is_empty() =>
            {
                *present = key_reads(&outcome).iter().map(|key| key.value.is_some()).collect();
                let writes = std::mem::take(writes);
                self.begin_expiring_writes(slot, writes, Pending::Exec(plan), false);
            }
            (Transaction::Write { .. }, TxnResult::Write(_)) => self.answer_exec(slot, *plan, &[], 0),
            (_, result) => {
                debug_assert!(false, "EXEC's transaction finished with {result:?}");
                self.reply(slot, &Frame::error("ERR internal error: mismatched transaction result"));
            }
        }
        self.enqueue(slot);
    }

    /// EXEC's reply: an array of each queued command's reply, in order; `values` are what the
    /// read of a read-only queue returned for its keys (empty for the others), judged at
    /// `read_at_ms`. Connection commands run now.
    fn answer_exec(&mut self, slot: usize, plan: ExecPlan, values: &[KeyRead<'_>], read_at_ms: u64) {
        let ExecPlan { steps, transaction } = plan;
        let (positions, present) = match &transaction {
            Transaction::Read { positions, .. } => (&positions[..], &[][..]),
            Transaction::Write { present, .. } => (&[][..], &present[..]),
            Transaction::None => (&[][..], &[][..]),
        };
        let mut positions = positions.iter();
        self.append(slot, |out, _| codec::write_array_header(out, steps.len()));
        for step in steps {
            match step {
                Step::Local(request) => {
                    let reply = self.local_reply(slot, request);
                    self.reply(slot, &reply);
                }
                Step::Read(command) => {
                    let absent = KeyRead { value: None, expires_at_ms: 0 };
                    let mut keys =
                        positions.by_ref().take(command.keys()).map(|&at| values.get(at).copied().unwrap_or(absent));
                    self.append(slot, |out, protocol| write_read_reply(out, protocol, command, read_at_ms, &mut keys));
                }
                Step::Written => self.append(slot, |out, _| codec::write_simple(out, b"OK")),
                Step::Deleted { known_present, read } => {
                    let read_present = read.iter().filter(|&&at| present.get(at).copied().unwrap_or(false)).count();
                    self.append(slot, |out, _| codec::write_integer(out, known_present + read_present as i64));
                }
            }
        }
    }
}

/// What a read returned for each of its keys, in the order of its keys.
fn key_reads(outcome: &ReadOutcome) -> Vec<KeyRead<'_>> {
    outcome.items.iter().map(KeyRead::of).collect()
}

#[cfg(test)]
mod tests {
    use super::super::limits::{MULTI_QUEUED_BYTES_MAX, MULTI_QUEUED_COMMANDS_MAX};
    use super::super::plan::ReadCommand;
    use super::super::state::QUEUED_COMMAND_OVERHEAD_BYTES;
    use super::*;
    use crate::auth::Permissions;
    use crate::codec::RequestParser;
    use crate::command::parse_request;
    use crate::command::TtlUnit;
    use crate::value;
    use rampkv_core::limits::TXN_KEYS_MAX;
    use rampkv_core::wire::Write;

    fn queue_of(lines: &[&str]) -> Vec<Request> {
        let mut parser = RequestParser::new();
        lines
            .iter()
            .map(|line| {
                let input = format!("{line}\r\n");
                let (args, _) = parser.parse(input.as_bytes()).unwrap().unwrap();
                parse_request(&args, Permissions::ALL)
            })
            .collect()
    }

    /// The EXEC's instant in these tests (Unix ms).
    const NOW_MS: u64 = 1_800_000_000_000;

    fn plan(lines: &[&str]) -> Result<ExecPlan, String> {
        ExecPlan::new(queue_of(lines), NOW_MS)
    }

    fn written(plan: &ExecPlan) -> &[Write] {
        let Transaction::Write { writes, .. } = &plan.transaction else { panic!("{plan:?}") };
        writes
    }

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|name| name.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_read_queue_is_one_read_of_its_distinct_keys() {
        let plan = plan(&["GET a", "MGET b a c", "PING", "EXISTS c c", "STRLEN d", "TYPE a"]).unwrap();
        let Transaction::Read { keys: read, key_count, positions } = &plan.transaction else { panic!("{plan:?}") };
        assert_eq!(read, &keys(&["a", "b", "c", "d"]));
        assert_eq!(*key_count, 4);
        assert_eq!(positions, &[0, 1, 0, 2, 2, 2, 3, 0]);
        assert_eq!(plan.steps.len(), 6);
        assert!(matches!(plan.steps[2], Step::Local(Request::Reply(_))));
    }

    #[test]
    fn a_write_queue_writes_the_last_value_of_each_key_and_reads_only_what_del_needs() {
        let plan = plan(&["SET a 1", "MSET b 2 a 3", "DEL a c c", "UNLINK c d", "SET d 4", "DEL d"]).unwrap();
        let Transaction::Write { writes, counted, counted_count, .. } = &plan.transaction else { panic!("{plan:?}") };
        let expected = vec![
            Write::delete(b"a".to_vec()),
            Write::new(b"b".to_vec(), value::encode(b"2")),
            Write::delete(b"c".to_vec()),
            Write::delete(b"d".to_vec()),
        ];
        assert_eq!(writes, &expected);
        // DEL a c c: a is present by the queue, c is read (its second mention is known absent);
        // UNLINK c d: c is known absent, d is read; the last DEL d: present by the SET before.
        assert_eq!(counted, &keys(&["c", "d"]));
        assert_eq!(*counted_count, 2);
        let deleted: Vec<(i64, Vec<usize>)> = plan
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Deleted { known_present, read } => Some((*known_present, read.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, vec![(1, vec![0]), (0, vec![1]), (1, vec![])]);
    }

    /// Every relative expiry of one EXEC comes from its one instant (Redis computes them from
    /// the EXEC's time), so keys queued with the same TTL carry the same deadline; a later
    /// command overrides value and expiry both.
    #[test]
    fn relative_expiries_of_one_exec_are_deadlines_from_its_one_instant() {
        let plan = plan(&[
            "SET a 1 EX 10",
            "PSETEX b 10000 2",
            "SETEX c 10 3",
            "MSET d 4",
            "SET e 5 PXAT 1900000000000",
            "SET f 6 PX 500",
            "SET f 7",
            "SET g 8",
            "SET g 9 EXAT 1800000001",
        ])
        .unwrap();
        let deadline = NOW_MS + 10_000;
        let expected = [
            Write::expiring(b"a".to_vec(), value::encode(b"1"), deadline),
            Write::expiring(b"b".to_vec(), value::encode(b"2"), deadline),
            Write::expiring(b"c".to_vec(), value::encode(b"3"), deadline),
            Write::new(b"d".to_vec(), value::encode(b"4")),
            Write::expiring(b"e".to_vec(), value::encode(b"5"), 1_900_000_000_000),
            Write::new(b"f".to_vec(), value::encode(b"7")),
            Write::expiring(b"g".to_vec(), value::encode(b"9"), 1_800_000_001_000),
        ];
        assert_eq!(written(&plan), &expected[..]);
        assert!(plan.steps.iter().all(|step| matches!(step, Step::Written)));
    }

    /// DEL's count of a key the queue wrote with a deadline is judged at the EXEC's instant: a
    /// deadline already past leaves the key absent.
    #[test]
    fn a_queued_del_counts_a_key_written_with_a_past_deadline_as_absent() {
        let plan = plan(&["SET a 1 PXAT 1000", "SET b 2 EX 100", "DEL a b"]).unwrap();
        let Transaction::Write { counted, .. } = &plan.transaction else { panic!("{plan:?}") };
        assert!(counted.is_empty(), "the queue tells both");
        assert!(matches!(plan.steps[2], Step::Deleted { known_present: 1, .. }), "{plan:?}");
        assert_eq!(written(&plan), &[Write::delete(b"a".to_vec()), Write::delete(b"b".to_vec())][..]);
    }

    #[test]
    fn ttl_and_pttl_queue_as_reads_and_refuse_to_mix_with_writes() {
        let plan = plan(&["TTL a", "PTTL b", "GET a"]).unwrap();
        let Transaction::Read { keys: read, positions, .. } = &plan.transaction else { panic!("{plan:?}") };
        assert_eq!(read, &keys(&["a", "b"]));
        assert_eq!(positions, &[0, 1, 0]);
        assert!(matches!(plan.steps[0], Step::Read(ReadCommand::TimeToLive(TtlUnit::Seconds))));
        let reason = self::plan(&["TTL a", "SETEX b 5 x"]).unwrap_err();
        assert!(reason.starts_with("it mixes reads (TTL) and writes (SET)"), "{reason}");
    }

    #[test]
    fn a_write_queue_whose_deletes_the_queue_answers_needs_no_read() {
        let plan = plan(&["SET a 1", "DEL a", "DEL a"]).unwrap();
        let Transaction::Write { counted, .. } = &plan.transaction else { panic!("{plan:?}") };
        assert!(counted.is_empty());
    }

    #[test]
    fn mixed_queues_and_too_many_keys_are_refused_with_why() {
        let reason = plan(&["GET a", "SET b 1", "MGET a", "DEL c", "GET x"]).unwrap_err();
        assert!(reason.starts_with("it mixes reads (GET, MGET) and writes (SET, DEL)"), "{reason}");
        assert!(reason.contains("read-only or write-only (RAMP)"), "{reason}");
        let many: Vec<String> = (0..=TXN_KEYS_MAX).map(|key| format!("GET k{key}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let reason = plan(&many).unwrap_err();
        assert_eq!(
            reason,
            format!("it touches 257 distinct keys, and a rampkv transaction takes at most {TXN_KEYS_MAX}")
        );
        assert!(plan(&many[1..]).is_ok(), "256 keys fit");
        assert!(matches!(plan(&["PING", "ECHO x"]).unwrap().transaction, Transaction::None));
        assert!(matches!(plan(&[]).unwrap().transaction, Transaction::None));
    }

    #[test]
    fn a_bad_command_or_a_full_queue_dooms_the_transaction_and_keeps_nothing() {
        let mut state = MultiState::default();
        let [set, bad, get] = <[Request; 3]>::try_from(queue_of(&["SET a 1", "GET", "GET a"])).unwrap();
        assert_eq!(state.queue(set), Frame::simple("QUEUED"));
        assert!(state.held_bytes() > 0);
        assert!(matches!(state.queue(bad), Frame::Error(_)));
        assert!(state.doomed && state.queued.is_empty() && state.held_bytes() == 0);
        assert_eq!(state.queue(get), Frame::simple("QUEUED"));
        assert!(state.queued.is_empty(), "nothing kept once doomed");

        let mut state = MultiState::default();
        for _ in 0..MULTI_QUEUED_COMMANDS_MAX {
            assert_eq!(state.queue(Request::Reply(Frame::simple("PONG"))), Frame::simple("QUEUED"));
        }
        let Frame::Error(full) = state.queue(Request::Reply(Frame::simple("PONG"))) else { panic!() };
        assert!(String::from_utf8_lossy(&full).starts_with("ERR MULTI queue full"));
        assert!(state.doomed && state.queued.is_empty() && state.held_bytes() == 0);

        let mut state = MultiState::default();
        let value = vec![b'v'; crate::value::STORED_VALUE_BYTES_MAX];
        let mut queued = 0;
        while state.queue(Request::Set { key: b"k".to_vec(), value: value.clone() }) == Frame::simple("QUEUED") {
            queued += 1;
            assert!(state.held_bytes() <= MULTI_QUEUED_BYTES_MAX);
        }
        assert_eq!(queued, MULTI_QUEUED_BYTES_MAX / (value.len() + 1 + QUEUED_COMMAND_OVERHEAD_BYTES));
        assert!(state.doomed);
    }
}
