"""What the rails' sampler costs: the real ftgovd on the fake Orin tree (INA3221 rails, update_interval 140 ms) in
tmpfs, its CPU time (user + system, psutil) over a stretch while jobs are held and over one while none is.

    python -m benchmarks.sampler_cost [--seconds 20] [--jobs 4] [--runs 3] [--no-doc]

While jobs run the daemon's whole CPU time is measured (the sampler, the 1 s tick, the watchdog, the loop): an upper
bound of the sampler's share. With no job the sampler is not scheduled at all. The jobs hold their pins and send no
progress, so nothing but the timers runs. Target (issue 23): at most 1% of a core while jobs run, nothing while none
does. Prints, and writes its own section of docs/benchmarks.md (replaced on each run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.figures import publish
from governor.backends import rails
from governor.sim import tree
from governor.sim.launch import FEATURES, Daemon, Rpc
from governor.sysfs import Root

REPO = Path(__file__).resolve().parent.parent
SECTION = "## The rails' sampler's cost"


def cpu_s(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return t.user + t.system


def one_run(seconds: float, n_jobs: int) -> tuple[float, float, float]:
    """(CPU share of one core while n_jobs are held, CPU seconds while none is, the rails' refresh in s)."""
    base = Path(tempfile.mkdtemp(prefix="ftgs", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        root = tree.build(base / "root", "jp6").root
        refresh_s = rails.discover(Root(root)).update_interval_s
        d = Daemon(root, workdir=base, config={"model_file": str(REPO / "model" / "paper-tree.json"),
                                               "sample_interval_s": 1.0},
                   test_config=False, log_level="info")
        d.start(timeout_s=30)
        try:
            ps = psutil.Process(d.proc.pid)
            c = Rpc(str(base / "s.sock"))
            jobs = [c.call("register", **FEATURES)["job_id"] for _ in range(n_jobs)]
            time.sleep(1.0)  # let the registrations' own work settle
            cpu0, t0 = cpu_s(ps), time.monotonic()
            time.sleep(seconds)  # the daemon's CPU over this stretch is the measurement
            busy = (cpu_s(ps) - cpu0) / (time.monotonic() - t0)
            for job in jobs:
                c.call("unregister", job_id=job)
            time.sleep(1.5)  # the last tick and sample after the end fire and stop
            cpu0 = cpu_s(ps)
            time.sleep(seconds)
            idle = cpu_s(ps) - cpu0
            c.close()
        finally:
            d.stop()
        return busy, idle, refresh_s
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args()
    results = [one_run(args.seconds, args.jobs) for _ in range(args.runs)]
    busy = [r[0] for r in results]
    idle = [r[1] for r in results]
    lines = [SECTION, "",
             "`python -m benchmarks.sampler_cost` (`make bench`). The real daemon on the fake Orin tree "
             f"(tmpfs; rails refresh every {1000 * results[0][2]:.0f} ms), {args.runs} runs of {args.seconds:g} s "
             f"each. With jobs: {args.jobs} held, no progress: the daemon's whole CPU time, the sampler's upper "
             "bound.", "",
             "| | per run | target |", "|---|---|---|",
             f"| daemon CPU while {args.jobs} jobs run | {' / '.join(f'{100 * b:.2f}%' for b in busy)} of a core "
             "| sampler <= 1% |",
             f"| daemon CPU with no job, over {args.seconds:g} s | {' / '.join(f'{1000 * i:.1f} ms' for i in idle)} "
             "| sampler: none (not scheduled) |", ""]
    text = "\n".join(lines)
    publish("sampler-cost", text, doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
