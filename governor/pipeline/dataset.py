"""Read a characterization CSV back as one sweep per workload: features, energy and time per setting; and the
`dataset` stage, which labels each configuration with the level the tree is trained to pick.

The tree's gpu_util feature is the utilization measured under MAXN: that is what the daemon sees when a job
registers without one, because the job runs under the board's default governor until the daemon pins a clock.

The label is the optimum of the measured energy curve after a 3-point smoothing across neighbouring levels (weights
1-2-1 on log energy). The floor of a U is flat to within run-to-run noise (1-3 %), so the raw argmin flips between
neighbours by chance and a tree fitted to it learns the noise; the smoothed optimum is the centre of the floor.
Regret is always measured against the raw energies (docs/energy-model.md has the figures).
"""

from __future__ import annotations

import argparse
import collections
import csv
import hashlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from governor import data as shipped
from governor.errors import FtgovError
from governor.features import FEATURE_ORDER, Features
from governor.policy.tree import MAX_LEAF_HZ, MIN_LEAF_HZ
from governor.safefile import open_file
from governor.units import mhz


@dataclass(frozen=True)
class Sweep:
    """One workload measured at every level and under MAXN. Energies are per step (J), times per step (s)."""

    workload: str
    model: str
    task: str
    params_m: float
    features: Features
    energy_j: dict[int, float]  # level (Hz) -> energy per step
    time_s: dict[int, float]
    gpu_util_pct: dict[int, float]
    maxn_energy_j: float
    maxn_time_s: float

    @property
    def levels_hz(self) -> tuple[int, ...]:
        return tuple(sorted(self.energy_j))

    @property
    def optimum_hz(self) -> int:
        """The energy-optimal level (the lowest one on an exact tie)."""
        return min(self.levels_hz, key=lambda f: (self.energy_j[f], f))

    def regret_pct(self, freq_hz: int) -> float:
        """Energy at freq_hz over the optimum's, in percent above it."""
        return 100.0 * (self.energy_j[freq_hz] / self.energy_j[self.optimum_hz] - 1.0)

    def savings_pct(self, energy_j: float) -> float:
        return 100.0 * (1.0 - energy_j / self.maxn_energy_j)


def load(path: str | Path) -> list[Sweep]:
    """Sweeps in the order their workloads first appear; every workload must have MAXN and the same levels."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            # Another file altogether (a typo'd --data) is told as such before any of its lines is judged as a row.
            missing = [c for c in SWEEP_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise FtgovError(f"{path} is not a characterization CSV (`ftgov characterize` writes one): no "
                                 f"column {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
            rows = list(whole_rows(reader, path))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise FtgovError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from e
    by_workload: dict[str, list[dict]] = {}
    try:
        for r in rows:
            by_workload.setdefault(r["workload"], []).append(r)
        sweeps = [_sweep(name, group) for name, group in by_workload.items()]
    except (KeyError, TypeError, ValueError) as e:  # another CSV (or no CSV): a column missing or not a number
        raise FtgovError(f"{path} is not a characterization CSV (`ftgov characterize` writes one): "
                         f"bad or missing column {e}") from e
    if not sweeps:
        raise FtgovError(f"{path} holds no measurements")
    sources = collections.Counter(r["source"] for r in rows)
    if len(sources) > 1:  # characterize never writes one; a file put together by hand would be trained on as one
        raise FtgovError(f"{path} mixes " + " and ".join(f"{n} {source} rows" for source, n in sorted(sources.items()))
                         + ": train on one kind at a time")
    levels = {s.levels_hz for s in sweeps}
    if len(levels) != 1:
        raise FtgovError(f"{path}: workloads were measured at different levels")
    # The levels become the tree's leaves and FFG's frequency, which the daemon refuses outside this range (MHz
    # written for Hz would pin every job at the lowest level): a file in another unit is told here, not at the daemon.
    off = [hz for hz in sweeps[0].levels_hz if not MIN_LEAF_HZ <= hz <= MAX_LEAF_HZ]
    if off:
        raise FtgovError(f"{path}: freq_hz {off[0]} is not a GPU clock in Hz ({mhz(MIN_LEAF_HZ)} to "
                         f"{mhz(MAX_LEAF_HZ)}): the column is in Hz (816 MHz is 816000000)")
    return sweeps


def whole_rows(reader: csv.DictReader, path: Path) -> Iterator[dict]:
    """The reader's rows, each with exactly the header's fields. A row cut short (a characterization stopped while
    writing it: a disk that filled, a power cut) still holds numbers in the columns before the cut, the last of them
    with some of its digits: read as it is, it would be trained on, and a resumed characterization would skip it."""
    for r in reader:
        if None in r or None in r.values():  # DictReader's fill for a short row, and its key for a long row's rest
            raise FtgovError(f"{path}: line {reader.line_num} is cut short or has extra fields ({_fields(r)} where "
                             f"the header has {len(reader.fieldnames or ())}): delete the line, and `ftgov "
                             "characterize` measures it again")
        yield r


def _fields(row: dict) -> int:
    return sum(1 for k, v in row.items() if k is not None and v is not None) + len(row.get(None) or ())


# The columns load() reads (characterize's COLUMNS has them all, and more).
SWEEP_COLUMNS = ("workload", "model", "task", "params_m", "model_type", "num_layers", "hidden_size", "seq_len",
                 "setting", "freq_hz", "energy_per_step_j", "step_time_s", "gpu_util_pct", "source")


def _sweep(name: str, rows: list[dict]) -> Sweep:
    maxn = [r for r in rows if r["setting"] == "maxn"]
    pinned = [r for r in rows if r["setting"] == "pinned"]
    if len(maxn) != 1 or not pinned:
        raise FtgovError(f"{name}: needs exactly one MAXN row and pinned rows (has {len(maxn)} and {len(pinned)})")
    for r in rows:
        for column in ("energy_per_step_j", "step_time_s"):
            _positive(name, r, column)
    first = rows[0]
    features = Features(model_type=first["model_type"], num_layers=int(first["num_layers"]),
                        hidden_size=int(first["hidden_size"]), seq_len=float(first["seq_len"]),
                        gpu_util=float(maxn[0]["gpu_util_pct"]))
    return Sweep(
        workload=name, model=first["model"], task=first["task"], params_m=float(first["params_m"]),
        features=features,
        energy_j={int(r["freq_hz"]): float(r["energy_per_step_j"]) for r in pinned},
        time_s={int(r["freq_hz"]): float(r["step_time_s"]) for r in pinned},
        gpu_util_pct={int(r["freq_hz"]): float(r["gpu_util_pct"]) for r in pinned},
        maxn_energy_j=float(maxn[0]["energy_per_step_j"]), maxn_time_s=float(maxn[0]["step_time_s"]),
    )


def _positive(name: str, row: dict, column: str) -> None:
    """A row's energy or time, which labels, FFG and regret take logs and sums of: 'nan' passed float() and made FFG
    pick the lowest level; 0 ended in a math domain error."""
    value = row[column]
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        at = "MAXN" if row["setting"] == "maxn" else mhz(int(row["freq_hz"]))
        raise FtgovError(f"{name}: {column} {value!r} at {at} is not a positive finite number")


def sha256(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise FtgovError(f"cannot read {path}: {e.strerror or e}") from e


def meta(data: str | Path) -> dict:
    """The provenance sidecar written beside a characterization CSV (``NAME.meta.json``); {} when there is none."""
    data = Path(data)
    try:
        return json.loads(data.with_name(data.name + ".meta.json").read_text())
    except (OSError, ValueError):
        return {}


SMOOTHING = (1.0, 2.0, 1.0)


def label_hz(sweep: Sweep) -> int:
    """The level at the minimum of the smoothed log-energy curve (weights renormalised at the ends of the table)."""
    levels = sweep.levels_hz
    log_e = [math.log(sweep.energy_j[f]) for f in levels]
    smoothed = []
    for i in range(len(levels)):
        pairs = [(w, log_e[j]) for j, w in zip((i - 1, i, i + 1), SMOOTHING, strict=False) if 0 <= j < len(levels)]
        smoothed.append(sum(w * v for w, v in pairs) / sum(w for w, _ in pairs))
    return levels[min(range(len(levels)), key=lambda i: (smoothed[i], i))]


def write_dataset(data: Path, out: Path) -> int:
    """Per configuration: the five features (encoded as the daemon encodes them), the label and the raw optimum
    beside it. Returns the number of configurations."""
    sweeps = load(data)
    with open_file(out) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["workload", *FEATURE_ORDER, "label_hz", "raw_optimum_hz", "regret_of_label_pct",
                    "savings_at_label_pct"])
        for s in sweeps:
            label = label_hz(s)
            w.writerow([s.workload, *(f"{v:g}" for v in s.features.vector()), label, s.optimum_hz,
                        f"{s.regret_pct(label):.2f}", f"{s.savings_pct(s.energy_j[label]):.2f}"])
    return len(sweeps)


def read_labels(path: str | Path, sweeps: list[Sweep]) -> dict[str, int]:
    """workload -> label level (Hz) from a file written by `dataset`, for exactly the workloads of ``sweeps``, whose
    features it must hold as they are now (a dataset written from other data is refused, not trained on)."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            rows = {r["workload"]: r for r in csv.DictReader(f)}
    except OSError as e:
        raise FtgovError(f"cannot read {path}: {e.strerror or e} (write it with the `dataset` stage, or give "
                         "--dataset)") from e
    except (KeyError, csv.Error) as e:
        raise FtgovError(f"{path}: not a dataset written by `dataset` ({e})") from e
    labels = {}
    for s in sweeps:
        row = rows.get(s.workload)
        if row is None:
            raise FtgovError(f"{path} has no label for {s.workload}: write it again from this data (`dataset`)")
        try:
            vector = [float(row[name]) for name in FEATURE_ORDER]
            labels[s.workload] = int(row["label_hz"])
        except (KeyError, ValueError) as e:
            raise FtgovError(f"{path}: {s.workload}: bad or missing column ({e})") from e
        if vector != [float(f"{v:g}") for v in s.features.vector()]:
            raise FtgovError(f"{path}: {s.workload}'s features differ from the data's: write it again (`dataset`)")
        if labels[s.workload] not in s.energy_j:
            raise FtgovError(f"{path}: {s.workload}: label {labels[s.workload]} Hz is not a measured level")
    if len(rows) != len(sweeps):
        extra = sorted(set(rows) - {s.workload for s in sweeps})
        raise FtgovError(f"{path} labels workloads the data does not hold: {', '.join(extra)}")
    return labels


def add_data_argument(p: argparse.ArgumentParser, what: str) -> None:
    """--data, the characterization CSV a stage reads: by default the one shipped with ftgov (package data), so that a
    stage runs wherever ftgov is installed; the stages' outputs default to plain names in the current directory."""
    p.add_argument("--data", type=Path, default=shipped.path(shipped.CHARACTERIZATION),
                   help=f"{what} (default: the one shipped with ftgov)")


def add_file_argument(p: argparse.ArgumentParser, flag: str, name: str, what: str, more: str = "") -> None:
    """A file one stage writes and the next reads: by default ``name`` in the current directory, the same name on
    both sides, so that the stages chain with no paths given."""
    p.add_argument(flag, type=Path, default=Path(name),
                   help=f"{what} (default: %(default)s in the current directory{more})")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("dataset", help="label each characterized configuration with its energy-optimal level",
                              description="Write the training set: per configuration the five features and the label "
                              "(the energy optimum of the 1-2-1 smoothed curve).")
    add_data_argument(p, "characterization CSV")
    add_file_argument(p, "--out", "dataset.csv", "where to write it")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    n = write_dataset(args.data, args.out)
    print(f"{args.out}: {n} labelled configurations", file=sys.stderr)
    return 0
