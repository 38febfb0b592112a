"""What ftgovd's CPU goes to on a real NVML GPU, read only: the daemon in the observe policy, one job reporting
progress 10 times a second, and where the time goes (cProfile).

    python -m scripts.daemon_cpu --out OUT [--seconds 60]

Phases, each against a fresh ftgovd (NVML backend, policy observe, tuner.window_rule time, a private socket and state
dir; nothing is written to the GPU): no job; one job whose client sends `progress` every 100 ms with `step_end_s`
(what governor.hf sends); the same without `step_end_s` (an old client); and the first again under cProfile. The job
is a stand-in (no training: the GPU idles), so the daemon's work per report and its energy counter reads are what is
measured, not a workload. Writes summary.md, profile.txt and the daemons' logs under OUT.
"""

from __future__ import annotations

import argparse
import cProfile  # noqa: F401  (run as -m cProfile in the daemon's interpreter; imported here so a missing one fails early)
import io
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from governor.sim.launch import Daemon
from scripts.observe_windows import gpu_readings, process_cpu_s

FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 128.0, "gpu_util": 80.0, "gpu": 0}
REPORT_S = 0.1
WARM_S = 10.0
NVML_CALLS = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo")


def daemon(out: Path, name: str, python_args: tuple[str, ...] = (), pythonpath: tuple[str, ...] = (),
           env: dict[str, str] | None = None) -> Daemon:
    """A fresh daemon whose root, socket and state are under a directory of its own (``stop_daemon`` removes it).
    ``pythonpath`` goes first on its PYTHONPATH (a pynvml stand-in), ``env`` into its environment."""
    here = str(Path(__file__).resolve().parents[1])
    work = Path(tempfile.mkdtemp(prefix="ftgov-cpu-"))
    (work / "root").mkdir()  # no Jetson: an empty sysfs root
    path = os.pathsep.join(p for p in (*pythonpath, here, os.environ.get("PYTHONPATH")) if p)
    return Daemon(work / "root", workdir=work,
                  config={"backend": "nvml", "policy": "observe", "restore_on_stop": False,
                          "tuner": {"window_rule": "time"}},
                  env={"PYTHONPATH": path, **(env or {})},
                  log_path=out / f"ftgovd-{name}.log", log_level="info", python_args=python_args)


def stop_daemon(d: Daemon) -> None:
    d.close()
    shutil.rmtree(d.workdir, ignore_errors=True)


def counter_reads(c) -> tuple[int, float]:
    """The energy counter's reads so far and their wall time (s), over the GPUs (status)."""
    gpus = c.call("status")["gpus"]
    return (sum(g.get("energy_counter_reads", 0) for g in gpus), sum(g.get("energy_counter_read_s", 0.0) for g in gpus))


def run_phase(d: Daemon, seconds: float, job: bool, step_ends: bool) -> tuple[float, float, float, float]:
    """The daemon's CPU, as a share of a core, over ``seconds`` with (or without) one job reporting every REPORT_S:
    over the whole phase, and after its first WARM_S (a job's first second reads the counter often, to find its
    update instants); and after WARM_S the counter's reads a second and their share of a core (their wall time, as
    the daemon paces them)."""
    c = d.client()
    status = c.call("status")
    if status["policy"] != "observe" or any(g.get("pinned_hz") for g in status["gpus"]):
        raise SystemExit(f"refusing: the daemon is not observing read-only: {status}")
    job_id = c.call("register", name="stand-in", **FEATURES)["job_id"] if job else None
    cpu0, start = process_cpu_s(d.proc.pid), time.monotonic()
    steps, deadline, warm = 0, start, None
    while time.monotonic() - start < seconds:
        if warm is None and time.monotonic() - start >= WARM_S:
            warm = (process_cpu_s(d.proc.pid), time.monotonic(), *counter_reads(c))
        deadline += REPORT_S
        time.sleep(max(0.0, deadline - time.monotonic()))
        if job_id is not None:
            steps += 1
            extra = {"step_end_s": time.monotonic()} if step_ends else {}
            c.notify("progress", job_id=job_id, steps=steps, **extra)
    c.call("ping")  # every report handled
    cpu_s, end = process_cpu_s(d.proc.pid), time.monotonic()
    reads, read_s = counter_reads(c)
    if job_id is not None:
        c.call("unregister", job_id=job_id)
    c.close()
    assert warm is not None, "a phase longer than WARM_S"
    warm_s = end - warm[1]
    return ((cpu_s - cpu0) / (end - start), (cpu_s - warm[0]) / warm_s, (reads - warm[2]) / warm_s,
            (read_s - warm[3]) / warm_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--quick", action="store_true", help="only the phase of one job with step_end_s, no profile")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = gpu_readings()
    rows = []
    phases = (("no job", False, False), ("one job, step_end_s", True, True), ("one job, no step_end_s", True, False))
    for name, job, step_ends in phases[1:2] if args.quick else phases:
        d = daemon(args.out, name.replace(" ", "-").replace(",", ""))
        d.start(timeout_s=60)
        try:
            rows.append((name, *run_phase(d, args.seconds, job, step_ends)))
        finally:
            stop_daemon(d)
    if args.quick:
        print("\n".join(f"{name}: {100 * share:.2f}% of a core, {100 * warm:.2f}% after {WARM_S:g} s, of which the "
                        f"counter's reads {100 * read_frac:.2f}% ({reads_per_s:.2f} a second)"
                        for name, share, warm, reads_per_s, read_frac in rows))
        return 0
    prof = args.out / "daemon.prof"
    d = daemon(args.out, "profiled", python_args=("-m", "cProfile", "-o", str(prof)))
    d.start(timeout_s=60)
    try:
        profiled, profiled_warm, _, _ = run_phase(d, args.seconds, True, True)
    finally:
        stop_daemon(d)
    after = gpu_readings()
    text = io.StringIO()
    stats = pstats.Stats(str(prof), stream=text)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    (args.out / "profile.txt").write_text(text.getvalue())
    nvml = {}
    for (_file, _line, func), (_cc, calls, _tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if func in NVML_CALLS:
            nvml[func] = (calls, cumtime)
    lines = [f"# ftgovd's CPU on {before['name']} (observe, read only)", "",
             f"{args.seconds:g} s per phase, one fresh daemon each; a stand-in job reporting every "
             f"{REPORT_S * 1000:g} ms (no training). Power limit and clocks' event reasons before / after: "
             f"{before['power_limit_mw']} / {after['power_limit_mw']} mW, {before['clocks_event_reasons']} / "
             f"{after['clocks_event_reasons']}.", "",
             f"| phase | ftgovd CPU, % of a core: whole phase | after its first {WARM_S:g} s | of which the energy "
             "counter's reads (wall time) | counter reads a second |", "|---|---:|---:|---:|---:|",
             *(f"| {name} | {100 * share:.2f}% | {100 * warm:.2f}% | {100 * read_frac:.2f}% | {reads_per_s:.2f} |"
               for name, share, warm, reads_per_s, read_frac in rows),
             f"| one job, step_end_s, under cProfile | {100 * profiled:.2f}% | {100 * profiled_warm:.2f}% | | |", "",
             "NVML calls in the profiled run (calls, cumulative s, per call ms):", "",
             *(f"- {func}: {calls}, {cum:.3f} s, {1000 * cum / calls:.2f} ms" for func, (calls, cum) in nvml.items()),
             "", "Where the rest goes: profile.txt."]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
