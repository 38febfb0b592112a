"""Nobody can lock everyone out: root has a reserve beyond the connection cap, idle connections holding no job are
closed, and the per-uid defaults take many users to exhaust."""

from __future__ import annotations

import socket

import pytest

from governor.config import LimitsConfig
from governor.daemon.admission import connection_refusal
from tests.support.daemon import FEATURES
from tests.support.security import open_to_members, run_as

_HOLD_CONNECTIONS = """
import socket, sys
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\\n')
    print(s.makefile().readline().strip(), flush=True)
    held.append(s)
sys.stdin.readline()
"""


def test_root_gets_in_while_members_hold_every_ordinary_slot(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon(config={"limits": {"max_connections": 4, "max_connections_per_uid": 4,
                                        "root_reserve_connections": 2}})
    open_to_members(d)
    holder = run_as(user, _HOLD_CONNECTIONS, d.socket, "4")
    try:
        for _ in range(4):
            assert '"result":{}' in holder.stdout.readline()
        # Every ordinary slot is taken; root still gets in, up to the reserve.
        first, second = d.client(), d.client()
        assert first.call("status")["jobs"] == [] and second.call("ping") == {}
        third = d.client()
        err = third.read_reply()["error"]
        assert err["code"] == -32002 and "root_reserve_connections" in err["message"], err
    finally:
        holder.kill()
        holder.wait()


def test_an_idle_connection_without_a_job_is_closed(orin, start_daemon):
    d = start_daemon(config={"limits": {"idle_timeout_s": 0.3}})
    busy = d.client()
    busy.call("register", **FEATURES)
    idle = socket.socket(socket.AF_UNIX)
    idle.settimeout(10)
    idle.connect(d.socket)
    assert idle.recv(1) == b"", "the daemon closes an idle connection that holds no job"
    idle.close()
    assert busy.call("ping") == {}, "a connection that holds a job is never timed out"
    assert len(busy.call("status")["jobs"]) == 1


def test_connection_rules():
    limits = LimitsConfig(max_connections=10, max_connections_per_uid=3, root_reserve_connections=2)
    assert connection_refusal(limits, uid=1000, total=9, of_uid=2) is None
    assert "max_connections_per_uid" in connection_refusal(limits, uid=1000, total=5, of_uid=3)
    assert "max_connections)" in connection_refusal(limits, uid=1000, total=10, of_uid=0)
    assert connection_refusal(limits, uid=0, total=11, of_uid=0) is None
    assert "root_reserve_connections" in connection_refusal(limits, uid=0, total=12, of_uid=0)


def test_defaults_take_many_users_to_exhaust():
    limits = LimitsConfig()
    assert limits.max_connections // limits.max_connections_per_uid >= 16
    assert limits.max_jobs // limits.max_jobs_per_uid >= 8
    assert limits.root_reserve_connections > 0 and limits.idle_timeout_s <= 120


@pytest.mark.parametrize("key", ["root_reserve_connections", "idle_timeout_s"])
def test_new_limits_are_validated(key):
    from pydantic import ValidationError

    assert getattr(LimitsConfig(**{key: 5}), key) == 5
    with pytest.raises(ValidationError, match=key):
        LimitsConfig(**{key: -1})
