"""Nobody can lock everyone out: root has a reserve beyond the connection cap, idle connections holding no job are
closed, and the per-uid defaults take many users to exhaust."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from governor.config import LimitsConfig
from governor.daemon.admission import FD_RESERVE, FD_RESERVE_DAEMON, connection_refusal
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
    assert connection_refusal(limits, uid=0, total=5, of_uid=5) is None  # root: no per-uid cap
    # Descriptors: a member is refused within FD_RESERVE of the open-file limit, root only within FD_RESERVE_DAEMON.
    near = 1024 - FD_RESERVE + 1
    assert "open-file limit" in connection_refusal(limits, uid=1000, total=1, of_uid=0, fds_in_use=near,
                                                    fd_limit=1024)
    assert connection_refusal(limits, uid=1000, total=1, of_uid=0, fds_in_use=near - 1, fd_limit=1024) is None
    assert connection_refusal(limits, uid=0, total=1, of_uid=0, fds_in_use=near, fd_limit=1024) is None
    assert "open-file limit" in connection_refusal(limits, uid=0, total=1, of_uid=0,
                                                    fds_in_use=1024 - FD_RESERVE_DAEMON + 1, fd_limit=1024)


def test_defaults_take_many_users_to_exhaust():
    limits = LimitsConfig()
    assert limits.max_connections // limits.max_connections_per_uid >= 16
    assert limits.max_jobs // limits.max_jobs_per_uid >= 8
    assert limits.max_jobs // limits.ranks_per_uid >= 4  # with a rank on each of 8 GPUs, two groups each
    assert limits.root_reserve_connections > 0 and limits.idle_timeout_s <= 120


def test_the_rank_cap_is_not_below_the_job_cap():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"max_ranks_per_uid \(4\) must be at least max_jobs_per_uid \(8\)"):
        LimitsConfig(max_ranks_per_uid=4)
    assert LimitsConfig(max_jobs_per_uid=4, max_ranks_per_uid=4).ranks_per_uid == 4
    # A config that raised max_jobs_per_uid before the rank cap existed loads as it did, the cap raised with it.
    assert LimitsConfig(max_jobs_per_uid=256).ranks_per_uid == 256 and LimitsConfig().ranks_per_uid == 16


@pytest.mark.parametrize("key", ["root_reserve_connections", "idle_timeout_s"])
def test_new_limits_are_validated(key):
    from pydantic import ValidationError

    assert getattr(LimitsConfig(**{key: 5}), key) == 5
    with pytest.raises(ValidationError, match=key):
        LimitsConfig(**{key: -1})


def test_root_is_not_held_to_the_per_uid_cap(orin, start_daemon):
    d = start_daemon(config={"limits": {"max_connections_per_uid": 2}})
    held = [d.client() for _ in range(5)]  # the operator's exporter and status calls, all at once
    assert all(c.call("ping") == {} for c in held)


def _up(collector) -> float:
    return next(m for m in collector.collect() if m.name == "ftgov_up").samples[0].value


def test_a_flooded_exporter_keeps_one_connection_and_the_operator_gets_in(orin, start_daemon, monkeypatch):
    """Anyone who reaches the exporter's port decides how often root's exporter asks the daemon: its scrapes share
    one connection, and root's `ftgov status` is never refused for root's own connections."""
    pytest.importorskip("prometheus_client")
    from governor.cli import metrics

    opened = []

    class Counted(metrics.Connection):  # the real connection, counted
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(metrics, "Connection", Counted)
    d = start_daemon(config={"limits": {"max_connections_per_uid": 2}})
    collector = metrics.DaemonCollector(d.socket)
    with ThreadPoolExecutor(16) as pool:
        scrapes = [pool.submit(_up, collector) for _ in range(300)]
        statuses = [d.client().request("status") for _ in range(30)]
        ups = [f.result() for f in scrapes]
    assert all("result" in r for r in statuses), [r for r in statuses if "error" in r][:1]
    assert ups == [1.0] * 300
    assert len(opened) == 1, f"{len(opened)} connections for 300 scrapes"
    d.stop()
    d.start()  # the daemon closed the exporter's connection: the next scrape opens a new one
    assert _up(collector) == 1.0 and len(opened) == 2


_FLOOD = """
import socket, sys
line = b'{"jsonrpc":"2.0","method":"status"}\\n'  # a notification: no reply, so no back-pressure either
chunk = line * (65536 // len(line))
conns = [socket.socket(socket.AF_UNIX) for _ in range(int(sys.argv[2]))]
for s in conns:
    s.connect(sys.argv[1])
    s.setblocking(False)
for s in conns:
    for _ in range(4):  # what the daemon reads of it in four turns
        try:
            s.sendall(chunk)
        except BlockingIOError:
            break
print("sent", flush=True)
sys.stdin.readline()
"""


def test_a_members_flood_of_requests_leaves_the_loop_turning(orin, start_daemon, member):
    """A connection's lines were all answered in the callback that read them: 64 KiB of `status` notifications (1,800
    requests, each reading sysfs and the rails, none with a reply to hold them back) took the loop for half a second,
    and a member's 16 connections took it for 8 s a turn, during which nobody was served, no tick ran and no
    watchdog ping went out (WatchdogSec=20s: two or three members, and systemd kills ftgovd). A connection now gets
    a few milliseconds a turn (connection.TURN_S), and the others theirs in between."""
    user, _uid = member
    d = start_daemon()
    open_to_members(d)
    operator = d.client()
    assert operator.call("ping") == {}
    flooder = run_as(user, _FLOOD, d.socket, "16")  # limits.max_connections_per_uid's default
    try:
        assert flooder.stdout.readline().strip() == "sent", flooder.stderr.read()
        waits_s = []
        for _ in range(5):
            started_s = time.monotonic()
            assert operator.call("ping") == {}
            waits_s.append(time.monotonic() - started_s)
        assert max(waits_s) < 1.0, f"root's pings waited {', '.join(f'{w:.2f}' for w in waits_s)} s"
    finally:
        flooder.kill()
        flooder.wait()
