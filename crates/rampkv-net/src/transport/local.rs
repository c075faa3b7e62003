//! The in-process transport: a client living in the same process as its servers hands each
//! request straight to the server's [`ServerCore`], on the client's own thread, and takes the
//! reply back. No socket, no ring, no second thread, no copy of the request (the driver hands
//! it over: `post_owned`); a read's reply is built from the stored versions as the client would
//! decode it, without a frame in between ([`ServerCore::serve`]). Everything else (the protocol
//! machines, the stores and their concurrency with the server threads serving other clients)
//! is what every other transport uses.
//!
//! It serves deployments that put a client next to its partitions, such as the RESP gateway of
//! `rampkv local`. S2PL's lock requests are refused: a lock granted later is answered through
//! the serving event loop's deferred replies, which a call on the client's thread has no way to
//! receive.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ClientTransport, TransportError};
use rampkv_core::protocol::server::{DeferredReply, ServerCore};
use rampkv_core::wire::{Request, Response};

/// Connection id the cores see for in-process clients (lock ownership only; never used, as
/// lock requests are refused).
const LOCAL_CONNECTION: u64 = u64::MAX - 1;

/// Direct calls into the server cores of this process (server i is `cores[i]`).
#[derive(Debug)]
pub struct LocalTransport {
    /// Each server's core and the clock its event loop stamps prepares with (so that GC and
    /// recovery see the same times whoever asks).
    servers: Vec<(Arc<ServerCore>, Instant)>,
    replies: VecDeque<(usize, u64, Response)>,
    frame: Vec<u8>,
    deferred: Vec<DeferredReply>,
}

impl LocalTransport {
    /// A transport to `cores`, whose event loops measure time from `clock`
    /// ([`crate::server::ServerGroup::clock`]).
    pub fn new(cores: Vec<Arc<ServerCore>>, clock: Instant) -> Self {
        Self::with_clocks(cores.into_iter().map(|core| (core, clock)).collect())
    }

    /// A transport to servers of several groups, each core with its group's clock.
    pub fn with_clocks(servers: Vec<(Arc<ServerCore>, Instant)>) -> Self {
        Self { servers, replies: VecDeque::new(), frame: Vec::new(), deferred: Vec::new() }
    }

    /// True if replies wait to be polled.
    pub fn has_replies(&self) -> bool {
        !self.replies.is_empty()
    }
}

impl ClientTransport for LocalTransport {
    fn server_count(&self) -> usize {
        self.servers.len()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        self.post_owned(server, request_id, request.clone())
    }

    /// Serves `request` at once; its values move into the store without a copy.
    fn post_owned(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        let servers = self.servers.len();
        let (core, clock) = self.servers.get(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        if matches!(
            &request,
            Request::LockRead { .. }
                | Request::LockWrite { .. }
                | Request::CommitLocked { .. }
                | Request::Release { .. }
        ) {
            return Err(TransportError::Unsupported {
                server,
                what: "S2PL lock requests over the in-process transport (use TCP or a ring transport)".into(),
            });
        }
        let now_ms = clock.elapsed().as_millis() as u64;
        let served = core.serve(LOCAL_CONNECTION, request, request_id, now_ms, &mut self.frame, &mut self.deferred);
        debug_assert!(self.deferred.is_empty(), "only lock requests defer replies");
        self.deferred.clear();
        let response = match served {
            Ok(Some(response)) => response,
            Ok(None) => return Err(TransportError::Closed { server }),
            Err(error) => return Err(TransportError::Malformed { server, error }),
        };
        self.replies.push_back((server, request_id, response));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        Ok(()) // every request was served when posted
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        if self.replies.is_empty() {
            // Nothing can arrive later: replies exist only for posted requests.
            if let Some(timeout) = timeout {
                std::thread::sleep(timeout.min(Duration::from_millis(1)));
            }
            return Ok(0);
        }
        let delivered = self.replies.len();
        for (server, request_id, response) in self.replies.drain(..) {
            deliver(server, request_id, response);
        }
        Ok(delivered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Driver, TxnResult};
    use rampkv_core::cluster::Cluster;
    use rampkv_core::protocol::ramp::{Algorithm, TxnOptions};
    use rampkv_core::wire::WriteSet;

    fn cluster_of(cores: &[Arc<ServerCore>]) -> Cluster {
        Cluster::with_servers((0..cores.len()).map(|i| format!("local:{i}")).collect()).unwrap()
    }

    #[test]
    fn a_driver_writes_and_reads_across_partitions_in_process() {
        let cores: Vec<Arc<ServerCore>> = (0..3).map(|_| Arc::new(ServerCore::new(1_000))).collect();
        let cluster = cluster_of(&cores);
        let mut driver = Driver::connect(LocalTransport::new(cores.clone(), Instant::now()), cluster, 1).unwrap();
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            (0..8).map(|i| (format!("key{i}").into_bytes(), format!("value{i}").into_bytes())).collect();
        let ts = driver.begin_write(0, pairs.clone()).unwrap();
        let mut completions = Vec::new();
        while completions.is_empty() {
            driver.step(Some(Duration::ZERO), &mut completions).unwrap();
        }
        assert!(matches!(completions[0].result, Ok(TxnResult::Write(_))));
        let partitions_written = cores.iter().filter(|core| core.store().stats().versions > 0).count();
        assert!(partitions_written > 1, "8 keys land on more than one of 3 partitions");
        completions.clear();
        driver.begin_read(0, pairs.iter().map(|(key, _)| key.clone()).collect()).unwrap();
        while completions.is_empty() {
            driver.step(Some(Duration::ZERO), &mut completions).unwrap();
        }
        let Ok(TxnResult::Read(outcome)) = &completions[0].result else { panic!("{:?}", completions[0].result) };
        for (item, (key, value)) in outcome.items.iter().zip(&pairs) {
            assert_eq!((&item.key, &item.value, item.ts), (key, value, ts));
        }
    }

    #[test]
    fn lock_requests_are_refused_with_a_clear_error() {
        let cores = vec![Arc::new(ServerCore::new(1_000))];
        let mut driver =
            Driver::connect(LocalTransport::new(cores.clone(), Instant::now()), cluster_of(&cores), 1).unwrap();
        driver.set_txn_options(TxnOptions { algorithm: Algorithm::S2pl, ..TxnOptions::default() });
        let error = driver.begin_read(0, vec![b"k".to_vec()]).unwrap_err();
        assert!(error.to_string().contains("S2PL lock requests"), "{error}");
    }

    #[test]
    fn a_served_read_is_the_reply_its_frame_decodes_to() {
        // serve() builds GET replies without a frame; they must be exactly what a client of
        // any other transport decodes from the frame handle_from writes.
        use rampkv_core::wire::{FrameHeader, GetItem, Metadata, Selector, Write};
        let core = ServerCore::new(10);
        let write = |key: &str, value: &str| Write { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec() };
        let prepares = [
            (
                5,
                Metadata::WriteSet(WriteSet::from_keys(&[b"a", b"b"]).unwrap()),
                vec![write("a", "a5"), write("b", "b5")],
            ),
            (7, Metadata::Bloom(vec![0x5a; 16]), vec![write("b", "b7")]),
            (9, Metadata::None, vec![write("c", "")]),
            (11, Metadata::WriteSet(WriteSet::from_keys(&[b"a"]).unwrap()), vec![write("a", "a11")]),
        ];
        let mut out = Vec::new();
        for (ts, metadata, writes) in prepares {
            core.handle(Request::Prepare { ts, metadata, write_set: Vec::new(), writes }, 1, 0, &mut out);
        }
        for ts in [5, 7, 9] {
            core.handle(Request::Commit { ts }, 1, 0, &mut out);
        }
        // Version 5 of "a" is superseded by 11 and collected at t=100.
        core.handle(Request::Commit { ts: 11 }, 1, 0, &mut out);
        core.handle(
            Request::Prepare { ts: 13, metadata: Metadata::None, write_set: Vec::new(), writes: vec![write("a", "x")] },
            1,
            50,
            &mut out,
        );
        core.handle(
            Request::Prepare { ts: 15, metadata: Metadata::None, write_set: Vec::new(), writes: vec![write("a", "y")] },
            1,
            100,
            &mut out,
        );
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
        let mut frame = Vec::new();
        let mut deferred = Vec::new();
        for (i, items) in gets.into_iter().enumerate() {
            let request = Request::Get { items };
            out.clear();
            core.handle(request.clone(), 42, 100, &mut out);
            let (header, body) = FrameHeader::split(&out).unwrap().unwrap();
            let decoded = Response::decode(header.kind, body).unwrap();
            let served = core.serve(LOCAL_CONNECTION, request, 42, 100, &mut frame, &mut deferred).unwrap().unwrap();
            assert_eq!(served, decoded, "get {i}");
        }
        let Response::Versions { items } = core
            .serve(
                LOCAL_CONNECTION,
                Request::Get { items: vec![item("b", Selector::Latest)] },
                1,
                100,
                &mut frame,
                &mut deferred,
            )
            .unwrap()
            .unwrap()
        else {
            panic!("not versions")
        };
        assert_eq!(
            (items[0].ts, &items[0].value[..], &items[0].metadata),
            (7, &b"b7"[..], &Metadata::Bloom(vec![0x5a; 16]))
        );
        // Other requests are served through their frame.
        let commit = core.serve(LOCAL_CONNECTION, Request::Commit { ts: 13 }, 3, 100, &mut frame, &mut deferred);
        assert_eq!(commit.unwrap(), Some(Response::Ack));
    }
}
