//! Property tests of the frame codec: round trips, and truncated or corrupted frames decode
//! to an error (or, for a flipped payload byte, to some other valid message), never a panic.

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use crate::limits::FRAME_BODY_BYTES_MAX;

fn key() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..24)
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..300)
}

fn selector() -> impl Strategy<Value = Selector> {
    prop_oneof![
        Just(Selector::Latest),
        Just(Selector::LatestTimestamp),
        any::<u64>().prop_map(Selector::Exact),
        vec(any::<u64>(), 0..6).prop_map(Selector::HighestOf),
    ]
}

fn metadata() -> impl Strategy<Value = Metadata> {
    prop_oneof![
        Just(Metadata::None),
        vec(key(), 0..5).prop_map(|keys| Metadata::WriteSet(WriteSet::from_keys(&keys).unwrap())),
        vec(any::<u8>(), 0..64).prop_map(Metadata::Bloom),
    ]
}

/// An expiry word as a writer sends it: mostly none, sometimes a deadline or a deletion.
fn written_expiry() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(0u64), 1 => Just(1u64), 2 => 0..=crate::types::Expiry::DEADLINE_MS_MAX]
}

/// An expiry as a server returns it: a written one, or one marked reclaimed.
fn returned_expiry() -> impl Strategy<Value = crate::types::Expiry> {
    (written_expiry(), any::<bool>()).prop_map(|(word, reclaimed)| {
        let expiry = crate::types::Expiry::from_word(word);
        if reclaimed && word != 0 {
            expiry.reclaimed()
        } else {
            expiry
        }
    })
}

fn version_item() -> impl Strategy<Value = VersionItem> {
    (any::<u64>(), value(), metadata(), returned_expiry()).prop_map(|(ts, value, metadata, expiry)| VersionItem {
        ts,
        value: value.into(),
        metadata,
        expiry,
    })
}

fn writes() -> impl Strategy<Value = Vec<Write>> {
    vec(
        (key(), value(), written_expiry())
            .prop_map(|(key, value, expires_at_ms)| Write::expiring(key, value, expires_at_ms)),
        0..6,
    )
}

fn cluster_view() -> impl Strategy<Value = Option<ClusterView>> {
    proptest::option::of(
        (any::<u32>(), any::<u32>()).prop_map(|(partitions, server_index)| ClusterView { partitions, server_index }),
    )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u16>(), cluster_view())
            .prop_map(|(client_ids_wanted, cluster)| Request::Hello { client_ids_wanted, cluster }),
        vec((key(), selector()).prop_map(|(key, selector)| GetItem { key, selector }), 0..8)
            .prop_map(|items| Request::Get { items }),
        vec((key(), selector()).prop_map(|(key, selector)| GetItem { key, selector }), 0..8)
            .prop_map(|items| Request::GetLocate { items }),
        (any::<u64>(), metadata(), vec(key(), 0..4), writes())
            .prop_map(|(ts, metadata, write_set, writes)| Request::Prepare { ts, metadata, write_set, writes }),
        (any::<u64>(), metadata(), vec(key(), 0..4), writes())
            .prop_map(|(ts, metadata, write_set, writes)| Request::PrepareCommit { ts, metadata, write_set, writes }),
        (any::<u64>(), vec(key(), 0..4)).prop_map(|(ts, keys)| Request::Status { ts, keys }),
        any::<u64>().prop_map(|ts| Request::Commit { ts }),
        (any::<u64>(), writes()).prop_map(|(ts, writes)| Request::Put { ts, writes }),
        (any::<u64>(), vec(key(), 0..6)).prop_map(|(ts, keys)| Request::LockRead { ts, keys }),
        (any::<u64>(), writes()).prop_map(|(ts, writes)| Request::LockWrite { ts, writes }),
        any::<u64>().prop_map(|ts| Request::CommitLocked { ts }),
        any::<u64>().prop_map(|ts| Request::Release { ts }),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    let code = prop_oneof![
        Just(ErrorCode::BadRequest),
        Just(ErrorCode::VersionGone),
        Just(ErrorCode::Internal),
        Just(ErrorCode::Aborted),
        (100u16..).prop_map(ErrorCode::Unknown)
    ];
    prop_oneof![
        (any::<u16>(), any::<u16>(), cluster_view()).prop_map(|(client_id_first, client_ids_granted, cluster)| {
            Response::Hello { client_id_first, client_ids_granted, cluster }
        }),
        vec(version_item(), 0..6).prop_map(|items| Response::Versions { items }),
        vec((version_item(), proptest::option::of(0u32..u32::MAX)), 0..6).prop_map(|entries| {
            let (items, slots) = entries.into_iter().unzip();
            Response::VersionsLocated { items, slots }
        }),
        vec((version_item(), any::<u64>()), 0..6).prop_map(|entries| {
            let (items, on_arrival) = entries.into_iter().unzip();
            Response::VersionsLocked { items, on_arrival }
        }),
        Just(Response::Ack),
        prop_oneof![
            Just(TxnState::Unknown),
            Just(TxnState::Prepared),
            Just(TxnState::Committed),
            Just(TxnState::Aborted)
        ]
        .prop_map(|state| Response::Status { state }),
        (code, "[a-z ]{0,40}").prop_map(|(code, message)| Response::Error { code, message }),
    ]
}

/// `request` with every write's expiry 0 (what a cut before its expiries section decodes to).
fn never_expiring_request(request: Request) -> Request {
    let never = |writes: Vec<Write>| writes.into_iter().map(|write| Write::new(write.key, write.value)).collect();
    match request {
        Request::Prepare { ts, metadata, write_set, writes } => {
            Request::Prepare { ts, metadata, write_set, writes: never(writes) }
        }
        Request::PrepareCommit { ts, metadata, write_set, writes } => {
            Request::PrepareCommit { ts, metadata, write_set, writes: never(writes) }
        }
        Request::Put { ts, writes } => Request::Put { ts, writes: never(writes) },
        Request::LockWrite { ts, writes } => Request::LockWrite { ts, writes: never(writes) },
        other => other,
    }
}

/// `response` with every entry's expiry 0.
fn never_expiring_response(response: Response) -> Response {
    let never = |items: Vec<VersionItem>| {
        items.into_iter().map(|item| VersionItem::new(item.ts, item.value, item.metadata)).collect()
    };
    match response {
        Response::Versions { items } => Response::Versions { items: never(items) },
        Response::VersionsLocated { items, slots } => Response::VersionsLocated { items: never(items), slots },
        Response::VersionsLocked { items, on_arrival } => Response::VersionsLocked { items: never(items), on_arrival },
        other => other,
    }
}

/// Splits one encoded frame into its header and body, checking it is complete and exact.
fn split_frame(frame: &[u8]) -> (FrameHeader, &[u8]) {
    let header = FrameHeader::check(frame).unwrap().expect("a complete frame");
    assert_eq!(header.frame_bytes(), frame.len());
    (header, &frame[FRAME_HEADER_BYTES..])
}

proptest! {
    #[test]
    fn requests_round_trip(request in request(), id in any::<u64>()) {
        let mut frame = Vec::new();
        request.encode_frame(id, &mut frame);
        let (header, body) = split_frame(&frame);
        prop_assert_eq!(header.request_id, id);
        prop_assert_eq!(Request::decode(header.kind, body).unwrap(), request);
    }

    #[test]
    fn responses_round_trip(response in response(), id in any::<u64>()) {
        let mut frame = Vec::new();
        response.encode_frame(id, &mut frame);
        let (header, body) = split_frame(&frame);
        prop_assert_eq!(header.request_id, id);
        prop_assert_eq!(Response::decode(header.kind, body).unwrap(), response);
    }

    #[test]
    fn every_truncation_is_incomplete_or_an_error(request in request(), response in response()) {
        for frame in [encode_request(&request), encode_response(&response)] {
            for cut in 0..frame.len() {
                // The stream reader waits for the rest ...
                prop_assert_eq!(FrameHeader::check(&frame[..cut]), Ok(None));
            }
            // ... and a body cut short never decodes, but at one place each: a HELLO cut right
            // before its (optional) cluster view is the older HELLO without one, and a message
            // cut right before its (optional) expiries section is the same message with nothing
            // expiring; each decodes as such.
            let (header, body) = split_frame(&frame);
            let without_expiries = {
                let mut shorter = Vec::new();
                match Request::decode(header.kind, body) {
                    Ok(request) => never_expiring_request(request).encode_body(&mut shorter),
                    Err(_) => never_expiring_response(Response::decode(header.kind, body).unwrap()).encode_body(&mut shorter),
                }
                shorter.len()
            };
            for cut in 0..body.len() {
                let expected = match (Request::decode(header.kind, &body[..cut]), Response::decode(header.kind, &body[..cut])) {
                    (Ok(Request::Hello { cluster: None, .. }), _) => cut == 2 && header.kind == 0x01,
                    (_, Ok(Response::Hello { cluster: None, .. })) => cut == 4 && header.kind == 0x81,
                    (Ok(_), _) | (_, Ok(_)) => cut == without_expiries,
                    (Err(_), Err(_)) => true,
                };
                prop_assert!(expected, "a body cut at {} of {} decoded", cut, body.len());
            }
        }
    }

    #[test]
    fn corrupted_frames_never_panic(
        request in request(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut frame = encode_request(&request);
        for (index, byte) in &flips {
            let at = index.index(frame.len());
            frame[at] = *byte;
        }
        if let Ok(Some(header)) = FrameHeader::check(&frame) {
            let body = &frame[FRAME_HEADER_BYTES..header.frame_bytes()];
            let _ = Request::decode(header.kind, body);
            let _ = Response::decode(header.kind, body);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(kind in any::<u8>(), body in vec(any::<u8>(), 0..512)) {
        let _ = Request::decode(kind, &body);
        let _ = Response::decode(kind, &body);
        let _ = FrameHeader::check(&body);
    }
}

fn encode_request(request: &Request) -> Vec<u8> {
    let mut frame = Vec::new();
    request.encode_frame(1, &mut frame);
    frame
}

fn encode_response(response: &Response) -> Vec<u8> {
    let mut frame = Vec::new();
    response.encode_frame(1, &mut frame);
    frame
}

#[test]
fn trailing_bytes_after_a_message_are_refused() {
    let mut body = Vec::new();
    Request::Commit { ts: 5 }.encode_body(&mut body);
    body.push(0);
    assert_eq!(Request::decode(request::KIND_COMMIT, &body), Err(WireError::TrailingBytes(1)));
}

#[test]
fn invalid_headers_are_refused_with_the_reason() {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    FrameHeader { body_length: 0, kind: 1, request_id: 0 }.encode(&mut header);
    let mut bad_version = header;
    bad_version[4] = 9;
    assert_eq!(FrameHeader::check(&bad_version), Err(WireError::UnsupportedVersion(9)));
    let mut reserved = header;
    reserved[6] = 1;
    assert_eq!(FrameHeader::check(&reserved), Err(WireError::ReservedBitsSet(1)));
    let mut oversized = header;
    oversized[0..4].copy_from_slice(&(FRAME_BODY_BYTES_MAX as u32 + 1).to_le_bytes());
    assert!(matches!(FrameHeader::check(&oversized), Err(WireError::FrameTooLarge { .. })));
}

#[test]
fn a_huge_count_in_a_short_body_is_refused_without_allocating() {
    // count = 200 items (under the limit) but no bytes for them.
    let body = 200u32.to_le_bytes();
    assert!(matches!(Request::decode(request::KIND_GET, &body), Err(WireError::Truncated { .. })));
    let body = u32::MAX.to_le_bytes();
    assert!(matches!(Request::decode(request::KIND_GET, &body), Err(WireError::FieldTooLarge { .. })));
}

#[test]
fn the_header_layout_is_as_documented() {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    FrameHeader { body_length: 0x0102_0304, kind: 0x82, request_id: 0x1122_3344_5566_7788 }.encode(&mut header);
    assert_eq!(header, [0x04, 0x03, 0x02, 0x01, 1, 0x82, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
}

#[test]
fn versions_located_needs_one_slot_per_version_and_matches_the_server_encoder() {
    let items = vec![
        VersionItem::new(7, b"v".to_vec(), Metadata::WriteSet(WriteSet::from_keys(&[b"k"]).unwrap())),
        VersionItem::new(0, Vec::new(), Metadata::None),
    ];
    let response = Response::VersionsLocated { items: items.clone(), slots: vec![Some(3), None] };
    let mut frame = Vec::new();
    response.encode_frame(9, &mut frame);
    let mut direct = Vec::new();
    let entries = items.iter().map(|item| (item.ts, &item.value[..], item.metadata.as_ref(), item.expiry.to_word()));
    response::append_versions_located_frame(&mut direct, 9, entries, [Some(3), None].into_iter());
    assert_eq!(frame, direct, "the server's borrowed encoder writes the same bytes");
    // The slot list is the VERSIONS body's tail: u32 count, u32 per slot (u32::MAX: none).
    assert_eq!(&frame[frame.len() - 12..], &[2, 0, 0, 0, 3, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
    let mut mismatched = frame[FRAME_HEADER_BYTES..frame.len() - 12].to_vec();
    mismatched.extend_from_slice(&[1, 0, 0, 0, 3, 0, 0, 0]);
    assert!(matches!(Response::decode(response::KIND_VERSIONS_LOCATED, &mismatched), Err(WireError::Invalid(_))));
}

#[test]
fn versions_locked_needs_one_arrival_timestamp_per_version_and_matches_the_server_encoder() {
    let items =
        vec![VersionItem::new(9, b"v".to_vec(), Metadata::None), VersionItem::new(0, Vec::new(), Metadata::None)];
    let response = Response::VersionsLocked { items: items.clone(), on_arrival: vec![5, 0] };
    let mut frame = Vec::new();
    response.encode_frame(4, &mut frame);
    let mut direct = Vec::new();
    let entries = items.iter().map(|item| (item.ts, &item.value[..], item.metadata.as_ref(), item.expiry.to_word()));
    response::append_versions_locked_frame(&mut direct, 4, entries, [5, 0].into_iter());
    assert_eq!(frame, direct, "the server's borrowed encoder writes the same bytes");
    // The arrival list is the VERSIONS body's tail: u32 count, u64 per version.
    assert_eq!(&frame[frame.len() - 20..], &[2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut mismatched = frame[FRAME_HEADER_BYTES..frame.len() - 20].to_vec();
    mismatched.extend_from_slice(&[1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
    assert!(matches!(Response::decode(response::KIND_VERSIONS_LOCKED, &mismatched), Err(WireError::Invalid(_))));
}

/// The largest request the limits allow (a PREPARE of `TXN_KEYS_MAX` keys of `KEY_BYTES_MAX`
/// bytes, values of `VALUE_BYTES_MAX`, the write set twice: as metadata and as the key list)
/// fits in a frame: requests are encoded with the asserting `append_frame`.
#[test]
fn the_largest_request_the_limits_allow_fits_in_a_frame() {
    use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
    let keys: Vec<Vec<u8>> = (0..TXN_KEYS_MAX)
        .map(|index| [vec![index as u8; KEY_BYTES_MAX - 2], (index as u16).to_le_bytes().to_vec()].concat())
        .collect();
    // Every write expires: the expiries section is there too.
    let writes = keys.iter().map(|key| Write::expiring(key.clone(), vec![7; VALUE_BYTES_MAX], u64::MAX >> 1)).collect();
    let metadata = Metadata::WriteSet(WriteSet::from_keys(&keys).unwrap());
    let request = Request::Prepare { ts: 1 << 16, metadata, write_set: keys, writes };
    let mut frame = Vec::new();
    request.encode_frame(1, &mut frame);
    let body = frame.len() - FRAME_HEADER_BYTES;
    assert!(body <= FRAME_BODY_BYTES_MAX, "{body} bytes");
    let (header, decoded) = FrameHeader::split(&frame).unwrap().unwrap();
    assert_eq!(Request::decode(header.kind, decoded).unwrap(), request);
}

/// A VERSIONS reply larger than a frame (a legal read: many large values with large write
/// sets on one server) becomes an ERROR BadRequest saying so, never a panic or a frame the
/// client would refuse.
#[test]
fn a_reply_too_large_for_a_frame_becomes_an_error_reply() {
    use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
    let keys: Vec<Vec<u8>> = (0..TXN_KEYS_MAX).map(|index| vec![index as u8; KEY_BYTES_MAX]).collect();
    let write_set = WriteSet::from_keys(&keys).unwrap();
    let items: Vec<VersionItem> = (0..TXN_KEYS_MAX)
        .map(|_| VersionItem::new(5 << 16, vec![1; VALUE_BYTES_MAX], Metadata::WriteSet(write_set.clone())))
        .collect();
    let mut out = b"earlier frames".to_vec();
    Response::Versions { items: items.clone() }.encode_frame(3, &mut out);
    let mut direct = b"earlier frames".to_vec();
    let entries = items.iter().map(|item| (item.ts, &item.value[..], item.metadata.as_ref(), item.expiry.to_word()));
    response::append_versions_frame(&mut direct, 3, entries);
    assert_eq!(out, direct, "both encoders fall back alike");
    assert_eq!(&out[..14], b"earlier frames", "what came before is kept");
    let (header, body) = FrameHeader::split(&out[14..]).unwrap().unwrap();
    assert_eq!((header.kind, header.request_id), (response::KIND_ERROR, 3));
    assert_eq!(header.frame_bytes(), out.len() - 14, "one small frame replaces the reply");
    let Response::Error { code: ErrorCode::BadRequest, message } = Response::decode(header.kind, body).unwrap() else {
        panic!("expected BadRequest");
    };
    assert!(message.contains("too large") && message.contains(&FRAME_BODY_BYTES_MAX.to_string()), "{message}");
}

/// The HELLO bytes docs/wire.md shows, with and without the cluster view; the old forms (no
/// view) still decode, as `None`.
#[test]
fn hello_frames_are_the_documented_bytes() {
    let view = Some(ClusterView { partitions: 8, server_index: 1 });
    let mut frame = Vec::new();
    Request::Hello { client_ids_wanted: 4, cluster: view }.encode_frame(1, &mut frame);
    assert_eq!(frame[..16], [0x0a, 0, 0, 0, 1, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(frame[16..], [4, 0, 8, 0, 0, 0, 1, 0, 0, 0]);
    let mut reply = Vec::new();
    Response::Hello { client_id_first: 5, client_ids_granted: 4, cluster: view }.encode_frame(1, &mut reply);
    assert_eq!(reply[..16], [0x0c, 0, 0, 0, 1, 0x81, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(reply[16..], [5, 0, 4, 0, 8, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(Request::decode(0x01, &[4, 0]).unwrap(), Request::Hello { client_ids_wanted: 4, cluster: None });
    let old_reply = Response::decode(0x81, &[5, 0, 4, 0]).unwrap();
    assert_eq!(old_reply, Response::Hello { client_id_first: 5, client_ids_granted: 4, cluster: None });
    assert!(matches!(Request::decode(0x01, &[4, 0, 8, 0, 0]), Err(WireError::Truncated { .. })));
    assert!(matches!(Request::decode(0x01, &[4, 0, 8, 0, 0, 0, 1, 0, 0, 0, 9]), Err(WireError::TrailingBytes(1))));
}
