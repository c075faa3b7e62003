//! The configuration service's port proves the cluster's shared secret as the data ports do
//! (docs/security.md, "Configuration-service port"): nodes and configuration clients without
//! it, or with another one, are refused with a clear error and cannot reach the Raft group;
//! handshakes are bounded in number and in time. Nodes run in this process, each with its own
//! secret, through the authenticator servers use (`ConfigPortAuth`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv::auth::{ConfigPortAuth, SharedSecret};
use rampkv::config::auth::PortAuthenticator;
use rampkv::config::client::ask;
use rampkv::config::configuration::{Configuration, ServerId, BOOTSTRAP_INCARNATION};
use rampkv::config::core::StartMode;
use rampkv::config::error::{ConfigError, RefusalReason};
use rampkv::config::limits::{CONFIG_HANDSHAKES_MAX, CONFIG_HANDSHAKE_TIMEOUT_MS, CONFIG_LOG_ENTRIES_KEPT_MAX};
use rampkv::config::node::{ConfigNode, NodeSettings};
use rampkv::config::timing::{Clock, MonotonicClock, Timing};
use rampkv::config::wire::{encode_frame, read_frame, Heartbeat, Message};
use rampkv::wire::{AuthFrame, AUTH_BYTES, FRAME_HEADER_BYTES};

/// Far above what an election or a failover takes (hundreds of ms): the suite shares 2 cores.
const STALL_TIMEOUT: Duration = Duration::from_secs(20);

fn authenticator(byte: u8) -> Arc<dyn PortAuthenticator> {
    Arc::new(ConfigPortAuth(Arc::new(SharedSecret::from_bytes(vec![byte; 32]).unwrap())))
}

/// Nodes of one cluster (6 partitions, 2 replicas when it can), node i proving `secrets[i]`'s secret
/// (`None`: none).
fn start(secrets: &[Option<u8>]) -> (Configuration, Vec<ConfigNode>) {
    let listeners: Vec<TcpListener> = secrets.iter().map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addresses = listeners
        .iter()
        .enumerate()
        .map(|(i, listener)| (format!("127.0.0.1:{}", 1 + i), listener.local_addr().unwrap().to_string()))
        .collect();
    let owners = (0..6).map(|p| (p % secrets.len()) as ServerId).collect();
    let initial = Configuration::placed(addresses, owners, secrets.len().min(2) as u32).unwrap();
    let clock = Arc::new(MonotonicClock::new());
    let nodes = listeners
        .into_iter()
        .zip(secrets)
        .enumerate()
        .map(|(me, (listener, secret))| {
            ConfigNode::start(NodeSettings {
                me: me as ServerId,
                initial: initial.clone(),
                mode: StartMode::Bootstrap,
                incarnation: BOOTSTRAP_INCARNATION,
                timing: Timing::default(),
                clock: Arc::clone(&clock) as Arc<dyn Clock>,
                listener: Some(listener),
                log_entries_kept: CONFIG_LOG_ENTRIES_KEPT_MAX,
                authenticator: secret.map(authenticator),
                state_dir: None,
            })
            .unwrap()
        })
        .collect();
    (initial, nodes)
}

/// Sends `frames` on a fresh connection to `address` without authenticating; what comes back
/// before the node closes it.
fn unauthenticated(address: &str, frames: &[Message]) -> Vec<u8> {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(STALL_TIMEOUT)).unwrap();
    for frame in frames {
        let _ = stream.write_all(&encode_frame(frame));
    }
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    reply
}

#[test]
fn the_configuration_port_serves_only_nodes_and_clients_that_prove_the_secret() {
    // Server 2 has another secret: the others refuse it, it refuses them.
    let (initial, nodes) = start(&[Some(1), Some(1), Some(2)]);
    let cluster_id = initial.cluster_id();
    let address = |server: usize| nodes[server].address().to_string();
    // Servers 0 and 1 are a majority: they elect a leader between them and, once the start-up
    // grace is over, fail server 2's partitions over, since no heartbeat of it gets through.
    let failed_over = nodes[0].wait_for_epoch(2, STALL_TIMEOUT).expect("server 2's partitions not failed over");
    for partition in 0..6 {
        assert_ne!(failed_over.primary_of(partition), Some(2), "partition {partition}: {failed_over:?}");
    }
    let leader = nodes[0].leader().expect("servers 0 and 1 have a leader");
    assert!(leader < 2 && nodes[1].leader() == Some(leader));
    // Server 2 never heard of them: no leader, its first configuration, no lease.
    assert_eq!(nodes[2].leader(), None);
    assert_eq!(nodes[2].configuration().epoch(), 1);
    assert!((0..6).all(|partition| !nodes[2].lease_valid(partition)));

    // Configuration clients: with the secret, served; without one, refused by name; with
    // another, refused for the wrong proof. Each error says what to do.
    let timeout = Duration::from_secs(5);
    let served = ask(&address(0), cluster_id, timeout, Some(&*authenticator(1))).unwrap();
    assert!(served.configuration.epoch() >= 2);
    let error = ask(&address(0), cluster_id, timeout, None).unwrap_err();
    assert!(matches!(error, ConfigError::Refused { reason: RefusalReason::AuthenticationRequired, .. }), "{error}");
    assert!(error.to_string().contains("authentication required") && error.to_string().contains("--secret-file"));
    let error = ask(&address(0), cluster_id, timeout, Some(&*authenticator(2))).unwrap_err();
    assert!(matches!(error, ConfigError::Authentication { .. }), "{error}");
    assert!(error.to_string().contains("wrong proof"), "{error}");

    // Forged frames without the secret: a hello in server 2's name followed by heartbeats that
    // would renew its lease, and a configuration request. Refused at the first frame, nothing
    // else read: server 2 stays failed over, nothing of the configuration leaks.
    let heartbeat = Heartbeat { from: 2, incarnation: BOOTSTRAP_INCARNATION, known_epoch: 2, sent_at_ns: 1 };
    let forged = [Message::Hello { cluster_id, from: 2 }, Message::Heartbeat(heartbeat), Message::Heartbeat(heartbeat)];
    for frames in [&forged[..], &[Message::ConfigRequest { cluster_id, known_epoch: 0 }][..]] {
        let reply = unauthenticated(&address(usize::from(leader)), frames);
        let answer = read_frame(&mut reply.as_slice(), "test").unwrap();
        assert!(
            matches!(answer, Some(Message::Refused { reason: RefusalReason::AuthenticationRequired, .. })),
            "{answer:?}"
        );
        assert_eq!(reply.len(), encode_frame(answer.as_ref().unwrap()).len(), "one refusal, nothing more");
    }
    let now = nodes[0].configuration();
    assert!((0..6).all(|partition| now.primary_of(partition) != Some(2)), "{now:?}");

    // A node's client that proves a secret to a node without one is told so.
    let (open_initial, open_nodes) = start(&[None]);
    let error = ask(&open_nodes[0].address().to_string(), open_initial.cluster_id(), timeout, Some(&*authenticator(1)))
        .unwrap_err();
    assert!(error.to_string().contains("no shared secret"), "{error}");
}

#[test]
fn configuration_port_handshakes_are_bounded_in_number_and_in_time() {
    let (initial, nodes) = start(&[Some(1)]);
    let address = nodes[0].address().to_string();
    // Silent connections beyond the bound close the oldest handshakes, at once.
    let extra = 8;
    let silent: Vec<TcpStream> = (0..CONFIG_HANDSHAKES_MAX + extra)
        .map(|_| {
            let stream = TcpStream::connect(&address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            stream
        })
        .collect();
    let started = Instant::now();
    let closed = |mut stream: &TcpStream| matches!(stream.read(&mut [0u8; 1]), Ok(0) | Err(_));
    for (index, stream) in silent.iter().take(extra).enumerate() {
        assert!(closed(stream), "silent connection {index} of the oldest was not closed");
    }
    // ... so an honest client gets through while they are held.
    let answer = ask(&address, initial.cluster_id(), Duration::from_secs(5), Some(&*authenticator(1))).unwrap();
    assert_eq!(answer.configuration.cluster_id(), initial.cluster_id());
    println!("{extra} oldest of {} silent handshakes closed in {:?}", silent.len(), started.elapsed());
    drop(silent);

    // A step trickled a byte at a time (each byte well within any per-read timeout) is closed
    // at the handshake deadline, not kept open by the trickle.
    let mut trickle = TcpStream::connect(&address).unwrap();
    let mut begin = Vec::new();
    AuthFrame::Begin { nonce: [7; AUTH_BYTES] }.encode_frame(0, &mut begin);
    assert_eq!(begin.len(), FRAME_HEADER_BYTES + AUTH_BYTES);
    let started = Instant::now();
    let mut sent = 0;
    while sent < begin.len() && trickle.write_all(&begin[sent..=sent]).is_ok() {
        sent += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    let took = started.elapsed();
    let deadline = Duration::from_millis(CONFIG_HANDSHAKE_TIMEOUT_MS);
    assert!(sent < begin.len(), "the node waited for all {} trickled bytes ({took:?})", begin.len());
    assert!(took >= deadline - Duration::from_millis(500), "closed after {took:?}, before the deadline");
    println!("a trickled handshake was closed after {sent} bytes, {took:?}");
}
