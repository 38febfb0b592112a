"""Fault injection against the real ftgovd process (issue 7, part 3).

A devfreq file turns read-only or vanishes mid-job; the limits are changed underneath a pin; the state dir is
unwritable or full; the model file is corrupt; the daemon is SIGKILLed at random points of register/unregister and
restarted. After each: the GPU ends at its baseline (or a live job is re-adopted at its pin) and nothing but the pin and
restore paths touched the files. (The node appearing late is tests/test_daemon.py's.)

``kill_trial`` is also what benchmarks/stress.py runs 1,000 times.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fswatch import Watch
from harness import DEVFREQ, FEATURES, REPO, Rpc, limits

BASELINE = (306000000, 1300500000)
PINNED = (714000000, 714000000)  # FEATURES under the paper's tree
# Between the two writes of a pin from the baseline (lowering: min first) or of its restore (raising: max first).
MID_WRITE = (714000000, 1300500000)
LEGAL_FILES = {BASELINE, PINNED, MID_WRITE}
READ_ONLY_INT_FILE = Path("/proc/sys/fs/file-nr")  # reads as an integer, refuses writes, root's too


def at_baseline(m: str) -> bool:
    return "STATUS=0 job(s); GPU 0 at baseline" in m


# ---- devfreq files failing under a job -----------------------------------------------------------------------------


def _read_only(path: Path):
    saved = path.read_text()
    path.unlink()
    path.symlink_to(READ_ONLY_INT_FILE)

    def heal():
        path.unlink()
        path.write_text(saved)
    return heal


def _vanish_file(path: Path):
    saved = path.read_text()
    path.unlink()
    return lambda: path.write_text(saved)  # the driver brings it back


def _vanish_node(node: Path):
    gone = node.with_name(node.name + ".unbound")
    node.rename(gone)
    return lambda: gone.rename(node)


@pytest.mark.parametrize("fault", ["max_freq read-only", "min_freq vanishes", "whole node vanishes"])
def test_devfreq_fault_mid_job_restore_is_retried_until_it_takes(orin, start_daemon, fault):
    d = start_daemon()
    node = (orin / DEVFREQ).resolve()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    assert limits(orin) == PINNED
    heal = {"max_freq read-only": lambda: _read_only(node / "max_freq"),
            "min_freq vanishes": lambda: _vanish_file(node / "min_freq"),
            "whole node vanishes": lambda: _vanish_node(node)}[fault]()
    ended = c.call("unregister", job_id=job)  # the job ends for its client even though the restore cannot take yet
    assert ended["job_id"] == job
    d.wait_status(lambda m: "STATUS=0 job(s); GPU 0 pinned" in m)
    assert c.call("status")["jobs"] == [] and c.call("ping") == {}
    assert "will retry" in d.log()
    d.notify.drain()
    heal()
    d.wait_status(at_baseline)  # retried on the daemon's tick
    assert limits(orin) == BASELINE
    assert c.call("register", **FEATURES)["freq_hz"] == 714000000  # and it pins again
    d.notify.drain()
    c.close()
    d.wait_status(at_baseline)
    assert limits(orin) == BASELINE


# ---- someone else changes the limits under a pin -------------------------------------------------------------------


def _write_limits(node: Path, min_hz: int, max_hz: int) -> None:
    (node / "max_freq").write_text(f"{max_hz}\n")
    (node / "min_freq").write_text(f"{min_hz}\n")


def test_limits_changed_under_a_pin_are_reapplied(orin, start_daemon):
    d = start_daemon(config={"on_external_change": "reapply", "sample_interval_s": 0.05})
    node = (orin / DEVFREQ).resolve()
    c = d.client()
    c.call("register", **FEATURES)
    watch = Watch(node)
    try:
        _write_limits(node, *BASELINE)  # nvpmodel puts the full range back
        watch.wait(lambda: _limits_now(orin) == PINNED, 10)  # the daemon's tick notices and writes the pin again
    finally:
        watch.close()
    assert "limits changed under our pin" in d.log() and "Re-applying" in d.log()
    c.close()
    d.wait_status(at_baseline)
    assert limits(orin) == BASELINE


def test_limits_changed_under_a_pin_are_left_alone_with_stand_down(orin, start_daemon):
    d = start_daemon(config={"on_external_change": "stand_down", "sample_interval_s": 0.05})
    node = (orin / DEVFREQ).resolve()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    theirs = (1300500000, 1300500000)  # jetson_clocks: min = max = the top level
    watch = Watch(node)
    d.notify.drain()
    try:
        _write_limits(node, *theirs)
        watch.drain()
        d.wait_status(lambda m: "STATUS=1 job(s); GPU 0 at baseline" in m)  # stood down: it holds no pin now
        assert c.call("status")["gpus"][0]["stood_down"] is True
        c.call("unregister", job_id=job)
        d.wait_jobs(0)
        assert limits(orin) == theirs  # their change is not undone when our job ends
        assert [e for e in watch.drain() if e[0] in ("min_freq", "max_freq")] == [], "the daemon wrote after standing down"
    finally:
        watch.close()
    assert c.call("register", **FEATURES)["freq_hz"] == 714000000  # with no job left it governs again
    assert limits(orin) == PINNED


# ---- the state dir -------------------------------------------------------------------------------------------------


def test_state_dir_under_a_regular_file_stops_the_start_with_a_clear_error(orin, start_daemon, tmp_path):
    (tmp_path / "afile").write_text("not a directory\n")
    d = start_daemon(launch=False, extra_args=("--state-dir", str(tmp_path / "afile" / "state")))
    d.start(wait=False)
    assert d.proc.wait(30) == 1
    assert "state file" in d.log() and "Not a directory" in d.log()
    assert limits(orin) == BASELINE


def test_unwritable_state_dir_refuses_to_pin_and_keeps_serving(orin, start_daemon):
    # /proc refuses mkdir even for root: the daemon can never write its state file there.
    d = start_daemon(launch=False, extra_args=("--state-dir", "/proc/ftgov-test-state"))
    d.start()
    c = d.client()
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32000 and "cannot write state file" in err["message"]
    assert c.call("status")["jobs"] == [] and limits(orin) == BASELINE
    assert c.call("predict", **FEATURES)["freq_hz"] == 714000000 and c.call("ping") == {}


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 16 KiB tmpfs for a full state dir (needs root/CAP_SYS_ADMIN): {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)
    return filler


def test_full_state_dir_refuses_new_pins_and_still_restores(orin, start_daemon, tiny_tmpfs):
    d = start_daemon(launch=False, extra_args=("--state-dir", str(tiny_tmpfs / "state")))
    d.start()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    assert limits(orin) == PINNED
    filler = _fill(tiny_tmpfs)
    c.call("unregister", job_id=job)  # the restore does not need the disk
    assert limits(orin) == BASELINE
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32000 and "No space left" in err["message"]
    assert c.call("status")["jobs"] == [] and limits(orin) == BASELINE
    filler.unlink()
    assert c.call("register", **FEATURES)["freq_hz"] == 714000000


# ---- the model file ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("corrupt", ["truncated", "binary garbage"])
def test_corrupt_model_file_falls_back_to_ffg(orin, start_daemon, tmp_path, corrupt):
    good = (REPO / "model" / "paper-tree.json").read_bytes()
    bad = tmp_path / "tree.json"
    bad.write_bytes(good[: len(good) // 2] if corrupt == "truncated" else random.Random(7).randbytes(4096))
    d = start_daemon(config={"model_file": str(bad), "ffg_freq_hz": 612000000})
    res = d.client().call("register", **FEATURES)
    assert res["policy"] == "mlg->ffg" and res["freq_hz"] == 612000000
    assert "MLG falls back to FFG" in d.log()


# ---- SIGKILL of the daemon -----------------------------------------------------------------------------------------


def test_restart_after_sigkill_restores_a_leftover_pin(orin, start_daemon):
    d = start_daemon()
    worker = subprocess.Popen(["sleep", "600"])
    c = d.client()  # kept open: a closed connection would end the job before the kill
    try:
        c.call("register", pid=worker.pid, **FEATURES)
        assert limits(orin) == PINNED
        d.stop(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    d.start()  # READY=1 comes only after leftovers are restored or re-adopted
    assert limits(orin) == BASELINE
    assert d.client().call("status")["jobs"] == []


def test_restart_after_sigkill_readopts_a_live_job(orin, start_daemon):
    d = start_daemon()
    worker = subprocess.Popen(["sleep", "600"])
    c = d.client()
    try:
        job = c.call("register", pid=worker.pid, **FEATURES)["job_id"]
        d.stop(signal.SIGKILL)
        d.start()
        (adopted,) = d.client().call("status")["jobs"]
        assert adopted["job_id"] == job and adopted["adopted"] and adopted["pid"] == worker.pid
        assert limits(orin) == PINNED
        d.notify.drain()
    finally:
        worker.kill()
        worker.wait()
    d.wait_status(at_baseline)  # the re-adopted job ends with its process
    assert limits(orin) == BASELINE


def kill_trial(d, root: Path, rng: random.Random, window_s: float = 0.004) -> dict:
    """SIGKILL the daemon at a random moment of a register or an unregister, restart it, check what it left.

    ``d`` has socket, state_dir, notify, wait_status(), start() (returns at READY=1) and kill(). The job's process is a `sleep`
    that dies before the restart in half the trials. Raises AssertionError on anything illegal; returns what
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
        return {"phase": phase, "after_kill": {BASELINE: "baseline", PINNED: "pinned", MID_WRITE: "mid-write"}[after_kill],
                "outcome": outcome, "writes": writes, "delay_s": delay_s, "torn": torn}
    finally:
        if c is not None:
            c.close()
        watch.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _limits_now(root: Path):
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


class _KillableDaemon:
    def __init__(self, d):
        self.d = d
        self.socket, self.state_dir, self.notify, self.wait_status = d.socket, d.state_dir, d.notify, d.wait_status

    def start(self):
        self.d.start()

    def kill(self):
        self.d.stop(signal.SIGKILL)


def test_sigkill_at_random_points_of_register_and_unregister(orin, start_daemon):
    d = start_daemon()
    rng = random.Random(int(os.environ.get("FTGOV_KILL_SEED", "1")))
    results = [kill_trial(_KillableDaemon(d), orin, rng) for _ in range(int(os.environ.get("FTGOV_KILL_TRIALS", "6")))]
    assert all(r["outcome"] in ("baseline", "restored", "re-adopted") for r in results)
    assert "Traceback" not in d.log()
