//! Issue 15, item 5: the binary port and the fabric control ports "accept anyone". With a
//! shared secret, every client proves it (HMAC-SHA-256 challenge-response, both ways) before it
//! is served; these tests run servers and clients in one process with secrets chosen per
//! client (`TcpClient::with_secret`, `FabricClient::set_secret`). Between processes, with the
//! command-line flags: `tests/multiprocess.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

#[allow(dead_code)] // this binary uses only the round-trip helper
mod common;

use common::put_get_round_trip;
use rampkv::auth::{AuthError, SharedSecret};
use rampkv::client::Driver;
use rampkv::cluster::{Cluster, Front};
use rampkv::message::control::Refusal;
use rampkv::message::fabric::FabricClient;
use rampkv::message::ring::Ring;
use rampkv::message::tcp::TcpClient;
use rampkv::message::ChannelError;
use rampkv::server::front::FrontEnd;
use rampkv::server::{ServerConfig, ServerGroup, ServerOptions};
use rampkv::transport::{Transport, TransportError};
use rampkv::wire::{AuthFrame, FrameHeader, GetItem, Request, Response, Selector, Write as KeyWrite};
use rampkv_fabric::ShmFabric;

fn secret(byte: u8) -> Arc<SharedSecret> {
    Arc::new(SharedSecret::from_bytes(vec![byte; 32]).unwrap())
}

/// Two servers requiring `secret` (None: none), with a ring front end.
fn cluster(secret: Option<Arc<SharedSecret>>) -> (ServerGroup, FrontEnd, Cluster, Vec<String>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let configs = [ServerConfig::new(localhost), ServerConfig::new(localhost)];
    let (group, _) = ServerGroup::start(&configs, &ServerOptions { secret, ..ServerOptions::default() }).unwrap();
    let rings = FrontEnd::spawn(&group, Front::Ring, localhost, None).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let control = rings.control_addresses().iter().map(SocketAddr::to_string).collect();
    (group, rings, cluster, control)
}

fn tcp(cluster: &Cluster, secret: Option<Arc<SharedSecret>>) -> Result<Transport<TcpClient>, TransportError> {
    Transport::with_medium(TcpClient::with_secret(secret).unwrap(), cluster.servers())
}

fn rings(
    control: &[String],
    secret: Option<Arc<SharedSecret>>,
) -> Result<Transport<FabricClient<ShmFabric, Ring>>, TransportError> {
    let mut medium = FabricClient::<ShmFabric, Ring>::with_fabric(ShmFabric::new().unwrap(), control.len()).unwrap();
    medium.set_secret(secret);
    Transport::with_medium(medium, control)
}

/// Reads one frame from `stream` and decodes it as a response.
fn read_frame(stream: &mut TcpStream) -> (FrameHeader, Response) {
    let mut header = [0u8; 16];
    stream.read_exact(&mut header).unwrap();
    let header = FrameHeader::decode(&header).unwrap();
    let mut body = vec![0u8; header.body_length as usize];
    stream.read_exact(&mut body).unwrap();
    (header, Response::decode(header.kind, &body).unwrap())
}

/// The channel error under a transport's connect error.
fn channel_error(error: TransportError) -> ChannelError {
    match error {
        TransportError::Connect { error, .. } => error,
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[test]
fn the_binary_port_serves_only_clients_that_prove_the_secret() {
    let (_group, _rings, cluster, _control) = cluster(Some(secret(1)));

    // No secret: the first request (the driver's HELLO) is refused, and the connection closed.
    let transport = tcp(&cluster, None).unwrap();
    let error = Driver::connect(transport, cluster.clone(), 1).unwrap_err();
    assert!(error.to_string().contains("authentication required"), "{error}");

    // Raw: pipelined requests before authenticating each get an ERROR, and no data; an
    // authentication frame out of order ends the connection.
    let mut raw = TcpStream::connect(&cluster.servers()[0]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frames = Vec::new();
    Request::Get { items: vec![GetItem { key: b"k".to_vec(), selector: Selector::Latest }] }
        .encode_frame(9, &mut frames);
    Request::Put { ts: (1 << 16) | 1, writes: vec![KeyWrite::new(b"k".to_vec(), b"v".to_vec())] }
        .encode_frame(10, &mut frames);
    raw.write_all(&frames).unwrap();
    for request_id in [9, 10] {
        let (header, reply) = read_frame(&mut raw);
        assert_eq!(header.request_id, request_id);
        let Response::Error { message, .. } = reply else { panic!("not an error: {reply:?}") };
        assert!(message.contains("authentication required"), "{message}");
    }
    let mut proof = Vec::new();
    AuthFrame::Proof { proof: [0; 32] }.encode_frame(11, &mut proof);
    raw.write_all(&proof).unwrap();
    let (_, reply) = read_frame(&mut raw);
    assert!(matches!(&reply, Response::Error { message, .. } if message.contains("out of order")), "{reply:?}");
    assert_eq!(raw.read(&mut [0; 16]).unwrap(), 0, "the server closed the connection");

    // A wrong secret: refused at connect, with the server's words.
    let error = channel_error(tcp(&cluster, Some(secret(2))).unwrap_err());
    assert!(
        matches!(&error, ChannelError::Auth(AuthError::Refused { message }) if message.contains("wrong proof")),
        "{error}"
    );

    // The right one: served.
    let mut driver = Driver::connect(tcp(&cluster, Some(secret(1))).unwrap(), cluster.clone(), 1).unwrap();
    for round in 0..3 {
        put_get_round_trip(&mut driver, round);
    }
}

#[test]
fn a_client_with_a_secret_refuses_a_server_that_cannot_prove_it() {
    let (_group, _rings, cluster, control) = cluster(None);
    let error = channel_error(tcp(&cluster, Some(secret(1))).unwrap_err());
    assert!(matches!(&error, ChannelError::Auth(AuthError::Refused { .. })), "{error}");
    let error = channel_error(rings(&control, Some(secret(1))).unwrap_err());
    assert!(matches!(error, ChannelError::ServerUnauthenticated), "{error}");
}

#[test]
fn the_control_ports_serve_only_clients_that_prove_the_secret() {
    let (_group, _rings, cluster, control) = cluster(Some(secret(1)));
    let error = channel_error(rings(&control, None).unwrap_err());
    assert!(matches!(error, ChannelError::Refused(Refusal::AuthenticationRequired)), "{error}");
    assert!(error.to_string().contains("--secret-file"), "{error}");
    let error = channel_error(rings(&control, Some(secret(2))).unwrap_err());
    assert!(matches!(error, ChannelError::Refused(Refusal::Authentication)), "{error}");

    let mut driver = Driver::connect(rings(&control, Some(secret(1))).unwrap(), cluster, 1).unwrap();
    for round in 0..3 {
        put_get_round_trip(&mut driver, round);
    }
}
