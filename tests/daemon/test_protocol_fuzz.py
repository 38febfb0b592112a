"""A seeded scenario fuzzer against the real ftgovd process: what a client can do to the daemon, round after round,
with the daemon's invariants checked after each round (docs/stress.md).

test_fuzz.py generates lines (hypothesis) and checks each line's reply; this one generates *sessions*: malformed and
truncated JSON, NaN/Infinity and huge numbers, duplicate keys, deep nesting, long lines and binary garbage; wrong types
in every parameter of every method; many requests pipelined on one connection; connections cut mid-line, mid-register,
between register and progress, half-closed with replies pending, cut while a request waits on a measurement; progress,
update, unregister, resume, set_level and job_energy for other connections' jobs; group registrations with inconsistent
rank and world_size; registrations naming other processes (pid 1, kernel threads, the daemon itself, a zombie, a process
that exits, a thread that is not its process's leader); tuned jobs driven by reports out of order on a board whose power
follows the pin; ranks of groups over four fake NVML GPUs whose ranks and world sizes may not fit; and random orders of
valid calls over several connections. After every round: the daemon answers ping, its descriptors are back to the count
they had before the round, no job or group is left, the GPU's min_freq/max_freq hold the baseline, the log holds no
traceback, and every error reply was a JSON-RPC error object with a code the protocol knows and a message that says
something.

Deterministic: one random.Random per round, from FTGOV_PFUZZ_SEED (default fixed); FTGOV_PFUZZ_ROUNDS sets the rounds.
Waits are on the daemon's replies (a ping, a status), never on sleeps.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from governor.daemon.protocol import METHODS
from governor.sim import tree
from governor.store.state import State
from tests.support import FAKENVML_DIR, REPO
from tests.support.daemon import FEATURES, Daemon, limits, scaled
from tests.support.security import open_to_members, run_as

SEED = int(os.environ.get("FTGOV_PFUZZ_SEED", "20250611"))
ROUNDS = int(os.environ.get("FTGOV_PFUZZ_ROUNDS", "12"))
BASELINE = (306000000, 1300500000)
MAX_LINE_BYTES = 64 * 1024  # the protocol's documented limit (README)
CODES = frozenset({-32700, -32600, -32601, -32602, -32000, -32001, -32002, -32003})
FAILS = ("Traceback", "Exception in callback", "internal error", "Task exception was never retrieved",
         "socket.send() raised",  # a reply written to a connection already lost (asyncio)
         "was never awaited")
DROP = object()
SLURM_JOB = 4242  # the one scheduler job id the fuzz may hold (released after each round)


# ---- a client that checks every reply ------------------------------------------------------------------------------


@dataclass
class Tally:
    requests: int = 0
    replies: int = 0
    errors: dict = field(default_factory=dict)
    messages: set = field(default_factory=set)  # (code, message head): read in the report

    def reply(self, reply: dict, ctx=None) -> dict:
        """Every reply: a JSON-RPC 2.0 result or error object; an error has a known code and a message."""
        assert reply.get("jsonrpc") == "2.0" and set(reply) in ({"jsonrpc", "id", "result"},
                                                                 {"jsonrpc", "id", "error"}), (ctx, reply)
        self.replies += 1
        if "error" in reply:
            err = reply["error"]
            assert isinstance(err, dict) and set(err) <= {"code", "message", "data"}, (ctx, reply)
            assert err.get("code") in CODES, (ctx, reply)
            msg = err.get("message")
            assert isinstance(msg, str) and msg.strip(), (ctx, reply)
            self.errors[err["code"]] = self.errors.get(err["code"], 0) + 1
            self.messages.add((err["code"], msg[:90]))
        else:
            assert isinstance(reply["result"], dict), (ctx, reply)
        return reply


TALLY = Tally()


class Client:
    """A raw connection whose replies are all checked (Tally.reply) and matched to their ids."""

    def __init__(self, path: str, timeout_s: float = 20.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(path)
        self.buf = bytearray()
        self.next_id = 1
        self.jobs: list[int] = []

    def new_id(self) -> int:
        rid, self.next_id = self.next_id, self.next_id + 1
        return rid

    def line(self, method: str, params=None, rid=None, **extra) -> bytes:
        msg = {"jsonrpc": "2.0", "method": method, **extra}
        if params is not None:
            msg["params"] = params
        if rid is not None:
            msg["id"] = rid
        return json.dumps(msg).encode() + b"\n"

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def pipeline(self, calls: list[tuple[str, dict, bool]]) -> None:
        """(method, params, notification) sent in one write; then one reply per request, in order, none for a
        notification."""
        expected, data = [], bytearray()
        for method, params, notification in calls:
            rid = None if notification else self.new_id()
            if rid is not None:
                expected.append(rid)
            data += self.line(method, params, rid)
        self.send(bytes(data))
        for rid in expected:
            assert self.read()["id"] == rid

    def read(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.buf += chunk
        nl = self.buf.index(b"\n")
        raw = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        return TALLY.reply(json.loads(raw), raw[:200])

    def request(self, method: str, **params) -> dict:
        rid = self.new_id()
        TALLY.requests += 1
        self.send(self.line(method, params, rid))
        reply = self.read()
        assert reply["id"] == rid, reply
        return reply

    def call(self, method: str, **params) -> dict:
        reply = self.request(method, **params)
        assert "result" in reply, (method, params, reply)
        return reply["result"]

    def register(self, **params) -> dict:
        """FEATURES and ``params``; a parameter given as DROP is left out (gpu_util: the daemon measures it)."""
        reply = self.request("register", **{k: v for k, v in {**FEATURES, **params}.items() if v is not DROP})
        if "result" in reply:
            self.jobs.append(reply["result"]["job_id"])
        return reply

    def close(self) -> None:
        self.sock.close()


# ---- what the daemon must be after every round ---------------------------------------------------------------------


@dataclass
class World:
    d: Daemon
    root: object
    probe: Client
    base_fds: int
    levels_hz: list
    baseline: bool = True  # the simulated Orin's limits (the fake NVML GPUs' are their own)
    log_at: int = 0
    spawned: list = field(default_factory=list)

    def client(self) -> Client:
        return Client(self.d.socket)

    def process(self) -> subprocess.Popen:
        """A child that lives until its stdin closes."""
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        self.spawned.append(proc)
        return proc

    def reap(self) -> None:
        for proc in self.spawned:
            if proc.poll() is None:
                proc.stdin.close()
            proc.wait(10)
        self.spawned.clear()


def settled(w: World, what: str) -> None:
    """The daemon's state after every client of the round closed: awaited through its replies (each status is a loop
    turn of the daemon's; a job ends with its connection's close or its process's exit, a turn or two later)."""
    status = {}
    for _ in range(500):
        status = w.probe.call("status")
        if not status["jobs"] and w.d.open_fds() == w.base_fds:
            break
    else:
        fds = sorted(os.readlink(f"/proc/{w.d.proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{w.d.proc.pid}/fd"))
        raise AssertionError(f"{what}: jobs {[j['job_id'] for j in status['jobs']]} left, {w.d.open_fds()} "
                             f"descriptors open, {w.base_fds} before: {fds}")
    assert all(gpu["pinned_hz"] is None for gpu in status["gpus"]), (what, status["gpus"])
    if w.baseline:
        gpu = status["gpus"][0]
        assert (gpu["min_hz"], gpu["max_hz"]) == BASELINE, (what, gpu)
    if w.root is not None:
        assert limits(w.root) == BASELINE, what
    assert status["groups"] == [] and status["holds"] == [], (what, status["groups"], status["holds"])
    assert w.probe.call("ping") == {}
    log = w.d.log_path.read_text(errors="replace")
    new, w.log_at = log[w.log_at:], len(log)
    bad = [m for m in FAILS if m in new]
    assert not bad, f"{what}: the log says {bad}:\n{new[-6000:]}"
    assert w.d.proc.poll() is None


# ---- lines broken below and at the JSON level ----------------------------------------------------------------------


def malformed(rng: random.Random, rid: int) -> tuple[bytes, str]:
    """A broken or odd line and what it must get: 'error' (one error reply), 'one' (one reply, result or error),
    'maybe' (at most one reply)."""
    good = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "register", "params": FEATURES}).encode()
    kind = rng.choice(["truncated", "nan", "huge", "dupkey", "nesting", "long", "garbage", "utf8", "nul", "top",
                       "crlf", "float_id", "bigint", "exp", "escape", "bom"])
    if kind == "truncated":
        return good[: rng.randrange(1, len(good) - 1)], "error"
    if kind == "nan":
        lit = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"1e999", b"-1e999"])
        where = rng.choice(["seq_len", "gpu_util", "num_layers", "id"])
        if where == "id":
            return b'{"jsonrpc":"2.0","id":' + lit + b',"method":"ping"}', "error"
        return good.replace(b'"%s": ' % where.encode() + json.dumps(FEATURES[where]).encode(),
                            b'"%s": ' % where.encode() + lit), "error"
    if kind == "huge":
        num = rng.choice([b"1" + b"0" * 30, b"-" + b"9" * 25, b"1e308", b"4.9e-324", b"1" + b"0" * 5000, b"-0",
                          b"0.0000000000000000000000000001", b"123456789012345678901234567890.5"])
        where = rng.choice(["seq_len", "gpu_util", "num_layers", "hidden_size"])
        return good.replace(b'"%s": ' % where.encode() + json.dumps(FEATURES[where]).encode(),
                            b'"%s": ' % where.encode() + num), "one"
    if kind == "dupkey":
        return rng.choice([
            b'{"jsonrpc":"2.0","id":%d,"method":"register","method":"ping"}' % rid,
            b'{"jsonrpc":"2.0","id":%d,"id":"x","method":"ping"}' % rid,
            b'{"jsonrpc":"1.0","jsonrpc":"2.0","id":%d,"method":"ping"}' % rid,
            b'{"jsonrpc":"2.0","id":%d,"method":"unregister","params":{"job_id":1,"job_id":"1"}}' % rid,
            b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{},"params":[]}' % rid,
        ]), "one"
    if kind == "nesting":
        depth = rng.choice([100, 1000, 30000])
        inner = b"[" * depth + b"]" * depth
        return rng.choice([inner, b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"a":%s}}' % (rid, inner),
                           b'{"a":' * depth + b"1" + b"}" * depth]), "one"
    if kind == "long":
        size = rng.choice([MAX_LINE_BYTES - 200, MAX_LINE_BYTES + 1, 3 * MAX_LINE_BYTES + 5])
        body = b'{"jsonrpc":"2.0","id":%d,"method":"register","params":{"name":"' % rid
        data = body + b"x" * (size - len(body) - 3) + b'"}}'
        return data, "error"
    if kind == "garbage":
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).replace(b"\n", b"")
        return data, ("maybe" if not data.strip() else "error")
    if kind == "utf8":
        cut = rng.randrange(len(good))
        return good[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"]) + \
            good[cut:], "error"
    if kind == "nul":
        return good.replace(b'"encoder"', b'"enc\\u0000oder"') if rng.random() < 0.5 else b"\x00" + good, "error"
    if kind == "top":
        return rng.choice([b"[]", b"[%s]" % good, b"null", b"1", b'"ping"', b"{}", b"true"]), "error"
    if kind == "crlf":
        return good + b"\r", "one"  # a line ended by CRLF: JSON whitespace
    if kind == "float_id":
        return rng.choice([b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', b'{"jsonrpc":"2.0","id":[1],"method":"ping"}',
                           b'{"jsonrpc":"2.0","id":true,"method":"ping"}',
                           b'{"jsonrpc":"2.0","id":%d,"method":"ping"}' % (1 << 60)]), "error"
    if kind == "bigint":
        return b'{"jsonrpc":"2.0","id":%d,"method":"progress","params":{"job_id":%d,"steps":%d}}' % (
            rid, rng.choice([1, 1 << 63, -1, 1 << 200]), rng.choice([1, 1 << 63, 1 << 62, -5])), "one"
    if kind == "exp":
        return b'{"jsonrpc":"2.0","id":%d,"method":"register","params":{"model_type":"encoder","num_layers":1e1,' \
               b'"hidden_size":7.68e2,"seq_len":4e1,"gpu_util":6e1}}' % rid, "error"
    if kind == "escape":
        return rng.choice([b'{"jsonrpc":"2.0","id":%d,"method":"\\u0070ing"}' % rid,
                           b'{"jsonrpc":"2.0","id":%d,"method":"ping\\ud800"}' % rid,
                           b'{"jsonrpc":"2.0","id":"\\udfff","method":"ping"}',
                           b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"\\ud800":1}}' % rid]), "one"
    return b"\xef\xbb\xbf" + good, "error"  # a byte-order mark


def s_malformed(w: World, rng: random.Random) -> None:
    """Broken lines pipelined on one connection, each followed by a ping that must be answered: every broken line
    gets what it promises, and nothing more."""
    c = w.client()
    plan, data = [], bytearray()
    for _ in range(rng.randrange(4, 14)):
        rid = c.new_id()
        line, expect = malformed(rng, rid)
        sentinel = c.new_id()
        plan.append((line, expect, sentinel))
        data += line + b"\n" + c.line("ping", rid=sentinel)
    step = rng.choice([len(data), 4096, 61])
    for i in range(0, len(data), step):
        c.send(bytes(data[i:i + step]))  # whole, or cut in pieces that split lines anywhere
    for line, expect, sentinel in plan:
        got = []
        while True:
            reply = c.read()
            if reply.get("id") == sentinel and reply.get("result") == {}:
                break
            got.append(reply)
        ctx = (line[:160], got)
        assert len(got) <= 1, ctx
        if expect == "error":
            assert len(got) == 1 and "error" in got[0], ctx
        elif expect == "one":
            assert len(got) == 1, ctx
        if got and "result" in got[0] and "job_id" in got[0]["result"] and "gpu" in got[0]["result"]:
            c.jobs.append(got[0]["result"]["job_id"])
    c.close()


# ---- wrong types in every parameter of every method ----------------------------------------------------------------


WRONG = [None, True, False, 0, -1, 1.5, -0.0, 1e308, 2**63, -(2**63), 2**200, "", "x", "0", "12", "NaN", " ",
         "\u00b2", "\u0663", "\x00", "\ud800", "a" * 300, [], [1], {}, {"a": 1}, [[[[[]]]]]]


def valid_params(method: str, job_id: int, freq_hz: int) -> dict:
    return {
        "register": dict(FEATURES),
        "update": {"job_id": job_id, "gpu_util": 50.0},
        "unregister": {"job_id": job_id},
        "resume": {"job_id": job_id},
        "progress": {"job_id": job_id, "steps": 1},
        "status": {}, "predict": dict(FEATURES), "ping": {}, "pin_check": {},
        "set_level": {"job_id": job_id, "freq_hz": freq_hz},
        "job_energy": {"job_id": job_id},
        "slurm_hold": {"slurm_job_id": SLURM_JOB, "uid": 0, "policy": "ffg"},
        "slurm_release": {"slurm_job_id": SLURM_JOB},
    }[method]


def wrong_typed(w: World, c: Client, method: str, name: str, value, job_id: int) -> dict:
    params = valid_params(method, job_id, w.levels_hz[-1])
    params[name] = value
    reply = c.request(method, **params)
    if "result" in reply:
        if method == "register":
            c.jobs.append(reply["result"]["job_id"])
        return reply
    err = reply["error"]
    if err["code"] == -32602:
        # A parameter's fault names its parameter (or "params" for a rule between parameters).
        assert err["message"].split(":")[0].split(".")[0] in (name, "params", "pid", "gpu") or name in err["message"], \
            (method, name, value, reply)
    return reply


def release_slurm(c: Client) -> None:
    reply = c.request("slurm_release", slurm_job_id=SLURM_JOB)
    assert "result" in reply or reply["error"]["code"] == -32003, reply


def s_wrong_types(w: World, rng: random.Random) -> None:
    c = w.client()
    job = c.register()["result"]["job_id"]
    for _ in range(rng.randrange(10, 40)):
        method = rng.choice(sorted(METHODS))
        fields = sorted(METHODS[method].model_fields) + ["bogus"]
        wrong_typed(w, c, method, rng.choice(fields), rng.choice(WRONG), job)
    release_slurm(c)
    c.close()


# ---- pipelining, disconnects, other connections' jobs --------------------------------------------------------------


def s_pipeline(w: World, rng: random.Random) -> None:
    """Many requests in one write; replies in order, one each (a notification none)."""
    c = w.client()
    job = c.register()["result"]["job_id"]
    calls = []
    for _ in range(rng.randrange(50, 400)):
        method = rng.choice(["ping", "status", "predict", "progress", "update", "progress", "job_energy", "ping"])
        params = valid_params(method, job, 0) if method != "progress" else {"job_id": job, "steps": rng.randrange(9)}
        if method == "update":
            params["gpu_util"] = float(rng.randrange(101))
        calls.append((method, params, rng.random() < 0.15))
    c.pipeline(calls)
    assert c.call("unregister", job_id=job)["job_id"] == job
    c.close()


def s_disconnects(w: World, rng: random.Random) -> None:
    """Connections cut at every point of a job's life; each round several at once, in a random order."""
    cuts = []
    for _ in range(rng.randrange(2, 7)):
        c = w.client()
        how = rng.choice(["mid-line", "mid-register", "unread-register", "after-register", "half-close",
                          "pipelined-close", "measuring", "predict-waiting", "exit-then-close", "mid-progress"])
        line = c.line("register", FEATURES, c.new_id())
        if how == "mid-line":
            c.send(line[: rng.randrange(1, len(line) - 1)])
        elif how == "mid-register":
            c.send(line[:-1])  # all but its newline
        elif how == "unread-register":
            c.send(line)  # closed before its reply is read
        elif how == "after-register":
            assert "result" in c.register()
        elif how == "half-close":
            c.send(line + c.line("progress", {"job_id": 1 << 40, "steps": 1}, c.new_id()))
            c.sock.shutdown(socket.SHUT_WR)
            replies = []
            while True:
                try:
                    replies.append(c.read())
                except ConnectionError:
                    break
            assert len(replies) == 2, replies  # what was asked before the end is answered
        elif how == "pipelined-close":
            c.send(line + b"".join(c.line("progress", {"job_id": j, "steps": 3}, c.new_id()) for j in range(1, 30)))
        elif how == "measuring":
            features = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
            c.send(c.line("register", {**features, "tune": rng.random() < 0.5}, c.new_id()))
        elif how == "predict-waiting":
            features = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
            c.send(c.line("predict", features, c.new_id()) + line)  # the register waits behind the measurement
        elif how == "exit-then-close":
            proc = w.process()
            assert "result" in c.register(pid=proc.pid)
            proc.stdin.close()
            proc.wait()
            c.send(c.line("progress", {"job_id": c.jobs[-1], "steps": 1}, c.new_id()))
        elif how == "mid-progress":
            assert "result" in c.register(tune=True)
            c.send(c.line("progress", {"job_id": c.jobs[-1], "steps": 5, "phase": "train"})[:-7])
        cuts.append(c)
    rng.shuffle(cuts)
    for c in cuts:
        if rng.random() < 0.3:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        c.close()


def s_cross(w: World, rng: random.Random) -> None:
    """Another connection's jobs (and job ids no one holds) are no one else's to touch."""
    owner, other = w.client(), w.client()
    jobs = [owner.register(tune=rng.random() < 0.5)["result"]["job_id"] for _ in range(rng.randrange(1, 4))]
    for _ in range(rng.randrange(5, 25)):
        job = rng.choice(jobs + [0, 1, max(jobs) + 1, 1 << 53])
        method = rng.choice(["progress", "unregister", "update", "set_level", "job_energy", "resume"])
        params = valid_params(method, job, rng.choice(w.levels_hz))
        reply = other.request(method, **params)
        assert "error" in reply and reply["error"]["code"] in (-32003, -32602), reply
    for job in jobs:
        assert owner.call("progress", job_id=job, steps=1) == {}
    ids = {j["job_id"] for j in w.probe.call("status")["jobs"]}
    assert set(jobs) <= ids
    for c in rng.sample([owner, other], 2):
        c.close()


def s_groups(w: World, rng: random.Random) -> None:
    """Group registrations that do not fit together (one GPU here: a second rank is refused)."""
    c = w.client()
    key = rng.choice(["run", "r" * 256, "é", "0"])
    for _ in range(rng.randrange(3, 12)):
        params = {"group": rng.choice([key, key, "other", "", "\t", None]),
                  "rank": rng.choice([None, 0, 1, 3, -1, 1 << 20, (1 << 20) + 1]),
                  "world_size": rng.choice([None, 0, 1, 2, 4, 1 << 20, -2])}
        params = {k: v for k, v in params.items() if v is not None or rng.random() < 0.3}
        reply = c.register(**params)
        if "result" in reply and rng.random() < 0.5:
            assert c.call("unregister", job_id=reply["result"]["job_id"])["job_id"] == reply["result"]["job_id"]
            c.jobs.remove(reply["result"]["job_id"])
        elif "result" in reply:
            job = reply["result"]["job_id"]
            for method, params in (("set_level", {"freq_hz": rng.choice(w.levels_hz)}), ("job_energy", {}),
                                   ("progress", {"steps": 3, "compute_s": 0.1})):
                c.request(method, job_id=job, **params)
    c.close()


def s_pids(w: World, rng: random.Random) -> None:
    """Registrations naming other processes (root may name any process; its job lives while it does)."""
    c = w.client()
    zombie = subprocess.Popen(["true"])
    zombie_pid = zombie.pid
    threads_ready, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (threads_ready.set(), stop.wait()))
    t.start()
    threads_ready.wait()
    try:
        pids = [1, 2, w.d.proc.pid, os.getpid(), (1 << 22) + 7, (1 << 31) - 1, t.native_id, zombie_pid]
        for pid in rng.sample(pids, rng.randrange(2, len(pids))):
            if pid == zombie_pid:  # exited and not reaped yet: a zombie
                os.waitid(os.P_PID, zombie_pid, os.WEXITED | os.WNOWAIT)
            reply = c.register(pid=pid)
            if "error" in reply:
                assert reply["error"]["code"] in (-32602, -32001), reply
                assert pid not in (1, w.d.proc.pid, os.getpid()), reply
            if pid == zombie_pid:
                assert "error" in reply, reply
        proc = w.process()
        job = c.register(pid=proc.pid)["result"]["job_id"]
        proc.stdin.close()
        proc.wait()
        reply = c.request("unregister", job_id=job)  # its process's end, or this: either ends it, once
        assert "result" in reply, reply
    finally:
        stop.set()
        t.join()
        zombie.wait()
    c.close()


def s_random(w: World, rng: random.Random) -> None:
    """Valid calls in random order over several connections, some closed mid-way."""
    conns = [w.client() for _ in range(rng.randrange(1, 5))]
    open_ = list(conns)
    for _ in range(rng.randrange(10, 60)):
        if not open_:
            break
        c = rng.choice(open_)
        op = rng.choice(["register", "register", "progress", "update", "unregister", "status", "predict",
                         "close", "set_level", "job_energy", "notify"])
        job = rng.choice(c.jobs) if c.jobs and rng.random() < 0.9 else rng.randrange(1, 200)
        if op == "register":
            c.register(tune=rng.random() < 0.4, **({"gpu_util": DROP} if rng.random() < 0.3 else {}))
        elif op == "progress":
            c.request("progress", job_id=job, steps=rng.randrange(0, 1000),
                      phase=rng.choice(["train", "eval", "checkpoint", "data", None]))
        elif op == "update":
            c.request("update", job_id=job, gpu_util=rng.uniform(0, 100), seq_len=rng.uniform(1, 512))
        elif op == "unregister":
            reply = c.request("unregister", job_id=job)
            if "result" in reply and job in c.jobs:
                c.jobs.remove(job)
        elif op in ("status", "predict"):
            c.request(op, **({} if op == "status" else FEATURES))
        elif op == "set_level":
            c.request("set_level", job_id=job, freq_hz=rng.choice(w.levels_hz))
        elif op == "job_energy":
            c.request("job_energy", job_id=job)
        elif op == "notify":
            c.send(c.line("progress", {"job_id": job, "steps": rng.randrange(100)}))
        else:
            c.close()
            open_.remove(c)
    for c in open_:
        c.close()


def s_tuned(w: World, rng: random.Random) -> None:
    """Tuned jobs (alone, or a group of one) driven by reports in odd orders: steps that go back, total_steps below
    the steps done, step ends out of order, phases, compute times, updates and set_level in between; pipelined."""
    c = w.client()
    extra: dict = {"tune": True, "total_steps": rng.choice([None, 1, 7, 300, 1 << 62])}
    if rng.random() < 0.4:
        extra.update(group=f"g{rng.randrange(3)}", rank=0, world_size=rng.choice([None, 1, 2]))
    if rng.random() < 0.3:
        extra["gpu_util"] = DROP
    reply = c.register(**{k: v for k, v in extra.items() if v is not None})
    if "error" in reply:
        c.close()
        return
    job = reply["result"]["job_id"]
    steps, calls = 0, []
    for _ in range(rng.randrange(20, 400)):
        steps = max(0, steps + rng.choice([1, 1, 1, 1, 2, 8, 0, -3]))
        params: dict = {"job_id": job, "steps": steps}
        if rng.random() < 0.5:
            params["step_end_s"] = time.monotonic() - rng.choice([0.0, 0.0, 0.3, 5.0, 700.0, -2.0])
        if rng.random() < 0.3:
            params["phase"] = rng.choice(["train", "eval", "checkpoint", "data"])
        if rng.random() < 0.05:
            params["total_steps"] = rng.choice([1, steps + 1, max(1, steps // 2), 1 << 62])
        if rng.random() < 0.3:
            params["compute_s"] = rng.choice([0.0, 0.001, 0.05, 86400.0])
        method = "progress"
        roll = rng.random()
        if roll < 0.05:
            method, params = "update", {"job_id": job, "seq_len": rng.uniform(1, 4096), "gpu_util": rng.uniform(0, 100)}
        elif roll < 0.08:
            method, params = "set_level", {"job_id": job, "freq_hz": rng.choice(w.levels_hz)}
        elif roll < 0.10:
            method, params = "job_energy", {"job_id": job}
        calls.append((method, params, rng.random() < 0.5))
    c.pipeline(calls)
    if rng.random() < 0.5:
        reply = c.request("unregister", job_id=job)
        assert "result" in reply, reply
    c.close()


def s_nvml_groups(w: World, rng: random.Random) -> None:
    """Ranks of a few groups over four GPUs, with ranks and world sizes that may not fit, some processes ending: a
    group never holds more ranks than its world size, nor a rank at or above it."""
    conns = [w.client() for _ in range(rng.randrange(1, 4))]
    procs = []
    for _ in range(rng.randrange(4, 16)):
        c = rng.choice(conns)
        proc = w.process()
        procs.append(proc)
        tag = {"group": rng.choice(["a", "b"]), "rank": rng.choice([None, 0, 1, 2, 3, 5]),
               "world_size": rng.choice([None, 1, 2, 3, 4, 6])}
        tag = {k: v for k, v in tag.items() if v is not None}
        if tag.get("rank", 0) >= tag.get("world_size", 1 << 30):
            del tag["rank"]
        c.register(pid=proc.pid, gpu=rng.randrange(4), **tag)
        if rng.random() < 0.2:
            proc.stdin.close()
        for group in w.probe.call("status")["groups"]:
            ranks = [r["rank"] for r in group["ranks"] if r["rank"] is not None]
            if group["world_size"] is not None:
                assert len(group["ranks"]) <= group["world_size"] and all(r < group["world_size"] for r in ranks), group
            assert len(ranks) == len(set(ranks)), group
        if c.jobs and rng.random() < 0.5:
            c.request("progress", job_id=rng.choice(c.jobs), steps=rng.randrange(50))
    for c in conns:
        c.close()


SCENARIOS: dict[str, Callable[[World, random.Random], None]] = {
    "malformed": s_malformed, "wrong_types": s_wrong_types, "pipeline": s_pipeline, "disconnects": s_disconnects,
    "cross": s_cross, "groups": s_groups, "pids": s_pids, "random": s_random, "tuned": s_tuned,
    "nvml_groups": s_nvml_groups,
}


# ---- the daemon ----------------------------------------------------------------------------------------------------


LIMITS = {"max_jobs": 256, "max_jobs_per_uid": 256, "max_jobs_per_connection": 64, "max_connections": 1024,
          "max_connections_per_uid": 1024}
# Windows of a few steps, no baseline window: a tuned job's search moves the pin within a round's reports.
TUNER = {"baseline_window": False, "warmup_steps": 1, "window_steps": 3}


def start_world(d: Daemon, root, baseline: bool = True) -> World:
    d.start()
    probe = Client(d.socket)
    status = probe.call("status")
    w = World(d, root, probe, d.open_fds(), sorted(status["gpus"][0]["available_hz"]), baseline)
    settled(w, "start")
    return w


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The simulated Orin's files (tree.build): the GPU's min_freq and max_freq are read back after every round."""
    root = tree.build(tmp_path_factory.mktemp("pfuzz") / "root", "jp6").root
    d = Daemon(root, config=scaled(0.02, {"limits": LIMITS, "tuner": TUNER}))
    try:
        yield start_world(d, root)
    finally:
        d.close()


@pytest.fixture(scope="module")
def sim_world():
    """ftgovd --simulate: a board whose power follows the pin, so that tuned jobs' windows measure and move it."""
    d = Daemon(None, simulate=True, config=scaled(0.02, {"limits": LIMITS, "tuner": TUNER}))
    try:
        yield start_world(d, None)
    finally:
        d.close()


@pytest.mark.parametrize("round_no", range(ROUNDS))
def test_a_round_of_hostile_clients_leaves_the_daemon_as_it_was(world, round_no):
    play_round(world, round_no, sorted(set(SCENARIOS) - {"nvml_groups"}))


@pytest.mark.parametrize("round_no", range(ROUNDS // 2))
def test_a_round_on_a_board_that_follows_the_pin(sim_world, round_no):
    play_round(sim_world, 5000 + round_no, ["cross", "disconnects", "groups", "random", "tuned", "tuned"])


@pytest.fixture(scope="module")
def nvml_world(tmp_path_factory):
    """Four fake NVML GPUs (tests/support/fakenvml): groups whose ranks each have a GPU of their own."""
    tmp = tmp_path_factory.mktemp("pfuzz-nvml")
    gpu = {"graphics_clocks_mhz": {"3201": [1980, 1500, 1005, 510]}, "util_gpu_pct": 80, "meter_update_s": 0}
    (tmp / "fakenvml.json").write_text(json.dumps({"gpus": [dict(gpu) for _ in range(4)]}))
    env = {"FAKENVML_CONFIG": str(tmp / "fakenvml.json"), "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
    d = Daemon(tmp / "no-jetson", env=env, config={"backend": "nvml", "policy": "tune", "limits": {
        **LIMITS, "repin_interval_s": 0.01}, "tuner": {**TUNER, "window_rule": "steps", "settle_updates": 0}})
    try:
        yield start_world(d, None, baseline=False)
    finally:
        d.close()


@pytest.mark.parametrize("round_no", range(ROUNDS // 3))
def test_a_round_of_group_ranks_that_may_not_fit(nvml_world, round_no):
    play_round(nvml_world, 9000 + round_no, ["nvml_groups"])


def play_round(world: World, round_no: int, scenarios: list[str]) -> None:
    rng = random.Random(SEED * 100000 + round_no)
    names = [rng.choice(scenarios) for _ in range(rng.randrange(3, 9))]
    try:
        for name in names:
            SCENARIOS[name](world, rng)
            settled(world, f"round {round_no} ({SEED}), after {name}")
    finally:
        world.reap()


def test_every_parameter_of_every_method_refuses_wrong_types(world):
    """Every field of every method (and one that is none), each wrong value: one reply each, a JSON-RPC error naming
    the field unless the value happens to be good; pipelined 200 at a time."""
    c = world.client()
    job = c.register()["result"]["job_id"]
    sent = 0
    for method in sorted(METHODS):
        for name in [*sorted(METHODS[method].model_fields), "bogus"]:
            for value in WRONG:
                wrong_typed(world, c, method, name, value, job)
                sent += 1
    release_slurm(c)
    c.close()
    settled(world, "every wrong type")
    assert sent > 500



# ---- the same, from a member: an unprivileged client, as the socket's group lets in ---------------------------------

# Sends its lines (hex, one JSON list on stdin) in pieces of argv[2] bytes (0: one write), half-closes, prints every
# reply until the daemon closes.
_MEMBER_SESSION = """
import json, socket, sys
lines = [bytes.fromhex(h) for h in json.loads(sys.stdin.readline())]
data = b"".join(line + b"\\n" for line in lines)
step = int(sys.argv[2]) or len(data)
s = socket.socket(socket.AF_UNIX); s.settimeout(60); s.connect(sys.argv[1])
for i in range(0, len(data), step):
    s.sendall(data[i:i + step])
s.shutdown(socket.SHUT_WR)
out = b""
while (got := s.recv(65536)):
    out += got
sys.stdout.write(out.decode())
"""


def _member_lines(root_job: int, daemon_pid: int) -> list[tuple[bytes, object, frozenset, str | None]]:
    """(line, the id its reply carries, the error codes it may get, the field its -32602 must name)."""
    out = []

    def add(method: str, params: dict, codes: set, field: str | None = None) -> None:
        rid = len(out) + 1
        out.append((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode(), rid,
                    frozenset(codes), field))

    for method in sorted(METHODS):
        for name in [*sorted(METHODS[method].model_fields), "bogus"]:
            for value in ([], {}, "\x00"):  # wrong for every field (an empty list of GPUs asks root's slurm_hold)
                add(method, {**valid_params(method, root_job, 714000000), name: value}, {-32602, -32001}, name)
    for method in ("unregister", "progress", "update", "set_level", "job_energy", "resume"):
        add(method, valid_params(method, root_job, 714000000), {-32003})  # root's job, on another connection
    for method in ("slurm_hold", "slurm_release"):
        add(method, valid_params(method, root_job, 714000000), {-32001})
    for pid in (1, daemon_pid):
        add("register", {**FEATURES, "pid": pid}, {-32001})
    for line, code in ((b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}', -32700), (b"[" * 60000, -32700),
                       (b'{"jsonrpc":"2.0","id":5,"method":"ping\xff"}', -32700),
                       (b"x" * (MAX_LINE_BYTES + 1), -32600)):
        out.append((line, None, frozenset({code}), None))
    return out


@pytest.mark.parametrize("piece_bytes", [0, 7])
def test_a_members_bad_requests_each_get_an_error_and_leave_roots_job_and_the_daemon_as_they_were(
        orin, start_daemon, member, piece_bytes):
    """A member's session of bad requests (every field of every method wrong, root's job asked for on another
    connection, root's methods, processes not its own, lines that are no request), pipelined whole or cut in pieces
    across lines, then half-closed: one error per line, in order, with its id, a known code and the field named; then
    root's job is untouched, its pin stands, every descriptor of the session is closed and the state file holds the
    pin."""
    user, _uid = member
    d = start_daemon()
    open_to_members(d)
    root = d.client()
    job = root.call("register", **FEATURES)["job_id"]
    before = d.open_fds()
    lines = _member_lines(job, d.proc.pid)
    out, err = run_as(user, _MEMBER_SESSION, d.socket, str(piece_bytes)).communicate(
        json.dumps([line.hex() for line, *_ in lines]) + "\n", timeout=120)
    replies = [json.loads(raw) for raw in out.splitlines()]
    assert len(replies) == len(lines), (err, replies[-3:])
    for (line, rid, codes, named), reply in zip(lines, replies, strict=True):
        error = TALLY.reply(reply, line[:120])["error"]
        assert reply["id"] == rid and error["code"] in codes, (line[:200], reply)
        if error["code"] == -32602 and named is not None:
            assert named in error["message"] or error["message"].startswith("params"), (line[:200], reply)
    assert d.open_fds() == before  # the member saw the end once the daemon had closed its socket and its pidfd
    [held] = root.call("status")["jobs"]
    assert (held["job_id"], held["steps"], held["freq_hz"]) == (job, 0, 714000000)
    assert limits(orin) == (714000000, 714000000)
    assert State.from_json((d.state_dir / "state.json").read_bytes()).gpus["0"].pinned_hz == 714000000
    assert root.call("unregister", job_id=job)["job_id"] == job
    assert limits(orin) == BASELINE
