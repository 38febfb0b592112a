"""Read a characterization CSV back as one sweep per workload: features, energy and time per setting.

The tree's gpu_util feature is the utilization measured under MAXN: that is what the daemon sees when a job
registers without one, because the job runs under the board's default governor until the daemon pins a clock.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

from governor.errors import FtgovError
from governor.features import Features


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
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise FtgovError(f"cannot read {path}: {e.strerror or e}") from e
    by_workload: dict[str, list[dict]] = {}
    for r in rows:
        by_workload.setdefault(r["workload"], []).append(r)
    sweeps = [_sweep(name, group) for name, group in by_workload.items()]
    if not sweeps:
        raise FtgovError(f"{path} holds no measurements")
    levels = {s.levels_hz for s in sweeps}
    if len(levels) != 1:
        raise FtgovError(f"{path}: workloads were measured at different levels")
    return sweeps


def _sweep(name: str, rows: list[dict]) -> Sweep:
    maxn = [r for r in rows if r["setting"] == "maxn"]
    pinned = [r for r in rows if r["setting"] == "pinned"]
    if len(maxn) != 1 or not pinned:
        raise FtgovError(f"{name}: needs exactly one MAXN row and pinned rows (has {len(maxn)} and {len(pinned)})")
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


def sha256(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise FtgovError(f"cannot read {path}: {e.strerror or e}") from e
