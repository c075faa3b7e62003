//! Bad bytes sent to a live server: each gets an error reply or its connection closed, other
//! clients keep being served, and no stored data is lost or changed.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::limits::FRAME_BODY_BYTES_MAX;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::wire::{ErrorCode, FrameHeader, Metadata, Request, Response, Selector, WriteSet, FRAME_HEADER_BYTES};

struct Fixture {
    group: ServerGroup,
    cluster: Cluster,
    address: SocketAddr,
}

fn fixture() -> Fixture {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost)]).unwrap();
    let address = group.addresses()[0];
    let cluster = Cluster::with_servers(vec![address.to_string()]).unwrap();
    let mut client = Client::connect(&cluster).unwrap();
    client.put_all(vec![(b"kept".to_vec(), b"safe".to_vec())]).unwrap();
    Fixture { group, cluster, address }
}

fn raw(address: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
}

/// Reads replies until the server closes the connection (or the timeout fails the test).
fn read_until_closed(stream: &mut TcpStream) -> Vec<(u64, Response)> {
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("the server closes the connection");
    decode_all(&bytes)
}

fn decode_all(mut bytes: &[u8]) -> Vec<(u64, Response)> {
    let mut replies = Vec::new();
    while let Some(header) = FrameHeader::check(bytes).unwrap() {
        let body = &bytes[FRAME_HEADER_BYTES..header.frame_bytes()];
        replies.push((header.request_id, Response::decode(header.kind, body).unwrap()));
        bytes = &bytes[header.frame_bytes()..];
    }
    assert!(bytes.is_empty(), "a partial reply frame");
    replies
}

fn read_one_reply(stream: &mut TcpStream) -> (u64, Response) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let decoded = FrameHeader::decode(&header).unwrap();
    let mut body = vec![0u8; decoded.body_length as usize];
    stream.read_exact(&mut body).unwrap();
    (decoded.request_id, Response::decode(decoded.kind, &body).unwrap())
}

fn assert_bad_request(response: &Response) {
    assert!(matches!(response, Response::Error { code: ErrorCode::BadRequest, .. }), "{response:?}");
}

fn assert_still_served(fixture: &Fixture) {
    let mut client = Client::connect(&fixture.cluster).unwrap();
    let read = client.get_all(vec![b"kept".to_vec()]).unwrap();
    assert_eq!(&read.items[0].value[..], b"safe", "stored data survived");
    assert_eq!(fixture.group.cores()[0].store().stats().versions, 1, "no state changed");
}

#[test]
fn garbage_bytes_get_an_error_reply_and_the_connection_closed() {
    let fixture = fixture();
    let mut stream = raw(fixture.address);
    stream.write_all(b"GET / HTTP/1.1\r\nHost: rampkv\r\n\r\n").unwrap();
    let replies = read_until_closed(&mut stream);
    assert_eq!(replies.len(), 1);
    assert_bad_request(&replies[0].1);
    assert_still_served(&fixture);
}

#[test]
fn an_oversized_frame_is_refused_before_its_body_arrives() {
    let fixture = fixture();
    let mut stream = raw(fixture.address);
    let mut header = [0u8; FRAME_HEADER_BYTES];
    FrameHeader { body_length: 0, kind: 0x03, request_id: 42 }.encode(&mut header);
    header[0..4].copy_from_slice(&(FRAME_BODY_BYTES_MAX as u32 + 1).to_le_bytes());
    stream.write_all(&header).unwrap();
    let replies = read_until_closed(&mut stream);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0, 42, "the reply names the request");
    assert_bad_request(&replies[0].1);
    assert_still_served(&fixture);
}

#[test]
fn a_truncated_frame_is_never_parsed_and_its_connection_is_closed_at_end_of_stream() {
    let fixture = fixture();
    let mut frame = Vec::new();
    Request::Prepare {
        ts: 99 << 16 | 1,
        metadata: Metadata::WriteSet(WriteSet::from_keys(&[b"kept"]).unwrap()),
        write_set: vec![],
        writes: vec![rampkv::wire::Write::new(b"kept".to_vec(), b"evil".to_vec())],
    }
    .encode_frame(7, &mut frame);
    for cut in [1, FRAME_HEADER_BYTES - 1, FRAME_HEADER_BYTES, frame.len() - 1] {
        let mut stream = raw(fixture.address);
        stream.write_all(&frame[..cut]).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        assert!(read_until_closed(&mut stream).is_empty(), "no reply to a partial frame (cut at {cut})");
    }
    assert_still_served(&fixture);
}

#[test]
fn a_valid_frame_with_a_garbage_body_gets_an_error_and_the_connection_goes_on() {
    let fixture = fixture();
    let mut stream = raw(fixture.address);
    let mut bytes = Vec::new();
    for (kind, body) in [(0x02u8, &[0xFFu8, 0xFF, 0xFF, 0xFF][..]), (0x03, &[1, 2, 3][..]), (0x7E, &[][..])] {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        FrameHeader { body_length: body.len() as u32, kind, request_id: u64::from(kind) }.encode(&mut header);
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(body);
    }
    Request::Get { items: vec![rampkv::wire::GetItem { key: b"kept".to_vec(), selector: Selector::Latest }] }
        .encode_frame(1000, &mut bytes);
    stream.write_all(&bytes).unwrap();
    for expected_id in [0x02, 0x03, 0x7E] {
        let (id, response) = read_one_reply(&mut stream);
        assert_eq!(id, expected_id);
        assert_bad_request(&response);
    }
    let (id, response) = read_one_reply(&mut stream);
    assert_eq!(id, 1000);
    match response {
        Response::Versions { items } => assert_eq!(&items[0].value[..], b"safe"),
        other => panic!("expected VERSIONS, got {other:?}"),
    }
    assert_still_served(&fixture);
}

#[test]
fn an_invalid_prepare_is_refused_whole() {
    let fixture = fixture();
    let mut stream = raw(fixture.address);
    let mut bytes = Vec::new();
    // "kept" is written but missing from the write set: refused, and "kept" is not touched.
    Request::Prepare {
        ts: 5 << 16 | 9,
        metadata: Metadata::WriteSet(WriteSet::from_keys(&[b"other"]).unwrap()),
        write_set: vec![],
        writes: vec![rampkv::wire::Write::new(b"kept".to_vec(), b"evil".to_vec())],
    }
    .encode_frame(1, &mut bytes);
    Request::Commit { ts: 5 << 16 | 9 }.encode_frame(2, &mut bytes);
    stream.write_all(&bytes).unwrap();
    assert_bad_request(&read_one_reply(&mut stream).1);
    assert_eq!(read_one_reply(&mut stream).1, Response::Ack, "a commit of an unknown ts is a harmless no-op");
    assert_still_served(&fixture);
}
