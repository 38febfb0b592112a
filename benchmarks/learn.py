"""Proof on the simulator that the board's measurement store teaches the tree (`make learn`, a few minutes).

The board: the simulated Orin with a different calibration of the energy model (BOARD below: a GPU whose voltage floor
holds up to 900 MHz, as another speed bin or DVFS table might; invented for the proof, unverified on hardware). The
shipped tree (model/mlg-tree.json) was trained on the default calibration, so on this board it is wrong by a level
or two, as a real board's tree would be. The daemon's decisions start from it.

A stream of tuned jobs runs on the board: each is a workload from a pool of the board's users' jobs (every model of
the catalogue at a few sequence lengths, none of them a held-out workload), starting at the tree's pick, tuned by the
daemon's OnlineTuner through a TuningSession on the noisy board model, exactly the windows the daemon would measure.
Each job is recorded through the daemon's own StoreWriter (the writer thread and Store.add it uses). After 0, 10,
25, 50, 100 and 200 jobs the tree is retrained from the store (governor.pipeline.retrain, the `ftgov model retrain`
code) and scored on the 60 held-out workloads (governor.pipeline.workloads.held_out_workloads) against the board's
noise-free energies: MLG's regret (energy at its pick over the optimum), and the tuner's, started from that tree.

Feeding the store directly instead of through a running daemon is a matter of speed (200 jobs in seconds); the daemon
end of the path (a tuned job landing in the store) is tests/daemon/test_store_daemon.py.

    PYTHONPATH=. python benchmarks/learn.py [--out out/learn] [--jobs 200] [--seed 0]

Writes learn.csv, learn.md (the README table) and learn.png (regret against jobs in the store).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from governor.backends.base import nearest_level  # noqa: E402
from governor.daemon.config import TunerConfig  # noqa: E402
from governor.daemon.store import JobRecord, StoreWriter, Window, measured_saving  # noqa: E402
from governor.features import Features  # noqa: E402
from governor.pipeline import dataset, retrain  # noqa: E402
from governor.pipeline.workloads import MODELS, held_out_workloads, make_workload  # noqa: E402
from governor.policy.tree import DecisionTree  # noqa: E402
from governor.policy.tuner import OnlineTuner, TuningSession  # noqa: E402
from governor.sim.energy import Calibration, OrinEnergyModel, Workload  # noqa: E402

BOARD = dataclasses.replace(Calibration(), knee_hz=900e6, v_floor=0.70, v_curve_exponent=2.2)
CHECKPOINTS = (0, 10, 25, 50, 100, 200)
JOB_STEPS = 2000
SEQ_LENS_PER_MODEL = 4
NOISE = 1.0  # the energy model's nominal noise, as in ftgov evaluate and bench_tuner


def features_of(board: OrinEnergyModel, w: Workload) -> Features:
    """What the daemon sees at register: the job's shape and its GPU load under the default governor."""
    return Features(model_type=w.model_type, num_layers=w.num_layers, hidden_size=w.hidden_size, seq_len=w.seq_len,
                    gpu_util=round(board.expected(w, None).gpu_util_pct, 1))


def user_pool(seed: int) -> list[Workload]:
    """The board's users' workloads: every model at a few sequence lengths drawn log-uniformly in 10..90 tokens."""
    rng = random.Random(seed)
    pool = []
    for m in MODELS:
        for k in range(SEQ_LENS_PER_MODEL):
            seq = round(math.exp(rng.uniform(math.log(10), math.log(90))), 1)
            w = make_workload(m, "sst2")
            pool.append(dataclasses.replace(w, name=f"{m.name}/seq{seq:g}", seq_len=seq))
    return pool


def tuned_job(w: Workload, start_hz: int, seed: int, cfg: TunerConfig) -> tuple[list[Window], int, float, float]:
    """One tuned job on the noisy board model: its windows, converged level, energy and time of JOB_STEPS steps."""
    model = OrinEnergyModel(noise=NOISE, seed=seed, calibration=BOARD)
    tuner = OnlineTuner(model.levels_hz, start_hz, cfg.max_slowdown, noise_rel=cfg.noise_rel,
                        max_probes=cfg.max_probes)
    session = TuningSession(tuner, steps=0, warmup_steps=cfg.warmup_steps, window_steps=cfg.window_steps)
    windows, energy_j, time_s, step = [], 0.0, 0.0, 0
    while not session.converged and step < JOB_STEPS:
        step += 1
        s = model.step(w, session.level_hz)
        energy_j, time_s = energy_j + s.energy_j, time_s + s.time_s
        m = session.on_progress(step, energy_j, time_s)
        if m is not None:
            windows.append(Window(m.level_hz, m.joules_per_step, m.seconds_per_step, m.measured_steps))
    rest = model.expected(w, tuner.best_hz)  # the rest of the job at the converged level
    return windows, tuner.best_hz, energy_j + (JOB_STEPS - step) * rest.energy_j, time_s + (JOB_STEPS - step) * rest.time_s


def record(w: Workload, f: Features, windows: list[Window], start_hz: int, best_hz: int, energy_j: float,
           time_s: float, i: int, tree_id: str) -> JobRecord:
    windows = [dataclasses.replace(x, gpu_util=f.gpu_util) for x in windows]
    saved, basis = measured_saving(windows, best_hz, start_hz)
    return JobRecord(ended_at=1.7e9 + 3600.0 * i, duration_s=time_s, boot_id="sim", daemon_job_id=i + 1, uid=1000,
                     name=w.name, model_type=f.model_type, num_layers=f.num_layers, hidden_size=f.hidden_size,
                     seq_len=f.seq_len, gpu_util=f.gpu_util, board_model="NVIDIA Jetson AGX Orin Developer Kit",
                     l4t_release="# R36 (release), REVISION: 4.3 (simulated board B)", backend="devfreq",
                     gpu_name="17000000.gpu", model_version=tree_id, model_source="trained", policy="tune",
                     freq_hz=best_hz, reason="tune: converged", steps=JOB_STEPS, energy_j=energy_j,
                     start_hz=start_hz, converged=True, saved_rel=saved, saved_basis=basis, ended="unregistered",
                     windows=tuple(windows))


def held_out_regret(decide, board: OrinEnergyModel, cfg: TunerConfig, seed: int) -> dict:
    """Mean and max regret (%) of MLG's pick and of the tuner started from it, on the held-out workloads."""
    mlg, tune = [], []
    for i, w in enumerate(held_out_workloads()):
        e = {hz: board.expected(w, hz).energy_j for hz in board.levels_hz}
        opt = min(e.values())
        pick = decide(features_of(board, w))
        mlg.append(100 * (e[pick] / opt - 1))
        windows, best, energy_j, _ = tuned_job(w, pick, 7919 * i + seed, cfg)
        tune.append(100 * (energy_j / (JOB_STEPS * opt) - 1))  # the whole job, exploration counted
    return {"mlg_mean": statistics.mean(mlg), "mlg_max": max(mlg), "tune_mean": statistics.mean(tune),
            "tune_max": max(tune)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "out" / "learn")
    p.add_argument("--jobs", type=int, default=CHECKPOINTS[-1])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="joblib workers for retraining's LOOCV")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    board = OrinEnergyModel(calibration=BOARD)
    cfg = TunerConfig()
    sweeps = dataset.load(REPO / "model" / "data" / "characterization.csv")
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    paper = DecisionTree.load(REPO / "model" / "paper-tree.json")
    levels = board.levels_hz
    start_decide = retrain.tree_decider(shipped, levels)
    pool = user_pool(args.seed)
    rng = random.Random(args.seed + 1)
    store_path = Path(tempfile.mkdtemp(prefix="ftgov-learn-")) / "measurements.sqlite"
    writer = StoreWriter(store_path)
    rows = []
    baseline = {"paper": held_out_regret(retrain.tree_decider(paper, levels), board, cfg, args.seed),
                "shipped": held_out_regret(start_decide, board, cfg, args.seed)}
    checkpoints = [c for c in CHECKPOINTS if c <= args.jobs]
    done = 0
    for n in checkpoints:
        while done < n:
            w = rng.choice(pool)
            f = features_of(board, w)
            start = start_decide(f)
            windows, best, energy_j, time_s = tuned_job(w, start, 104729 * done + args.seed, cfg)
            writer.submit(record(w, f, windows, start, best, energy_j, time_s, done, "shipped"))
            done += 1
        writer.join_queue()
        from governor.daemon import store as store_mod

        conn = store_mod.open_read_only(store_path)
        records = store_mod.read_jobs(conn)
        conn.close()
        result = retrain.retrain(records, sweeps, args.seed, shipped, args.workers)
        tree_path = args.out / f"tree-{n}.json"
        retrain.export_tree(result, tree_path, {"benchmark": "benchmarks/learn.py", "jobs": n})
        tree = DecisionTree.load(tree_path)  # the daemon's reader, as the reloaded daemon would decide
        scores = held_out_regret(retrain.tree_decider(tree, levels), board, cfg, args.seed)
        r = result.report
        rows.append({"jobs": n, "labelled": r["labelled_curves"], **{k: round(v, 3) for k, v in scores.items()},
                     "board_before": (r["before"] or {}).get("mean_regret_pct"),
                     "board_after": r["after"]["mean_regret_pct"], "loocv_regret": r["loocv_mean_regret_pct"]})
        print(f"{n:4d} jobs, {r['labelled_curves']:3d} labelled: held-out MLG {scores['mlg_mean']:.2f}% "
              f"(max {scores['mlg_max']:.1f}%), tuner from it {scores['tune_mean']:.2f}%  "
              f"[{time.monotonic() - t0:.0f} s]", file=sys.stderr)
    writer.close()
    _write(args.out, rows, baseline)
    last = rows[-1]
    ok = last["mlg_mean"] < baseline["shipped"]["mlg_mean"]
    print(f"retrained MLG {last['mlg_mean']:.2f}% vs shipped MLG {baseline['shipped']['mlg_mean']:.2f}% on the "
          f"held-out workloads: {'better' if ok else 'NOT better'}; store {store_path}", file=sys.stderr)
    return 0 if ok else 1


def _write(out: Path, rows: list[dict], baseline: dict) -> None:
    import csv

    with (out / "learn.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    lines = ["| jobs in the store | labelled workloads | MLG regret, held-out (mean / max) | tuner from that tree "
             "(whole job) |", "|---:|---:|---:|---:|"]
    for name, b in (("paper tree", baseline["paper"]), ("shipped tree", baseline["shipped"])):
        lines.append(f"| {name} | - | {b['mlg_mean']:.2f}% / {b['mlg_max']:.1f}% | {b['tune_mean']:.2f}% |")
    for r in rows:
        lines.append(f"| {r['jobs']} | {r['labelled']} | {r['mlg_mean']:.2f}% / {r['mlg_max']:.1f}% | "
                     f"{r['tune_mean']:.2f}% |")
    (out / "learn.md").write_text("\n".join(lines) + "\n")
    (out / "learn.json").write_text(json.dumps({"rows": rows, "baseline": baseline}, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    xs = [max(r["jobs"], 1) for r in rows]
    ax.plot(xs, [r["mlg_mean"] for r in rows], "o-", label="MLG, retrained tree")
    ax.plot(xs, [r["tune_mean"] for r in rows], "s-", label="tuner from the retrained tree")
    ax.axhline(baseline["shipped"]["mlg_mean"], color="C3", ls="--", label="MLG, shipped tree")
    ax.axhline(baseline["paper"]["mlg_mean"], color="C7", ls=":", label="MLG, paper tree")
    ax.set_xscale("log")
    ax.set_xlabel("tuned jobs in the board's store (0 plotted at 1)")
    ax.set_ylabel("mean energy regret, held-out (%)")
    ax.set_title("Simulated board B: the store teaches the tree")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learn.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
