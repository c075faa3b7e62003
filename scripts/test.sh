#!/usr/bin/env bash
# The test command (README: "Run the tests"; CI runs it too).
# Unit, property and integration tests of every crate, then the loom models of the
# concurrency-critical fabric code, then smoke runs of every benchmark (checked where they
# record histories), so none can rot.
set -euo pipefail
cd "$(dirname "$0")/.."

# The RESP tests drive real Redis tools; install what a fresh machine lacks (Debian packages and
# PyPI, as root). They fail rather than skip without them.
echo "== tools of the RESP tests: redis-cli, redis-benchmark, redis-server, redis-py"
if ! command -v redis-cli >/dev/null || ! command -v redis-benchmark >/dev/null || ! command -v redis-server >/dev/null; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-tools redis-server
fi
if ! python3 -c "import redis" 2>/dev/null; then
  python3 -m pip install --quiet redis
fi

cargo nextest run --workspace --no-fail-fast

echo "== loom (fabric: item-slot seqlock, message ring, send/recv queue pair)"
RUSTFLAGS="--cfg loom" cargo test -p rampkv-fabric --release --target-dir target/loom --lib loom

echo "== benchmark smoke runs (with the read-atomicity checker)"
cargo run --release -p rampkv -- bench --duration 3s --check --seed 1
cargo run --release -p rampkv -- bench --compare --duration 2s --check --seed 1
cargo run --release -p rampkv -- bench --workload a --keys 1000 --txns 2000 --check --ycsb --seed 1
# YCSB over GET*: versions fit the item slots fitted to the workload (reads come from slots).
cargo run --release -p rampkv -- bench --workload a --transport onesided --txn-size 8 --keys 1000 --txns 2000 --check --seed 1
# The paper's four figures in quick mode (about 30 points of 0.3 s, each checked): plots,
# tables and results under target/figures-smoke (see docs/figures.md).
cargo run --release -p rampkv -- figures --quick --check --out target/figures-smoke
cargo bench -p rampkv-ycsb --bench generate -- --test
cargo run --release -p rampkv-fabric --example rpc_bench -- --quick
# The persistence engine's micro-benchmark (append throughput per fsync policy, restart time).
cargo run --release -p rampkv-durable --example durable_bench -- --quick --dir target
