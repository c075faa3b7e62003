#!/usr/bin/env python3
"""redis-py's key space calls against a rampkv RESP gateway: scan_iter, scan, keys, dbsize and
INFO's keyspace section (issue 31).

Usage: resp_keyspace.py PORT. `tests/resp_keyspace.rs` runs it against a gateway over TCP and
against one calling its servers in-process. Prints "resp_keyspace.py: every check passed" and
exits 0, or raises. The database must hold no other keys while it runs.
"""
import sys

import redis

port = int(sys.argv[1])

for protocol in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, decode_responses=True, protocol=protocol)
    prefix = f"ks{protocol}:"
    names = [f"{prefix}{index}" for index in range(600)]
    for start in range(0, len(names), 100):  # a command takes at most 256 keys
        r.mset({name: "v" for name in names[start:start + 100]})
    assert r.delete(*names[:100]) == 100
    expected = set(names[100:])

    # scan_iter: every key once here (no write runs), in any order; COUNT is a hint.
    for count in (None, 1, 37, 1000):
        got = list(r.scan_iter(match=prefix + "*", count=count))
        assert set(got) == expected, (count, len(got), sorted(expected - set(got))[:5])
        assert len(got) == len(expected), f"duplicates with count {count}"
    assert set(r.scan_iter(match=prefix + "2[0-4]?")) == {f"{prefix}{index}" for index in range(200, 250)}
    assert set(r.scan_iter(match=prefix + "1?")) == set(), "keys 10..19 were deleted"
    assert set(r.scan_iter(match=prefix + "*", _type="string")) == expected
    assert list(r.scan_iter(_type="list")) == []

    # scan: an int cursor, 0 at the end; a bad cursor is Redis's error.
    cursor, seen = 0, set()
    for _ in range(10_000):
        cursor, keys = r.scan(cursor=cursor, match=prefix + "*", count=50)
        assert isinstance(cursor, int) and cursor >= 0
        seen.update(keys)
        if cursor == 0:
            break
    assert seen == expected
    for bad in ("abc", "-1", "18446744073709551616", str(1 << 63)):
        try:
            r.execute_command("SCAN", bad)
        except redis.ResponseError as error:
            assert "invalid cursor" in str(error), error
        else:
            raise AssertionError(f"SCAN {bad} was accepted")

    # keys, dbsize, INFO keyspace.
    assert set(r.keys(prefix + "*")) == expected
    assert r.keys(prefix + "nosuch*") == []
    total = r.dbsize()
    assert total == len(r.keys("*")) and total >= len(expected), total
    info = r.info("keyspace")
    assert info["db0"]["keys"] == total and info["db0"]["expires"] == 0, info
    for start in range(0, len(names), 200):
        r.delete(*names[start:start + 200])
    assert r.dbsize() == total - len(expected)

assert r.dbsize() == 0, r.dbsize()
assert r.info("keyspace") == {}, "no db0 line without keys, as in Redis"
print("resp_keyspace.py: every check passed")
