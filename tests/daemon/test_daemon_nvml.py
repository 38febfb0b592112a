"""ftgovd on the NVML backend, against the fake pynvml (real API names and error codes) in the daemon's process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import governor
from governor.cli.ops import format_status
from governor.client import GovernorWarning
from governor.sim.meters import NVML_UPDATE_JITTER_S, NVML_UPDATE_S, UpdateClock
from governor.store import measurements as store
from tests.support import FAKENVML_DIR as FAKE_DIR
from tests.support.daemon import FEATURES, REPO, reload, rewrite_config
from tests.support.fswatch import Watch


@pytest.fixture
def nvml_daemon(start_daemon, tmp_path):
    """start(gpus, system, **config): an ftgovd on the fake NVML; ``restart_of``: a killed one's workdir and state
    again (the same fake GPUs)."""
    restarts = iter(range(2, 100))

    def start(gpus=({}, {}), system=None, restart_of=None, **config):
        spec = tmp_path / "fakenvml.json"
        calls = tmp_path / "calls.log"
        env = {"FAKENVML_CONFIG": str(spec), "FAKENVML_LOG": str(calls),
               "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO)])}
        if restart_of is not None:
            return start_daemon(root=tmp_path / "no-jetson", workdir=restart_of.workdir,
                                notify_name=f"n{next(restarts)}.sock", launch=True,
                                config_file=str(restart_of.config_path), env=env), calls
        spec.write_text(json.dumps({"gpus": list(gpus), **(system or {})}))
        d = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml", **config}, env=env)
        return d, calls
    return start


def set_faults(path: Path, faults: dict) -> None:
    """Bring on faults in the fake NVML of a running daemon (FakeSystem.faults_path), whole: it reads the file at
    every call."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


def _worker() -> subprocess.Popen:
    """A process that stands for a training job: it lives until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def test_job_on_a_named_gpu_locks_that_gpu_and_reset_restores(nvml_daemon):
    d, calls = nvml_daemon()
    c = d.client()
    status = c.call("status")
    assert [g["id"] for g in status["gpus"]] == ["0", "1"]
    uuid = status["gpus"][1]["uuid"]
    res = c.call("register", gpu=uuid, **FEATURES)
    assert res["gpu"] == "1" and res["freq_hz"] in status["gpus"][1]["available_hz"]
    gpus = c.call("status")["gpus"]
    assert gpus[1]["pinned_hz"] == res["freq_hz"] and gpus[0]["pinned_hz"] is None
    assert "nvmlDeviceSetGpuLockedClocks" in calls.read_text().split()
    end = c.call("unregister", job_id=res["job_id"])
    assert end["energy_j"] is not None and end["energy_j"] >= 0  # from the GPU's energy counter
    assert "nvmlDeviceResetGpuLockedClocks" in calls.read_text().split()
    assert c.call("status")["gpus"][1]["pinned_hz"] is None


def test_a_job_naming_no_gpu_on_a_multi_gpu_host_is_refused(nvml_daemon):
    d, _calls = nvml_daemon()
    err = d.client().request("register", **FEATURES)["error"]
    assert err["code"] == -32602 and err["data"]["field"] == "gpu" and "pass gpu" in err["message"]
    err = d.client().request("register", gpu=7, **FEATURES)["error"]
    assert err["code"] == -32602 and "no GPU with index 7" in err["message"]


def test_without_permission_to_lock_clocks_a_job_runs_as_observe_and_nothing_is_retried(nvml_daemon):
    """Not root, or a container or virtual GPU that withholds clock control: every Set*/Reset* answers
    NVML_ERROR_NO_PERMISSION. Every tune job's register was refused; and a refused pin check's restore (a Reset, refused
    alike) was retried on every tick. The first refusal is the evidence: the job is measured, never pinned."""
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80},), system={"root": False})
    c = d.client()
    (check,) = c.call("pin_check")["gpus"]
    assert not check["ok"] and not check["wrote"] and "NO_PERMISSION" in check["detail"], check
    assert "so its jobs run as observe" in check["detail"], check  # doctor's reader learns what the refusal did
    res = c.call("register", tune=True, **FEATURES)
    assert res["policy"] == "observe" and res["freq_hz"] is None and "NO_PERMISSION" in res["gpu_cannot_pin"], res
    (gpu,) = c.call("status")["gpus"]
    assert gpu["cannot_pin"] and gpu["write_error"] is None and gpu["pinned_hz"] is None, gpu
    c.call("unregister", job_id=res["job_id"])
    made = calls.read_text().split()
    assert made.count("nvmlDeviceSetGpuLockedClocks") == 1 and "nvmlDeviceResetGpuLockedClocks" not in made
    assert "restore failed" not in d.log() and "could not apply" not in d.log()


def test_a_gpu_that_cannot_lock_its_clocks_runs_its_jobs_as_observe_and_the_operator_is_told_once(nvml_daemon):
    """Before Volta, and on some boards, NVML answers Not Supported to a clock lock. Under tune (the default on NVML)
    every register was refused ("use the observe policy"), and nothing at start said so. Now the first refused lock
    marks the GPU for the daemon's life: that job and every later one is measured as observe, the register reply and
    the status say why, the journal says it once, and no lock is tried again."""
    from governor.cli.ops import format_status

    d, calls = nvml_daemon(gpus=({"supports_locking": False, "util_gpu_pct": 80},))
    c = d.client()
    res = c.call("register", tune=True, **FEATURES)
    assert res["policy"] == "observe" and res["freq_hz"] is None, res
    assert "NOT_SUPPORTED" in res["gpu_cannot_pin"] and "cannot be pinned" in res["reason"], res
    again = c.call("register", **FEATURES)
    assert again["policy"] == "observe" and again["gpu_cannot_pin"] == res["gpu_cannot_pin"], again
    status = c.call("status")
    (gpu,) = status["gpus"]
    assert gpu["cannot_pin"] == res["gpu_cannot_pin"] and gpu["pinned_hz"] is None and gpu["write_error"] is None
    assert [j["tuner"]["mode"] for j in status["jobs"]] == ["observe", "observe"]  # measured as observe measures
    assert "GPU 0: cannot be pinned, so its jobs run as observe" in format_status(status)
    for job in (res, again):
        assert c.call("unregister", job_id=job["job_id"])["energy_j"] is not None
    assert calls.read_text().split().count("nvmlDeviceSetGpuLockedClocks") == 1
    told = [line for line in d.log().splitlines() if "GPU 0 cannot be pinned:" in line]
    assert len(told) == 1 and " WARNING " in told[0] and "restart ftgovd" in told[0], told
    assert json.loads((d.state_dir / "state.json").read_text())["gpus"] == {}  # no baseline of a GPU never written


def test_a_job_on_a_gpu_that_cannot_lock_its_clocks_warns_its_user_once_and_trains_on(nvml_daemon):
    """The client logged the register reply at info: a user who asked for tune read nothing of observe."""
    d, _ = nvml_daemon(gpus=({"supports_locking": False, "util_gpu_pct": 80},))
    with pytest.warns(GovernorWarning, match=r"job \d+ runs as observe .*GPU 0 cannot be pinned: .*NOT_SUPPORTED") as w:
        with governor.job(**FEATURES, gpu=0, tune=True, socket=d.socket) as job:
            for _ in range(3):
                job.step()
    assert len([x for x in w if issubclass(x.category, GovernorWarning)]) == 1
    assert not job.disabled and job.result["steps"] == 3


def test_a_lock_that_fails_otherwise_is_the_registers_error_and_the_next_job_pins(nvml_daemon, tmp_path):
    """A lost GPU (or any error but Not Supported and No Permission) fails that pin only: the GPU is not marked."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": 80},), system={"faults_path": str(faults)})
    c = d.client()
    set_faults(faults, {"gpus": {"0": {"nvmlDeviceSetGpuLockedClocks": 15}}})  # NVML_ERROR_GPU_IS_LOST
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32000 and "GPU_IS_LOST" in err["message"], err
    set_faults(faults, {})
    res = c.call("register", **FEATURES)
    assert res["policy"] == "tune" and res["freq_hz"] is not None and "gpu_cannot_pin" not in res, res
    assert c.call("status")["gpus"][0]["cannot_pin"] is None


def test_observe_mode_changes_nothing_and_refuses_tune(nvml_daemon):
    d, calls = nvml_daemon(policy="observe")
    c = d.client()
    res = c.call("register", gpu=0, **FEATURES)
    assert res["freq_hz"] is None and "mlg would pick" in res["reason"]
    gpu_line = next(line for line in d.log().splitlines() if "INFO GPU 0: " in line)
    assert "backend=nvml index=0 " in gpu_line and "{" not in gpu_line  # key=value text, not a Python dict
    err = c.request("register", gpu=0, tune=True, **FEATURES)["error"]
    assert err["data"]["field"] == "tune"
    c.call("unregister", job_id=res["job_id"])
    written = [name for name in calls.read_text().split() if name.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]
    assert written == []


def test_nvml_defaults_to_the_tuner_and_applies_and_restores_a_power_cap(nvml_daemon):
    d, calls = nvml_daemon(gpus=({},), power_cap_w=500)
    c = d.client()
    res = c.call("register", **FEATURES)
    assert res["policy"] == "tune"  # the Orin-trained tree does not transfer: the tuner is the default on NVML
    made = calls.read_text().split()
    assert made.count("nvmlDeviceSetPowerManagementLimit") == 1
    c.call("unregister", job_id=res["job_id"])
    made = calls.read_text().split()
    assert "nvmlDeviceResetGpuLockedClocks" in made
    assert made.count("nvmlDeviceSetPowerManagementLimit") == 2  # the previous limit put back with the clocks


def test_a_tuned_job_starts_at_the_top_of_the_table_then_where_its_shape_converged_before(nvml_daemon, tmp_path):
    """The Orin tree's MHz mean nothing on this GPU: the start is the top of the table (what the default governor
    runs a busy GPU at), until the measurement store holds a converged level for the same shape on this kind of GPU."""
    path = tmp_path / "m.sqlite"
    d, _calls = nvml_daemon(gpus=({},), store={"path": str(path)})
    c = d.client()
    gpu = c.call("status")["gpus"][0]
    levels = gpu["available_hz"]
    res = c.call("register", **FEATURES)
    assert res["policy"] == "tune" and res["freq_hz"] == levels[-1], res
    assert "top of the table" in res["reason"]
    c.call("unregister", job_id=res["job_id"])
    d.stop()

    features = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
    s = store.Store(path)
    # A job of the same shape whose measured seq_len differs by 5% (within governor.daemon.starts' tolerance).
    s.add(store.JobRecord(ended_at=1.7e9, **{**features, "seq_len": features["seq_len"] * 1.05}, gpu_util=55.0,
                          backend="nvml", gpu_name=gpu["name"], levels_hz=json.dumps(levels), policy="tune",
                          freq_hz=levels[3], converged=True, uid=os.geteuid()))  # this test's own user
    s.close()
    d2, _calls = nvml_daemon(gpus=({},), store={"path": str(path)})
    c = d2.client()
    res = c.call("register", **FEATURES)
    assert res["freq_hz"] == levels[3], res
    assert "where the last tuned job of this shape (yours, else root's) converged" in res["reason"], res
    c.call("unregister", job_id=res["job_id"])
    other = c.call("register", **{**FEATURES, "num_layers": FEATURES["num_layers"] * 2})
    assert other["freq_hz"] == levels[-1], other  # another shape: nothing learnt for it


def test_on_a_jetson_the_tree_still_picks_the_start(orin, start_daemon):
    d = start_daemon(config={"policy": "tune"})
    res = d.client().call("register", **FEATURES)
    assert res["freq_hz"] == 714000000 and "tree:" in res["reason"], res  # the paper tree's pick, not the top


def test_a_window_inside_one_update_of_the_energy_counter_waits_for_it_and_tuning_goes_on(nvml_daemon):
    """Steps of 26 ms against NVML's counter, which moves every 100 ms: a window of 4 steps that starts just after an
    update sees none (0 J). That is a window too short to read, not a stalled meter: it stays open until the counter
    moves, and the search goes on."""
    # settle_updates 0: the window opens right after its warm-up step, not an update later (as by default).
    d, _calls = nvml_daemon(gpus=({},), tuner={"window_rule": "steps", "baseline_window": False,
                                               "settle_updates": 0})
    c = d.client()
    job_id = c.call("register", **FEATURES)["job_id"]
    c.notify("progress", job_id=job_id, steps=1, phase="train")  # the search starts: pinned at its first level
    assert c.call("status")["jobs"][0]["tuner"]["status"] == "measuring"
    clock = UpdateClock(NVML_UPDATE_S, NVML_UPDATE_JITTER_S, seed=0)  # the fake GPU 0's update instants
    update = clock.last_at(time.monotonic()) + NVML_UPDATE_S
    time.sleep(max(0.0, update + 0.005 - time.monotonic()))  # the job's steps run up to just after an update
    for steps in range(2, 7):  # the warm-up step, then 4 steps, all read before the next update
        c.notify("progress", job_id=job_id, steps=steps, phase="train")
    tuner = c.call("status")["jobs"][0]["tuner"]
    assert time.monotonic() < update + NVML_UPDATE_S - NVML_UPDATE_JITTER_S, "the reports outran the counter's update"
    assert tuner["status"] == "measuring" and tuner["probes"] == 0, tuner
    time.sleep(max(0.0, update + NVML_UPDATE_S + 0.005 - time.monotonic()))  # 4 more steps: the counter has moved
    c.notify("progress", job_id=job_id, steps=10, phase="train")
    tuner = c.call("status")["jobs"][0]["tuner"]
    assert tuner["status"] == "measuring" and tuner["probes"] == 1, (tuner, d.log())
    assert tuner["last_window"]["steps"] == 8, tuner


def test_a_client_that_times_its_steps_gets_windows_whose_ends_are_the_counters_updates(nvml_daemon, tmp_path):
    """Against NVML's counter (100 ms updates, held between), 4-step windows of 26 ms steps read at the reports are off
    by up to a whole update's energy. With step_end_s, a window runs from one update instant to another, where the
    counter is exact, and counts the steps between them from their end times: at a steady power each window's energy
    per second is the GPU's true power at its level."""
    path = tmp_path / "m.sqlite"
    util_pct, top_mhz = 80, 1980
    # The re-pin interval shortened and no settling after a pin: 120 steps of 26 ms are 3 s, and this checks the
    # windows' edges, not the rate at which probes may move the pin (tests/daemon/test_ratelimit.py) nor the
    # wait for the counter's next update after one (tests/policy/test_windows_settle.py).
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": util_pct},), store={"path": str(path)},
                            tuner={"window_rule": "steps", "settle_updates": 0}, limits={"repin_interval_s": 0.01})
    c = d.client()
    job_id = c.call("register", **FEATURES)["job_id"]
    step_s = 0.026
    next_end = time.monotonic()
    for steps in range(1, 121):
        next_end += step_s
        time.sleep(max(0.0, next_end - time.monotonic()))  # the step's work
        c.notify("progress", job_id=job_id, steps=steps, phase="train", step_end_s=time.monotonic())
    status = c.call("status")
    tuner = status["jobs"][0]["tuner"]
    # Windows to check each one's edges (a loaded CI machine fitted 3 in these 3 s, a quiet one 4 or more).
    assert tuner["probes"] >= 2 and not tuner["status"].startswith("stopped"), (tuner, d.log())
    # Status counts every read of the counter the daemon made, and what they cost (scripts/daemon_cpu.py's figure).
    gpu, = status["gpus"]
    made = _calls.read_text().split().count("nvmlDeviceGetTotalEnergyConsumption")  # and the timer's since status
    # Every read made before a second status is counted in it, but the backend's probe of the counter at start (one
    # call, governor/backends/nvml.py): no allowance for the timer's reads in between, which a loaded machine made
    # more of than the two the check allowed.
    (after,) = c.call("status")["gpus"]
    assert 0 < gpu["energy_counter_reads"] <= made <= after["energy_counter_reads"] + 1, (gpu, made, after)
    assert gpu["energy_counter_read_s"] > 0, gpu
    end = c.call("unregister", job_id=job_id)
    assert isinstance(end["saved_measured_steps"], int) and end["saved_pct_err"] > 0, end  # steps counted whole
    d.stop()
    job, = store.read_jobs(store.open_read_only(path))
    assert job.windows[0].level_hz is None and len(job.windows) == 1 + tuner["probes"]  # the baseline first
    for w in job.windows:
        mhz = top_mhz if w.level_hz is None else w.level_hz / 1e6  # unlocked, a busy GPU runs at the top
        true_w = (90_000 + (650_000 - 90_000) * util_pct / 100 * (mhz / top_mhz) ** 2) / 1000
        assert w.joules_per_step / w.seconds_per_step == pytest.approx(true_w, rel=0.03), (w, true_w, d.log())


def test_the_load_is_first_read_a_sample_period_after_the_first_training_step(nvml_daemon, tmp_path):
    """NVML's load is the share of its last sample period (up to 1 s) in which a kernel ran. On an H200 a read at a
    Trainer's first training step gave 0%, and the tree took a busy job for an idle one (gpu_util <= 22). The first
    read waits the GPU's load_lag_s (1 s) after the step: the fake GPU's reading covers its last second the same way."""
    started = tmp_path / "loop-started"
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": 80, "util_busy_from_path": str(started)},), policy="mlg",
                            util_sample_s=0.2)
    c = d.client()
    features = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
    res = c.call("register", **features)
    assert res["freq_hz"] is None and "waiting for gpu_util" in res["reason"], res
    started.write_text(repr(time.monotonic()))  # the loop runs from now
    c.notify("progress", job_id=res["job_id"], steps=1, phase="train")
    d.wait_status(lambda m: "pinned to" in m)
    job, = c.call("status")["jobs"]
    assert job["features"]["gpu_util"] == 80.0, (job, d.log())  # a read within the first 0.2 s: 20% at most
    assert "read from 1 s after it" in job["reason"], job["reason"]
    assert job["freq_hz"] == 795_000_000, job  # the tree's busy branch (714 MHz: 795 on this table); idle: 1095


def test_a_step_end_that_is_not_this_hosts_recent_clock_is_refused_in_one_line(nvml_daemon):
    d, _calls = nvml_daemon(gpus=({},))
    c = d.client()
    job_id = c.call("register", **FEATURES)["job_id"]
    now = time.monotonic()
    for bad in (now + 60, now - 3600, "soon", True):
        err = c.request("progress", job_id=job_id, steps=1, step_end_s=bad)["error"]
        assert err["code"] == -32602 and err["data"]["field"] == "step_end_s" and "\n" not in err["message"], err
    c.call("progress", job_id=job_id, steps=2, step_end_s=now)
    err = c.request("progress", job_id=job_id, steps=3, step_end_s=now - 1)["error"]
    assert err["code"] == -32602 and "is not after" in err["message"], err
    c.call("progress", job_id=job_id, steps=4)  # a report without one is taken as before
    assert c.call("status")["jobs"][0]["steps"] == 4


def test_a_report_of_steps_already_counted_does_not_move_the_last_steps_end(nvml_daemon):
    """A report whose count is not past the one held (a stale count, a step reported again) says when no new step
    ended: its step_end_s was taken for the end of the step held, so that step "ended" later than it did. The energy
    meter's points then counted no step up to there and two in the next (a tuned job's windows closed in the step
    counted twice read 5% cheap, a baseline so and the saving 21% where it was 29%), and the next step's true end,
    before that one, was refused."""
    d, _calls = nvml_daemon(gpus=({},))
    c = d.client()
    job_id = c.call("register", **FEATURES)["job_id"]
    now = time.monotonic()
    c.call("progress", job_id=job_id, steps=10, step_end_s=now - 3)
    c.call("progress", job_id=job_id, steps=5, step_end_s=now - 1)
    c.call("progress", job_id=job_id, steps=10, step_end_s=now - 1)
    c.call("progress", job_id=job_id, steps=11, step_end_s=now - 2)  # step 11's end: after step 10's
    assert c.call("status")["jobs"][0]["steps"] == 11


def test_the_counters_update_instants_are_found_by_the_daemons_own_reads_when_reports_keep_its_pace(nvml_daemon):
    """The HF callback reports about 10 times a second: on an H200 its reads, all at one phase of the counter's
    100 ms updates, never showed where the updates fall. The daemon reads the counter on a timer of its own at the
    instants that tell most, so the grid is known within about a second and windows end on it; from then on a
    report reads nothing (a read of the real counter took 3.9 ms of CPU on an H200): a few reads a second in all."""
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80},), policy="observe", tuner={"window_rule": "time"})
    c = d.client()
    job_id = c.call("register", **FEATURES)["job_id"]
    clock = UpdateClock(NVML_UPDATE_S, NVML_UPDATE_JITTER_S, seed=0)  # the fake GPU 0's update instants

    def report(steps: int) -> None:  # one report 3 ms after each update, as the callback's pace may fall
        update = clock.last_at(time.monotonic()) + NVML_UPDATE_S
        time.sleep(max(0.0, update + 0.003 - time.monotonic()))  # the job's steps
        c.notify("progress", job_id=job_id, steps=steps, phase="train", step_end_s=time.monotonic())

    for steps in range(1, 21):
        report(steps)
    c.call("status")  # every report handled
    assert "the energy counter's update instants are known" in d.log(), d.log()
    reads_before = calls.read_text().split().count("nvmlDeviceGetTotalEnergyConsumption")
    started = time.monotonic()
    for steps in range(21, 51):
        report(steps)
    c.call("status")
    reads = calls.read_text().split().count("nvmlDeviceGetTotalEnergyConsumption") - reads_before
    assert reads / (time.monotonic() - started) < 6, reads  # the timer's ~3 and the 1 s tick's, not 10 reports'
    c.call("unregister", job_id=job_id)



def test_in_observe_mode_doctors_pin_check_writes_nothing_and_a_reload_into_tune_waits_for_a_restart(nvml_daemon):
    d, calls = nvml_daemon(gpus=({},), policy="observe")
    c = d.client()
    (answer,) = c.call("pin_check")["gpus"]  # a read-only handle refused the pin, then the restore, retried for ever
    assert answer["ok"] and not answer["wrote"] and "not checked: the observe policy" in answer["detail"], answer
    rewrite_config(d, policy="tune")
    reload(d, "config reloaded")
    assert "policy tune takes effect only at start: the GPUs were opened read-only" in d.log()
    assert c.call("status")["policy"] == "observe"
    res = c.call("register", gpu=0, **FEATURES)
    assert res["freq_hz"] is None
    c.call("unregister", job_id=res["job_id"])
    assert not [call for call in calls.read_text().split() if call.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]
    complaints = [line for line in d.log().splitlines() if (" WARNING " in line or " ERROR " in line)
                  and "socket.group" not in line]  # a host without the ftgov group: said at start, root serves on
    assert len(complaints) == 1 and "reload: policy tune" in complaints[0], complaints


def test_an_energy_counter_that_goes_back_leaves_a_state_file_the_next_start_restores_from(nvml_daemon, tmp_path):
    """NVML's counter counts from the driver's load; one that restarts under a job (a GPU reset) read less than at the
    job's start, the job's energy so far went negative, and the state file saved with it was one the next start (and
    `ftgov restore`) refused whole (energy_j >= 0), baselines and all: after a crash the clock stayed locked."""
    faults = tmp_path / "faults.json"
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80, "energy_mj": 5e9},), system={"faults_path": str(faults)},
                           policy="ffg")
    worker = _worker()
    try:
        c = d.client()
        c.call("register", pid=worker.pid, **FEATURES)
        set_faults(faults, {"gpus": {"0": {"energy_offset_mj": -5e9}}})  # the counter starts again from 0
        other = c.call("register", **FEATURES)["job_id"]
        c.call("unregister", job_id=other)  # a job leaves: the state file is written on the next loop turn
        c.call("status")
        saved = json.loads((d.state_dir / "state.json").read_text())
        assert saved["jobs"][0]["energy_j"] >= 0, saved["jobs"]
        assert "GPU 0's energy counter went back" in d.log()
        d.stop(signal.SIGKILL)
        worker.kill()
        worker.wait()
        before = len(calls.read_text().split())
        d2, _calls = nvml_daemon(restart_of=d)
        made = calls.read_text().split()[before:]
        assert "nvmlDeviceResetGpuLockedClocks" in made, d2.log()  # the job is gone: its lock undone at start
        assert "invalid state file" not in d2.log()
    finally:
        worker.kill()


def test_doctors_pin_check_leaves_a_clock_lock_set_before_ftgovd_alone_and_a_first_pin_says_it_undoes_it(
        nvml_daemon):
    """An operator's `nvidia-smi -lgc 1500` before ftgovd: NVML cannot read a lock back, so the pin check's restore
    (a reset) removed it, and the clock went back to the driver's default: the check that says it moves no clock
    moved it, without a word. The clock event reasons show a lock in force (ApplicationsClocksSetting)."""
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80, "locked_mhz": [1500, 1500]},))
    c = d.client()
    (answer,) = c.call("pin_check")["gpus"]
    assert not answer["ok"] and not answer["wrote"] and "nvidia-smi -i 0 -rgc" in answer["detail"], answer
    assert not [call for call in calls.read_text().split() if call.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]
    assert c.call("status")["gpus"][0]["cur_hz"] == 1_500_000_000
    c.call("register", **FEATURES)  # a job's pin is the operator's choice to make (ftgovd runs): said, not refused
    warning = next(line for line in d.log().splitlines() if "not set by ftgovd" in line)
    assert " WARNING " in warning and "the end of its jobs resets it" in warning, warning


def test_a_restart_that_finds_the_gpus_numbered_anew_restores_the_gpu_it_locked_by_its_uuid(nvml_daemon, tmp_path):
    """NVML numbers the GPUs it finds at its init: with one of two gone (drained, or off the bus) when ftgovd starts
    again, the locked GPU 1 is NVML's GPU 0. The state file keys GPUs by index: "GPU 1: no such GPU", its baseline
    dropped, and its lock stayed (and a GPU 0 baseline would have been written to the other GPU)."""
    a, b = "GPU-0000000a-5a1e-4e55-9a3d-00000000f00a", "GPU-0000000b-5a1e-4e55-9a3d-00000000f00b"
    d, calls = nvml_daemon(gpus=({"uuid": a, "util_gpu_pct": 80}, {"uuid": b, "util_gpu_pct": 80}), policy="ffg")
    worker = _worker()
    try:
        c = d.client()  # held open: closing it would end the job before the kill
        assert c.call("register", pid=worker.pid, gpu=b, **FEATURES)["gpu"] == "1"
        d.stop(signal.SIGKILL)
        worker.kill()
        worker.wait()
        spec = tmp_path / "fakenvml.json"
        spec.write_text(json.dumps({"gpus": [{"uuid": b, "util_gpu_pct": 80}]}))  # GPU a is gone
        before = len(calls.read_text().split())
        d2, _calls = nvml_daemon(restart_of=d)
        assert "nvmlDeviceResetGpuLockedClocks" in calls.read_text().split()[before:], d2.log()
        assert "state file: GPU 1 " + f"({b}) is GPU 0 now" in d2.log()
    finally:
        worker.kill()


def test_a_gpu_without_an_energy_counter_is_said_so_at_start_and_at_a_jobs_end(nvml_daemon):
    """Before Volta (and on some virtual GPUs) NVML answers Not Supported for the energy counter: the daemon said
    "job energy from the GPU's own energy counter" at start and "unknown (no rails)" at a job's end."""
    d, _ = nvml_daemon(gpus=({"supports_energy": False},))
    c = d.client()
    job = c.call("register", **FEATURES)
    c.call("unregister", job_id=job["job_id"])
    log = d.log()
    assert "from the GPU's own energy counter" not in log
    assert "GPU 0 has neither power rails nor an energy counter" in log
    assert "energy unknown (no rails or energy counter)" in log, log


def test_a_locked_gpu_absent_at_a_restart_keeps_its_baseline_for_the_start_that_finds_it_back(nvml_daemon, tmp_path):
    """A killed ftgovd left GPU b locked; b was off the bus (being reset) when ftgovd started again. Its baseline was
    dropped as "no such GPU" and the first save wrote the state file without it: nothing re-probes NVML while the
    daemon runs, and neither the next start nor `ftgov restore` had anything left to put back once b returned."""
    a, b = "GPU-0000000a-5a1e-4e55-9a3d-00000000f00a", "GPU-0000000b-5a1e-4e55-9a3d-00000000f00b"
    spec = tmp_path / "fakenvml.json"
    both = json.dumps({"gpus": [{"uuid": a, "util_gpu_pct": 80}, {"uuid": b, "util_gpu_pct": 80}]})
    d, calls = nvml_daemon(gpus=json.loads(both)["gpus"], policy="ffg")
    worker = _worker()
    try:
        c = d.client()  # held open: closing it would end the job before the kill
        assert c.call("register", pid=worker.pid, gpu=b, **FEATURES)["gpu"] == "1"
        d.stop(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    spec.write_text(json.dumps({"gpus": [{"uuid": a, "util_gpu_pct": 80}]}))  # b is gone for now
    d2, _calls = nvml_daemon(restart_of=d)
    c = d2.client()
    job = c.call("register", gpu=a, **FEATURES)  # a pin on GPU a: the state file is written again
    assert job["freq_hz"] is not None
    saved = json.loads((d2.state_dir / "state.json").read_text())["gpus"]
    assert saved[b]["describe"]["uuid"] == b and saved["0"]["describe"]["uuid"] == a, saved
    assert f"state file: GPU 1 ({b}, not here now): its baseline" in d2.log()
    d2.stop(signal.SIGKILL)
    # systemd's ExecStopPost: a's lock undone, b's baseline kept (its absence is no failure: it would fail every stop)
    restore = subprocess.run([sys.executable, "-m", "governor.cli", "restore", "--on-stop", "--config",
                              str(d.config_path), "--state-dir", str(d.state_dir)], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "FAKENVML_CONFIG": str(spec), "FAKENVML_LOG": str(calls),
                                              "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO)])})
    assert restore.returncode == 0, restore.stderr
    assert "GPU 0 restored" in restore.stdout and "stays in the state file" in restore.stderr, restore
    assert list(json.loads((d.state_dir / "state.json").read_text())["gpus"]) == [b]
    spec.write_text(both)  # b is back
    before = len(calls.read_text().split())
    d3, _calls = nvml_daemon(restart_of=d)
    assert "nvmlDeviceResetGpuLockedClocks" in calls.read_text().split()[before:], d3.log()
    assert "GPU 1 restored to its baseline" in d3.log(), d3.log()
    assert b not in json.loads((d3.state_dir / "state.json").read_text())["gpus"]


def test_a_locked_gpu_found_by_a_later_probe_gets_the_baseline_the_state_file_kept(nvml_daemon, tmp_path):
    """No GPU at all at a restart (NVML answered Driver Not Loaded): the daemon serves and probes again. The GPU a
    killed ftgovd left locked was governed from the probe that found it, with its baseline dropped at start: its lock
    stayed until a job's end happened to reset it."""
    faults = tmp_path / "faults.json"
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80}, {"util_gpu_pct": 80}), system={"faults_path": str(faults)},
                           policy="ffg", probe_retry_s=0.05)
    worker = _worker()
    try:
        c = d.client()  # held open: closing it would end the job before the kill
        assert c.call("register", pid=worker.pid, gpu=1, **FEATURES)["freq_hz"] is not None
        d.stop(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    set_faults(faults, {"system": {"nvmlInitWithFlags": 9}})  # NVML_ERROR_DRIVER_NOT_LOADED
    d2, _calls = nvml_daemon(restart_of=d)
    assert d2.client().call("status")["gpus"] == []
    before = len(calls.read_text().split())
    set_faults(faults, {})
    d2.wait_status(lambda m: "GPU 1 at baseline" in m)
    assert "nvmlDeviceResetGpuLockedClocks" in calls.read_text().split()[before:], d2.log()
    assert "GPU 1 (GPU-00000001-5a1e-4e55-9a3d-00000000f001) is back: restoring" in d2.log()


def test_a_kept_baseline_that_does_not_fit_the_gpu_found_back_is_said_and_not_written(nvml_daemon, tmp_path):
    """The same, with the kept baseline outside the GPU's table (it did not come from this GPU): it was dropped
    without a word, where the start's check of a saved GPU says so."""
    faults = tmp_path / "faults.json"
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80}, {"util_gpu_pct": 80}), system={"faults_path": str(faults)},
                           policy="ffg", probe_retry_s=0.05)
    worker = _worker()
    try:
        c = d.client()
        assert c.call("register", pid=worker.pid, gpu=1, **FEATURES)["freq_hz"] is not None
        d.stop(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    state_path = d.state_dir / "state.json"
    state = json.loads(state_path.read_text())
    state["gpus"]["1"]["baseline"]["min_hz"] = 1  # below any level
    state_path.write_text(json.dumps(state))
    set_faults(faults, {"system": {"nvmlInitWithFlags": 9}})  # NVML_ERROR_DRIVER_NOT_LOADED
    d2, _calls = nvml_daemon(restart_of=d)
    before = len(calls.read_text().split())
    set_faults(faults, {})
    d2.wait_status(lambda m: "GPU 1 at baseline" in m)
    said = [line for line in d2.log().splitlines() if ") is back" in line]
    assert len(said) == 1 and " WARNING " in said[0] and "is not restored: baseline 1.." in said[0], said
    assert "nvmlDeviceResetGpuLockedClocks" not in calls.read_text().split()[before:]


def test_a_pin_that_sets_no_power_cap_keeps_no_power_limit_to_put_back(nvml_daemon):
    """With no power_cap_w, ftgovd never writes the power limit, but its baseline carried the limit read at the first
    pin, and every restore (the job's end, the next start, `ftgov restore`) set it back where it read otherwise: an
    operator's `nvidia-smi -pl` during a job was undone, and where power limits may not be set the restore failed,
    retried on every tick."""
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80},))
    c = d.client()
    res = c.call("register", tune=True, **FEATURES)
    assert res["freq_hz"] is not None, res
    (saved,) = json.loads((d.state_dir / "state.json").read_text())["gpus"].values()
    assert "power_limit_mw" not in saved["baseline"]["extra"], saved
    c.call("unregister", job_id=res["job_id"])
    assert "nvmlDeviceSetPowerManagementLimit" not in calls.read_text().split()


@pytest.mark.parametrize("code", [3, 4], ids=["not-supported", "no-permission"])
def test_a_power_cap_the_gpu_refuses_leaves_the_clock_pin_and_is_not_tried_again(nvml_daemon, tmp_path, code):
    """Many virtual and cloud GPUs allow clock locks but not power limits: nvmlDeviceSetPowerManagementLimit answers
    NOT_SUPPORTED or NO_PERMISSION to any limit. With power_cap_w set, every register there failed (the job dropped)
    after its clock lock had been written. Now the clock pin applies, the cap does not: said once in the journal and
    shown in status, and no later pin tries it again; no restore touches a power limit that was never changed."""
    from governor.cli.ops import format_status

    faults = tmp_path / "faults.json"
    set_faults(faults, {"gpus": {"0": {"nvmlDeviceSetPowerManagementLimit": code}}})
    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80},), system={"faults_path": str(faults)}, power_cap_w=500)
    c = d.client()
    first = c.call("register", tune=True, **FEATURES)
    assert first["policy"] == "tune" and first["freq_hz"] is not None, first
    status = c.call("status")
    (gpu,) = status["gpus"]
    assert gpu["pinned_hz"] == first["freq_hz"] and gpu["write_error"] is None and gpu["cannot_pin"] is None, gpu
    assert ("NOT_SUPPORTED" if code == 3 else "NO_PERMISSION") in gpu["cannot_cap"], gpu
    assert "GPU 0: power_cap_w is not applied (its clocks are pinned without it): " in format_status(status)
    (saved,) = json.loads((d.state_dir / "state.json").read_text())["gpus"].values()
    assert "power_limit_mw" not in saved["baseline"]["extra"], saved  # nothing for a restore after a crash to set
    c.call("unregister", job_id=first["job_id"])
    again = c.call("register", tune=True, **FEATURES)
    assert again["freq_hz"] is not None, again
    c.call("unregister", job_id=again["job_id"])
    made = calls.read_text().split()
    assert made.count("nvmlDeviceSetPowerManagementLimit") == 1  # neither the restores nor the next pin tried again
    assert made.count("nvmlDeviceSetGpuLockedClocks") == 2 and made.count("nvmlDeviceResetGpuLockedClocks") == 2
    (gpu,) = c.call("status")["gpus"]
    assert gpu["pinned_hz"] is None and gpu["write_error"] is None and gpu["baseline_max_hz"] is None, gpu
    told = [line for line in d.log().splitlines() if "power limit cannot be set" in line]
    assert len(told) == 1 and " WARNING " in told[0], told
    assert "could not apply" not in d.log() and "restore failed" not in d.log()


def test_a_power_cap_outside_a_gpus_range_leaves_its_clock_pin_and_is_said_once(nvml_daemon):
    """One power_cap_w for a node of unlike GPUs: a cap outside one GPU's range failed every register there (the
    job dropped, after its lock had been written). The clock pin applies without the cap there, said once, while
    the GPU whose range holds the cap is capped; nothing is left pinned or limited."""
    from governor.cli.ops import format_status

    d, calls = nvml_daemon(gpus=({"util_gpu_pct": 80}, {"util_gpu_pct": 80, "power_limit_range_mw": [100000, 350000]}),
                           power_cap_w=500)
    c = d.client()
    jobs = [c.call("register", tune=True, gpu=gpu, **FEATURES) for gpu in (0, 1, 1)]
    assert all(j["freq_hz"] is not None for j in jobs), jobs
    status = c.call("status")
    gpus = status["gpus"]
    assert gpus[1]["pinned_hz"] == jobs[1]["freq_hz"] and gpus[1]["write_error"] is None, gpus[1]
    assert "outside" in gpus[1]["cannot_cap"] and gpus[0]["cannot_cap"] is None, gpus
    # its power limit can be set (to a value in its range), and a reload with another cap tries it: not "until restart"
    (said,) = [line for line in format_status(status).splitlines() if "power_cap_w" in line]
    assert said.startswith("  GPU 1: power_cap_w is not applied") and "restart" not in said, said
    for job in jobs:
        c.call("unregister", job_id=job["job_id"])
    again = c.call("register", tune=True, gpu=1, **FEATURES)  # a later first pin: not tried again
    c.call("unregister", job_id=again["job_id"])
    made = calls.read_text().split()
    assert made.count("nvmlDeviceSetPowerManagementLimit") == 2, made  # GPU 0's cap and its restore, none on GPU 1
    assert all(g["pinned_hz"] is None and g["write_error"] is None for g in c.call("status")["gpus"])
    told = [line for line in d.log().splitlines() if "power_cap_w (500 W) is not applied" in line]
    assert len(told) == 1 and "GPU 1" in told[0] and "100000..350000 mW" in told[0], told
    assert "a reload with a power_cap_w within its range tries that one" in told[0], told
    # ftgov doctor says it too, where an operator checks a node (only status and the journal did)
    env = {**os.environ, "FAKENVML_CONFIG": str(d.workdir.parent / "fakenvml.json"),
           "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO)])}
    out = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--json", "--config", str(d.config_path),
                          "--socket", d.socket, "--state-dir", str(d.state_dir)], capture_output=True, text=True,
                         env=env, timeout=60, cwd="/")
    (cap,) = [check for check in json.loads(out.stdout)["checks"] if check["name"] == "power cap"]
    assert cap["status"] == "WARN" and cap["detail"].startswith("GPU 1: power_cap_w is not applied"), cap
    assert "power limit cannot be set" not in d.log() and "will not try again while it runs" not in d.log()


def test_a_gpu_lost_under_a_tuned_job_is_said_once_and_its_reports_are_still_taken(nvml_daemon, tmp_path):
    """GPU 1 off the bus (every call: GPU_IS_LOST) while tuned jobs run on both GPUs. Each report of GPU 1's job
    read its energy counter, and the error failed the whole report: "progress from uid 0 failed" at every report
    (tens a second, for as long as the job ran), and the rest of the report (the load sampler, the job's group) was
    skipped. The job stays (its process runs), its energy is unknown, the other GPU's job goes on, said once."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": 80}, {"util_gpu_pct": 80}), system={"faults_path": str(faults)})
    c = d.client()
    jobs = [c.call("register", tune=True, gpu=gpu, **FEATURES)["job_id"] for gpu in (0, 1)]
    set_faults(faults, {"gpus": {"1": {"*": 15}}})  # NVML_ERROR_GPU_IS_LOST
    for steps in range(1, 21):
        for job_id in jobs:
            c.notify("progress", job_id=job_id, steps=steps, phase="train")
    status = c.call("status")
    assert [(j["gpu"], j["steps"]) for j in status["jobs"]] == [("0", 20), ("1", 20)], status["jobs"]
    assert status["jobs"][0]["energy_j"] is not None and status["jobs"][1]["energy_j"] is None, status["jobs"]
    log = d.log()
    assert "progress from uid 0 failed" not in log, log
    said = [line for line in log.splitlines() if "energy counter cannot be read" in line]
    assert len(said) == 1 and f"job {jobs[1]} " in said[0] and "GPU_IS_LOST" in said[0], said
    watch = Watch(Path(d.log_path).parent)  # the next tick's check of the pins: status then says which GPU is lost
    try:
        watch.wait(lambda: "GPU 1: cannot read limits to check the pin" in d.log(), timeout_s=30)
    finally:
        watch.close()
    status = c.call("status")
    assert [g["read_error"] is not None for g in status["gpus"]] == [False, True], status["gpus"]
    assert "GPU 1: cannot be read, so its pin is not checked" in format_status(status)
    set_faults(faults, {})  # back (the same handle answers again)
    c.notify("progress", job_id=jobs[1], steps=21, phase="train")
    c.call("status")
    assert f"job {jobs[1]} (pid {os.getpid()}): its energy counter reads again" in d.log()


def test_a_job_ended_by_its_gpu_falling_off_the_bus_keeps_the_energy_read_before(nvml_daemon, tmp_path):
    """Xid 79: the GPU falls off the bus, the training process dies of it, and the job's end finds the counter
    answering GPU_IS_LOST. Its energy was "unknown" for the whole run, in the log, the unregister reply and the
    measurement store, though the daemon had read the counter moments before: it is counted up to that read."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": 80, "meter_update_s": 0}, {"util_gpu_pct": 80, "meter_update_s": 0}),
                            system={"faults_path": str(faults)}, policy="ffg")
    worker = _worker()
    try:
        c = d.client()
        job_id = c.call("register", pid=worker.pid, gpu=1, **FEATURES)["job_id"]
        so_far_j = c.call("status")["jobs"][0]["energy_j"]  # a read of the counter
        assert so_far_j > 0
        set_faults(faults, {"gpus": {"1": {"*": 15}}})  # NVML_ERROR_GPU_IS_LOST
        worker.kill()
        d.wait_status(lambda m: "=0 job(s)" in m)
    finally:
        worker.kill()
        worker.wait()
    ended = next(line for line in d.log().splitlines() if f"job {job_id} (pid {worker.pid}) ended" in line)
    assert "energy unknown" not in ended and f"energy {so_far_j:.1f} J" in ended, ended
    assert "its energy is counted up to the last read" in d.log()


def test_doctors_pin_check_on_a_node_with_a_gpu_off_the_bus_checks_the_others(nvml_daemon, tmp_path):
    """A GPU off the bus (GPU_IS_LOST), pinned for a job (GPU 1) or idle (GPU 2): its read failed the whole pin
    check, so `ftgov doctor` on the node an operator looks at because a GPU is in trouble said only "pin check
    through ftgovd failed", and nothing of the GPUs that work. Each GPU is answered for; the lost ones say why."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": 80},) * 3, system={"faults_path": str(faults)}, policy="ffg")
    c = d.client()
    assert c.call("register", gpu=1, **FEATURES)["freq_hz"] is not None
    set_faults(faults, {"gpus": {"1": {"*": 15}, "2": {"*": 15}}})  # NVML_ERROR_GPU_IS_LOST
    answers = c.call("pin_check")["gpus"]
    assert [(a["gpu"], a["ok"], a["wrote"]) for a in answers] == [("0", True, True), ("1", False, False),
                                                                 ("2", False, False)], answers
    assert all(a["detail"].startswith("cannot be read: ") and "GPU_IS_LOST" in a["detail"] for a in answers[1:])
    status = c.call("status")["gpus"]
    assert [g["pinned_hz"] is not None for g in status] == [False, True, False], status  # nothing written on 1, 2


def test_an_energy_counter_that_jumps_by_more_than_any_gpu_draws_is_not_a_jobs_energy(nvml_daemon, tmp_path):
    """A counter that jumps by a megajoule between two reads a second apart (a glitch; 1 GW): taken as energy, it
    went whole into the job's energy (1000980 J for 3 s of an H200) and into the window open across it (a tuner's
    level read 65000 J/step against 14), so a saving or a search could rest on it. It is dropped, as a counter that
    goes back is, and said once."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(gpus=({"util_gpu_pct": 80, "meter_update_s": 0},), system={"faults_path": str(faults)},
                            policy="ffg")
    c = d.client()
    job_id = c.call("register", **FEATURES)["job_id"]
    c.call("status")  # a read of the counter
    set_faults(faults, {"gpus": {"0": {"energy_offset_mj": 1e9}}})
    assert c.call("status")["jobs"][0]["energy_j"] < 1000  # under a second of an H200 at its 700 W
    set_faults(faults, {"gpus": {"0": {"energy_offset_mj": 2e9}}})  # and again: said once
    end = c.call("unregister", job_id=job_id)
    assert 0 < end["energy_j"] < 1000, end
    said = [line for line in d.log().splitlines() if "GPU 0's energy counter jumped" in line and " DEBUG " not in line]
    assert len(said) == 1 and " WARNING " in said[0], said
