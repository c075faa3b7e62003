//! The replication port against bad input: every refusal is an answer or a closed connection,
//! nothing is applied past it, nothing panics.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_core::limits::REPLICATION_LOG_RING_BYTES;
use rampkv_core::protocol::server::{Effects, LogPosition, ServerCore};
use rampkv_core::storage::{Store, StoredMetadata, Version};
use rampkv_durable::record::encode_record;
use rampkv_durable::{RecordHeader, RecordRef};

use super::super::durable::DurabilityConfig;
use super::log_region::{LogReceiver, LogSender};
use super::wire::{
    decode_ack, decode_answer, decode_hello, decode_marker, encode_ack, encode_answer, encode_hello, encode_marker,
    Hello, ACK_BYTES, ANSWER_BYTES, HELLO_BYTES, MARKER_BYTES, MARKER_IN_SYNC, MARKER_SNAPSHOT,
};
use super::*;

fn service() -> BackupService {
    BackupService::start(TcpListener::bind("127.0.0.1:0").unwrap(), 1_000, None).unwrap()
}

/// The stream identity the tests' hand-made primaries name.
const STREAM: u64 = 0x5eed;

fn connect(service: &BackupService) -> TcpStream {
    let stream = TcpStream::connect(service.address()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
}

fn hello(stream: &mut TcpStream, primary: u16, epoch: u64, first: u64) -> (u16, u64) {
    stream
        .write_all(&encode_hello(&Hello { primary, epoch, first, stream: STREAM, catch_up: false, log_region: false }))
        .unwrap();
    let mut answer = [0u8; ANSWER_BYTES];
    stream.read_exact(&mut answer).unwrap();
    decode_answer(&answer).expect("a well-formed answer")
}

fn put(lsn: u64, epoch: u64, key: &str) -> Vec<u8> {
    let writes = vec![(Key::from(key.as_bytes()), Box::from(b"value".as_slice()))];
    let mut frame = Vec::new();
    let header = RecordHeader { lsn, epoch, synced_lsn: 0 };
    encode_record(header, RecordRef::Put { ts: 1 << 20 | lsn, writes: (&writes).into() }, &mut frame).unwrap();
    frame
}

fn ack(stream: &mut TcpStream) -> u64 {
    let mut ack = [0u8; ACK_BYTES];
    stream.read_exact(&mut ack).unwrap();
    let (applied, in_sync) = decode_ack(&ack).expect("a well-formed acknowledgement");
    assert!(!in_sync, "an acknowledgement of records");
    applied
}

/// The connection was closed by the backup (a read returns end of stream or a reset).
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0) | Err(_))
}

use rampkv_core::storage::Key;

#[test]
fn hello_answer_and_acknowledgement_round_trip_and_any_flipped_bit_is_refused() {
    let fields =
        Hello { primary: 3, epoch: 7, first: 11, stream: 0x1234_5678_9abc, catch_up: false, log_region: false };
    let hello = encode_hello(&fields);
    assert_eq!(decode_hello(&hello).as_ref(), Some(&fields));
    let catch_up = encode_hello(&Hello { catch_up: true, log_region: true, ..fields });
    assert_eq!(
        decode_hello(&catch_up),
        Some(Hello { primary: 3, epoch: 7, first: 11, stream: 0x1234_5678_9abc, catch_up: true, log_region: true })
    );
    let mut unknown_flag = hello;
    unknown_flag[32] |= 4;
    let crc = crc32c::crc32c(&unknown_flag[0..36]);
    unknown_flag[36..40].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode_hello(&unknown_flag), None, "an unknown flag");
    let answer = encode_answer(2, 99);
    assert_eq!(decode_answer(&answer), Some((2, 99)));
    let acknowledgement = encode_ack(42, false);
    assert_eq!(decode_ack(&acknowledgement), Some((42, false)));
    assert_eq!(decode_ack(&encode_ack(42, true)), Some((42, true)));
    let marker = encode_marker(MARKER_SNAPSHOT, 9, 4);
    assert_eq!(decode_marker(&marker), Some((MARKER_SNAPSHOT, 9, 4)));
    for bit in 0..MARKER_BYTES * 8 {
        let mut bad = marker;
        bad[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(decode_marker(&bad), None, "marker bit {bit}");
    }
    for bit in 0..HELLO_BYTES * 8 {
        let mut bad = hello;
        bad[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(decode_hello(&bad), None, "hello bit {bit}");
    }
    for bit in 0..ANSWER_BYTES * 8 {
        let mut bad = answer;
        bad[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(decode_answer(&bad), None, "answer bit {bit}");
    }
    for bit in 0..ACK_BYTES * 8 {
        let mut bad = acknowledgement;
        bad[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(decode_ack(&bad), None, "acknowledgement bit {bit}");
    }
}

#[test]
fn records_are_applied_in_order_and_acknowledged_and_a_bad_checksum_closes_the_stream() {
    let service = service();
    let mut stream = connect(&service);
    assert_eq!(hello(&mut stream, 0, 1, 1), (0, 0));
    let mut burst = put(1, 1, "a");
    burst.extend(put(2, 1, "b"));
    stream.write_all(&burst).unwrap();
    let mut acknowledged = ack(&mut stream);
    if acknowledged < 2 {
        acknowledged = ack(&mut stream);
    }
    assert_eq!(acknowledged, 2);
    let copy = service.copy_of(0).unwrap();
    assert!(copy.store().get_latest(b"a").is_some() && copy.store().get_latest(b"b").is_some());
    let mut damaged = put(3, 1, "c");
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40; // in the payload: the header still checks, the CRC does not
    stream.write_all(&damaged).unwrap();
    assert!(closed(&mut stream), "a record with a bad checksum closes the stream");
    assert_eq!(copy.applied(), 2, "nothing applied past the damage");
    assert!(copy.store().get_latest(b"c").is_none());
    // The stream can be taken up again where it stopped.
    let mut again = connect(&service);
    assert_eq!(hello(&mut again, 0, 1, 3), (0, 2));
    again.write_all(&put(3, 1, "c")).unwrap();
    assert_eq!(ack(&mut again), 3);
    assert_eq!(service.stats().records_applied, 3);
}

#[test]
fn stale_epochs_gaps_and_records_of_another_epoch_are_refused() {
    let service = service();
    let mut stream = connect(&service);
    assert_eq!(hello(&mut stream, 1, 5, 1), (0, 0));
    stream.write_all(&put(1, 5, "a")).unwrap();
    assert_eq!(ack(&mut stream), 1);
    drop(stream);
    // A primary of an older epoch (a deposed one) is fenced.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut stale = connect(&service);
    let mut answer = hello(&mut stale, 1, 4, 2);
    while answer.0 == 4 && std::time::Instant::now() < deadline {
        // The first stream's thread has not noticed its end yet.
        std::thread::sleep(Duration::from_millis(10));
        stale = connect(&service);
        answer = hello(&mut stale, 1, 4, 2);
    }
    assert_eq!(answer, (1, 5), "stale epoch, the known one named");
    // A stream that starts past what the backup holds needs catching up.
    let mut gap = connect(&service);
    assert_eq!(hello(&mut gap, 2, 1, 10), (2, 0));
    // Inside a stream, a record of another epoch than the hello's.
    let mut wrong = connect(&service);
    assert_eq!(hello(&mut wrong, 3, 2, 1), (0, 0));
    wrong.write_all(&put(1, 1, "x")).unwrap();
    assert!(closed(&mut wrong));
    assert_eq!(service.copy_of(3).unwrap().applied(), 0);
    // A record out of order.
    let mut skip = connect(&service);
    assert_eq!(hello(&mut skip, 4, 1, 1), (0, 0));
    skip.write_all(&put(2, 1, "y")).unwrap();
    assert!(closed(&mut skip));
    // Garbage instead of a hello.
    let mut garbage = connect(&service);
    garbage.write_all(&[0xAB; HELLO_BYTES]).unwrap();
    let mut answer = [0u8; ANSWER_BYTES];
    garbage.read_exact(&mut answer).unwrap();
    assert_eq!(decode_answer(&answer), Some((3, 0)));
    assert!(service.stats().connections_refused >= 4);
}

#[test]
fn a_replicator_releases_a_call_only_once_every_backup_acknowledged_it() {
    replicator_releases_a_call_only_once_every_backup_holds_it(ReplicationMedium::Tcp);
}

/// One-sided: a call is released once it landed in both backups' log regions; the backups
/// apply it (the apply lag is measured); a backup that goes away closes its region, and later
/// calls are never released.
#[test]
fn a_one_sided_replicator_releases_a_call_once_it_landed_in_every_log_region() {
    replicator_releases_a_call_only_once_every_backup_holds_it(ReplicationMedium::OneSided);
}

fn replicator_releases_a_call_only_once_every_backup_holds_it(medium: ReplicationMedium) {
    let (first, second) = (service(), service());
    let backups = vec![(1, first.address().to_string()), (2, second.address().to_string())];
    let replicator = Replicator::start(0, 1, backups, None, medium).unwrap();
    let mut effects = Effects::default();
    effects.logged.push(rampkv_core::protocol::server::LogRecord::put(
        1 << 20,
        vec![(Key::from(b"k".as_slice()), Box::from(b"v".as_slice()))],
    ));
    effects.logged.push(rampkv_core::protocol::server::LogRecord::Prepare {
        ts: 2 << 20,
        metadata: StoredMetadata::None,
        write_set: rampkv_core::wire::WriteSet::from_keys(&[b"p"]).unwrap(),
        writes: vec![(
            Key::from(b"p".as_slice()),
            Arc::new(Version::new(2 << 20, Box::from(b"w".as_slice()), StoredMetadata::None)),
        )],
    });
    replicator.append(&mut effects);
    assert!(effects.logged.is_empty());
    assert_eq!(effects.release_after, Some(LogPosition(2)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while replicator.acknowledged() < LogPosition(2) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(replicator.acknowledged(), LogPosition(2));
    for service in [&first, &second] {
        let copy = service.copy_of(0).unwrap();
        // One-sided, the backup applies what it holds off the primary's path: soon, not at once.
        let deadline = Instant::now() + Duration::from_secs(10);
        while copy.applied() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(copy.applied(), 2);
        assert!(copy.store().get_latest(b"k").is_some());
        assert_eq!(copy.store().stats().pending_transactions, 1, "the PREPARE is held prepared");
    }
    if medium == ReplicationMedium::OneSided {
        let deadline = Instant::now() + Duration::from_secs(10);
        while replicator.stats().apply_lag.count() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stats = replicator.stats();
        assert_eq!(stats.apply_lag.count(), 2, "one apply lag per backup for the call");
        assert!(stats.apply_lag.quantile_us(1.0) > 0 && stats.apply_lag_us_max < 10_000_000);
    }
    // A backup that goes away: the link fails and later calls are never released.
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while replicator.failure().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(replicator.failure().is_some());
    let mut effects = Effects::default();
    effects.logged.push(rampkv_core::protocol::server::LogRecord::Commit { ts: 2 << 20 });
    replicator.append(&mut effects);
    assert_eq!(effects.release_after, Some(LogPosition(3)));
    std::thread::sleep(Duration::from_millis(50));
    assert!(replicator.acknowledged() < LogPosition(3), "held: one backup cannot hold it");
}

/// Failover: taking a primary's copy over fences the primary. What it streamed and was
/// acknowledged is in the copy; its stream is closed and nothing it sends after the takeover is
/// applied; a later hello of its old epoch is refused, naming the new one.
#[test]
fn taking_a_copy_over_fences_its_primary() {
    let service = service();
    let mut stream = connect(&service);
    assert_eq!(hello(&mut stream, 4, 1, 1), (0, 0));
    stream.write_all(&put(1, 1, "a")).unwrap();
    assert_eq!(ack(&mut stream), 1);
    let copy = service.take_over(4, 2).expect("the primary streamed");
    assert!(copy.store().get_latest(b"a").is_some(), "the acknowledged record is in the copy");
    let _ = stream.write_all(&put(2, 1, "b")); // may fail: the backup closed the stream
    assert!(closed(&mut stream), "the old primary's stream is closed");
    assert!(copy.store().get_latest(b"b").is_none() && copy.applied() == 1, "nothing applied after it");
    let mut again = connect(&service);
    assert_eq!(hello(&mut again, 4, 1, 2), (1, 2), "a hello of the old epoch is refused");
    assert!(closed(&mut again));
    assert!(service.take_over(9, 2).is_none(), "a primary that never streamed has no copy");
}

fn write_key(store: &Store, ts: u64, key: &str) {
    store.put(ts, vec![(Key::from(key.as_bytes()), Box::from(key.as_bytes()))], 0).unwrap();
}

/// Rejoin: a catching-up backup gets a snapshot of the primary's store, then the records
/// appended while it was taken and after; its copy becomes current only once it is in sync,
/// and from then on a write is released only once it is on the copy.
#[test]
fn a_catching_up_backup_gets_a_snapshot_then_the_records_and_becomes_in_sync() {
    catching_up_backup_gets_a_snapshot_then_the_records_and_becomes_in_sync(ReplicationMedium::Tcp);
}

/// The same through the backup's log region (the snapshot, the records and the in-sync marker
/// all travel in it).
#[test]
fn a_one_sided_catching_up_backup_gets_a_snapshot_then_the_records_and_becomes_in_sync() {
    catching_up_backup_gets_a_snapshot_then_the_records_and_becomes_in_sync(ReplicationMedium::OneSided);
}

fn catching_up_backup_gets_a_snapshot_then_the_records_and_becomes_in_sync(medium: ReplicationMedium) {
    let core = Arc::new(ServerCore::new(1_000));
    let service = service();
    let replicator = Replicator::start(0, 3, Vec::new(), None, medium).unwrap();
    replicator.set_source(Arc::clone(&core));
    // The store applies a change before its record is appended (the contract).
    let write = |ts: u64, key: &str| {
        write_key(core.store(), ts, key);
        let mut effects = Effects::default();
        effects.logged.push(rampkv_core::protocol::server::LogRecord::put(
            ts,
            vec![(Key::from(key.as_bytes()), Box::from(key.as_bytes()))],
        ));
        replicator.append(&mut effects);
        effects.release_after.expect("a record was appended")
    };
    write_key(core.store(), 1 << 20, "old"); // in the store, no record (adopted data)
    write(2 << 20, "before");
    replicator.add_catch_up(1, service.address().to_string(), 7).unwrap();
    for index in 0..200u64 {
        write((3 + index) << 20, &format!("during{index}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replicator.in_sync(1, 7, 3) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(replicator.in_sync(1, 7, 3), "the catching-up backup got in sync");
    assert!(!replicator.in_sync(1, 7, 4), "a link opened in epoch 3 does not count for epoch 4");
    assert!(!replicator.in_sync(1, 8, 3), "nor for another incarnation of the backup");
    let copy = service.copy_of(0).expect("the copy is current once in sync");
    for key in ["old".to_owned(), "before".to_owned()].into_iter().chain((0..200).map(|index| format!("during{index}")))
    {
        assert!(copy.store().get_latest(key.as_bytes()).is_some(), "{key} is on the copy");
    }
    let position = write(1_000 << 20, "after");
    let deadline = Instant::now() + Duration::from_secs(10);
    while replicator.acknowledged() < position && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(replicator.acknowledged() >= position);
    if medium == ReplicationMedium::OneSided {
        // Held (landed in the log region): applied soon after, off the primary's path.
        let deadline = Instant::now() + Duration::from_secs(10);
        while copy.store().get_latest(b"after").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(copy.store().get_latest(b"after").is_some(), "a released write is on the in-sync copy");
}

fn ack_of(stream: &mut TcpStream) -> (u64, bool) {
    let mut ack = [0u8; ACK_BYTES];
    stream.read_exact(&mut ack).unwrap();
    decode_ack(&ack).expect("a well-formed acknowledgement")
}

/// A catch-up stream: hello (answered accepted), the snapshot marker at `first`, `snapshot` in
/// one chunk, then the end of the snapshot.
fn catch_up(service: &BackupService, primary: u16, first: u64, snapshot: &[u8]) -> TcpStream {
    let mut stream = connect(service);
    stream
        .write_all(&encode_hello(&Hello {
            primary,
            epoch: 2,
            first,
            stream: STREAM,
            catch_up: true,
            log_region: false,
        }))
        .unwrap();
    let mut answer = [0u8; ANSWER_BYTES];
    stream.read_exact(&mut answer).unwrap();
    // 0: a fresh copy; more: a copy of this stream cut short goes on (it may still get a
    // snapshot, which starts it over).
    assert!(matches!(decode_answer(&answer), Some((0, _))), "a catch-up hello is accepted");
    stream.write_all(&encode_marker(MARKER_SNAPSHOT, first, 2)).unwrap();
    let _ = stream.write_all(&(snapshot.len() as u32).to_le_bytes());
    let _ = stream.write_all(snapshot);
    let _ = stream.write_all(&0u32.to_le_bytes());
    stream
}

/// Bad input on a catch-up stream (a damaged or cut snapshot, a snapshot of another point, a
/// record where the snapshot must come, an in-sync marker before the records it names): the
/// stream is closed and the copy never becomes current. A good one: acknowledged at its point,
/// then records, then current at the in-sync marker.
#[test]
fn a_catch_up_stream_with_bad_input_is_refused_and_its_copy_never_current() {
    let service = service();
    let store = Store::new(1_000);
    for index in 0..20u64 {
        write_key(&store, (index + 1) << 20, &format!("k{index}"));
    }
    let mut snapshot = Vec::new();
    rampkv_durable::snapshot::write_to(&mut snapshot, &store, 4, 2).unwrap();
    let mut damaged = snapshot.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x10;
    let cut = &snapshot[..snapshot.len() - 3];
    for (what, bytes, first) in [("damaged", &damaged[..], 5), ("cut", cut, 5), ("another point", &snapshot[..], 6)] {
        let mut stream = catch_up(&service, 5, first, bytes);
        assert!(closed(&mut stream), "{what}: the stream is closed");
        assert!(service.copy_of(5).is_none(), "{what}: the copy is not current");
    }
    let mut record_first = connect(&service);
    record_first
        .write_all(&encode_hello(&Hello {
            primary: 5,
            epoch: 2,
            first: 5,
            stream: STREAM,
            catch_up: true,
            log_region: false,
        }))
        .unwrap();
    let mut answer = [0u8; ANSWER_BYTES];
    record_first.read_exact(&mut answer).unwrap();
    record_first.write_all(&put(5, 2, "x")).unwrap();
    assert!(closed(&mut record_first), "a record before the snapshot");
    let mut early = catch_up(&service, 5, 5, &snapshot);
    assert_eq!(ack_of(&mut early), (4, false), "the snapshot acknowledged at its point");
    early.write_all(&encode_marker(MARKER_IN_SYNC, 9, 2)).unwrap();
    assert!(closed(&mut early), "an in-sync marker past what was applied");
    assert!(service.copy_of(5).is_none());
    // A good one (a snapshot again, though the copy cut short holds up to record 4).
    let mut good = catch_up(&service, 5, 5, &snapshot);
    assert_eq!(ack_of(&mut good), (4, false));
    good.write_all(&put(5, 2, "x")).unwrap();
    assert_eq!(ack_of(&mut good), (5, false));
    assert!(service.copy_of(5).is_none(), "not current before the in-sync marker");
    good.write_all(&encode_marker(MARKER_IN_SYNC, 5, 2)).unwrap();
    assert_eq!(ack_of(&mut good), (5, true));
    let copy = service.copy_of(5).expect("current after the in-sync marker");
    assert!(copy.store().get_latest(b"x").is_some() && copy.store().get_latest(b"k19").is_some());
    assert!(service.stats().connections_refused >= 5);
}

/// A primary's one-sided stream played by the test: a hello asking for a log region (answered
/// accepted), then the region handshake.
fn log_hello(service: &BackupService, primary: u16, epoch: u64, first: u64) -> (TcpStream, LogSender) {
    let mut stream = connect(service);
    stream
        .write_all(&encode_hello(&Hello { primary, epoch, first, stream: STREAM, catch_up: false, log_region: true }))
        .unwrap();
    let mut answer = [0u8; ANSWER_BYTES];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(decode_answer(&answer).map(|(status, _)| status), Some(0), "accepted");
    let log = LogSender::connect(&mut stream).unwrap();
    (stream, log)
}

/// Writes `bytes` into the log region (waiting for room up to 5 s): whether they are held.
fn land(log: &mut LogSender, bytes: &[u8]) -> Result<bool, LogError> {
    log.append(bytes, &mut 0, Some(Instant::now() + Duration::from_secs(5)))
}

/// One-sided, the same checks as over TCP: records applied in order and acknowledged; a
/// record with a bad checksum, or of an older epoch than its stream's hello, closes the stream
/// and its log region (a later write is not held) and is never applied.
#[test]
fn one_sided_records_are_applied_in_order_and_a_bad_checksum_or_an_old_epoch_closes_the_stream() {
    let service = service();
    let (mut stream, mut log) = log_hello(&service, 0, 1, 1);
    let mut burst = put(1, 1, "a");
    burst.extend(put(2, 1, "b"));
    assert!(land(&mut log, &burst).unwrap(), "held once landed");
    let mut acknowledged = ack(&mut stream);
    if acknowledged < 2 {
        acknowledged = ack(&mut stream);
    }
    assert_eq!(acknowledged, 2, "applied and acknowledged");
    let copy = service.copy_of(0).unwrap();
    assert!(copy.store().get_latest(b"a").is_some() && copy.store().get_latest(b"b").is_some());
    let mut damaged = put(3, 1, "c");
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40; // in the payload: the header still checks, the CRC does not
    let _ = land(&mut log, &damaged); // may land before the backup reads it: then it is refused
    assert!(closed(&mut stream), "a record with a bad checksum closes the stream");
    assert!(matches!(land(&mut log, &put(4, 1, "d")), Err(LogError::Closed)), "and its region");
    assert_eq!(copy.applied(), 2, "nothing applied past the damage");
    assert!(copy.store().get_latest(b"c").is_none());
    // A record of an older epoch than the hello's (a deposed primary's).
    let (mut stale, mut log) = log_hello(&service, 3, 2, 1);
    let _ = land(&mut log, &put(1, 1, "x"));
    assert!(closed(&mut stale), "a record of an old epoch closes the stream");
    assert!(matches!(land(&mut log, &put(2, 2, "y")), Err(LogError::Closed)));
    assert_eq!(service.copy_of(3).unwrap().applied(), 0, "never applied");
    assert!(service.stats().connections_refused >= 2);
}

/// Failover over the one-sided medium: records land in the log region while the backup takes
/// the copy over. Every record whose write counted as held before the takeover is in the copy
/// it takes (the region is closed, then drained), a write after the close is not held, nothing
/// is applied once the takeover returned, and the old epoch's hello is refused.
#[test]
fn taking_a_copy_over_drains_its_log_region_and_no_later_write_is_held() {
    let service = service();
    let (stream, mut log) = log_hello(&service, 4, 1, 1);
    // The backup's acknowledgements are read (a full socket would stall its apply).
    let mut acknowledgements = stream.try_clone().unwrap();
    let reader =
        std::thread::spawn(move || while acknowledgements.read(&mut [0u8; 4096]).is_ok_and(|read| read > 0) {});
    let writer = std::thread::spawn(move || {
        let mut held = 0;
        for lsn in 1..=1_000_000u64 {
            match land(&mut log, &put(lsn, 1, &format!("k{lsn}"))) {
                Ok(true) => held = lsn,
                Ok(false) => panic!("the region stayed full for 5 s at record {lsn}"),
                Err(LogError::Closed) => return (held, lsn),
                Err(other) => panic!("record {lsn}: {other}"),
            }
        }
        (held, 0)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while service.copy_of(4).map_or(0, |copy| copy.applied()) < 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let copy = service.take_over(4, 2).expect("the primary streamed");
    let applied = copy.applied();
    let (held, refused) = writer.join().unwrap();
    assert!(refused > 0, "a write after the takeover is not held");
    assert!(applied >= held, "every held record is in the copy: {held} held, {applied} applied");
    for lsn in (1..=held).step_by(97).chain([held]) {
        assert!(copy.store().get_latest(format!("k{lsn}").as_bytes()).is_some(), "record {lsn} held, in the copy");
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(copy.applied(), applied, "nothing applied after the takeover returned");
    let mut again = connect(&service);
    assert_eq!(hello(&mut again, 4, 1, applied + 1), (1, 2), "a hello of the old epoch is refused");
    drop(stream);
    reader.join().unwrap();
}

/// The apply lag's bound: a backup that does not apply fills its log region, and then the
/// primary's writes wait (back-pressure) and give up at their deadline; what the backup
/// consumes is written again, and a closed region makes the next write not held.
#[test]
fn a_full_log_region_holds_the_primary_back_until_the_backup_consumes() {
    let (_connections, mut log, mut receiver) = log_region_pair();
    let message = vec![7u8; 4096];
    let mut landed = 0;
    while log.append(&message, &mut 0, None).unwrap() {
        landed += 1;
    }
    assert!(landed > 0 && landed * message.len() <= REPLICATION_LOG_RING_BYTES, "{landed} messages in the region");
    let soon = Instant::now() + Duration::from_millis(20);
    assert!(!log.append(&message, &mut 0, Some(soon)).unwrap(), "full: the write waits, then gives up");
    // The backup consumes a quarter of the region (credit returns in quarters): room again.
    let mut out = vec![0u8; message.len()];
    for _ in 0..=REPLICATION_LOG_RING_BYTES / 4 / message.len() {
        assert_eq!(receiver.read(&mut out).unwrap(), message.len());
        assert!(out.iter().all(|&byte| byte == 7));
    }
    assert!(land(&mut log, &message).unwrap(), "written once the backup consumed");
    receiver.close();
    assert!(matches!(land(&mut log, &message), Err(LogError::Closed)), "a closed region holds nothing");
}

/// A backup reads whatever landed in its log region in one read (a burst: applied and
/// acknowledged once), across message boundaries, and a read of an empty region returns
/// nothing at once (it polls; nobody rings it).
#[test]
fn a_backup_reads_a_burst_of_messages_at_once() {
    let (_connections, mut log, mut receiver) = log_region_pair();
    let mut out = vec![0u8; 64 * 1024];
    let started = Instant::now();
    assert_eq!(receiver.read(&mut out).unwrap(), 0, "nothing landed");
    assert!(started.elapsed() < Duration::from_millis(50), "an empty region is not waited on");
    for byte in 1..=3u8 {
        assert!(land(&mut log, &vec![byte; 1000]).unwrap());
    }
    assert_eq!(receiver.read(&mut out).unwrap(), 3000, "three messages in one read");
    assert!(out[..1000].iter().all(|&b| b == 1) && out[1000..2000].iter().all(|&b| b == 2));
    assert!(out[2000..3000].iter().all(|&b| b == 3));
    // A read smaller than what landed takes its part; the next read the rest.
    assert!(land(&mut log, &[9u8; 1500]).unwrap());
    assert_eq!(receiver.read(&mut out[..1000]).unwrap(), 1000);
    assert_eq!(receiver.read(&mut out).unwrap(), 500);
    assert_eq!(receiver.read(&mut out).unwrap(), 0);
}

/// A primary's log sender and a backup's log region, set up over a loopback connection (kept
/// open by the returned pair of streams: its end would mean the backup went away).
fn log_region_pair() -> ((TcpStream, TcpStream), LogSender, LogReceiver) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let backup = std::thread::spawn(move || {
        let (mut control, _) = listener.accept().unwrap();
        control.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let receiver = LogReceiver::accept(&mut control).unwrap();
        (control, receiver)
    });
    let mut control = connect_to(address);
    let log = LogSender::connect(&mut control).unwrap();
    let (backup_control, receiver) = backup.join().unwrap();
    ((control, backup_control), log, receiver)
}

fn connect_to(address: std::net::SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
}

/// The apply-lag histogram: buckets tile the values without gaps, and a quantile is bounded
/// from above by at most a quarter (plus one bucket's rounding at the bottom).
#[test]
fn the_apply_lag_histogram_bounds_each_quantile_from_above_within_a_quarter() {
    for value in 0..131_072u64 {
        let index = LagHistogram::bucket(value);
        assert!(value < LagHistogram::upper_us(index), "{value} below its bucket's end");
        assert!(index == 0 || value >= LagHistogram::upper_us(index - 1), "{value} above the previous bucket");
    }
    let mut histogram = LagHistogram::default();
    assert_eq!(histogram.quantile_us(0.5), 0, "no lag counted");
    for value in 0..10_000u64 {
        histogram.record(value);
    }
    assert_eq!(histogram.count(), 10_000);
    for quantile in [0.5f64, 0.9, 0.99, 0.999, 1.0] {
        let exact = (quantile * 10_000.0).ceil() as u64 - 1;
        let bound = histogram.quantile_us(quantile);
        assert!(bound > exact && bound <= exact + exact / 4 + 2, "quantile {quantile}: {bound} for {exact}");
    }
    let mut merged = LagHistogram::default();
    merged.add(&histogram);
    merged.add(&histogram);
    assert_eq!((merged.count(), merged.quantile_us(0.5)), (20_000, histogram.quantile_us(0.5)));
}

/// Restart with a data directory (module docs, "Delta"): a backup that kept its copy on disk
/// and restarted is sent only the records it missed by a primary whose stream it holds a
/// prefix of; once the primary's store took what no record describes (an adopted copy: a new
/// stream identity) it gets a snapshot instead. Either way it ends in sync with every write.
#[test]
fn a_restarted_backup_with_its_copy_on_disk_gets_only_the_records_it_missed() {
    let root = tempfile::tempdir().unwrap();
    let persistence = |restore| {
        let config = DurabilityConfig::default();
        Some(CopyPersistence {
            root: root.path().join(super::super::durable::COPIES_DIR),
            config,
            restore,
            resume_current: false,
        })
    };
    let start = |restore| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        BackupService::start_durable(listener, 1_000, None, persistence(restore)).unwrap()
    };
    let core = Arc::new(ServerCore::new(1_000));
    let backup = start(false);
    let stream = StreamStart { first: 1, backlog_bytes: 1 << 20, ..StreamStart::default() };
    let backups = vec![(1, backup.address().to_string(), rampkv_config::configuration::BOOTSTRAP_INCARNATION)];
    let replicator =
        Replicator::start_with(0, 3, backups, None, ReplicationMedium::OneSided, stream, Some(Arc::clone(&core)))
            .unwrap();
    let write = |index: u64| {
        let key = format!("key{index}");
        write_key(core.store(), (index + 1) << 20, &key);
        let mut effects = Effects::default();
        effects.logged.push(rampkv_core::protocol::server::LogRecord::put(
            (index + 1) << 20,
            vec![(Key::from(key.as_bytes()), Box::from(key.as_bytes()))],
        ));
        replicator.append(&mut effects);
        effects.release_after.expect("a record was appended")
    };
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(done(), "{what}");
    };
    let position = (0..100).fold(LogPosition(0), |_, index| write(index));
    wait("the backup acknowledged the first 100 records", &|| replicator.acknowledged() >= position);
    // One-sided, a record is held once it landed and applied (and kept on disk) later: the
    // test lets the backup apply all 100 before it dies, so that it missed exactly 50.
    wait("the backup applied the first 100 records", &|| backup.copy_of(0).is_some_and(|copy| copy.applied() == 100));
    // The backup dies; the configuration removes it; the primary writes on without it.
    drop(backup);
    replicator.retain_backups(&[]);
    replicator.set_epoch(4); // the delta's records are of epoch 3, the catch-up hello's of 4
    (100..150).for_each(|index| {
        write(index);
    });
    let restarted = start(true);
    replicator.add_catch_up(1, restarted.address().to_string(), 7).unwrap();
    (150..170).for_each(|index| {
        write(index);
    });
    wait("the restarted backup got in sync", &|| replicator.in_sync(1, 7, 3));
    let stats = replicator.stats();
    assert_eq!((stats.catch_up_deltas, stats.catch_up_snapshots), (1, 0), "{stats:?}");
    assert_eq!(stats.catch_up_delta_records, 50, "the 50 records it missed, not the store: {stats:?}");
    let copy = restarted.copy_of(0).expect("current once in sync");
    wait("every write is on the copy", &|| copy.applied() == 170);
    for index in 0..170 {
        assert!(copy.store().get_latest(format!("key{index}").as_bytes()).is_some(), "key{index}");
    }
    // The primary adopts a copy (data no record describes): the next restart needs a snapshot.
    drop(copy);
    drop(restarted);
    replicator.retain_backups(&[]);
    replicator.new_lineage();
    write_key(core.store(), 1_000 << 20, "adopted");
    write(170);
    let again = start(true);
    replicator.add_catch_up(1, again.address().to_string(), 8).unwrap();
    wait("the backup restarted again got in sync", &|| replicator.in_sync(1, 8, 3));
    let stats = replicator.stats();
    assert_eq!((stats.catch_up_deltas, stats.catch_up_snapshots), (1, 1), "{stats:?}");
    let copy = again.copy_of(0).expect("current once in sync");
    assert!(copy.store().get_latest(b"adopted").is_some(), "the snapshot holds the adopted data");
    assert!(copy.store().get_latest(b"key170").is_some());
}

/// Measurement (docs/performance.md, "Catching up after a restart"): a backup of a primary
/// holding `RAMPKV_CATCH_UP_KEYS` keys (default 100,000, 100-byte values) restarts having
/// missed `RAMPKV_CATCH_UP_MISSED` writes (default 20,000); the time to load its copy from disk
/// and to get in sync with a delta, against a fresh backup's snapshot catch-up. Run with
/// `cargo test --release -p rampkv-net catch_up_size_and_time -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a test"]
fn catch_up_size_and_time_delta_against_snapshot() {
    let number =
        |name: &str, default: u64| std::env::var(name).ok().and_then(|text| text.parse().ok()).unwrap_or(default);
    let (keys, missed) = (number("RAMPKV_CATCH_UP_KEYS", 100_000), number("RAMPKV_CATCH_UP_MISSED", 20_000));
    let root = tempfile::tempdir().unwrap();
    let start = |restore: bool, persistent: bool| {
        let config = DurabilityConfig { policy: rampkv_durable::FsyncPolicy::Everysec, ..DurabilityConfig::default() };
        let root = root.path().join(super::super::durable::COPIES_DIR);
        let persistence = persistent.then_some(CopyPersistence { root, config, restore, resume_current: false });
        BackupService::start_durable(TcpListener::bind("127.0.0.1:0").unwrap(), 60_000, None, persistence).unwrap()
    };
    let core = Arc::new(ServerCore::new(60_000));
    let backup = start(false, true);
    let stream =
        StreamStart { backlog_bytes: rampkv_core::limits::REPLICATION_BACKLOG_BYTES, ..StreamStart::default() };
    let backups = vec![(1, backup.address().to_string(), rampkv_config::configuration::BOOTSTRAP_INCARNATION)];
    let replicator =
        Replicator::start_with(0, 3, backups, None, ReplicationMedium::OneSided, stream, Some(Arc::clone(&core)))
            .unwrap();
    let value = vec![b'v'; 100];
    let write = |index: u64| {
        let ts = (index + 1) << 20;
        let key = Key::from(format!("key{:07}", index % keys).into_bytes());
        core.store().put(ts, vec![(key.clone(), Box::from(value.as_slice()))], 0).unwrap();
        let mut effects = Effects::default();
        effects
            .logged
            .push(rampkv_core::protocol::server::LogRecord::put(ts, vec![(key, Box::from(value.as_slice()))]));
        replicator.append(&mut effects);
        effects.release_after.unwrap()
    };
    let wait = |done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(600);
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(done());
    };
    let last = (0..keys).fold(LogPosition(0), |_, index| write(index));
    wait(&|| replicator.acknowledged() >= last);
    drop(backup);
    replicator.retain_backups(&[]);
    (keys..keys + missed).for_each(|index| {
        write(index);
    });
    let versions = core.store().stats().versions;
    let started = Instant::now();
    let restarted = start(true, true);
    let loaded_ms = started.elapsed().as_millis();
    let started = Instant::now();
    replicator.add_catch_up(1, restarted.address().to_string(), 7).unwrap();
    wait(&|| replicator.in_sync(1, 7, 3));
    let delta_ms = started.elapsed().as_millis();
    let delta = replicator.stats();
    drop(restarted);
    replicator.retain_backups(&[]);
    let fresh = start(false, false);
    let started = Instant::now();
    replicator.add_catch_up(1, fresh.address().to_string(), 8).unwrap();
    wait(&|| replicator.in_sync(1, 8, 3));
    let snapshot_ms = started.elapsed().as_millis();
    let snapshot = replicator.stats();
    println!(
        "{keys} keys, {versions} versions in the primary's store, {missed} writes missed: restart loaded its copy \
         from disk in {loaded_ms} ms, then a delta of {} records in sync in {delta_ms} ms; a fresh backup's \
         snapshot of {} versions in sync in {snapshot_ms} ms",
        delta.catch_up_delta_records, snapshot.catch_up_snapshot_versions
    );
}

/// A backup whose log region cannot be mapped (described as another host's without RDMA: the
/// primary's fabric gives `NoMedium`), and one that cannot map the primary's region, get the
/// stream over TCP, agreed in the log region handshake; the other backup keeps its log region.
/// Over TCP a call is released only once that backup applied it, so the copy holds every
/// released record at the moment it is released; both copies end up with every record.
#[test]
fn a_backup_whose_log_region_cannot_be_mapped_gets_the_stream_over_tcp_and_holds_every_record() {
    use super::log_region::{ForeignSide, FOREIGN_REGIONS};
    for side in [ForeignSide::Backup, ForeignSide::Primary] {
        let (foreign, local) = (service(), service());
        FOREIGN_REGIONS.lock().unwrap().push((foreign.address(), side));
        let backups = vec![(1, foreign.address().to_string()), (2, local.address().to_string())];
        let replicator = Replicator::start(0, 1, backups, None, ReplicationMedium::OneSided).unwrap();
        let write = |index: u64| {
            let mut effects = Effects::default();
            let key = format!("key{index}");
            effects.logged.push(rampkv_core::protocol::server::LogRecord::put(
                (index + 1) << 20,
                vec![(Key::from(key.as_bytes()), Box::from(key.as_bytes()))],
            ));
            replicator.append(&mut effects);
            effects.release_after.expect("a record was appended")
        };
        let released = |position: LogPosition| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while replicator.acknowledged() < position && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(replicator.acknowledged() >= position, "{side:?}: {position:?} released");
        };
        // Call by call: released means applied by the backup reached over TCP.
        for index in 0..20 {
            let position = write(index);
            released(position);
            let applied = foreign.copy_of(0).map_or(0, |copy| copy.applied());
            assert!(applied >= position.0, "{side:?}: record {} released, {applied} applied", position.0);
        }
        let media: Vec<(usize, bool)> =
            replicator.shared.links.read().iter().map(|link| (link.backup, link.one_sided())).collect();
        assert_eq!(media, vec![(1, false), (2, true)], "{side:?}: TCP for the foreign backup only");
        // Then a burst, released at once.
        let last = (20..300).fold(LogPosition(0), |_, index| write(index));
        released(last);
        let copy = foreign.copy_of(0).expect("the TCP backup's copy");
        assert!(copy.applied() >= last.0, "{side:?}: every released record applied: {}", copy.applied());
        let other = local.copy_of(0).expect("the one-sided backup's copy");
        let deadline = Instant::now() + Duration::from_secs(10);
        while other.applied() < last.0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        for index in 0..300 {
            let key = format!("key{index}");
            assert!(copy.store().get_latest(key.as_bytes()).is_some(), "{side:?}: {key} on the TCP backup");
            assert!(other.store().get_latest(key.as_bytes()).is_some(), "{side:?}: {key} on the one-sided backup");
        }
        assert!(replicator.failure().is_none(), "{side:?}: no link failed: {:?}", replicator.failure());
        let stats = replicator.stats();
        assert_eq!(stats.links_failed, 0, "{side:?}: {stats:?}");
        FOREIGN_REGIONS.lock().unwrap().retain(|(address, _)| *address != foreign.address());
    }
}
