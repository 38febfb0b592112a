"""`ftgov characterize`: run a workload for a fixed number of steps at every GPU level and under MAXN, and append one
tidy CSV row per (workload, setting) with step time, rail power (integrated over the run) and energy per step.

Resumable: rows already in the CSV are skipped, and each row is flushed as soon as it is measured. Ctrl-C (or any
error) leaves the GPU at the limits it had before: the snapshot taken at the start is restored in a ``finally``.

Two workloads behind one loop:
- ``--simulate``: the energy model of a simulated Orin (simulated time: the 27-configuration sweep takes seconds);
- ``--model-dir/--task-dir``: a Hugging Face fine-tuning loop on a Jetson, pinned through the devfreq backend and
  measured from the INA3221 rails (governor.pipeline.hf_runner; run on CPU against a simulated sysfs tree in the
  tests, UNTESTED ON A JETSON).

Columns: model/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from governor.backends.rails import AGX_ORIN_RAILS, ENERGY_RAILS
from governor.errors import FtgovError
from governor.pipeline.dataset import whole_rows
from governor.pipeline.measure import SettingMeasurement
from governor.safefile import OutDir, write_file

SETTING_MAXN = "maxn"
SETTING_PINNED = "pinned"

COLUMNS = (
    "workload", "model", "task", "model_type", "num_layers", "hidden_size", "seq_len", "batch_size", "params_m",
    "setting", "freq_hz", "mean_freq_hz", "steps", "duration_s", "step_time_s", "gpu_util_pct",
    "power_mw", "energy_j", "energy_per_step_j",
    *(f"{rail}_mw" for rail in AGX_ORIN_RAILS),
    "energy_rails", "source", "model_version", "seed",
)


class Runner(Protocol):
    def run(self, steps: int, warmup: int = 0) -> SettingMeasurement:
        """Run steps at whatever clock the GPU holds now, and measure them."""


@dataclass(frozen=True)
class SweepJob:
    """One workload to characterize: its identity for the CSV and the runner that executes it."""

    workload: str  # "model/task"
    model: str
    task: str
    model_type: str
    num_layers: int
    hidden_size: int
    seq_len: float
    batch_size: int
    params_m: float | None
    make_runner: Callable[[], Runner]


@dataclass(frozen=True)
class Provenance:
    source: str  # "simulated" | "measured"
    model_version: str  # the energy model's VERSION, or a board description
    seed: int

    def describe(self, row: dict[str, str] | None = None) -> str:
        """What a CSV holding these rows holds: "simulated orin-energy/1.0 seed 0", "measured" (a board's runs, one
        workload each, may differ in seed)."""
        source, version, seed = (row["source"], row["model_version"], row["seed"]) if row else \
            (self.source, self.model_version, str(self.seed))
        return f"{source} {version} seed {seed}" if source == "simulated" else source


def setting_key(freq_hz: int | None) -> str:
    return SETTING_MAXN if freq_hz is None else str(freq_hz)


def done_keys(csv_path: Path, prov: Provenance) -> set[tuple[str, str]]:
    """(workload, setting key) pairs already measured in the CSV; refuses a CSV with other columns, or with rows that
    ``prov``'s would not join: another source, or another simulated run. A CSV is one kind of data: its sidecar
    describes it, the stages train on all of it, and the tree records where it came from."""
    if not csv_path.exists() or csv_path.stat().st_size == 0:
        return set()
    try:
        with csv_path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                raise FtgovError(f"{csv_path} has different columns: not a characterization CSV of this version")
            done = set()
            for r in whole_rows(reader, csv_path):
                if prov.describe(r) != prov.describe():
                    raise FtgovError(f"{csv_path} holds {prov.describe(r)} rows (line {reader.line_num}), not "
                                     f"{prov.describe()}: write these to another --out")
                done.add((r["workload"], r["freq_hz"] or SETTING_MAXN))
            return done
    except OSError as e:
        raise FtgovError(f"cannot read {csv_path}: {e.strerror or e}") from e


def _fmt(x: float | None, digits: int = 7) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def make_row(job: SweepJob, freq_hz: int | None, m: SettingMeasurement, prov: Provenance) -> dict[str, str]:
    if m.steps <= 0 or m.duration_s <= 0:
        raise FtgovError(f"{job.workload}: empty measurement")
    power_mw = m.energy_j / m.duration_s * 1e3
    return {
        "workload": job.workload, "model": job.model, "task": job.task, "model_type": job.model_type,
        "num_layers": str(job.num_layers), "hidden_size": str(job.hidden_size), "seq_len": _fmt(job.seq_len),
        "batch_size": str(job.batch_size), "params_m": _fmt(job.params_m, 5),
        "setting": SETTING_MAXN if freq_hz is None else SETTING_PINNED,
        "freq_hz": "" if freq_hz is None else str(freq_hz), "mean_freq_hz": _fmt(m.mean_freq_hz),
        "steps": str(m.steps), "duration_s": _fmt(m.duration_s), "step_time_s": _fmt(m.duration_s / m.steps),
        "gpu_util_pct": _fmt(m.gpu_util_pct, 4), "power_mw": _fmt(power_mw), "energy_j": _fmt(m.energy_j),
        "energy_per_step_j": _fmt(m.energy_j / m.steps),
        **{f"{rail}_mw": _fmt(m.rail_power_mw(rail)) for rail in AGX_ORIN_RAILS},
        "energy_rails": "+".join(ENERGY_RAILS), "source": prov.source, "model_version": prov.model_version,
        "seed": str(prov.seed),
    }


class Progress:
    """tqdm when it is installed, else one plain line per measurement on stderr."""

    def __init__(self, total: int, initial: int):
        self.total, self.count = total, initial
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, initial=initial, unit="run", file=sys.stderr, dynamic_ncols=True)

    def update(self, label: str) -> None:
        self.count += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
        else:
            print(f"[{self.count}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def characterize(jobs: Iterable[SweepJob], gpu, csv_path: Path, steps: int, warmup: int, prov: Provenance,
                 on_row: Callable[[dict], None] | None = None, progress: bool = True) -> int:
    """Measure every (job, setting) not yet in csv_path; return how many rows were added.

    Settings: MAXN first (the baseline limits, under the load-following governor), then every level ascending.
    The GPU's limits are snapshotted first and restored on the way out, whatever happens.
    """
    jobs = list(jobs)
    settings: list[int | None] = [None, *gpu.levels_hz]
    done = done_keys(csv_path, prov)
    todo = [(j, f) for j in jobs for f in settings if (j.workload, setting_key(f)) not in done]
    bar = Progress(len(jobs) * len(settings), len(jobs) * len(settings) - len(todo)) if progress else None
    baseline = gpu.snapshot()
    added = 0
    try:
        with OutDir(csv_path.parent) as out, out.append(csv_path.name) as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            if f.tell() == 0:
                writer.writeheader()
            runners: dict[str, Runner] = {}
            for job, freq_hz in todo:
                runner = runners.get(job.workload) or runners.setdefault(job.workload, job.make_runner())
                if freq_hz is None:
                    gpu.restore(baseline)
                else:
                    gpu.pin(freq_hz)
                row = make_row(job, freq_hz, runner.run(steps, warmup), prov)
                writer.writerow(row)
                f.flush()
                added += 1
                if bar:
                    bar.update(f"{job.workload} @ {setting_key(freq_hz)}")
                if on_row:
                    on_row(row)
    except OSError as e:
        raise FtgovError(f"cannot write {csv_path}: {e.strerror or e}") from e
    finally:
        gpu.restore(baseline)
        if bar:
            bar.close()
    return added


# -- building jobs ----------------------------------------------------------------------------------------------

def simulated_jobs(workloads, gpu, seed: int, noise: float) -> list[SweepJob]:
    from governor.sim.gpu import SimulatedRunner

    jobs = []
    for w in workloads:
        model, task = w.name.split("/", 1)
        jobs.append(SweepJob(w.name, model, task, w.model_type, w.num_layers, w.hidden_size, w.seq_len, w.batch_size,
                        round(w.total_params_m, 3),
                        make_runner=lambda w=w: SimulatedRunner(w, gpu, seed=seed, noise=noise)))
    return jobs


def select_workloads(suite: str | None, names: list[str] | None):
    from governor.pipeline.workloads import characterization_workloads, held_out_workloads

    pool = {"characterization": characterization_workloads, "held-out": held_out_workloads}
    chosen = pool[suite]() if suite else []
    if names:
        every = {w.name: w for w in characterization_workloads() + held_out_workloads()}
        unknown = [n for n in names if n not in every]
        if unknown:
            raise FtgovError(f"unknown workload(s) {unknown}; names look like 'bert-base/sst2'")
        chosen += [every[n] for n in names if every[n] not in chosen]
    if not chosen:
        raise FtgovError("nothing to characterize: give --suite or --workload")
    return chosen


def write_sidecar(csv_path: Path, meta: dict) -> None:
    """<csv>.meta.json: where the data came from (a CSV cannot say it without breaking its readers)."""
    path = csv_path.with_name(csv_path.name + ".meta.json")
    try:
        write_file(path, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    except OSError as e:
        raise FtgovError(f"cannot write {path}: {e.strerror or e}") from e


def _run_simulated(args) -> int:
    from governor.sim.energy import OrinEnergyModel
    from governor.sim.gpu import SimulatedGpu

    gpu = SimulatedGpu(OrinEnergyModel().levels_hz)
    workloads = select_workloads(args.suite, args.workload)
    prov = Provenance("simulated", OrinEnergyModel.VERSION, args.seed)
    added = characterize(simulated_jobs(workloads, gpu, args.seed, args.noise), gpu, args.out, args.steps,
                         args.warmup, prov, progress=not args.quiet)
    write_sidecar(args.out, {
        "source": "simulated", "generator": "ftgov characterize --simulate",
        "energy_model": OrinEnergyModel.VERSION, "seed": args.seed, "noise": args.noise, "steps": args.steps,
        "warmup_steps": args.warmup, "suite": args.suite, "workloads": [w.name for w in workloads],
        "levels_hz": list(gpu.levels_hz), "energy_rails": list(ENERGY_RAILS),
        "note": "Simulated Jetson AGX Orin (governor/sim/energy.py); not a measurement of hardware.",
    })
    print(f"{args.out}: {added} rows added", file=sys.stderr)
    return 0


def hf_job(model_dir: Path, task: str, task_dir: Path, gpu, rails, *, model_name: str | None = None,
           batch_size: int = 32, seed: int = 0, device: str = "cuda", max_len: int = 128,
           on_step: Callable[[int], None] | None = None) -> SweepJob:
    """The SweepJob for a Hugging Face checkpoint fine-tuned on a local GLUE task (governor.pipeline.hf_runner).

    The runner is built here, not lazily, because the CSV's identity columns (shape, mean sequence length, parameter
    count) come from the loaded model and the tokenized data.
    """
    from governor.features import from_hf_config
    from governor.pipeline.hf_runner import HfTask, HfTrainingRunner

    runner = HfTrainingRunner(model_dir, HfTask(task, task_dir), gpu, rails, batch_size=batch_size, seed=seed,
                              max_len=max_len, device=device, on_step=on_step)
    shape = from_hf_config(runner.model.config)
    params_m = sum(p.numel() for p in runner.model.parameters()) / 1e6
    name = model_name or Path(model_dir).name
    return SweepJob(f"{name}/{task}", name, task, shape["model_type"], shape["num_layers"], shape["hidden_size"],
               round(runner.seq_len, 2), batch_size, round(params_m, 3), make_runner=lambda: runner)


class Terminated(FtgovError):
    """SIGTERM arrived during a characterization (a `kill`, a systemd stop)."""


@contextlib.contextmanager
def sigterm_raises():
    """Turn SIGTERM into an exception for the duration, so the ``finally`` that restores the GPU runs.

    Python's default SIGTERM action ends the process without unwinding: the pin would outlive the run. Ctrl-C needs
    nothing (KeyboardInterrupt unwinds). The previous handler is put back on the way out.
    """
    def handler(signum, frame):
        raise Terminated("terminated by SIGTERM; the GPU's limits were restored")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _board_model(root) -> str:
    try:
        return root.path("/proc/device-tree/model").read_bytes().rstrip(b"\0\n").decode(errors="replace")
    except OSError:
        return "unknown"


def _run_hardware(args) -> int:
    """A real Jetson: devfreq pins, INA3221 rails. Exercised on CPU against a simulated sysfs tree
    (tests/pipeline/test_hf_runner.py); UNTESTED ON A JETSON (see governor/pipeline/hf_runner.py)."""
    from governor.cli.doctor import refuse_while_daemon_runs

    refuse_while_daemon_runs("ftgov characterize")  # the sweep writes devfreq itself: one writer at a time
    from governor.backends.devfreq import probe
    from governor.backends.rails import discover
    from governor.sysfs import trusted_root

    root = trusted_root(args.sysfs_root)  # as root, a tree another user can write is refused (docs/security.md)
    gpu = probe(root)[0]  # the Orin has one GPU
    rails = discover(root)
    if rails is None:
        raise FtgovError("no INA3221 rails found: energy cannot be measured on this board")
    missing = [r for r in ENERGY_RAILS if r not in rails.channels]
    if missing:
        raise FtgovError(f"rails {missing} not found (have {rails.names}): energy would be undercounted")
    baseline = gpu.snapshot()
    if baseline.min_hz == baseline.max_hz:
        # The MAXN row would be measured at this pin and labelled as the board's default: refuse rather than lie.
        raise FtgovError(f"the GPU is pinned at {baseline.min_hz} Hz already (a crashed run, ftgovd, jetson_clocks?): "
                         f"restore its default limits before characterizing")
    if baseline.max_hz < gpu.levels_hz[-1]:
        # AGX Orin's default power mode, MODE_30W, caps max_freq at 612 MHz: the maxn row would be that mode's.
        raise FtgovError(f"the GPU is capped at {baseline.max_hz} Hz (its table reaches {gpu.levels_hz[-1]} Hz): a "
                         "power mode's cap (nvpmodel) or another tool's max_freq; the MAXN row would be measured under "
                         "it. Set the power mode without a GPU cap (MAXN: sudo nvpmodel -q shows the mode) first")
    job = hf_job(args.model_dir, args.task, args.task_dir, gpu, rails, model_name=args.model_name,
                 batch_size=args.batch_size, seed=args.seed, device=args.device, max_len=args.max_len)
    prov = Provenance("measured", "jetson", args.seed)
    with sigterm_raises():
        added = characterize([job], gpu, args.out, args.steps, args.warmup, prov, progress=not args.quiet)
    write_sidecar(args.out, {
        "source": "measured", "generator": "ftgov characterize --model-dir", "board": _board_model(root),
        "model_dir": str(args.model_dir), "task": args.task, "task_dir": str(args.task_dir),
        "device": args.device, "seed": args.seed, "steps": args.steps, "warmup_steps": args.warmup,
        "batch_size": args.batch_size, "max_len": args.max_len, "workloads": [job.workload],
        "levels_hz": list(gpu.levels_hz), "baseline_hz": [baseline.min_hz, baseline.max_hz],
        "energy_rails": list(ENERGY_RAILS),
    })
    print(f"{args.out}: {added} rows added", file=sys.stderr)
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("characterize", help="measure time, power and energy per step at every GPU level",
                              description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--simulate", action="store_true", help="the simulated Orin's energy model (simulated time)")
    where.add_argument("--model-dir", type=Path, help="a local Hugging Face checkpoint (real Jetson)")
    p.add_argument("--suite", choices=("characterization", "held-out"), help="simulated: the paper's workload set")
    p.add_argument("--workload", action="append", help="simulated: a workload like bert-base/sst2 (repeatable)")
    p.add_argument("--task", help="real: GLUE task name (sst2, qnli, ...)")
    p.add_argument("--task-dir", type=Path, help="real: local copy of the GLUE task")
    p.add_argument("--model-name", help="real: name for the CSV (default: the model directory's name)")
    p.add_argument("--sysfs-root", default="/", help="real: file-system root of sysfs (default /)")
    p.add_argument("--device", default="cuda", help="real: torch device of the training loop (default cuda; "
                   "cpu for a dry run off the board)")
    p.add_argument("--max-len", type=int, default=128, help="real: truncate samples to this many tokens")
    p.add_argument("--out", type=Path, default=Path("characterization.csv"),
                   help="CSV to append to (default: characterization.csv in the current directory, and its .meta.json)")
    p.add_argument("--steps", type=int, default=50, help="measured steps per setting (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured steps first, per setting (default 5)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=1.0, help="simulated: run-to-run noise scale (0 = none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    if args.steps < 1 or args.warmup < 0:
        raise FtgovError("--steps must be >= 1 and --warmup >= 0")
    if args.simulate:
        return _run_simulated(args)
    if not args.task or not args.task_dir:
        raise FtgovError("a real characterization needs --task and --task-dir with --model-dir")
    return _run_hardware(args)
