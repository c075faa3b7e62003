//! Transactions from the YCSB workloads and from property files, through the public API.

use rampkv_ycsb::{
    BuiltinWorkload, CoreWorkload, CoreWorkloadConfig, Error, OperationKind, Properties, Txn, TxnGenerator, TxnKind,
};

fn generator(workload: BuiltinWorkload, seed: u64, txn_size: usize) -> TxnGenerator {
    println!("seed {seed}");
    let workload = CoreWorkload::new(workload.config(), seed).expect("valid workload");
    TxnGenerator::new(workload, txn_size).expect("valid transaction size")
}

fn assert_distinct(txn: &Txn) {
    let mut numbers = txn.key_numbers().to_vec();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), txn.len(), "keys of a transaction are distinct");
}

/// Keys are the YCSB names of the key numbers, and each write's value is its fields' bytes.
fn assert_well_formed(generator: &TxnGenerator, txn: &Txn) {
    let names = generator.workload().key_names();
    for (position, key) in txn.keys().enumerate() {
        assert_eq!(key, names.name(txn.key_numbers()[position]).as_bytes());
    }
    for write in txn.writes() {
        let joined: Vec<u8> = write.fields().flat_map(|field| field.value.iter().copied()).collect();
        assert_eq!(write.value, joined.as_slice());
        assert!(write.value.iter().all(|byte| (0x20..=0x7E).contains(byte)));
    }
}

#[test]
fn workload_a_forms_read_and_write_transactions() {
    let mut generator = generator(BuiltinWorkload::A, 101, 8);
    let mut txn = Txn::with_capacity(8, 1000);
    let draws = 20_000u32;
    let mut reads = 0u32;
    for _ in 0..draws {
        generator.next_txn(&mut txn).expect("no error");
        assert_eq!(txn.len(), 8);
        assert_distinct(&txn);
        assert_well_formed(&generator, &txn);
        assert!(txn.key_numbers().iter().all(|&number| number < 1000));
        match txn.kind() {
            TxnKind::ReadOnly => {
                reads += 1;
                assert_eq!(txn.operation(), Some(OperationKind::Read));
                assert!(!txn.writes_values());
            }
            TxnKind::WriteOnly => {
                assert_eq!(txn.operation(), Some(OperationKind::Update));
                assert_eq!(txn.writes().count(), 8);
                for write in txn.writes() {
                    // writeallfields=false: one field of fieldlength bytes.
                    assert_eq!(write.fields().count(), 1);
                    let field = write.fields().next().expect("one field");
                    assert!(field.index < 10);
                    assert_eq!(write.value.len(), 100);
                }
            }
            TxnKind::ReadThenWrite => panic!("workload A has no read-modify-write"),
        }
        generator.acknowledge(&txn).expect("no-op for reads and updates");
    }
    // One draw per transaction, every transaction 8 operations: operation shares equal the
    // transaction shares, 50/50.
    let share = f64::from(reads) / f64::from(draws);
    assert!((share - 0.5).abs() < 0.015, "read share {share}");
}

#[test]
fn workload_b_share_of_operations() {
    let mut generator = generator(BuiltinWorkload::B, 102, 4);
    let mut txn = Txn::new();
    let mut operations = [0u64; 2];
    for _ in 0..20_000 {
        generator.next_txn(&mut txn).expect("no error");
        let slot = usize::from(txn.kind() != TxnKind::ReadOnly);
        operations[slot] += txn.len() as u64;
    }
    let share = operations[0] as f64 / (operations[0] + operations[1]) as f64;
    assert!((share - 0.95).abs() < 0.01, "read operation share {share}");
}

#[test]
fn workload_f_read_modify_write_reads_and_writes_the_same_keys() {
    let mut generator = generator(BuiltinWorkload::F, 103, 8);
    let mut txn = Txn::new();
    let mut read_modify_writes = 0u32;
    for _ in 0..5_000 {
        generator.next_txn(&mut txn).expect("no error");
        assert_distinct(&txn);
        assert_well_formed(&generator, &txn);
        if txn.kind() == TxnKind::ReadThenWrite {
            read_modify_writes += 1;
            assert_eq!(txn.operation(), Some(OperationKind::ReadModifyWrite));
            let read_keys: Vec<&[u8]> = txn.keys().collect();
            let written_keys: Vec<&[u8]> = txn.writes().map(|write| write.key).collect();
            assert_eq!(read_keys, written_keys);
        }
    }
    assert!((2_300..2_700).contains(&read_modify_writes));
}

#[test]
fn workload_e_scans_are_unsupported_and_inserts_are_new_keys() {
    let mut generator = generator(BuiltinWorkload::E, 104, 8);
    let mut txn = Txn::new();
    let mut unsupported = 0u32;
    let mut next_insert = 1000u64;
    let draws = 10_000u32;
    for _ in 0..draws {
        match generator.next_txn(&mut txn) {
            Err(Error::Unsupported { operation, reason }) => {
                assert_eq!(operation, "scan");
                assert!(reason.contains("range scans"));
                unsupported += 1;
            }
            Ok(()) => {
                assert_eq!(txn.operation(), Some(OperationKind::Insert));
                assert_eq!(txn.kind(), TxnKind::WriteOnly);
                assert_well_formed(&generator, &txn);
                let expected: Vec<u64> = (next_insert..next_insert + 8).collect();
                assert_eq!(txn.key_numbers(), expected.as_slice());
                next_insert += 8;
                for write in txn.writes() {
                    // Inserts write every field.
                    let indexes: Vec<u64> = write.fields().map(|field| field.index).collect();
                    assert_eq!(indexes, (0..10).collect::<Vec<u64>>());
                    assert_eq!(write.value.len(), 1000);
                }
                generator.acknowledge(&txn).expect("first acknowledgement");
                assert!(matches!(generator.acknowledge(&txn), Err(Error::InvalidAcknowledgement { .. })));
            }
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    let share = f64::from(unsupported) / f64::from(draws);
    assert!((share - 0.95).abs() < 0.01, "scan share {share}");
    assert_eq!(generator.workload().last_inserted_key_number(), next_insert - 1);
}

#[test]
fn workload_d_reads_find_acknowledged_inserts() {
    let mut generator = generator(BuiltinWorkload::D, 105, 4);
    let mut txn = Txn::new();
    let mut newest_reads = 0u32;
    for _ in 0..20_000 {
        generator.next_txn(&mut txn).expect("no error");
        match txn.operation() {
            Some(OperationKind::Insert) => generator.acknowledge(&txn).expect("valid"),
            Some(OperationKind::Read) => {
                let last = generator.workload().last_inserted_key_number();
                assert!(txn.key_numbers().iter().all(|&number| number <= last));
                if last >= 1000 && txn.key_numbers().contains(&last) {
                    newest_reads += 1;
                }
            }
            other => panic!("unexpected operation {other:?}"),
        }
    }
    assert!(newest_reads > 1000, "latest favours the newest key: {newest_reads}");
}

#[test]
fn unacknowledged_inserts_end_in_an_error() {
    let mut config = BuiltinWorkload::D.config();
    config.proportions.read = 0.0;
    // 2^20 inserts: keep records tiny so the test stays fast.
    config.field_count = 1;
    config.field_length = 1;
    let seed = 106;
    println!("seed {seed}");
    let workload = CoreWorkload::new(config, seed).expect("valid");
    let mut generator = TxnGenerator::new(workload, 256).expect("valid");
    let mut txn = Txn::new();
    let window = rampkv_ycsb::limits::ACKNOWLEDGEMENT_WINDOW_KEYS;
    for _ in 0..window / 256 {
        generator.next_txn(&mut txn).expect("room");
    }
    assert!(matches!(generator.next_txn(&mut txn), Err(Error::TooManyUnacknowledgedInserts { .. })));
}

#[test]
fn load_transactions_cover_the_records_in_order() {
    let mut generator = generator(BuiltinWorkload::A, 107, 8);
    let mut txn = Txn::new();
    let mut loaded = Vec::new();
    while generator.next_load_txn(&mut txn) {
        assert_eq!(txn.operation(), Some(OperationKind::Insert));
        assert_well_formed(&generator, &txn);
        for write in txn.writes() {
            assert_eq!(write.fields().count(), 10);
        }
        loaded.extend_from_slice(txn.key_numbers());
        generator.acknowledge(&txn).expect("load needs no acknowledgement");
    }
    assert_eq!(loaded, (0..1000).collect::<Vec<u64>>());
    assert!(txn.is_empty());
    assert!(!generator.next_load_txn(&mut txn));
}

#[test]
fn same_seed_same_transactions() {
    let mut first = generator(BuiltinWorkload::A, 108, 8);
    let mut second = generator(BuiltinWorkload::A, 108, 8);
    let mut left = Txn::new();
    let mut right = Txn::new();
    for _ in 0..2_000 {
        first.next_txn(&mut left).expect("no error");
        second.next_txn(&mut right).expect("no error");
        assert_eq!(left.kind(), right.kind());
        assert!(left.keys().eq(right.keys()));
        assert!(left.writes().map(|write| write.value).eq(right.writes().map(|write| write.value)));
    }
}

#[test]
fn property_file_to_transactions() {
    let text = "# a small update-heavy workload\n\
                recordcount=500\noperationcount=10000\n\
                readproportion=0.5\nupdateproportion=0.5\n\
                requestdistribution=uniform\nwriteallfields=true\n\
                fieldcount=3\nfieldlength=16\ninsertorder=ordered\nzeropadding=6\n";
    let properties = Properties::parse(text).expect("valid file");
    let config = CoreWorkloadConfig::from_properties(&properties).expect("valid workload");
    let seed = 109;
    println!("seed {seed}");
    let mut generator = TxnGenerator::new(CoreWorkload::new(config, seed).expect("valid"), 5).expect("valid");
    let mut txn = Txn::new();
    for _ in 0..1_000 {
        generator.next_txn(&mut txn).expect("no error");
        for key in txn.keys() {
            assert!(key.starts_with(b"user"));
            assert_eq!(key.len(), 10, "user + 6 padded digits: {key:?}");
        }
        for write in txn.writes() {
            assert_eq!(write.fields().count(), 3);
            assert_eq!(write.value.len(), 48);
        }
    }
}

#[test]
fn bad_transaction_sizes_are_errors() {
    let workload = CoreWorkload::new(BuiltinWorkload::A.config(), 1).expect("valid");
    assert!(TxnGenerator::new(workload.clone(), 0).is_err());
    assert!(TxnGenerator::new(workload.clone(), 257).is_err());
    let mut small = BuiltinWorkload::A.config();
    small.record_count = 4;
    let workload = CoreWorkload::new(small, 1).expect("valid");
    assert!(TxnGenerator::new(workload, 5).is_err());
}

/// A zipfian key space barely larger than the transaction: distinct keys are still found, or
/// a bounded error value comes back, never a hang.
#[test]
fn skewed_small_key_space_is_bounded() {
    let mut config = BuiltinWorkload::C.config();
    config.record_count = 16;
    let seed = 110;
    println!("seed {seed}");
    let workload = CoreWorkload::new(config, seed).expect("valid");
    let mut generator = TxnGenerator::new(workload, 16).expect("valid");
    let mut txn = Txn::new();
    for _ in 0..20 {
        match generator.next_txn(&mut txn) {
            Ok(()) => assert_eq!(txn.len(), 16),
            Err(Error::DistinctKeysNotFound { wanted, .. }) => assert_eq!(wanted, 16),
            Err(other) => panic!("unexpected error {other}"),
        }
    }
}
