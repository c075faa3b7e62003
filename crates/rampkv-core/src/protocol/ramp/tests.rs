//! RAMP-Fast's round-2 planning over compact write sets against the plain rule it replaced:
//! for every key, the highest ts among the returned versions whose write set (a list of owned
//! keys, compared byte by byte) names it, repaired where newer than the key's own version.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

/// The rule as first written: owned keys, a byte comparison against every transaction key.
fn plain_repairs(keys: &[Vec<u8>], results: &[Option<PlainVersion>]) -> Vec<(usize, Timestamp)> {
    let mut required = vec![TIMESTAMP_INITIAL; keys.len()];
    for (ts, write_set) in results.iter().flatten() {
        for key in write_set.iter().flatten() {
            if let Some(index) = keys.iter().position(|known| known == key) {
                required[index] = required[index].max(*ts);
            }
        }
    }
    let own = |index: usize| results[index].as_ref().map_or(TIMESTAMP_INITIAL, |(ts, _)| *ts);
    (0..keys.len()).filter(|&index| required[index] > own(index)).map(|index| (index, required[index])).collect()
}

fn random_key(random: &mut SmallRng) -> Vec<u8> {
    match random.gen_range(0..4) {
        // Few distinct names of one length: the same prefix, so bytes are compared often.
        0 | 1 => format!("key{:03}", random.gen_range(0..48)).into_bytes(),
        2 => (0..random.gen_range(0..6)).map(|_| random.gen_range(0..3u8)).collect(),
        _ => (0..random.gen_range(0..40)).map(|_| random.gen()).collect(),
    }
}

/// One returned version: its ts and its write set (`None`: other metadata).
type PlainVersion = (Timestamp, Option<Vec<Vec<u8>>>);

/// One random read: distinct keys, and per key maybe no version, else a version with a small ts
/// (ties happen) whose metadata is a write set of some of the keys, foreign keys and repeats,
/// or other metadata.
type Case = (Vec<Vec<u8>>, Vec<Option<PlainVersion>>);

type Fingerprint = fn(&[u8]) -> u64;

fn random_case(random: &mut SmallRng) -> Case {
    let wanted = if random.gen_bool(0.8) { random.gen_range(1..=12) } else { random.gen_range(13..=40) };
    let mut keys: Vec<Vec<u8>> = Vec::new();
    while keys.len() < wanted {
        let key = random_key(random);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let results = (0..keys.len())
        .map(|_| {
            if random.gen_bool(0.1) {
                return None;
            }
            let ts = random.gen_range(0..12u64);
            let write_set = random.gen_bool(0.85).then(|| {
                (0..random.gen_range(0..=keys.len() + 3))
                    .map(|_| {
                        if random.gen_bool(0.7) {
                            keys[random.gen_range(0..keys.len())].clone()
                        } else {
                            random_key(random)
                        }
                    })
                    .collect::<Vec<_>>()
            });
            Some((ts, write_set))
        })
        .collect();
    (keys, results)
}

fn as_versions(results: &[Option<PlainVersion>]) -> Vec<Option<VersionItem>> {
    results
        .iter()
        .map(|result| {
            result.as_ref().map(|(ts, write_set)| {
                let metadata = match write_set {
                    Some(keys) => Metadata::WriteSet(WriteSet::from_keys(keys).unwrap()),
                    None => Metadata::Bloom(vec![0xFF; 8]),
                };
                VersionItem::new(*ts, Vec::new(), metadata)
            })
        })
        .collect()
}

fn test_seed() -> u64 {
    let seed = std::env::var("RAMPKV_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |since| since.as_nanos() as u64)
    });
    println!("seed {seed} (replay with RAMPKV_TEST_SEED={seed})");
    seed
}

#[test]
fn compact_write_sets_plan_the_same_round_two_as_owned_keys() {
    let seed = test_seed();
    let mut random = SmallRng::seed_from_u64(seed);
    let fingerprints: [(&str, Fingerprint); 3] =
        [("key_fingerprint", key_fingerprint), ("every key collides", |_| 7), ("length only", |key| key.len() as u64)];
    let mut repaired = 0;
    for case in 0..20_000 {
        let (keys, results) = random_case(&mut random);
        let expected = plain_repairs(&keys, &results);
        repaired += usize::from(!expected.is_empty());
        let versions = as_versions(&results);
        for (name, fingerprint) in fingerprints {
            let planned = fast_repairs(&keys, &versions, KeyIndex::with_fingerprint(&keys, fingerprint));
            assert_eq!(
                planned, expected,
                "seed {seed}, case {case}, fingerprint {name}: keys {keys:?}, results {results:?}"
            );
        }
    }
    assert!(repaired > 2_000, "seed {seed}: the cases exercise repairs ({repaired})");
}

#[test]
fn the_key_index_finds_every_key_and_nothing_else() {
    for count in [0, 1, 8, KEY_INDEX_SCAN_MAX, KEY_INDEX_SCAN_MAX + 1, 64] {
        let keys: Vec<Vec<u8>> = (0..count).map(|n| format!("k{n}").into_bytes()).collect();
        for fingerprint in [key_fingerprint as Fingerprint, |_| 0] {
            let index = KeyIndex::with_fingerprint(&keys, fingerprint);
            for (position, key) in keys.iter().enumerate() {
                assert_eq!(index.find(key), Some(position), "{count} keys");
            }
            assert_eq!(index.find(b"k"), None);
            assert_eq!(index.find(b""), None);
            assert_eq!(index.find(format!("k{count}").as_bytes()), None);
        }
    }
}

#[test]
fn fingerprints_tell_short_keys_apart_and_long_keys_differing_in_the_middle_are_still_found() {
    let mut short: Vec<Vec<u8>> = (0..=u16::MAX).map(|n| n.to_le_bytes().to_vec()).collect();
    short.extend((0..=255u8).map(|n| vec![n]));
    short.extend((0..40u32 * 40 * 40).map(|n| vec![(n % 40) as u8, (n / 40 % 40) as u8, (n / 1600) as u8]));
    short.extend((0..100_000).map(|n| format!("key{n}").into_bytes()));
    short.extend((0..100_000u64).map(|n| format!("user{:012}", n * 7919).into_bytes()));
    short.push(Vec::new());
    let mut seen: ahash::AHashMap<u64, &[u8]> = ahash::AHashMap::default();
    for key in &short {
        assert!(key.len() <= 16);
        if let Some(other) = seen.insert(key_fingerprint(key), key) {
            panic!("{other:?} and {key:?} share a fingerprint");
        }
    }
    // Same length, first and last 8 bytes: only the bytes tell them apart.
    let long: Vec<Vec<u8>> = (0..16u8).map(|n| [&[b'p'; 12][..], &[n; 6], &[b's'; 12]].concat()).collect();
    assert!(long.windows(2).all(|pair| key_fingerprint(&pair[0]) == key_fingerprint(&pair[1])));
    let index = key_index(&long);
    for (position, key) in long.iter().enumerate() {
        assert_eq!(index.find(key), Some(position));
    }
    assert_eq!(index.find(&[&[b'p'; 12][..], &[99; 6], &[b's'; 12]].concat()), None);
}

/// A reader that got a version whose write set names a key it read at an older version
/// repairs exactly that key, at exactly that version; nothing when nothing raced.
#[test]
fn a_read_txn_repairs_from_a_compact_write_set() {
    let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
    let keys: Vec<Vec<u8>> = vec![b"x".to_vec(), b"y".to_vec(), b"z".to_vec()];
    let mut read = ReadTxn::new(&cluster, keys.clone(), TxnOptions::default()).unwrap();
    let mut out = Vec::new();
    read.start(&mut out);
    assert_eq!(out.len(), 1);
    let tag = out[0].tag;
    out.clear();
    let version = |ts: Timestamp, write_set: &[&[u8]]| {
        VersionItem::new(ts, ts.to_le_bytes().to_vec(), Metadata::WriteSet(WriteSet::from_keys(write_set).unwrap()))
    };
    // x and z written together at 20; the reader saw z's older version 10.
    let items = vec![version(20, &[b"x", b"z"]), version(5, &[b"y"]), version(10, &[b"z"])];
    let step = read.on_reply(tag, Response::Versions { items }, &mut out).unwrap();
    assert!(matches!(step, Step::Pending));
    let [Outgoing { request: Request::Get { items }, tag, .. }] = &out[..] else { panic!("one round-2 GET: {out:?}") };
    assert_eq!(items.len(), 1);
    assert_eq!((items[0].key.as_slice(), &items[0].selector), (&b"z"[..], &Selector::Exact(20)));
    let tag = *tag;
    let mut more = Vec::new();
    let step = read.on_reply(tag, Response::Versions { items: vec![version(20, &[b"x", b"z"])] }, &mut more).unwrap();
    let Step::Done(outcome) = step else { panic!("done after round 2") };
    let read_ts: Vec<Timestamp> = outcome.items.iter().map(|item| item.ts).collect();
    assert_eq!(read_ts, [20, 5, 20]);
    assert_eq!(outcome.round2_keys, 1);
    // The outcome keeps round 1's fractured answer (z at 10) and names what round 2 fetched.
    let round1: Vec<Option<Timestamp>> = outcome.items.iter().map(|item| item.round1_ts).collect();
    assert_eq!(round1, [Some(20), Some(5), Some(10)]);
    let fetched: Vec<bool> = outcome.items.iter().map(|item| item.fetched_in_round2).collect();
    assert_eq!(fetched, [false, false, true]);
}

/// A read that needs no repair reports round 1 as its answer, and a restart forgets the
/// round-1 answer and round-2 fetches of the attempt it abandons.
#[test]
fn round_one_is_reported_per_attempt() {
    let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
    let keys: Vec<Vec<u8>> = vec![b"x".to_vec(), b"z".to_vec()];
    let version = |ts: Timestamp, write_set: &[&[u8]]| {
        VersionItem::new(ts, ts.to_le_bytes().to_vec(), Metadata::WriteSet(WriteSet::from_keys(write_set).unwrap()))
    };
    let mut read = ReadTxn::new(&cluster, keys, TxnOptions::default()).unwrap();
    let mut out = Vec::new();
    read.start(&mut out);
    let tag = out.remove(0).tag;
    // Attempt 0: a race, so round 2 asks for z at 20; the server has collected it.
    let items = vec![version(20, &[b"x", b"z"]), version(10, &[b"z"])];
    assert!(matches!(read.on_reply(tag, Response::Versions { items }, &mut out).unwrap(), Step::Pending));
    let tag = out.remove(0).tag;
    let gone = Response::Error { code: ErrorCode::VersionGone, message: String::new() };
    assert!(matches!(read.on_reply(tag, gone, &mut out).unwrap(), Step::Pending));
    // Attempt 1: no race; the outcome shows this attempt's round 1, no round-2 fetch.
    let tag = out.remove(0).tag;
    let items = vec![version(30, &[b"x", b"z"]), version(30, &[b"x", b"z"])];
    let Step::Done(outcome) = read.on_reply(tag, Response::Versions { items }, &mut out).unwrap() else {
        panic!("one round when nothing raced")
    };
    assert_eq!(outcome.restarts, 1);
    for item in &outcome.items {
        assert_eq!((item.ts, item.round1_ts, item.fetched_in_round2), (30, Some(30), false));
    }
}

/// A RAMP write whose keys are all on one server is one PREPARE_COMMIT, done on its ACK; with
/// keys on two servers it is PREPAREs, then COMMITs once both are acknowledged; NoCC is PUTs.
#[test]
fn a_write_on_one_server_is_one_prepare_commit_and_a_wider_one_two_phases() {
    let one = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
    let two = Cluster::with_servers(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
    let writes =
        |count: usize| (0..count).map(|index| (format!("k{index}").into_bytes(), vec![1u8])).collect::<Vec<_>>();
    for algorithm in [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid] {
        let options = TxnOptions { algorithm, ..TxnOptions::default() };
        let mut write = WriteTxn::new(&one, 1 << 16 | 1, writes(3), options).unwrap();
        let mut out = Vec::new();
        write.start(&mut out);
        let [Outgoing { request: Request::PrepareCommit { writes: sent, .. }, tag, .. }] = &out[..] else {
            panic!("{algorithm:?}: one PREPARE_COMMIT: {out:?}")
        };
        assert_eq!(sent.len(), 3);
        let tag = *tag;
        let mut more = Vec::new();
        let step = write.on_reply(tag, Response::Ack, &mut more).unwrap();
        assert!(matches!(step, Step::Done(_)) && more.is_empty(), "{algorithm:?}: done on the ACK");

        // Keys on both servers (16 keys: both get some).
        let mut write = WriteTxn::new(&two, 1 << 16 | 2, writes(16), options).unwrap();
        let mut out = Vec::new();
        write.start(&mut out);
        assert_eq!(out.len(), 2, "{algorithm:?}");
        assert!(out.iter().all(|sent| matches!(sent.request, Request::Prepare { .. })), "{algorithm:?}: {out:?}");
        let mut commits = Vec::new();
        for sent in &out {
            assert!(matches!(write.on_reply(sent.tag, Response::Ack, &mut commits).unwrap(), Step::Pending));
        }
        assert!(commits.iter().all(|sent| matches!(sent.request, Request::Commit { .. })) && commits.len() == 2);
    }
    let options = TxnOptions { algorithm: Algorithm::NoCc, ..TxnOptions::default() };
    let mut write = WriteTxn::new(&one, 1 << 16 | 3, writes(2), options).unwrap();
    let mut out = Vec::new();
    write.start(&mut out);
    assert!(matches!(&out[..], [Outgoing { request: Request::Put { .. }, .. }]), "{out:?}");
}

/// Independent writes (pipelined Redis SETs): one PREPARE_COMMIT per key, all at once and at
/// one timestamp, each carrying a write set of its own key alone (so no reader repairs one from
/// another, and each version may go as soon as it is superseded); a key written twice keeps its
/// last value; done when every key is acknowledged. Other algorithms get one transaction.
#[test]
fn independent_writes_are_one_prepare_commit_per_key_each_alone_in_its_write_set() {
    let two = Cluster::with_servers(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
    let mut writes: Vec<(Vec<u8>, Vec<u8>)> =
        (0..6).map(|index| (format!("k{index}").into_bytes(), vec![1u8])).collect();
    writes.push((b"k0".to_vec(), vec![2u8]));
    let ts = 1 << 16 | 4;
    let mut write = WriteTxn::independent(&two, ts, writes.clone(), TxnOptions::default()).unwrap();
    let mut out = Vec::new();
    write.start(&mut out);
    assert_eq!(out.len(), 6, "one request per distinct key: {out:?}");
    for sent in &out {
        let Request::PrepareCommit {
            ts: sent_ts, metadata: Metadata::WriteSet(write_set), writes: sent_writes, ..
        } = &sent.request
        else {
            panic!("a PREPARE_COMMIT with a write set: {sent:?}")
        };
        let [only] = &sent_writes[..] else { panic!("one write each: {sent_writes:?}") };
        assert_eq!(*sent_ts, ts);
        assert_eq!(write_set.iter().collect::<Vec<_>>(), vec![&only.key[..]], "its own key alone");
        assert_eq!(sent.server, two.server_of(&only.key));
        if only.key == b"k0" {
            assert_eq!(only.value, vec![2u8], "the last value of a key written twice");
        }
    }
    let mut more = Vec::new();
    let (last, first) = out.split_last().unwrap();
    for sent in first {
        assert!(matches!(write.on_reply(sent.tag, Response::Ack, &mut more).unwrap(), Step::Pending));
    }
    assert!(matches!(write.on_reply(last.tag, Response::Ack, &mut more).unwrap(), Step::Done(_)));
    assert!(more.is_empty(), "no COMMIT: {more:?}");

    let options = TxnOptions { algorithm: Algorithm::RampSmall, ..TxnOptions::default() };
    let mut write = WriteTxn::independent(&two, ts, writes, options).unwrap();
    let mut out = Vec::new();
    write.start(&mut out);
    assert!(out.len() <= 2 && out.iter().all(|sent| matches!(sent.request, Request::Prepare { .. })), "{out:?}");
}

/// A version of keys `x` and `z` written together at `ts`, expiring as `expiry`.
fn expiring_version(ts: Timestamp, expiry: Expiry) -> VersionItem {
    let metadata = Metadata::WriteSet(WriteSet::from_keys(&[&b"x"[..], b"z"]).unwrap());
    let value = if expiry.is_reclaimed() { Vec::new() } else { ts.to_le_bytes().to_vec() };
    VersionItem { ts, value: value.into(), metadata, expiry }
}

/// A read of x and z whose round 1 sees x at 20 (written with z, expiring at 5,000) and z at
/// an older version 10: round 2 fetches z at 20, answered `round_two`. The outcome as read.
fn read_repairing_z(round_two: VersionItem) -> ReadOutcome {
    let cluster = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
    let mut read = ReadTxn::new(&cluster, vec![b"x".to_vec(), b"z".to_vec()], TxnOptions::default()).unwrap();
    let mut out = Vec::new();
    read.start(&mut out);
    let tag = out.remove(0).tag;
    let items =
        vec![expiring_version(20, Expiry::at_ms(5_000).unwrap()), VersionItem::new(10, vec![1], Metadata::None)];
    assert!(matches!(read.on_reply(tag, Response::Versions { items }, &mut out).unwrap(), Step::Pending));
    let [Outgoing { request: Request::Get { items }, tag, .. }] = &out[..] else { panic!("one round-2 GET: {out:?}") };
    assert_eq!((items[0].key.as_slice(), &items[0].selector), (&b"z"[..], &Selector::Exact(20)));
    let tag = *tag;
    let Step::Done(outcome) = read.on_reply(tag, Response::Versions { items: vec![round_two] }, &mut out).unwrap()
    else {
        panic!("done after round 2")
    };
    assert!(outcome.items[1].fetched_in_round2);
    outcome
}

/// Issue 31: a version fetched in round 2 carries its deadline and is judged with the rest of
/// the read, at one instant: both keys of the transaction present before the deadline, both
/// missing at and after it (their timestamps kept, as RAMP's evidence).
#[test]
fn an_expiring_version_fetched_in_round_two_is_judged_with_the_rest_of_the_read() {
    let outcome = read_repairing_z(expiring_version(20, Expiry::at_ms(5_000).unwrap()));
    let judged = |now_ms: u64| {
        let mut outcome = outcome.clone();
        outcome.judge_expiry(|| now_ms);
        assert_eq!(outcome.read_at_ms, now_ms);
        outcome.items.iter().map(|item| (item.ts, item.present_value().map(<[u8]>::to_vec))).collect::<Vec<_>>()
    };
    let value = Some(20u64.to_le_bytes().to_vec());
    assert_eq!(judged(4_999), vec![(20, value.clone()), (20, value)]);
    assert_eq!(judged(5_000), vec![(20, None), (20, None)]);
    assert_eq!(judged(9_000), vec![(20, None), (20, None)]);
}

/// Clock skew: z's server, whose clock runs ahead, has reclaimed z's version (deadline 5,000);
/// x's server has not, and the reader's clock says 1,000. The reclaimed answer of round 2
/// raises the read's instant to the deadline, so x (same transaction, same deadline) reads as
/// missing too: never one key of the transaction expired and the other present.
#[test]
fn a_reclaimed_version_in_round_two_makes_its_whole_transaction_read_as_missing() {
    let mut outcome = read_repairing_z(expiring_version(20, Expiry::at_ms(5_000).unwrap().reclaimed()));
    assert_eq!(outcome.reclaimed_deadline_ms, 5_000);
    outcome.judge_expiry(|| 1_000);
    assert_eq!(outcome.read_at_ms, 5_000, "raised to the reclaimed deadline, above the reader's clock");
    let present: Vec<bool> = outcome.items.iter().map(|item| item.exists).collect();
    assert_eq!(present, [false, false]);
    assert_eq!(outcome.items.iter().map(|item| item.ts).collect::<Vec<_>>(), [20, 20]);
}

/// Issue 31: distinct keys come out in first-seen order, without copies, and every requested
/// key (repeats included) maps to its own; below and above the scan's limit.
#[test]
fn distinct_keys_keep_first_seen_order_and_map_every_repeat() {
    for count in [1usize, 5, 16, 17, 160, 256] {
        let keys: Vec<Vec<u8>> =
            (0..count).map(|index| format!("k{}", (index * 7) % (count / 2 + 1)).into_bytes()).collect();
        let (distinct, positions) = super::distinct_keys(keys.clone());
        let mut model: Vec<Vec<u8>> = Vec::new();
        for key in &keys {
            if !model.contains(key) {
                model.push(key.clone());
            }
        }
        assert_eq!(distinct, model, "{count} keys");
        assert_eq!(positions.len(), keys.len());
        for (key, &position) in keys.iter().zip(&positions) {
            assert_eq!(&distinct[position], key, "{count} keys");
        }
    }
}
