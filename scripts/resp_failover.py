#!/usr/bin/env python3
"""MSET/MGET of key groups through rampkv's RESP gateway while servers fail over (issue 30).

Client threads run a closed loop of MSETs and MGETs over groups of keys that span partitions;
the caller (crates/rampkv/tests/gateway_failover.rs, or a person) kills server processes with
SIGKILL meanwhile and restarts them. Every MSET writes one value to every key of its group,
`<group>:<n>` with `n` counting the group's writes, so a read of a group shows which write it
saw on each key. Each group is written by one thread only, so the checks need no timestamps:
- **lost**: an MGET that returned an older write than one acknowledged before it started;
- **fractured**: an MGET that saw two different writes of one group (read atomicity);
- **phantom**: a value no MSET of this run sent;
- **unreadable**: a group that cannot be read back at the end (within `--final-read-s`).
It also measures the **longest window with no successful command** (from the first command to
the end of the run, across all threads) and counts the errors by their first word
(`TRYAGAIN`, `CLUSTERDOWN`, `ERR`, or the exception's name for connection failures).

An MSET that failed may or may not have taken effect (as with any store), so a later read may
see it: that is not counted as anything.

Prints one JSON object (the summary) on stdout. Exit status 0 unless the script itself failed.
Usage: resp_failover.py --port PORT --duration SECONDS [--threads 4] [--groups 24] [--seed N]
"""

import argparse
import json
import random
import sys
import threading
import time

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:
    sys.exit("resp_failover.py needs redis-py: python3 -m pip install redis (.ci/run installs it)")


def group_keys(group, keys_per_group):
    return [f"failover:g{group}:k{index}" for index in range(keys_per_group)]


class State:
    """What every thread shares: per group, the last write acknowledged and the last sent."""

    def __init__(self, groups):
        self.lock = threading.Lock()
        self.acknowledged = [0] * groups
        self.sent = [0] * groups
        self.successes = []  # monotonic times of successful commands, all threads
        self.errors = {}
        self.first_errors = []
        self.lost = []
        self.fractured = []
        self.phantom = []
        self.mset_ok = 0
        self.mget_ok = 0

    def error(self, kind, text):
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            if len(self.first_errors) < 20:
                self.first_errors.append(f"{time.monotonic() - START:.3f}s {text}")


START = time.monotonic()


def classify(error):
    """TRYAGAIN, CLUSTERDOWN, ERR... for a server error; the exception's name otherwise."""
    if isinstance(error, redis.exceptions.ResponseError) or type(error).__name__ in (
        "TryAgainError",
        "ClusterDownError",
    ):
        words = str(error).split()
        name = type(error).__name__
        if name == "TryAgainError":
            return "TRYAGAIN"
        if name == "ClusterDownError":
            return "CLUSTERDOWN"
        return words[0] if words else "ERR"
    return type(error).__name__


def check_read(state, group, values, acknowledged_before, where):
    """Checks one read of a group; returns the write it saw (0: none)."""
    written = [None if value is None else value.decode() for value in values]
    if all(value is None for value in written):
        if acknowledged_before > 0:
            state.lost.append(f"{where}: group {group} read nothing, write {acknowledged_before} was acknowledged")
        return 0
    if any(value is None for value in written) or len(set(written)) != 1:
        state.fractured.append(f"{where}: group {group} read {written}")
        return -1
    prefix, _, number = written[0].partition(":")
    if prefix != str(group) or not number.isdigit():
        state.phantom.append(f"{where}: group {group} read {written[0]!r}")
        return -1
    seen = int(number)
    with state.lock:
        sent = state.sent[group]
    if seen < acknowledged_before:
        state.lost.append(f"{where}: group {group} read write {seen}, write {acknowledged_before} was acknowledged")
    if seen > sent:
        state.phantom.append(f"{where}: group {group} read write {seen}, only {sent} were sent")
    return seen


def connect(port, timeout):
    # No retry inside redis-py: every failure is the gateway's answer, counted.
    return redis.Redis(port=port, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))


def run_thread(args, state, thread, deadline):
    rng = random.Random(args.seed * 1000 + thread)
    own = [group for group in range(args.groups) if group % args.threads == thread]
    client = connect(args.port, args.socket_timeout)
    while time.monotonic() < deadline:
        try:
            if rng.random() < 0.5 and own:
                group = rng.choice(own)
                with state.lock:
                    state.sent[group] += 1
                    number = state.sent[group]
                value = f"{group}:{number}"
                client.mset({key: value for key in group_keys(group, args.keys_per_group)})
                now = time.monotonic()
                with state.lock:
                    state.acknowledged[group] = max(state.acknowledged[group], number)
                    state.successes.append(now)
                    state.mset_ok += 1
            else:
                group = rng.randrange(args.groups)
                with state.lock:
                    acknowledged_before = state.acknowledged[group]
                values = client.mget(group_keys(group, args.keys_per_group))
                now = time.monotonic()
                check_read(state, group, values, acknowledged_before, f"{now - START:.3f}s")
                with state.lock:
                    state.successes.append(now)
                    state.mget_ok += 1
        except redis.exceptions.ConnectionError as error:
            state.error(classify(error), str(error))
            time.sleep(0.05)
            client = connect(args.port, args.socket_timeout)
        except redis.exceptions.RedisError as error:
            state.error(classify(error), str(error))


def final_read(args, state):
    """Reads every group back (all of them within --final-read-s); returns the unreadable."""
    client = connect(args.port, args.socket_timeout)
    unreadable = []
    give_up = time.monotonic() + args.final_read_s
    for group in range(args.groups):
        while True:
            try:
                values = client.mget(group_keys(group, args.keys_per_group))
                check_read(state, group, values, state.acknowledged[group], "final read")
                break
            except redis.exceptions.RedisError as error:
                if time.monotonic() >= give_up:
                    unreadable.append(f"group {group}: {error}")
                    break
                time.sleep(0.1)
                client = connect(args.port, args.socket_timeout)
    return unreadable


def longest_gap(successes, start, end):
    """The longest window with no successful command between start and end, and when it began."""
    times = [start] + sorted(successes) + [end]
    gap, at = 0.0, start
    for before, after in zip(times, times[1:]):
        if after - before > gap:
            gap, at = after - before, before
    return gap, at - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--duration", type=float, required=True, help="seconds of load")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--keys-per-group", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--socket-timeout", type=float, default=30.0)
    parser.add_argument("--final-read-s", type=float, default=30.0)
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 32)
    print(f"seed {args.seed} (replay the choices with --seed {args.seed})", file=sys.stderr)

    state = State(args.groups)
    started = time.monotonic()
    deadline = started + args.duration
    threads = [
        threading.Thread(target=run_thread, args=(args, state, thread, deadline), daemon=True)
        for thread in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ended = time.monotonic()
    gap, gap_at = longest_gap(state.successes, started, ended)
    unreadable = final_read(args, state)
    summary = {
        "seed": args.seed,
        "seconds": round(ended - started, 3),
        "mset_ok": state.mset_ok,
        "mget_ok": state.mget_ok,
        "errors": state.errors,
        "first_errors": state.first_errors,
        "lost": state.lost[:20],
        "lost_count": len(state.lost),
        "fractured": state.fractured[:20],
        "fractured_count": len(state.fractured),
        "phantom": state.phantom[:20],
        "phantom_count": len(state.phantom),
        "unreadable": unreadable,
        "longest_gap_ms": round(gap * 1000),
        "longest_gap_at_s": round(gap_at, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
