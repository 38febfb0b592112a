"""A member cannot run the daemon out of file descriptors, nor flood its log through another logger: every hold is
released on every path, and part of the open-file limit is kept for root and the daemon itself. The daemon runs with
RLIMIT_NOFILE 1024, as the unit gives it."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import socket
import struct

import pytest

from governor.backends.gpuid import GpuNotFound, find_gpu
from governor.client.features import visible_gpu
from governor.config import SocketConfig
from governor.daemon import logs, peers
from governor.daemon.connection import Connection
from governor.daemon.holds import Holds
from governor.daemon.main import route_loggers
from governor.daemon.notify import Notifier
from tests.support.daemon import DEVFREQ, FEATURES, limits
from tests.support.security import open_to_members, run_as

NOFILE = 1024
# Registrations are bounded per uid (2 a second): set high, so that the bound tested is the descriptors'.
MANY_REGISTRATIONS = {"registrations_per_s": 100000.0, "registration_burst": 100000}

# One register per connection: before the fix, the error closed the connection (internal error), its pidfd kept.
_MALFORMED_REGISTERS = """
import json, socket, sys
features = json.loads(sys.argv[2])
answered = 0
for i in range(int(sys.argv[3])):
    s = socket.socket(socket.AF_UNIX); s.settimeout(5)
    try:
        s.connect(sys.argv[1])
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register",
                              "params": {**features, "gpu": "\\u00b2"}}).encode() + b"\\n")
        line = s.makefile().readline()
    except OSError:
        break  # the daemon stopped answering
    finally:
        s.close()
    if line:
        answered += 1
print(answered, flush=True)
"""


def test_malformed_registers_leak_no_descriptor(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon(config={"limits": MANY_REGISTRATIONS}, nofile=NOFILE)
    open_to_members(d)
    d.client().call("ping")
    before = d.open_fds()
    out, err = run_as(user, _MALFORMED_REGISTERS, d.socket, json.dumps(FEATURES), "1100").communicate(timeout=240)
    assert out.strip() == "1100", err  # every one answered (an error naming gpu), none left hanging
    root = d.client()
    assert root.call("status")["jobs"] == []
    reply = root.request("register", **FEATURES, gpu="\u00b2")
    assert reply["error"]["data"]["field"] == "gpu", reply
    assert d.open_fds() <= before + 2, f"{d.open_fds() - before} descriptors more after 1,100 malformed registers"


# Hold as many connections as the daemon takes (and try that many more); report how many it served.
_HOLD_MANY = """
import socket, sys, time
held, served, refused = [], 0, 0
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); held.append(s)
for s in held:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\\n')
deadline = time.monotonic() + 30
for s in held:
    s.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        line = s.makefile().readline()
    except OSError:
        continue
    served += '"result"' in line
    refused += "open-file limit" in line
print(served, refused, flush=True)
sys.stdin.readline()
"""


def test_a_member_cannot_take_the_descriptors_root_and_the_daemon_need(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon(config={"limits": {"max_connections": 2000, "max_connections_per_uid": 2000}}, nofile=NOFILE)
    open_to_members(d)
    holder = run_as(user, _HOLD_MANY, d.socket, "700")  # 1,400 descriptors in the daemon if all were served
    try:
        served, refused = map(int, holder.stdout.readline().split())
        assert refused > 0 and served + refused == 700, (served, refused)
        assert d.open_fds() < NOFILE - 32
        root = d.client()
        assert root.call("status")["jobs"] == []
        job = root.call("register", **FEATURES)  # a pin and a state save: the daemon still opens its files
        assert job["freq_hz"] == limits(orin)[0] and (orin / DEVFREQ).is_dir()
        assert "Traceback" not in d.log()
    finally:
        holder.kill()
        holder.wait()


def test_decimal_indexes_are_ascii_digits_only(monkeypatch):
    class Gpu:
        def __init__(self, gid):
            self.id, self.uuid = gid, None

    gpus = [Gpu("0"), Gpu("3")]
    assert find_gpu(gpus, "3") is gpus[1] and find_gpu(gpus, 3) is gpus[1]
    for text in ("\u00b2", "\u0663", "\uff13"):  # superscript two, Arabic-Indic three, fullwidth three
        with pytest.raises(GpuNotFound):
            find_gpu(gpus, text)
    with pytest.raises(ValueError, match="octal"):
        SocketConfig(mode="\u0660\u0666\u0666\u0660")
    assert Notifier({"WATCHDOG_USEC": "\u00b2"}).watchdog_s is None  # int() would raise at start-up
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "\u0663"}, None) is None  # CUDA reads ASCII digits too
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "3"}, None) == "3"
    assert Notifier({"WATCHDOG_USEC": "2000000"}).watchdog_s == 2.0


def test_every_logger_is_bounded(monkeypatch):
    """asyncio logs a failed accept with its traceback once per attempt: through the daemon's handler, its lines are
    bounded like a client's (the daemon's own lines never are)."""
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    saved = {name: (lg.handlers, lg.level, lg.propagate) for name in ("ftgovd", "governor", "asyncio", "")
             for lg in [logging.getLogger(name)]}
    try:
        logs.setup("info", journal=False)
        route_loggers()
        for _ in range(5000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                logging.getLogger("asyncio").exception("socket.accept() out of system resource")
        for _ in range(200):
            logging.getLogger("some.library").warning("noisy")
        logging.getLogger("ftgovd").info("the daemon's own line")
        logs.flush()
    finally:
        for name, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(name)
            lg.handlers, lg.level, lg.propagate = handlers, level, propagate
    text = stderr.getvalue()
    assert text.count("socket.accept() out of system resource") <= 60, text.count("out of system resource")
    assert text.count("noisy") <= 60 and "the daemon's own line" in text
    assert len(text.splitlines()) < 1000, f"{len(text.splitlines())} lines for 5,200 logged"


class _OutOfFdsSocket:
    """A connected socket whose peer's pidfd cannot be had: EMFILE, as when the daemon runs out of descriptors."""

    def getsockopt(self, level, option, size=None):
        if option == socket.SO_PEERCRED:
            return struct.pack("3i", os.getpid(), 1000, 1000)
        raise OSError(errno.EMFILE, "Too many open files")

    def fileno(self) -> int:
        return 1023


class _Transport:
    def __init__(self):
        self.sock, self.aborted, self.written = _OutOfFdsSocket(), False, []

    def get_extra_info(self, name):
        return self.sock if name == "socket" else None

    def abort(self):
        self.aborted = True

    def write(self, data):
        self.written.append(data)


def test_an_accept_that_runs_out_of_descriptors_is_a_refusal_not_a_half_built_connection():
    class Server:
        read_buffer = memoryview(bytearray(16))

        def opened(self, conn):
            raise AssertionError("a connection without its process must not be served")

    if peers.SO_PEERPIDFD is None:
        pytest.skip("no SO_PEERPIDFD on this architecture: the process is held by number")
    conn, transport = Connection(Server(), Holds(lambda job_id, why: None, lambda reg, process: None)), _Transport()
    conn.connection_made(transport)  # raised OSError into asyncio's accept before
    assert transport.aborted and conn.closed and not conn.counted and conn.process is None
    conn.connection_lost(None)  # what the aborted transport calls next: nothing to undo
