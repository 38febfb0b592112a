"""The one launcher of ftgovd outside systemd: the real daemon process on a real socket against a fake tree, for tests,
benchmarks, the demo and scripts; and a raw JSON-RPC client to talk to it.

Readiness and changes are awaited through the daemon's own sd_notify messages (READY=1, STATUS=...) on a datagram
socket the caller owns: no sleeps, no polling of files. A daemon that exits before the message waited for fails the
wait at once (its pidfd), with its log.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.support import REPO
from tests.support.notify import DaemonExited, NotifyListener

DEVFREQ = "sys/class/devfreq/17000000.gpu"
# The paper's tree, not the trained one: tests check the daemon, and the paper's splits are fixed. Short sampling
# windows keep the tests quick.
TEST_CONFIG = {"model_file": str(REPO / "model" / "paper-tree.json"), "util_sample_s": 0.05, "node_wait_s": 5,
               "sample_interval_s": 0.2}


class Rpc:
    """A line-oriented JSON-RPC client on a raw socket (tests need to send malformed bytes too)."""

    def __init__(self, path: str, timeout_s: float = 10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_reply(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, method: str, **params) -> dict:
        rid, self.next_id = self.next_id, self.next_id + 1
        self.send_raw(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        reply = self.read_reply()
        assert reply.get("id") == rid, reply
        return reply

    def call(self, method: str, **params) -> dict:
        reply = self.request(method, **params)
        assert "result" in reply, reply
        return reply["result"]

    def notify(self, method: str, **params) -> None:
        self.send_raw(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode() + b"\n")

    def close(self) -> None:
        self.sock.close()


class Daemon:
    """One ftgovd process. ``root`` is the fake sysfs root (None with ``simulate``: ftgovd --simulate builds its own);
    ``workdir`` holds socket, state, config and log.

    The config written is TEST_CONFIG updated with ``config``; ``test_config=False`` writes ``config`` alone (the
    daemon's own defaults otherwise), and ``config_file`` names an existing file instead (os.devnull: every default).
    ``python_args`` go before ``-m governor.daemon`` (a profiler, say); ``python`` is the interpreter (another
    venv's, to run an installed ftgov: then pass env={"PYTHONPATH": ""} so that the checkout is not imported).
    ``nofile``: the daemon's RLIMIT_NOFILE, soft and hard (what a unit's LimitNOFILE= gives)."""

    def __init__(self, root: Path | None, workdir: Path | None = None, config: dict | None = None,
                 extra_args: tuple[str, ...] = (), simulate: bool = False, notify_name: str = "n.sock",
                 env: dict | None = None, *, test_config: bool = True, config_file: str | None = None,
                 state_dir: Path | None = None, log_path: Path | None = None, log_level: str = "debug",
                 python_args: tuple[str, ...] = (), python: str = sys.executable, nofile: int | None = None):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="ftg", dir="/tmp"))  # short: AF_UNIX paths <= 107
        self.root = root
        self.socket = str(self.workdir / "s.sock")
        self.state_dir = Path(state_dir) if state_dir is not None else self.workdir / "state"
        self.log_path = Path(log_path) if log_path is not None else self.workdir / "ftgovd.log"
        if config_file is not None:
            self.config_path = Path(config_file)
        else:
            self.config_path = self.workdir / "ftgov.yaml"
            self.config_path.write_text(yaml.safe_dump({**(TEST_CONFIG if test_config else {}), **(config or {})}))
        self.notify_path = str(self.workdir / notify_name)
        self.notify = NotifyListener(self.notify_path)
        self.extra_args = extra_args
        self.env = env or {}
        self.simulate = simulate
        self.log_level = log_level
        self.python_args = python_args
        self.python = python
        self.nofile = nofile
        self.proc: subprocess.Popen | None = None
        self.pidfd: int | None = None

    def command(self) -> list[str]:
        cmd = [self.python, *self.python_args, "-m", "governor.daemon", "--config", str(self.config_path),
               "--socket", self.socket, "--state-dir", str(self.state_dir), "--log-level", self.log_level,
               *self.extra_args]
        if self.simulate:
            cmd.append("--simulate")
        elif self.root is not None:
            cmd += ["--sysfs-root", str(self.root)]
        return cmd

    def start(self, wait: bool = True, timeout_s: float = 20.0) -> Daemon:
        env = {**os.environ, "NOTIFY_SOCKET": self.notify_path, "PYTHONPATH": str(REPO), **self.env}
        env.pop("INVOCATION_ID", None)
        env.pop("JOURNAL_STREAM", None)
        self._close_pidfd()
        log = open(self.log_path, "ab")
        limit = None if self.nofile is None else (self.nofile, self.nofile)
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env, cwd=self.workdir,
                                     preexec_fn=None if limit is None else
                                     lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        log.close()
        self.pidfd = os.pidfd_open(self.proc.pid)
        if wait:
            self.wait_status(lambda m: "READY=1" in m, timeout_s)
        return self

    def wait_status(self, predicate, timeout_s: float = 10.0) -> str:
        """Wait for an sd_notify message from the daemon that satisfies predicate."""
        try:
            return self.notify.wait(predicate, timeout_s, pidfd=self.pidfd)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.log()}") from None
        except DaemonExited as e:
            raise DaemonExited(f"ftgovd exited with {self.proc.wait()}: {e}\n{self.log()}") from None

    def wait_jobs(self, count: int, timeout_s: float = 10.0) -> str:
        return self.wait_status(lambda m: f"STATUS={count} job(s)" in m, timeout_s)

    def client(self) -> Rpc:
        return Rpc(self.socket)

    def open_fds(self) -> int:
        """How many descriptors the daemon has open now (/proc/PID/fd)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log(self) -> str:
        """The daemon's log so far. While it runs, a ping first: the daemon writes a loop turn's lines after that
        turn's replies, and it answers the ping only after writing every line of the requests before it."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                rpc = Rpc(self.socket, timeout_s=5.0)
                try:
                    rpc.call("ping")
                finally:
                    rpc.close()
            except (OSError, AssertionError):
                pass  # not serving (stopping, wedged on purpose): read what is there
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def _close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def close(self) -> None:
        self.stop()
        self._close_pidfd()
        self.notify.close()


def scaled(time_scale: float, config: dict | None = None) -> dict:
    """The config of a daemon whose jobs run at ``time_scale`` (governor.sim.job): the GPU's re-pin interval
    (limits.repin_interval_s, a second) scaled alike, so that a tuned job's windows wait for their pins as many of
    its steps as a real job's do."""
    config = dict(config or {})
    config["limits"] = {**config.get("limits", {}), "repin_interval_s": time_scale}
    return config


def limits(root: Path, node: str = DEVFREQ) -> tuple[int, int]:
    d = root / node
    return int((d / "min_freq").read_text()), int((d / "max_freq").read_text())


FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0, "gpu_util": 60.0}


class ProgressJob:
    """What a client library's job does per step, on the raw protocol: report the total steps (for governor.sim.job's
    run(), which drives a job through ``step()``)."""

    def __init__(self, rpc: Rpc, job_id: int):
        self.rpc, self.job_id, self.steps = rpc, job_id, 0

    def step(self) -> None:
        self.steps += 1
        self.rpc.notify("progress", job_id=self.job_id, steps=self.steps)
