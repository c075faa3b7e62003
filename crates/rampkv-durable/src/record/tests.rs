use proptest::prelude::*;

use super::*;

fn key(text: &str) -> Key {
    text.as_bytes().into()
}

fn write_set_of(keys: &[Key]) -> WriteSet {
    WriteSet::from_keys(keys).unwrap()
}

fn writes(pairs: &[(&str, &str)]) -> Vec<StoreWrite> {
    pairs.iter().map(|(name, value)| StoreWrite::new(key(name), value.as_bytes().into())).collect()
}

fn header(lsn: Lsn) -> RecordHeader {
    RecordHeader { lsn, epoch: 3, synced_lsn: lsn.saturating_sub(2) }
}

fn round_trip(record: &Record) -> Vec<u8> {
    let mut bytes = Vec::new();
    let length = encode_record(header(9), record.as_ref(), &mut bytes).unwrap();
    assert_eq!(length, bytes.len());
    let (decoded_header, decoded, used) = decode_record(&bytes).unwrap();
    assert_eq!(decoded_header, header(9));
    assert_eq!(&decoded, record);
    assert_eq!(used, bytes.len());
    bytes
}

#[test]
fn every_kind_round_trips() {
    let write_set = write_set_of(&[key("a"), key("b")]);
    round_trip(&Record::Prepare {
        ts: 77,
        metadata: StoredMetadata::WriteSet(write_set.clone()),
        write_set: write_set.clone(),
        writes: writes(&[("a", "1"), ("b", "22")]),
    });
    round_trip(&Record::Prepare {
        ts: 78,
        metadata: StoredMetadata::Bloom(Arc::from(&[1u8, 2, 3][..])),
        write_set: write_set.clone(),
        writes: writes(&[("a", "")]),
    });
    round_trip(&Record::Prepare {
        ts: 79,
        metadata: StoredMetadata::None,
        write_set: WriteSet::default(),
        writes: writes(&[("a", "x")]),
    });
    round_trip(&Record::Commit { ts: 80 });
    round_trip(&Record::Abort { ts: 81 });
    round_trip(&Record::Put { ts: 82, writes: writes(&[("k", "v")]) });
}

#[test]
fn a_write_set_equal_to_the_metadata_is_stored_once_and_shared_again_when_decoded() {
    // Long enough not to be held inline: decoded, the two share one buffer.
    let write_set = write_set_of(&[key("alpha-alpha-alpha"), key("beta-beta-beta")]);
    let shared = Record::Prepare {
        ts: 5,
        metadata: StoredMetadata::WriteSet(write_set.clone()),
        write_set: write_set.clone(),
        writes: writes(&[("alpha-alpha-alpha", "1")]),
    };
    let separate = Record::Prepare {
        ts: 5,
        metadata: StoredMetadata::WriteSet(write_set.clone()),
        write_set: write_set_of(&[key("alpha-alpha-alpha")]),
        writes: writes(&[("alpha-alpha-alpha", "1")]),
    };
    let shared_bytes = round_trip(&shared);
    round_trip(&separate);
    let Record::Prepare { metadata: StoredMetadata::WriteSet(keys), write_set, .. } =
        decode_record(&shared_bytes).unwrap().1
    else {
        panic!("decoded a PREPARE with a write set");
    };
    assert!(keys.shares_buffer_with(&write_set));
}

#[test]
fn the_encoder_refuses_what_the_decoder_would_refuse_and_appends_nothing() {
    let mut bytes = vec![7u8];
    let too_long = vec![StoreWrite::new(Key::from(vec![0u8; KEY_BYTES_MAX + 1]), Box::from(&b"v"[..]))];
    let too_big = vec![StoreWrite::new(key("k"), vec![0u8; VALUE_BYTES_MAX + 1].into_boxed_slice())];
    let too_many: Vec<StoreWrite> =
        (0..=TXN_KEYS_MAX).map(|index| StoreWrite::new(key(&index.to_string()), Box::from(&b""[..]))).collect();
    let reclaimed =
        vec![StoreWrite { expiry: Expiry::DELETED.reclaimed(), ..StoreWrite::new(key("k"), Box::default()) }];
    let refused = [
        RecordRef::Commit { ts: 0 },
        RecordRef::Put { ts: 1, writes: WritesRef::Values(&[]) },
        RecordRef::Put { ts: 1, writes: (&too_long).into() },
        RecordRef::Put { ts: 1, writes: (&too_big).into() },
        RecordRef::Put { ts: 1, writes: (&too_many).into() },
        RecordRef::Put { ts: 1, writes: (&reclaimed).into() },
    ];
    for record in refused {
        assert!(encode_record(header(1), record, &mut bytes).is_err(), "{record:?}");
    }
    assert_eq!(encode_record(header(0), RecordRef::Commit { ts: 1 }, &mut bytes), Err(RecordError::ZeroLsn));
    assert_eq!(bytes, [7u8]);
}

#[test]
fn the_largest_record_fits_the_payload_bound() {
    let keys: Vec<Key> = (0..TXN_KEYS_MAX).map(|index| Key::from(vec![index as u8; KEY_BYTES_MAX])).collect();
    // Every write expires: the expiries section is part of the largest record.
    let writes: Vec<StoreWrite> = keys
        .iter()
        .map(|key| StoreWrite {
            expiry: Expiry::at_ms(Expiry::DEADLINE_MS_MAX).unwrap(),
            ..StoreWrite::new(key.clone(), vec![1u8; VALUE_BYTES_MAX].into_boxed_slice())
        })
        .collect();
    let record = Record::Prepare {
        ts: 1,
        metadata: StoredMetadata::WriteSet(write_set_of(&keys)),
        write_set: write_set_of(&keys.iter().rev().cloned().collect::<Vec<_>>()),
        writes,
    };
    let bytes = round_trip(&record);
    assert_eq!(bytes.len(), RECORD_HEADER_BYTES + RECORD_PAYLOAD_BYTES_MAX);
}

#[test]
fn a_cut_record_is_truncated_and_a_changed_byte_is_a_checksum_or_header_error() {
    let bytes = round_trip(&Record::Put { ts: 12, writes: writes(&[("key", "value"), ("other", "more")]) });
    for cut in 0..bytes.len() {
        assert!(matches!(check_frame(&bytes[..cut]), Err(RecordError::Truncated { .. })), "cut at {cut}");
    }
    for position in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x40;
        let error = check_frame(&damaged).unwrap_err();
        let expected = match position {
            // A changed length claims more bytes than present, too many, or fewer (checksum).
            0..4 => matches!(
                error,
                RecordError::Truncated { .. }
                    | RecordError::PayloadTooLarge { .. }
                    | RecordError::ChecksumMismatch { .. }
            ),
            8 => matches!(error, RecordError::UnknownKind(_)),
            9..16 => error == RecordError::ReservedBytesSet,
            _ => matches!(error, RecordError::ChecksumMismatch { .. }),
        };
        assert!(expected, "byte {position}: {error:?}");
    }
}

#[test]
fn garbage_after_a_valid_checksum_is_an_error_not_a_panic() {
    // A frame whose checksum is right but whose payload is not a record (as a bug or a
    // crafted file would make): every kind, a few payloads.
    for kind in KIND_PREPARE..=KIND_PUT {
        for payload in [&b""[..], &[0u8; 8], &[1, 0, 0, 0, 0, 0, 0, 0, 9, 9], &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
        {
            let frame = raw_frame(kind, 4, payload);
            assert!(decode_record(&frame).is_err(), "kind {kind} payload {payload:?}");
        }
    }
}

/// A frame with a correct checksum around any payload.
fn raw_frame(kind: u8, lsn: Lsn, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; RECORD_HEADER_BYTES];
    frame[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    frame[8] = kind;
    frame[16..24].copy_from_slice(&lsn.to_le_bytes());
    frame.extend_from_slice(payload);
    let crc = frame_crc(&frame);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    frame
}

fn arbitrary_key() -> impl Strategy<Value = Key> {
    prop::collection::vec(any::<u8>(), 0..12).prop_map(Key::from)
}

fn arbitrary_writes() -> impl Strategy<Value = Vec<StoreWrite>> {
    let expiry = prop_oneof![3 => Just(0u64), 1 => Just(1u64), 1 => 0..=Expiry::DEADLINE_MS_MAX];
    prop::collection::vec(
        (arbitrary_key(), prop::collection::vec(any::<u8>(), 0..40).prop_map(Box::from), expiry)
            .prop_map(|(key, value, word)| StoreWrite { key, value, expiry: Expiry::from_word(word) }),
        1..6,
    )
}

fn arbitrary_metadata() -> impl Strategy<Value = StoredMetadata> {
    prop_oneof![
        Just(StoredMetadata::None),
        prop::collection::vec(arbitrary_key(), 0..5).prop_map(|keys| StoredMetadata::WriteSet(write_set_of(&keys))),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|bits| StoredMetadata::Bloom(bits.into())),
    ]
}

fn arbitrary_record() -> impl Strategy<Value = Record> {
    let ts = 1..u64::MAX;
    prop_oneof![
        (
            ts.clone(),
            arbitrary_metadata(),
            prop::collection::vec(arbitrary_key(), 0..5),
            arbitrary_writes(),
            any::<bool>()
        )
            .prop_map(|(ts, metadata, keys, writes, reuse)| {
                let write_set = match (&metadata, reuse) {
                    (StoredMetadata::WriteSet(shared), true) => shared.clone(),
                    _ => write_set_of(&keys),
                };
                Record::Prepare { ts, metadata, write_set, writes }
            }),
        ts.clone().prop_map(|ts| Record::Commit { ts }),
        ts.clone().prop_map(|ts| Record::Abort { ts }),
        (ts, arbitrary_writes()).prop_map(|(ts, writes)| Record::Put { ts, writes }),
    ]
}

proptest! {
    #[test]
    fn arbitrary_records_round_trip(record in arbitrary_record(), lsn in 1..u64::MAX, epoch: u64, synced: u64) {
        let header = RecordHeader { lsn, epoch, synced_lsn: synced };
        let mut bytes = vec![0xAA; 3];
        let length = encode_record(header, record.as_ref(), &mut bytes).unwrap();
        let (decoded_header, decoded, used) = decode_record(&bytes[3..]).unwrap();
        prop_assert_eq!(decoded_header, header);
        prop_assert_eq!(decoded, record);
        prop_assert_eq!(used, length);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_record(&bytes);
    }

    #[test]
    fn arbitrary_payloads_behind_a_valid_checksum_never_panic(
        kind in 0u8..7, payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let _ = decode_record(&raw_frame(kind, 1, &payload));
    }

    #[test]
    fn any_changed_byte_of_an_encoded_record_is_detected(
        record in arbitrary_record(), position_seed: usize, flip in 1u8..=255,
    ) {
        let mut bytes = Vec::new();
        encode_record(header(5), record.as_ref(), &mut bytes).unwrap();
        let position = position_seed % bytes.len();
        bytes[position] ^= flip;
        prop_assert!(decode_record(&bytes).is_err());
    }
}

#[test]
fn the_header_layout_is_as_documented_byte_by_byte() {
    let mut bytes = Vec::new();
    let header = RecordHeader { lsn: 0x0102_0304_0506_0708, epoch: 9, synced_lsn: 7 };
    encode_record(header, RecordRef::Commit { ts: 0xAB }, &mut bytes).unwrap();
    let mut expected = vec![8, 0, 0, 0, 0, 0, 0, 0, KIND_COMMIT, 0, 0, 0, 0, 0, 0, 0];
    expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
    expected.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
    expected.extend_from_slice(&[7, 0, 0, 0, 0, 0, 0, 0]);
    expected.extend_from_slice(&[0xAB, 0, 0, 0, 0, 0, 0, 0]);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&expected[0..4]), &expected[8..]);
    expected[4..8].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(bytes, expected);
}
