"""Crash safety: the state file, re-adoption after a daemon restart, `ftgov restore`, restore_on_stop: false."""

import json
import os
import signal
import subprocess
import sys

from governor.errors import UNKNOWN_JOB
from governor.sim import tree
from governor.sim.tree import replace_file
from governor.sysfs import Root
from tests.support.daemon import FEATURES, REPO, limits
from tests.support.fswatch import Watch
from tests.support.security import open_to_members, run_as

BASELINE = (306000000, 1300500000)
PINNED = (714000000, 714000000)


def _worker():
    """A process that stands for a training job: it lives until we kill it."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _ftgov(*args, env_extra=None):
    return subprocess.run([sys.executable, "-m", "governor.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})})


def test_state_file_holds_the_baseline_before_the_pin(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    c.call("register", name="j", **FEATURES)
    state = json.loads((d.state_dir / "state.json").read_text())
    assert state["gpus"]["0"]["baseline"]["min_hz"] == BASELINE[0]
    assert state["gpus"]["0"]["pinned_hz"] == PINNED[0]
    assert state["boot_id"] == (orin / "proc/sys/kernel/random/boot_id").read_text().strip()


def test_killed_daemon_restarts_and_readopts_a_live_job(orin, start_daemon):
    d = start_daemon()
    worker = _worker()
    try:
        c = d.client()  # held open: closing it would end the job before the kill
        job = c.call("register", pid=worker.pid, name="live", **FEATURES)["job_id"]
        d.stop(signal.SIGKILL)
        assert limits(orin) == PINNED  # nobody restored: the daemon died without a handler
        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
        status = d2.client().call("status")
        assert [(j["job_id"], j["adopted"]) for j in status["jobs"]] == [(job, True)]
        assert limits(orin) == PINNED
        assert "re-adopted after a daemon restart" in d2.log()
        worker.kill()
        worker.wait()
        d2.wait_jobs(0)
        assert limits(orin) == BASELINE
        # Job ids go on counting within a boot: a new job never reuses an old id.
        assert d2.client().call("register", **FEATURES)["job_id"] == job + 1
    finally:
        worker.kill()


# A member's attempt at resuming a job: the error code its answer carries.
_RESUME = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "resume", "params": {"job_id": int(sys.argv[2])}}).encode()
          + b"\\n")
print(json.loads(s.makefile().readline())["error"]["code"])
"""


def test_a_readopted_job_is_held_again_by_its_clients_new_connection(orin, start_daemon, member):
    """A restart re-adopts a live job by its process alone: a client in a notebook, whose process outlives its
    training, would keep the pin until the kernel exits. Its new connection holds the job again (resume), and
    closing that ends it. Only a job no connection holds, and only its own uid's."""
    d = start_daemon()
    worker = _worker()
    try:
        c = d.client()
        job = c.call("register", pid=worker.pid, name="notebook", **FEATURES)["job_id"]
        d.stop(signal.SIGKILL)
        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
        open_to_members(d2)
        user, _uid = member
        out, err = run_as(user, _RESUME, d2.socket, str(job)).communicate(timeout=60)
        assert out.strip() == str(UNKNOWN_JOB), err  # root's job: none of a member's
        again = d2.client()
        assert again.call("resume", job_id=job) == {"job_id": job, "policy": "mlg", "freq_hz": PINNED[0],
                                                     "reason": "re-adopted after a daemon restart", "gpu": "0"}
        other = d2.client()
        for job_id in (job, job + 1):  # held by a connection now; no such job
            assert other.request("resume", job_id=job_id)["error"]["code"] == UNKNOWN_JOB
        assert again.call("progress", job_id=job, steps=10) == {}  # its job now
        again.close()
        d2.wait_jobs(0)  # the worker lives on: the connection's end ended the job
        assert limits(orin) == BASELINE and worker.poll() is None
        assert "resumed by its client" in d2.log()
    finally:
        worker.kill()


def _saved_job(state_path) -> dict | None:
    try:
        jobs = json.loads(state_path.read_text())["jobs"]
    except (OSError, ValueError):  # not written yet
        return None
    return jobs[0] if jobs else None


def test_a_readopted_job_keeps_its_start_time_and_energy(orin, start_daemon):
    # After a SIGKILL and restart, a job that had run 25.0 s was recorded as 16.3 s: the new daemon counted anew.
    d = start_daemon()
    worker = _worker()
    try:
        c = d.client()
        c.call("register", pid=worker.pid, name="live", **FEATURES)
        state_path = d.state_dir / "state.json"
        watch = Watch(d.state_dir)
        try:  # the periodic save of the energy so far (every SAVE_ENERGY_TICKS ticks of 0.2 s here)
            watch.wait(lambda: (_saved_job(state_path) or {}).get("energy_j", 0) > 0, 15)
        finally:
            watch.close()
        before = c.call("status")["jobs"][0]
        d.stop(signal.SIGKILL)
        saved = _saved_job(state_path)
        assert saved["started_at"] > 0 and saved["energy_j"] > 0

        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
        after = d2.client().call("status")["jobs"][0]
        assert after["adopted"] and after["duration_s"] >= before["duration_s"] > 0
        assert after["energy_j"] >= saved["energy_j"]
        worker.kill()
        worker.wait()
        d2.wait_jobs(0)
        ended = next(line for line in d2.log().splitlines() if "ended (process exited) after" in line)
        assert float(ended.split(" after ")[1].split(" s,")[0]) >= before["duration_s"]
        energy_j = float(ended.split(" energy ")[1].split(" J ")[0])
        assert energy_j >= saved["energy_j"] - 0.05  # the log writes the energy to 0.1 J
    finally:
        worker.kill()


def test_killed_daemon_restarts_and_restores_when_the_job_died_too(orin, start_daemon):
    d = start_daemon()
    worker = _worker()
    c = d.client()
    c.call("register", pid=worker.pid, **FEATURES)
    d.stop(signal.SIGKILL)
    worker.kill()
    worker.wait()
    assert limits(orin) == PINNED
    d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
    assert limits(orin) == BASELINE  # restored before READY=1
    assert d2.client().call("status")["jobs"] == []


def test_ftgov_restore_after_a_sigkill_then_the_restart_readopts(orin, start_daemon):
    d = start_daemon()
    worker = _worker()
    try:
        c = d.client()
        c.call("register", pid=worker.pid, **FEATURES)
        # While the daemon holds the pin, restore refuses: written under it, the pin would be put back at once.
        busy = _ftgov("restore", "--config", str(d.config_path), "--state-dir", str(d.state_dir),
                      "--sysfs-root", str(orin))
        assert busy.returncode == 1 and "ftgovd is running on" in busy.stderr and "nothing was written" in busy.stderr
        assert limits(orin) == PINNED and "changed under our pin" not in d.log()
        d.stop(signal.SIGKILL)
        out = _ftgov("restore", "--config", str(d.config_path), "--state-dir", str(d.state_dir),
                     "--sysfs-root", str(orin))  # the kill dropped its lock on the state dir
        assert out.returncode == 0, out
        assert "GPU 0 restored" in out.stdout and limits(orin) == BASELINE
        again = _ftgov("restore", "--config", str(d.config_path), "--state-dir", str(d.state_dir),
                       "--sysfs-root", str(orin))
        assert again.returncode == 0 and "nothing to restore" in again.stdout
        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
        assert limits(orin) == PINNED  # the live job is held again, on a fresh baseline snapshot
        worker.kill()
        worker.wait()
        d2.wait_jobs(0)
        assert limits(orin) == BASELINE
    finally:
        worker.kill()


def test_ftgov_restore_of_a_state_file_it_cannot_read_fails_and_leaves_the_file(orin, start_daemon):
    """A crashed daemon's file that this ftgov cannot read (one a newer ftgov wrote, after a downgrade; a damaged
    one): restore said "nothing to restore (no state of this boot)", exited 0 (the unit's ExecStopPost too) with the
    pin in place, and moved the file aside, so that nothing could read its baseline any more."""
    d = start_daemon()
    c = d.client()
    c.call("register", **FEATURES)
    d.stop(signal.SIGKILL)
    path = d.state_dir / "state.json"
    newer = {**json.loads(path.read_text()), "written_by": "a later ftgov"}
    path.write_text(json.dumps(newer))
    out = _ftgov("restore", "--on-stop", "--config", str(d.config_path), "--state-dir", str(d.state_dir),
                 "--sysfs-root", str(orin))
    assert out.returncode == 1 and "nothing to restore" not in out.stdout, out
    assert f"state file {path} is invalid" in out.stderr and "written_by" in out.stderr, out.stderr
    assert json.loads(path.read_text()) == newer and limits(orin) == PINNED


def test_ftgov_restore_finds_a_simulated_daemons_state_beside_ftgov_sim_tree(tmp_path, start_daemon):
    """After `eval "$(ftgovd --simulate --print-env)"`, a plain `ftgov restore` restores the simulated GPU a killed
    daemon left pinned: its state is beside $FTGOV_SIM_TREE, not in the board's /run/ftgov."""
    state_dir = tmp_path / "ftgov-sim"
    sim_tree = tree.build(state_dir / "sim-orin").root  # where ftgovd --simulate builds it
    d = start_daemon(sim_tree, state_dir=state_dir)
    c = d.client()  # held open: closing it would end the job before the kill
    c.call("register", **FEATURES)
    env = {"FTGOV_SIM_TREE": str(sim_tree)}
    busy = _ftgov("restore", env_extra=env)  # the simulated daemon is a process in a shell, not the unit
    assert busy.returncode == 1 and "Ctrl-C" in busy.stderr and "systemctl" not in busy.stderr
    d.stop(signal.SIGKILL)
    assert limits(sim_tree) == PINNED
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    given = _ftgov("restore", "--state-dir", str(elsewhere), "--sysfs-root", str(sim_tree), env_extra=env)
    assert given.returncode == 0 and f"nothing to restore (no state of this boot in {elsewhere})" in given.stdout
    assert limits(sim_tree) == PINNED  # the flags given win over the environment
    out = _ftgov("restore", env_extra=env)
    assert out.returncode == 0, out
    assert f"the simulated tree {sim_tree} (from $FTGOV_SIM_TREE)" in out.stdout and "GPU 0 restored" in out.stdout
    assert limits(sim_tree) == BASELINE


def test_ftgov_restore_after_a_crash_restores_even_when_the_config_went_bad_meanwhile(orin, start_daemon):
    """systemd's ExecStopPost after a crash: a config edit the daemon would have refused must not leave its pins."""
    d = start_daemon(config={"restore_on_stop": False})
    worker = _worker()
    try:
        # Held open: a client dropped at once ends the job, and the kill then lands in the daemon's unpin (a fake
        # tree's attribute, unlike sysfs's, is empty between the write's truncation and its bytes).
        c = d.client()
        c.call("register", pid=worker.pid, **FEATURES)
        d.stop(signal.SIGKILL)
        d.config_path.write_text(d.config_path.read_text() + "limits:\n  max_jobs: 0\n")
        out = _ftgov("restore", "--on-stop", "--config", str(d.config_path), "--state-dir", str(d.state_dir),
                     "--sysfs-root", str(orin))
        assert out.returncode == 0 and "GPU 0 restored" in out.stdout and limits(orin) == BASELINE, out
        assert f"warning: config file {d.config_path}: limits.max_jobs: Input should be greater than 0" in out.stderr
        assert "restoring with the defaults for the rest (backend auto" in out.stderr
    finally:
        worker.kill()


def test_a_saved_job_of_a_policy_this_ftgov_does_not_know_is_not_adopted_and_the_start_restores(orin, start_daemon):
    """A state file a newer ftgov wrote (a downgrade in one boot) may name a policy this one does not have: the job's
    label passes the file's schema, and its adoption raised out of the start, which a restart could never get past
    (the file keeps its jobs), the pin in place meanwhile. The job is left out, as one on a GPU not here is."""
    d = start_daemon()
    worker = _worker()
    try:
        c = d.client()
        c.call("register", pid=worker.pid, **FEATURES)
        d.stop(signal.SIGKILL)
        path = d.state_dir / "state.json"
        saved = json.loads(path.read_text())
        saved["jobs"][0]["policy"] = "greedy"
        path.write_text(json.dumps(saved))  # as a newer ftgov wrote it
        d.start()
        assert limits(orin) == BASELINE and d.client().call("status")["jobs"] == []
        assert "policy 'greedy', which this ftgov does not know" in d.log()
    finally:
        worker.kill()


def test_state_from_another_boot_is_ignored(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    c.call("register", **FEATURES)
    d.stop(signal.SIGKILL)
    # "Reboot": the board came back with fresh limits and a new boot id; the old file must not be "restored".
    (orin / "proc/sys/kernel/random/boot_id").write_text("00000000-0000-0000-0000-000000000000\n")
    node = orin / "sys/class/devfreq/17000000.gpu"
    (node / "min_freq").write_text("408000000\n")
    (node / "max_freq").write_text("1224000000\n")
    out = _ftgov("restore", "--config", str(d.config_path), "--state-dir", str(d.state_dir), "--sysfs-root", str(orin))
    assert "nothing to restore" in out.stdout
    d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
    assert limits(orin) == (408000000, 1224000000)
    assert "from another boot" in d2.log()


def test_restore_on_stop_false_leaves_the_pin(orin, start_daemon):
    d = start_daemon(config={"restore_on_stop": False})
    worker = _worker()
    try:
        c = d.client()
        c.call("register", pid=worker.pid, **FEATURES)
        assert d.stop() == 0
        assert limits(orin) == PINNED
        out = _ftgov("restore", "--on-stop", "--config", str(d.config_path), "--state-dir", str(d.state_dir),
                     "--sysfs-root", str(orin))
        assert out.returncode == 0 and "leaving the pin" in out.stdout and limits(orin) == PINNED
        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock", config={"restore_on_stop": False})
        assert d2.client().call("status")["jobs"][0]["adopted"] is True
    finally:
        worker.kill()


def test_sigterm_restores_by_default(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    c.call("register", **FEATURES)
    assert d.stop() == 0
    assert limits(orin) == BASELINE


def test_a_clean_restart_restores_at_stop_and_takes_the_running_jobs_back(orin, start_daemon):
    """systemctl restart (an upgrade) ended every job at the stop ("daemon stopping") and dropped it from the state
    file: the restarted daemon had nothing to take back, each client's resume was refused, and the jobs trained on
    at the default clocks for good; only a crash kept them. The stop still restores the GPU (restore_on_stop), and
    keeps the jobs in the state file: the next start takes back those whose processes run, and pins again."""
    d = start_daemon()
    worker = _worker()
    try:
        c = d.client()
        job = c.call("register", pid=worker.pid, **FEATURES)
        assert limits(orin) == PINNED
        assert d.stop() == 0
        assert limits(orin) == BASELINE  # nothing left pinned while no daemon runs
        assert "ended (daemon stopping)" not in d.log()
        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
        (adopted,) = d2.client().call("status")["jobs"]
        assert adopted["job_id"] == job["job_id"] and adopted["adopted"] is True, adopted
        assert limits(orin) == PINNED
    finally:
        worker.kill()


def test_a_gpu_stood_down_from_stays_so_across_a_restart_while_its_jobs_run(orin, start_daemon):
    """on_external_change: stand_down leaves another tool's limits alone while the jobs under them run. The state
    file kept no trace of it: a restart (an upgrade, a crash) re-adopted the jobs and pinned over the tool's limits,
    which the daemon had left alone until then."""
    theirs = (1300500000, 1300500000)  # jetson_clocks: min = max = the top level
    d = start_daemon(config={"on_external_change": "stand_down"})
    worker = _worker()
    node = orin / "sys/class/devfreq/17000000.gpu"
    try:
        c = d.client()
        c.call("register", pid=worker.pid, **FEATURES)
        assert limits(orin) == PINNED
        d.notify.drain()
        replace_file(Root(orin), node / "min_freq", f"{theirs[0]}\n")
        replace_file(Root(orin), node / "max_freq", f"{theirs[1]}\n")
        d.wait_status(lambda m: "STATUS=1 job(s); GPU 0 at baseline" in m)  # stood down: it holds no pin now
        d.stop(signal.SIGKILL)
        d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock", config={"on_external_change": "stand_down"})
        (adopted,) = d2.client().call("status")["jobs"]
        assert adopted["adopted"] is True and d2.client().call("status")["gpus"][0]["stood_down"] is True
        assert limits(orin) == theirs, "the restart pinned over the other tool's limits"
    finally:
        worker.kill()
    d2.wait_jobs(0)
    assert limits(orin) == theirs  # and the job's end leaves them, as before the restart
    assert d2.client().call("register", **FEATURES)["freq_hz"] == PINNED[0]  # no job left: it governs again


def test_limits_changed_under_the_pin_are_reapplied_or_left(orin, start_daemon):
    theirs = (306000000, 2147483647)
    for mode in ("reapply", "stand_down"):
        d = start_daemon(config={"on_external_change": mode})
        c = d.client()
        c.call("register", **FEATURES)
        node = orin / "sys/class/devfreq/17000000.gpu"
        d.notify.drain()
        # What nvpmodel -m 0 does: MIN_FREQ 0 / MAX_FREQ 2147483647 (a plain file keeps the raw values), each in one
        # step as the kernel's attributes change: the daemon's tick reads them meanwhile.
        replace_file(Root(orin), node / "min_freq", "306000000\n")
        replace_file(Root(orin), node / "max_freq", "2147483647\n")
        # Every tick while a job runs checks the pin, then sends STATUS=; the second tick after the write has
        # certainly seen it.
        for _ in range(2):
            d.wait_status(lambda m: "STATUS=" in m)
        assert "limits changed under our pin" in d.log()
        if mode == "reapply":
            assert limits(orin) == PINNED
        c.close()
        d.wait_jobs(0)
        # Either way the other tool's limits are what the job's end leaves: re-applying keeps the pin while the job
        # runs, standing down leaves it; neither undoes the tool's change afterwards (nvpmodel would report a mode
        # whose limits are gone).
        assert limits(orin) == theirs
        d.stop()
        (node / "min_freq").write_text("306000000\n")
        (node / "max_freq").write_text("1300500000\n")
