"""Run ftgovd outside systemd: the real daemon process on a real socket against a fake or simulated tree, for the
demo, the benchmarks, the scripts and the tests; with a raw JSON-RPC client to talk to it.

Readiness and changes are awaited through the daemon's own sd_notify messages (READY=1, STATUS=...) on a datagram
socket the caller owns (`NotifyListener`, the receiving end of governor/daemon/notify.py): no sleeps, no polling of
files. A daemon that exits before the message waited for fails the wait at once (its pidfd), with its log.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import yaml

from governor.policy.windows import AVERAGE_SETTLE_UPDATES

DEVFREQ = "sys/class/devfreq/17000000.gpu"
# Where workdirs are made: /tmp unless set (a test session sets a directory of its own and removes it at its end).
WORKDIRS_ENV = "FTGOV_TEST_WORKDIRS"
# The paper's tree, not the trained one: its splits are fixed, so what a run shows does not move with retraining.
# Short sampling windows keep runs quick.
QUICK_CONFIG = {"model_file": str(resources.files("governor.data") / "paper-tree.json"), "util_sample_s": 0.05,
                "node_wait_s": 5, "sample_interval_s": 0.2}
# The package's own directory's parent: the daemon imports the same governor as its launcher, checkout or install.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

class DaemonExited(RuntimeError):
    """The process being waited on exited without sending the message waited for."""


class NotifyListener:
    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        self.messages: list[str] = []

    def wait(self, predicate: Callable[[str], bool], timeout_s: float = 10.0, pidfd: int | None = None) -> str:
        """The next message satisfying predicate; TimeoutError after timeout_s. With ``pidfd`` (os.pidfd_open of the
        sender), DaemonExited as soon as that process is gone and has left no such message: a daemon that dies at
        start fails the wait at once instead of at the timeout."""
        deadline = time.monotonic() + timeout_s
        watched = [self.sock] if pidfd is None else [self.sock, pidfd]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching sd_notify message within {timeout_s} s (last: {self.messages[-3:]})")
            readable, _, _ = select.select(watched, [], [], left)
            if self.sock in readable:
                msg = self.sock.recv(4096).decode(errors="replace")
                self.messages.append(msg)
                if predicate(msg):
                    return msg
            elif readable:
                # A datagram is queued when sendto returns: everything the process sent is here already.
                for msg in self._queued():
                    if predicate(msg):
                        return msg
                raise DaemonExited(f"the process exited without a matching sd_notify message "
                                   f"(last: {self.messages[-3:]})")

    def _queued(self) -> list[str]:
        got = []
        self.sock.setblocking(False)
        try:
            while True:
                got.append(self.sock.recv(4096).decode(errors="replace"))
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)
        self.messages += got
        return got

    def drain(self) -> None:
        """Forget every message already queued (so that the next wait sees only what happens from now on)."""
        self._queued()

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


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

    The config written is QUICK_CONFIG updated with ``config``; ``test_config=False`` writes ``config`` alone (the
    daemon's own defaults otherwise), and ``config_file`` names an existing file instead (os.devnull: every default).
    ``python_args`` go before ``-m governor.daemon`` (a profiler, say); ``python`` is the interpreter (another
    venv's, to run an installed ftgov: then pass env={"PYTHONPATH": ""} so that the checkout is not imported).
    ``nofile``: the daemon's RLIMIT_NOFILE, soft and hard, or a (soft, hard) pair (what a unit's LimitNOFILE= gives)."""

    def __init__(self, root: Path | None, workdir: Path | None = None, config: dict | None = None,
                 extra_args: tuple[str, ...] = (), simulate: bool = False, notify_name: str = "n.sock",
                 env: dict | None = None, *, test_config: bool = True, config_file: str | None = None,
                 state_dir: Path | None = None, log_path: Path | None = None, log_level: str = "debug",
                 python_args: tuple[str, ...] = (), python: str = sys.executable,
                 nofile: int | tuple[int, int] | None = None,
                 sim_meters: str = "exact"):
        # Short: AF_UNIX paths <= 107.
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="ftg", dir=os.environ.get(WORKDIRS_ENV, "/tmp")))
        self.root = root
        self.socket = str(self.workdir / "s.sock")
        self.state_dir = Path(state_dir) if state_dir is not None else self.workdir / "state"
        self.log_path = Path(log_path) if log_path is not None else self.workdir / "ftgovd.log"
        if config_file is not None:
            self.config_path = Path(config_file)
        else:
            self.config_path = self.workdir / "ftgov.yaml"
            self.config_path.write_text(yaml.safe_dump({**(QUICK_CONFIG if test_config else {}), **(config or {})}))
        self.notify_path = str(self.workdir / notify_name)
        self.notify = NotifyListener(self.notify_path)
        self.extra_args = extra_args
        self.env = env or {}
        self.simulate = simulate
        self.sim_meters = sim_meters  # with simulate: ftgovd --sim-meters (exact: the tests' jobs run in scaled time)
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
            cmd += ["--simulate", "--sim-meters", self.sim_meters]
        elif self.root is not None:
            cmd += ["--sysfs-root", str(self.root)]
        return cmd

    def start(self, wait: bool = True, timeout_s: float = 20.0) -> Daemon:
        env = {**os.environ, "NOTIFY_SOCKET": self.notify_path, "PYTHONPATH": _PACKAGE_ROOT, **self.env}
        env.pop("INVOCATION_ID", None)
        env.pop("JOURNAL_STREAM", None)
        self._close_pidfd()
        log = open(self.log_path, "ab")
        limit = self.nofile if self.nofile is None or isinstance(self.nofile, tuple) else (self.nofile, self.nofile)
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


def scaled(time_scale: float, config: dict | None = None, meters: str = "exact") -> dict:
    """The config of a daemon whose jobs run at ``time_scale`` (governor.sim.job): the GPU's re-pin interval
    (limits.repin_interval_s, a second) scaled alike, so that a tuned job's windows wait for their pins as many of
    its steps as a real job's do; and the meter's settling after a change of clock (tuner.settle_updates): none for
    the simulated board's exact rails (``meters`` "exact", a tree without tree.METERS), and for rails that report as
    an INA3221 does ("ina3221") the sensor's, scaled too, since the board runs it in the jobs' compressed time while
    the tree's update_interval says 140 ms. On exact rails windows are of steps (tuner.window_rule steps: a 4-step
    window reads the exact energy, and a WindowRule's seconds would be real time against the jobs' compressed
    time)."""
    config = dict(config or {})
    config["limits"] = {**config.get("limits", {}), "repin_interval_s": time_scale}
    settle = 0.0 if meters == "exact" else AVERAGE_SETTLE_UPDATES * time_scale
    exact = {"window_rule": "steps"} if meters == "exact" else {}
    config["tuner"] = {"settle_updates": settle, **exact, **config.get("tuner", {})}
    return config


def limits(root: Path, node: str = DEVFREQ) -> tuple[int, int]:
    d = root / node
    return int((d / "min_freq").read_text()), int((d / "max_freq").read_text())


# A BERT-base fine-tune's features, as a client would register them.
FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0, "gpu_util": 60.0}
