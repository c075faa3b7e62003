//! The server core's unit tests.

use super::*;
use crate::wire::{FrameHeader, GetItem};

/// Issue 15: "one raw PUT with timestamp u64::MAX pins the key: every later write answers
/// OK and is never visible". Each request that writes or commits at a timestamp is refused
/// when no honest client issues it, the store is left as it was, and the key stays writable.
#[test]
fn writes_and_commits_at_forged_timestamps_are_refused_and_change_nothing() {
    let core = ServerCore::new(10);
    let mut effects = Effects::default();
    let now = Now { monotonic_ms: 1, wall_clock_us: 50_000_000 };
    let write = || vec![Write::new(b"k".to_vec(), b"forged".to_vec())];
    let honest = (now.wall_clock_us << 16) | 3;
    let forged = [0, u64::MAX, (now.wall_clock_us << 16), ((now.wall_clock_us + 1_000_001) << 16) | 3];
    for ts in forged {
        let requests = [
            Request::Prepare { ts, metadata: Metadata::None, write_set: Vec::new(), writes: write() },
            Request::Put { ts, writes: write() },
            Request::LockWrite { ts, writes: write() },
            Request::Commit { ts },
            Request::CommitLocked { ts },
        ];
        for request in requests {
            let kind = request.kind();
            let reply = core.handle(ConnectionId::default(), request, 1, now, &mut effects);
            let Some(Reply::Response(Response::Error { code: ErrorCode::BadRequest, message })) = reply else {
                panic!("ts {ts} kind {kind}: {reply:?}")
            };
            assert!(message.contains(&format!("timestamp {ts}")), "{message}");
        }
    }
    assert_eq!(core.store().stats().versions, 0, "nothing was stored");
    assert!(core.locks.lock().next_deadline_ms().is_none());
    let ahead = match core.handle(ConnectionId::default(), Request::Commit { ts: u64::MAX }, 1, now, &mut effects) {
        Some(Reply::Response(Response::Error { message, .. })) => message,
        other => panic!("{other:?}"),
    };
    assert!(ahead.contains("µs ahead") && ahead.contains("1000 ms"), "names how far ahead and the bound: {ahead}");
    let put = core.handle(ConnectionId::default(), Request::Put { ts: honest, writes: write() }, 2, now, &mut effects);
    assert!(matches!(put, Some(Reply::Response(Response::Ack))), "{put:?}");
    assert_eq!(core.store().last_commit(b"k"), honest, "the key took the honest write");
    // Reads, lock reads, releases and status asks carry no timestamp that is stored.
    let read = Request::LockRead { ts: u64::MAX, keys: vec![b"k".to_vec()] };
    assert!(matches!(core.handle(ConnectionId::default(), read, 3, now, &mut effects), Some(Reply::Locked { .. })));
}

/// A gate that serves a fixed set of partitions (what a lease-holding primary serves).
#[derive(Debug)]
struct Serves(std::sync::Mutex<Vec<u32>>);

impl PartitionGate for Serves {
    fn serves(&self, partition: u32) -> bool {
        self.0.lock().unwrap().contains(&partition)
    }
}

/// Failover: with a gate, a server serves exactly the partitions the gate allows (its own
/// cluster-file partitions too only while allowed), refuses the others with `NotPrimary`
/// (reads, writes, and a COMMIT of what it prepared there), takes a HELLO naming a server
/// whose partitions it took over, and hands out client ids from a band of its own.
#[test]
fn with_a_gate_a_server_serves_only_the_partitions_it_holds_a_lease_for() {
    let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
    let key_of = |server: usize| {
        (0..).map(|i| format!("k{i}").into_bytes()).find(|key| cluster.server_of(key) == server).unwrap()
    };
    let (own, other) = (key_of(1), key_of(0));
    let core = ServerCore::new(10);
    let gate = Arc::new(Serves(std::sync::Mutex::new(vec![cluster.partition_of(&own)])));
    assert!(core.join_cluster(cluster.clone(), 1) && core.set_gate(gate.clone()));
    let mut effects = Effects::default();
    let now = Now { monotonic_ms: 1, wall_clock_us: 50_000_000 };
    let ts = (now.wall_clock_us << 16) | 3;
    let mut handle = |request: Request| core.handle(ConnectionId::default(), request, 1, now, &mut effects);
    let get = |key: &[u8]| Request::Get { items: vec![GetItem { key: key.to_vec(), selector: Selector::Latest }] };
    let prepare = |key: &[u8]| Request::Prepare {
        ts,
        metadata: Metadata::None,
        write_set: Vec::new(),
        writes: vec![Write::new(key.to_vec(), b"v".to_vec())],
    };
    let not_primary = |reply: Option<Reply>| {
        matches!(reply, Some(Reply::Response(Response::Error { code: ErrorCode::NotPrimary, .. })))
    };
    assert!(not_primary(handle(get(&other))), "another server's partition");
    assert!(not_primary(handle(prepare(&other))));
    assert!(matches!(handle(prepare(&own)), Some(Reply::Response(Response::Ack))));
    let hello = |index: u32| Request::Hello {
        client_ids_wanted: 1,
        cluster: Some(ClusterView { partitions: 2, server_index: index }),
    };
    assert!(not_primary(handle(hello(0))), "server 0's partitions are not taken over");
    let Some(Reply::Response(Response::Hello { client_id_first, .. })) = handle(hello(1)) else { panic!() };
    assert!(client_id_first > CLIENT_IDS_MAX as u16 / 2, "server 1's band: {client_id_first}");
    // The lease lapses (deposed): nothing more, not even the COMMIT of what it prepared.
    gate.0.lock().unwrap().clear();
    assert!(not_primary(handle(get(&own))));
    assert!(not_primary(handle(Request::Commit { ts })));
    assert_eq!(core.store().last_commit(&own), 0, "the deposed server committed nothing");
    // It took server 0's partitions over: HELLO as server 0 is accepted, as server 0.
    *gate.0.lock().unwrap() = (0..2).collect();
    let Some(Reply::Response(Response::Hello { cluster: Some(view), .. })) = handle(hello(0)) else { panic!() };
    assert_eq!(view.server_index, 0);
    assert!(matches!(handle(get(&other)), Some(Reply::Versions(_))));
}

/// With logging on, every change to the store is described after it was made, and nothing
/// else: refused requests and reads log nothing; a STATUS that marks an unknown
/// transaction aborted logs the abort. Without logging nothing is copied.
#[test]
fn each_change_to_the_store_is_logged_once_made_and_refusals_are_not() {
    let core = ServerCore::new(10);
    let mut effects = Effects::default();
    effects.set_logging(true);
    let write = |key: &str| Write::new(key.as_bytes().to_vec(), b"v".to_vec());
    let key = |name: &str| Key::from(name.as_bytes());
    let version = |name: &str, ts: Timestamp, metadata: StoredMetadata| {
        (key(name), Arc::new(Version::new(ts, Box::from(&b"v"[..]), metadata)))
    };
    let mut logged = |request: Request| {
        effects.clear();
        core.handle(ConnectionId::default(), request, 1, Now::default(), &mut effects);
        std::mem::take(&mut effects.logged)
    };
    let write_set = Metadata::WriteSet(WriteSet::from_keys(&[b"a", b"b"]).unwrap());
    let prepared =
        logged(Request::Prepare { ts: 5, metadata: write_set, write_set: Vec::new(), writes: vec![write("a")] });
    let keys = WriteSet::from_keys(&[b"a", b"b"]).unwrap();
    let expected = LogRecord::Prepare {
        ts: 5,
        metadata: StoredMetadata::WriteSet(keys.clone()),
        writes: vec![version("a", 5, StoredMetadata::WriteSet(keys.clone()))],
        write_set: keys,
    };
    assert_eq!(prepared, vec![expected]);
    assert_eq!(logged(Request::Commit { ts: 5 }), vec![LogRecord::Commit { ts: 5 }]);
    let put = logged(Request::Put { ts: 7, writes: vec![write("c")] });
    assert_eq!(put, vec![LogRecord::Put { ts: 7, writes: vec![version("c", 7, StoredMetadata::None)] }]);
    // Unknown here: marked aborted, and the mark is logged; asked again, nothing new.
    assert_eq!(logged(Request::Status { ts: 9, keys: vec![b"d".to_vec()] }), vec![LogRecord::Abort { ts: 9 }]);
    assert_eq!(logged(Request::Status { ts: 9, keys: vec![b"d".to_vec()] }), vec![]);
    assert_eq!(logged(Request::Status { ts: 5, keys: vec![b"a".to_vec()] }), vec![]);
    // Refused (aborted, invalid): no change, nothing logged; reads log nothing.
    let late = Request::Prepare { ts: 9, metadata: Metadata::None, write_set: Vec::new(), writes: vec![write("d")] };
    assert_eq!(logged(late), vec![]);
    assert_eq!(logged(Request::Put { ts: 0, writes: vec![write("e")] }), vec![]);
    let get = Request::Get { items: vec![GetItem { key: b"a".to_vec(), selector: Selector::Latest }] };
    assert_eq!(logged(get), vec![]);
    // S2PL: the staged writes are logged as a PUT at COMMIT_LOCKED, not when staged.
    assert_eq!(logged(Request::LockWrite { ts: 11, writes: vec![write("f")] }), vec![]);
    let committed = logged(Request::CommitLocked { ts: 11 });
    assert_eq!(committed, vec![LogRecord::Put { ts: 11, writes: vec![version("f", 11, StoredMetadata::None)] }]);
    let mut aborted = Effects::default();
    aborted.set_logging(true);
    core.abort(13, 0, &mut aborted);
    assert_eq!(aborted.logged, vec![LogRecord::Abort { ts: 13 }]);
    let mut silent = Effects::default();
    core.handle(
        ConnectionId::default(),
        Request::Put { ts: 15, writes: vec![write("g")] },
        1,
        Now::default(),
        &mut silent,
    );
    assert!(silent.logged.is_empty(), "not logging: nothing described");
}

/// PREPARE_COMMIT: the versions are visible when it returns, logged as a PREPARE and a
/// COMMIT, republished and never marked "newer prepared"; refused, changing nothing, when
/// its write set names a key it does not write (part of a wider transaction) or it writes
/// a key outside its write set, whatever the metadata.
#[test]
fn a_one_phase_write_is_visible_at_once_and_only_for_a_whole_write_set() {
    let core = ServerCore::new(10);
    let mut effects = Effects::new(true);
    effects.set_logging(true);
    let write = |key: &str| Write::new(key.as_bytes().to_vec(), key.as_bytes().to_vec());
    let key = |name: &str| Key::from(name.as_bytes());
    let mut handle = |request: Request| {
        effects.clear();
        let reply = core.handle(ConnectionId::default(), request, 1, Now::default(), &mut effects);
        let Some(Reply::Response(response)) = reply else { panic!("{reply:?}") };
        (response, std::mem::take(&mut effects.logged), effects.prepared.len(), effects.committed.clone())
    };
    let write_set = |keys: &[&[u8]]| Metadata::WriteSet(WriteSet::from_keys(keys).unwrap());
    let whole = Request::PrepareCommit {
        ts: 5,
        metadata: write_set(&[b"a", b"b"]),
        write_set: Vec::new(),
        writes: vec![write("a"), write("b")],
    };
    let (response, logged, prepared, committed) = handle(whole);
    assert_eq!(response, Response::Ack);
    assert!(matches!(&logged[..], [LogRecord::Prepare { ts: 5, .. }, LogRecord::Commit { ts: 5 }]), "{logged:?}");
    assert_eq!((prepared, committed), (0, vec![key("a"), key("b")]));
    for name in ["a", "b"] {
        assert_eq!(core.store().get_latest(name.as_bytes()).map(|version| version.ts), Some(5), "{name}");
    }
    // RAMP-Small and RAMP-Hybrid carry the write set beside the metadata.
    let small = Request::PrepareCommit {
        ts: 7,
        metadata: Metadata::None,
        write_set: vec![b"c".to_vec()],
        writes: vec![write("c")],
    };
    assert_eq!(handle(small).0, Response::Ack);
    assert_eq!(core.store().last_commit(b"c"), 7);
    let refusals = [
        // Part of a transaction that also writes b elsewhere.
        (write_set(&[b"a", b"b"]), Vec::new(), vec![write("a")]),
        (Metadata::Bloom(vec![0xff; 32]), vec![b"a".to_vec(), b"b".to_vec()], vec![write("a")]),
        // Writes outside the write set, or no write set at all.
        (Metadata::None, vec![b"a".to_vec()], vec![write("a"), write("d")]),
        (Metadata::None, Vec::new(), vec![write("a")]),
    ];
    for (metadata, write_set, writes) in refusals {
        let request = Request::PrepareCommit { ts: 9, metadata, write_set, writes };
        let (response, logged, prepared, committed) = handle(request.clone());
        let Response::Error { code: ErrorCode::BadRequest, message } = response else { panic!("{request:?}") };
        assert!(message.contains("exactly the keys of its write set"), "{message}");
        assert!(logged.is_empty() && prepared == 0 && committed.is_empty(), "{request:?}");
        assert_eq!(core.store().last_commit(b"a"), 5, "{request:?}");
        assert!(core.store().pending_keys(9).is_empty(), "{request:?}");
    }
}

/// `into_response` (the in-process client's reply, built without a frame) must be exactly
/// what a client of every other transport decodes from the frame `encode_frame` writes.
#[test]
fn a_reply_as_a_response_is_what_its_frame_decodes_to() {
    let core = ServerCore::new(10);
    let mut effects = Effects::default();
    let mut handle = |request, monotonic_ms| {
        core.handle(ConnectionId::default(), request, 1, Now { monotonic_ms, wall_clock_us: 0 }, &mut effects)
    };
    let write = |key: &str, value: &str| Write::new(key.as_bytes().to_vec(), value.as_bytes().to_vec());
    let prepares = [
        (5, Metadata::WriteSet(WriteSet::from_keys(&[b"a", b"b"]).unwrap()), vec![write("a", "a5"), write("b", "b5")]),
        (7, Metadata::Bloom(vec![0x5a; 16]), vec![write("b", "b7")]),
        (9, Metadata::None, vec![write("c", "")]),
        (11, Metadata::WriteSet(WriteSet::from_keys(&[b"a"]).unwrap()), vec![write("a", "a11")]),
    ];
    for (ts, metadata, writes) in prepares {
        handle(Request::Prepare { ts, metadata, write_set: Vec::new(), writes }, 0);
    }
    for ts in [5, 7, 9, 11] {
        handle(Request::Commit { ts }, 0);
    }
    // Version 5 of "a" is superseded by 11 and collected at t=100.
    for (ts, now_ms) in [(13, 50), (15, 100)] {
        let writes = vec![write("a", "x")];
        handle(Request::Prepare { ts, metadata: Metadata::None, write_set: Vec::new(), writes }, now_ms);
    }
    let item = |key: &str, selector: Selector| GetItem { key: key.as_bytes().to_vec(), selector };
    let gets = vec![
        vec![
            item("a", Selector::Latest),
            item("b", Selector::Latest),
            item("c", Selector::Latest),
            item("none", Selector::Latest),
        ],
        vec![item("a", Selector::LatestTimestamp), item("none", Selector::LatestTimestamp)],
        vec![item("a", Selector::Exact(13)), item("b", Selector::Exact(5))],
        vec![item("b", Selector::HighestOf(vec![5, 6])), item("b", Selector::HighestOf(vec![1]))],
        vec![item("a", Selector::Exact(5))],
        vec![item("a", Selector::Exact(99))],
        vec![item("a", Selector::HighestOf(vec![5]))],
        vec![],
    ];
    let locate = |key: &[u8]| (key == b"b").then_some(3);
    for (i, items) in gets.into_iter().enumerate() {
        for request in [Request::Get { items: items.clone() }, Request::GetLocate { items }] {
            let mut frame = Vec::new();
            handle(request.clone(), 100).unwrap().encode_frame(42, &mut frame, locate);
            let (header, body) = FrameHeader::split(&frame).unwrap().unwrap();
            let decoded = Response::decode(header.kind, body).unwrap();
            assert_eq!(handle(request, 100).unwrap().into_response(locate), decoded, "get {i}");
        }
    }
    let Some(Reply::Versions(answers)) = handle(Request::Get { items: vec![item("b", Selector::Latest)] }, 100) else {
        panic!("not versions")
    };
    let Response::Versions { items } = Reply::Versions(answers).into_response(locate) else { panic!() };
    assert_eq!(
        (items[0].ts, &items[0].value[..], &items[0].metadata),
        (7, &b"b7"[..], &Metadata::Bloom(vec![0x5a; 16]))
    );
}

#[test]
fn a_prepared_write_set_is_kept_as_it_arrived_shared_not_decoded() {
    let keys: Vec<Vec<u8>> = (0..10u8).map(|index| vec![b'k', index]).collect();
    let arrived = WriteSet::from_keys(&keys).unwrap();
    let (metadata, write_set) = stored_write_set(Metadata::WriteSet(arrived.clone()), Vec::new()).unwrap();
    let StoredMetadata::WriteSet(stored) = &metadata else { panic!("{metadata:?}") };
    assert!(stored.shares_buffer_with(&arrived), "the versions' metadata is the request's buffer");
    assert!(write_set.shares_buffer_with(&arrived), "so is the pending entry's write set");
    assert_eq!(write_set.to_keys(), keys);

    // RAMP-Small and Hybrid carry the write set beside their metadata: encoded once.
    let (metadata, write_set) = stored_write_set(Metadata::None, keys.clone()).unwrap();
    assert_eq!((metadata, write_set.to_keys()), (StoredMetadata::None, keys));
    let too_many: Vec<Vec<u8>> = (0..=TXN_KEYS_MAX as u32).map(|index| index.to_le_bytes().to_vec()).collect();
    assert!(matches!(
        stored_write_set(Metadata::None, too_many),
        Err(StoreError::InvalidPrepare(InvalidPrepare::WriteSetTooLarge { .. }))
    ));
}
