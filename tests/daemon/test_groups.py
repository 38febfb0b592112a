"""Job groups (governor.daemon.groups) on the real daemon over its socket, with several fake NVML GPUs.

Each rank is a real child process registered by pid, so that a rank's death is the kernel's (a pidfd), not a
message."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from governor.sim import job as simjob
from governor.sim.energy import Workload
from governor.sim.groups import SimGroup
from governor.sysfs import Root
from tests.support import FAKENVML_DIR
from tests.support.daemon import FEATURES, REPO, ProgressJob
from tests.support.security import open_to_members, run_as

BERT_BASE = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
WORKLOAD = Workload(name="bert-base", **BERT_BASE)

# A short table, so that a group's tuner converges in a few windows.
LEVELS_MHZ = [1980, 1500, 1005, 510]
GPU = {"graphics_clocks_mhz": {"3201": LEVELS_MHZ}, "util_gpu_pct": 80, "meter_update_s": 0}


@pytest.fixture
def group_daemon(start_daemon, tmp_path):
    def start(count=2, gpus=None, workdir=None, **config):
        spec = tmp_path / "fakenvml.json"
        spec.write_text(json.dumps({"gpus": gpus or [dict(GPU) for _ in range(count)]}))
        env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
        # Fixed-step windows and no settling after a move unless a test says otherwise: these tests drive the
        # membership and the one tuner with reports as fast as they go, on an exact meter; the windows sized by time
        # are test_a_groups_windows_are_sized_by_time_and_carry_their_uncertainty's.
        config = {"backend": "nvml", "policy": "tune", "limits": {"repin_interval_s": 0.01},
                  "tuner": {"baseline_window": False, "noise_rel": 0.05, "window_rule": "steps",
                            "settle_updates": 0}, **config}
        return start_daemon(root=tmp_path / "no-jetson", config=config, env=env, workdir=workdir)
    return start


def register_rank(c, proc, rank: int, world_size: int | None = 2, key: str = "run-1", **extra) -> dict:
    return c.call("register", pid=proc.pid, gpu=rank, group=key, rank=rank, world_size=world_size, **FEATURES,
                  **extra)


def search_until_converged(c, jobs: list[int], max_steps: int) -> tuple[int, dict]:
    """Every rank reports each step (no step times) until the group's tuner converges: the steps, the group."""
    group: dict = {}
    for steps in range(1, max_steps + 1):
        for job_id in jobs:
            c.notify("progress", job_id=job_id, steps=steps)
        (group,) = c.call("status")["groups"]
        if group["tuner"]["converged"]:
            return steps, group
    pytest.fail(f"no convergence in {max_steps} steps: {group}")


def killed_and_restarted(group_daemon, d, c, workdir):
    """The group daemon ``d`` (its workdir ``workdir``, ``c`` a client of it) SIGKILLed and started again there."""
    c.close()
    d.stop(signal.SIGKILL)
    d.notify.close()
    return group_daemon(workdir=workdir)


def gpus_of(c) -> dict[str, dict]:
    return {g["id"]: g for g in c.call("status")["gpus"]}


def test_a_group_gets_one_level_and_status_shows_it(group_daemon, children):
    d = group_daemon()
    c = d.client()
    first = register_rank(c, children(), 0)
    second = register_rank(c, children(), 1)
    assert first["group"] == second["group"] == "run-1" and (first["rank"], second["rank"]) == (0, 1)
    assert first["freq_hz"] == second["freq_hz"] is not None and first["policy"] == second["policy"] == "tune"
    assert first["levels_hz"] == sorted(m * 1_000_000 for m in LEVELS_MHZ)
    gpus = gpus_of(c)
    assert gpus["0"]["pinned_hz"] == gpus["1"]["pinned_hz"] == first["freq_hz"]
    (group,) = c.call("status")["groups"]
    assert group["key"] == "run-1" and group["world_size"] == 2 and group["level_hz"] == first["freq_hz"]
    assert [(r["rank"], r["gpu"]) for r in group["ranks"]] == [(0, "0"), (1, "1")]
    assert all(j["tuner"] is None for j in c.call("status")["jobs"])  # the group's tuner, not one per rank


def test_a_rank_cannot_join_twice_or_share_its_groups_gpu(group_daemon, children):
    d = group_daemon()
    c = d.client()
    register_rank(c, children(), 0)
    err = c.request("register", pid=children().pid, gpu=1, group="run-1", rank=0, world_size=2, **FEATURES)["error"]
    assert err["code"] == -32602 and err["data"]["field"] == "rank", err
    err = c.request("register", pid=children().pid, gpu=0, group="run-1", rank=1, world_size=2, **FEATURES)["error"]
    assert err["data"]["field"] == "gpu", err
    assert err["message"].endswith("two ranks on one GPU; give each rank its own (CUDA_VISIBLE_DEVICES, or gpu= "
                                   "per rank)"), err
    err = c.request("register", pid=children().pid, gpu=1, group="run-1", rank=1, world_size=3, **FEATURES)["error"]
    assert err["data"]["field"] == "world_size", err
    err = c.request("register", gpu=1, rank=1, **FEATURES)["error"]
    assert "pass group" in err["message"], err
    assert len(c.call("status")["jobs"]) == 1


def test_a_rank_that_does_not_fit_the_groups_world_size_is_refused(group_daemon, children):
    """A group holds at most world_size ranks, each below it, whichever registration said the world size. Before, a
    rank 5 registered without a world size stayed when a later rank said 2, and a third rank joined that world of 2:
    the group was never whole ('paused: 3 of 2 ranks registered here') and its tuner never ran."""
    d = group_daemon(count=4)
    c = d.client()

    def refused(gpu: int, **tag) -> dict:
        err = c.request("register", pid=children().pid, gpu=gpu, group="run-1", **tag, **FEATURES)["error"]
        assert err["code"] == -32602, err
        return err

    register_rank(c, children(), 3, world_size=None)  # rank 3 of a world not told yet
    err = refused(1, rank=0, world_size=2)  # a world of 2 has no rank 3
    assert err["data"]["field"] == "world_size" and "rank 3" in err["message"], err
    register_rank(c, children(), 0, world_size=4)
    err = refused(2, rank=4)
    assert err["data"]["field"] == "rank" and "world_size 4" in err["message"], err
    register_rank(c, children(), 1, world_size=None)
    register_rank(c, children(), 2, world_size=4)
    (group,) = c.call("status")["groups"]
    assert group["world_size"] == 4 and sorted(r["rank"] for r in group["ranks"]) == [0, 1, 2, 3], group
    # Whole: a fifth registration, ranked or not, has no place in it.
    c2 = d.client()
    err = c2.request("register", pid=children().pid, gpu=0, group="run-1", **FEATURES)["error"]
    assert err["code"] == -32602 and err["data"]["field"] == "group" and "4 of 4" in err["message"], err
    # Two ranks of a group that said no world size (or rank): a third cannot say the world is 2.
    for gpu in (0, 1):
        c.call("register", pid=children().pid, gpu=gpu, group="run-2", **FEATURES)
    err = c.request("register", pid=children().pid, gpu=2, group="run-2", world_size=2, **FEATURES)["error"]
    assert err["data"]["field"] == "world_size" and "2 ranks" in err["message"], err
    assert len(c.call("status")["jobs"]) == 6


def test_the_per_uid_cap_counts_a_group_once(group_daemon, children):
    d = group_daemon(count=4, limits={"repin_interval_s": 0.01, "max_jobs_per_uid": 2})
    c = d.client()
    for rank in range(3):
        register_rank(c, children(), rank, world_size=3)
    c.call("register", pid=children().pid, gpu=3, **FEATURES)  # one group + one job: two
    err = c.request("register", pid=children().pid, gpu=3, **FEATURES)["error"]
    assert err["code"] == -32002 and "counts once" in err["message"], err
    err = c.request("register", pid=children().pid, gpu=3, group="run-2", **FEATURES)["error"]
    assert err["code"] == -32002, err


# A member's registrations, each a rank of group g<i> on GPU j, on one connection: their replies, as JSON.
_GROUPS_ON_EVERY_GPU = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
out = []
for g in range(int(sys.argv[2])):
    for gpu in range(int(sys.argv[3])):
        f.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register",
                            "params": {**json.loads(sys.argv[4]), "gpu": gpu, "group": f"g{g}"}}).encode() + b"\n")
        f.flush()
        out.append(json.loads(f.readline()))
print(json.dumps(out), flush=True)
sys.stdin.read()
"""


def test_one_members_groups_cannot_take_every_job_slot(group_daemon, member):
    """The per-uid cap counts a group once; on its own it let one member hold max_jobs_per_uid groups with a rank on
    every GPU: on an 8-GPU node at the default limits, all 64 of limits.max_jobs, and nobody else, root included,
    could register. limits.max_ranks_per_uid (16 by default) counts every rank."""
    d = group_daemon(count=8, limits={"repin_interval_s": 0.01, "max_jobs": 20, "max_jobs_per_connection": 64,
                                      "registrations_per_s": 1000, "registration_burst": 1000})
    open_to_members(d)
    name, uid = member
    proc = run_as(name, _GROUPS_ON_EVERY_GPU, d.socket, "3", "8", json.dumps(FEATURES))
    try:
        replies = json.loads(proc.stdout.readline())
        assert all("result" in r for r in replies[:16]), replies[:16]
        refusals = [r["error"] for r in replies[16:]]
        assert [e["code"] for e in refusals] == [-32002] * 8, refusals
        assert all(f"uid {uid} already holds 16 jobs" in e["message"] and "max_ranks_per_uid" in e["message"]
                   for e in refusals), refusals
        c = d.client()
        assert c.call("register", gpu=0, **FEATURES)["job_id"], "root still registers"
        assert len(c.call("status")["jobs"]) == 17
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    d.wait_jobs(1)


def test_a_killed_ranks_gpu_is_restored_while_the_others_keep_the_pin(group_daemon, children):
    d = group_daemon(count=3)
    c = d.client()
    procs = [children() for _ in range(3)]
    level = [register_rank(c, p, r, world_size=3) for r, p in enumerate(procs)][0]["freq_hz"]
    d.wait_jobs(3)
    procs[1].kill()
    d.wait_jobs(2)
    gpus = gpus_of(c)
    assert gpus["1"]["pinned_hz"] is None
    assert gpus["0"]["pinned_hz"] == gpus["2"]["pinned_hz"] == level
    (group,) = c.call("status")["groups"]
    assert [r["rank"] for r in group["ranks"]] == [0, 2] and group["status"] != "measuring"
    procs[0].kill()
    procs[2].kill()
    d.wait_jobs(0)
    assert c.call("status")["groups"] == []
    assert all(g["pinned_hz"] is None for g in gpus_of(c).values())
    assert "ended with its last rank" in d.log()


def test_a_tuned_group_converges_on_the_summed_energy_and_the_slowest_step(group_daemon, children):
    """Progress from both ranks drives one tuner: every window has both ranks' measurements, and both GPUs move
    together to every level it probes."""
    gpus = [dict(GPU), {**GPU, "util_gpu_pct": 40}]
    d = group_daemon(gpus=gpus, tuner={"baseline_window": False, "noise_rel": 0.05, "window_steps": 3,
                                       "max_probes": 12, "window_rule": "steps", "settle_updates": 0})
    c = d.client()
    jobs = [register_rank(c, children(), r)["job_id"] for r in range(2)]
    _steps, group = search_until_converged(c, jobs, 400)
    assert group["status"] == "converged" and group["windows"]
    assert all(w["ranks"] == 2 for w in group["windows"])
    assert {j["freq_hz"] for j in c.call("status")["jobs"]} == {group["level_hz"]}  # the pins follow
    assert "over 2 ranks" in d.log()
    # The level it keeps is its pick: a group runs no follow-up windows after convergence, so a near-tie its tuner
    # would have gone on to confirm (tuner.follow_up) is no place to stay.
    assert group["level_hz"] == group["tuner"]["best_hz"] and group["tuner"]["follow_up"] is None, group["tuner"]


def test_set_level_moves_only_the_callers_rank_of_a_group_spanning_nodes(group_daemon, children):
    d = group_daemon()
    c, other = d.client(), d.client()
    r0 = register_rank(c, children(), 0, world_size=4)  # ranks 2 and 3 are on another node
    r1 = register_rank(other, children(), 1, world_size=4)
    lone = c.call("register", pid=children().pid, gpu=1, **FEATURES)
    low = r0["levels_hz"][0]
    err = other.request("set_level", job_id=r0["job_id"], freq_hz=low)["error"]
    assert err["code"] == -32003, err  # only the connection that holds the job
    err = c.request("set_level", job_id=lone["job_id"], freq_hz=low)["error"]
    assert "in no group" in err["message"], err
    err = c.request("set_level", job_id=r0["job_id"], freq_hz=low + 1)["error"]
    assert err["data"]["field"] == "freq_hz", err
    reply = c.call("set_level", job_id=r0["job_id"], freq_hz=low)
    assert reply["freq_hz"] == low
    if not reply["deferred"]:  # within the GPU's re-pin interval of its first pin, the move lands at its end
        assert gpus_of(c)["0"]["pinned_hz"] == low
    levels = {j["job_id"]: j["freq_hz"] for j in c.call("status")["jobs"]}
    assert levels[r0["job_id"]] == low
    assert levels[r1["job_id"]] != low  # rank 1's own pick (and the lone job's) stay until rank 1 asks
    assert gpus_of(c)["1"]["pinned_hz"] != low
    energy = c.call("job_energy", job_id=r0["job_id"])
    assert energy["energy_j"] is not None and energy["energy_j"] >= 0
    (group,) = c.call("status")["groups"]
    assert group["remote"] and group["status"].startswith("tuned by its rank 0")
    assert other.call("set_level", job_id=r1["job_id"], freq_hz=low)["freq_hz"] == low


def test_a_group_survives_a_daemon_restart(group_daemon, children, tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    d = group_daemon(workdir=workdir)
    c = d.client()
    procs = [children(), children()]
    level = [register_rank(c, p, r) for r, p in enumerate(procs)][0]["freq_hz"]
    d2 = killed_and_restarted(group_daemon, d, c, workdir)
    c = d2.client()
    (group,) = c.call("status")["groups"]
    assert group["key"] == "run-1" and [r["rank"] for r in group["ranks"]] == [0, 1]
    assert group["level_hz"] == level
    procs[0].kill()
    d2.wait_jobs(1)
    assert gpus_of(c)["0"]["pinned_hz"] is None and gpus_of(c)["1"]["pinned_hz"] == level


class _Probing(Exception):
    """The group's search is measuring a level that is not its best so far, and the state file says so."""


def test_a_daemon_killed_mid_search_takes_a_group_back_at_its_best_level_not_the_probe(group_daemon, children,
                                                                                      tmp_path):
    """A restart loses the group's search, as a single job's: its ranks are re-adopted at what stopping the tuning
    would keep (the best level measured so far), not at the level a window was measuring, which the re-adopted group
    would otherwise keep until its ranks end."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    d = group_daemon(workdir=workdir, tuner={"baseline_window": False, "noise_rel": 0.05, "window_rule": "steps",
                                             "settle_updates": 0, "follow_up": False, "window_steps": 300})
    c = d.client()
    jobs = [register_rank(c, children(), r)["job_id"] for r in range(2)]
    state = d.state_dir / "state.json"
    seen: dict = {}
    for steps in range(1, 5000):  # windows of 300 steps: a probe outlasts the state file's deferred save
        before_ns = state.stat().st_mtime_ns  # the move may come with this step's reports, and its save at once
        for job_id in jobs:
            c.notify("progress", job_id=job_id, steps=steps)
        (group,) = c.call("status")["groups"]
        tuner = group["tuner"]
        if tuner["converged"]:
            pytest.fail(f"converged before a probe away from the best was saved: {group}")
        if tuner["probes"] < 1 or group["level_hz"] == tuner["best_hz"]:
            seen.clear()
            continue
        if seen.get("probe") != group["level_hz"]:  # a probe begins: the state file is saved a moment after the move
            seen.update(best=tuner["best_hz"], probe=group["level_hz"], mtime=before_ns)
        if state.stat().st_mtime_ns != seen["mtime"] and tuner["best_hz"] == seen["best"]:
            seen["saved"] = [j["freq_hz"] for j in json.loads(state.read_text())["jobs"]]
            break
    assert seen.get("saved") == [seen["best"]] * 2 != [seen["probe"]] * 2, seen
    c = killed_and_restarted(group_daemon, d, c, workdir).client()
    (group,) = c.call("status")["groups"]
    assert group["level_hz"] == seen["best"]
    assert [g["pinned_hz"] for g in gpus_of(c).values()] == [seen["best"]] * 2


def test_the_ranks_that_wait_are_trimmed_while_the_group_step_time_holds(group_daemon, children):
    """After convergence, ranks that report their step ends and compute times on GPUs of different speeds (the
    simulation of governor.sim.groups, driven by the pins the daemon sets): the fast ranks are lowered, the slowest
    is not, and the group's step time stays within the trim's tolerance."""
    levels_mhz = list(range(1980, 1004, -15))
    gpu = {**GPU, "graphics_clocks_mhz": {"3201": levels_mhz}}
    d = group_daemon(gpus=[dict(gpu) for _ in range(3)], tuner={"baseline_window": False, "max_probes": 2,
                                                                 "window_rule": "steps", "settle_updates": 0})
    c = d.client()
    jobs = [register_rank(c, children(), r, world_size=3)["job_id"] for r in range(3)]
    sim = SimGroup([1.0, 0.9, 0.82], sorted(m * 1_000_000 for m in levels_mhz), noise_rel=0.0)
    # The search: steps without times. Its windows count the steps reported while the pins and the load's sampling
    # wait their time, as many as the reports come in meanwhile (the first took 92 in a run where 200 were too few
    # for two), so the bound is a generous one: the loop ends at convergence.
    steps, group = search_until_converged(c, jobs, 1000)
    level = group["level_hz"]
    clock_s = time.monotonic() - 500.0  # the steps' own clock: CLOCK_MONOTONIC times in the recent past
    for _ in range(3000):
        pins = [g["pinned_hz"] for g in c.call("status")["gpus"]]
        compute = [sim.compute_s(r, hz) for r, hz in enumerate(pins)]
        clock_s += sim.step_s(pins)
        steps += 1
        for r, job_id in enumerate(jobs):
            c.notify("progress", job_id=job_id, steps=steps, step_end_s=clock_s, compute_s=compute[r])
        (group,) = c.call("status")["groups"]
        if group["trim"] is not None and group["trim"]["done"]:
            break
    assert group["trim"] is not None and group["trim"]["done"], group
    c.call("ping")
    final = [group["trim"]["levels_hz"][str(j)] for j in jobs]
    assert final[2] == level and final[0] < final[1] < level, final
    assert sim.step_s(final) <= sim.step_s([level] * 3) * 1.005
    assert sim.energy_j(final) < sim.energy_j([level] * 3)
    # The decisions; each GPU's pin follows within its re-pin interval (limits.repin_interval_s).
    assert [j["freq_hz"] for j in c.call("status")["jobs"]] == final
    assert "trim: job" in d.log()


def test_a_rank_whose_pin_fails_is_in_no_group(start_daemon, tmp_path, children):
    spec, faults = tmp_path / "fakenvml.json", tmp_path / "faults.json"
    # The lock answers GPU_IS_LOST: this pin fails (a GPU that refuses every lock has its rank observe instead).
    faults.write_text(json.dumps({"gpus": {"0": {"nvmlDeviceSetGpuLockedClocks": 15}}}))
    spec.write_text(json.dumps({"gpus": [dict(GPU), dict(GPU)], "faults_path": str(faults)}))
    env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
    d = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml", "policy": "mlg"}, env=env)
    c = d.client()
    err = c.request("register", pid=children().pid, gpu=0, group="run-1", rank=0, world_size=2, **FEATURES)["error"]
    assert err["code"] == -32000, err
    status = c.call("status")
    assert status["jobs"] == [] and status["groups"] == []


def test_ftgov_status_shows_the_group(group_daemon, children):
    from governor.cli.ops import format_status

    d = group_daemon()
    c = d.client()
    level = register_rank(c, children(), 0)["freq_hz"]
    register_rank(c, children(), 1)
    text = format_status(c.call("status"))
    assert (f"group 'run-1': 2 of 2 rank(s) here (rank 0 job 1 GPU 0, rank 1 job 2 GPU 1), level "
            f"{level // 1_000_000} MHz") in text, text


def test_a_group_on_a_jetsons_rails_measures_its_windows(start_daemon):
    """On the simulated Orin the energy comes from the rails' sampler, which integrates the jobs' own meters: a
    group's windows read them, so that its tuner converges there too."""
    d = start_daemon(config={"policy": "tune", "limits": {"repin_interval_s": 0.01},
                             "tuner": {"baseline_window": False, "max_probes": 3, "window_rule": "steps",
                                       "settle_updates": 0}})
    c = d.client()
    job_id = c.call("register", group="solo", rank=0, world_size=1, **FEATURES)["job_id"]
    for steps in range(1, 100_001):
        c.notify("progress", job_id=job_id, steps=steps, step_end_s=time.monotonic())
        if steps % 200 == 0:
            (group,) = c.call("status")["groups"]
            if group["tuner"]["converged"]:
                break
    assert group["tuner"]["converged"] and len(group["windows"]) == 3, group
    assert all(w["joules_per_step"] > 0 for w in group["windows"])


def test_a_groups_windows_are_sized_by_time_and_carry_their_uncertainty(start_daemon):
    """window_rule time (the default), as for a single job: each rank's window is sized by time whatever its steps'
    count and states its own uncertainty; the group's window carries the sum's, which its tuner weighs (issue 23:
    8-step windows on a 100 ms counter scatter by 7-20%). The simulated Orin, its rails' 140 ms average."""
    d = start_daemon(simulate=True, config={"policy": "tune", "limits": {"repin_interval_s": 0.01}, "tuner": {
        "baseline_window": False, "window_min_s": 0.4, "window_max_s": 0.8, "window_min_updates": 1,
        "settle_updates": 2 * 0.15, "max_probes": 3}})
    c = d.client()
    reply = c.call("register", group="solo", rank=0, world_size=1, gpu_util=80.0, **BERT_BASE)
    # What a run across nodes would size its windows by: the same rule, on this rank's meter (the rails' refresh).
    assert reply["window"]["min_s"] == 0.4 and reply["window"]["meter_update_s"] > 0, reply
    job_id = reply["job_id"]
    simjob.run(Root(d.state_dir / "sim-orin"), ProgressJob(c, job_id), WORKLOAD, 80, time_scale=0.15)
    (group,) = c.call("status")["groups"]
    assert len(group["windows"]) >= 2, group
    # The first window has nothing to be compared with: it spans the rule's least; the later ones may close early
    # once clearly apart from the tuner's reference (as a single job's do), never past the cap.
    assert group["windows"][0]["seconds"] >= 0.4, group["windows"]
    for w in group["windows"]:
        assert w["seconds"] <= 0.8 + 0.2 and w["steps"] >= 2, w  # closed at the first report past the cap
        assert w["noise_rel"] is not None and 0 < w["noise_rel"] < 0.5, w
    assert "J/step +-" in d.log()


def test_a_ranks_window_is_compared_with_its_share_of_the_groups_reference():
    """The tuner compares the group's summed J/step; a rank's window closes early against its own share of that
    reference (its part of the last window), and against nothing while a rank has no part yet."""
    from types import SimpleNamespace

    from governor.daemon.groups import Group, Groups, Member
    from governor.policy.windows import Reference

    ref = Reference(3.0, 0.02, exploring=True)
    group = Group(0, "run", 2, tuner=SimpleNamespace(window_reference=lambda hz: ref), level_hz=510_000_000)
    a, b = Member(None, last_joules_per_step=1.0), Member(None, last_joules_per_step=2.0)  # type: ignore[arg-type]
    group.members = {1: a, 2: b}
    assert Groups._reference(group, a) == Reference(1.0, 0.02, exploring=True)
    assert Groups._reference(group, b) == Reference(2.0, 0.02, exploring=True)
    b.last_joules_per_step = None  # a rank that joined since the last window
    assert Groups._reference(group, a) is None


@pytest.mark.parametrize("unpinnable_first", [False, True])
def test_a_rank_on_a_gpu_that_cannot_lock_its_clocks_observes_and_the_group_does_not_wait_for_it(
        group_daemon, children, unpinnable_first):
    """A rank whose GPU refuses every lock (Not Supported) was refused its register; now it observes there. The
    group's windows need every rank at its level, which that one never reaches: the group has no tuner (whichever rank
    came first), says why, and the other rank keeps the level it was pinned at, rather than a search that never
    measures a window."""
    d = group_daemon(gpus=[dict(GPU), {**GPU, "supports_locking": False}])
    c = d.client()
    order = [1, 0] if unpinnable_first else [0, 1]
    reply = {rank: register_rank(c, children(), rank) for rank in order}
    assert reply[1]["policy"] == "observe" and reply[1]["freq_hz"] is None and reply[1]["gpu_cannot_pin"], reply
    assert reply[0]["policy"] == "tune" and reply[0]["freq_hz"] == max(LEVELS_MHZ) * 1_000_000, reply
    for steps in range(1, 20):
        for rank in (0, 1):
            c.notify("progress", job_id=reply[rank]["job_id"], steps=steps)
    (group,) = c.call("status")["groups"]
    assert group["tuner"] is None and group["status"].startswith("no tuner: GPU 1 (job"), group
    gpus = gpus_of(c)
    assert gpus["0"]["pinned_hz"] == reply[0]["freq_hz"] and gpus["1"]["pinned_hz"] is None, gpus
    assert [j["tuner"]["mode"] for j in c.call("status")["jobs"] if j["gpu"] == "1"] == ["observe"]


def _searching_group(group_daemon, children, register: dict | None = None) -> tuple:
    """A daemon whose group of two ranks (rank r registered with ``register[r]`` besides) has measured its first
    window and searches on: the client, the ranks' job ids, the steps so far."""
    d = group_daemon(tuner={"baseline_window": False, "noise_rel": 0.05, "window_steps": 3, "max_probes": 12,
                            "window_rule": "steps", "settle_updates": 0})
    c = d.client()
    jobs = [register_rank(c, children(), r, **(register or {}).get(r, {}))["job_id"] for r in range(2)]
    for steps in range(1, 100):
        for job_id in jobs:
            c.notify("progress", job_id=job_id, steps=steps)
        (group,) = c.call("status")["groups"]
        if group["tuner"]["probes"]:
            assert not group["tuner"]["converged"], group
            return c, jobs, steps
    pytest.fail(f"no window in 100 steps: {group}")


def test_a_length_the_ranks_tell_with_progress_reprices_the_groups_search_and_may_end_it(group_daemon, children):
    """Ranks registered without total_steps tell it with progress (Job.set_total_steps, the callbacks' second run in
    one process): the group's tuner is priced over the steps left, as a single job's is, and a length that ends the
    search pins the group at its choice. The group's length is the largest its ranks told (each rank's latest).
    Before, only the first rank's registered length reached the group's tuner: this one stayed priced for the
    tuner's assumed 2,000 steps and searched on past the run's end."""
    c, jobs, steps = _searching_group(group_daemon, children)
    for job_id in jobs:
        c.notify("progress", job_id=job_id, steps=steps, total_steps=5000)
    (group,) = c.call("status")["groups"]
    assert group["tuner"]["total_steps"] == 5000 - steps, group["tuner"]
    # Ranks that disagree: the largest. Rank 0 alone at its end leaves the search to rank 1's length.
    c.notify("progress", job_id=jobs[0], steps=steps, total_steps=steps + 1)
    (group,) = c.call("status")["groups"]
    assert group["tuner"]["total_steps"] == 5000 - steps and not group["tuner"]["converged"], group["tuner"]
    c.notify("progress", job_id=jobs[1], steps=steps, total_steps=steps + 1)
    (group,) = c.call("status")["groups"]
    tuner = group["tuner"]
    assert tuner["converged"] and group["status"] == "converged", group
    assert group["level_hz"] == tuner["best_hz"]
    assert [j["freq_hz"] for j in c.call("status")["jobs"]] == [tuner["best_hz"]] * 2  # every rank's pin moved


def test_a_length_a_later_rank_registers_with_reaches_the_groups_tuner(group_daemon, children):
    """The first rank registered without total_steps, the second with it: the group's tuner learns it (it took only
    the first rank's, at its start)."""
    c, jobs, steps = _searching_group(group_daemon, children, {1: {"total_steps": 800}})
    (group,) = c.call("status")["groups"]
    assert group["tuner"]["total_steps"] is not None and group["tuner"]["total_steps"] <= 800, group["tuner"]


def test_a_groups_tuner_counts_the_steps_left_from_the_ranks_steps(group_daemon, children):
    """Once the group's length is known, each window tells its tuner the steps the ranks have left, as a single
    job's session does: counted down by the windows' steps alone, the steps that waited for the pins went uncounted.
    (Status shows that count once converged.)"""
    c, jobs, told_at = _searching_group(group_daemon, children)
    for job_id in jobs:
        c.notify("progress", job_id=job_id, steps=told_at, total_steps=5000)
    for steps in range(told_at + 1, told_at + 400):
        for job_id in jobs:
            c.notify("progress", job_id=job_id, steps=steps)
        (group,) = c.call("status")["groups"]
        if group["tuner"]["converged"]:
            break
    assert group["tuner"]["steps_left"] == 5000 - steps, (steps, group["tuner"])
