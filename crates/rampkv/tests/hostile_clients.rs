//! Hostile and faulty peers against live servers and the client driver, over TCP on loopback
//! (issue 15, phase B): forged timestamps, hostile HELLO replies.
//!
//! Each test opens with the attack as the issue found it, then shows the fix: refused with a
//! clear error, the victim keeps working.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use rampkv::client::{Client, ClientError};
use rampkv::cluster::Cluster;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::types::{wall_clock_us, CLIENT_ID_BITS};
use rampkv::wire::{ErrorCode, FrameHeader, Metadata, Request, Response, Write as WireWrite, FRAME_HEADER_BYTES};

const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

struct Fixture {
    group: ServerGroup,
    cluster: Cluster,
    address: SocketAddr,
}

fn fixture() -> Fixture {
    let group = ServerGroup::spawn(&[ServerConfig::new("127.0.0.1:0".parse().unwrap())]).unwrap();
    let address = group.addresses()[0];
    let cluster = Cluster::with_servers(vec![address.to_string()]).unwrap();
    Fixture { group, cluster, address }
}

fn raw(address: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    stream
}

fn read_frame(stream: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = FrameHeader::decode(&header).unwrap();
    let mut body = vec![0u8; header.body_length as usize];
    stream.read_exact(&mut body).unwrap();
    (header, body)
}

/// Sends `request` as one frame and returns the reply.
fn call(stream: &mut TcpStream, request: &Request) -> Response {
    let mut frame = Vec::new();
    request.encode_frame(7, &mut frame);
    stream.write_all(&frame).unwrap();
    let (header, body) = read_frame(stream);
    assert_eq!(header.request_id, 7);
    Response::decode(header.kind, &body).unwrap()
}

fn forged_write(key: &[u8]) -> Vec<WireWrite> {
    vec![WireWrite { key: key.to_vec(), value: b"forged".to_vec() }]
}

fn refusal(response: Response) -> String {
    match response {
        Response::Error { code: ErrorCode::BadRequest, message } => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Timestamps refused at the server (plan item 1)

/// "One raw PUT with timestamp u64::MAX pins the key: every later write answers OK and is never
/// visible (silent lost writes)." The server now refuses it with an error naming the timestamp,
/// how far ahead of its clock it is and the bound; nothing is stored, and the key takes the
/// next honest write.
#[test]
fn a_raw_put_at_u64_max_is_refused_and_the_key_stays_writable() {
    let fixture = fixture();
    let mut stream = raw(fixture.address);
    let message = refusal(call(&mut stream, &Request::Put { ts: u64::MAX, writes: forged_write(b"pinned") }));
    println!("{message}");
    assert!(message.contains("timestamp 18446744073709551615"), "{message}");
    assert!(message.contains("µs ahead of this server's wall clock") && message.contains("1000 ms"), "{message}");
    for ts in [0, 5 << CLIENT_ID_BITS] {
        let message = refusal(call(&mut stream, &Request::Put { ts, writes: forged_write(b"pinned") }));
        assert!(message.contains("timestamp 0") || message.contains("client id 0"), "{message}");
    }
    assert_eq!(fixture.group.cores()[0].store().stats().versions, 0, "nothing was stored");

    let mut client = Client::connect(&fixture.cluster).unwrap();
    let ts = client.put_all(vec![(b"pinned".to_vec(), b"mine".to_vec())]).unwrap();
    let read = client.get_all(vec![b"pinned".to_vec()]).unwrap();
    assert_eq!((read.items[0].ts, &read.items[0].value[..]), (ts, &b"mine"[..]));
    // The refused connection is still served (a refusal is a reply, not a fault).
    let honest = (wall_clock_us() << CLIENT_ID_BITS) | 9;
    assert!(matches!(call(&mut stream, &Request::Put { ts: honest, writes: forged_write(b"x") }), Response::Ack));
}

/// "A smaller future timestamp spreads through the gateway's pooled sessions (15 of 20 keys
/// written later became un-updatable)." A version an hour ahead is refused in every way it
/// could be stored (PREPARE then COMMIT, PUT, S2PL's LOCK_WRITE then COMMIT_LOCKED), so no reader
/// ever sees it and no client's clock can follow it: keys written later stay updatable.
#[test]
fn a_forged_future_timestamp_is_refused_in_every_write_path_and_does_not_spread() {
    let fixture = fixture();
    let mut stream = raw(fixture.address);
    let an_hour_us = 3_600_000_000;
    let ahead = ((wall_clock_us() + an_hour_us) << CLIENT_ID_BITS) | 1;
    let prepare = Request::Prepare {
        ts: ahead,
        metadata: Metadata::None,
        write_set: vec![b"ahead".to_vec()],
        writes: forged_write(b"ahead"),
    };
    let requests = [
        prepare,
        Request::Commit { ts: ahead },
        Request::Put { ts: ahead, writes: forged_write(b"ahead") },
        Request::LockWrite { ts: ahead, writes: forged_write(b"ahead") },
        Request::CommitLocked { ts: ahead },
    ];
    for request in requests {
        let message = refusal(call(&mut stream, &request));
        assert!(message.contains(&format!("timestamp {ahead}")), "{message}");
    }
    assert_eq!(fixture.group.cores()[0].store().stats().versions, 0, "nothing was stored");

    let (mut reader, mut other) = (Client::connect(&fixture.cluster).unwrap(), Client::connect(&fixture.cluster).unwrap());
    assert_eq!(reader.get_all(vec![b"ahead".to_vec()]).unwrap().items[0].ts, 0, "never written");
    let keys: Vec<Vec<u8>> = (0..20).map(|index| format!("key{index}").into_bytes()).collect();
    for key in &keys {
        reader.put_all(vec![(key.clone(), b"first".to_vec())]).unwrap();
        other.put_all(vec![(key.clone(), b"second".to_vec())]).unwrap();
        assert_eq!(reader.get_all(vec![key.clone()]).unwrap().items[0].value, b"second", "updatable");
    }
}

/// A server that answers HELLO with client id 0, or with a block of ids that runs past 16 bits,
/// would have given the driver's sessions a clock that cannot issue honest timestamps (id 0
/// means "never written"; an overflowed id repeats another client's). The driver refuses such
/// a reply with an error naming what it was granted.
#[test]
fn a_hostile_hello_reply_is_an_error_not_a_session() {
    for (first, granted, sessions) in [(0u16, 1u16, 1usize), (u16::MAX, 4, 4), (1, 1, 4)] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            let (header, _) = read_frame(&mut stream);
            let mut reply = Vec::new();
            Response::Hello { client_id_first: first, client_ids_granted: granted }
                .encode_frame(header.request_id, &mut reply);
            stream.write_all(&reply).unwrap();
            // Hold the connection until the client has read the reply and given up.
            let _ = stream.read(&mut [0u8; 1]);
        });
        let cluster = Cluster::with_servers(vec![address.to_string()]).unwrap();
        let transport = rampkv::transport::TcpClientTransport::connect(cluster.servers()).unwrap();
        let refused = rampkv::client::Driver::connect(transport, cluster, sessions).unwrap_err();
        assert!(
            matches!(refused, ClientError::HelloGranted { first: f, granted: g, .. } if f == first && g == granted),
            "{refused}"
        );
        println!("{refused}");
        server.join().unwrap();
    }
}
