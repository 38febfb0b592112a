"""Fault injection against the real ftgovd process (docs/stress.md).

A devfreq file turns read-only or vanishes mid-job; the limits are changed underneath a pin; the state dir is
unwritable or full; the model file is corrupt; the daemon is SIGKILLed at random points of register/unregister and
restarted. After each: the GPU ends at its baseline (or a live job is re-adopted at its pin) and nothing but the pin and
restore paths touched the files. (The node appearing late is tests/daemon/test_daemon.py's.)

``kill_trial`` is also what benchmarks/stress.py runs 1,000 times.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import READ_ONLY_INT_FILE
from tests.support.daemon import DEVFREQ, FEATURES, REPO, limits
from tests.support.faults import BASELINE, PINNED, at_baseline, kill_trial, limits_now
from tests.support.fswatch import Watch

LOW_FEATURES = {"model_type": "decoder", "num_layers": 6, "hidden_size": 512, "seq_len": 20.0,
                "gpu_util": 50.0}  # 510 MHz under the paper's tree (FEATURES: 714 MHz)

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


@pytest.mark.parametrize("on_external_change", ["reapply", "stand_down"])
def test_a_repin_that_failed_mid_write_is_retried_not_taken_for_another_tools_change(orin, start_daemon,
                                                                                    on_external_change):
    """A re-pin (down to the other job's level as a job leaves) whose write fails leaves the files at our old pin or
    half way. That is our failed write, retried on the tick: it was read as limits another tool had set under the pin,
    and the old pin became the baseline's max (reapply: the jobs' end left the GPU capped at that level) or the daemon
    stood down (the pin left on the idle GPU)."""
    d = start_daemon(config={"on_external_change": on_external_change})
    node = (orin / DEVFREQ).resolve()
    c, other = d.client(), d.client()
    high = c.call("register", **FEATURES)["job_id"]
    other.call("register", **LOW_FEATURES)
    assert limits(orin) == PINNED
    heal = _vanish_file(node / "min_freq")
    c.call("unregister", job_id=high)  # down to the other job's 510 MHz: the first write (min) fails
    assert "will retry" in d.log()
    heal()
    d.notify.drain()
    for _ in range(2):  # each tick says STATUS=: the second comes from a tick that began after the heal
        d.wait_status(lambda m: m.startswith("STATUS=1 job(s)"))
    assert limits(orin) == (510000000, 510000000)
    other.close()
    d.wait_status(at_baseline)
    assert limits(orin) == BASELINE
    assert "limits changed under our pin" not in d.log()


@pytest.fixture
def read_only_node(orin):
    """The GPU's devfreq node mounted read-only: what the unit's sandbox (ReadWritePaths=/sys/devices/platform) makes
    of a node outside it (docs/install.md's "Read-only file system")."""
    node = (orin / DEVFREQ).resolve()
    proc = subprocess.run(["mount", "--bind", str(node), str(node)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot bind-mount the node read-only (needs root/CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(node)], check=True)
        yield node
    finally:
        subprocess.run(["umount", "-l", str(node)], check=False)


def test_a_pin_the_sandbox_refuses_leaves_nothing_to_restore(orin, start_daemon, read_only_node):
    """The first write of the pin fails: the limits never left the baseline. That is no restore to retry: before, the
    daemon tried to write the baseline back on every tick for as long as it ran (an error line each time, `ftgov
    status` saying "pinned" with no job), and `ftgov restore` after it failed as well."""
    d = start_daemon()
    c = d.client()
    err = c.request("register", **FEATURES)["error"]
    assert "Read-only file system" in err["message"]
    status = c.call("status")
    assert status["jobs"] == [] and status["gpus"][0]["pinned_hz"] is None
    assert limits(orin) == BASELINE and "will retry" not in d.log()
    d.close()
    restore = subprocess.run([sys.executable, "-m", "governor.cli", "restore", "--config", str(d.config_path),
                              "--state-dir", str(d.state_dir), "--sysfs-root", str(orin)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert restore.returncode == 0, restore.stderr


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
        watch.wait(lambda: limits_now(orin) == PINNED, 10)  # the daemon's tick notices and writes the pin again
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
        writes = [e for e in watch.drain() if e[0] in ("min_freq", "max_freq")]
        assert writes == [], "the daemon wrote after standing down"
    finally:
        watch.close()
    assert c.call("register", **FEATURES)["freq_hz"] == 714000000  # with no job left it governs again
    assert limits(orin) == PINNED


def test_a_clock_held_at_one_level_before_the_first_pin_is_named_in_the_log(orin, start_daemon):
    """jetson_clocks (min = max = the top) or a pin whose holder is gone (a crashed ftgovd whose state file could not
    be read) before the first pin: it becomes the baseline every job's end puts back, and its max caps every pin.
    The daemon says so where the operator looks, once a pin; a full range says nothing."""
    d = start_daemon()
    node = (orin / DEVFREQ).resolve()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    c.call("unregister", job_id=job)
    assert "another tool holds the clock" not in d.log()
    held = (714000000, 714000000)
    _write_limits(node, *held)
    job = c.call("register", **FEATURES)["job_id"]
    c.call("unregister", job_id=job)
    d.wait_jobs(0)
    assert limits(orin) == held
    assert re.search(r"GPU 0: its limits read min = max = 714 MHz before this pin: another tool holds the clock",
                     d.log()), d.log()


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
        pytest.skip("cannot mount a 16 KiB tmpfs for a full state dir (needs root/CAP_SYS_ADMIN): "
                    f"{proc.stderr.strip()}")
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


def test_a_full_state_dir_under_a_held_pin_is_one_error_line_not_a_traceback_each_save(orin, start_daemon,
                                                                                         tiny_tmpfs):
    """The job list's saves come on a timer (a job joins or leaves at the pin held, the energy every few ticks): a
    full /run made each a traceback in the journal ("Exception in callback StateSaver.flush()"). One line says it, and
    one more when a save takes again."""
    d = start_daemon(launch=False, extra_args=("--state-dir", str(tiny_tmpfs / "state")))
    d.start()
    c = d.client()
    first = c.call("register", **FEATURES)["job_id"]
    jobs = [c.call("register", **FEATURES)["job_id"] for _ in range(2)]  # each joins the pin held
    filler = _fill(tiny_tmpfs)
    for job in jobs:
        c.call("unregister", job_id=job)  # the pin stays; the job list is saved on the next loop turn, and fails
    log = d.log()
    assert "Exception in callback" not in log and "Traceback" not in log
    assert [line for line in log.splitlines() if "ERROR" in line and "No space left" in line] == [
        next(line for line in log.splitlines() if "cannot write state file" in line)]
    assert limits(orin) == PINNED
    filler.unlink()
    c.call("unregister", job_id=first)
    assert limits(orin) == BASELINE and "written again" in d.log()


def test_a_pin_check_on_a_full_state_dir_writes_nothing_and_leaves_no_pin_behind(orin, start_daemon, tiny_tmpfs):
    """`ftgov doctor`'s pin check saves the state before its pin, as a job's pin does: refused by a full /run, it
    left the idle GPU marked pinned (status, STATUS=) at the check's level with nothing on it, for good."""
    d = start_daemon(launch=False, extra_args=("--state-dir", str(tiny_tmpfs / "state")))
    d.start()
    c = d.client()
    c.call("unregister", job_id=c.call("register", **FEATURES)["job_id"])  # the state file exists: the dir is full
    filler = _fill(tiny_tmpfs)
    (result,) = c.call("pin_check")["gpus"]
    assert result["ok"] is False and result["wrote"] is False and "No space left" in result["detail"]
    assert c.call("status")["gpus"][0]["pinned_hz"] is None and limits(orin) == BASELINE
    filler.unlink()
    assert c.call("pin_check")["gpus"][0]["ok"] is True


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
