"""Job groups' figures (issue 25): what coordinating a group costs, and what trimming the ranks that wait saves.

- Registration: each rank's `register` on the real daemon (fake NVML GPUs, one per rank, one connection per rank),
  as a rank of one group and as a plain job, at 4, 16 and 64 ranks.
- Coordination per tuning window, rank 0's side (governor.client.group.GroupCoordinator): with real torch.distributed
  (gloo, CPU) processes, ranks spread over ftgovd instances of 4 fake GPUs each ("nodes"); and with simulated ranks,
  rank 0 alone against a stand-in for the collectives that hands it the other ranks' windows, which isolates its own
  work (the reads of its daemon at the window's edges and inside it, set_level, the tuner) from the network.
  Bytes: what each collective carries.
- The trim (governor.policy.trim) on simulated groups whose GPUs' speeds differ as SC'22 measured
  (governor.sim.groups): energy per step against one level for the whole group, and the step time's change.

    python -m benchmarks.bench_groups [--runs N] [--gloo-ranks 4 16] [--no-doc]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from benchmarks.figures import machine, markdown_table, pct, publish
from governor.client.group import SUB_WINDOWS
from governor.policy.trim import Trimmer
from governor.sim.groups import MAX_SPREAD_REL, MEAN_SPREAD_REL, SimGroup, gpu_speeds
from governor.sim.launch import FEATURES, Daemon, Rpc

REPO = Path(__file__).resolve().parents[1]
FAKENVML_DIR = REPO / "tests" / "support" / "fakenvml"
H200_LEVELS_HZ = [mhz * 1_000_000 for mhz in range(345, 1981, 15)]
# 16 levels: rank 0's tuner runs some windows before it converges.
TUNE_LEVELS_MHZ = list(range(1980, 1004, -65))
RANKS_PER_NODE = 4


def start_node(workdir: Path, gpus: int, levels_mhz: list[int] | None = None) -> Daemon:
    spec = workdir / "fakenvml.json"
    gpu = {"util_gpu_pct": 80, "meter_update_s": 0}
    if levels_mhz is not None:
        gpu["graphics_clocks_mhz"] = {"3201": levels_mhz}
    spec.write_text(json.dumps({"gpus": [dict(gpu) for _ in range(gpus)]}))
    env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
    config = {"backend": "nvml", "policy": "tune", "limits": {
        "repin_interval_s": 0.01, "max_connections_per_uid": 256, "max_jobs_per_connection": 4,
        "max_jobs_per_uid": 1024, "max_jobs": 1024, "registrations_per_s": 1e6, "registration_burst": 100000},
        # The windows' rule scaled to the ranks' steps of well under a ms (the defaults' 1-10 s windows would make a
        # run of 200 windows last minutes): the cost of a window is counted, not its length.
        "tuner": {"window_min_s": 0.02, "window_max_s": 0.05, "window_min_updates": 0}}
    return Daemon(workdir / "no-jetson", workdir=workdir, config=config, env=env, log_level="info").start()


# ---- registration -------------------------------------------------------------------------------------------------

def registration_cost(ranks: int, runs: int, tmp: Path) -> dict[str, list[float]]:
    """Seconds per `register` (send to reply), as a group's rank and as a plain job, ``runs`` times ``ranks``."""
    workdir = Path(tempfile.mkdtemp(prefix="ftgb", dir=tmp))
    d = start_node(workdir, ranks)
    out: dict[str, list[float]] = {"group": [], "plain": []}
    try:
        for run in range(runs):
            for kind in ("group", "plain"):
                conns = [Rpc(d.socket) for _ in range(ranks)]
                for rank, c in enumerate(conns):
                    extra = {"group": f"run-{run}", "rank": rank, "world_size": ranks} if kind == "group" else {}
                    began = time.perf_counter()
                    c.call("register", gpu=rank, **FEATURES, **extra)
                    out[kind].append(time.perf_counter() - began)
                for c in conns:
                    c.close()
                d.wait_jobs(0)
    finally:
        d.close()
    return out


# ---- coordination: simulated ranks --------------------------------------------------------------------------------

class SimulatedCollectives:
    """torch.distributed as rank 0 of ``world_size`` sees it, the other ranks simulated: all_gather hands back their
    windows (rank 0's own, copied), broadcast is rank 0's own. No network: rank 0's own work only."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def get_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return self.world_size

    def get_backend(self) -> str:
        return "gloo"

    def all_gather(self, gathered, mine) -> None:
        for t in gathered:
            t.copy_(mine)

    def broadcast(self, tensor, src: int) -> None:
        pass


def simulated_coordination(ranks: int, windows: int, tmp: Path) -> list[float]:
    """Rank 0's seconds per window at ``ranks`` simulated ranks, against a real daemon (its own rank's job)."""
    import governor
    from governor.client.group import GroupCoordinator

    workdir = Path(tempfile.mkdtemp(prefix="ftgc", dir=tmp))
    d = start_node(workdir, 1, TUNE_LEVELS_MHZ)
    costs: list[float] = []
    try:
        while len(costs) < windows:
            job = governor.job(**FEATURES, tune=True, gpu=0, socket=d.socket, group="sim", rank=0,
                               world_size=ranks)
            with job:
                coordinator = GroupCoordinator(job, SimulatedCollectives(ranks))
                while not coordinator.done and len(costs) + len(coordinator.window_costs_s) < windows:
                    job.step()
                    coordinator.step(job.steps)
                costs += coordinator.window_costs_s
    finally:
        d.close()
    return costs[:windows]


# ---- coordination: real gloo processes ----------------------------------------------------------------------------

def gloo_rank(rank: int, world_size: int, port: int, socket: str, results) -> None:
    """One rank of a run across nodes: train (a little compute and an all-reduce a step) until the group's tuning is
    done; report rank 0's coordinator figures."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(min(RANKS_PER_NODE, world_size // 2)),
                      TORCHELASTIC_RUN_ID="bench")
    import torch
    import torch.distributed as dist

    import governor

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=300))
    a = torch.rand(64, 64)
    grad = torch.ones(256)
    per_node = min(RANKS_PER_NODE, world_size // 2)
    job = governor.job(**FEATURES, tune=True, gpu=rank % per_node, socket=socket)
    with job:
        for _ in range(20_000):
            a = torch.tanh(a @ a)
            dist.all_reduce(grad)
            job.step()
            if job.coordinator is not None and job.coordinator.done:
                break
        c = job.coordinator
        results.put((rank, None if c is None else (c.window_costs_s, c.bytes_sent, c.windows, c.status)))
    results.close()
    results.join_thread()
    os._exit(0)


def gloo_coordination(ranks: int, tmp: Path) -> dict:
    import socket as socketlib

    per_node = min(RANKS_PER_NODE, ranks // 2)
    nodes = [start_node(Path(tempfile.mkdtemp(prefix="ftgn", dir=tmp)), per_node, TUNE_LEVELS_MHZ)
             for _ in range(ranks // per_node)]
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=gloo_rank, args=(r, ranks, port, nodes[r // per_node].socket, results))
             for r in range(ranks)]
    try:
        for p in procs:
            p.start()
        got = dict(results.get(timeout=600) for _ in range(ranks))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        for d in nodes:
            d.close()
    costs, sent0, windows, status = got[0]
    return {"costs": costs, "rank0_bytes": sent0, "other_bytes": got[1][1], "windows": windows, "status": status}


# ---- the trim ----------------------------------------------------------------------------------------------------

def trim_runs(ranks: int, runs: int) -> dict[str, list[float]]:
    """Per simulated group: the energy saved against one level (%), the step time's change (%), windows."""
    out: dict[str, list[float]] = {"saved_pct": [], "slowdown_pct": [], "windows": []}
    for seed in range(runs):
        rng = random.Random(seed * 1000 + ranks)
        group = SimGroup(gpu_speeds(ranks, rng), H200_LEVELS_HZ, rng=rng)
        level = group.best_single_level()
        t = Trimmer(H200_LEVELS_HZ, level, list(range(ranks)))
        while not t.done and t.windows < 100_000:
            t.observe(*group.window([t.level_of(r) for r in range(ranks)]))
        final = [t.level_of(r) for r in range(ranks)]
        one = [level] * ranks
        out["saved_pct"].append(100.0 * (1.0 - group.energy_j(final) / group.energy_j(one)))
        out["slowdown_pct"].append(100.0 * (group.step_s(final) / group.step_s(one) - 1.0))
        out["windows"].append(t.windows)
    return out


# ---- the section --------------------------------------------------------------------------------------------------

def us(values: list[float], p: float) -> str:
    return f"{1e6 * pct(values, p):.0f}"


def ms(values: list[float], p: float) -> str:
    return f"{1e3 * pct(values, p):.2f}"


def section(args, registration, simulated, gloo, trims) -> str:
    lines = ["## Job groups", "",
             f"`python -m benchmarks.bench_groups --runs {args.runs} --windows {args.windows} --gloo-ranks "
             f"{' '.join(map(str, args.gloo_ranks))} --trim-runs {args.trim_runs}` on {machine()}, "
             "the real daemon on fake NVML GPUs (one per rank).", "",
             f"Registration: one `register` per rank, each on its own connection, send to reply; {args.runs} run(s) "
             "of every rank, as one group's ranks and as plain jobs.", ""]
    rows = [(n, len(registration[n]["group"]), us(registration[n]["group"], 50), us(registration[n]["group"], 99),
             us(registration[n]["plain"], 50), us(registration[n]["plain"], 99)) for n in sorted(registration)]
    lines += markdown_table(("ranks", "registrations", "group p50 us", "group p99 us", "plain p50 us",
                             "plain p99 us"), rows)
    lines += ["", "Coordination per tuning window, on rank 0 (governor.client.group): its reads of its daemon "
              f"(job_energy: the window's two edges and {SUB_WINDOWS - 1} inside it), the all_gather, the tuner, "
              "the broadcast and its set_level. Simulated ranks: rank 0 "
              "alone, the other ranks' windows handed to it without a network (its own work). gloo: real processes "
              f"on this machine's CPUs, {RANKS_PER_NODE} ranks to an ftgovd (2 to one at 4 ranks), until the tuner "
              "converged; its time includes waiting in the collectives for the last rank to reach the window's end "
              "(with more processes than CPUs, mostly scheduling). While the search runs, each read inside a window "
              "is a collective too (early_close: an all_gather of 5 float64 a rank and rank 0's verdict, one "
              "float64), so that a window clearly worse than the tuner's reference closes there: on gloo, with "
              "every rank waiting for the slowest at each, they are most of the time. Bytes at a window's end: each "
              "rank sends 7 float64 (56 B) to the all_gather and receives the others' (56 B x (ranks - 1)); rank 0 "
              "broadcasts 5 + ranks float64 (the flags, the next window's steps, each rank's level); the whole run's "
              "column counts the reads inside too.", ""]
    rows = []
    for n in sorted(simulated):
        rows.append((n, "simulated", len(simulated[n]), ms(simulated[n], 50), ms(simulated[n], 99),
                     56 * (n - 1) + 8 * (5 + n), "-"))
    for n in sorted(gloo):
        g = gloo[n]
        rows.append((n, "gloo", len(g["costs"]), ms(g["costs"], 50), ms(g["costs"], 99),
                     56 * (n - 1) + 8 * (5 + n), f"{g['rank0_bytes']} / {g['other_bytes']}"))
    lines += markdown_table(("ranks", "collectives", "windows", "rank 0 p50 ms", "rank 0 p99 ms",
                             "bytes into a rank but 0, a window", "bytes sent, rank 0 / rank 1, whole run"), rows)
    lines += ["", f"The trim on simulated groups (governor.sim.groups): GPUs slower than the fastest by "
              f"{100 * MEAN_SPREAD_REL:.0f}% on average and under {100 * MAX_SPREAD_REL:.0f}% (SC'22), compute 80% "
              "clock-bound, 10 ms collective, H200 table (15 MHz steps), 0.2% step-time noise a window, the trim's "
              "0.3% tolerance; the group's "
              f"level is its least-energy single level. {args.trim_runs} groups of each size (seeded). Saving: energy "
              "per step against that level on every rank; slowdown: the true step time's change.", ""]
    rows = []
    for n in sorted(trims):
        t = trims[n]
        rows.append((n, len(t["saved_pct"]), f"{statistics.mean(t['saved_pct']):.2f}",
                     f"{min(t['saved_pct']):.2f}", f"{statistics.mean(t['slowdown_pct']):.2f}",
                     f"{pct(t['slowdown_pct'], 99):.2f}", f"{statistics.median(t['windows']):.0f}"))
    lines += markdown_table(("ranks", "groups", "saved mean %", "saved min %", "slowdown mean %", "slowdown p99 %",
                             "windows to done, median"), rows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--runs", type=int, default=3, help="registration runs at each size")
    p.add_argument("--windows", type=int, default=200, help="simulated-rank windows at each size")
    p.add_argument("--gloo-ranks", type=int, nargs="*", default=[4, 16])
    p.add_argument("--trim-runs", type=int, default=100)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ftgbench") as tmp_dir:  # the daemons' trees and sockets, removed after
        tmp = Path(tmp_dir)
        registration = {n: registration_cost(n, args.runs, tmp) for n in args.ranks}
        print("registration done", file=sys.stderr)
        simulated = {n: simulated_coordination(n, args.windows, tmp) for n in args.ranks}
        print("simulated coordination done", file=sys.stderr)
        gloo = {n: gloo_coordination(n, tmp) for n in args.gloo_ranks}
        print("gloo coordination done", file=sys.stderr)
    trims = {n: trim_runs(n, args.trim_runs) for n in args.ranks}
    publish("groups", section(args, registration, simulated, gloo, trims), doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
