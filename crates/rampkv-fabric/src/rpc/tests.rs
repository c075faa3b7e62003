//! RF-RPC over the in-process fabric with a real server thread: round trips in both modes, the
//! hybrid switch and its reversal under controlled server delays, batching under mixed sizes,
//! the timeout split, and the automatic batch size.

use super::*;
use crate::fabric::{Access, Fabric};
use crate::memory::{MemoryFabric, MemoryLocalRegion};
use crate::ring::Doorbell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Client = RpcClient<Arc<MemoryFabric>, Arc<MemoryLocalRegion>>;

/// What the server saw of one request: (aux, entries, packed entry bytes).
type Seen = Arc<Mutex<Vec<(u16, usize, usize)>>>;

struct TestServer {
    stop: Arc<AtomicBool>,
    delay_ns: Arc<AtomicU64>,
    seen: Seen,
    thread: Option<JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

/// The reply to an entry: its bytes reversed, then its length as one byte (so that the reply
/// size differs from the request's and every entry's reply is checkable).
fn answer(entry: &[u8]) -> Vec<u8> {
    let mut reply: Vec<u8> = entry.iter().rev().copied().collect();
    reply.push(entry.len() as u8);
    reply
}

fn connect(config: RpcConfig, ring_bytes: usize, slot_bytes: usize) -> (Client, TestServer) {
    let fabric = Arc::new(MemoryFabric::new());
    let dedicated = RpcLayout::dedicated(ring_bytes, slot_bytes);
    let server_region = Arc::new(fabric.register("server", dedicated.server_region_bytes, Access::ReadWrite).unwrap());
    let client_region = Arc::new(fabric.register("client", dedicated.client_region_bytes, Access::ReadWrite).unwrap());
    let server_remote = fabric.map(&fabric.describe(&server_region)).unwrap();
    let client_remote = fabric.map(&fabric.describe(&client_region)).unwrap();
    let client =
        RpcClient::new(Arc::clone(&fabric), server_remote, Arc::clone(&client_region), dedicated.layout, config)
            .unwrap();
    let mut endpoint = RpcServerEndpoint::new(
        Arc::clone(&fabric),
        Arc::clone(&server_region),
        client_remote,
        dedicated.layout,
        Duration::from_secs(5),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let delay_ns = Arc::new(AtomicU64::new(0));
    let seen: Seen = Arc::default();
    let (thread_stop, thread_delay, thread_seen) = (Arc::clone(&stop), Arc::clone(&delay_ns), Arc::clone(&seen));
    let thread = std::thread::spawn(move || {
        let doorbell = Doorbell::new(Arc::clone(&server_region), 0).unwrap();
        let mut replies = EntryList::new();
        while !thread_stop.load(Ordering::Relaxed) {
            let _ = doorbell.wait_until(|| endpoint.has_pending(), Duration::from_millis(5));
            let Some(request) = endpoint.server_recv().unwrap() else { continue };
            thread_seen.lock().unwrap().push((request.aux, request.entries.len(), request.entries.bytes_len()));
            replies.clear();
            for entry in request.entries.iter() {
                replies.push(&answer(entry));
            }
            // Delays of a millisecond or more sleep, so that a slow server does not take a core
            // from the other tests' threads; shorter ones spin.
            let delay = Duration::from_nanos(thread_delay.load(Ordering::Relaxed));
            let started = std::time::Instant::now();
            if delay >= Duration::from_millis(1) {
                std::thread::sleep(delay);
            }
            while started.elapsed() < delay {
                std::hint::spin_loop();
            }
            endpoint.server_send(&replies).unwrap();
        }
    });
    (client, TestServer { stop, delay_ns, seen, thread: Some(thread) })
}

fn single(entry: &[u8]) -> EntryList {
    let mut list = EntryList::new();
    list.push(entry);
    list
}

#[test]
fn fetch_mode_round_trips_small_and_large_replies() {
    let config = RpcConfig { fetch_bytes: 64, hybrid: false, ..RpcConfig::default() };
    let (mut client, _server) = connect(config, 4096, 1024);
    for size in [0usize, 1, 7, 8, 40, 41, 100, 500] {
        let request: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let reply = client.call(&single(&request), 0).unwrap();
        assert_eq!(reply.mode, ReplyMode::Fetch);
        assert_eq!(reply.entries.iter().collect::<Vec<_>>(), vec![&answer(&request)[..]]);
    }
    let stats = client.stats();
    assert_eq!((stats.calls, stats.pushed_calls), (8, 0));
    // Replies of 101 and 501 bytes (with header and trailer above 64) need the second read.
    assert!(stats.second_reads >= 2, "{stats:?}");
    assert!(matches!(client.client_recv(), Err(RpcError::Protocol { .. })));
}

#[test]
fn push_mode_round_trips_and_misuse_is_refused() {
    let config = RpcConfig { hybrid: false, initial_mode: ReplyMode::Push, ..RpcConfig::default() };
    let (mut client, _server) = connect(config, 4096, 1024);
    for round in 0..50u32 {
        let request = round.to_le_bytes();
        let reply = client.call(&single(&request), 0).unwrap();
        assert_eq!(reply.mode, ReplyMode::Push);
        assert_eq!(reply.entries.iter().next().unwrap(), &answer(&request)[..]);
    }
    assert_eq!(client.stats().pushed_calls, 50);
    assert_eq!(client.stats().slot_reads, 0);
    assert!(matches!(client.call(&EntryList::new(), 0), Err(RpcError::Protocol { .. })));
    client.client_send(&single(b"x"), 0).unwrap();
    assert!(matches!(client.client_send(&single(b"y"), 0), Err(RpcError::Protocol { .. })));
    assert_eq!(client.client_recv().unwrap().entries.iter().next().unwrap(), &answer(b"x")[..]);
}

/// Server delays are set per phase: 30 ms is far beyond R = 5 fetches 100 us apart, and 0 is
/// far below. On a loaded machine the scheduler can still make a fast call slow (or, by descheduling
/// the client for the whole delay, a slow call fast), so each step checks the rule against the
/// failed-fetch counts the calls report, and repeats until the intended case happened.
#[test]
fn hybrid_switches_to_push_after_two_slow_calls_and_back_when_the_server_is_fast() {
    let config = RpcConfig { fetch_interval: Duration::from_micros(100), ..RpcConfig::default() };
    let (mut client, server) = connect(config, 4096, 1024);
    let slow = Duration::from_millis(30).as_nanos() as u64;
    let is_slow = |failed: u32| failed >= config.fetch_retries;
    let call = |client: &mut Client, delay_ns: u64| {
        server.delay_ns.store(delay_ns, Ordering::Relaxed);
        let reply = client.call(&single(b"call"), 0).unwrap();
        assert_eq!(reply.entries.iter().next().unwrap(), &answer(b"call")[..]);
        (reply.mode, reply.failed_fetches, reply.server_time)
    };
    // One slow call, then a fast one: no switch.
    let mut checked_single = false;
    for _ in 0..20 {
        while client.mode() != ReplyMode::Fetch {
            call(&mut client, 0);
        }
        let switches = client.stats().switches_to_push;
        let (_, slow_failed, _) = call(&mut client, slow);
        let (_, fast_failed, _) = call(&mut client, 0);
        if is_slow(slow_failed) && !is_slow(fast_failed) {
            assert_eq!(client.mode(), ReplyMode::Fetch);
            assert_eq!(client.stats().switches_to_push, switches);
            checked_single = true;
            break;
        }
    }
    assert!(checked_single, "no slow-then-fast pair in 20 tries");
    // Two consecutive slow calls from fetch mode (after a fast one): switch to push.
    let mut checked_pair = false;
    for _ in 0..20 {
        while client.mode() != ReplyMode::Fetch {
            call(&mut client, 0);
        }
        if is_slow(call(&mut client, 0).1) {
            continue;
        }
        let switches = client.stats().switches_to_push;
        let first = call(&mut client, slow);
        if !is_slow(first.1) {
            continue;
        }
        assert_eq!(client.mode(), ReplyMode::Fetch, "one slow call must not switch");
        let second = call(&mut client, slow);
        assert_eq!((first.0, second.0), (ReplyMode::Fetch, ReplyMode::Fetch));
        if is_slow(second.1) {
            assert_eq!(client.mode(), ReplyMode::Push);
            assert_eq!(client.stats().switches_to_push, switches + 1);
            checked_pair = true;
            break;
        }
    }
    assert!(checked_pair, "no two consecutive slow calls in 20 tries");
    server.delay_ns.store(slow, Ordering::Relaxed);
    // While the server stays slow, replies are pushed and report its time: no switch back.
    for _ in 0..3 {
        let reply = client.call(&single(b"slow3"), 0).unwrap();
        assert_eq!(reply.mode, ReplyMode::Push);
        // 30 ms saturates the 16-bit field (6.5535 ms).
        assert!(reply.server_time >= Duration::from_micros(6_500), "{:?}", reply.server_time);
        assert_eq!(client.mode(), ReplyMode::Push);
    }
    // The server gets fast: the first pushed reply reporting <= 2 us switches back.
    server.delay_ns.store(0, Ordering::Relaxed);
    let switches_back = client.stats().switches_to_fetch;
    let mut reverted = false;
    for _ in 0..100 {
        let reply = client.call(&single(b"fast"), 0).unwrap();
        assert_eq!(reply.mode, ReplyMode::Push);
        if reply.server_time <= config.push_back_below {
            reverted = true;
            break;
        }
    }
    assert!(reverted, "no fast pushed reply in 100 calls");
    assert_eq!(client.mode(), ReplyMode::Fetch);
    assert_eq!(client.stats().switches_to_fetch, switches_back + 1);
    let reply = client.call(&single(b"after"), 0).unwrap();
    assert_eq!(reply.mode, ReplyMode::Fetch);
    assert_eq!(reply.entries.iter().next().unwrap(), &answer(b"after")[..]);
}

/// Seeded xorshift; the seed is printed and `RAMPKV_RPC_SEED` replays one.
fn seed() -> u64 {
    let seed = std::env::var("RAMPKV_RPC_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (replay: RAMPKV_RPC_SEED={seed})");
    seed | 1
}

fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn batches_of_mixed_sizes_arrive_whole_and_large_entries_go_alone() {
    let (client, server) = connect(RpcConfig::default(), 8192, 4096);
    let config =
        BatchConfig { bytes_max: 256, alone_above_bytes: 64, timeout: Duration::from_secs(10), size: 8, auto: None };
    let mut batcher = Batcher::new(client, config).unwrap();
    let mut state = seed();
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut completed: Vec<(u64, Vec<u8>, usize, FlushReason)> = Vec::new();
    let mut on_reply = |completion: Completion<'_>| {
        completed.push((completion.tag, completion.reply.to_vec(), completion.batch_entries, completion.reason));
    };
    // Random sizes, then fixed runs that surely hit each rule: 16 tiny entries reach the size
    // (8); eight of 60 bytes the byte limit (4 * 64 = 256 fit; whatever tiny entries are still
    // buffered, at most one size flush comes first and five more follow); one of 100 bytes the
    // alone limit.
    let fixed = [[1usize; 16].as_slice(), &[60; 8], &[100]].concat();
    for step in 0..500usize {
        let size = match (fixed.get(step.wrapping_sub(500 - fixed.len())), next(&mut state) % 10) {
            (Some(&size), _) => size,
            (None, 0) => 65 + (next(&mut state) % 200) as usize, // above the alone limit
            (None, 1..=3) => (next(&mut state) % 65) as usize,   // up to the limit
            (None, _) => (next(&mut state) % 16) as usize,       // small
        };
        let entry: Vec<u8> = (0..size).map(|_| next(&mut state) as u8).collect();
        let tag = batcher.enqueue(&entry, &mut on_reply).unwrap();
        assert_eq!(tag as usize, sent.len());
        sent.push(entry);
    }
    batcher.flush(&mut on_reply).unwrap();
    assert_eq!(completed.len(), sent.len());
    for (index, (tag, reply, batch_entries, reason)) in completed.iter().enumerate() {
        assert_eq!(*tag as usize, index, "replies come back in order, each once");
        assert_eq!(reply, &answer(&sent[index]));
        if sent[index].len() > 64 {
            assert_eq!((*batch_entries, *reason), (1, FlushReason::Alone));
        }
    }
    let stats = batcher.stats().clone();
    assert_eq!(stats.entries, 500);
    assert!(stats.count(FlushReason::Alone) > 0 && stats.count(FlushReason::Size) > 0);
    assert!(stats.count(FlushReason::Bytes) > 0, "{stats:?}");
    assert_eq!(stats.count(FlushReason::Timeout), 0);
    assert!(stats.size_histogram[9..].iter().all(|&count| count == 0), "never more than 8 entries");
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len() as u64, stats.batches);
    assert!(seen.iter().all(|&(aux, entries, bytes)| aux == 8 && entries <= 8 && (bytes <= 256 || entries == 1)));
    println!("batches {} mean entries {:.2} by reason {:?}", stats.batches, stats.mean_entries(), stats.by_reason);
}

#[test]
fn a_batch_is_split_by_the_timeout() {
    let (client, _server) = connect(RpcConfig::default(), 8192, 4096);
    let config = BatchConfig { timeout: Duration::from_millis(20), size: 100, ..BatchConfig::default() };
    let mut batcher = Batcher::new(client, config).unwrap();
    let completed: std::cell::RefCell<Vec<(u64, usize, FlushReason)>> = Default::default();
    let mut on_reply = |completion: Completion<'_>| {
        completed.borrow_mut().push((completion.tag, completion.batch_entries, completion.reason));
    };
    for entry in [&b"a"[..], b"bb", b"ccc"] {
        batcher.enqueue(entry, &mut on_reply).unwrap();
    }
    assert!(!batcher.flush_if_due(&mut on_reply).unwrap(), "not due yet");
    std::thread::sleep(Duration::from_millis(30));
    // The next entry finds the buffered three past the timeout: they go first, alone together.
    batcher.enqueue(b"dddd", &mut on_reply).unwrap();
    assert_eq!(
        *completed.borrow(),
        vec![(0, 3, FlushReason::Timeout), (1, 3, FlushReason::Timeout), (2, 3, FlushReason::Timeout)]
    );
    assert_eq!(batcher.buffered(), 1);
    std::thread::sleep(Duration::from_millis(30));
    assert!(batcher.flush_if_due(&mut on_reply).unwrap());
    assert_eq!(completed.borrow()[3], (3, 1, FlushReason::Timeout));
    assert_eq!(batcher.stats().count(FlushReason::Timeout), 2);
}

#[test]
fn auto_batch_size_grows_under_a_loose_limit_and_shrinks_under_a_tight_one() {
    let (client, server) = connect(RpcConfig::default(), 8192, 4096);
    let auto = AutoBatchConfig { window_samples: 16, size_max: 12, ..AutoBatchConfig::new(Duration::from_secs(10)) };
    let config = BatchConfig { size: 2, auto: Some(auto), timeout: Duration::from_secs(10), ..BatchConfig::default() };
    let mut batcher = Batcher::new(client, config).unwrap();
    let mut replies = 0usize;
    let mut on_reply = |_: Completion<'_>| replies += 1;
    for round in 0..600u32 {
        batcher.enqueue(&round.to_le_bytes(), &mut on_reply).unwrap();
    }
    assert_eq!(batcher.size(), 12, "every latency is under 10 s: the size grows to its maximum");
    let trace = batcher.stats().size_trace.clone();
    assert!(trace.windows(2).all(|pair| pair[1] >= pair[0]) && trace[0] == 2, "{trace:?}");
    // The server saw the growing size in the aux field.
    let seen: Vec<u16> = server.seen.lock().unwrap().iter().map(|&(aux, _, _)| aux).collect();
    assert!(seen.first() == Some(&2) && seen.last() == Some(&12), "{seen:?}");
    batcher.flush(&mut on_reply).unwrap();
    assert_eq!(replies, 600);

    // A limit nobody meets (server delay 200 us, limit 1 ns) shrinks the size to 1.
    let (client, server) = connect(RpcConfig::default(), 8192, 4096);
    server.delay_ns.store(200_000, Ordering::Relaxed);
    let auto = AutoBatchConfig { window_samples: 8, ..AutoBatchConfig::new(Duration::from_nanos(1)) };
    let config = BatchConfig { size: 6, auto: Some(auto), timeout: Duration::from_secs(10), ..BatchConfig::default() };
    let mut batcher = Batcher::new(client, config).unwrap();
    for round in 0..80u32 {
        batcher.enqueue(&round.to_le_bytes(), &mut |_| {}).unwrap();
    }
    let trace = &batcher.stats().size_trace;
    assert_eq!(batcher.size(), 1, "{trace:?}");
    assert!(trace.windows(2).all(|pair| pair[1] <= pair[0]), "{trace:?}");
}

#[test]
fn batcher_refuses_contradictory_limits() {
    let (client, _server) = connect(RpcConfig::default(), 1024, 1024);
    // Ring of 1024: messages up to 496 bytes, entries up to 472 (a multiple of 8, so that the
    // padded entries fit).
    assert_eq!(client.request_entries_bytes_max(), 472);
    let mut client = client;
    let mut largest = EntryList::new();
    largest.push(&[7; 468]);
    assert_eq!(client.call(&largest, 0).unwrap().entries.iter().next().unwrap(), &answer(&[7; 468])[..]);
    let mut above = EntryList::new();
    above.push(&[7; 469]);
    assert!(matches!(client.client_send(&above, 0), Err(RpcError::TooLarge { bytes: 473, bytes_max: 472 })));
    let too_big = BatchConfig { bytes_max: 2048, ..BatchConfig::default() };
    assert!(matches!(Batcher::new(client, too_big), Err(RpcError::InvalidLayout { .. })));
}

/// One thread, two connections: `try_client_recv` lets the fast one's replies through while
/// the slow one's call (50 ms) is outstanding, in fetch and in push mode.
#[test]
fn one_thread_multiplexes_connections_without_blocking() {
    for mode in [ReplyMode::Fetch, ReplyMode::Push] {
        let config = RpcConfig { hybrid: false, initial_mode: mode, ..RpcConfig::default() };
        let (mut slow, slow_server) = connect(config, 4096, 1024);
        let (mut fast, _fast_server) = connect(config, 4096, 1024);
        slow_server.delay_ns.store(Duration::from_millis(50).as_nanos() as u64, Ordering::Relaxed);
        assert!(matches!(slow.try_client_recv(), Err(RpcError::Protocol { .. })));
        slow.client_send(&single(b"slow"), 0).unwrap();
        let mut fast_replies = 0;
        let slow_reply = loop {
            if !fast.has_outstanding() {
                fast.client_send(&single(b"fast"), 0).unwrap();
            }
            if let Some(reply) = fast.try_client_recv().unwrap() {
                assert_eq!(reply.entries.iter().next().unwrap(), &answer(b"fast")[..]);
                assert_eq!(reply.mode, mode);
                fast_replies += 1;
            }
            if let Some(reply) = slow.try_client_recv().unwrap() {
                break reply.entries.iter().next().unwrap().to_vec();
            }
            std::hint::spin_loop();
        };
        assert_eq!(slow_reply, answer(b"slow"));
        assert!(!slow.has_outstanding());
        assert!(fast_replies >= 1, "{mode:?}: no fast reply during a 50 ms call");
        println!("{mode:?}: {fast_replies} fast replies during the slow call");
        if mode == ReplyMode::Fetch {
            assert!(slow.stats().failed_fetches > 0);
        }
    }
}

/// Stream replies (any entry count) and unsolicited pushes, step by step in one thread: the
/// rampkv transport's use (a request whose reply is deferred gets none now, and the reply comes
/// later outside any call).
#[test]
fn stream_replies_and_unsolicited_pushes() {
    let fabric = Arc::new(MemoryFabric::new());
    let dedicated = RpcLayout::dedicated(1024, 1024);
    let server_region = Arc::new(fabric.register("s", dedicated.server_region_bytes, Access::ReadWrite).unwrap());
    let client_region = Arc::new(fabric.register("c", dedicated.client_region_bytes, Access::ReadWrite).unwrap());
    let server_remote = fabric.map(&fabric.describe(&server_region)).unwrap();
    let client_remote = fabric.map(&fabric.describe(&client_region)).unwrap();
    let config = RpcConfig { hybrid: false, stream_replies: true, ..RpcConfig::default() };
    let mut client =
        RpcClient::new(Arc::clone(&fabric), server_remote, Arc::clone(&client_region), dedicated.layout, config)
            .unwrap();
    let mut server = RpcServerEndpoint::new(
        Arc::clone(&fabric),
        Arc::clone(&server_region),
        client_remote,
        dedicated.layout,
        Duration::from_secs(1),
    )
    .unwrap();
    let mut request = EntryList::new();
    request.push(b"now");
    request.push(b"later");
    client.client_send(&request, 0).unwrap();
    assert!(client.try_client_recv().unwrap().is_none());
    let message = server.server_recv().unwrap().unwrap();
    assert!(message.stream && message.entries.len() == 2);
    let mut replies = EntryList::new();
    replies.push(b"now done");
    server.server_send(&replies).unwrap();
    let reply = client.try_client_recv().unwrap().unwrap();
    assert_eq!(reply.entries.iter().collect::<Vec<_>>(), vec![&b"now done"[..]]);
    // Later, outside any call.
    assert!(client.try_recv_unsolicited().unwrap().is_none());
    replies.clear();
    replies.push(b"later done");
    assert!(server.try_push_unsolicited(&replies).unwrap());
    let pushed = client.try_recv_unsolicited().unwrap().unwrap();
    assert_eq!(pushed.iter().collect::<Vec<_>>(), vec![&b"later done"[..]]);
    // A call answered with no entries at all.
    client.client_send(&request, 0).unwrap();
    server.server_recv().unwrap().unwrap();
    server.server_send(&EntryList::new()).unwrap();
    assert_eq!(client.try_client_recv().unwrap().unwrap().entries.len(), 0);
    // The push ring fills up: the push is refused for now, not lost.
    replies.clear();
    replies.push(&[1; 400]);
    let mut pushed = 0;
    while server.try_push_unsolicited(&replies).unwrap() {
        pushed += 1;
        assert!(pushed <= 2, "a 1024-byte ring holds at most two 440-byte frames");
    }
    assert!(pushed >= 1);
    for _ in 0..pushed {
        assert_eq!(client.try_recv_unsolicited().unwrap().unwrap().iter().next().unwrap(), &[1; 400][..]);
    }
    assert!(client.try_recv_unsolicited().unwrap().is_none());
    assert!(server.try_push_unsolicited(&replies).unwrap(), "credit came back");
    // Unsolicited pushes are refused on connections that may push replies.
    let hybrid = RpcConfig { stream_replies: true, ..RpcConfig::default() };
    let (mut other, _server) = connect(hybrid, 1024, 1024);
    assert!(matches!(other.try_recv_unsolicited(), Err(RpcError::Protocol { .. })));
}

/// A client sleeping on its doorbell for a fetched reply (the rampkv transport's wait) is woken
/// by `server_send` when the server notifies fetchers, and only then.
#[test]
fn a_sleeping_fetcher_is_woken_by_a_notifying_server() {
    for notify in [true, false] {
        let fabric = Arc::new(MemoryFabric::new());
        let dedicated = RpcLayout::dedicated(1024, 1024);
        let server_region = Arc::new(fabric.register("s", dedicated.server_region_bytes, Access::ReadWrite).unwrap());
        let client_region = Arc::new(fabric.register("c", dedicated.client_region_bytes, Access::ReadWrite).unwrap());
        let server_remote = fabric.map(&fabric.describe(&server_region)).unwrap();
        let client_remote = fabric.map(&fabric.describe(&client_region)).unwrap();
        let config = RpcConfig { hybrid: false, ..RpcConfig::default() };
        let layout = dedicated.layout;
        let mut client =
            RpcClient::new(Arc::clone(&fabric), server_remote, Arc::clone(&client_region), layout, config).unwrap();
        let mut server =
            RpcServerEndpoint::new(Arc::clone(&fabric), server_region, client_remote, layout, Duration::from_secs(1))
                .unwrap();
        server.set_notify_fetchers(notify);
        client.client_send(&single(b"ping"), 0).unwrap();
        assert!(!client.reply_may_be_ready());
        let server_thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50)); // the client is asleep by now
            server.server_recv().unwrap().unwrap();
            server.server_send(&single(b"pong")).unwrap();
        });
        let doorbell = Doorbell::new(Arc::clone(&client_region), 0).unwrap();
        let started = std::time::Instant::now();
        let woken = doorbell
            .wait_until(|| client.reply_may_be_ready(), Duration::from_millis(if notify { 5_000 } else { 300 }));
        server_thread.join().unwrap();
        // The wait re-checks its condition at its deadline, so it ends well either way; what
        // differs is when: at the reply (50 ms) when notified, at the deadline (300 ms) if not.
        assert!(woken.is_ok());
        if notify {
            assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        } else {
            assert!(started.elapsed() >= Duration::from_millis(300), "woken early: {:?}", started.elapsed());
        }
        assert!(client.reply_may_be_ready());
        assert_eq!(client.try_client_recv().unwrap().unwrap().entries.iter().next().unwrap(), b"pong");
        assert!(!client.reply_may_be_ready());
    }
}
