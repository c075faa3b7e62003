//! The hot path does not allocate: after a warm-up, drawing operations, formatting key names
//! and filling reused transaction buffers performs no heap allocation.
//!
//! A counting global allocator counts allocations made by this thread only (the test harness
//! may allocate on other threads meanwhile). This file holds one test so that nothing else
//! runs in this binary's process-wide allocator during the measurement.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use rampkv_ycsb::{BuiltinWorkload, CoreWorkload, MicroWorkload, Operation, Txn, TxnGenerator};

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call forwards to the system allocator unchanged; the counter is a
// const-initialized thread-local `Cell`, which needs no allocation to access.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|count| count.set(count.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` was allocated by `System` through `alloc` above.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|count| count.set(count.get() + 1));
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(pointer, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn hot_path_does_not_allocate() {
    let seed = 5150;
    println!("seed {seed}");

    // The counter sees this thread's allocations.
    let before = allocations();
    let boxed = std::hint::black_box(Box::new(7u64));
    assert!(allocations() > before, "the counting allocator counts");
    drop(boxed);

    // Operations and key names.
    let mut workload = CoreWorkload::new(BuiltinWorkload::D.config(), seed).expect("valid");
    let mut key_bytes = Vec::with_capacity(64);
    let before = allocations();
    for _ in 0..100_000 {
        let operation = workload.next_operation().expect("no error");
        key_bytes.clear();
        workload.key_names().append_name(operation.key_number(), &mut key_bytes);
        if let Operation::Insert { key_number } = operation {
            workload.acknowledge_insert(key_number).expect("valid");
        }
    }
    assert_eq!(allocations() - before, 0, "operations and key names");

    // Transactions into a reused buffer: warm up until the buffer has grown, then count.
    for builtin in [BuiltinWorkload::A, BuiltinWorkload::D, BuiltinWorkload::F] {
        let workload = CoreWorkload::new(builtin.config(), seed).expect("valid");
        let mut generator = TxnGenerator::new(workload, 8).expect("valid");
        let mut txn = Txn::with_capacity(8, 1000);
        let run = |count: u32, generator: &mut TxnGenerator, txn: &mut Txn| {
            for _ in 0..count {
                generator.next_txn(txn).expect("no error");
                generator.acknowledge(txn).expect("valid");
            }
        };
        run(1_000, &mut generator, &mut txn);
        let before = allocations();
        run(20_000, &mut generator, &mut txn);
        assert_eq!(allocations() - before, 0, "{builtin:?} transactions");
    }

    let mut micro = MicroWorkload::paper_default().generator(seed).expect("valid");
    let mut txn = Txn::with_capacity(8, 1024);
    for _ in 0..1_000 {
        micro.next_txn(&mut txn).expect("no error");
    }
    let before = allocations();
    for _ in 0..20_000 {
        micro.next_txn(&mut txn).expect("no error");
    }
    assert_eq!(allocations() - before, 0, "micro transactions");
}
