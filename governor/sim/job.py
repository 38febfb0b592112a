"""A simulated training job for the simulated Orin: steps take as long as the energy model says at the GPU's
current clock, so the daemon's rails-based energy per step has the real U shape and the tuner has something to find.

Used by tests, the demo and `ftgov sim-job` (try the `tune` policy without a Jetson). ``time_scale`` shrinks every
step by the same factor, which keeps the ratios between levels (and so the energy-optimal level) unchanged.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable, Optional

from governor.sysfs import Root


def _read_hz(path: Path) -> int:
    # The fake tree's files are plain files, rewritten by truncate-then-write: a reader racing the daemon can catch
    # one empty. A real sysfs attribute is replaced atomically, so only the simulation needs the second look.
    for _ in range(100):
        text = path.read_text().strip()
        if text:
            return int(text)
    raise RuntimeError(f"{path} stayed empty")


def step_seconds(node: Path, workload, model) -> float:
    """One step's duration at the clock the simulated GPU (devfreq node) runs now, from the energy model."""
    pinned = _read_hz(node / "min_freq") == _read_hz(node / "max_freq")
    return model.step(workload, _read_hz(node / "cur_freq") if pinned else None).time_s


def run(root: Root, job, workload, steps: int, *, time_scale: float = 0.1, noise: float = 0.0, seed: int = 0,
        on_step: Optional[Callable[[int], None]] = None) -> None:
    """Run `steps` simulated steps inside an open governor.client Job."""
    from governor.backends import devfreq
    from governor.sim.energy import OrinEnergyModel

    model = OrinEnergyModel(noise=noise, seed=seed)
    node = devfreq.find_node(root)
    deadline = time.monotonic()
    for i in range(steps):
        deadline += step_seconds(node, workload, model) * time_scale
        time.sleep(max(0.0, deadline - time.monotonic()))  # the step itself: simulated work takes wall time
        job.step()
        if on_step is not None:
            on_step(i + 1)


def add_parser(sub) -> None:
    p = sub.add_parser("sim-job", help="run a simulated fine-tuning job against ftgovd --simulate")
    p.add_argument("--socket", help="daemon socket (default: FTGOV_SOCKET, else /run/ftgov/ftgov.sock)")
    p.add_argument("--tree", required=True, help="the simulated Orin tree ftgovd --simulate printed")
    p.add_argument("--model-type", choices=["encoder", "decoder"], default="encoder")
    p.add_argument("--num-layers", type=int, default=12)
    p.add_argument("--hidden-size", type=int, default=768)
    p.add_argument("--seq-len", type=float, default=40.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--time-scale", type=float, default=0.1, help="wall time per simulated second (default 0.1)")
    p.add_argument("--tune", action="store_true", help="ask for the online tuner for this job")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from governor import client
    from governor.sim.energy import Workload

    features = {"model_type": args.model_type, "num_layers": args.num_layers, "hidden_size": args.hidden_size,
                "seq_len": args.seq_len}
    workload = Workload(name="sim-job", **features)
    with client.job(name="sim-job", socket=args.socket, tune=args.tune or None, report_every_s=0.05,
                    **features) as job:
        run(Root(Path(args.tree)), job, workload, args.steps, time_scale=args.time_scale)
    print(job.result)
    return 0
