"""A simulated training job for the simulated Orin: steps take as long as the energy model says at the GPU's
current clock, so the daemon's rails-based energy per step has the real U shape and the tuner has something to find.

Used by tests, the demo and `ftgov sim-job` (try the `tune` policy without a Jetson). ``time_scale`` shrinks every
step by the same factor, and the board draws the model's power divided by time_scale while the steps run: each step
still takes the workload's energy, so the daemon measures and records the workload's J/step at any scale (its s/step
and the rails' power are the compressed time's).

A job tells the simulated board (governor.sim.board) what it runs through the tree, as a training process tells a
real GPU by running kernels on it: ``announce`` writes a file under the tree's ``ftgov-sim/jobs/`` with the workload
and whether its steps run now; the board shows the workload's load and power only while they do.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from governor import SOCKET_ENV
from governor.errors import FtgovError
from governor.sim import tree
from governor.sim.inotify import IN_CLOSE_WRITE, IN_MODIFY, Inotify
from governor.simpaths import (
    PRINT_ENV,
    SIM_TREE_ENV,
    SIMULATED_TREE_NAME,
    simulated_state_dir,
    start_simulated,
    tree_socket,
    tree_state_dir,
)
from governor.sysfs import Root
from governor.units import mhz

_announcements = itertools.count(1)


class Announcement:
    """A job's file in the board's jobs directory; ``stepping(True)`` while its training steps run. ``time_scale``:
    the share of the model's time the job's steps take (the board runs its meters in the same compressed time, and
    divides the power by it)."""

    def __init__(self, root: Root, workload, time_scale: float = 1.0):
        self.root, self.workload, self.time_scale = root, workload, time_scale
        self.path = root.path(tree.JOBS_DIR) / f"{os.getpid()}-{next(_announcements)}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stepping(False)

    def stepping(self, running: bool) -> None:
        record = {"pid": os.getpid(), "workload": asdict(self.workload), "stepping": running,
                  "time_scale": self.time_scale}
        tree.replace_file(self.root, self.path, json.dumps(record) + "\n")

    def withdraw(self) -> None:
        self.path.unlink(missing_ok=True)


@contextmanager
def announce(root: Root, workload, time_scale: float = 1.0) -> Iterator[Announcement]:
    """The job is on the board (idle until ``stepping(True)``) for the block's duration."""
    a = Announcement(root, workload, time_scale)
    try:
        yield a
    finally:
        a.withdraw()


def _read_hz(path: Path, timeout_s: float = 5.0) -> int:
    """The attribute's value. The daemon writes the fake tree's plain files by truncate-then-write, so a read can land
    between the two and find the file empty (a real sysfs attribute is replaced in one step): then wait for the write
    that completes it (inotify, not a retry loop)."""
    text = path.read_text().strip()
    if text:
        return int(text)
    ino = Inotify()
    try:
        ino.watch(path.parent, IN_MODIFY | IN_CLOSE_WRITE)
        text = path.read_text().strip()  # written between the first read and the watch: no event will come
        while not text:
            if not select.select([ino.fd], [], [], timeout_s)[0]:
                raise RuntimeError(f"{path} stayed empty for {timeout_s:g} s")
            ino.read()
            text = path.read_text().strip()
        return int(text)
    finally:
        ino.close()


def step_seconds(node: Path, workload, model) -> float:
    """One step's duration at the clock the simulated GPU (devfreq node) runs now, from the energy model."""
    min_hz, max_hz = _read_hz(node / "min_freq"), _read_hz(node / "max_freq")
    return model.step(workload, min_hz if min_hz == max_hz else None).time_s


def run(root: Root, job, workload, steps: int, *, time_scale: float = 0.1, noise: float = 0.0, seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> None:
    """Run `steps` simulated steps inside an open governor.client Job; the board shows the load while they run."""
    from governor.backends import devfreq
    from governor.sim.energy import OrinEnergyModel

    model = OrinEnergyModel(noise=noise, seed=seed)
    node = devfreq.find_node(root)
    with announce(root, workload, time_scale) as on_board:
        on_board.stepping(True)
        deadline = time.monotonic()
        for i in range(steps):
            try:
                deadline += step_seconds(node, workload, model) * time_scale
            except FileNotFoundError as e:  # a real board's sysfs never goes; a restarted --simulate rebuilds its tree
                raise FtgovError(f"the simulated board's tree went away after {i} of {steps} steps ({e.filename}): "
                                 "ftgovd --simulate was restarted, and a restart builds a new board; start the job "
                                 "again") from None
            time.sleep(max(0.0, deadline - time.monotonic()))  # the step itself: simulated work takes wall time
            job.step()
            if on_step is not None:
                on_step(i + 1)
                # What the hook spent (an evaluation, say) is not the next steps' time: they run at their own pace
                # from here, not squeezed to catch up.
                deadline = max(deadline, time.monotonic())


def add_parser(sub) -> None:
    from governor.argtypes import above, at_least

    p = sub.add_parser("sim-job", help="run a simulated fine-tuning job against ftgovd --simulate",
                       description="Register a simulated training job with ftgovd and run its steps on the simulated "
                                   "Orin: each step takes as long as the energy model says at the clock the GPU runs "
                                   "now, so the daemon's energy per step has the real U shape. Prints the job's "
                                   "summary (energy, pin, saving) when it ends.")
    p.add_argument("--socket", help="daemon socket (default: FTGOV_SOCKET, else /run/ftgov/ftgov.sock)")
    p.add_argument("--tree", default=os.environ.get(SIM_TREE_ENV),
                   help="the simulated Orin tree ftgovd --simulate printed (default: $FTGOV_SIM_TREE, which "
                        "`eval \"$(ftgovd --simulate --print-env)\"` sets)")
    p.add_argument("--model-type", choices=["encoder", "decoder"], default="encoder", help="(default encoder)")
    p.add_argument("--num-layers", type=at_least(1), default=12, help="transformer layers (default 12)")
    p.add_argument("--hidden-size", type=at_least(1), default=768, help="hidden size (default 768)")
    p.add_argument("--seq-len", type=above(0), default=40.0, help="average tokens per sample (default 40)")
    p.add_argument("--steps", type=at_least(1), default=200, help="training steps (default 200)")
    # The board's meter steps through each step's compressed time: much below 0.01 it cannot keep up.
    p.add_argument("--time-scale", type=at_least(0.01, float), default=0.1,
                   help="wall time per simulated second (default 0.1; at least 0.01): the board draws the "
                        "model's power / TIME_SCALE meanwhile, so the energy per step is the workload's at any scale")
    p.add_argument("--tune", action="store_true", help="ask for the online tuner for this job")
    p.add_argument("--no-daemon", action="store_true",
                   help="run the steps on the board without registering, as an unmodified script (try ftgov run)")
    p.set_defaults(func=_main)


class _Unregistered:
    """The steps of a script that knows nothing of ftgovd: nothing to report."""

    result = None

    def step(self) -> None:
        pass


@contextmanager
def _governor_news() -> Iterator[list[str]]:
    """The client's GovernorWarnings inside the block, as this command's words (a list filled as the block ends):
    what a training script is warned of is sim-job's error. Other warnings are shown as they would have been."""
    from governor.client import GovernorWarning
    from governor.client.job import WITHOUT_GOVERNOR  # a training script's news, not this command's

    news: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GovernorWarning)
        try:
            yield news
        finally:
            news += [str(w.message).removeprefix(WITHOUT_GOVERNOR) for w in caught
                     if issubclass(w.category, GovernorWarning)]
    for w in caught:
        if not issubclass(w.category, GovernorWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _main(args: argparse.Namespace) -> int:
    from governor import client
    from governor.sim.energy import workload_from_features

    if not args.tree:  # the tree beside the daemon's socket (--socket, else $FTGOV_SOCKET), where one lies there
        state = simulated_state_dir(args.socket)
        args.tree = None if state is None else str(Path(state) / SIMULATED_TREE_NAME)
    if not args.tree:
        raise FtgovError(f"no simulated tree: give --tree DIR, or set {SIM_TREE_ENV} with {PRINT_ENV} once "
                         "ftgovd --simulate runs")
    state_dir = tree_state_dir(args.tree)
    if state_dir is not None and not Path(args.tree).exists():  # FTGOV_SIM_TREE set before the daemon's first start
        raise FtgovError(f"no simulated tree at {args.tree}: ftgovd --simulate builds it when it starts (start it: "
                         f"{start_simulated(state_dir, tree_socket(args.tree))})")
    root = Root(Path(args.tree))
    try:
        tree.layout_of(root)
    except ValueError as e:
        raise FtgovError(str(e)) from e
    features = {"model_type": args.model_type, "num_layers": args.num_layers, "hidden_size": args.hidden_size,
                "seq_len": args.seq_len}
    try:  # the daemon's bounds, checked before a step runs (a 10^8 hidden size is no model)
        client.check_features(features)
    except ValueError as e:
        raise FtgovError(str(e)) from e
    workload = workload_from_features(features, "sim-job")
    if args.no_daemon:
        started_s = time.monotonic()
        run(root, _Unregistered(), workload, args.steps, time_scale=args.time_scale)
        print(json.dumps({"registered": False, "steps": args.steps,
                          "wall_s": round(time.monotonic() - started_s, 3)}, indent=2, sort_keys=True))
        return 0
    # The daemon of this tree: --socket, else $FTGOV_SOCKET, else the socket beside a tree --simulate built (a shell
    # that exported only FTGOV_SIM_TREE looked for the board's /run/ftgov/ftgov.sock).
    socket = args.socket or os.environ.get(SOCKET_ENV) or tree_socket(args.tree)
    job = client.job(name="sim-job", socket=socket, tune=args.tune or None, report_every_s=0.05, **features)
    # A training script carries on without the governor (a warning); this job exists to be governed, so a daemon
    # that does not take it is this command's failure, not a null summary and exit 0.
    with _governor_news() as news:
        job.start()
    if not job.registered:
        job.close()
        why = "; ".join(news) or "the job was not registered"
        start = "start ftgovd --simulate" if PRINT_ENV in why else f"start ftgovd --simulate, then {PRINT_ENV}"
        raise FtgovError(f"{why}. sim-job runs its steps for ftgovd to govern: {start} (or pass --socket); "
                         "--no-daemon runs them without it")
    # The steps take a while (2,000 of BERT-base: ~40 s): said on stderr, stdout keeps the summary's JSON alone.
    reg = job.registration or {}
    print(f"sim-job: job {job.job_id} registered ({reg.get('policy')}, "
          f"{mhz(reg.get('freq_hz'), none='not pinned yet')}); "
          f"running {args.steps} steps; `ftgov status` or ftgovd's log shows the pin meanwhile, the summary comes at "
          "the end", file=sys.stderr, flush=True)
    # Nor is a daemon that went away while the steps ran: no summary, and its warning is this command's error, not a
    # Python warning that points at the ftgov script.
    with _governor_news() as lost:
        try:
            run(root, job, workload, args.steps, time_scale=args.time_scale)
        finally:
            job.close()
    if job.result is None:
        raise FtgovError(f"{'; '.join(lost) or 'ftgovd gave no summary of the job'}. The job's steps ran on "
                         "without it: no summary")
    print(json.dumps(job.result, indent=2, sort_keys=True))  # unregister's answer: the job's energy, pin, saving
    return 0
