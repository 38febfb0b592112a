"""The policies `ftgov evaluate` compares, behind one small interface.

A policy sees a workload the way the daemon does (its Features, gpu_util measured under MAXN) and picks a level, or
None for MAXN. ``probe`` lets a policy measure a level the way a running job would (per-step energy, time and
utilization at that level) — unused by the static policies, it is the hook for an online tuner
(governor/tuning.py, ``OnlineTuner(levels_hz, start_hz, max_slowdown=None)``): a ``TunerPolicy`` would call
``next_level_hz()``, ``probe`` that level, ``observe`` it, until ``converged``, and return ``best_hz()``; the steps
spent probing then belong in its energy, which is why a pick may carry them (``Pick.probe_steps``). Add it to
``build_policies`` (or pass it in ``extra``) and the table, JSON and plots include it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from governor.backends.base import nearest_level
from governor.errors import FtgovError
from governor.pipeline.dataset import Sweep
from governor.tree import DecisionTree


@dataclass(frozen=True)
class Probe:
    """What a job running at one level for a while would show: per-step energy and time, utilization."""

    freq_hz: int
    energy_j: float  # per step
    time_s: float  # per step
    gpu_util_pct: float


ProbeFn = Callable[[int], Probe]


@dataclass(frozen=True)
class Pick:
    freq_hz: int | None  # None: MAXN
    probe_steps: dict[int, int] = field(default_factory=dict)  # level -> steps spent there before settling


class Policy(Protocol):
    name: str

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick: ...


@dataclass(frozen=True)
class Maxn:
    name: str = "maxn"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return Pick(None)


@dataclass(frozen=True)
class Fixed:
    """FFG: one level for every workload."""

    freq_hz: int
    name: str = "ffg"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return Pick(nearest_level(sweep.levels_hz, self.freq_hz))


@dataclass(frozen=True)
class Tree:
    """MLG: a decision tree over the workload's features (the daemon's evaluator, not scikit-learn)."""

    tree: DecisionTree
    name: str

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return Pick(nearest_level(sweep.levels_hz, self.tree.decide(sweep.features).freq_hz))


@dataclass(frozen=True)
class Oracle:
    """The per-workload optimum, known only after measuring every level: the bound no policy can beat."""

    name: str = "oracle"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return Pick(sweep.optimum_hz)


def load_ffg_hz(path: Path) -> int:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise FtgovError(f"cannot read FFG frequency from {path}: {e}") from e
    hz = doc.get("freq_hz") if isinstance(doc, dict) else None
    if not isinstance(hz, int) or isinstance(hz, bool) or hz <= 0:
        raise FtgovError(f"{path}: freq_hz must be a positive integer (Hz)")
    return hz


def build_policies(ffg_path: Path, paper_tree: Path, mlg_tree: Path, extra: list[Policy] | None = None) -> list[Policy]:
    """MAXN first (the baseline every saving is measured against), the oracle last."""
    policies: list[Policy] = [Maxn(), Fixed(load_ffg_hz(ffg_path)), Tree(DecisionTree.load(paper_tree), "paper"),
                              Tree(DecisionTree.load(mlg_tree), "mlg")]
    return policies + list(extra or []) + [Oracle()]
