#!/usr/bin/env python3
"""redis-py's own single-key conditional writes against a rampkv RESP gateway.

Usage: resp_conditional.py PORT. `tests/resp_conditional.rs` runs it against a gateway over TCP
and against one calling its servers in-process. Prints "resp_conditional.py: every check passed"
and exits 0, or raises.

What it pins (docs/resp.md, "Conditional writes"): incr/incrby/decr/decrby, setnx,
set(nx=, xx=, get=), getset, getdel and append with redis-py's return types, in RESP2 and RESP3;
the errors redis-py raises for a value that is not an integer and for an overflow; a
conditional write in pipeline(transaction=True) refused with why (redis-py raises the
refusal); concurrent INCRs from
several connections lose nothing.
"""
import sys
import threading

import redis

port = int(sys.argv[1])


def client(**options):
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, decode_responses=True, **options)


def expect_error(kind, call, text):
    try:
        call()
    except kind as error:
        assert text in str(error), f"{kind.__name__}: {error!r} lacks {text!r}"
        return error
    raise AssertionError(f"expected {kind.__name__} ({text})")


for protocol in (2, 3):
    r = client(protocol=protocol)
    key = lambda name: f"p{protocol}:{name}"  # noqa: E731

    assert r.incr(key("counter")) == 1
    assert r.incr(key("counter"), 9) == 10
    assert r.incrby(key("counter"), 5) == 15
    assert r.decr(key("counter")) == 14
    assert r.decrby(key("counter"), 4) == 10
    assert r.decr(key("counter"), 20) == -10
    assert r.get(key("counter")) == "-10"
    r.set(key("text"), "hello")
    expect_error(redis.ResponseError, lambda: r.incr(key("text")), "value is not an integer or out of range")
    r.set(key("max"), str(2**63 - 1))
    expect_error(redis.ResponseError, lambda: r.incr(key("max")), "increment or decrement would overflow")
    assert r.get(key("max")) == str(2**63 - 1), "a refused INCR writes nothing"

    assert r.setnx(key("nx"), "first") is True
    assert r.setnx(key("nx"), "second") is False
    assert r.get(key("nx")) == "first"
    assert r.set(key("snx"), "1", nx=True) is True
    assert r.set(key("snx"), "2", nx=True) is None
    assert r.set(key("snx"), "3", xx=True) is True
    assert r.set(key("sxx"), "1", xx=True) is None
    assert r.get(key("snx")) == "3" and r.get(key("sxx")) is None
    assert r.set(key("snx"), "4", get=True) == "3"
    assert r.set(key("sget"), "1", get=True) is None
    assert r.set(key("snx"), "5", nx=True, get=True) == "4"
    assert r.get(key("snx")) == "4", "NX GET on a present key sets nothing"

    assert r.getset(key("gs"), "a") is None
    assert r.getset(key("gs"), "b") == "a"
    assert r.getdel(key("gs")) == "b"
    assert r.getdel(key("gs")) is None
    assert r.exists(key("gs")) == 0
    assert r.incr(key("gs")) == 1, "a deleted key counts from 0"

    assert r.append(key("ap"), "hello") == 5
    assert r.append(key("ap"), " world") == 11
    assert r.get(key("ap")) == "hello world"
    assert r.strlen(key("ap")) == 11

    # Inside MULTI a conditional write is refused as it is queued, and the transaction with it.
    with r.pipeline(transaction=True) as pipe:
        pipe.set(key("m"), "1")
        pipe.incr(key("m"))
        # redis-py raises the queued command's error (Redis's EXECABORT follows it).
        expect_error(redis.ResponseError, pipe.execute, "INCRBY inside MULTI is not supported by rampkv")
    assert r.get(key("m")) is None
    # Pipelined outside MULTI each one runs on its own, in order.
    with r.pipeline(transaction=False) as pipe:
        pipe.incr(key("pc"))
        pipe.set(key("pn"), "x", nx=True)
        pipe.incr(key("pc"))
        pipe.getdel(key("pn"))
        assert pipe.execute() == [1, True, 2, "x"]

# Concurrent INCRs from several connections: none is lost.
THREADS, EACH = 4, 200


def hammer():
    r = client()
    for _ in range(EACH):
        r.incr("shared-counter")


threads = [threading.Thread(target=hammer) for _ in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert client().get("shared-counter") == str(THREADS * EACH), client().get("shared-counter")

print("resp_conditional.py: every check passed")
