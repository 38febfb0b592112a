"""ftgovd and `ftgov restore` against an NVML call that does not return (a GPU off the bus, Xid 79; a wedged driver):
the fake pynvml's hang_s faults block a call for longer than the 1 s each call is given."""

import json
import os
import signal
import subprocess
import sys
import time

from governor.errors import SERVER_ERROR
from tests.daemon import test_daemon_nvml
from tests.daemon.test_daemon_nvml import _worker, set_faults
from tests.support import FAKENVML_DIR as FAKE_DIR
from tests.support.daemon import FEATURES, REPO

nvml_daemon = test_daemon_nvml.nvml_daemon  # the fixture: ftgovd on the fake NVML

FOR_GOOD_S = 60  # a hang that outlasts the test: the GPU does not come back


def _not_answering(log: str) -> list[str]:
    return [line for line in log.splitlines() if "is not answering" in line]


def test_a_gpu_that_stops_answering_fails_its_calls_while_the_other_gpu_is_served(nvml_daemon, tmp_path):
    """Every NVML call ran on the event loop with no time limit: one that never returned stalled every client of
    every GPU until systemd's watchdog killed ftgovd. The call is given up on after 1 s, the GPU's later calls fail at
    once with the same error, and the other GPU is pinned and released as before."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(system={"faults_path": str(faults)}, policy="ffg")
    c = d.client()
    uuid = c.call("status")["gpus"][1]["uuid"]
    set_faults(faults, {"gpus": {"1": {"hang_s": {"*": FOR_GOOD_S}}}})
    started = time.monotonic()
    err = c.request("register", gpu=1, **FEATURES)["error"]
    message = err["message"]
    assert err["code"] == SERVER_ERROR and f"GPU 1 ({uuid}): NVML did not answer nvmlDevice" in message, err
    assert "fallen off the bus" in message and "dmesg" in message and "nvidia-smi" in message, message
    job = c.call("register", gpu=0, **FEATURES)
    status = c.call("status")
    assert [j["job_id"] for j in status["jobs"]] == [job["job_id"]]
    assert status["gpus"][0]["pinned_hz"] == job["freq_hz"] is not None and status["gpus"][1]["pinned_hz"] is None
    c.call("unregister", job_id=job["job_id"])
    assert c.call("status")["gpus"][0]["pinned_hz"] is None
    assert c.request("register", gpu=1, **FEATURES)["error"]["message"] == message  # no second wait: said once
    assert time.monotonic() - started < FOR_GOOD_S / 4
    said = _not_answering(d.log())
    assert len(said) == 1 and " WARNING " in said[0] and f"GPU 1 ({uuid}) is not answering" in said[0], said


def test_a_pinned_gpu_that_stops_answering_is_restored_once_it_answers_again(nvml_daemon, tmp_path):
    """A job's end on a GPU that does not answer cannot restore it: the restore waits, retried on every tick without
    a line each, and takes once the stuck call has returned."""
    faults = tmp_path / "faults.json"
    d, calls = nvml_daemon(system={"faults_path": str(faults)}, policy="ffg")
    c = d.client()
    job = c.call("register", gpu=1, **FEATURES)
    d.wait_status(lambda m: "GPU 1 pinned to" in m)
    set_faults(faults, {"gpus": {"1": {"hang_s": {"*": 3}}}})
    c.call("unregister", job_id=job["job_id"])  # within 1 s: its energy read given up on, the restore failed at once
    set_faults(faults, {})  # the stuck call returns 3 s after it began; the GPU answers from then on
    d.wait_status(lambda m: "0 job(s); GPU 0 at baseline, GPU 1 pinned to" in m)
    d.wait_status(lambda m: "0 job(s); GPU 0 at baseline, GPU 1 at baseline" in m, timeout_s=15)
    assert "nvmlDeviceResetGpuLockedClocks" in calls.read_text().split()
    log = d.log()
    assert len(_not_answering(log)) == 1 and log.count("answers again") == 1, log
    assert "GPU 1 restored to its baseline" in log
    assert "its energy is counted up to the last read" in log and "energy unknown" not in log, log
    complaints = [line.split(" ", 3)[-1] for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
    assert len(complaints) == len(set(complaints)), complaints  # each said once, not on every tick's retry


def test_in_observe_mode_a_gpu_that_stops_answering_leaves_the_daemon_serving(nvml_daemon, tmp_path):
    """Observe mode's read-only NVML handle goes through the same worker: a job on the GPU that does not answer is
    registered (observe pins nothing) without its energy, and the daemon answers throughout."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(system={"faults_path": str(faults)}, policy="observe")
    c = d.client()
    set_faults(faults, {"gpus": {"1": {"hang_s": {"*": FOR_GOOD_S}}}})
    started = time.monotonic()
    job = c.call("register", gpu=1, **FEATURES)
    assert job["freq_hz"] is None
    other = c.call("register", gpu=0, **FEATURES)
    assert len(c.call("status")["jobs"]) == 2
    assert c.call("unregister", job_id=other["job_id"])["energy_j"] is not None
    c.call("unregister", job_id=job["job_id"])
    assert time.monotonic() - started < FOR_GOOD_S / 4
    log = d.log()
    assert len(_not_answering(log)) == 1
    assert "GPU 1's energy counter cannot be read, so this job's energy goes unmeasured" in log, log
    assert "energy unknown (its GPU's energy counter could not be read when it started)" in log, log


def _ftgov(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "governor.cli", *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


def test_ftgov_restore_gives_up_on_a_gpu_that_does_not_answer_and_says_which(nvml_daemon, tmp_path):
    """The unit's ExecStopPost (`ftgov restore --on-stop`) after a kill: a GPU that does not answer hung it until
    TimeoutStopSec. It gives up on that GPU within its deadline, says so, and the state file keeps the baseline for
    the next start; as for a GPU that is not there, that is no failure of the stop (exit 0)."""
    d, faults, env = _killed_with_a_pin(nvml_daemon, tmp_path)
    set_faults(faults, {"gpus": {"1": {"hang_s": {"*": FOR_GOOD_S}}}})
    started = time.monotonic()
    out = _ftgov("restore", "--on-stop", "--config", str(d.config_path), "--state-dir", str(d.state_dir), env=env)
    assert time.monotonic() - started < FOR_GOOD_S / 4
    assert out.returncode == 0, out
    assert "GPU 1: NVML did not answer nvmlDeviceGet" in out.stderr and "fallen off the bus" in out.stderr, out.stderr
    last = out.stderr.splitlines()[-1]
    kept = list(json.loads((d.state_dir / "state.json").read_text())["gpus"])
    assert len(kept) == 1 and kept[0].startswith("GPU-"), f"the baseline stays for the next start, by UUID: {kept}"
    # named by its UUID, not by the placeholder id renumbered gave it ("1 (GPU-..., not here now)")
    assert last.startswith(f"ftgov restore: GPU {kept[0]} is not here or does not answer now"), out.stderr
    assert "stays in the state file" in last, out.stderr


def _killed_with_a_pin(nvml_daemon, tmp_path, gpus=({}, {}), gpu=1):
    """A daemon killed (SIGKILL) with GPU ``gpu`` pinned for a live job: the state file holds its baseline. Returns the
    daemon, its faults file and the environment `ftgov restore` runs in."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(gpus=gpus, system={"faults_path": str(faults)}, policy="ffg")
    worker = _worker()
    try:
        c = d.client()  # held open until the kill: a client dropped at once ends the job
        c.call("register", pid=worker.pid, gpu=gpu, **FEATURES)
        d.stop(signal.SIGKILL)
    finally:
        worker.kill()
    env = {"FAKENVML_CONFIG": str(tmp_path / "fakenvml.json"),
           "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO)])}
    return d, faults, env


def test_ftgov_restore_on_a_node_whose_only_gpu_does_not_answer_keeps_its_baseline_and_does_not_fail_the_stop(
        nvml_daemon, tmp_path):
    """A GPU that does not answer is no failure of the stop where another GPU answers; on a node of one GPU (or where
    none answers) the probe found no GPU at all and `ftgov restore --on-stop` failed (exit 1), failing every stop of
    the unit while the GPU is away. The baseline stays in the state file either way."""
    d, faults, env = _killed_with_a_pin(nvml_daemon, tmp_path, gpus=({},), gpu=0)
    set_faults(faults, {"gpus": {"0": {"hang_s": {"*": FOR_GOOD_S}}}})
    out = _ftgov("restore", "--on-stop", "--config", str(d.config_path), "--state-dir", str(d.state_dir), env=env)
    assert out.returncode == 0, out
    assert "none of the 1 GPUs could be opened" in out.stderr, out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith("ftgov restore: GPU GPU-") and "is not here or does not answer now" in last, out.stderr
    assert "stays in the state file" in last, out.stderr
    (saved,) = json.loads((d.state_dir / "state.json").read_text())["gpus"].values()
    assert saved["describe"]["index"] == 0 and saved["pinned_hz"] is not None


def test_ftgov_restore_under_an_nvml_init_that_does_not_return_keeps_the_baselines_and_does_not_fail_the_stop(
        nvml_daemon, tmp_path):
    """A hung nvmlInit (a wedged driver) failed the stop (exit 1) where a GPU that does not answer does not: nothing
    can be written to any GPU then either. Said, the baselines kept, exit 0."""
    d, faults, env = _killed_with_a_pin(nvml_daemon, tmp_path, gpus=({},), gpu=0)
    config = tmp_path / "restore.yaml"
    config.write_text(d.config_path.read_text() + "\nnvml_init_timeout_s: 0.5\n")
    set_faults(faults, {"system": {"hang_s": {"nvmlInitWithFlags": FOR_GOOD_S}}})
    out = _ftgov("restore", "--on-stop", "--config", str(config), "--state-dir", str(d.state_dir), env=env)
    assert out.returncode == 0, out
    assert "NVML did not answer nvmlInit within 0.5 s" in out.stderr and "the driver hung" in out.stderr, out.stderr
    assert "stays in the state file" in out.stderr.splitlines()[-1], out.stderr
    (saved,) = json.loads((d.state_dir / "state.json").read_text())["gpus"].values()
    assert saved["pinned_hz"] is not None


def test_ftgov_restore_keeps_the_baseline_of_a_gpu_that_stops_answering_at_its_restore_and_does_not_fail(
        nvml_daemon, tmp_path):
    """A GPU that answered the probe but not the restore's reset failed the stop (exit 1), where one that did not
    answer the probe does not: nothing can be written to it now either. Its baseline stays in the state file, the
    other GPU's is restored and dropped."""
    d, faults, env = _killed_with_a_pin(nvml_daemon, tmp_path)
    uuid = json.loads((d.state_dir / "state.json").read_text())["gpus"]["1"]["describe"]["uuid"]
    set_faults(faults, {"gpus": {"1": {"hang_s": {"nvmlDeviceResetGpuLockedClocks": FOR_GOOD_S}}}})
    started = time.monotonic()
    out = _ftgov("restore", "--on-stop", "--config", str(d.config_path), "--state-dir", str(d.state_dir), env=env)
    assert time.monotonic() - started < FOR_GOOD_S / 4
    assert out.returncode == 0, out
    assert "NVML did not answer nvmlDeviceResetGpuLockedClocks" in out.stderr, out.stderr
    assert "GPU 1 is not here or does not answer now" in out.stderr, out.stderr
    assert list(json.loads((d.state_dir / "state.json").read_text())["gpus"]) == [uuid]


def test_an_nvml_init_that_does_not_return_fails_the_start_naming_it(start_daemon, tmp_path):
    """Before READY=1 a hung nvmlInit held the start until systemd's TimeoutStartSec (180 s) killed it, without a
    word. Start fails after nvml_init_timeout_s, saying what did not answer and what to check."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"system": {"hang_s": {"nvmlInitWithFlags": FOR_GOOD_S}}}))
    spec = tmp_path / "fakenvml.json"
    spec.write_text(json.dumps({"gpus": [{}], "faults_path": str(faults)}))
    env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO)])}
    d = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml", "nvml_init_timeout_s": 0.5}, env=env,
                     launch=False)
    d.start(wait=False)
    assert d.proc.wait(FOR_GOOD_S / 4) == 1
    errors = [line for line in d.log_path.read_text().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "NVML did not answer nvmlInit within 0.5 s" in errors[0], errors
    assert "nvidia-persistenced" in errors[0] and "nvml_init_timeout_s" in errors[0], errors


def test_a_stop_with_a_pin_on_a_gpu_that_does_not_answer_ends_and_leaves_the_baseline_for_the_next_start(
        nvml_daemon, tmp_path):
    """systemctl stop: the daemon's own restore of a GPU that does not answer gives up on it and the daemon exits
    (before, it hung until TimeoutStopSec); the state file keeps the baseline for ExecStopPost and the next start."""
    faults = tmp_path / "faults.json"
    d, _calls = nvml_daemon(system={"faults_path": str(faults)}, policy="ffg")
    worker = _worker()
    try:
        c = d.client()
        c.call("register", pid=worker.pid, gpu=1, **FEATURES)
        set_faults(faults, {"gpus": {"1": {"hang_s": {"*": FOR_GOOD_S}}}})
        assert d.stop(timeout_s=FOR_GOOD_S / 4) == 0
    finally:
        worker.kill()
    assert "1" in json.loads((d.state_dir / "state.json").read_text())["gpus"]
    errors = [line for line in d.log().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "GPU 1: could not apply the pin" in errors[0] and "not answer" in errors[0], errors
