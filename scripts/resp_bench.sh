#!/usr/bin/env bash
# redis-benchmark against rampkv's RESP gateway and against a real redis-server, in one run.
#
# Starts `rampkv local --resp-port` (4 servers on one poller thread, the gateway on its own
# thread, all in one process) and `redis-server` (no persistence) on free loopback ports, then
# runs, for each round, each pipeline depth and each test, redis-benchmark against rampkv and
# right after against Redis (interleaved, so machine noise hits both alike; each round starts
# fresh processes, and who starts, is filled and runs first turns with the round: see the loop
# below). Tests: GET, SET, MSET10 and INCR are redis-benchmark's own (`-t get`, `-t set`, `-t mset`: 10 keys, `-t incr`:
# counters `counter:N` over the same KEYSPACE, not filled: each starts absent); MGET10, MGET4
# and MSET4 are custom commands (MGET of 10 or 4 random keys, MSET of 4). Before each pipeline
# depth of each round every key of the key space is written once, with single-key SETs, on
# each server (see fill below), so the reads read versions of the same shape and both hold the
# same keys. Prints a table (one line per round, test and depth, then the median ratio of each
# test and depth over the rounds) and writes it, with the configuration and git commit, to
# target/resp_bench/result.txt. Besides requests per second (which a machine shared with other
# work makes noisy) it prints the CPU time each server process spent per request during the
# run (utime + stime from /proc/PID/stat, all of its threads, in clock ticks of 1/CLK_TCK s)
# and the ratio of the two: what a request costs rampkv against Redis, steadier under load.
#
# With BASE_BIN=path/to/another/rampkv (a build of main, say) a third server runs that binary
# beside the two, interleaved the same way, and the table adds its rate, the ratio of rampkv to
# it and the ratio of their CPU per request (steadier than the rates when the client, not the
# server, is the bottleneck): before and after a change, measured side by side in one run.
#
# An MSET test that follows a read test (GET, MGET) waits until the reads are READS_SETTLE_S
# (default 11) seconds old: rampkv keeps the versions an MSET supersedes for the GC grace
# period (10 s) while a reader may still come back for them in round 2, and a key read in
# the last 10 s may have one. Right after a run of reads over the whole key space an MSET run
# therefore holds ten seconds of versions (about 5 GB at 50,000 MSETs of 10 KiB a second),
# which is RAMP's cost, not the command's: READS_SETTLE_S=0 measures it (docs/performance.md).
# SET needs no wait: a version alone in its write set goes as soon as it is superseded.
#
# Usage: scripts/resp_bench.sh [REQUESTS] (default 100000). Environment: CLIENTS (8),
# VALUE_BYTES (1024), KEYSPACE (100000), PIPELINES ("1 16"), TESTS ("GET SET MGET10 MSET10 INCR"),
# ROUNDS (1), FRONT (ring: `rampkv local`'s default front end, with GET* item slots; none:
# without), RAMPKV_BIN (a built binary: no build), BASE_BIN (see above).
#
# Memory mode: scripts/resp_bench.sh --memory [REQUESTS] (default 300000). Loads each server in
# turn with redis-benchmark -t set -n REQUESTS -r KEYSPACE (default 100000) -d VALUE_BYTES at
# its default 50 clients and -P 1 (LOAD=mset: -t mset instead, MSETs of 10 keys), then writes
# every key of the key space once more, so that each holds exactly KEYSPACE keys; waits past
# rampkv's GC grace period (SETTLE_S, default 22: the 10 s grace plus 12 s for the background
# sweep), then reads each process's resident set from /proc/PID/status (and, for rampkv, how
# much of it is shared memory: the one-sided front end's item slots), counts the keys each
# holds (Redis: DBSIZE; rampkv: EXISTS over the whole key space) and prints the bytes per key
# and the ratio. Writes target/resp_bench/memory.txt.
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
  REQUESTS="${1:-300000}"
else
  REQUESTS="${1:-100000}"
fi
KEYSPACE="${KEYSPACE:-100000}"
CLIENTS="${CLIENTS:-8}"
VALUE_BYTES="${VALUE_BYTES:-1024}"
PIPELINES="${PIPELINES:-1 16}"
TESTS="${TESTS:-GET SET MGET10 MSET10 INCR}"
ROUNDS="${ROUNDS:-1}"
FRONT="${FRONT:-ring}"
SETTLE_S="${SETTLE_S:-22}"
LOAD="${LOAD:-set}"
READS_SETTLE_S="${READS_SETTLE_S:-11}"
BASE_BIN="${BASE_BIN:-}"
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
TAKEN=()
new_port() {
  local port
  port=$(free_port)
  while [[ " ${TAKEN[*]:-} " == *" $port "* ]]; do port=$(free_port); done
  echo "$port"
}
RAMPKV_PORT=$(new_port); TAKEN+=("$RAMPKV_PORT")
REDIS_PORT=$(new_port); TAKEN+=("$REDIS_PORT")
BARE_PORT=$(new_port); TAKEN+=("$BARE_PORT")
BASE_PORT=$(new_port); TAKEN+=("$BASE_PORT")

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

start_rampkv() {
  "$RAMPKV" local --front "$FRONT" --cluster-file "$OUT_DIR/cluster.toml" --resp-port "$RAMPKV_PORT" 2>"$OUT_DIR/rampkv.log" &
  RAMPKV_PID=$!
  PIDS+=("$RAMPKV_PID")
}
start_redis() {
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT_DIR/redis.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
}
# The same cluster without the one-sided front end (no item slots: RESP does not use them).
start_bare() {
  "$RAMPKV" local --front none --cluster-file "$OUT_DIR/cluster-bare.toml" --resp-port "$BARE_PORT" 2>"$OUT_DIR/rampkv-bare.log" &
  BARE_PID=$!
  PIDS+=("$BARE_PID")
}
start_base() {
  "$BASE_BIN" local --front "$FRONT" --cluster-file "$OUT_DIR/cluster-base.toml" --resp-port "$BASE_PORT" 2>"$OUT_DIR/rampkv-base.log" &
  BASE_PID=$!
  PIDS+=("$BASE_PID")
}
port_of() {
  case "$1" in
    rampkv) echo "$RAMPKV_PORT" ;;
    redis) echo "$REDIS_PORT" ;;
    bare) echo "$BARE_PORT" ;;
    base) echo "$BASE_PORT" ;;
  esac
}

wait_for() {
  for _ in $(seq 1 100); do
    if [ "$(redis-cli -p "$1" PING 2>/dev/null)" = "PONG" ]; then return 0; fi
    sleep 0.1
  done
  echo "resp_bench.sh: nothing answers PING on port $1" >&2
  exit 1
}

# Starts the named servers in the order given and waits until each answers.
start_servers() {
  local server
  for server in "$@"; do "start_$server"; done
  for server in "$@"; do wait_for "$(port_of "$server")"; done
}

# Stops every server started, and waits for them to go.
stop_servers() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}

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

# Writes every key of the key space once (redis-benchmark's names for -r, values of
# VALUE_BYTES) on the server on port $1: single-key SETs, pipelined through redis-cli --pipe.
fill() {
  python3 - "$KEYSPACE" "$VALUE_BYTES" <<'PYTHON' | redis-cli -p "$1" --pipe >/dev/null
import sys
keyspace, value_bytes = int(sys.argv[1]), int(sys.argv[2])
value = b"x" * value_bytes
out = sys.stdout.buffer
for index in range(keyspace):
    key = b"key:%012d" % index
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value))
PYTHON
}

if [ "$MODE" = memory ]; then
  start_servers rampkv redis bare
  NAMES=("rampkv" "rampkv --front none" "redis-server")
  PORTS=("$RAMPKV_PORT" "$BARE_PORT" "$REDIS_PORT")
  SERVER_PIDS=("$RAMPKV_PID" "$BARE_PID" "$REDIS_PID")
  idle=() loaded=()
  for index in 0 1 2; do idle+=("$(status_kb "${SERVER_PIDS[$index]}" VmRSS)"); done
  for index in 0 1 2; do
    redis-benchmark -p "${PORTS[$index]}" -n "$REQUESTS" -r "$KEYSPACE" -d "$VALUE_BYTES" -t "$LOAD" -q >/dev/null
    fill "${PORTS[$index]}"
    loaded+=("$(status_kb "${SERVER_PIDS[$index]}" VmRSS)")
  done
  sleep "$SETTLE_S"
  RESULT="$OUT_DIR/memory.txt"
  {
    echo "# resp_bench.sh --memory $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
    echo "# load on each in turn: redis-benchmark -t $LOAD -n $REQUESTS -r $KEYSPACE -d $VALUE_BYTES (50 clients, -P 1), then every one of the $KEYSPACE keys SET once; RSS read ${SETTLE_S} s after the last"
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
    MSET10) output=$(redis-benchmark "${common[@]}" -d "$VALUE_BYTES" -t mset) ;;
    INCR) output=$(redis-benchmark "${common[@]}" -t incr) ;;
    MGET4) output=$(redis-benchmark "${common[@]}" MGET "$KEY" "$KEY" "$KEY" "$KEY") ;;
    MGET10) output=$(redis-benchmark "${common[@]}" MGET "$KEY" "$KEY" "$KEY" "$KEY" "$KEY" "$KEY" "$KEY" "$KEY" "$KEY" "$KEY") ;;
    MSET4) output=$(redis-benchmark "${common[@]}" MSET "$KEY" "$VALUE" "$KEY" "$VALUE" "$KEY" "$VALUE" "$KEY" "$VALUE") ;;
    *) echo "resp_bench.sh: unknown test $test" >&2; exit 2 ;;
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

RESULT="$OUT_DIR/result.txt"
LINES="$OUT_DIR/result.lines"
: >"$LINES"
{
  echo "# resp_bench.sh $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
  echo "# redis-benchmark $(redis-benchmark --version | awk '{print $2}'): -n $REQUESTS -c $CLIENTS -r $KEYSPACE, values $VALUE_BYTES B, $ROUNDS round(s), an MSET test waits until reads are ${READS_SETTLE_S} s old; redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2) (no persistence)"
  echo "# rampkv: rampkv local --front $FRONT --resp-port (4 servers on 1 poller thread + gateway thread, RAMP-Fast), loopback${BASE_BIN:+; base: $BASE_BIN}"
  printf "| %5s | %-6s | %8s | %12s | %12s | %7s | %13s | %13s | %13s | %12s | %9s |" round test pipeline "rampkv req/s" "redis req/s" ratio \
    "rampkv p50 ms" "redis p50 ms" "rampkv µs/req" "redis µs/req" "CPU ratio"
  if [ -n "$BASE_BIN" ]; then printf " %10s | %9s | %11s |" "base req/s" "to base" "CPU to base"; fi
  printf "\n|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|" ------- -------- ---------- -------------- -------------- --------- --------------- \
    --------------- --------------- -------------- -----------
  if [ -n "$BASE_BIN" ]; then printf "%s|%s|%s|" ------------ ----------- -------------; fi
  printf "\n"
} | tee "$RESULT"
SERVERS=(rampkv redis)
if [ -n "$BASE_BIN" ]; then SERVERS+=(base); fi
for round in $(seq 1 "$ROUNDS"); do
  # Fresh processes each round, started in an order that turns with the round: a process's
  # speed depends on where its memory lands (of three instances of one build, started one
  # after the other, the last ran GET -P 16 3-10% faster, round after round), and on whether
  # it runs first in a test (docs/performance.md, "seventh look"); over the rounds each server
  # is started first, and runs first, in turn.
  turn=$(((round - 1) % ${#SERVERS[@]}))
  ORDER=("${SERVERS[@]:turn}" "${SERVERS[@]:0:turn}")
  start_servers "${ORDER[@]}"
  unset READ_AT # no reads yet in these processes
  for pipeline in $PIPELINES; do
    for server in "${ORDER[@]}"; do fill "$(port_of "$server")"; done
    for test in $TESTS; do
      case "$test" in
        MSET*)
          if [ -n "${READ_AT:-}" ]; then
            wait_s=$((READ_AT + READS_SETTLE_S - $(date +%s)))
            if [ "$wait_s" -gt 0 ]; then sleep "$wait_s"; fi
          fi
          ;;
      esac
      rampkv_line="" redis_line="" base_line="0 0 0"
      for server in "${ORDER[@]}"; do
        case "$server" in
          rampkv) rampkv_line=$(bench "$RAMPKV_PORT" "$pipeline" "$test" "$RAMPKV_PID") ;;
          redis) redis_line=$(bench "$REDIS_PORT" "$pipeline" "$test" "$REDIS_PID") ;;
          base) base_line=$(bench "$BASE_PORT" "$pipeline" "$test" "$BASE_PID") ;;
        esac
      done
      read -r base_rps _ base_cpu <<<"$base_line"
      read -r rampkv_rps rampkv_p50 rampkv_cpu <<<"$rampkv_line"
      read -r redis_rps redis_p50 redis_cpu <<<"$redis_line"
      ratio=$(awk -v a="$rampkv_rps" -v b="$redis_rps" 'BEGIN { printf "%.2f", a / b }')
      # CPU per request, rampkv over Redis (above 1: rampkv spends more).
      cpu_ratio=$(awk -v a="$rampkv_cpu" -v b="$redis_cpu" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
      base_ratio=$(awk -v a="$rampkv_rps" -v b="$base_rps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
      # CPU per request, rampkv over the base build (below 1: the change saves CPU).
      base_cpu_ratio=$(awk -v a="$rampkv_cpu" -v b="$base_cpu" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
      echo "$test $pipeline $ratio $cpu_ratio $base_ratio $base_cpu_ratio" >>"$LINES"
      case "$test" in
        GET | MGET*) READ_AT=$(date +%s) ;;
      esac
      {
        printf "| %5s | %-6s | %8s | %12.0f | %12.0f | %7s | %13s | %13s | %13s | %12s | %9s |" \
          "$round" "$test" "$pipeline" "$rampkv_rps" "$redis_rps" "$ratio" "$rampkv_p50" "$redis_p50" \
          "$rampkv_cpu" "$redis_cpu" "$cpu_ratio"
        if [ -n "$BASE_BIN" ]; then printf " %10.0f | %9s | %11s |" "$base_rps" "$base_ratio" "$base_cpu_ratio"; fi
        printf "\n"
      } | tee -a "$RESULT"
    done
  done
  stop_servers
done
if [ "$ROUNDS" -gt 1 ]; then
  {
    echo
    echo "# medians over the $ROUNDS rounds (the range in brackets)"
    printf "| %-6s | %8s | %18s | %18s |%s\n" test pipeline "ratio to redis" "CPU ratio" "${BASE_BIN:+ ratio to base | CPU to base |}"
    for pipeline in $PIPELINES; do
      for test in $TESTS; do
        awk -v test="$test" -v pipeline="$pipeline" -v base="${BASE_BIN:+1}" '
          function median(values, count,   i, j, swap) {
            for (i = 1; i <= count; i++) for (j = i + 1; j <= count; j++)
              if (values[j] < values[i]) { swap = values[i]; values[i] = values[j]; values[j] = swap }
            return count % 2 ? values[(count + 1) / 2] : (values[count / 2] + values[count / 2 + 1]) / 2
          }
          $1 == test && $2 == pipeline { n++; ratio[n] = $3; cpu[n] = $4; to_base[n] = $5; cpu_to_base[n] = $6 }
          END {
            if (n == 0) exit
            printf "| %-6s | %8s | %5.2f [%4.2f-%4.2f] | %5.2f [%4.2f-%4.2f] |", test, pipeline,
              median(ratio, n), ratio[1], ratio[n], median(cpu, n), cpu[1], cpu[n]
            if (base) printf " %5.2f [%4.2f-%4.2f] | %5.2f [%4.2f-%4.2f] |", median(to_base, n), to_base[1], to_base[n],
              median(cpu_to_base, n), cpu_to_base[1], cpu_to_base[n]
            printf "\n"
          }' "$LINES"
      done
    done
  } | tee -a "$RESULT"
fi
