#!/usr/bin/env bash
# redis-benchmark against rampkv's RESP gateway and against a real redis-server, in one run.
#
# Starts `rampkv local --resp-port` (4 servers on one poller thread, the gateway on its own
# thread, all in one process) and `redis-server` (no persistence) on free loopback ports, then
# runs, for each pipeline depth and each test, redis-benchmark against rampkv and right after
# against Redis (interleaved, so machine noise hits both alike): GET, MGET of 4 keys, SET and
# MSET of 4 keys (GET and SET are redis-benchmark's own tests; MGET and MSET are custom
# commands, as its `-t mset` is 10 keys). Reads run first, on a key space rewritten by
# single-key SETs (see prefill below). Prints a table and writes it, with the configuration and git commit, to
# target/resp_bench/result.txt. Besides requests per second (which a machine shared with other
# work makes noisy) it prints the CPU time each server process spent per request during the run
# (utime + stime from /proc/PID/stat, all of its threads, in clock ticks of 1/CLK_TCK s) and the
# ratio of the two: what a request costs rampkv against Redis, steadier under load.
#
# Usage: scripts/resp_bench.sh [REQUESTS] (default 100000). Environment: CLIENTS (8),
# VALUE_BYTES (1024), KEYSPACE (10000), PIPELINES ("1 16"), TESTS ("GET MGET4 SET MSET4"), FRONT
# (ring: `rampkv local`'s default front end, with GET* item slots; none: without),
# RAMPKV_BIN (a built binary: no build).
#
# Memory mode: scripts/resp_bench.sh --memory [REQUESTS] (default 200000). Writes both with the
# same load, redis-benchmark -t set -n REQUESTS -r KEYSPACE (default 100000) -d VALUE_BYTES at its
# default 50 clients and -P 1, waits past rampkv's GC grace period (SETTLE_S, default 22: the
# 10 s grace plus 12 s for the background sweep), then reads both processes' resident set from
# /proc/PID/status (and, for rampkv, how much of it is shared memory: the one-sided front end's
# item slots), counts the keys each holds (Redis: DBSIZE; rampkv: EXISTS over the whole key
# space) and prints the bytes per key and the ratio. Writes target/resp_bench/memory.txt.
#
# Needs redis-tools, redis-server and python3 (.ci/run installs them). Kills what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=speed
if [ "${1:-}" = "--memory" ]; then
  MODE=memory
  shift
fi
if [ "$MODE" = memory ]; then
  REQUESTS="${1:-200000}"
  KEYSPACE="${KEYSPACE:-100000}"
else
  REQUESTS="${1:-100000}"
  KEYSPACE="${KEYSPACE:-10000}"
fi
CLIENTS="${CLIENTS:-8}"
VALUE_BYTES="${VALUE_BYTES:-1024}"
PIPELINES="${PIPELINES:-1 16}"
TESTS="${TESTS:-GET MGET4 SET MSET4}"
FRONT="${FRONT:-ring}"
SETTLE_S="${SETTLE_S:-22}"
OUT_DIR=target/resp_bench
mkdir -p "$OUT_DIR"

for tool in redis-benchmark redis-cli redis-server python3; do
  command -v "$tool" >/dev/null || { echo "resp_bench.sh: $tool is missing (apt-get install redis-tools redis-server)" >&2; exit 2; }
done

if [ -z "${RAMPKV_BIN:-}" ]; then
  cargo build --release -q -p rampkv --bin rampkv
fi
RAMPKV="${RAMPKV_BIN:-target/release/rampkv}"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
RAMPKV_PORT=$(free_port)
REDIS_PORT=$(free_port)
while [ "$REDIS_PORT" = "$RAMPKV_PORT" ]; do REDIS_PORT=$(free_port); done
BARE_PORT=$(free_port)
while [ "$BARE_PORT" = "$RAMPKV_PORT" ] || [ "$BARE_PORT" = "$REDIS_PORT" ]; do BARE_PORT=$(free_port); done

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

"$RAMPKV" local --front "$FRONT" --cluster-file "$OUT_DIR/cluster.toml" --resp-port "$RAMPKV_PORT" 2>"$OUT_DIR/rampkv.log" &
RAMPKV_PID=$!
PIDS+=("$RAMPKV_PID")
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT_DIR/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
if [ "$MODE" = memory ]; then
  # The same cluster without the one-sided front end (no item slots: RESP does not use them).
  "$RAMPKV" local --front none --cluster-file "$OUT_DIR/cluster-bare.toml" --resp-port "$BARE_PORT" 2>"$OUT_DIR/rampkv-bare.log" &
  BARE_PID=$!
  PIDS+=("$BARE_PID")
fi

wait_for() {
  for _ in $(seq 1 100); do
    if [ "$(redis-cli -p "$1" PING 2>/dev/null)" = "PONG" ]; then return 0; fi
    sleep 0.1
  done
  echo "resp_bench.sh: nothing answers PING on port $1" >&2
  exit 1
}
wait_for "$RAMPKV_PORT"
wait_for "$REDIS_PORT"
if [ "$MODE" = memory ]; then wait_for "$BARE_PORT"; fi

# A field of /proc/PID/status in KB (VmRSS, RssAnon, RssShmem...).
status_kb() {
  awk -v field="$2:" '$1 == field { print $2 }' "/proc/$1/status"
}

# How many of the key space's keys the server on port $1 holds: EXISTS of 250 keys at a time,
# pipelined (the key names are redis-benchmark's for -r).
count_keys() {
  python3 - "$KEYSPACE" <<'PYTHON' | redis-cli -p "$1" | awk '{ sum += $1 } END { print sum }'
import sys
keyspace = int(sys.argv[1])
for start in range(0, keyspace, 250):
    print("EXISTS " + " ".join("key:%012d" % index for index in range(start, min(start + 250, keyspace))))
PYTHON
}

if [ "$MODE" = memory ]; then
  NAMES=("rampkv" "rampkv --front none" "redis-server")
  PORTS=("$RAMPKV_PORT" "$BARE_PORT" "$REDIS_PORT")
  SERVER_PIDS=("$RAMPKV_PID" "$BARE_PID" "$REDIS_PID")
  idle=() loaded=()
  for index in 0 1 2; do idle+=("$(status_kb "${SERVER_PIDS[$index]}" VmRSS)"); done
  for index in 0 1 2; do
    redis-benchmark -p "${PORTS[$index]}" -n "$REQUESTS" -r "$KEYSPACE" -d "$VALUE_BYTES" -t set -q >/dev/null
    loaded+=("$(status_kb "${SERVER_PIDS[$index]}" VmRSS)")
  done
  sleep "$SETTLE_S"
  RESULT="$OUT_DIR/memory.txt"
  {
    echo "# resp_bench.sh --memory $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty')"
    echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
    echo "# load on each in turn: redis-benchmark -t set -n $REQUESTS -r $KEYSPACE -d $VALUE_BYTES (50 clients, -P 1); RSS read ${SETTLE_S} s after the last"
    echo "# rampkv local --resp-port: 4 servers, RAMP-Fast, GC grace 10 s; default front end: ring, with item slots; redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2), no persistence"
    printf "| %-19s | %6s | %8s | %13s | %7s | %13s | %9s | %8s |\n" server keys "idle MB" "after load MB" "RSS MB" "of it shmem MB" "KB / key" "to redis"
    printf "|%s|%s|%s|%s|%s|%s|%s|%s|\n" --------------------- -------- ---------- --------------- --------- ---------------- ----------- ----------
  } | tee "$RESULT"
  # RSS of each now (then keys counted: counting reads, which could only add to RSS).
  now=() shmem=() keys=()
  for index in 0 1 2; do
    now+=("$(status_kb "${SERVER_PIDS[$index]}" VmRSS)")
    shmem+=("$(status_kb "${SERVER_PIDS[$index]}" RssShmem)")
  done
  keys=("$(count_keys "$RAMPKV_PORT")" "$(count_keys "$BARE_PORT")" "$(redis-cli -p "$REDIS_PORT" DBSIZE)")
  redis_per_key=$(awk -v kb="${now[2]}" -v n="${keys[2]}" 'BEGIN { print kb / n }')
  for index in 0 1 2; do
    awk -v name="${NAMES[$index]}" -v n="${keys[$index]}" -v idle="${idle[$index]}" -v loaded="${loaded[$index]}" \
        -v kb="${now[$index]}" -v shmem="${shmem[$index]}" -v redis="$redis_per_key" 'BEGIN {
      printf "| %-19s | %6d | %8.1f | %13.1f | %7.1f | %14.1f | %9.2f | %7.2fx |\n",
        name, n, idle / 1024, loaded / 1024, kb / 1024, shmem / 1024, kb / n, (kb / n) / redis
    }' | tee -a "$RESULT"
  done
  exit 0
fi

VALUE=$(head -c "$VALUE_BYTES" /dev/zero | tr '\0' 'x')
KEY='key:__rand_int__'

# CPU time of process $1 so far (user + system, all threads), in clock ticks. The command name
# (field 2) is in parentheses and has no spaces here, so the fields split on spaces.
cpu_ticks() {
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}
TICKS_PER_S=$(getconf CLK_TCK)

# One redis-benchmark run against the server on port $1 (process $4); prints "rps p50_ms
# cpu_us_per_request".
bench() {
  local port=$1 pipeline=$2 test=$3 pid=$4
  local cpu_before
  cpu_before=$(cpu_ticks "$pid")
  local common=(-p "$port" -n "$REQUESTS" -c "$CLIENTS" -r "$KEYSPACE" -P "$pipeline" --csv)
  local output
  case "$test" in
    GET) output=$(redis-benchmark "${common[@]}" -d "$VALUE_BYTES" -t get) ;;
    SET) output=$(redis-benchmark "${common[@]}" -d "$VALUE_BYTES" -t set) ;;
    MGET4) output=$(redis-benchmark "${common[@]}" MGET "$KEY" "$KEY" "$KEY" "$KEY") ;;
    MSET4) output=$(redis-benchmark "${common[@]}" MSET "$KEY" "$VALUE" "$KEY" "$VALUE" "$KEY" "$VALUE" "$KEY" "$VALUE") ;;
  esac
  if grep -q "ERR" <<<"$output"; then
    echo "resp_bench.sh: errors from port $port in $test: $output" >&2
    exit 1
  fi
  local cpu_us
  cpu_us=$(awk -v ticks=$(($(cpu_ticks "$pid") - cpu_before)) -v hz="$TICKS_PER_S" -v n="$REQUESTS" \
    'BEGIN { printf "%.2f", ticks * 1e6 / hz / n }')
  # CSV: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
  grep -v '^"test"' <<<"$output" | tail -1 | awk -F'","' -v cpu="$cpu_us" '{ print $2, $5, cpu }'
}

# Before each pipeline depth, (re)write the key space on both with single-key SETs, without
# pipelining, so that every read test reads versions of the same shape. (RAMP-Fast stores each
# version with its transaction's write set: versions written by MSET, or by pipelined SETs that
# the gateway batches into one transaction, make later reads of them dearer.)
prefill() {
  for port in "$RAMPKV_PORT" "$REDIS_PORT"; do
    redis-benchmark -p "$port" -n $((KEYSPACE * 5)) -c "$CLIENTS" -r "$KEYSPACE" -d "$VALUE_BYTES" -t set -q >/dev/null
  done
}

RESULT="$OUT_DIR/result.txt"
{
  echo "# resp_bench.sh $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty')"
  echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
  echo "# redis-benchmark $(redis-benchmark --version | awk '{print $2}'): -n $REQUESTS -c $CLIENTS -r $KEYSPACE, values $VALUE_BYTES B; redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2) (no persistence)"
  echo "# rampkv: rampkv local --front $FRONT --resp-port (4 servers on 1 poller thread + gateway thread, RAMP-Fast), loopback"
  printf "| %-6s | %8s | %12s | %12s | %7s | %13s | %13s | %13s | %12s | %9s |\n" test pipeline "rampkv req/s" "redis req/s" ratio \
    "rampkv p50 ms" "redis p50 ms" "rampkv µs/req" "redis µs/req" "CPU ratio"
  printf "|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n" -------- ---------- -------------- -------------- --------- --------------- \
    --------------- --------------- -------------- -----------
} | tee "$RESULT"
for pipeline in $PIPELINES; do
  prefill
  for test in $TESTS; do
    rampkv_line=$(bench "$RAMPKV_PORT" "$pipeline" "$test" "$RAMPKV_PID")
    redis_line=$(bench "$REDIS_PORT" "$pipeline" "$test" "$REDIS_PID")
    read -r rampkv_rps rampkv_p50 rampkv_cpu <<<"$rampkv_line"
    read -r redis_rps redis_p50 redis_cpu <<<"$redis_line"
    ratio=$(awk -v a="$rampkv_rps" -v b="$redis_rps" 'BEGIN { printf "%.2f", a / b }')
    # CPU per request, rampkv over Redis (above 1: rampkv spends more).
    cpu_ratio=$(awk -v a="$rampkv_cpu" -v b="$redis_cpu" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    printf "| %-6s | %8s | %12.0f | %12.0f | %7s | %13s | %13s | %13s | %12s | %9s |\n" \
      "$test" "$pipeline" "$rampkv_rps" "$redis_rps" "$ratio" "$rampkv_p50" "$redis_p50" \
      "$rampkv_cpu" "$redis_cpu" "$cpu_ratio" | tee -a "$RESULT"
  done
done
