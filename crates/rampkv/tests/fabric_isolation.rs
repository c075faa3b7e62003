//! Issue 15, items 3 and 4: isolation between the clients of a fabric front end.
//!
//! Before: every ring client mapped the server group's whole region read-write, with all 64
//! request rings, so a same-user process overwrote other clients' rings and a victim's
//! benchmark died; and a hello could name the server's own item region, which the server then
//! mapped as that client's memory. Now a client maps only its own connection's region, a hello
//! naming a region of the server's is refused, and the server maps a client's region only after
//! the client wrote a random challenge into it (which another user cannot do to a region file of
//! rampkv's user). These tests speak the control protocol raw where they play the attacker.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[allow(dead_code)] // this binary uses only the round-trip helper
mod common;

use common::{assert_closed, put_get_round_trip};
use rampkv::client::Driver;
use rampkv::cluster::{Cluster, Front};
use rampkv::item_slots::ItemSlotConfig;
use rampkv::message::control::{ControlHello, ControlReply, ControlResponse, MediumKind, Refusal, CONTROL_VERSION};
use rampkv::message::fabric::HEADER_BYTES;
use rampkv::server::front::FrontEnd;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::WritePollClientTransport;
use rampkv_fabric::{Access, Fabric, RegionDescriptor, ShmFabric, StoreOrdering, Words};

/// Two servers on one TCP group, with a ring front end (and item slots) serving the same cores.
fn cluster() -> (ServerGroup, FrontEnd, Cluster, Vec<String>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost), ServerConfig::new(localhost)]).unwrap();
    let items = ItemSlotConfig { slots: 64, slot_bytes: 1024 };
    let rings = FrontEnd::spawn(&group, Front::Ring, localhost, Some(items)).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let control = rings.control_addresses().iter().map(SocketAddr::to_string).collect();
    (group, rings, cluster, control)
}

/// A raw control connection: one JSON line each way, as the protocol says.
struct RawControl {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl RawControl {
    fn connect(address: &str) -> Self {
        let stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Self { stream, reader }
    }

    /// Sends one line (`json` is a serialized value).
    fn send(&mut self, json: Vec<u8>) {
        let mut line = json;
        line.push(b'\n');
        self.stream.write_all(&line).unwrap();
    }

    fn receive(&mut self) -> ControlReply {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("{error}: {line:?}"))
    }

    /// Sends a ring hello naming `region` with the slot at `slot_offset_bytes`.
    fn hello(address: &str, region: &RegionDescriptor, slot_offset_bytes: u64) -> (Self, ControlReply) {
        let mut control = Self::connect(address);
        let hello = ControlHello {
            version: CONTROL_VERSION,
            medium: MediumKind::Ring,
            region: region.clone(),
            slot_offset_bytes,
            nonce: None,
        };
        control.send(serde_json::to_vec(&hello).unwrap());
        let reply = control.receive();
        (control, reply)
    }
}

fn refusal(reply: ControlReply) -> Refusal {
    match reply {
        ControlReply::Refused { refusal } => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Issue 15, item 3: "Another user can take all 64 ring slots by naming the server's own items
/// region in its hello." Now naming any region of the server's (its item region, its doorbell
/// region, another connection's region) is refused with `OwnRegion`, before any challenge.
#[test]
fn a_hello_naming_one_of_the_servers_own_regions_is_refused() {
    let (_group, rings, _cluster, control) = cluster();
    let items = rings.item_slots(0).unwrap().info().region.clone();
    let (_, reply) = RawControl::hello(&control[0], &items, 0);
    assert_eq!(refusal(reply), Refusal::OwnRegion { name: items.name.clone() });

    // A connection of our own, through the whole handshake, to learn the names of a connection
    // region and of the doorbell region.
    let fabric = ShmFabric::new().unwrap();
    let own = fabric.register("isolation-test", HEADER_BYTES + 2 * (64 + (1 << 20)), Access::ReadWrite).unwrap();
    let (mut connection, reply) = RawControl::hello(&control[0], &fabric.describe(&own), HEADER_BYTES as u64);
    let ControlReply::Challenge { challenge } = reply else { panic!("expected a challenge, got {reply:?}") };
    for index in 0..4 {
        own.store(HEADER_BYTES / 8 + index, challenge.word(index), StoreOrdering::Release);
    }
    connection.send(serde_json::to_vec(&ControlResponse::default()).unwrap());
    let ControlReply::Accepted { region, doorbell, .. } = connection.receive() else { panic!("not accepted") };
    for server_region in [region, doorbell] {
        let (_, reply) = RawControl::hello(&control[1], &server_region, 0);
        assert_eq!(refusal(reply), Refusal::OwnRegion { name: server_region.name.clone() });
    }
}

/// A client that names a region it cannot write (here: it does not write the challenge, as
/// another user could not into a region file of rampkv's user) is refused with
/// `ChallengeNotWritten`, and the server writes nothing into that region.
#[test]
fn a_challenge_not_written_is_refused_and_the_named_region_is_untouched() {
    let (_group, _rings, _cluster, control) = cluster();
    let fabric = ShmFabric::new().unwrap();
    let bytes = HEADER_BYTES + 64 + (1 << 20);
    let victim = fabric.register("isolation-victim", bytes, Access::ReadWrite).unwrap();
    let pattern = |index: usize| 0x5A5A_0000_0000_0000 | index as u64;
    for index in 0..bytes / 8 {
        victim.store(index, pattern(index), StoreOrdering::Relaxed);
    }
    let (mut attacker, reply) = RawControl::hello(&control[0], &fabric.describe(&victim), HEADER_BYTES as u64);
    assert!(matches!(reply, ControlReply::Challenge { .. }), "{reply:?}");
    attacker.send(serde_json::to_vec(&ControlResponse::default()).unwrap()); // claims it wrote the challenge; it did not
    assert_eq!(refusal(attacker.receive()), Refusal::ChallengeNotWritten);
    for index in 0..bytes / 8 {
        assert_eq!(victim.load(index, rampkv_fabric::LoadOrdering::Relaxed), pattern(index), "word {index} changed");
    }
    // A response line that is not one is a bad hello, not a crash.
    let (mut garbage, _) = RawControl::hello(&control[0], &fabric.describe(&victim), HEADER_BYTES as u64);
    garbage.stream.write_all(b"{\"wrote\":\"yes\"}\n").unwrap();
    assert!(matches!(refusal(garbage.receive()), Refusal::BadHello { .. }));
}

/// Issue 15, item 4: "a same-user process overwrote [other clients' request rings] and a victim
/// writepoll bench died." Now a client reaches only its own connection's region and the shared
/// doorbell: one that writes garbage over all of that breaks only its own connection, and
/// another client of the same server keeps working.
#[test]
fn a_client_that_overwrites_all_the_memory_it_can_reach_breaks_only_its_own_connection() {
    let (_group, _rings, cluster, control) = cluster();
    let mut healthy =
        Driver::connect(WritePollClientTransport::connect(&control).unwrap(), cluster.clone(), 1).unwrap();
    put_get_round_trip(&mut healthy, 0);
    for (round, garbage) in [0xDEAD_BEEF_0BAD_F00D_u64, u64::MAX, 1].into_iter().enumerate() {
        let mut attacker = WritePollClientTransport::connect(&control).unwrap();
        attacker.channel_mut(0).unwrap().overwrite_peer_memory_for_test(garbage).unwrap();
        assert_closed(&mut attacker, &format!("garbage {garbage:#x}"));
        for repeat in 0..5 {
            put_get_round_trip(&mut healthy, 1 + round as u32 * 5 + repeat);
        }
    }
}

/// Control connections that never finish their handshake: before, the control thread ran
/// handshakes one at a time, blocking, each read waiting up to the control timeout (5 s), so 20
/// silent connections held an honest client back for 100 s (its own handshake timed out), and
/// a hello trickled a byte at a time held it back indefinitely. Now handshakes run side by side:
/// the honest client connects at once, the silent and trickling ones are closed after
/// `CONTROL_HANDSHAKE_TIMEOUT_MS`, and beyond `CONTROL_HANDSHAKES_MAX` under way a new
/// connection closes the oldest.
#[test]
fn control_connections_that_never_finish_their_handshake_hold_no_other_client_back() {
    let (_group, _rings, cluster, control) = cluster();
    let silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&control[0]).unwrap()).collect();
    let trickler = TcpStream::connect(&control[0]).unwrap();
    // The first bytes of a hello, one at a time; never the newline.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickling = {
        let mut stream = trickler.try_clone().unwrap();
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            for byte in b"{\"version\":1,\"medium\":\"ring\",\"region\":{".iter().cycle().take(400) {
                if stop.load(std::sync::atomic::Ordering::Relaxed) || stream.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The honest client connects and is served while all of them are under way.
    let transport = WritePollClientTransport::connect(&control).expect("the honest client's handshake finishes");
    let mut driver = Driver::connect(transport, cluster, 1).unwrap();
    put_get_round_trip(&mut driver, 1);
    // The others are closed once their handshake time is up (bounded wait: 20 s).
    for (index, mut stream) in silent.into_iter().chain([trickler.try_clone().unwrap()]).enumerate() {
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let read = std::io::Read::read(&mut stream, &mut [0u8; 64]);
        // Closed: the end of the stream, or a reset (a close with bytes unread); a timeout is not.
        let closed = matches!(&read, Ok(0))
            || matches!(&read, Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset);
        assert!(closed, "connection {index} was not closed within 20 s: {read:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = trickler.shutdown(std::net::Shutdown::Both);
    trickling.join().unwrap();
    // Beyond the bound of handshakes under way, a new one closes the oldest.
    let mut oldest = TcpStream::connect(&control[0]).unwrap();
    let rest: Vec<TcpStream> =
        (0..rampkv::limits::CONTROL_HANDSHAKES_MAX).map(|_| TcpStream::connect(&control[0]).unwrap()).collect();
    oldest.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert!(matches!(std::io::Read::read(&mut oldest, &mut [0u8; 64]), Ok(0)), "the oldest handshake was closed");
    let transport = WritePollClientTransport::connect(&control).expect("an honest client still gets in");
    drop(rest);
    drop(transport);
}
