"""governor.client.group: a job group's key from the launcher's environment, and a run across two simulated nodes
(CPU-only torch over gloo, two ftgovd instances with two fake NVML GPUs each) tuned by its rank 0."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import re
import signal
import socket

import pytest

from governor.client.group import group_from_env
from tests.support import FAKENVML_DIR
from tests.support.daemon import REPO

pytest.importorskip("torch.distributed")

LEVELS_MHZ = [1980, 1500, 1005, 510]
GPU = {"graphics_clocks_mhz": {"3201": LEVELS_MHZ}, "util_gpu_pct": 80, "meter_update_s": 0}
TIMEOUT_S = 120


def test_the_group_comes_from_torchrun_else_slurm_else_the_caller():
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    g = group_from_env(env=torchrun)
    assert (g.key, g.rank, g.world_size, g.local_world_size, g.spans_nodes) == ("torchrun-abc", 3, 8, 4, True)
    g = group_from_env(env={"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert (g.key, g.rank, g.world_size, g.spans_nodes) == ("slurm-77.2", 1, 2, False)
    g = group_from_env("mine", 0, 2, env=torchrun)
    assert (g.key, g.rank, g.world_size) == ("mine", 0, 2)
    assert group_from_env(env={"SLURM_JOB_ID": "77"}) is None  # a batch script outside any step: no group
    assert group_from_env(env={}) is None


def test_the_ranks_on_this_node_come_from_whichever_launcher_says():
    """Whether a run spans nodes rests on how many of its ranks share this node: torchrun's LOCAL_WORLD_SIZE, srun's
    --ntasks-per-node or, without it, its step's task list (this node's entry), Open MPI's, MPICH's and deepspeed's
    local size, or the caller's."""
    srun = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    g = group_from_env(env={**srun, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1"})
    assert (g.local_world_size, g.spans_nodes) == (2, True)
    g = group_from_env(env={**srun, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1"})
    assert (g.local_world_size, g.spans_nodes) == (1, True)
    g = group_from_env(env={**srun, "SLURM_STEP_TASKS_PER_NODE": "4"})
    assert (g.local_world_size, g.spans_nodes) == (4, False)  # one node
    g = group_from_env(env={**srun, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2"})
    assert g.local_world_size == 2
    assert group_from_env(env={**srun, "SLURM_STEP_TASKS_PER_NODE": "garbage"}).local_world_size is None
    assert group_from_env(env={**srun, "SLURM_STEP_TASKS_PER_NODE": "2(x0)"}).local_world_size is None
    # mpirun inside an allocation: the batch step's SLURM_* describe the allocation, the MPI launcher's the ranks
    g = group_from_env("mpi", env={**srun, "SLURM_NTASKS_PER_NODE": "1", "OMPI_COMM_WORLD_RANK": "5",
                                   "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (g.rank, g.world_size, g.local_world_size) == (5, 8, 4)
    g = group_from_env("mpi", env={"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (g.rank, g.world_size, g.local_world_size, g.spans_nodes) == (5, 8, 4, True)
    g = group_from_env("mpich", env={"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1"})
    assert (g.rank, g.world_size, g.spans_nodes) == (1, 2, True)
    # deepspeed's launcher (its pdsh runner's too, on each node; its MPICH and Intel MPI runners) says LOCAL_SIZE, the
    # rank 0 node's even where it was started from a Slurm batch script, whose SLURM_* describe the allocation
    deepspeed = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
                 "CROSS_SIZE": "2"}
    g = group_from_env("hf-1", env={**deepspeed, "SLURM_JOB_ID": "77", "SLURM_NTASKS_PER_NODE": "1"})
    assert (g.rank, g.world_size, g.local_world_size, g.spans_nodes) == (3, 4, 2, True)
    g = group_from_env("mine", 0, 4, env={}, local_world_size=2)
    assert g.spans_nodes
    assert group_from_env("mine", 0, 4, env={}).local_world_size is None


def test_a_tuned_rank_that_cannot_tell_whether_its_run_spans_nodes_warns(node, monkeypatch):
    """Without any launcher's local size, a run whose ranks span nodes would never be tuned (each node's daemon waits
    for every rank; no rank 0 tunes across nodes), silently: the rank says so at register. Given, it does not."""
    import warnings

    import governor
    from governor.client import GovernorWarning

    d = node("one")
    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                "LOCAL_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(var, raising=False)
    features = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)
    with pytest.warns(GovernorWarning, match="local_world_size"):
        with governor.job(**features, gpu=0, socket=d.socket, tune=True, group="g", rank=0, world_size=2):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error", GovernorWarning)
        with governor.job(**features, gpu=0, socket=d.socket, tune=True, group="h", rank=0, world_size=2,
                          local_world_size=2):
            pass


def test_a_torchrun_rank_registers_in_its_group_and_reports_its_compute_time(node, monkeypatch):
    import governor

    d = node("one")
    for name, value in {"TORCHELASTIC_RUN_ID": "r1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with governor.job(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0, gpu=1,
                      socket=d.socket, report_every_s=0) as job:
        assert job.registration["group"] == "torchrun-r1" and job.registration["rank"] == 1
        sent = []
        notify = job._conn.notify
        monkeypatch.setattr(job._conn, "notify", lambda method, **p: (sent.append(p), notify(method, **p)))
        job.step()  # the first step: no start to time its compute from
        job.compute_done()
        job.step()
        job.step()  # no compute_done: nothing to add
        assert "compute_s" not in sent[0] and "compute_s" not in sent[2]
        assert 0 <= sent[1]["compute_s"] < 5 and sent[1]["step_end_s"] >= sent[0]["step_end_s"]
        (group,) = d.client().call("status")["groups"]
        assert group["key"] == "torchrun-r1" and group["world_size"] == 2 and group["ranks"][0]["rank"] == 1
        assert job.coordinator is None  # one node: its daemon tunes the group


@pytest.fixture
def node(start_daemon, tmp_path):
    """One simulated node: an ftgovd with two fake NVML GPUs."""
    def start(name: str, gpu: dict | None = None, tuner: dict | None = None):
        spec = tmp_path / f"{name}.json"
        spec.write_text(json.dumps({"gpus": [dict(gpu or GPU), dict(gpu or GPU)]}))
        env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
        # Windows sized by time as the daemon's defaults size them, scaled to these ranks' 1-3 ms steps: at least
        # 0.1 s, at most 0.3 s (the defaults' 1-10 s would outlast the ranks' MAX_STEPS).
        return start_daemon(root=tmp_path / "no-jetson", env=env,
                            config={"backend": "nvml", "policy": "tune", "limits": {"repin_interval_s": 0.01},
                                    "tuner": {"window_min_s": 0.1, "window_max_s": 0.3, "window_min_updates": 1,
                                              **(tuner or {})}})
    return start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_of(daemon) -> dict:
    """The daemon's status, on a connection of its own."""
    c = daemon.client()
    try:
        return c.call("status")
    finally:
        c.close()


def pinned(daemon) -> dict[str, int | None]:
    """Each GPU's pin now (a restore is immediate; a move lands within the GPU's re-pin interval)."""
    return {g["id"]: g["pinned_hz"] for g in status_of(daemon)["gpus"]}


def decided(daemon) -> dict[str, int | None]:
    """The level each GPU's job was given (what its pin follows within the GPU's re-pin interval)."""
    return {j["gpu"]: j["freq_hz"] for j in status_of(daemon)["jobs"]}


class FourRanks:
    """Four training processes, two on each of ``nodes`` (tests.support.ranks.run_rank, ``speeds`` passed on), as a
    context manager: started on entry; on exit each is released and joined, killed if it hangs. ``results`` is the
    queue they report on; ``release()`` lets them end (a killed rank's pipe is skipped)."""

    def __init__(self, nodes, speeds: list[float] | None = None):
        from tests.support.ranks import run_rank

        ctx = multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self._pipes = [ctx.Pipe(duplex=False) for _ in range(4)]  # (the rank's end, the test's end)
        port = free_port()
        extra = () if speeds is None else (speeds,)
        self.procs = [ctx.Process(target=run_rank, args=(rank, 4, 2, port, nodes[rank // 2].socket, self.results,
                                                         self._pipes[rank][0], *extra)) for rank in range(4)]

    def release(self) -> None:
        for _rank_end, test_end in self._pipes:
            try:
                test_end.send(True)
            except OSError:
                pass  # a killed rank

    def __enter__(self) -> FourRanks:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def test_four_ranks_on_two_nodes_converge_on_one_level_and_a_killed_ranks_gpu_is_restored(node):
    nodes = [node("a"), node("b")]
    with FourRanks(nodes) as ranks:
        results, release = ranks.results, ranks.release
        try:
            done = {}
            for _ in range(4):
                rank, pid, steps, coordinator = results.get(timeout=TIMEOUT_S)
                done[rank] = (pid, steps, coordinator)
            assert {steps for _pid, steps, _c in done.values()} == {done[0][1]}  # every rank stopped at one step
            levels = {c["level_hz"] for _pid, _steps, c in done.values()}
            assert len(levels) == 1 and all(c["status"].startswith("converged") for _p, _s, c in done.values()), done
            (level,) = levels
            assert done[0][2]["windows"] >= 1 and done[0][2]["bytes_sent"] > 0
            # Windows on the daemon's rule: each states its own uncertainty; the next one's length is every rank's.
            last = done[0][2]["last_window"]
            assert last["noise_rel"] is not None and last["noise_rel"] > 0 and last["seconds"] >= 0.1, last
            assert len({c["window_steps"] for _p, _s, c in done.values()}) == 1, done
            # A window closed early at a read inside closed on every rank at once (rank 0's verdict, broadcast).
            assert len({c["closed_early"] for _p, _s, c in done.values()}) == 1, done
            assert decided(nodes[0]) == {"0": level, "1": level} and decided(nodes[1]) == {"0": level, "1": level}

            nodes[1].notify.drain()
            os.kill(done[3][0], signal.SIGKILL)  # rank 3: node b's GPU 1
            nodes[1].wait_jobs(1)
            assert pinned(nodes[1])["1"] is None  # restored at once
            assert decided(nodes[1]) == {"0": level} and decided(nodes[0]) == {"0": level, "1": level}
            (group,) = nodes[1].client().call("status")["groups"]
            assert group["key"] == "torchrun-test-run" and [r["rank"] for r in group["ranks"]] == [2]

            release()
            ended = {}
            for _ in range(3):
                rank, what, result = results.get(timeout=TIMEOUT_S)
                ended[rank] = result
            assert sorted(ended) == [0, 1, 2] and all(r is not None and r["freq_hz"] == level for r in ended.values())
            nodes[0].wait_jobs(0)
            nodes[1].wait_jobs(0)
            assert set(pinned(nodes[0]).values()) == set(pinned(nodes[1]).values()) == {None}
        except queue.Empty:
            pytest.fail(f"the ranks did not report within {TIMEOUT_S} s")


def test_ranks_whose_daemons_differ_in_their_window_rule_take_part_in_the_same_collectives(node):
    """Node b's daemon sizes windows in fixed steps (as an older one would: no rule in its register reply), node a's
    by time. Rank 0 (on a) says whether a window's reads inside are collectives, so ranks 2 and 3, which have no rule
    of their own, take part in them: the run converges on one level instead of hanging at the first read inside."""
    nodes = [node("a"), node("b", tuner={"window_rule": "steps"})]
    with FourRanks(nodes) as ranks:
        try:
            done = {}
            for _ in range(4):
                rank, _pid, steps, coordinator = ranks.results.get(timeout=TIMEOUT_S)
                done[rank] = (steps, coordinator)
        except queue.Empty:
            pytest.fail(f"the ranks did not report within {TIMEOUT_S} s (a collective that some ranks skipped?)")
    assert len({steps for steps, _c in done.values()}) == 1, done
    assert len({c["level_hz"] for _s, c in done.values()}) == 1, done
    assert all(c["status"].startswith("converged") for _s, c in done.values()), done
    assert done[0][1]["windows"] >= 1


def test_a_run_across_nodes_trims_its_ranks_that_wait_and_ends(node):
    """Ranks that tell their compute times (job.compute_done()), on simulated GPUs of different speeds: after the
    group's level, rank 0 trims; every rank ends at or under the group's level, its daemon's pin where rank 0 put it.
    (On a loaded CPU the step times are noisy: which ranks keep a lower level is not asserted.)"""
    # A fine table, and a GPU whose idle power makes the top level the least energy per step: there is room under
    # the group's level.
    gpu = {**GPU, "graphics_clocks_mhz": {"3201": list(range(1980, 1499, -60))}, "idle_power_mw": 300_000}
    nodes = [node("c", gpu), node("d", gpu)]
    with FourRanks(nodes, speeds=[1.0, 0.95, 0.9, 0.8]) as ranks:
        try:
            done = {}
            for _ in range(4):
                rank, _pid, _steps, coordinator = ranks.results.get(timeout=TIMEOUT_S)
                done[rank] = coordinator
            assert all(c["status"].endswith("; trimmed") for c in done.values()), done
            (level,) = {c["level_hz"] for c in done.values()}
            assert all(c["own_hz"] <= level for c in done.values())
            assert decided(nodes[0]) == {"0": done[0]["own_hz"], "1": done[1]["own_hz"]}
            assert decided(nodes[1]) == {"0": done[2]["own_hz"], "1": done[3]["own_hz"]}
            ranks.release()
            for _ in range(4):
                ranks.results.get(timeout=TIMEOUT_S)
        except queue.Empty:
            pytest.fail(f"the ranks did not report within {TIMEOUT_S} s")


class TwoRanks:
    """torch.distributed as rank 0 of two sees it, rank 1's part of an edge given by the test (no network); at a read
    inside a window, rank 1 has read nothing."""

    def __init__(self, other: list[float]):
        self.other = other
        self.so_far = [0.0, 0.0, 0.0, 0.0, -1.0]

    def get_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 2

    def get_backend(self) -> str:
        return "gloo"

    def all_gather(self, gathered, mine) -> None:
        import torch

        gathered[0].copy_(mine)
        gathered[1].copy_(torch.tensor(self.other if len(mine) == len(self.other) else self.so_far,
                                       dtype=torch.float64))

    def broadcast(self, tensor, src: int) -> None:
        pass


def test_a_rank_whose_daemon_is_absent_makes_rank_0_broadcast_stop_at_the_first_edge(tmp_path):
    """Rank 1 says "not able" (its daemon absent or refusing): rank 0 broadcasts stop at the first edge, and the
    coordination ends there (every rank reads the same broadcast), so that no rank waits in a collective the others
    no longer enter."""
    import warnings

    from governor.client import GovernorWarning, Job
    from governor.client.group import GROUP_WINDOW_STEPS, SUB_WINDOWS, GroupCoordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)
        job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
                  socket=str(tmp_path / "absent.sock"), group="g", rank=0, world_size=2).start()
    coordinator = GroupCoordinator(job, TwoRanks([0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0]))
    for _ in range(1 + GROUP_WINDOW_STEPS):  # the first edge: GROUP_WINDOW_STEPS after the first step, on every rank
        job.step()
        coordinator.step(job.steps)
    # the reads inside the stretch before the first edge are collectives on every rank (the stretch may close early,
    # SUB_WINDOWS - 1 of them: rank 0's five floats and its verdict each); then at the edge rank 0's seven floats in
    # the all_gather and the broadcast: 5 + one level a rank
    assert coordinator.done and coordinator.status.startswith("stopped")
    assert coordinator.bytes_sent == (SUB_WINDOWS - 1) * (40 + 8) + 56 + 56


class PeerGone(TwoRanks):
    """Rank 1 dies after ``calls`` collectives: gloo raises on the next one."""

    def __init__(self, calls: int):
        super().__init__([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
        self.calls = calls

    def all_gather(self, gathered, mine) -> None:
        self.calls -= 1
        if self.calls < 0:
            raise RuntimeError("[gloo] Connection closed by peer")
        super().all_gather(gathered, mine)


def test_a_collective_that_fails_ends_the_coordination_not_the_training(tmp_path):
    """A rank gone (SIGKILLed, its node down): the next collective of rank 0's coordination raises inside job.step().
    The coordination stops there with a warning, and job.step() returns: the run's own next collective fails in the
    training's words, or the run goes on untuned."""
    import warnings

    from governor.client import GovernorWarning, Job
    from governor.client.group import GROUP_WINDOW_STEPS, GroupCoordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)
        job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
                  socket=str(tmp_path / "absent.sock"), group="g", rank=0, world_size=2).start()
    coordinator = GroupCoordinator(job, PeerGone(calls=3))
    for _ in range(1 + 2 * GROUP_WINDOW_STEPS):
        job.step()
        coordinator.step(job.steps)  # raises nothing
    assert coordinator.done and coordinator.status.startswith("stopped: a collective failed"), coordinator.status
    assert "closed by peer" in coordinator.status


def test_rank_0_sizes_the_next_window_by_time_and_by_the_last_ones_uncertainty(tmp_path):
    """The rule the daemon told (the register reply's window): at least its shortest time, as long as the last
    window's scatter says the target needs, at most max_s; without one (an older daemon), GROUP_WINDOW_STEPS."""
    import warnings

    from governor.client import GovernorWarning, Job
    from governor.client.group import GROUP_WINDOW_STEPS, GroupCoordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)
        job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
                  socket=str(tmp_path / "absent.sock"), group="g", rank=0, world_size=2).start()
    assert GroupCoordinator(job, TwoRanks([])).sized_steps(0.025, 8, 0.2) == GROUP_WINDOW_STEPS
    job.registration = {"window": {"target_rel": 0.02, "min_s": 1.0, "max_s": 10.0, "min_updates": 5,
                                   "meter_update_s": 0.1, "min_steps": 2, "prior_rel": 0.03}}
    c = GroupCoordinator(job, TwoRanks([]))
    assert c.sized_steps(0.025, 8, None) == 40  # 1 s of 25 ms steps
    assert c.sized_steps(0.025, 8, 0.2) == 400  # 8 steps at 20% want 800: the 10 s cap
    assert c.sized_steps(0.025, 120, 0.03) == 270  # (3% / 2%)^2 x 120
    assert c.sized_steps(0.025, 270, 0.01) == 68  # calmer than the target: a quarter of the steps
    assert c.sized_steps(0.5, 8, 0.03) == 18  # long steps: few of them
    job.registration = {"window": {"target_rel": -1}}  # a rule that does not validate: fixed steps, not a crash
    assert GroupCoordinator(job, TwoRanks([])).rule is None


def test_a_loop_that_reports_data_around_each_batch_reads_its_energy_only_at_its_windows_edges(tmp_path):
    """A rank of a run across nodes whose loop reports `data` around each batch's loading (job.phase("data"), then
    "train"): each stretch is training (shorter than SHORT_PHASE_S). Its windows here are fixed-step (no window rule
    from the daemon: no reads inside to estimate a long stretch's start by), so a stretch costs one job_energy call,
    as it begins, and none as it ends. Before, each phase change made a blocking job_energy call: two a step."""
    import warnings

    from governor.client import GovernorWarning, Job
    from governor.client.group import GroupCoordinator

    class Daemon:  # the rank's daemon as its connection answers: energy at 10 J a step
        def __init__(self, job):
            self.job, self.energy_reads = job, 0

        def call(self, method, **params):
            if method == "job_energy":
                self.energy_reads += 1
                return {"job_id": params["job_id"], "energy_j": 10.0 * self.job.steps, "at_s": 0.1 * self.job.steps}
            return {"job_id": params["job_id"], "freq_hz": params["freq_hz"], "deferred": False}  # set_level

        def notify(self, method, **params):
            return True

    levels = [510_000_000, 1_005_000_000, 1_500_000_000, 1_980_000_000]
    reads = []
    for phases in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GovernorWarning)
            job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
                      socket=str(tmp_path / "absent.sock"), group="g", rank=0, world_size=2, local_world_size=1,
                      tune=True).start()
        daemon = Daemon(job)
        job.job_id, job.disabled, job._conn = 7, False, daemon
        job.registration = {"job_id": 7, "freq_hz": levels[-1], "levels_hz": levels}  # no window rule: 8-step windows
        job.coordinator = GroupCoordinator(job, TwoRanks([1.0, 1.0, 80.0, 8.0, 0.8, -1.0, -1.0]))
        for _ in range(200):
            if phases:
                job.phase("data")  # the next batch's loading
                job.phase("train")
            job.step()
        assert job.coordinator.windows >= 5 and "stopped" not in job.coordinator.status, job.coordinator.describe()
        reads.append(daemon.energy_reads)
    assert reads[1] - reads[0] <= 200, reads  # at most one a stretch (400 before)


def test_a_read_its_daemon_did_not_answer_is_not_called_refused(tmp_path, caplog):
    """A rank's job_energy that got no answer (the daemon gone) was logged as the daemon's refusal."""
    import logging
    import warnings

    from governor.client import DaemonUnavailable, GovernorWarning, Job, RpcError
    from governor.client.group import GroupCoordinator

    class Conn:
        def __init__(self, error):
            self.error = error

        def call(self, method, **params):
            raise self.error

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)
        job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
                  socket=str(tmp_path / "absent.sock"), group="g", rank=0, world_size=2).start()
    job.job_id, job.disabled = 7, False
    coordinator = GroupCoordinator(job, TwoRanks([]))
    with caplog.at_level(logging.WARNING, "governor"):
        job._conn = Conn(DaemonUnavailable("lost the connection to ftgovd"))
        assert coordinator._call("job_energy") is None
        job._conn = Conn(RpcError(-32602, "job_id: this job is in no group"))
        assert coordinator._call("job_energy") is None
    assert [r.getMessage() for r in caplog.records] == [
        "ftgov: group 0: job_energy got no answer: lost the connection to ftgovd",
        "ftgov: group 0: job_energy refused: job_id: this job is in no group [JSON-RPC -32602]"]


def restart_without(daemon, lost: list[int]) -> None:
    """SIGKILL ``daemon`` and start it again, the jobs ``lost`` gone from its state file (their records had not reached
    it, or it was set aside): it re-adopts the others and restores the lost ones' clocks."""
    import json

    daemon.stop(signal.SIGKILL)
    state = daemon.state_dir / "state.json"
    saved = json.loads(state.read_text())
    state.write_text(json.dumps({**saved, "jobs": [j for j in saved["jobs"] if j["job_id"] not in lost]}))
    daemon.start()


def test_a_rank_a_restarted_daemon_lost_rejoins_its_group_and_the_group_is_tuned_again(node):
    """Two ranks on one node; the daemon restarts having lost rank 1's job (re-adopting rank 0's): rank 1 registers
    again and rejoins its group by key, and the group's tuner starts over. Before, the re-adopted rank had no meter
    in the group, and the tuner made for the rejoined rank stopped at once, its status saying that a rank's GPU had
    no energy source."""
    import warnings

    import governor
    from governor.client import GovernorWarning

    d = node("one")
    features = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)  # the re-registration's, which the client's tests check
        jobs = [governor.job(**features, gpu=r, socket=d.socket, tune=True, group="g", rank=r, world_size=2,
                             local_world_size=2, report_every_s=0).start() for r in range(2)]
        for job in jobs:
            job.step()
        first = [job.job_id for job in jobs]
        restart_without(d, lost=[first[1]])
        for _ in range(20):
            for job in jobs:
                job.step()
        assert jobs[0].job_id == first[0] and jobs[1].job_id not in (None, first[1]) and not jobs[1].disabled
        (group,) = status_of(d)["groups"]
        assert sorted((r["rank"], r["job_id"]) for r in group["ranks"]) == [(0, first[0]), (1, jobs[1].job_id)]
        assert group["tuner"] is not None and group["status"] == "measuring", group
        for job in jobs:
            job.close()


@pytest.mark.parametrize("lost", [False, True], ids=["re-adopted", "registered-again"])
def test_a_rank_across_nodes_goes_on_being_tuned_after_its_daemon_restarts(node, lost):
    """Rank 0 of a run across nodes (rank 1's windows given), its node's daemon restarted under it. Re-adopted, the
    job's energy was no more to be had (the group's re-adopted rank had no meter): rank 0 stopped the group's tuning
    at its next edge, every GPU left at the level of the search it was at. Registered again (the restart lost the
    job), its new job was pinned at what the daemon decided for it, not at the group's level, while the coordinator
    took its GPU for still there; and the window open across the restart took the new meter's energy for the old
    one's (a window of negative energy stopped the tuning). Now the window open across the restart is measured
    again, the GPU is put back at the group's level, and the search goes on."""
    import warnings

    from governor.client import GovernorWarning, Job
    from governor.client.group import GroupCoordinator

    d = node("one")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)
        job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0),
                  socket=d.socket, gpu=0, tune=True, group="g", rank=0, world_size=2, local_world_size=1,
                  report_every_s=0).start()
        start_hz = job.registration["freq_hz"]
        # rank 1: 8 steps of 0.2 s at 1 J each; at a read inside, nothing read yet
        coordinator = job.coordinator = GroupCoordinator(job, TwoRanks([1.0, 1.0, 8.0, 8.0, 0.2, -1.0, -1.0]))
        while coordinator.own_hz in (None, start_hz) and not coordinator.done:  # until the search moved the GPU
            job.step()
        assert not coordinator.done, coordinator.status
        level, windows, first = coordinator.own_hz, coordinator.windows, job.job_id
        restart_without(d, lost=[first] if lost else [])
        job.step()  # finds the daemon gone: the job is held again, or registered again
        job.step()
        assert (job.job_id != first) == lost and not job.disabled
        assert decided(d) == {"0": coordinator.own_hz} and coordinator.own_hz in (level, coordinator.level_hz)
        for _ in range(400):
            job.step()
            if coordinator.windows > windows + 1 or coordinator.done:
                break
    assert coordinator.windows > windows + 1 and not coordinator.status.startswith("stopped"), coordinator.status
    assert coordinator.last_window["joules_per_step"] > 1.0, coordinator.last_window  # rank 0's part counted
    job.close()


def ranks_reports(target, socket: str, world_size: int = 2, reports: int = 1,
                  timeout_s: float = TIMEOUT_S) -> list[tuple]:
    """Start ``world_size`` ranks running ``target`` (tests.support.ranks) against the daemon at ``socket``; what
    each reported (rank, the job's group key, its rank and world size, registered; ``reports`` a rank, each within
    ``timeout_s``), by rank."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, world_size, port, socket, results)) for rank in range(world_size)]
    for p in procs:
        p.start()
    try:
        return sorted((results.get(timeout=timeout_s) for _ in range(reports * len(procs))), key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def assert_one_group_of_two(daemon, got: list[tuple], prefix: str) -> None:
    (rank0, key, r0, world0, registered0), (rank1, key1, r1, world1, registered1) = got
    assert key is not None and key.startswith(f"{prefix}-") and key1 == key, got
    assert (rank0, r0, world0, rank1, r1, world1) == (0, 0, 2, 1, 1, 2) and registered0 and registered1, got
    assert re.search(rf"group '{key}' \(uid \d+\): started by job \d+ .*\(world size 2\)", daemon.log()), daemon.log()
    assert re.search(rf"group '{key}' \(uid \d+\) ended with its last rank", daemon.log()), daemon.log()


def test_lightning_ddp_ranks_without_a_launchers_key_form_one_group(node):
    """Lightning's own DDP launchers (strategy="ddp" from `python train.py`, ddp_spawn) set no group key and no RANK
    (deepspeed's sets RANK, but no key): each rank's job stood alone, and under tune=True their tuners fought. Rank 0
    makes a key at the train-start hook and broadcasts it; both ranks register in one group."""
    pytest.importorskip("lightning.pytorch")
    from tests.support.ranks import lightning_rank

    d = node("one")
    assert_one_group_of_two(d, ranks_reports(lightning_rank, d.socket), "lightning")


def test_hf_trainer_ranks_under_deepspeeds_launcher_form_one_group(node):
    """deepspeed's launcher (and accelerate's deepspeed launch across nodes, mpirun) sets RANK and WORLD_SIZE but no
    group key: each Trainer rank's job stood alone, and under tune=True their tuners fought. The callback's rank 0
    makes a key at on_train_begin, which every rank runs, and broadcasts it over the process group that
    TrainingArguments brought up; both ranks register in one group."""
    pytest.importorskip("transformers")
    from tests.support.ranks import hf_rank

    d = node("one")
    got = ranks_reports(hf_rank, d.socket, reports=2)
    assert [r for r in got if r[1] == "warned"] == [(0, "warned", []), (1, "warned", [])], got
    assert_one_group_of_two(d, [r for r in got if r[1] != "warned"], "hf")


def test_hf_trainer_ranks_of_two_runs_in_one_process_form_a_group_each(node):
    """Each train start agrees on its group afresh (a notebook's second Trainer in the same processes): the second
    run's ranks form a group of their own, not the first one's again."""
    from functools import partial

    pytest.importorskip("transformers")
    from tests.support.ranks import hf_rank

    d = node("one")
    got = [r for r in ranks_reports(partial(hf_rank, runs=2), d.socket, reports=3) if r[1] != "warned"]
    first, second = [got[0], got[2]], [got[1], got[3]]
    assert first[0][1] != second[0][1], got
    for run in (first, second):
        assert_one_group_of_two(d, run, "hf")


def assert_rank_0_alone_and_told(got: list, d) -> None:
    """Ranks' reports (ranks_reports) of a run whose callback is on rank 0 only: rank 0 registered a job of its own and
    warned once, naming the fix; rank 1 registered none and said nothing; the daemon formed no group."""
    assert [r for r in got if r[1] != "warned"] == [(0, None, None, None, True), (1, None, None, None, False)], got
    (said,) = [r[2] for r in got if r[1] == "warned" and r[0] == 0][0]
    assert "rank 0 of 2" in said and "Give every rank's Trainer a GovernorCallback" in said, said
    assert [r[2] for r in got if r[1] == "warned" and r[0] == 1] == [[]], got
    assert not re.search(r"group '[^']*' \(uid", d.log()), d.log()


def test_hf_trainer_with_the_callback_on_rank_0_only_trains_on_and_says_why_it_is_ungrouped(node):
    """The callback on the main process only (``callbacks=[cb] if rank == 0 else []``): rank 0's train begin was a
    broadcast that the other ranks never reached, while they waited in DDP's all-reduce: the training hung for good.
    Now it finishes (the ranks report within the time limit), rank 0 registers a job of its own and warns once,
    naming the fix."""
    from functools import partial

    pytest.importorskip("transformers")
    from tests.support.ranks import hf_rank

    d = node("one")
    got = ranks_reports(partial(hf_rank, holders=(0,)), d.socket, reports=2, timeout_s=60)
    assert_rank_0_alone_and_told(got, d)

    # A tuned run across nodes under torchrun (its key from the launcher, one rank a node): rank 0 alone in the group
    # would have waited at its first step in the tuning's collectives.
    across = {"TORCHELASTIC_RUN_ID": "run-across", "LOCAL_WORLD_SIZE": "1"}
    got = ranks_reports(partial(hf_rank, holders=(0,), env=across, tune=True), d.socket, reports=2, timeout_s=60)
    assert [r for r in got if r[1] != "warned"] == [(0, None, None, None, True), (1, None, None, None, False)], got
    assert not re.search(r"group '[^']*' \(uid", d.log()), d.log()


def test_lightning_trainer_with_the_callback_on_rank_0_only_trains_on_and_says_why_it_is_ungrouped(node):
    """A real Lightning Trainer under DDP (two ranks as its own launcher starts them, gloo) with the callback on rank 0
    only (``callbacks=[cb] if trainer.global_rank == 0 else []``), as the Hugging Face test above: the fit finishes,
    rank 0 registers a job of its own and warns once, naming the fix; rank 1 says nothing."""
    from functools import partial

    pytest.importorskip("lightning.pytorch")
    from tests.support.ranks import lightning_trainer_rank

    d = node("one")
    got = ranks_reports(partial(lightning_trainer_rank, holders=(0,)), d.socket, reports=2, timeout_s=60)
    assert_rank_0_alone_and_told(got, d)


def rank_1_first(start: int) -> dict[int, list[tuple]]:
    """Gates (tests.support.ranks.agreeing_rank) for train start ``start``: rank 1 waits for rank 0 to open it before
    rank 0 does."""
    return {1: [(start, "wait", r"/open$", f"test/{start}/waiting", None)],
            0: [(start, "add", r"ftgov/gen$", None, f"test/{start}/waiting")]}


def rank_0_opened_first(start: int) -> dict[int, list[tuple]]:
    """Gates for train start ``start``: rank 1 comes once rank 0 has opened it and waits for the ranks."""
    return {0: [(start, "wait", r"/rank/", f"test/{start}/opened", None)],
            1: [(start, "add", r"ftgov/gen$", None, f"test/{start}/opened")]}


def agreed_keys(starts: list[tuple[int, ...]], gates: dict[int, list[tuple]], unsynced: tuple[int, ...] = ()) -> dict:
    """Two gloo ranks through ``starts`` (tests.support.ranks.agreeing_rank): the key each agreed on, by (rank,
    start)."""
    from functools import partial

    from tests.support.ranks import agreeing_rank

    got = ranks_reports(partial(agreeing_rank, starts=starts, gates=gates, unsynced=unsynced), None,
                        reports=len(starts))
    return {(rank, start): key for rank, start, key in got}


ORDERS = pytest.mark.parametrize("order", [rank_1_first, rank_0_opened_first], ids=["rank-1-first", "rank-0-first"])


@ORDERS
def test_ranks_agree_on_a_group_after_rank_0_ran_a_train_start_alone(order):
    """A Trainer with the callback on rank 0 only, then one with it on every rank (a notebook's cells): each process
    counted its own train starts, so rank 0's second agreed under keys that rank 1's first had used, and every later
    train start stood ungrouped (rank 0 waiting 5 s each time). Now the starts are rank 0's: the second is one group."""
    keys = agreed_keys([(0,), (0, 1)], order(1))
    assert keys[(0, 0)] == "" and keys[(1, 0)] is None, keys
    assert keys[(0, 1)] == keys[(1, 1)] and keys[(0, 1)].startswith("hf-"), keys


@ORDERS
def test_ranks_agree_on_a_group_after_rank_1_ran_a_train_start_alone(order):
    """As above, the callback on rank 1 only first: rank 1 waits for a start of rank 0's that never opens and goes
    alone having said nothing, so that rank 0's next start, with every rank, is one group (it waited 30 s at every
    later train start)."""
    keys = agreed_keys([(1,), (0, 1)], order(1))
    assert keys[(1, 0)] == "" and keys[(0, 0)] is None, keys
    assert keys[(0, 1)] == keys[(1, 1)] and keys[(0, 1)].startswith("hf-"), keys


def test_ranks_agree_at_each_train_start_whichever_comes_first():
    """Every rank at every train start: rank 1 before rank 0 opened it, then after; a group each, its own key."""
    keys = agreed_keys([(0, 1), (0, 1)], {r: rank_1_first(0)[r] + rank_0_opened_first(1)[r] for r in (0, 1)})
    assert keys[(0, 0)] == keys[(1, 0)] and keys[(0, 1)] == keys[(1, 1)], keys
    assert keys[(0, 0)].startswith("hf-") and keys[(0, 1)].startswith("hf-") and keys[(0, 0)] != keys[(0, 1)], keys


def test_a_rank_early_for_rank_0s_next_train_start_joins_that_one():
    """Rank 1 reads which start rank 0 is at while rank 0 is at one without it (its callback on rank 0 only), and rank
    0 decides that one and opens its next before rank 1 looks at it: rank 1 joins the next, one group."""
    gates = {0: [(0, "wait", r"/rank/", "test/opened0", "test/read"), (1, "wait", r"/rank/", "test/opened1", None)],
             1: [(1, "add", r"ftgov/gen$", None, "test/opened0"),
                 (1, "check", r"/group$", "test/read", "test/opened1")]}
    keys = agreed_keys([(0,), (0, 1)], gates, unsynced=(0,))
    assert keys[(0, 0)] == "" and keys[(0, 1)] == keys[(1, 1)] and keys[(0, 1)].startswith("hf-"), keys


def test_hf_trainer_ranks_with_no_process_group_and_no_key_are_told_how_to_form_one(node):
    """Ranks whose Trainer shares no torch.distributed process group (under torch_xla, accelerate counts the processes
    without one) under a launcher that sets no group key cannot be told that they are one run: each registered a job of
    its own, silently, and under tune=True their tuners fought. Each rank warns once, naming the group option; with it,
    the ranks form one group."""
    from functools import partial

    pytest.importorskip("transformers")
    from tests.support.ranks import hf_rank_without_process_group

    d = node("one")
    got = ranks_reports(hf_rank_without_process_group, d.socket, reports=2)
    warned = [r for r in got if r[1] == "warned"]
    assert [(rank, len(said)) for rank, _, said in warned] == [(0, 1), (1, 1)], warned
    for rank, _, (said,) in warned:
        assert f"rank {rank} of 2" in said and "GovernorCallback(group=...)" in said, said
    assert sorted(r for r in got if r[1] != "warned") == [(0, None, None, None, True), (1, None, None, None, True)]
    assert not re.search(r"group '[^']*' \(uid", d.log()), d.log()

    got = ranks_reports(partial(hf_rank_without_process_group, group="xla-run"), d.socket, reports=2)
    assert [(r[0], r[2]) for r in got if r[1] == "warned"] == [(0, []), (1, [])]
    assert_one_group_of_two(d, [r for r in got if r[1] != "warned"], "xla")


def test_rank_0s_tuner_learns_a_length_told_after_it_began_and_ends_its_search_on_it(tmp_path):
    """Rank 0's job tells its length after the group's tuner began (Job.set_total_steps, the callbacks' next run in
    one process): the tuner is re-priced over the steps left, as the daemon's are, and a length at its end ends the
    search at the next window, every rank given the choice. Before, rank 0's tuner took only the length its job knew
    when the tuner was made, and searched on for the assumed 2,000 steps."""
    import warnings

    from governor.client import GovernorWarning, Job
    from governor.client.group import GroupCoordinator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GovernorWarning)
        job = Job(dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
                  socket=str(tmp_path / "absent.sock"), group="g", rank=0, world_size=2).start()
    levels = [510_000_000, 1_005_000_000, 1_500_000_000, 1_980_000_000]
    job.registration = {"freq_hz": levels[-1], "levels_hz": levels}
    coordinator = GroupCoordinator(job, TwoRanks([]))

    def window(joules: float) -> list[float]:  # able, measured, energy_j, steps, seconds, compute_s, noise_rel
        return [1.0, 1.0, joules * 8, 8.0, 0.2, -1.0, 0.0]

    coordinator._decide([window(1.0)] * 2)  # the stretch before the first edge times the steps: the tuner begins
    for _ in range(20):
        job.step()
    coordinator.steps = job.steps  # as step() tells it, which this test, calling _decide, goes around
    converged, _stop, _done, _steps, *ranks = coordinator._decide([window(1.0)] * 2)
    assert coordinator.tuner is not None and not converged
    job.set_total_steps(5000)
    coordinator._decide([window(0.9)] * 2)
    assert coordinator.tuner.total_steps == 5000 - 20, coordinator.tuner.state()
    assert not coordinator.tuner.converged
    job.set_total_steps(21)  # cut short: one step left
    converged, _stop, _done, _steps, *ranks = coordinator._decide([window(0.8)] * 2)
    assert converged and ranks == [float(coordinator.tuner.best_hz)] * 2, (ranks, coordinator.tuner.state())


def test_a_rank_whose_store_wait_fails_oddly_still_takes_the_runs_word(monkeypatch):
    """Rank 1's wait for rank 0's word fails with something other than a timeout (a store of another torch): it must
    still read the word rank 0 set (compare_set), or rank 0 and the others would form a group without it, and a run
    across nodes would wait in collectives it never joins."""
    from governor.client import group

    class Store:
        def __init__(self):
            self.values = {group.GENERATION_KEY: b"1", "ftgov/1/open": b"1"}  # rank 0 is at its first train start

        def set(self, key, value):
            self.values[key] = value.encode()
            if key == "ftgov/1/rank/1":
                self.values["ftgov/1/group"] = b"key:hf-abc"  # rank 0's word, once rank 1 said it is there

        def add(self, key, amount):
            self.values[key] = str(int(self.values.get(key, b"0")) + amount).encode()
            return int(self.values[key])

        def check(self, keys):
            return all(key in self.values for key in keys)

        def wait(self, keys, timeout):
            raise ValueError("a store that fails its waits")

        def compare_set(self, key, expected, desired):
            if key not in self.values and expected == "":
                self.values[key] = desired.encode()
            return self.values[key]

    class Dist:
        def __init__(self, rank, store):
            self.rank, self.store = rank, store
            self.distributed_c10d = self

        def get_world_size(self):
            return 2

        def get_rank(self):
            return self.rank

        def _get_default_store(self):
            return self.store

    store = Store()
    monkeypatch.setattr(group, "torch_distributed", lambda: Dist(1, store))
    assert group.shared_run_key("hf", None) == "hf-abc"
    # Rank 0's first start decided, its next not opened: the wait for that opening fails as oddly; rank 1 goes alone
    # having said nothing there.
    assert group.shared_run_key("hf", None) == group.NO_GROUP
    assert not any(key.startswith("ftgov/2/") for key in store.values), store.values
