"""The random-point SIGKILL trial, shared by tests/daemon/test_faults.py (a few trials) and benchmarks/stress.py (a
thousand): kill ftgovd in the middle of a register or an unregister, restart it, check what it left."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

from tests.support.daemon import DEVFREQ, FEATURES, Rpc, limits
from tests.support.fswatch import Watch

BASELINE = (306000000, 1300500000)
PINNED = (714000000, 714000000)  # FEATURES under the paper's tree
# Between the two writes of a pin from the baseline (lowering: min first) or of its restore (raising: max first).
MID_WRITE = (714000000, 1300500000)
LEGAL_FILES = {BASELINE, PINNED, MID_WRITE}


def at_baseline(m: str) -> bool:
    return "STATUS=0 job(s); GPU 0 at baseline" in m


def kill_trial(d, root: Path, rng: random.Random, window_s: float = 0.004) -> dict:
    """SIGKILL the daemon at a random moment of a register or an unregister, restart it, check what it left.

    ``d`` has socket, state_dir, notify, wait_status(), start() (returns at READY=1) and kill(). The job's process is
    a `sleep` that dies before the restart in half the trials. Raises AssertionError on anything illegal; returns what
    happened: the phase, the files after the kill, the outcome after the restart and the writes it made.
    """
    node = (root / DEVFREQ).resolve()
    worker = subprocess.Popen(["sleep", "600"])
    watch = Watch(node)
    c = None
    try:
        c = Rpc(d.socket)
        phase = rng.choice(["register", "unregister"])
        req = {"jsonrpc": "2.0", "id": 1, "method": "register", "params": {"pid": worker.pid, **FEATURES}}
        if phase == "unregister":
            req = {"jsonrpc": "2.0", "id": 2, "method": "unregister",
                   "params": {"job_id": c.call("register", pid=worker.pid, **FEATURES)["job_id"]}}
        delay_s = rng.uniform(0, window_s)
        c.send_raw(json.dumps(req).encode() + b"\n")
        if delay_s:
            time.sleep(delay_s)  # the random point: this delay is the experiment, not a wait for an event
        d.kill()
        c.close()
        torn = _mend_torn_writes(node)
        after_kill = limits(root)
        assert after_kill in LEGAL_FILES, f"files after the kill: {after_kill}"
        state = _state(d.state_dir)
        saved = state.get("gpus", {}).get("0")
        if after_kill != BASELINE:  # the baseline reached the disk before the first write
            assert saved and (saved["baseline"]["min_hz"], saved["baseline"]["max_hz"]) == BASELINE, state
        _only_limit_writes(watch.drain())
        worker_alive = rng.random() < 0.5
        if not worker_alive:
            worker.kill()
            worker.wait()
        d.start()
        writes = _only_limit_writes(watch.drain())
        if not saved:
            assert writes == 0, "the restart wrote to the GPU with nothing recorded to restore"
        assert writes <= 2, f"{writes} writes by the restart (one pin or one restore is two)"
        c = Rpc(d.socket)
        jobs = c.call("status")["jobs"]
        now = limits(root)
        if jobs:
            (job,) = jobs
            assert job["adopted"] and job["pid"] == worker.pid and worker_alive and now == PINNED, (job, now)
            outcome = "re-adopted"
            d.notify.drain()
            worker.kill()
            worker.wait()
            d.wait_status(at_baseline)
            assert limits(root) == BASELINE
        else:
            assert now == BASELINE, f"no job after the restart but the files read {now}"
            outcome = "baseline" if after_kill == BASELINE else "restored"
        seen = {BASELINE: "baseline", PINNED: "pinned", MID_WRITE: "mid-write"}[after_kill]
        return {"phase": phase, "after_kill": seen, "outcome": outcome, "writes": writes, "delay_s": delay_s,
                "torn": torn}
    finally:
        if c is not None:
            c.close()
        watch.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def limits_now(root: Path):
    """The limits while the daemon may be writing them: None mid-write (a plain file is empty between the
    truncating open and the write; a kernel attribute never is)."""
    try:
        return limits(root)
    except ValueError:
        return None


def _mend_torn_writes(node: Path) -> int:
    """A kill between the truncating open and the write leaves a plain file empty, which a kernel attribute
    (one store() call) never does: there the file would hold its old or its new value. Every write of a pin from the
    baseline or of a restore has the baseline value as its old or its new value, so an empty file becomes that."""
    torn = 0
    for name, value in (("min_freq", BASELINE[0]), ("max_freq", BASELINE[1])):
        if not (node / name).read_text().strip():
            (node / name).write_text(f"{value}\n")
            torn += 1
    return torn


def _state(state_dir: Path) -> dict:
    try:
        return json.loads((Path(state_dir) / "state.json").read_text())
    except FileNotFoundError:
        return {}


def _only_limit_writes(events: list[tuple[str, str]]) -> int:
    """Only min_freq and max_freq may change, and only by being written (no create, delete, rename or chmod)."""
    other = [e for e in events if e[0] not in ("min_freq", "max_freq") or e[1] not in ("modify", "close_write")]
    assert not other, f"something other than a pin or a restore touched the devfreq node: {other}"
    return sum(1 for e in events if e[1] == "close_write")
