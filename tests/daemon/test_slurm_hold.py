"""Scheduler holds (governor/daemon/scheduler.py) on the real daemon over its socket: a Slurm job's GPUs held from
the prolog to the epilog, a registration from inside joining the hold, the release restoring the baseline, root
only, and a hold kept across daemon restarts."""

import json
import os
import signal
import subprocess
import sys

import pytest

from governor.store import measurements as store
from tests.support import FAKENVML_DIR, hostusers
from tests.support.daemon import DEVFREQ, FEATURES, REPO, limits

BASELINE = (306000000, 1300500000)
FFG_HZ = 1300500000  # the hold's level: above what MLG picks for FEATURES (714 MHz), so a join is told apart


@pytest.fixture
def nvml_daemon(start_daemon, tmp_path):
    def start(gpus=({}, {}), daemon_args=None, **config):
        spec = tmp_path / "fakenvml.json"
        spec.write_text(json.dumps({"gpus": list(gpus)}))
        calls = tmp_path / "calls.log"
        env = {"FAKENVML_CONFIG": str(spec), "FAKENVML_LOG": str(calls),
               "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
        d = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml", "policy": "mlg", **config}, env=env,
                         **(daemon_args or {}))
        return d, calls
    return start


def _set_max(root, hz: int) -> None:
    (root / DEVFREQ / "max_freq").write_text(f"{hz}\n")


def test_a_hold_pins_each_gpu_of_the_job_and_the_release_restores_and_records(nvml_daemon, tmp_path):
    path = tmp_path / "measurements.sqlite"
    d, calls = nvml_daemon(store={"path": str(path)})
    c = d.client()
    held = c.call("slurm_hold", slurm_job_id=41, uid=1000, policy="ffg", gpus=[0, 1], partition="gpu")
    levels = c.call("status")["gpus"][0]["available_hz"]
    assert set(held["gpus"]) == {"0", "1"} and all(g["freq_hz"] in levels for g in held["gpus"].values())
    status = c.call("status")
    assert [g["pinned_hz"] for g in status["gpus"]] == [held["gpus"]["0"]["freq_hz"], held["gpus"]["1"]["freq_hz"]]
    assert status["jobs"] == [] and status["holds"][0]["slurm_job_id"] == 41
    assert calls.read_text().split().count("nvmlDeviceSetGpuLockedClocks") == 2
    out = c.call("slurm_release", slurm_job_id=41)
    assert out["restored"] and out["energy_j"] is not None and out["energy_j"] >= 0
    assert set(out["gpus"]) == {"0", "1"} and all(g["pinned_hz_after"] is None for g in out["gpus"].values())
    assert calls.read_text().split().count("nvmlDeviceResetGpuLockedClocks") == 2
    assert [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None]
    assert c.call("status")["holds"] == []
    d.stop()  # the store's writer commits what is queued at shutdown
    rows = [(r.sched_job_id, r.uid, r.partition, r.policy, r.energy_j, r.ended)
            for r in store.read_scheduler_jobs(store.open_read_only(path))]
    assert rows == [(41, 1000, "gpu", "ffg", pytest.approx(out["energy_j"]), "epilog")]


def test_the_release_restores_the_baseline_found_not_the_highest_clocks(orin, start_daemon):
    _set_max(orin, 1020000000)  # an operator's lower cap, in place before the job
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    c = d.client()
    held = c.call("slurm_hold", slurm_job_id=7, uid=0, policy="ffg", gpus=None)  # a Jetson: the one GPU
    assert held["gpus"]["0"]["freq_hz"] == 612000000 and limits(orin) == (612000000, 612000000)
    c.call("slurm_release", slurm_job_id=7)
    assert limits(orin) == (306000000, 1020000000)


def test_off_pins_nothing_and_measures_energy(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    held = c.call("slurm_hold", slurm_job_id=8, uid=0, policy="off")
    assert held["gpus"]["0"]["freq_hz"] is None and limits(orin) == BASELINE
    out = c.call("slurm_release", slurm_job_id=8)
    assert out["energy_j"] is not None and out["policy"] == "off"


def test_a_registration_from_inside_joins_the_hold_and_its_end_does_not_release_it(orin, start_daemon):
    d = start_daemon(config={"ffg_freq_hz": FFG_HZ})
    root = d.client()
    root.call("slurm_hold", slurm_job_id=9, uid=0, policy="mlg", gpus=None)
    assert limits(orin) == (FFG_HZ, FFG_HZ)  # mlg has no features yet: FFG's level
    inside = d.client()
    reg = inside.call("register", slurm_job_id=9, **FEATURES)
    # Joined: its own pick speaks for the GPU (a second job beside the hold would have left FFG's higher level).
    assert reg["slurm"] == {"slurm_job_id": 9, "joined": True} and reg["freq_hz"] == 714000000
    assert limits(orin) == (714000000, 714000000)
    hold = root.call("status")["holds"][0]
    assert hold["joined"] == [reg["job_id"]] and hold["gpus"]["0"]["joined"] is True
    inside.call("unregister", job_id=reg["job_id"])
    assert limits(orin) == (FFG_HZ, FFG_HZ)  # the hold is still there
    assert root.call("status")["holds"][0]["slurm_job_id"] == 9
    root.call("slurm_release", slurm_job_id=9)
    assert limits(orin) == BASELINE


def test_the_release_ends_a_joined_job_still_running(orin, start_daemon):
    d = start_daemon(config={"ffg_freq_hz": FFG_HZ})
    root = d.client()
    root.call("slurm_hold", slurm_job_id=10, uid=0, policy="ffg")
    inside = d.client()  # held open: its job lives until the release
    reg = inside.call("register", slurm_job_id=10, **FEATURES)
    assert reg["policy"] == "ffg" and reg["slurm"]["joined"]  # the hold's policy, for a job that asked for none
    out = root.call("slurm_release", slurm_job_id=10)
    assert out["joined"] == [reg["job_id"]]
    assert root.call("status")["jobs"] == [] and limits(orin) == BASELINE
    assert f"job {reg['job_id']} (pid {os.getpid()}) ended (its Slurm job 10 ended (epilog))" in d.log()


def test_a_registration_naming_no_hold_is_a_job_of_its_own(orin, start_daemon):
    d = start_daemon(config={"ffg_freq_hz": FFG_HZ})
    c = d.client()
    reg = c.call("register", slurm_job_id=99, **FEATURES)
    assert reg["slurm"] == {"slurm_job_id": 99, "joined": False,
                            "why": "no hold of yours for Slurm job 99 on this node"}
    assert limits(orin) == (714000000, 714000000)


def test_a_daemon_restart_keeps_the_hold(orin, start_daemon):
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    d.client().call("slurm_hold", slurm_job_id=11, uid=0, policy="ffg")
    d.stop(signal.SIGKILL)
    assert limits(orin) == (612000000, 612000000)
    d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock", config={"ffg_freq_hz": 612000000})
    c = d2.client()
    assert c.call("status")["holds"][0]["slurm_job_id"] == 11 and limits(orin) == (612000000, 612000000)
    d2.stop()  # restore_on_stop: the GPU goes back to its baseline while no daemon runs, the hold stays on file
    assert limits(orin) == BASELINE
    d3 = start_daemon(workdir=d.workdir, notify_name="n3.sock", config={"ffg_freq_hz": 612000000})
    c = d3.client()
    assert limits(orin) == (612000000, 612000000)
    out = c.call("slurm_release", slurm_job_id=11)
    assert out["energy_j"] is not None and limits(orin) == BASELINE


def test_releasing_an_unknown_job_is_an_error(start_daemon):
    err = start_daemon().client().request("slurm_release", slurm_job_id=5)["error"]
    assert err["code"] == -32003 and "no hold for Slurm job 5" in err["message"]


def test_a_policy_that_is_not_one_of_the_four_is_refused(start_daemon):
    err = start_daemon().client().request("slurm_hold", slurm_job_id=5, uid=0, policy="fast")["error"]
    assert err["code"] == -32602 and err["data"]["field"] == "policy"


_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
replies = s.makefile()
for line in sys.argv[2:]:
    s.sendall(line.encode() + b"\\n")
    print(replies.readline().strip(), flush=True)
"""


def _as_member(sock: str, *requests: dict) -> list[dict]:
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    lines = [json.dumps({"jsonrpc": "2.0", "id": i, **r}) for i, r in enumerate(requests, 1)]
    out = subprocess.run(["runuser", "-u", "ftgovtest", "--", python, "-c", _CLIENT, sock, *lines],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_member_may_neither_hold_nor_release_nor_join_anothers_hold(orin, start_daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    # Before the daemon starts: its socket gets the ftgov group only if the group exists then.
    hostusers.ensure_user("ftgovtest", groups=("ftgov",))  # removed at the session's end if it made it
    d = start_daemon(config={"ffg_freq_hz": FFG_HZ})
    os.chmod(d.workdir, 0o755)
    d.client().call("slurm_hold", slurm_job_id=12, uid=0, policy="ffg")
    hold, release, register, elsewhere = _as_member(
        d.socket,
        {"method": "slurm_hold", "params": {"slurm_job_id": 13, "uid": 0, "policy": "off"}},
        {"method": "slurm_release", "params": {"slurm_job_id": 12}},
        {"method": "register", "params": {"slurm_job_id": 12, **FEATURES}},
        {"method": "register", "params": {"slurm_job_id": 99, **FEATURES}})
    assert hold["error"]["code"] == -32001 and "only root" in hold["error"]["message"]
    assert release["error"]["code"] == -32001
    # Not whose the batch job is, nor that it runs here: what status hides of another's hold (redact.py), a
    # registration naming its id told ("Slurm job 12 is uid 0's, not uid 1001's"). The log has it.
    why = register["result"]["slurm"]["why"]
    assert register["result"]["slurm"]["joined"] is False and "uid" not in why, why
    assert why == elsewhere["result"]["slurm"]["why"].replace("99", "12"), (why, elsewhere)
    assert "Slurm job 12 is uid 0's" in d.log()
    assert limits(orin) == (FFG_HZ, FFG_HZ)  # root's hold stands (the member's own job adds 714 MHz beneath it)
    assert [h["slurm_job_id"] for h in d.client().call("status")["holds"]] == [12]


def test_the_client_library_joins_the_hold_of_the_job_it_runs_in(orin, start_daemon, monkeypatch):
    import governor

    d = start_daemon(config={"ffg_freq_hz": FFG_HZ})
    root = d.client()
    root.call("slurm_hold", slurm_job_id=14, uid=0, policy="mlg")
    monkeypatch.setenv("SLURM_JOB_ID", "14")  # what slurmstepd gives every task of the job
    with governor.job(socket=d.socket, **FEATURES) as j:
        assert j.registration["slurm"] == {"slurm_job_id": 14, "joined": True}
        assert limits(orin) == (714000000, 714000000)
    assert limits(orin) == (FFG_HZ, FFG_HZ)
    root.call("slurm_release", slurm_job_id=14)
    assert limits(orin) == BASELINE


def test_a_joined_tuned_job_gives_the_hold_its_measured_saving(start_daemon):
    from governor.sim import job as simjob
    from governor.sim.energy import Workload
    from governor.sysfs import Root
    from tests.support.daemon import ProgressJob, scaled

    time_scale = 0.15
    d = start_daemon(simulate=True, config=scaled(time_scale))
    root = d.client()
    root.call("slurm_hold", slurm_job_id=15, uid=0, policy="tune", partition="train")
    inside = d.client()
    bert = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
    res = inside.call("register", tune=True, gpu_util=80.0, slurm_job_id=15, **bert)
    assert res["slurm"]["joined"] and res["policy"] == "tune"
    simjob.run(Root(d.state_dir / "sim-orin"), ProgressJob(inside, res["job_id"]), Workload(name="w", **bert), 120,
               time_scale=time_scale)
    summary = inside.call("unregister", job_id=res["job_id"])
    assert summary["saved_pct"] is not None
    out = root.call("slurm_release", slurm_job_id=15)
    assert out["saved_pct"] == round(summary["saved_pct"], 2) and out["joined"] == [res["job_id"]]
    # The hold measured from the prolog, the job from its register; the rails are integrated over the same samples, but
    # the job's meter also gets one at each of its reports: the two agree to within the sampling, not exactly.
    assert out["energy_j"] == pytest.approx(summary["energy_j"], rel=0.1) and out["energy_j"] > 0
    d.stop()
    rec, = store.read_scheduler_jobs(store.open_read_only(d.state_dir / "measurements.sqlite"))
    assert (rec.sched_job_id, rec.policy, rec.partition, rec.saved_pct) == (15, "tune", "train", out["saved_pct"])
    assert json.loads(rec.daemon_job_ids) == [res["job_id"]]


def test_a_slurm_number_that_names_two_gpus_holds_neither_unless_the_numbering_is_set(nvml_daemon):
    """Slurm's number is its GRES index: the GPU's place among the device files where gres.conf lists them, in NVML's
    order where AutoDetect=nvml orders them so (PrincetonUniversity/jobstats#34: /dev/nvidia0 was nvidia-smi's GPU 6).
    Read only as device files, a hold pinned NVML's GPU 1 for a Slurm that meant NVML's GPU 0, another job's. Where
    the two orders name different GPUs, nothing is held unless the prolog says which numbering applies."""
    d, calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 0}, {}))
    c = d.client()
    err = c.request("slurm_hold", slurm_job_id=16, uid=1000, policy="ffg", gpus=[0])["error"]
    assert "ambiguous" in err["message"] and "gpu_numbering" in err["message"], err
    assert ("in NVML's order it is NVML's GPU 0 (/dev/nvidia1), in the device files' NVML's GPU 1 (/dev/nvidia0)"
            in err["message"]), err
    assert [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None, None] and c.call("status")["holds"] == []
    held = c.call("slurm_hold", slurm_job_id=17, uid=1000, policy="ffg", gpus=[2])  # either order: NVML's GPU 2
    assert set(held["gpus"]) == {"2"}
    held = c.call("slurm_hold", slurm_job_id=18, uid=1000, policy="ffg", gpus=[0], gpu_numbering="device_file")
    assert set(held["gpus"]) == {"1"}  # /dev/nvidia0 is NVML's GPU 1
    c.call("slurm_release", slurm_job_id=18)
    held = c.call("slurm_hold", slurm_job_id=19, uid=1000, policy="ffg", gpus=[0], gpu_numbering="index")
    assert set(held["gpus"]) == {"0"}
    assert [g["pinned_hz"] is not None for g in c.call("status")["gpus"]] == [True, False, True]
    for numbering in ("auto", "device_file"):
        err = c.request("slurm_hold", slurm_job_id=20, uid=1000, policy="ffg", gpus=[3], gpu_numbering=numbering)
        assert "Slurm's GPU 3 is not here" in err["error"]["message"], err  # nothing held, and the prolog says why
    err = c.request("slurm_hold", slurm_job_id=20, uid=1000, policy="ffg", gpus=[0], gpu_numbering="pci")["error"]
    assert err["data"]["field"] == "gpu_numbering", err
    for job in (17, 19):
        c.call("slurm_release", slurm_job_id=job)
    assert [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None, None]


def test_where_slurmd_offers_another_count_of_gpus_than_the_node_has_numbers_hold_nothing(nvml_daemon):
    """gres.conf listing some of a node's GPUs (File=/dev/nvidia[4-7] of eight), or MIG instances: Slurm's 0 is the
    first GPU it offers, which neither NVML's order nor the device files' give. The prolog sends slurmd's count."""
    d, _calls = nvml_daemon()
    c = d.client()
    err = c.request("slurm_hold", slurm_job_id=22, uid=1000, policy="ffg", gpus=[0], node_gpus=1)["error"]
    assert "slurmd offers 1 GPU(s) on this node and ftgovd governs 2" in err["message"], err
    assert c.call("status")["holds"] == [] and [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None]
    uuid1 = c.call("status")["gpus"][1]["uuid"]
    held = c.call("slurm_hold", slurm_job_id=22, uid=1000, policy="ffg", gpus=[uuid1], node_gpus=1)  # exact
    assert set(held["gpus"]) == {"1"}
    held = c.call("slurm_hold", slurm_job_id=23, uid=1000, policy="ffg", gpus=[0], node_gpus=2)
    assert set(held["gpus"]) == {"0"}
    for job in (22, 23):
        c.call("slurm_release", slurm_job_id=job)


def test_slurm_counts_device_files_in_order_not_by_their_numbers(nvml_daemon):
    """A node whose GPUs are /dev/nvidia1 and /dev/nvidia2 (one fell off the bus, or a driver that began at 1): Slurm
    22.05 gives the first one's prolog 0 (tests/slurm), its place among gres.conf's files. NVML's order is the same
    here, so the number is not ambiguous."""
    d, _calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 2}))
    c = d.client()
    for job, numbering in enumerate(("auto", "device_file", "index"), start=30):
        held = c.call("slurm_hold", slurm_job_id=job, uid=1000, policy="ffg", gpus=[0], gpu_numbering=numbering)
        assert set(held["gpus"]) == {"0"}, numbering
        c.call("slurm_release", slurm_job_id=job)


def test_a_registration_inside_a_one_gpu_job_is_on_that_gpu_whatever_number_it_names(nvml_daemon):
    """Inside a Slurm job CUDA_VISIBLE_DEVICES holds Slurm's number (or, under ConstrainDevices, the cgroup's 0), not
    NVML's index: a client that knows no UUID (no CUDA in the process: `ftgov run`) names a number. In a job given
    one GPU it can only mean that one: the registration joins the hold there, not NVML's GPU of that number."""
    d, _calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 0}))
    c = d.client()
    c.call("slurm_hold", slurm_job_id=21, uid=0, policy="ffg", gpus=[0], gpu_numbering="device_file")  # NVML's 1
    res = c.call("register", slurm_job_id=21, gpu="0", **FEATURES)
    assert res["slurm"]["joined"] and c.call("status")["jobs"][0]["gpu"] == "1", res
    c.call("unregister", job_id=res["job_id"])
    uuid0 = c.call("status")["gpus"][0]["uuid"]
    res = c.call("register", slurm_job_id=21, gpu=uuid0, **FEATURES)  # a UUID is exact: NVML's 0, not the job's
    assert not res["slurm"]["joined"] and c.call("status")["jobs"][0]["gpu"] == "0", res
    c.call("unregister", job_id=res["job_id"])
    c.call("slurm_release", slurm_job_id=21)


def test_a_number_inside_a_several_gpu_job_never_lands_on_a_gpu_outside_the_job(nvml_daemon):
    """Inside a Slurm job given several GPUs, a number in CUDA_VISIBLE_DEVICES is Slurm's index or, under
    ConstrainDevices, the cgroup's 0..k-1: not NVML's index. A job held on NVML's GPUs 1 and 2 whose `ftgov run`
    names "0" (its cgroup's first GPU) was registered on NVML's GPU 0, another job's, and pinned it. It is refused
    now; a number that is one of the job's own GPUs still joins the hold there."""
    d, _calls = nvml_daemon(gpus=({}, {}, {}))
    c = d.client()
    c.call("slurm_hold", slurm_job_id=22, uid=0, policy="ffg", gpus=[1, 2], gpu_numbering="index")
    err = c.request("register", slurm_job_id=22, gpu="0", **FEATURES)["error"]
    assert "Slurm job 22" in err["message"] and "UUID" in err["message"], err
    status = c.call("status")
    assert status["jobs"] == [] and status["gpus"][0]["pinned_hz"] is None, status
    res = c.call("register", slurm_job_id=22, gpu="2", **FEATURES)
    assert res["slurm"]["joined"] and c.call("status")["jobs"][0]["gpu"] == "2", res
    c.call("unregister", job_id=res["job_id"])
    res = c.call("register", slurm_job_id=22, gpu=c.call("status")["gpus"][0]["uuid"], **FEATURES)
    assert not res["slurm"]["joined"], res  # a UUID is exact: the process says it runs on NVML's GPU 0
    c.call("unregister", job_id=res["job_id"])
    c.call("slurm_release", slurm_job_id=22)


def test_where_nvml_reports_no_device_file_slurms_number_is_taken_as_the_index(nvml_daemon):
    d, _calls = nvml_daemon(gpus=({"minor_number": -1}, {"minor_number": -1}))  # GetMinorNumber: NOT_SUPPORTED
    held = d.client().call("slurm_hold", slurm_job_id=18, uid=1000, policy="ffg", gpus=[1])
    assert set(held["gpus"]) == {"1"}


def test_a_hold_joined_by_many_short_jobs_is_kept_across_a_restart(orin, start_daemon):
    """A hold keeps the ids of the registrations that joined it, and the state file keeps them; its reader takes at
    most 1024 a hold. The job's user, registering and ending short jobs inside its batch job (at the default 2 a
    second, under nine minutes), grew the list past that: at the next restart the state file was refused whole and
    set aside, the hold and the baseline with it, and the GPU stayed at the hold's pin."""
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    c = d.client()
    c.call("slurm_hold", slurm_job_id=19, uid=0, policy="ffg")
    for _ in range(1030):
        job_id = c.call("register", slurm_job_id=19, **FEATURES)["job_id"]
        c.call("unregister", job_id=job_id)
    live = c.call("register", slurm_job_id=19, **FEATURES)["job_id"]
    assert live in c.call("status")["holds"][0]["joined"]
    d.stop()  # the hold stays on file (and the GPU at its baseline while no daemon runs)
    d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock", config={"ffg_freq_hz": 612000000})
    assert "invalid" not in d2.log()
    c = d2.client()
    assert [h["slurm_job_id"] for h in c.call("status")["holds"]] == [19]
    assert limits(orin) == (612000000, 612000000)
    out = c.call("slurm_release", slurm_job_id=19)
    assert len(out["joined"]) <= 1024 and live in out["joined"]
    assert limits(orin) == BASELINE


def test_a_node_whose_nvml_order_is_not_its_device_files_is_told_so(nvml_daemon):
    """The orders a Slurm prolog's numbers depend on: ftgovd's start log and `ftgov doctor` say where they differ."""
    from governor.cli.doctor_checks import OK, WARN, Context, check_numbering

    d, _calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 0}))
    assert "NVML's order of the GPUs is not their device files' (0 is /dev/nvidia1, 1 is /dev/nvidia0)" in d.log()
    status = d.client().call("status")
    assert [g["device_file"] for g in status["gpus"]] == ["/dev/nvidia1", "/dev/nvidia0"]

    def doctor(status):
        return check_numbering(Context(root=None, config=None, config_path="", socket="", uid=0, session_gids=set(),
                                       status=status))

    (check,) = doctor(status)
    assert check.status == WARN and "gpu_numbering" in check.fix, check
    for gpu, minor in zip(status["gpus"], (0, 1), strict=True):
        gpu["device_file"] = f"/dev/nvidia{minor}"
    assert [c.status for c in doctor(status)] == [OK]
    assert doctor({"gpus": status["gpus"][:1]}) == [] and doctor(None) == []  # one GPU, or no daemon: nothing to say


@pytest.mark.parametrize("gpu", [" 0", "0 ", "\t0"])
def test_a_number_with_blanks_around_it_is_read_inside_a_slurm_job_as_a_number(nvml_daemon, gpu):
    """find_gpu strips a key before it reads a number, so " 0" is NVML's GPU 0 there; the check that a number named
    inside a Slurm job is one of the job's GPUs read only bare digits, so " 0" passed it and landed on NVML's GPU 0,
    another job's, and pinned it."""
    d, _calls = nvml_daemon(gpus=({}, {}, {}))
    c = d.client()
    c.call("slurm_hold", slurm_job_id=23, uid=0, policy="ffg", gpus=[1, 2], gpu_numbering="index")
    err = c.request("register", slurm_job_id=23, gpu=gpu, **FEATURES).get("error")
    assert err is not None and "Slurm job 23" in err["message"], err
    status = c.call("status")
    assert status["jobs"] == [] and status["gpus"][0]["pinned_hz"] is None, status
    c.call("slurm_hold", slurm_job_id=24, uid=0, policy="ffg", gpus=[1], gpu_numbering="index")
    res = c.call("register", slurm_job_id=24, gpu=gpu, **FEATURES)
    assert res["slurm"]["joined"] and c.call("status")["jobs"][0]["gpu"] == "1", res
    c.call("unregister", job_id=res["job_id"])
    for job in (23, 24):
        c.call("slurm_release", slurm_job_id=job)


def test_a_slurm_number_sent_as_text_is_read_as_slurms_number_not_nvmls_index(nvml_daemon):
    """slurm_hold's gpus are Slurm's numbers or UUIDs; a number sent as a JSON string ("0", as a site's own prolog
    may send what it read from the environment) went to find_gpu as NVML's index, past gpu_numbering and the
    node_gpus check: on this node Slurm's 0 is ambiguous, and NVML's GPU 0 was held."""
    d, _calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 0}, {}))
    c = d.client()
    err = c.request("slurm_hold", slurm_job_id=25, uid=1000, policy="ffg", gpus=["0"])["error"]
    assert "ambiguous" in err["message"], err
    err = c.request("slurm_hold", slurm_job_id=25, uid=1000, policy="ffg", gpus=[" 2"], node_gpus=2)["error"]
    assert "slurmd offers 2 GPU(s)" in err["message"], err
    assert c.call("status")["holds"] == [] and [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None] * 3
    held = c.call("slurm_hold", slurm_job_id=25, uid=1000, policy="ffg", gpus=["0"], gpu_numbering="device_file")
    assert set(held["gpus"]) == {"1"}
    c.call("slurm_release", slurm_job_id=25)


def test_a_number_inside_a_slurm_job_with_no_hold_here_tells_no_gpu(nvml_daemon):
    """Inside a Slurm job a GPU number is Slurm's or its cgroup's (ConstrainDevices makes any GPU 0): with no hold
    of the job to say which GPU Slurm gave it (no prolog, or one that held nothing), NVML's GPU of that number may
    be another job's. Refused, with the way out; a UUID, or a number outside Slurm, as before."""
    d, _calls = nvml_daemon()
    c = d.client()
    err = c.request("register", slurm_job_id=77, gpu="0", **FEATURES)["error"]
    assert "no hold of the job here says which GPU Slurm gave it" in err["message"], err
    assert c.call("status")["jobs"] == [] and [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None]
    uuid1 = c.call("status")["gpus"][1]["uuid"]
    res = c.call("register", slurm_job_id=77, gpu=uuid1, **FEATURES)
    assert not res["slurm"]["joined"] and c.call("status")["jobs"][0]["gpu"] == "1", res
    c.call("unregister", job_id=res["job_id"])
    res = c.call("register", gpu="0", **FEATURES)
    assert c.call("status")["jobs"][0]["gpu"] == "0", res
    c.call("unregister", job_id=res["job_id"])


def test_a_prolog_for_a_held_job_on_other_gpus_moves_the_hold_to_them(nvml_daemon):
    """A job requeued (preempted, a node failure) whose epilog here was lost (ftgovd unreachable then: the epilog
    warns and exits 0) may run again on this node on other GPUs, under the same job id, which the next prolog's
    sweep keeps (squeue lists the job). The new prolog answered the old hold: its GPU, now perhaps another job's,
    stayed pinned at the hold's level, and the job's new GPU was not held."""
    d, _calls = nvml_daemon()
    c = d.client()
    c.call("slurm_hold", slurm_job_id=60, uid=1000, policy="ffg", gpus=[0])
    again = c.call("slurm_hold", slurm_job_id=60, uid=1000, policy="ffg", gpus=[1])
    assert set(again["gpus"]) == {"1"}, again
    status = c.call("status")
    assert [g["pinned_hz"] is not None for g in status["gpus"]] == [False, True], status["gpus"]
    assert [set(h["gpus"]) for h in status["holds"]] == [{"1"}]
    same = c.call("slurm_hold", slurm_job_id=60, uid=1000, policy="ffg", gpus=[1])  # a prolog run again: as before
    assert same.get("already_held") and set(same["gpus"]) == {"1"}, same
    c.call("slurm_release", slurm_job_id=60)
    assert [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None]


def test_a_heterogeneous_jobs_component_is_joined_by_the_leaders_id_its_tasks_see(nvml_daemon):
    """A heterogeneous job's components are jobs of their own: a component's prolog says its own SLURM_JOB_ID and
    the leader's SLURM_HET_JOB_ID, while the tasks of its steps see the leader's id as SLURM_JOB_ID (slurmstepd sets
    it so). Their registrations, which say the leader's id, joined no hold and ran as jobs of their own beside the
    component's pin. They join the component held on their GPU now, a number names one of its GPUs, and the link
    survives a restart."""
    d, _calls = nvml_daemon(gpus=({}, {}, {}))
    c = d.client()
    c.call("slurm_hold", slurm_job_id=600, uid=0, policy="ffg", gpus=[0], gpu_numbering="index")  # the leader
    c.call("slurm_hold", slurm_job_id=601, uid=0, policy="ffg", gpus=[2], gpu_numbering="index", het_job_id=600)
    uuids = [g["uuid"] for g in c.call("status")["gpus"]]
    res = c.call("register", slurm_job_id=600, gpu=uuids[2], **FEATURES)  # a task of component 601, on its GPU
    assert res["slurm"]["joined"], res
    assert {h["slurm_job_id"]: h["joined"] for h in c.call("status")["holds"]} == {600: [], 601: [res["job_id"]]}
    c.call("unregister", job_id=res["job_id"])
    res = c.call("register", slurm_job_id=600, gpu=uuids[0], **FEATURES)  # the leader's own task
    assert res["slurm"]["joined"] and c.call("status")["holds"][0]["joined"] == [res["job_id"]], res
    c.call("unregister", job_id=res["job_id"])
    err = c.request("register", slurm_job_id=600, gpu="1", **FEATURES)["error"]  # GPU 1 is no component's
    assert "UUID" in err["message"], err
    res = c.call("register", slurm_job_id=600, gpu="2", **FEATURES)
    assert res["slurm"]["joined"] and c.call("status")["jobs"][0]["gpu"] == "2", res
    c.call("unregister", job_id=res["job_id"])
    d.stop(signal.SIGKILL)
    d2, _calls = nvml_daemon(gpus=({}, {}, {}), daemon_args={"workdir": d.workdir, "notify_name": "n2.sock"})
    c = d2.client()
    res = c.call("register", slurm_job_id=600, gpu=uuids[2], **FEATURES)
    assert res["slurm"]["joined"] and c.call("status")["holds"][1]["joined"][-1] == res["job_id"], res
    c.call("unregister", job_id=res["job_id"])
    for job in (601, 600):
        c.call("slurm_release", slurm_job_id=job)


def test_a_hold_on_a_gpu_that_cannot_be_pinned_says_it_observes(nvml_daemon):
    """A GPU that refuses every clock lock (Not Supported) is never pinned, a Slurm hold's pin included; the hold's
    reply, status and `ftgov status` still showed the policy's level as the GPU's, a pin that was not in effect. Now
    they say the hold observes there and why; the other GPU of the job is pinned, and the release restores it."""
    from governor.cli.ops import format_status

    d, calls = nvml_daemon(gpus=({"supports_locking": False}, {}))
    c = d.client()
    held = c.call("slurm_hold", slurm_job_id=43, uid=1000, policy="ffg", gpus=[0, 1])
    status = c.call("status")
    assert [g["pinned_hz"] for g in status["gpus"]] == [None, held["gpus"]["1"]["freq_hz"]], status["gpus"]
    assert status["gpus"][0]["cannot_pin"] and held["gpus"]["1"]["freq_hz"] is not None
    for gpus in (held["gpus"], status["holds"][0]["gpus"]):
        assert gpus["0"]["freq_hz"] is None and "GPU 0 cannot be pinned" in gpus["0"]["reason"], gpus
    (line,) = [line for line in format_status(status).splitlines() if "Slurm job 43" in line]
    assert "0 no pin" in line and "1 " in line, line
    again = c.call("slurm_hold", slurm_job_id=44, uid=1000, policy="ffg", gpus=[0])  # the GPU known unpinnable now
    assert again["gpus"]["0"]["freq_hz"] is None and "cannot be pinned" in again["gpus"]["0"]["reason"], again
    for job in (43, 44):
        c.call("slurm_release", slurm_job_id=job)
    made = calls.read_text().split()
    assert made.count("nvmlDeviceSetGpuLockedClocks") == 2  # GPU 0's one refused lock, GPU 1's pin
    assert [g["pinned_hz"] for g in c.call("status")["gpus"]] == [None, None]
