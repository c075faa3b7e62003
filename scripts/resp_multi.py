#!/usr/bin/env python3
"""redis-py's own transactions, TYPE/STRLEN/UNLINK and INFO against a rampkv RESP gateway.

Usage: resp_multi.py PORT [--in-process]. `tests/resp_multi.rs` runs it against a gateway over
TCP and against one calling its servers in-process (`--in-process`: INFO then shows the stores).
Prints "resp_multi.py: every check passed" and exits 0, or raises.

What it pins (docs/resp.md, "Transactions"): `pipeline(transaction=True)` (MULTI, the commands
and EXEC in one write) with writes only and with reads only; a queue mixing reads and writes
refused at EXEC with why; WATCH refused; DISCARD; EXECABORT after a command that fails to queue;
INFO parsed as redis-py's `info()` parses it.
"""
import sys

import redis

port = int(sys.argv[1])
in_process = "--in-process" in sys.argv[2:]


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
    prefix = f"p{protocol}:"
    key = lambda name: prefix + name  # noqa: E731

    # Writes only: one RAMP write across partitions; DEL and UNLINK count as if run in order.
    r.set(key("gone"), "x")
    with r.pipeline(transaction=True) as pipe:
        pipe.set(key("a"), "1")
        pipe.mset({key("b"): "2", key("c"): "3", key("d"): "4"})
        pipe.set(key("a"), "11")  # a later command overrides an earlier one
        pipe.delete(key("gone"), key("never"), key("d"))  # gone (stored), d (queued): 2
        pipe.unlink(key("gone"), key("d"))  # both deleted by the queue already: 0
        assert pipe.execute() == [True, True, True, 2, 0]
    assert r.mget(key("a"), key("b"), key("c"), key("d"), key("gone")) == ["11", "2", "3", None, None]

    # Reads only: one read-atomic read of every key of the queue.
    with r.pipeline(transaction=True) as pipe:
        pipe.get(key("a"))
        pipe.mget(key("b"), key("missing"), key("c"))
        pipe.exists(key("a"), key("missing"), key("a"))
        pipe.strlen(key("a"))
        pipe.strlen(key("missing"))
        pipe.type(key("b"))
        pipe.type(key("missing"))
        pipe.ping()
        assert pipe.execute() == ["11", ["2", None, "3"], 2, 2, 0, "string", "none", True]

    # Reads and writes in one queue: refused at EXEC with why, nothing written.
    with r.pipeline(transaction=True) as pipe:
        pipe.get(key("a"))
        pipe.set(key("a"), "changed")
        error = expect_error(redis.exceptions.ExecAbortError, pipe.execute, "mixes reads (GET) and writes (SET)")
        assert "read-only or write-only (RAMP)" in str(error), error
    assert r.get(key("a")) == "11"

    # A command that fails to queue dooms the transaction: EXECABORT, and redis-py raises the
    # command's own error (its first), as against Redis.
    with r.pipeline(transaction=True) as pipe:
        pipe.set(key("a"), "doomed")
        pipe.execute_command("GET")
        expect_error(redis.exceptions.ResponseError, pipe.execute, "wrong number of arguments for 'get' command")
    assert r.get(key("a")) == "11"

    # WATCH is refused, with why; so is redis-py's optimistic transaction() helper.
    with r.pipeline() as pipe:
        expect_error(redis.exceptions.ResponseError, lambda: pipe.watch(key("a")), "WATCH is not supported by rampkv")
        assert pipe.unwatch() in ("OK", True)  # nothing is watched
    expect_error(
        redis.exceptions.ResponseError,
        lambda: r.transaction(lambda pipe: pipe.get(key("a")), key("a")),
        "read-only or write-only (RAMP)",
    )

    # MULTI / DISCARD / EXEC by hand on one connection, as redis-py sends and reads them.
    single = client(protocol=protocol, single_connection_client=True)
    single.ping()  # connects

    def raw(*args):
        single.connection.send_command(*args)
        return single.connection.read_response()

    assert raw("MULTI") == "OK"
    assert raw("SET", key("a"), "discarded") == "QUEUED"
    expect_error(redis.exceptions.ResponseError, lambda: raw("MULTI"), "MULTI calls can not be nested")
    assert raw("DISCARD") == "OK"
    expect_error(redis.exceptions.ResponseError, lambda: raw("EXEC"), "EXEC without MULTI")
    expect_error(redis.exceptions.ResponseError, lambda: raw("DISCARD"), "DISCARD without MULTI")
    assert raw("GET", key("a")) == "11"
    assert raw("MULTI") == "OK" and raw("GET", key("a")) == "QUEUED" and raw("EXEC") == ["11"]
    single.close()

    # TYPE, STRLEN and UNLINK outside MULTI.
    assert r.type(key("a")) == "string" and r.type(key("missing")) == "none"
    assert r.strlen(key("b")) == 1 and r.strlen(key("missing")) == 0
    assert r.unlink(key("b"), key("missing"), key("b")) == 1
    assert r.exists(key("b")) == 0

    # INFO: every section parses, with the fields operators read.
    info = r.info()
    for field in ["redis_version", "process_id", "tcp_port", "uptime_in_seconds", "connected_clients",
                  "maxclients", "blocked_clients", "maxmemory_policy", "loading", "total_commands_processed",
                  "role", "connected_slaves", "cluster_enabled", "db0", "rampkv_replicas"]:
        assert field in info, f"INFO lacks {field}: {sorted(info)}"
    assert info["role"] == "master" and info["blocked_clients"] == 0 and info["cluster_enabled"] == 0
    assert isinstance(info["process_id"], int) and info["tcp_port"] == port
    assert info["connected_clients"] >= 1
    if sys.platform.startswith("linux"):
        assert isinstance(info["used_memory_rss"], int) and info["used_memory_rss"] > 1024 * 1024, info
    assert info["rampkv_partition0"]["primary"].startswith("127.0.0.1:"), info["rampkv_partition0"]
    assert set(r.info("server")) >= {"redis_version", "process_id"} and "role" not in r.info("server")
    assert set(r.info("clients")) == {"connected_clients", "maxclients", "blocked_clients", "tracking_clients",
                                      "rampkv_clients_in_multi"}, r.info("clients")
    assert set(r.info("all")) == set(r.info("everything"))
    assert set(r.info("all")) == set(info), sorted(set(r.info("all")) ^ set(info))
    assert r.info("nosuch") == {}
    multi_sections = r.execute_command("INFO", "replication", "cluster")
    assert "role" in multi_sections and "cluster_enabled" in multi_sections, multi_sections
    if in_process:
        assert info["rampkv_gateway"] == "in_process" and info["rampkv_rss_includes_servers"] == 1
        assert info["rampkv_store_keys"] >= 4 and info["rampkv_store_value_bytes"] > 0, info
        assert info["aof_enabled"] == 0 and info["rampkv_persistence"] == "none"
    else:
        assert info["rampkv_gateway"] == "tcp" and info["rampkv_persistence"] == "unknown"
        assert "rampkv_store_keys" not in info
    r.close()

print("resp_multi.py: every check passed")
