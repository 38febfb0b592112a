"""What a job's phase reports cost the daemon: the real ftgovd on the fake Orin tree (tmpfs), policy tune, one job
whose loop runs 40 steps a second (25 ms a step) through the real client (governor.Job, report_every_s 0.1), with and
without a `data` phase reported around each batch's loading (job.phase("data"), 5 ms, then job.phase("train"), as
governor/daemon/phases.py describes), each phase change a progress notification of its own.

    python -m benchmarks.phase_cost [--seconds 15] [--runs 5] [--no-doc]

Each run measures both loops, each against a fresh daemon: its CPU time (user + system, psutil) over ``--seconds``
after a warm-up, while the loop runs; the notifications the client sent in that time (its connection's count of those
it wrote, a report dropped while the daemon is busy not counted). The cost of one phase notification is the
difference in the daemon's CPU over the difference in notifications a second. Target (the sampler's, issue 23): at
most 1% of a core while jobs run. Prints, and writes its own section of docs/benchmarks.md ("phase-cost").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.figures import machine, publish
from benchmarks.sampler_cost import cpu_s
from governor.sim import tree
from governor.sim.launch import FEATURES, Daemon

REPO = Path(__file__).resolve().parent.parent
STEP_S = 0.025
DATA_S = 0.005
WARM_S = 3.0


def one_loop(seconds: float, phases: bool) -> tuple[float, float]:
    """(the daemon's CPU as a share of a core, the client's notifications a second) over ``seconds`` of the loop."""
    import governor

    base = Path(tempfile.mkdtemp(prefix="ftgp", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        root = tree.build(base / "root", "jp6").root
        d = Daemon(root, workdir=base, config={"model_file": str(REPO / "model" / "paper-tree.json"),
                                               "policy": "tune"},
                   test_config=False, log_level="info")
        d.start(timeout_s=30)
        try:
            ps = psutil.Process(d.proc.pid)
            with governor.job(**FEATURES, socket=d.socket, name="phase-cost") as job:
                sent = [0]
                notify = job._conn.notify

                def counted(method, **params):
                    ok = notify(method, **params)
                    sent[0] += bool(ok)
                    return ok

                job._conn.notify = counted
                deadline = start = time.monotonic()
                measured = None
                while True:
                    now = time.monotonic()
                    if measured is None and now - start >= WARM_S:
                        measured = (cpu_s(ps), now, sent[0])
                    if measured is not None and now - measured[1] >= seconds:
                        break
                    if phases:
                        job.phase("data")
                        deadline += DATA_S
                        time.sleep(max(0.0, deadline - time.monotonic()))  # the batch's loading
                        job.phase("train")
                        deadline += STEP_S - DATA_S
                    else:
                        deadline += STEP_S
                    time.sleep(max(0.0, deadline - time.monotonic()))  # the step's compute
                    job.step()
                job._conn.call("ping")  # every notification handled
                cpu, end = cpu_s(ps), time.monotonic()
                assert measured is not None
                return (cpu - measured[0]) / (end - measured[1]), (sent[0] - measured[2]) / (end - measured[1])
        finally:
            d.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    plain, phased = [], []
    for _ in range(args.runs):
        plain.append(one_loop(args.seconds, False))
        phased.append(one_loop(args.seconds, True))
        print(plain[-1], phased[-1], file=sys.stderr)
    per_ms = [1000 * (c1 - c0) / (n1 - n0) for (c0, n0), (c1, n1) in zip(plain, phased, strict=True)]
    extra = [c1 - c0 for (c0, _), (c1, _) in zip(plain, phased, strict=True)]

    def row(name: str, runs: list[tuple[float, float]]) -> str:
        return (f"| {name} | {' / '.join(f'{100 * c:.2f}%' for c, _ in runs)} "
                f"| {' / '.join(f'{n:.1f}' for _, n in runs)} |")

    lines = ["## What a job's phase reports cost the daemon", "",
             f"`python -m benchmarks.phase_cost --seconds {args.seconds:g} --runs {args.runs}` on {machine()}: the "
             "real daemon on the fake Orin tree (tmpfs), policy tune, one job whose loop runs "
             f"{1 / STEP_S:.0f} steps a second through the real client (report_every_s 0.1), with and without `data` "
             f"reported around each batch's loading ({1000 * DATA_S:g} ms); a fresh daemon for each loop, "
             f"{args.runs} runs of each, {args.seconds:g} s measured after {WARM_S:g} s. The daemon's CPU time "
             "(psutil), and the progress notifications the client sent.", "",
             "| loop | daemon CPU, % of a core, per run | notifications a second, per run |", "|---|---|---|",
             row("steps only", plain), row("`data` around each batch", phased), "",
             f"- The phase reports add {' / '.join(f'{100 * e:.2f}%' for e in extra)} of a core "
             f"(median {100 * statistics.median(extra):.2f}%): "
             f"{' / '.join(f'{m:.3f}' for m in per_ms)} ms of the daemon's CPU per notification "
             f"(median {statistics.median(per_ms):.3f} ms).", ""]
    publish("phase-cost", "\n".join(lines), doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
