"""Client figures: what the governor costs a training loop, against a real ftgovd --simulate.

- job.step(): the per-step cost with the default rate limit (a clock read; a notification at most every 0.1 s), and
  with a notification at every step (report_every_s=0);
- job.observe_batch(): one 32x128 torch attention mask while measuring, and the no-op once seq_len is known;
- register and unregister round trips through governor.job (gpu_util given, so the daemon does not sample the load);
- `ftgov run -- true` against running `true` directly: the wrapper's start-up and registration overhead.

Prints a table and writes it to docs/benchmarks.md ("client"). Run: python -m benchmarks.bench_client
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.figures import machine, markdown_table, write_section
from governor.sim.launch import FEATURES, Daemon

REPO = Path(__file__).resolve().parent.parent


def per_call_ns(fn, n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - start) / n


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    import torch

    import governor

    work = Path(tempfile.mkdtemp(prefix="ftgbc", dir="/tmp"))
    daemon = Daemon(None, workdir=work, simulate=True, config_file=os.devnull, state_dir=work, log_level="warning")
    sock = daemon.socket
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows = []
    try:
        daemon.start(timeout_s=30)
        with governor.job(**FEATURES, socket=sock) as job:
            step_ns = per_call_ns(job.step, 1_000_000)
            rows.append(("job.step(), default rate limit (mean of 10^6)", f"{step_ns:.0f} ns"))
        with governor.job(**FEATURES, socket=sock, report_every_s=0) as job:
            step_ns = per_call_ns(job.step, 100_000)
            rows.append(("job.step(), a notification every step (mean of 10^5)", f"{step_ns / 1e3:.1f} us"))
        mask = torch.ones(32, 128, dtype=torch.long)
        mask[:, 40:] = 0
        batch = {"attention_mask": mask}
        measuring = governor.job(**{k: v for k, v in FEATURES.items() if k != "seq_len"}, socket=sock,
                                 measure_batches=10**9)
        rows.append(("job.observe_batch(), measuring (32x128 mask, mean of 20,000)",
                     f"{per_call_ns(lambda: measuring.observe_batch(batch), 20_000) / 1e3:.1f} us"))
        with governor.job(**FEATURES, socket=sock) as job:
            observe_ns = per_call_ns(lambda: job.observe_batch(batch), 1_000_000)
            rows.append(("job.observe_batch(), seq_len known (mean of 10^6)", f"{observe_ns:.0f} ns"))

        def round_trip():
            with governor.job(**FEATURES, socket=sock):
                pass

        rows.append(("connect + register + unregister (median of 200)", f"{median_ms(round_trip, 200):.2f} ms"))
        true = shutil.which("true")
        ftgov = [sys.executable, "-m", "governor.cli", "run", "--socket", sock, "--model-type", "encoder",
                 "--num-layers", "12", "--hidden-size", "768", "--seq-len", "40", "--gpu-util", "60", "--", true]
        bare = median_ms(lambda: subprocess.run([true], check=True), 20)
        wrapped = median_ms(lambda: subprocess.run(ftgov, check=True, env=env), 20)
        rows.append(("`true` run directly (median of 20)", f"{bare:.1f} ms"))
        rows.append(("`ftgov run -- true` (median of 20)", f"{wrapped:.1f} ms"))
    finally:
        daemon.stop(timeout_s=30)
        daemon.close()
        shutil.rmtree(work, ignore_errors=True)
    width = max(len(name) for name, _ in rows)
    print(f"{'client figure':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    text = ("## Client figures\n\n`python -m benchmarks.bench_client` (`make bench`): what the governor costs a "
            "training loop, against a real `ftgovd --simulate`; each row names how many calls it covers. "
            f"Machine: {machine()}.\n\n"
            + "\n".join(markdown_table(("client figure", "value"), rows)) + "\n")
    if not args.no_doc:
        print(f"wrote {write_section('client', text)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
