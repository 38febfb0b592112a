"""What the rails' sampler costs: the real ftgovd on the fake Orin tree (INA3221 rails, update_interval 140 ms) in
tmpfs, its CPU time (user + system, psutil) over a stretch while jobs are held and over one while none is.

    python -m benchmarks.sampler_cost [--seconds 20] [--jobs 4] [--runs 3] [--nvml-seconds 40] [--no-doc]

While jobs run the daemon's whole CPU time is measured (the sampler, the 1 s tick, the watchdog, the loop): an upper
bound of the sampler's share. With no job the sampler is not scheduled at all. The jobs hold their pins and send no
progress, so nothing but the timers runs. Target (issue 23): at most 1% of a core while jobs run, nothing while none
does. Then the same on an NVML GPU, whose sampler is the timer reading the energy counter: the fake NVML with an
H200's read costs (scripts/daemon_cpu.py's phases). Prints, and writes its own section of docs/benchmarks.md
(replaced on each run).
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
from scripts import daemon_cpu
from tests.support import FAKENVML_DIR

REPO = Path(__file__).resolve().parent.parent
SECTION = "## The sampler's cost: the rails, and an NVML GPU's energy counter"
H200_READ_S = "0.004,0.012,0.012"  # a driver that answers one read in three from a cache; a mean of 9.3 ms


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


def nvml_run(seconds: float, out: Path) -> tuple[float, float, float, float]:
    """On the fake NVML whose counter reads spend an H200's CPU (H200_READ_S in turn), the daemon as scripts/
    daemon_cpu.py runs it on a real GPU: (the counter's reads' share of a core and their number a second after the
    job's first WARM_S, one job reporting ten times a second with step_end_s; with no job, the reads a second and the
    daemon's CPU share, the harness's status calls included)."""
    env = {"FAKENVML_ENERGY_READ_S": H200_READ_S}
    shares = []
    for job in (True, False):
        d = daemon_cpu.daemon(out, "job" if job else "no-job", pythonpath=(str(FAKENVML_DIR),), env=env)
        d.start(timeout_s=60)
        try:
            shares.append(daemon_cpu.run_phase(d, seconds, job, step_ends=True))
        finally:
            daemon_cpu.stop_daemon(d)
    (_, _, reads_per_s, read_frac), (idle, _, idle_reads_per_s, _) = shares
    return read_frac, reads_per_s, idle_reads_per_s, idle


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nvml-seconds", type=float, default=40.0, help="each NVML phase (the first 10 s left out)")
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args()
    results = [one_run(args.seconds, args.jobs) for _ in range(args.runs)]
    out = Path(tempfile.mkdtemp(prefix="ftgov-nvml-cost-"))
    try:
        nvml = [nvml_run(args.nvml_seconds, out) for _ in range(args.runs)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
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
             "| sampler: none (not scheduled) |", "",
             "On an NVML GPU the sampler is the timer that reads the energy counter, whose reads cost milliseconds: "
             f"the daemon as `scripts/daemon_cpu.py` runs it (observe), on the fake NVML whose counter reads spend "
             f"{H200_READ_S.replace(',', ', ')} s of CPU in turn (an H200's: docs/daemon-cpu.md), {args.runs} runs of "
             f"{args.nvml_seconds:g} s, the first {daemon_cpu.WARM_S:g} s (the update grid's search) left out; one "
             "job reporting ten times a second with step_end_s. The reads' share is their wall time (the daemon's "
             "own count, `status`).", "",
             "| | per run | target |", "|---|---|---|",
             f"| the counter's reads while a job runs | {' / '.join(f'{100 * r[0]:.2f}%' for r in nvml)} of a core "
             f"({' / '.join(f'{r[1]:.2f}' for r in nvml)} reads a second) | <= 1% |",
             f"| the counter's reads with no job | {' / '.join(f'{r[2]:.2f}' for r in nvml)} a second (the daemon's "
             f"CPU {' / '.join(f'{100 * r[3]:.2f}%' for r in nvml)} of a core, the harness's status calls included) "
             "| none |", ""]
    text = "\n".join(lines)
    publish("sampler-cost", text, doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
