#!/usr/bin/env bash
# Runs every protocol at 95% and 50% reads (DESIGN configuration: 4 servers, 8 clients,
# 4 keys per transaction, 1,000 keys, 1 KiB values) and prints a Markdown table of throughput,
# p99 latency, round-2 cost and metadata size. Usage: scripts/protocols.sh [SECONDS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
seed=${2:-1}
cargo build --release -p rampkv --quiet
row=$(cat <<'PYTHON'
import json, sys
d = json.load(sys.stdin)
r = d['round2']
print(f"| {d['protocol']} | {d['config']['read_ratio']:.0%} | {d['throughput_txn_per_s']:,.0f} | {d['read']['p99_us']} "
      f"| {d['write']['p99_us']} | {r['round2_keys_per_read']:.4f} | {r['fraction_of_reads']:.3%} "
      f"| {r['metadata_bytes_per_item']:.1f} | {r['read_restarts']} |")
PYTHON
)
echo "| protocol | reads | txn/s | read p99 (µs) | write p99 (µs) | round-2 keys per read | reads needing round 2 | metadata B per item | aborts/restarts |"
echo "|---|---|---|---|---|---|---|---|---|"
for protocol in ramp-fast ramp-small ramp-hybrid s2pl nocc; do
  for reads in 0.95 0.5; do
    ./target/release/rampkv bench --protocol "$protocol" --read-ratio "$reads" --duration "${seconds}s" \
      --seed "$seed" --json 2>/dev/null | python3 -c "$row"
  done
done
