#!/usr/bin/env bash
# The test command (README: "Run the tests"; CI runs it too).
# Unit, property and integration tests of every crate, then the loom models of the
# concurrency-critical fabric code, then a smoke run of the benchmark with the checker.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo nextest run --workspace --no-fail-fast

echo "== loom (fabric: item-slot seqlock, message ring)"
RUSTFLAGS="--cfg loom" cargo test -p rampkv-fabric --release --target-dir target/loom --lib loom

echo "== benchmark smoke run with the read-atomicity checker"
cargo run --release -p rampkv -- bench --duration 3s --check --seed 1
