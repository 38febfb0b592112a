"""The measured saving of tuned jobs through the real daemon on the simulated Orin, against the energy model's truth.

Each job registers with the `tune` policy and its length (total_steps), runs simulated steps (governor.sim.job: a
step takes as long as the energy model says at the pinned clock, times --time-scale) until the tuner has converged and
--tail steps more have run at the chosen level, then unregisters. The daemon's answer carries the saving per step it
measured against its baseline window at the default governor; the table sets it beside the energy model's (noise
free) saving of the converged level against MAXN, and the windows the search used.

    python -m benchmarks.bench_saving [--jobs 8] [--time-scale 0.3] [--tail 50]

Prints the table and writes it to docs/benchmarks.md ("saving").

Takes about 110 s on a 2-core VM. The measured figure carries the simulated rails' integration over a sleeping
process: wall-clock jitter of a few ms per step, more under CPU contention.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.figures import machine, write_section
from governor.sim import job as simjob
from governor.sim.energy import OrinEnergyModel, Workload
from governor.sim.launch import Daemon, scaled
from governor.sysfs import Root

WORKLOADS = (
    Workload(name="bert-base/seq40", model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0),
    Workload(name="distilbert/seq64", model_type="encoder", num_layers=6, hidden_size=768, seq_len=64.0),
    Workload(name="bert-large/seq32", model_type="encoder", num_layers=24, hidden_size=1024, seq_len=32.0),
    Workload(name="bert-small/seq20", model_type="encoder", num_layers=4, hidden_size=512, seq_len=20.0),
    Workload(name="gpt2/seq128", model_type="decoder", num_layers=12, hidden_size=768, seq_len=128.0),
    Workload(name="gpt2-medium/seq64", model_type="decoder", num_layers=24, hidden_size=1024, seq_len=64.0),
    Workload(name="pythia-160m/seq256", model_type="decoder", num_layers=12, hidden_size=768, seq_len=256.0),
    Workload(name="tiny-decoder/seq48", model_type="decoder", num_layers=6, hidden_size=512, seq_len=48.0),
)


class _Done(Exception):
    pass


class TunedJob:
    """Reports every step; stops the simulated job ``tail`` steps after the tuner converged."""

    def __init__(self, rpc, job_id: int, tail: int):
        self.rpc, self.job_id, self.tail, self.steps = rpc, job_id, tail, 0
        self.converged_at: int | None = None
        self.tuner: dict | None = None

    def step(self) -> None:
        self.steps += 1
        self.rpc.notify("progress", job_id=self.job_id, steps=self.steps)
        if self.converged_at is None and self.steps % 5 == 0:
            self.tuner = self.rpc.call("status")["jobs"][0]["tuner"]
            if self.tuner["converged"]:
                self.converged_at = self.steps
        if self.converged_at is not None and self.steps >= self.converged_at + self.tail:
            raise _Done


def run_job(d: Daemon, w: Workload, model: OrinEnergyModel, args) -> dict:
    c = d.client()
    util = round(model.expected(w, None).gpu_util_pct, 1)
    res = c.call("register", tune=True, name=w.name, model_type=w.model_type, num_layers=w.num_layers,
                 hidden_size=w.hidden_size, seq_len=w.seq_len, gpu_util=util, total_steps=args.total_steps)
    job = TunedJob(c, res["job_id"], args.tail)
    try:
        simjob.run(Root(d.state_dir / "sim-orin"), job, w, args.max_steps, time_scale=args.time_scale)
    except _Done:
        pass
    end = c.call("unregister", job_id=res["job_id"])
    c.close()
    energy = {hz: model.expected(w, hz).energy_j for hz in model.levels_hz}
    maxn = model.expected(w, None).energy_j
    best = end["freq_hz"]
    oracle = min(energy, key=energy.get)
    return {"workload": w.name, "start_hz": res["freq_hz"], "freq_hz": best, "oracle_hz": oracle,
            "measured_pct": end.get("saved_pct"), "measured_steps": end.get("saved_measured_steps"),
            "true_pct": 100 * (1 - energy[best] / maxn), "oracle_pct": 100 * (1 - energy[oracle] / maxn),
            "windows": job.tuner["probes"] if job.tuner else None, "converged": job.converged_at is not None}


def section(lines: list[str], jobs: int, args) -> str:
    """docs/benchmarks.md's "saving" section: the table's lines, what was run, on what."""
    return (f"## Measured saving of tuned jobs\n\n`python -m benchmarks.bench_saving --jobs {args.jobs}` (`make bench`"
            f" runs 8): {jobs} tuned jobs of {args.total_steps} registered steps through the real daemon on the "
            f"simulated Orin, each run until the tuner converged and {args.tail} steps more (time scale "
            f"{args.time_scale:g}). The saving each job's `unregister` reports, measured against its window at the "
            "default governor, beside the energy model's noise-free saving at the converged level and at the "
            f"optimum. Machine: {machine()}.\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=len(WORKLOADS))
    p.add_argument("--time-scale", type=float, default=0.3, help=(
        "wall time per simulated second; below 0.3 the sleep jitter of short steps skews the measured saving"))
    p.add_argument("--tail", type=int, default=50, help="steps run at the chosen level after convergence")
    p.add_argument("--total-steps", type=int, default=2000, help="the job length each job registers with")
    p.add_argument("--max-steps", type=int, default=400, help="a job that has not converged by then stops")
    args = p.parse_args(argv)
    model = OrinEnergyModel()
    t0 = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ftgov-saving-") as work:
        d = Daemon(None, workdir=Path(work), simulate=True, log_level="info", config=scaled(args.time_scale)).start()
        try:
            for i in range(args.jobs):
                rows.append(run_job(d, WORKLOADS[i % len(WORKLOADS)], model, args))
        finally:
            d.close()
    lines = ["| workload | start MHz | converged MHz (optimum) | measured saving vs default governor (over N steps) "
             "| model's true saving (at the optimum) | windows |", "|---|---|---|---|---|---|"]
    for r in rows:
        measured = "none" if r["measured_pct"] is None else f"{r['measured_pct']:.1f}% ({r['measured_steps']})"
        lines.append(f"| {r['workload']} | {r['start_hz'] / 1e6:g} | {r['freq_hz'] / 1e6:g} ({r['oracle_hz'] / 1e6:g}) "
                     f"| {measured} | {r['true_pct']:.1f}% ({r['oracle_pct']:.1f}%) | {r['windows']}"
                     f"{'' if r['converged'] else ' (not converged)'} |")
    errors = [r["measured_pct"] - r["true_pct"] for r in rows if r["measured_pct"] is not None]
    if errors:
        lines += ["", f"Measured - true saving over {len(errors)} jobs: mean {sum(errors) / len(errors):+.2f} points, "
                  f"largest {max(errors, key=abs):+.2f} points."]
    print("\n".join(lines))
    print(f"{len(rows)} jobs in {time.monotonic() - t0:.0f} s (time scale {args.time_scale:g})", file=sys.stderr)
    print(f"wrote {write_section('saving', section(lines, len(rows), args))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
