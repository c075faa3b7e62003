//! Garbage collection against a slow reader, driven step by step with the real state machines
//! and server cores (no network, explicit clock), so the race is exact rather than likely.
//!
//! The story: a reader's round 1 sees key y from writer W1 but key x from before W1, so it
//! must fetch x@W1 in round 2. Before that request arrives, newer writes supersede x@W1 and,
//! the grace period over, collect it. The server must answer VersionGone (never a wrong
//! version), and the reader must restart and return a read-atomic result.

use rampkv::cluster::Cluster;
use rampkv::protocol::ramp::{ReadTxn, TxnOptions, WriteTxn};
use rampkv::protocol::server::{Effects, Now, ServerCore};
use rampkv::protocol::{ConnectionId, Outgoing, ReadOutcome, Step};
use rampkv::wire::{FrameHeader, Request, Response};

const GRACE_MS: u64 = 100;

struct Servers {
    cores: Vec<ServerCore>,
    now_ms: u64,
}

impl Servers {
    /// The servers' time; the writers' timestamps are `(n << 16) | 1`, a few microseconds after
    /// the epoch, so the wall clock stays at it.
    fn now(&self) -> Now {
        Now { monotonic_ms: self.now_ms, wall_clock_us: 0 }
    }

    fn call(&self, outgoing: &Outgoing) -> Response {
        let (mut frame, mut effects) = (Vec::new(), Effects::default());
        let connection = ConnectionId::default();
        let reply =
            self.cores[outgoing.server].handle(connection, outgoing.request.clone(), 0, self.now(), &mut effects);
        reply.expect("RAMP requests never wait").encode_frame(0, &mut frame, |_| None);
        let (header, body) = FrameHeader::split(&frame).unwrap().unwrap();
        Response::decode(header.kind, body).unwrap()
    }

    /// Runs a whole write transaction at once.
    fn write(&self, cluster: &Cluster, ts: u64, keys: &[&[u8]]) {
        let writes = keys.iter().map(|key| (key.to_vec(), ts.to_le_bytes().to_vec())).collect();
        let mut txn = WriteTxn::new(cluster, ts, writes, TxnOptions::default()).unwrap();
        let mut pending = Vec::new();
        txn.start(&mut pending);
        while let Some(outgoing) = pending.pop() {
            let mut more = Vec::new();
            let step = txn.on_reply(outgoing.tag, self.call(&outgoing), &mut more).unwrap();
            pending.extend(more);
            if let Step::Done(_) = step {
                assert!(pending.is_empty());
            }
        }
    }
}

#[test]
fn a_slow_reader_whose_version_was_collected_restarts_and_reads_atomically() {
    let cluster = Cluster::with_servers(vec!["gc:1".into(), "gc:2".into()]).unwrap();
    let x = (0..).map(|i| format!("x{i}").into_bytes()).find(|key| cluster.server_of(key) == 0).unwrap();
    let y = (0..).map(|i| format!("y{i}").into_bytes()).find(|key| cluster.server_of(key) == 1).unwrap();
    let mut servers = Servers { cores: (0..2).map(|_| ServerCore::new(GRACE_MS)).collect(), now_ms: 0 };
    let ts = |n: u64| (n << 16) | 1;

    // W1 prepares x and y and commits y only, for now.
    let writes = vec![(x.clone(), ts(1).to_le_bytes().to_vec()), (y.clone(), ts(1).to_le_bytes().to_vec())];
    let mut w1 = WriteTxn::new(&cluster, ts(1), writes, TxnOptions::default()).unwrap();
    let mut w1_out = Vec::new();
    w1.start(&mut w1_out);
    let mut commits = Vec::new();
    for prepare in w1_out.drain(..) {
        let _ = w1.on_reply(prepare.tag, servers.call(&prepare), &mut commits).unwrap();
    }
    let commit_x = commits.iter().position(|c| c.server == 0).unwrap();
    let commit_x = commits.remove(commit_x);
    for commit in &commits {
        let _ = w1.on_reply(commit.tag, servers.call(commit), &mut Vec::new()).unwrap();
    }

    // The reader's round 1: x from before W1, y from W1; round 2 asks for x@W1.
    let mut reader = ReadTxn::new(&cluster, vec![x.clone(), y.clone()], TxnOptions::default()).unwrap();
    let mut round = Vec::new();
    reader.start(&mut round);
    let mut round_two = Vec::new();
    for get in round.drain(..) {
        assert!(matches!(reader.on_reply(get.tag, servers.call(&get), &mut round_two).unwrap(), Step::Pending));
    }
    assert_eq!(round_two.len(), 1, "x needs the repair");
    assert!(matches!(&round_two[0].request, Request::Get { .. }));

    // W1 commits x; then W2 and W3 supersede it, and after the grace period x@W1 is collected.
    let _ = w1.on_reply(commit_x.tag, servers.call(&commit_x), &mut Vec::new()).unwrap();
    servers.write(&cluster, ts(2), &[&x]);
    servers.write(&cluster, ts(3), &[&x]);
    servers.now_ms = GRACE_MS + 1;
    servers.write(&cluster, ts(4), &[&x]);
    assert!(servers.cores[0].store().stats().versions_collected > 0, "x@W1 was collected");

    // The slow round 2 arrives: VersionGone, and the reader restarts by itself.
    let mut restarted = Vec::new();
    let step = reader.on_reply(round_two[0].tag, servers.call(&round_two[0]), &mut restarted).unwrap();
    assert!(matches!(step, Step::Pending));
    assert!(!restarted.is_empty(), "the read restarted from round 1");
    let outcome = drive_to_end(&servers, &mut reader, restarted);
    assert_eq!(outcome.restarts, 1);
    assert_eq!(outcome.items[0].ts, ts(4), "x: the newest version");
    assert_eq!(outcome.items[1].ts, ts(1), "y: W1's");
    for item in &outcome.items {
        assert_eq!(&item.value[..], item.ts.to_le_bytes(), "each value is its version's");
    }
}

fn drive_to_end(servers: &Servers, reader: &mut ReadTxn, mut pending: Vec<Outgoing>) -> ReadOutcome {
    loop {
        let outgoing = pending.pop().expect("the read finishes");
        let mut more = Vec::new();
        if let Step::Done(outcome) = reader.on_reply(outgoing.tag, servers.call(&outgoing), &mut more).unwrap() {
            return outcome;
        }
        pending.extend(more);
    }
}
