"""What the attack tests share (docs/security.md names them): a stdlib client run as a throwaway user, forged state
files. Their fixtures (a throwaway member, a process of root's) are in tests/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from governor.daemon.peers import start_ticks
from tests.support import REPO
from tests.support.faults import BASELINE, PINNED

__all__ = ["BASELINE", "PINNED", "boot_id_of", "ftgov", "job_record", "needs_root", "open_to_members", "run_as",
           "state_dir_of", "write_state"]

# The other user cannot run the repo's venv interpreter (it lives under /root): a stdlib-only client, system python.
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs clients as a throwaway user (useradd) against a root daemon")


def run_as(user: str, code: str, *args: str, **popen) -> subprocess.Popen:
    """Start code (stdlib only) under the system python as user; stdout and stdin are pipes."""
    return subprocess.Popen(["runuser", "-u", user, "--", SYSTEM_PYTHON, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def open_to_members(d) -> None:
    """The test's workdir is 0700 root: let the member reach the socket (which is 0660 root:ftgov)."""
    os.chmod(d.workdir, 0o755)


def boot_id_of(root: Path) -> str:
    return (root / "proc/sys/kernel/random/boot_id").read_text().strip()


def state_dir_of(d) -> Path:
    d.state_dir.mkdir(mode=0o700, exist_ok=True)
    return d.state_dir


def write_state(d, root: Path, *, gpus=None, jobs=(), raw: bytes | None = None) -> Path:
    """Plant a state file in daemon d's state dir (what an attacker who could write there would leave)."""
    path = state_dir_of(d) / "state.json"
    if raw is None:
        raw = json.dumps({"format": "ftgov-state/1", "boot_id": boot_id_of(root), "next_job_id": 7,
                          "gpus": gpus or {}, "jobs": list(jobs)}).encode()
    path.write_bytes(raw)
    return path


def job_record(pid: int, *, uid: int = 0, name=None, freq_hz=714000000, job_id: int = 3) -> dict:
    return {"job_id": job_id, "pid": pid, "start_ticks": start_ticks(pid), "gpu": "0", "name": name, "uid": uid,
            "features": {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0,
                         "gpu_util": 60.0},
            "freq_hz": freq_hz, "policy": "mlg"}


def ftgov(*args, timeout_s: float = 60.0):
    return subprocess.run([sys.executable, "-m", "governor.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(REPO)})
