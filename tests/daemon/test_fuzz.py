"""Protocol fuzzing and hostile clients against the real ftgovd process (docs/stress.md).

Hypothesis generates lines, valid and invalid (wrong types, huge and negative numbers, NaN/Infinity, deep nesting,
unicode, invalid UTF-8, oversized, binary garbage, a last line without its newline), spreads them over several
connections and cuts them into fragments that arrive interleaved. Each line carries what the protocol promises for
it: exactly one reply (with its id, or with a null id when the id itself could not be read), none for a valid
notification or a blank line, at most one for a broken notification. After every example the daemon must still
serve; at the end no job is left, the GPU is at its baseline and the daemon's log holds no traceback.

FTGOV_FUZZ_EXAMPLES sets the number of examples (CI: a few hundred, about 1,500 lines; `make stress`: enough for
10,000+ lines); FTGOV_FUZZ_REPORT names a JSON file that receives the line count and the time.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.features import MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_SEQ_LEN, MIN_SEQ_LEN
from governor.sim import tree
from tests.support.daemon import FEATURES, Daemon, Rpc, limits

BASELINE = (306000000, 1300500000)
MAX_LINE_BYTES = 64 * 1024  # the protocol's documented limit (README), not imported: the test states the contract
FUZZ_EXAMPLES = int(os.environ.get("FTGOV_FUZZ_EXAMPLES", "350"))
SENTINEL = "sync\u0001end"

# ---- what each line promises ---------------------------------------------------------------------------------------


@dataclass
class Line:
    data: bytes  # without its newline
    min_replies: int
    max_replies: int
    ids: tuple = (None,)  # the ids a reply may carry
    result_ok: bool = True  # may the reply be a result (not only an error)?
    error_codes: frozenset | None = None  # allowed error codes; None: any JSON-RPC error code


SCHEMA_ERRORS = frozenset({-32700, -32600, -32601})
ALL_CODES = frozenset({-32700, -32600, -32601, -32602, -32000, -32001, -32002, -32003})

# ---- strategies ----------------------------------------------------------------------------------------------------

ODD_TEXT = st.sampled_from(["", "\x00", "\ud800", "\udfff", "\u2028", "é", "😀", "a" * 300, "\n", "\"", "\\",
                            "register", "NaN", "-0"])
ODD_NUMBERS = st.sampled_from([0, -1, 2**31, 2**53 + 1, -(2**63), 2**64, 1e308, -1e-308, 5e-324, 0.5, -0.0,
                               float("nan"), float("inf"), float("-inf")])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), ODD_NUMBERS, st.text(max_size=12), ODD_TEXT)
JSON_VALUES = st.recursive(LEAVES, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                        max_size=4), max_leaves=12)

FEATURE_PARAMS = st.fixed_dictionaries(
    {"model_type": st.sampled_from(["encoder", "decoder"]), "num_layers": st.integers(1, MAX_LAYERS),
     "hidden_size": st.integers(1, MAX_HIDDEN_SIZE),
     "seq_len": st.floats(min_value=MIN_SEQ_LEN, max_value=MAX_SEQ_LEN) | st.integers(1, int(MAX_SEQ_LEN))},
    optional={"gpu_util": st.floats(0, 100) | st.integers(0, 100)})
JOB_ID = st.integers(1, 60)
VALID_PARAMS = {
    "ping": st.just({}),
    "status": st.just({}),
    "predict": FEATURE_PARAMS,
    "register": st.builds(lambda f, extra: {**f, **extra}, FEATURE_PARAMS, st.fixed_dictionaries({}, optional={
        "name": st.text(max_size=40) | ODD_TEXT.filter(lambda s: len(s) <= 256),
        "pid": st.sampled_from([os.getpid(), 1, (1 << 31) - 1]),
        "gpu": st.sampled_from([0, "0", 1, "GPU-00000000-0000-0000-0000-000000000000"]),
        "tune": st.booleans()})),
    "update": st.fixed_dictionaries({"job_id": JOB_ID}, optional={"gpu_util": st.floats(0, 100),
                                                                  "seq_len": st.floats(1, 4096)}),
    "unregister": st.fixed_dictionaries({"job_id": JOB_ID}),
    "progress": st.fixed_dictionaries({"job_id": JOB_ID, "steps": st.integers(0, 1 << 62)},
                                      optional={"phase": st.sampled_from(["train", "eval", "checkpoint", "data"])}),
}
BAD_IDS = st.one_of(st.floats(), st.booleans(), st.lists(st.integers(), max_size=2), st.just({}),
                    st.just(2**53 + 1), st.just(-(2**60)), st.just("x" * 257))


def dumps(obj, ascii_only: bool) -> bytes:
    text = json.dumps(obj, ensure_ascii=ascii_only)  # NaN/Infinity come out as the non-JSON literals on purpose
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes invalid UTF-8 on the wire


@st.composite
def valid_lines(draw, next_id) -> Line:
    method = draw(st.sampled_from(sorted(VALID_PARAMS)))
    params = draw(VALID_PARAMS[method])
    msg = {"jsonrpc": "2.0", "method": method}
    if draw(st.booleans()) or params:
        msg["params"] = params
    ascii_only = draw(st.booleans())
    raw_ok = ascii_only or not _has_surrogate(params)
    if draw(st.integers(0, 5)) == 0:  # a notification: no reply whatever it says, when it is readable
        return Line(dumps(msg, ascii_only), 0, 0) if raw_ok else Line(dumps(msg, ascii_only), 0, 1, (None,), False)
    rid = next_id()
    msg["id"] = rid
    if not raw_ok:
        return Line(dumps(msg, ascii_only), 1, 1, (None,), False, frozenset({-32700}))
    # A valid request may still fail on what it names (a pid that does not exist, a GPU that is not there, a job of
    # another connection, a full job table, a pin that did not take) but never on its shape.
    return Line(dumps(msg, ascii_only), 1, 1, (rid,), True, ALL_CODES - SCHEMA_ERRORS)


@st.composite
def mutated_lines(draw, next_id) -> Line:
    """A valid-looking request with one thing wrong (or, by chance, nothing wrong)."""
    method = draw(st.sampled_from(sorted(VALID_PARAMS)))
    params = dict(draw(VALID_PARAMS[method]))
    msg: dict = {"jsonrpc": "2.0", "method": method, "params": params}
    rid = next_id()
    id_kind = draw(st.sampled_from(["good", "good", "good", "none", "bad"]))
    if id_kind == "good":
        msg["id"] = rid
    elif id_kind == "bad":
        msg["id"] = draw(BAD_IDS)
    how = draw(st.sampled_from(["value", "drop", "extra", "method", "jsonrpc", "params", "member", "top"]))
    if how == "value" and params:
        params[draw(st.sampled_from(sorted(params)))] = draw(JSON_VALUES)
    elif how == "drop" and params:
        del params[draw(st.sampled_from(sorted(params)))]
    elif how == "extra":
        params[draw(st.text(max_size=10) | ODD_TEXT)] = draw(JSON_VALUES)
    elif how == "method":
        msg["method"] = draw(JSON_VALUES | ODD_TEXT)
    elif how == "jsonrpc":
        msg["jsonrpc"] = draw(st.sampled_from(["1.0", "2", 2.0, None, ""]) | JSON_VALUES)
    elif how == "params":
        msg["params"] = draw(JSON_VALUES)
    elif how == "member":
        msg[draw(st.sampled_from(["result", "error", "Method", "x" * 100]) | st.text(max_size=10))] = draw(JSON_VALUES)
    elif how == "top":
        msg = draw(JSON_VALUES)  # not an object, or an object that is not a request
    return _expect(msg, dumps(msg, draw(st.booleans())))


@st.composite
def byte_lines(draw, next_id) -> Line:
    """Lines that are broken below the JSON level."""
    kind = draw(st.sampled_from(["garbage", "utf8", "nesting", "oversized", "hugeint", "blank"]))
    if kind == "garbage":
        data = draw(st.binary(max_size=200)).replace(b"\n", b" ")
        blank = not data.strip()
        return Line(data, 0 if blank else 1, 0 if blank else 1, (None,), False)
    if kind == "utf8":
        good = json.dumps({"jsonrpc": "2.0", "id": next_id(), "method": "ping"}).encode()
        cut = draw(st.integers(0, len(good)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"]))
        return Line(good[:cut] + bad + good[cut:], 1, 1, (None,), False, frozenset({-32700}))
    if kind == "nesting":
        depth = draw(st.sampled_from([50, 1000, 5000, 20000]))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        inner = opener * depth + b"1" + closer * depth
        if draw(st.booleans()):
            rid = next_id()
            data = b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"x":' % rid + inner + b"}}"
            if len(data) > MAX_LINE_BYTES:
                return Line(data, 1, 1, (None,), False, frozenset({-32600}))
            return Line(data, 1, 1, (rid, None), False)
        return Line(inner, 1, 1, (None,), False, frozenset({-32700, -32600}))
    if kind == "oversized":
        size = draw(st.sampled_from([MAX_LINE_BYTES + 1, MAX_LINE_BYTES + 7, 3 * MAX_LINE_BYTES, 1 << 20]))
        pad = draw(st.sampled_from([b"a", b"\xff", b"[", b" "]))
        body = b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"x":"' % next_id()
        return Line(body + pad * (size - len(body)), 1, 1, (None,), False, frozenset({-32600}))
    if kind == "hugeint":
        digits = draw(st.sampled_from([20, 400, 4301, 20000]))
        rid = next_id()
        data = b'{"jsonrpc":"2.0","id":%d,"method":"register","params":{"model_type":"encoder","num_layers":' % rid
        data += b"-" * draw(st.integers(0, 1)) + b"9" * digits + b',"hidden_size":768,"seq_len":40,"gpu_util":50}'
        return Line(data, 1, 1, (rid, None), False)
    return Line(draw(st.sampled_from([b"", b" ", b"\t", b"\r", b" \r\t "])), 0, 0)


def _has_surrogate(obj) -> bool:
    """A lone surrogate anywhere (it cannot be encoded as UTF-8; an emoji can)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(obj, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_surrogate(v) for v in obj)
    return False


def _expect(msg, data: bytes) -> Line:
    """What the protocol promises for a message whose validity we do not claim to know."""
    if not isinstance(msg, dict):
        return Line(data, 1, 1, (None,), False)
    mid = msg.get("id")
    if mid is None:
        return Line(data, 0, 1, (None,), False)  # no id, or "id": null: a notification, answered only if unreadable
    if isinstance(mid, (int, str)) and not isinstance(mid, bool):
        return Line(data, 1, 1, (mid, None))  # null when the line as a whole was unreadable (NaN, invalid UTF-8)
    return Line(data, 1, 1, (None,), False)


@st.composite
def sessions(draw):
    """1-3 connections, each with 1-5 lines; their bytes cut into fragments and interleaved; maybe a last line
    without its newline when the connection closes."""
    counter = iter(range(1, 1 << 30))
    base = draw(st.integers(0, 1 << 40))

    def next_id():
        return base + next(counter)

    line_st = st.one_of(valid_lines(next_id), mutated_lines(next_id), byte_lines(next_id))
    conns = []
    for _ in range(draw(st.integers(1, 3))):
        lines = draw(st.lists(line_st, min_size=1, max_size=5))
        stream = b"".join(line.data + b"\n" for line in lines)
        stream += json.dumps({"jsonrpc": "2.0", "id": SENTINEL, "method": "ping"}).encode() + b"\n"
        tail = draw(st.sampled_from([b"", b"", b"", b'{"jsonrpc":"2.0","id":1,"method":"pi', b"\xff\xfe"]))
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=4))))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)] + ([tail] if tail else [])
        conns.append((lines, pieces))
    order = draw(st.permutations([i for i, (_l, p) in enumerate(conns) for _ in p]))
    return conns, order


# ---- the running daemon --------------------------------------------------------------------------------------------


@dataclass
class Tally:
    examples: int = 0
    lines: int = 0
    replies: int = 0
    results: int = 0
    errors: dict = field(default_factory=dict)
    started_s: float = field(default_factory=time.perf_counter)


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    root = tree.build(tmp_path_factory.mktemp("fuzz") / "root", "jp6").root
    # Enough connections and jobs that the limits answer only where the fuzz means them to; gpu_util measured
    # in one sample so that registrations without it stay fast.
    d = Daemon(root, config={"util_sample_s": 0, "limits": {"max_jobs": 256, "max_jobs_per_uid": 256,
                                                             "max_connections": 1024,
                                                             "max_connections_per_uid": 1024}}).start()
    yield d, root
    d.close()


def _read_until_sentinel(sock: socket.socket, buf: bytearray) -> list[dict]:
    replies = []
    while True:
        while b"\n" not in buf:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise AssertionError(f"daemon closed the connection before the sentinel; got {replies}")
            buf += chunk
        nl = buf.index(b"\n")
        reply = json.loads(bytes(buf[:nl]))
        del buf[: nl + 1]
        if reply.get("id") == SENTINEL:
            assert reply.get("result") == {}, reply
            return replies
        replies.append(reply)


def check_replies(lines: list[Line], replies: list[dict], tally: Tally) -> None:
    """Replies come in line order: find an assignment of replies to lines that keeps every line's promise. Lines that
    may get zero or one reply make it ambiguous (a null-id error could be theirs or the next line's), so every way
    of giving them a reply is tried (at most 2^5 per connection)."""
    optional = [n for n, line in enumerate(lines) if line.max_replies > line.min_replies]
    for mask in range(1 << len(optional)):
        takes = [line.min_replies for line in lines]
        for bit, n in enumerate(optional):
            takes[n] += mask >> bit & 1
        if sum(takes) != len(replies):
            continue
        pairs, i = [], 0
        for line, take in zip(lines, takes, strict=False):
            pairs += [(line, reply) for reply in replies[i: i + take]]
            i += take
        if all(_fits(line, reply) for line, reply in pairs):
            for line, reply in pairs:
                _check_one(line, reply, tally)
            return
    raise AssertionError(("no assignment of replies to lines keeps the protocol's promises",
                          [(line.data[:120], line.min_replies, line.max_replies) for line in lines], replies))


def _fits(line: Line, reply: dict) -> bool:
    try:
        _check_one(line, reply, Tally())
    except AssertionError:
        return False
    return True


def _check_one(line: Line, reply: dict, tally: Tally) -> None:
    ctx = (line.data[:200], reply)
    shapes = ({"jsonrpc", "id", "result"}, {"jsonrpc", "id", "error"})
    assert reply.get("jsonrpc") == "2.0" and set(reply) in shapes, ctx
    assert reply["id"] in line.ids, ctx
    tally.replies += 1
    if "result" in reply:
        assert line.result_ok and isinstance(reply["result"], dict), ctx
        tally.results += 1
        return
    err = reply["error"]
    assert isinstance(err.get("code"), int) and isinstance(err.get("message"), str) and err["message"], ctx
    assert err["code"] in (line.error_codes or ALL_CODES), ctx
    tally.errors[err["code"]] = tally.errors.get(err["code"], 0) + 1


TALLY = Tally()


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(session=sessions())
def test_fuzzed_lines_each_get_their_reply_and_the_daemon_keeps_serving(fuzz_daemon, session):
    d, root = fuzz_daemon
    conns, order = session
    TALLY.examples += 1
    socks = []
    for _ in conns:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(d.socket)
        socks.append(s)
    try:
        cursor = [0] * len(conns)
        for k in order:
            socks[k].sendall(conns[k][1][cursor[k]])
            cursor[k] += 1
        held_jobs = 0
        for s, (lines, _pieces) in zip(socks, conns, strict=True):
            replies = _read_until_sentinel(s, bytearray())
            check_replies(lines, replies, TALLY)
            TALLY.lines += len(lines)
            results = [r["result"] for r in replies if "result" in r]
            held_jobs += sum("gpu" in r and "job_id" in r for r in results)  # registered
            held_jobs -= sum("duration_s" in r for r in results)  # unregistered
        d.notify.drain()  # every line is answered: what comes now is about the closes
        for s in socks:
            s.shutdown(socket.SHUT_WR)  # a last line without its newline gets no reply: the stream just ends
            assert s.recv(1 << 16) == b"", "a reply to a line that never ended"
    finally:
        for s in socks:
            s.close()
    if held_jobs:
        d.wait_jobs(0)  # the jobs this example registered end with their connections
    assert d.proc.poll() is None, d.log()


def test_after_the_fuzz_no_job_is_left_and_the_gpu_is_at_its_baseline(fuzz_daemon):
    if not TALLY.examples:  # selected alone (-k): there is no fuzz to check the aftermath of
        pytest.skip("checks what the fuzz test before it left: run the module, or both")
    d, root = fuzz_daemon
    c = Rpc(d.socket)
    status = c.call("status")
    assert status["jobs"] == [] and (status["gpus"][0]["min_hz"], status["gpus"][0]["max_hz"]) == BASELINE
    assert status["gpus"][0]["pinned_hz"] is None and limits(root) == BASELINE
    assert c.call("register", **FEATURES)["freq_hz"] == 714000000  # and it still pins
    d.notify.drain()  # the fuzz left STATUS= messages queued: wait for the one this close causes
    c.close()
    d.wait_jobs(0)
    assert limits(root) == BASELINE
    log = d.log()
    assert "Traceback" not in log and "Exception in callback" not in log, log[-5000:]
    assert TALLY.lines > 0 and TALLY.replies > 0
    report = os.environ.get("FTGOV_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"lines": TALLY.lines, "replies": TALLY.replies, "results": TALLY.results,
                       "errors": {str(k): v for k, v in sorted(TALLY.errors.items())},
                       "seconds": time.perf_counter() - TALLY.started_s}, f)


# ---- hostile clients (liveness only here; latencies under load are benchmarks/stress.py's) -------------------------


@pytest.fixture(scope="module")
def hostile_daemon(tmp_path_factory):
    root = tree.build(tmp_path_factory.mktemp("hostile") / "root", "jp6").root
    d = Daemon(root, config={"limits": {"max_connections": 1024, "max_connections_per_uid": 1024}}).start()
    yield d, root
    d.close()


def test_a_slow_writer_does_not_hold_up_other_clients(hostile_daemon):
    d, root = hostile_daemon
    slow, other = Rpc(d.socket), Rpc(d.socket)
    line = b'{"jsonrpc": "2.0", "id": 7, "method": "ping"}\n'
    for i in range(0, len(line) - 1, 4):
        slow.send_raw(line[i:i + 4])  # a few bytes at a time; between them the daemon serves someone else
        assert other.call("ping") == {}
    job = other.call("register", **FEATURES)["job_id"]
    assert limits(root) == (714000000, 714000000)
    slow.send_raw(line[-1:])
    assert slow.read_reply() == {"jsonrpc": "2.0", "id": 7, "result": {}}
    other.call("unregister", job_id=job)
    assert limits(root) == BASELINE
    slow.close()
    other.close()


def test_a_client_that_never_reads_is_throttled_and_others_are_served(hostile_daemon):
    import psutil

    d, root = hostile_daemon
    rss_before = psutil.Process(d.proc.pid).memory_info().rss
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(d.socket)
    hog.setblocking(False)
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "status"}).encode() + b"\n"
    burst = request * 1000
    sent = 0
    while sent < (64 << 20):  # stops long before: once its replies fill the socket, the daemon stops reading it
        try:
            sent += hog.send(burst)
        except BlockingIOError:
            break
    assert sent < (64 << 20), "the daemon kept reading a client that never reads its replies"
    other = Rpc(d.socket)
    assert other.call("ping") == {}
    job = other.call("register", **FEATURES)["job_id"]
    assert limits(root) == (714000000, 714000000)
    other.call("unregister", job_id=job)
    rss_growth_mb = (psutil.Process(d.proc.pid).memory_info().rss - rss_before) / 2**20
    assert rss_growth_mb < 10, f"daemon RSS grew {rss_growth_mb:.1f} MB for {sent} bytes of unread requests"
    hog.close()
    assert other.call("ping") == {}
    other.close()


def test_600_idle_connections_do_not_stop_service(hostile_daemon):
    # 600: with a socket and a pidfd each, the daemon's descriptors go past 1024 (the default soft limit, which
    # it raises, and the most select() can take, which it never uses).
    d, root = hostile_daemon
    idle = []
    try:
        for _ in range(600):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            idle.append(s)
        c = Rpc(d.socket)
        assert c.call("ping") == {}
        job = c.call("register", **FEATURES)["job_id"]
        assert limits(root) == (714000000, 714000000)
        c.call("unregister", job_id=job)
        assert limits(root) == BASELINE
        c.close()
    finally:
        for s in idle:
            s.close()


def test_connections_over_the_limit_are_refused_cleanly(start_daemon):
    d = start_daemon(config={"limits": {"max_connections": 16, "max_connections_per_uid": 1024,
                                        "root_reserve_connections": 0}})  # the tests run as root
    held = [Rpc(d.socket) for _ in range(16)]
    assert held[0].call("ping") == {}
    extra = Rpc(d.socket)
    reply = extra.read_reply()
    assert reply["error"]["code"] == -32002 and "max_connections" in reply["error"]["message"]
    with pytest.raises(ConnectionError):
        extra.read_reply()
    assert held[-1].call("ping") == {}  # the ones inside the limit keep working


def test_a_client_holding_the_maximum_jobs_leaves_others_served(orin, start_daemon):
    d = start_daemon(config={"limits": {"max_jobs": 16, "max_jobs_per_connection": 8, "max_jobs_per_uid": 16}})
    hogs = [Rpc(d.socket), Rpc(d.socket)]
    for hog in hogs:
        for _ in range(8):
            hog.call("register", **FEATURES)
    err = hogs[0].request("register", **FEATURES)["error"]
    assert err["code"] == -32002 and "max_jobs_per_connection" in err["message"]
    other = Rpc(d.socket)
    assert other.call("ping") == {}
    assert len(other.call("status")["jobs"]) == 16
    assert other.call("predict", **FEATURES)["freq_hz"] == 714000000
    err = other.request("register", **FEATURES)["error"]
    assert err["code"] == -32002 and "limits.max_jobs" in err["message"]
    assert limits(orin) == (714000000, 714000000)
    for hog in hogs:
        hog.close()
    d.wait_jobs(0)
    assert limits(orin) == BASELINE
    assert other.call("register", **FEATURES)["freq_hz"] == 714000000


def test_the_lines_of_a_client_that_has_gone_are_not_served(start_daemon):
    """A client that pipelines requests and closes before its replies: once a reply cannot be written (the peer is
    gone), the lines behind it are dropped. They were served before: each registration decided and pinned for a
    connection already lost, and asyncio logged 'socket.send() raised exception.' for every reply after the fifth."""
    d = start_daemon(config={"util_sample_s": 0.5})
    features = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gone.connect(d.socket)
    # The predict measures gpu_util for util_sample_s: the lines behind it wait, and the client is gone by its end.
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "predict", "params": features}]
    lines += [{"jsonrpc": "2.0", "id": 2 + i, "method": "ping"} for i in range(10)]
    lines += [{"jsonrpc": "2.0", "id": 20 + i, "method": "register", "params": FEATURES} for i in range(3)]
    gone.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
    gone.close()
    probe = Rpc(d.socket)
    assert probe.call("predict", **features)["freq_hz"]  # measured after the other's: answered after its end
    assert probe.call("status")["jobs"] == []
    log = d.log()
    assert "socket.send() raised" not in log and "job 1 (pid" not in log, log
    probe.close()
