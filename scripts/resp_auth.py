#!/usr/bin/env python3
"""redis-py against a rampkv RESP gateway that requires authentication.

Usage: resp_auth.py PORT. The gateway runs with the ACL file of
crates/rampkv/tests/resp_cli.rs (ACL_FILE); the script passes against redis-server 7.0 with that
file too: default/secret, alice/apw, bob disabled,
carol without permissions, dave without keys. Prints "resp_auth.py: every check passed"
and exits 0, or raises.
"""
import sys

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

port = int(sys.argv[1])


def client(**options):
    # No retries: redis-py 6 and later retry a failed login three times with backoff (seconds).
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, retry=Retry(NoBackoff(), 0), **options)


def expect_error(kind, call, text=None):
    try:
        call()
    except kind as error:
        assert text is None or text in str(error), f"{kind.__name__}: {error!r} lacks {text!r}"
        return
    raise AssertionError(f"expected {kind.__name__} ({text})")


# No password: redis-py 5 and later open with HELLO 3 and meet HELLO's NOAUTH, older ones meet
# NOAUTH at the first command; both raise AuthenticationError (its text varies by version).
expect_error(redis.AuthenticationError, lambda: client().get("k"))
expect_error(redis.AuthenticationError, lambda: client(protocol=2).get("k"), "Authentication required")
# Wrong passwords, a disabled user, an unknown one: WRONGPASS, the same for all.
for options in [
    {"password": "wrong"},
    {"username": "alice", "password": "wrong"},
    {"username": "bob", "password": "bpw"},
    {"username": "nobody", "password": "x"},
]:
    expect_error(redis.AuthenticationError, lambda: client(**options).ping(), "invalid username-password pair")

# The default user's password (AUTH secret), then a user and password (AUTH alice apw).
default = client(password="secret")
assert default.mset({"a": "1", "b": "2"}) is True
alice = client(username="alice", password="apw", decode_responses=True)
assert alice.mget("a", "b", "missing") == ["1", "2", None]
assert alice.acl_whoami() == "alice"
# RESP3: redis-py logs in with HELLO 3 AUTH alice apw.
resp3 = client(username="alice", password="apw", protocol=3, decode_responses=True)
assert resp3.get("a") == "1" and resp3.get("missing") is None
assert resp3.acl_whoami() == "alice"
# RESP3 with a wrong password: HELLO's WRONGPASS.
expect_error(
    redis.AuthenticationError,
    lambda: client(username="alice", password="no", protocol=3).ping(),
    "invalid username-password pair",
)

# Permissions: carol may run no command, dave no command with keys.
carol = client(username="carol", password="anything")
expect_error(redis.exceptions.NoPermissionError, lambda: carol.get("a"), "no permissions to run the 'get' command")
dave = client(username="dave", password="dpw")
assert dave.ping() is True
expect_error(redis.exceptions.NoPermissionError, lambda: dave.mget("a", "b"), "no permissions to access one of the keys")

print("resp_auth.py: every check passed")
