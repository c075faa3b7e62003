#!/usr/bin/env python3
"""Concurrent MSET/MGET through rampkv's RESP gateway with redis-py, recorded as a history.

Writer threads run MSETs and reader threads run MGETs over keys that live on different
partitions; every transaction becomes one line of a rampkv history (docs/history.md), which
`rampkv check FILE` (or `rampkv::checker::check_file`) checks for read atomicity. The Rust test
`tests/resp_atomicity.rs` runs this script against an in-process cluster and gateway.

Timestamps. A Redis client never learns the timestamp rampkv gives its MSET, so the history
uses a *write id* instead: `(writer + 1) << 32 | counter`, which every value of that MSET
carries in rampkv's check-value format (8-byte little-endian id, then a pattern derived from it,
docs/history.md "Check-mode values"). The checker orders the versions of a key by these ids, so
they must agree with the order in which rampkv applies the writes. They do because each writer
owns its group of keys: only one thread writes a key, its MSETs run one after another on one
connection, and so on one gateway session whose clock only moves forward. Readers read across
groups, which is where read atomicity across partitions is at stake. (Writers sharing keys would
need rampkv's timestamps in the history; Redis's MSET reply has no room for them.)

With `--multi` the same groups go through MULTI/EXEC (redis-py's `pipeline(transaction=True)`):
each writer's group is a queue of SETs (and sometimes an MSET of some of them) setting its keys
to one value, which the gateway runs as one RAMP write; half of the reads are a queue of GETs and
an MGET, which it runs as one read-atomic read, the other half plain MGETs. Either kind of read
seeing part of a group is a fractured read the checker reports.

Usage: resp_atomicity.py --port PORT [--reader-port PORT2] --history FILE [--seed N] [--multi] ...
The seed (printed) fixes every random choice; thread interleavings are up to the machine.
"""

import argparse
import json
import random
import sys
import threading
import time

try:
    import redis
except ImportError:
    sys.exit("resp_atomicity.py needs redis-py: python3 -m pip install redis (.ci/run installs it)")

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
VALUE_TS_CORRUPT = MASK64


def mix(z):
    """SplitMix64's finaliser, as in rampkv::history."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return z


def check_value(ts, length):
    """The bytes rampkv's fill_check_value(ts, buffer of `length`) writes."""
    seed = mix(ts ^ mix(length ^ GAMMA))
    words = [ts] + [mix((seed + (i + 1) * GAMMA) & MASK64) for i in range((length - 8 + 7) // 8)]
    return b"".join(word.to_bytes(8, "little") for word in words)[:length]


def value_ts(value):
    """What a reader records in value_ts: the verified id, 0 for absent, corrupt otherwise."""
    if value is None:
        return 0
    if len(value) < 8:
        return VALUE_TS_CORRUPT
    ts = int.from_bytes(value[:8], "little")
    return ts if check_value(ts, len(value)) == value else VALUE_TS_CORRUPT


def prefix_ts(value):
    """The write id a value claims (what the history's `reads` holds): 0 for absent."""
    if value is None:
        return 0
    return int.from_bytes(value[:8], "little") if len(value) >= 8 else VALUE_TS_CORRUPT


class Recorder:
    def __init__(self):
        self.t0 = time.monotonic_ns()
        self.lock = threading.Lock()
        self.lines = []

    def now(self):
        return time.monotonic_ns() - self.t0

    def add(self, records):
        with self.lock:
            self.lines.extend(json.dumps(r, separators=(",", ":")) for r in records)


def connect(port, thread_index):
    # Half of the threads speak RESP3 (HELLO 3), half RESP2.
    protocol = 3 if thread_index % 2 == 0 else 2
    return redis.Redis(host="127.0.0.1", port=port, protocol=protocol, socket_timeout=30)


def write_group(client, rng, keys, value):
    """One MULTI/EXEC setting every key of `keys` to `value`: SETs, and sometimes an MSET of
    some of them, queued in one write; the gateway runs them as one put_all."""
    with client.pipeline(transaction=True) as pipe:
        split = rng.randint(0, len(keys))
        if split >= 2:
            pipe.mset({key: value for key in keys[:split]})
        else:
            split = 0
        for key in keys[split:]:
            pipe.set(key, value)
        replies = pipe.execute()
    assert all(reply is True for reply in replies), replies


def read_group(client, rng, keys):
    """One MULTI/EXEC reading `keys` (GETs and one MGET of the rest), as one read-atomic read;
    the values in the order of `keys`."""
    split = rng.randint(0, len(keys))
    with client.pipeline(transaction=True) as pipe:
        for key in keys[:split]:
            pipe.get(key)
        if split < len(keys):
            pipe.mget(keys[split:])
        replies = pipe.execute()
    values = replies[:split]
    if split < len(keys):
        values.extend(replies[split])
    assert len(values) == len(keys), (keys, replies)
    return values


def writer(args, index, keys, recorder, seed, deadline, errors):
    rng = random.Random(seed * 1_000_003 + index)
    client = connect(args.port, index)
    records = []
    for counter in range(1, args.writes + 1):
        if time.monotonic() > deadline:
            break
        chosen = rng.sample(keys, rng.randint(2, len(keys)))
        write_id = ((index + 1) << 32) | counter
        value = check_value(write_id, args.value_bytes)
        start = recorder.now()
        ok = True
        try:
            if args.multi:
                write_group(client, rng, chosen, value)
            else:
                client.mset({key: value for key in chosen})
        # A timed-out write may still take effect: ok false. A wrong reply fails the run.
        except (redis.RedisError, AssertionError) as error:
            errors.append(f"writer {index}: {error}")
            ok = False
        end = recorder.now()
        records.append({"type": "write", "client": index, "ts": write_id, "keys": chosen,
                        "start_ns": start, "end_ns": end, "ok": ok})
    client.close()
    recorder.add(records)


def reader(args, index, groups, recorder, seed, deadline, errors):
    rng = random.Random(seed * 1_000_003 + index)
    # With a second gateway, every other reader uses it: its reads then race the writes from
    # another rampkv client, not only from other sessions of the same one.
    port = args.reader_port if args.reader_port and index % 2 == 1 else args.port
    client = connect(port, index)
    records = []
    for _ in range(args.reads):
        if time.monotonic() > deadline:
            break
        chosen = []
        for group in rng.sample(groups, rng.randint(2, min(3, len(groups)))):
            chosen.extend(rng.sample(group, rng.randint(1, len(group))))
        rng.shuffle(chosen)
        start = recorder.now()
        try:
            values = read_group(client, rng, chosen) if args.multi and rng.random() < 0.5 else client.mget(chosen)
        except (redis.RedisError, AssertionError) as error:
            errors.append(f"reader {index}: {error}")
            continue
        end = recorder.now()
        records.append({"type": "read", "client": index, "keys": chosen,
                        "reads": {k: prefix_ts(v) for k, v in zip(chosen, values)},
                        "value_ts": {k: value_ts(v) for k, v in zip(chosen, values)},
                        "start_ns": start, "end_ns": end, "ok": True})
    client.close()
    recorder.add(records)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reader-port", type=int, default=None,
                        help="a second gateway of the same cluster, for half of the readers")
    parser.add_argument("--history", required=True)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--keys-per-group", type=int, default=6)
    parser.add_argument("--writes", type=int, default=300, help="MSETs per writer")
    parser.add_argument("--reads", type=int, default=600, help="MGETs per reader")
    parser.add_argument("--value-bytes", type=int, default=32)
    parser.add_argument("--deadline-seconds", type=float, default=90.0)
    parser.add_argument("--multi", action="store_true",
                        help="writes and half of the reads as MULTI/EXEC (pipeline(transaction=True))")
    args = parser.parse_args()
    if args.writers < 2 or args.keys_per_group < 2 or args.value_bytes < 8:
        sys.exit("need at least 2 writers, 2 keys per group and 8-byte values")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"resp_atomicity.py: seed {seed}", flush=True)

    groups = [[f"w{g}:k{i}" for i in range(args.keys_per_group)] for g in range(args.writers)]
    recorder = Recorder()
    deadline = time.monotonic() + args.deadline_seconds
    errors = []
    threads = [threading.Thread(target=writer, args=(args, g, groups[g], recorder, seed, deadline, errors))
               for g in range(args.writers)]
    threads += [threading.Thread(target=reader,
                                 args=(args, args.writers + r, groups, recorder, seed, deadline, errors))
                for r in range(args.readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    with open(args.history, "w", encoding="utf-8") as history:
        history.write("\n".join(recorder.lines) + "\n")
    writes = sum(1 for line in recorder.lines if line.startswith('{"type":"write"'))
    kind = "MULTI/EXEC groups" if args.multi else "MSETs"
    print(f"resp_atomicity.py: {writes} {kind}, {len(recorder.lines) - writes} reads, "
          f"{len(errors)} errors, history {args.history}")
    for error in errors[:10]:
        print(f"  {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
