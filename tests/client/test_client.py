"""The client core against a tiny JSON-RPC server on a real Unix socket (the wire protocol, not our code, is faked).

The tests against the real daemon are in test_client_daemon.py.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from governor import client
from governor.client import (
    Connection,
    DaemonUnavailable,
    GovernorWarning,
    InvalidParams,
    NotPermitted,
    RpcError,
    SocketPermissionError,
    batch_tokens,
    describe_reply,
    job,
)
from tests.support import REPO

BERT_TINY = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32}


class Fault(Exception):
    def __init__(self, code, message, data=None):
        self.error = {"code": code, "message": message, **({"data": data} if data is not None else {})}


class FakeDaemon:
    """Speaks the wire protocol: records every message it receives, answers requests from ``handlers``."""

    def __init__(self, path: str):
        self.path = path
        self.messages: list[dict] = []
        self.closed_connections = 0
        self.cond = threading.Condition()
        self.handlers = {
            "ping": lambda p: {},
            "register": lambda p: {"job_id": 7, "policy": "MLG", "freq_hz": 612000000, "reason": "test", "gpu": "0"},
            "unregister": lambda p: {"job_id": p["job_id"], "duration_s": 1.0, "freq_hz": 612000000,
                                     "energy_j": None, "steps": self.last_steps()},
            "update": lambda p: {"job_id": p["job_id"], "freq_hz": 714000000, "policy": "MLG", "reason": "test"},
        }
        self.drop_after: str | None = None  # a method after which the daemon hangs up
        self.silent: set[str] = set()  # methods the daemon never answers
        daemon = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                for line in self.rfile:
                    message = json.loads(line)
                    with daemon.cond:
                        daemon.messages.append(message)
                        daemon.cond.notify_all()
                    method = message.get("method")
                    if "id" in message and method not in daemon.silent:
                        self.wfile.write(json.dumps(daemon.answer(message)).encode() + b"\n")
                    if method == daemon.drop_after:
                        break
                # Hung up before it is counted: a client told so must find the connection gone (EPIPE), not send
                # into it while socketserver has yet to close it (under load, two steps then went unnoticed).
                with contextlib.suppress(OSError):  # the client closed first
                    self.request.shutdown(socket.SHUT_RDWR)
                with daemon.cond:
                    daemon.closed_connections += 1
                    daemon.cond.notify_all()

        self.server = socketserver.ThreadingUnixStreamServer(path, Handler)
        self.server.daemon_threads = True
        # shutdown() waits up to one poll interval; keep it short so teardown is quick.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, message):
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        handler = self.handlers.get(message["method"])
        try:
            if handler is None:
                raise Fault(-32601, f"no method {message['method']}")
            reply["result"] = handler(message.get("params", {}))
        except Fault as f:
            reply["error"] = f.error
        return reply

    def methods(self) -> list[str]:
        with self.cond:
            return [m["method"] for m in self.messages]

    def of(self, method) -> list[dict]:
        with self.cond:
            return [m for m in self.messages if m["method"] == method]

    def last_steps(self):
        progress = self.of("progress")
        return progress[-1]["params"]["steps"] if progress else 0

    def wait_for(self, predicate, timeout_s=5.0):
        with self.cond:
            assert self.cond.wait_for(predicate, timeout_s), f"timed out; messages: {self.messages}"


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="ftc", dir="/tmp") as d:
        yield d


@pytest.fixture
def daemon(short_dir):
    fake = FakeDaemon(os.path.join(short_dir, "s"))
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_job_registers_reports_progress_and_unregisters(daemon):
    with job(BERT_TINY, seq_len=40, name="bert-tiny", socket=daemon.path, report_every_s=0) as j:
        for _ in range(3):
            j.step()
    assert daemon.methods() == ["register", "progress", "progress", "progress", "unregister"]
    register = daemon.of("register")[0]["params"]
    assert register == {"model_type": "encoder", "num_layers": 2, "hidden_size": 32, "seq_len": 40.0,
                        "name": "bert-tiny"}
    assert all("id" not in m for m in daemon.of("progress")), "progress must be a notification"
    assert [m["params"]["steps"] for m in daemon.of("progress")] == [1, 2, 3]
    assert j.registration["freq_hz"] == 612000000
    assert j.result["steps"] == 3
    daemon.wait_for(lambda: daemon.closed_connections == 1)


def test_the_pick_and_the_summary_are_logged_at_info_on_governor_client(daemon, caplog):
    """What docs/clients.md tells callback users to set up to see them (the logger has no handler of its own)."""
    caplog.set_level(logging.INFO, logger="governor.client")
    with job(BERT_TINY, seq_len=40, socket=daemon.path, report_every_s=0) as j:
        j.step()
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("governor.client", logging.INFO, "ftgov: job 7 registered: MLG 612 MHz (test)"),
        ("governor.client", logging.INFO, "ftgov: job 7 ended: 612 MHz 1.0 s 1 steps")]
    assert (j.registration["freq_hz"], j.result["steps"]) == (612000000, 1)


def test_the_end_summary_never_says_saved_minus_zero():
    reply = {"saved_pct": -0.0, "saved_measured_steps": 1200}
    assert describe_reply(reply) == ("saved 0% energy per step vs the default governor, measured over 1200 steps")


def test_progress_is_rate_limited_and_the_exact_total_is_sent_before_unregister(daemon):
    with job(BERT_TINY, seq_len=40, socket=daemon.path, report_every_s=3600) as j:
        for _ in range(1000):
            j.step()
    assert [m["params"]["steps"] for m in daemon.of("progress")] == [1, 1000]
    assert daemon.methods()[-1] == "unregister"


def test_socket_from_environment(daemon, monkeypatch):
    monkeypatch.setenv("FTGOV_SOCKET", daemon.path)
    assert client.socket_path() == daemon.path
    assert client.socket_path("/elsewhere") == "/elsewhere"
    with job(BERT_TINY, seq_len=40) as j:
        assert j.registered
    monkeypatch.delenv("FTGOV_SOCKET")
    assert client.socket_path() == "/run/ftgov/ftgov.sock"


def test_registration_waits_for_the_measured_sequence_length(daemon):
    masks = [[[1] * 10 + [0] * 6, [1] * 16], [[1] * 4 + [0] * 12, [1] * 2 + [0] * 14], [[1] * 8 + [0] * 8] * 2]
    with job(BERT_TINY, socket=daemon.path, measure_batches=3, report_every_s=0) as j:
        for mask in masks[:2]:
            j.observe_batch({"input_ids": mask, "attention_mask": mask})
            j.step()
        assert "register" not in daemon.methods()
        j.observe_batch({"attention_mask": masks[2]})
        assert j.registered
        j.observe_batch({"attention_mask": [[1] * 16] * 2})  # measured already: ignored
    register = daemon.of("register")[0]["params"]
    assert register["seq_len"] == pytest.approx((10 + 16 + 4 + 2 + 8 + 8) / 6)
    # Steps taken before registration are reported right after it.
    assert daemon.methods()[:2] == ["register", "progress"]
    assert daemon.of("progress")[0]["params"]["steps"] == 2


def test_update_and_phase(daemon):
    with job(BERT_TINY, seq_len=40, socket=daemon.path) as j:
        assert j.update(gpu_util=55.5)["freq_hz"] == 714000000
        j.phase("eval")
        j.phase("eval")  # unchanged: nothing sent
        j.phase("train")
    assert daemon.of("update")[0]["params"] == {"job_id": 7, "gpu_util": 55.5}
    assert [m["params"].get("phase") for m in daemon.of("progress")] == ["eval", "train"]


def test_daemon_absent_warns_once_and_training_goes_on(short_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with job(BERT_TINY, socket=os.path.join(short_dir, "missing.sock")) as j:
            for _ in range(20):
                j.observe_batch({"attention_mask": [[1, 1, 0]]})
                j.step()
            j.update(gpu_util=10.0)
            j.phase("eval")
    assert [w.category for w in caught] == [GovernorWarning]
    assert "ftgovd is not running" in str(caught[0].message)
    assert "missing.sock" in str(caught[0].message)
    assert j.disabled and not j.registered and j.steps == 20


def test_an_ended_job_pickles(daemon):
    """A Lightning Trainer under ddp_spawn pickles its callbacks for its processes, with the job of the callback's
    last fit: ended, it has no connection, and nothing else of it may stop the pickle (the lock that keeps two
    threads from talking to the daemon at once is made anew)."""
    import pickle

    with job(BERT_TINY, seq_len=40, socket=daemon.path) as j:
        j.step()
    copy = pickle.loads(pickle.dumps(j))
    assert copy.closed and copy.steps == 1 and copy.job_id == j.job_id
    copy.close()


def test_the_warning_points_at_the_users_line_not_into_ftgov(short_dir):
    """Not governor/client/job.py: a location of ours reads as an ftgov bug, and Python's default filter would show
    the warning once for every user's line together."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        with job(BERT_TINY, seq_len=40, socket=os.path.join(short_dir, "missing.sock")):
            pass
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(GovernorWarning, __file__, line)]


def test_under_ftgov_run_a_job_warns_once_and_does_not_connect(daemon, monkeypatch):
    monkeypatch.setenv("FTGOV_RUN_JOB", "34")  # as `ftgov run` sets it for its command
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with job(BERT_TINY, seq_len=40, socket=daemon.path, report_every_s=0) as j:
            for _ in range(3):
                j.step()
            j.update(gpu_util=50.0)
            j.phase("eval")
    assert [str(w.message) for w in caught] == [
        "ftgov: this process is governed by `ftgov run`'s job 34 (FTGOV_RUN_JOB), so this job does not register; "
        "drop one of the two (tune=True needs this job or callback without `ftgov run`, which sends no step reports)"]
    assert j.disabled and j.steps == 3
    assert daemon.methods() == [] and daemon.closed_connections == 0


def test_refused_registration_warns_with_the_daemons_reason(daemon):
    def refuse(params):
        raise Fault(-32602, "seq_len must be > 0", {"field": "seq_len"})

    daemon.handlers["register"] = refuse
    with pytest.warns(GovernorWarning, match=r"register refused: register: seq_len must be > 0 \(field 'seq_len'\)"):
        with job(BERT_TINY, seq_len=40, socket=daemon.path) as j:
            j.step()
    assert j.disabled
    assert daemon.methods() == ["register"]  # nothing more once refused
    daemon.wait_for(lambda: daemon.closed_connections == 1)


@pytest.mark.parametrize("code, cls", [(-32602, InvalidParams), (-32001, NotPermitted), (-32099, RpcError)])
def test_json_rpc_errors_become_ftgov_errors(daemon, code, cls):
    def fail(params):
        raise Fault(code, "no", {"field": "pid"})

    daemon.handlers["register"] = fail
    with Connection(daemon.path) as conn:
        with pytest.raises(cls) as info:
            conn.call("register", pid=1)
        assert (info.value.code, info.value.message, info.value.data) == (code, "no", {"field": "pid"})
        with pytest.raises(client.MethodNotFound):
            conn.call("nonesuch")
        assert conn.call("ping") == {}  # the connection survives an error reply


def test_daemon_hanging_up_mid_job_disables_the_job(daemon):
    daemon.drop_after = "register"
    with pytest.warns(GovernorWarning, match="lost the connection"):
        with job(BERT_TINY, seq_len=40, socket=daemon.path, report_every_s=0) as j:
            daemon.wait_for(lambda: daemon.closed_connections == 1)
            j.step()
            j.step()
    assert j.disabled


def test_no_reply_times_out(daemon):
    daemon.silent.add("ping")
    with Connection(daemon.path, timeout_s=0.2) as conn:
        with pytest.raises(DaemonUnavailable, match="no reply"):
            conn.call("ping")
        assert conn.closed


def test_a_daemon_that_does_not_answer_register_is_not_said_to_refuse(daemon):
    daemon.silent.add("register")  # a SIGSTOPped ftgovd: the connection is accepted, nothing answers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with job(BERT_TINY, seq_len=40, socket=daemon.path, timeout_s=0.2) as j:
            j.step()
    assert [str(w.message) for w in caught] == [
        "ftgov: training goes on without the GPU frequency governor: ftgovd did not answer register within "
        f"timeout_s=0.2 s (stopped or stuck; it did not refuse the job): register: no reply from ftgovd at "
        f"{daemon.path}: timed out"]
    assert j.disabled


def test_stale_socket_file_is_named(short_dir):
    path = os.path.join(short_dir, "stale")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # the file stays, nobody listens
    with pytest.raises(DaemonUnavailable, match="nothing listens"):
        Connection(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
@pytest.mark.parametrize("group, socket_mode, dir_mode, says", [
    # The socket's own group, the config's socket.group: it was always 'ftgov', which an operator's other group is not.
    ("disk", 0o660, 0o755, "join the group 'disk' (sudo usermod -aG disk $USER, then log in again), or run as root"),
    ("disk", 0o600, 0o755, "only its owner may connect (mode 0600): run as its owner or root"),
    # Root's group (a daemon started by hand where no ftgov group exists): joining it would open far more than this.
    ("root", 0o660, 0o755, "its group is root: run as root"),
    # Its directory is closed: joining the socket's group would change nothing.
    ("disk", 0o660, 0o700, "a directory on its path is closed to you, so no group of the socket's would help"),
], ids=["group", "owner-only", "root-group", "closed-dir"])
def test_permission_denied_says_who_may_connect(daemon, group, socket_mode, dir_mode, says):
    os.chown(daemon.path, 0, grp.getgrnam(group).gr_gid)  # groups nobody (65534) is not in
    os.chmod(daemon.path, socket_mode)
    os.chmod(os.path.dirname(daemon.path), dir_mode)
    # Import as root (the interpreter lives under /root), then become nobody before connecting.
    code = ("import os\nfrom governor.client import Connection, SocketPermissionError\n"
            "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
            f"try:\n    Connection({daemon.path!r})\nexcept SocketPermissionError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO)}, timeout=60)
    assert out.stdout.startswith(f"permission denied on {daemon.path}: {says}"), (out.stdout, out.stderr)
    assert issubclass(SocketPermissionError, DaemonUnavailable)


def test_ctrl_c_while_register_waits_closes_the_connection(tmp_path):
    """Ctrl-C while register waits for the daemon's answer (`with governor.job(...)`): __exit__ does not run for an
    __enter__ that raised, and a notebook's traceback keeps the job alive, so its connection, and the job the daemon
    registered on it, stayed open until the kernel exited. The interrupted start closes it."""
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    main_thread = threading.main_thread().ident
    closed = threading.Event()

    def daemon_that_never_answers() -> None:
        conn, _ = server.accept()
        with conn:
            conn.makefile("rb").readline()  # the register
            signal.pthread_kill(main_thread, signal.SIGINT)  # Ctrl-C, while the client waits for the answer
            if conn.recv(4096) == b"":
                closed.set()

    t = threading.Thread(target=daemon_that_never_answers, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt) as interrupted:
        with job(model_type="encoder", num_layers=2, hidden_size=32, seq_len=10, socket=path, timeout_s=60):
            pytest.fail("the block must not run")
    assert closed.wait(30), "the connection stays open while the traceback holds the job"
    assert interrupted.traceback  # held until here, as a notebook holds the last one
    server.close()


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan")])
def test_a_bad_timeout_raises_when_the_job_is_made(timeout_s):
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        job(model_type="encoder", num_layers=2, hidden_size=32, seq_len=10, timeout_s=timeout_s)


def test_bad_features_raise_before_training():
    with pytest.raises(ValueError, match="model_type"):
        job(model_type="mixture", num_layers=2, hidden_size=32, seq_len=10)
    with pytest.raises(ValueError, match="num_layers"):
        job(BERT_TINY, num_layers=0)
    with pytest.raises(ValueError, match="missing: hidden_size"):
        job(model_type="decoder", num_layers=2)


def test_numbers_complete_a_config_and_an_encoder_decoder_needs_them():
    """A config that names no layer count (MPT's ``n_layers``) was refused whatever numbers came with it; a T5 was
    taken for a decoder of its encoder's layers alone."""
    mpt = {"model_type": "mpt", "n_layers": 24, "d_model": 2048}
    with pytest.raises(ValueError, match="names no layer count: pass num_layers"):
        job(mpt, seq_len=30)
    assert job(mpt, num_layers=24, seq_len=30).features["num_layers"] == 24
    t5 = {"model_type": "t5", "is_encoder_decoder": True, "num_layers": 6, "num_decoder_layers": 6, "d_model": 512}
    with pytest.raises(ValueError, match="'t5' is an encoder-decoder model.*: pass model_type, num_layers"):
        job(t5, seq_len=30)
    assert job(t5, model_type="decoder", num_layers=12, seq_len=30).features == {
        "model_type": "decoder", "num_layers": 12, "hidden_size": 512, "seq_len": 30.0}


def test_a_name_the_daemon_would_refuse_fails_when_the_job_is_made():
    """It cost the job its pin at register (one warning) while training went on: a bad name is the caller's
    mistake, as a bad number is."""
    with pytest.raises(ValueError, match=r"name: must not contain control .* \(U\+000A at index 1\)"):
        job(model_type="decoder", num_layers=2, hidden_size=32, seq_len=10, name="a\nb")
    with pytest.raises(ValueError, match="name: must have at most 256 characters, not 257"):
        job(model_type="decoder", num_layers=2, hidden_size=32, seq_len=10, name="x" * 257)


def test_seq_len_never_measured_warns(daemon):
    with pytest.warns(GovernorWarning, match="no 2-D attention_mask"):
        with job(BERT_TINY, socket=daemon.path, measure_batches=2) as j:
            for _ in range(4):
                j.observe_batch({"input_ids": [[1, 2, 3]]})
                j.step()
    assert "register" not in daemon.methods()
    with pytest.warns(GovernorWarning, match="no batch was observed"):
        with job(BERT_TINY, socket=daemon.path, measure_batches=2) as j:
            for _ in range(4):
                j.step()


def test_a_run_shorter_than_the_measurement_says_it_was_never_registered(daemon):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with job(BERT_TINY, socket=daemon.path) as j:
            for _ in range(5):
                j.observe_batch({"attention_mask": [[1, 1, 0]]})
                j.step()
    assert [str(w.message) for w in caught] == [
        "ftgov: the job was never registered: it ended after 5 of the 8 batches it measures seq_len over before "
        "registering; pass seq_len= (average non-padding tokens per sample) to register at once"]
    assert "register" not in daemon.methods()


def test_batch_tokens_counts_non_padding_tokens():
    mask = [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch_tokens({"attention_mask": mask}) == (4.0, 2)
    assert batch_tokens(({"attention_mask": torch.tensor(mask)}, torch.zeros(2))) == (4.0, 2)
    assert batch_tokens(attention_mask=np.array(mask, dtype=bool)) == (4.0, 2)
    assert batch_tokens({"input_ids": torch.ones(2, 4)}) is None  # padded length only: not a measurement
    assert batch_tokens({"attention_mask": torch.ones(2, 1, 4, 4)}) is None  # an extended mask: not per token
    assert batch_tokens(torch.ones(2, 4)) is None


def test_neither_framework_is_needed_to_import_governor(tmp_path):
    code = """
import sys
for name in ("torch", "transformers", "lightning", "pytorch_lightning", "prometheus_client"):
    sys.modules[name] = None  # makes any import of it fail, as if it were not installed
import governor, governor.client, governor.cli.run, governor.cli.ops, governor.cli.metrics
from governor.cli import main
for module, extra in (("governor.hf", "hf"), ("governor.lightning", "lightning")):
    try:
        __import__(module)
    except ImportError as e:
        print(module, "ftgov[%s]" % extra in str(e))
print("metrics", main(["metrics", "--textfile", sys.argv[1], "--once"]))
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.prom")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.stdout.split("\n")[:3] == ["governor.hf True", "governor.lightning True", "metrics 2"], out.stderr
    assert "pip install 'ftgov[metrics]'" in out.stderr


def test_the_jobs_length_goes_with_register_and_a_later_one_with_the_next_progress_only(daemon):
    with job(BERT_TINY, seq_len=40, socket=daemon.path, report_every_s=0, total_steps=500) as j:
        j.step()
        j.set_total_steps(800)
        j.step()
    assert daemon.of("register")[0]["params"]["total_steps"] == 500
    assert [m["params"].get("total_steps") for m in daemon.of("progress")] == [None, 800, None]
    with pytest.raises(ValueError, match="total_steps must be a positive integer"):
        job(BERT_TINY, seq_len=40, socket=daemon.path, total_steps=0)


def test_progress_says_when_the_last_step_ended_on_this_hosts_monotonic_clock(daemon):
    before = time.monotonic()
    with job(BERT_TINY, seq_len=40, socket=daemon.path, report_every_s=0) as j:
        for _ in range(3):
            j.step()
        j.phase("eval")  # no step ended since the last report: the same step's end again
    after = time.monotonic()
    reports = [m["params"] for m in daemon.of("progress")]
    ends = [p["step_end_s"] for p in reports]
    assert [p["steps"] for p in reports] == [1, 2, 3, 3]
    assert before <= ends[0] < ends[1] < ends[2] == ends[3] <= after


def test_dropped_reports_never_cut_a_line(tmp_path):
    """Reports sent without waiting: one the socket cannot take is dropped whole, and one it takes only part of is
    finished before anything else, so the daemon reads whole lines, in order, whatever the buffer took (and the
    small reports' case, dropped whole once the buffer is full, is the real daemon's test in test_client_daemon)."""
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    conn = client.Connection(path, timeout_s=5)
    peer, _ = server.accept()
    with peer, conn:
        # A line longer than the socket's buffer goes in part; the rest waits, and what follows it is dropped.
        assert conn.notify("progress", drop_if_busy=True, job_id=1, steps=0, phase="x" * (1 << 20))
        assert conn._pending
        sent = [0] + [n for n in range(1, 20000) if conn.notify("progress", drop_if_busy=True, job_id=1, steps=n,
                                                                 phase="x" * (n % 97))]
        assert sent == [0]
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: peer.recv(1 << 16), b"")))
        reader.start()  # the daemon reads again
        conn.notify("progress", job_id=1, steps=20000)  # waits: the rest of a cut line goes first
        conn.close()
        reader.join(timeout=30)
        data = b"".join(chunks)
    steps = [json.loads(line)["params"]["steps"] for line in data.splitlines()]
    assert steps == [0, 20000]


def test_a_full_listen_queue_is_said_as_such(tmp_path):
    """connect() on a Unix socket whose listen queue is full fails at once with EAGAIN: not "cannot connect ...
    Resource temporarily unavailable", which reads like a fault of the client's."""
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(0)  # one waiting connection at most, and none accepted
    held = []
    try:
        with pytest.raises(client.DaemonUnavailable, match="its listen queue is full"):
            for _ in range(8):
                held.append(client.Connection(path, timeout_s=5))
    finally:
        for conn in held:
            conn.close()
        server.close()
