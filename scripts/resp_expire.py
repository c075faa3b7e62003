#!/usr/bin/env python3
"""redis-py's own expiry commands against a rampkv RESP gateway.

Usage: resp_expire.py PORT. `tests/resp_expire.rs` runs it against `rampkv local --resp-port`.
Prints "resp_expire.py: every check passed" and exits 0, or raises.

What it pins (docs/resp.md, "Expiry"): expire/pexpire/expireat/pexpireat with nx=, xx=, gt=,
lt= and their True/False results; ttl/pttl after each; persist; getex with ex=, px=, exat=,
pxat=, persist=; set(..., keepttl=True) and set with nx=/xx=/get= together with ex=/px=; a
deadline in the past deletes the key; INCR keeps a key's TTL, a plain SET clears it; a key
really expires after PEXPIRE (polled, at most 5 s); EXPIRE inside pipeline(transaction=True)
is refused with why; in RESP2 and RESP3.
"""
import sys
import time

import redis

port = int(sys.argv[1])
WAIT_SECONDS_MAX = 5.0


def client(**options):
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, decode_responses=True, **options)


def expect_error(kind, call, text):
    try:
        call()
    except kind as error:
        assert text in str(error), f"{kind.__name__}: {error!r} lacks {text!r}"
        return error
    raise AssertionError(f"expected {kind.__name__} ({text})")


def within(value, low, high, what):
    assert low <= value <= high, f"{what}: {value} not in [{low}, {high}]"


for protocol in (2, 3):
    r = client(protocol=protocol)
    key = lambda name: f"x{protocol}:{name}"  # noqa: E731
    k = key("k")

    # EXPIRE and its options: True if the deadline was set, False if not.
    r.set(k, "v")
    assert r.ttl(k) == -1
    assert r.expire(k, 100) is True
    within(r.ttl(k), 99, 100, "ttl after expire 100")
    assert r.expire(k, 200, nx=True) is False, "NX: it has a deadline"
    assert r.expire(k, 200, gt=True) is True
    within(r.ttl(k), 199, 200, "ttl after expire gt")
    assert r.expire(k, 50, gt=True) is False
    assert r.expire(k, 50, lt=True) is True
    assert r.expire(k, 500, xx=True) is True
    within(r.pttl(k), 499_000, 500_000, "pttl after expire xx")
    assert r.pexpire(k, 100_000) is True
    within(r.pttl(k), 99_000, 100_000, "pttl after pexpire")
    assert r.get(k) == "v", "an expiry keeps the value"
    assert r.persist(k) is True
    assert r.ttl(k) == -1
    assert r.persist(k) is False, "no deadline left to remove"
    assert r.expire(k, 10, xx=True) is False, "XX: it has none"
    assert r.expire(k, 10, gt=True) is False, "GT: none is an infinite TTL"
    assert r.expire(k, 10, lt=True) is True, "LT: anything is below an infinite TTL"
    assert r.expire(key("missing"), 10) is False
    assert r.persist(key("missing")) is False
    assert r.exists(key("missing")) == 0, "EXPIRE of a missing key writes nothing"

    now = time.time()
    assert r.expireat(k, int(now) + 1000) is True
    within(r.ttl(k), 998, 1000, "ttl after expireat")
    assert r.pexpireat(k, int(now * 1000) + 60_000) is True
    within(r.ttl(k), 58, 60, "ttl after pexpireat")

    # GETEX: the value, and the deadline changed as asked.
    assert r.getex(k) == "v"
    within(r.ttl(k), 58, 60, "getex without options keeps the deadline")
    assert r.getex(k, ex=30) == "v"
    within(r.ttl(k), 29, 30, "ttl after getex ex")
    assert r.getex(k, px=20_000) == "v"
    within(r.pttl(k), 19_000, 20_000, "pttl after getex px")
    assert r.getex(k, exat=int(now) + 40) == "v"
    within(r.ttl(k), 38, 40, "ttl after getex exat")
    assert r.getex(k, pxat=int(now * 1000) + 50_000) == "v"
    within(r.ttl(k), 48, 50, "ttl after getex pxat")
    assert r.getex(k, persist=True) == "v"
    assert r.ttl(k) == -1
    assert r.getex(key("missing"), ex=10) is None

    # SET KEEPTTL keeps the deadline; a plain SET clears it; INCR keeps it.
    r.expire(k, 60)
    assert r.set(k, "w", keepttl=True) is True
    assert r.get(k) == "w"
    within(r.ttl(k), 59, 60, "ttl after set keepttl")
    assert r.set(k, "x") is True
    assert r.ttl(k) == -1, "a plain SET clears the TTL"
    counter = key("counter")
    assert r.set(counter, 1, ex=100) is True
    assert r.incr(counter) == 2
    within(r.ttl(counter), 99, 100, "INCR keeps the TTL")

    # SET NX|XX|GET together with an expiry.
    n = key("n")
    assert r.set(n, "1", nx=True, ex=10) is True
    within(r.ttl(n), 9, 10, "ttl after set nx ex")
    assert r.set(n, "2", nx=True, ex=10) is None, "NX on a present key"
    assert r.get(n) == "1"
    assert r.set(n, "3", xx=True, px=20_000) is True
    within(r.pttl(n), 19_000, 20_000, "pttl after set xx px")
    assert r.set(n, "4", get=True, ex=5) == "3"
    within(r.ttl(n), 4, 5, "ttl after set get ex")
    assert r.set(n, "5", xx=True, keepttl=True) is True
    within(r.ttl(n), 4, 5, "ttl after set xx keepttl")
    assert r.get(n) == "5"
    assert r.set(key("never"), "1", xx=True, ex=10) is None
    assert r.exists(key("never")) == 0

    # A deadline in the past deletes the key, as in Redis.
    assert r.expire(k, -1) is True
    assert r.get(k) is None and r.exists(k) == 0
    r.set(k, "v")
    assert r.expireat(k, 1) is True
    assert r.get(k) is None
    r.set(k, "v")
    assert r.pexpire(k, 0) is True
    assert r.ttl(k) == -2

    # A key really expires: present right after PEXPIRE, missing within the bound after.
    e = key("expiring")
    r.set(e, "soon")
    started = time.monotonic()
    assert r.pexpire(e, 300) is True
    assert r.get(e) == "soon"
    while r.get(e) is not None:
        assert time.monotonic() - started < WAIT_SECONDS_MAX, "the key outlived its deadline by seconds"
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.25, f"expired after {elapsed:.3f} s, before its 300 ms"
    assert r.ttl(e) == -2 and r.exists(e) == 0
    # Expired means missing to the updates too (the primary judges it by its clock): EXPIRE
    # finds nothing, INCR counts from 0, SET NX sets.
    assert r.expire(e, 100) is False
    assert r.getex(e, persist=True) is None
    assert r.incr(e) == 1
    assert r.ttl(e) == -1
    r.set(e, "41", px=200)
    while r.exists(e):
        assert time.monotonic() - started < 2 * WAIT_SECONDS_MAX, "the key outlived its deadline by seconds"
        time.sleep(0.02)
    assert r.set(e, "new", nx=True) is True and r.get(e) == "new"

    # Inside MULTI, EXPIRE is refused as it is queued, and the transaction with it.
    with r.pipeline(transaction=True) as pipe:
        pipe.set(key("m"), "1")
        pipe.expire(key("m"), 10)
        expect_error(redis.ResponseError, pipe.execute, "EXPIRE inside MULTI is not supported by rampkv")
    assert r.get(key("m")) is None
    # Pipelined outside MULTI each one runs on its own, in order.
    with r.pipeline(transaction=False) as pipe:
        pipe.set(key("p"), "1")
        pipe.expire(key("p"), 100)
        pipe.ttl(key("p"))
        pipe.persist(key("p"))
        pipe.ttl(key("p"))
        assert pipe.execute() == [True, True, 100, True, -1]

print("resp_expire.py: every check passed")
