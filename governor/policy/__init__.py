"""Policies: map a job's features to a GPU frequency (or to no pin at all).

- ``mlg``: the decision tree (governor.policy.tree), loaded from a JSON export; falls back to FFG with a logged reason
  when the model file is missing or invalid.
- ``ffg``: one configured frequency for every job.
- ``observe``: pins nothing, so the default governor runs; for baseline measurements.
- ``tune``: starts from MLG's pick; the daemon's tuner then moves it (governor.policy.tuner).
A tree's leaf or FFG's frequency need not be in this board's table: the pin is the nearest level at or above it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from governor.backends.base import nearest_level
from governor.errors import ModelError
from governor.features import FEATURE_ORDER, Features
from governor.policy.tree import DecisionTree, Split
from governor.units import mhz

log = logging.getLogger("ftgovd")


class PolicyName(str, Enum):
    MLG = "mlg"
    FFG = "ffg"
    OBSERVE = "observe"
    TUNE = "tune"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decision:
    policy: PolicyName  # the policy asked for
    freq_hz: int | None  # None: no pin
    reason: str
    fell_back_to: PolicyName | None = None  # the policy that decided instead (mlg without a tree: ffg)

    @property
    def label(self) -> str:
        """The name replies, logs and the state file carry: "mlg", or "mlg->ffg" after a fallback."""
        return self.policy.value if self.fell_back_to is None else f"{self.policy.value}->{self.fell_back_to.value}"

    @classmethod
    def from_label(cls, label: str, freq_hz: int | None, reason: str) -> Decision:
        asked, _, fell = label.partition("->")
        return cls(PolicyName(asked), freq_hz, reason, PolicyName(fell) if fell else None)


class Policy:
    """Decides for one GPU's table of levels."""

    def __init__(self, name: PolicyName | str, ffg_freq_hz: int, tree: DecisionTree | None,
                 fallback_reason: str = "", model_file: str | Path | None = None):
        self.name = PolicyName(name)
        self.ffg_freq_hz = ffg_freq_hz
        self.tree = tree
        self.fallback_reason = fallback_reason
        self.model_file = model_file  # where the tree came from

    @classmethod
    def from_config(cls, name: PolicyName | str, ffg_freq_hz: int, model_file: str | Path) -> Policy:
        name = PolicyName(name)
        if name is PolicyName.FFG:
            return cls(name, ffg_freq_hz, None)
        try:
            tree = DecisionTree.load(model_file)
        except ModelError as e:
            if name is PolicyName.OBSERVE:
                log.info("observe: no tree to report what MLG would pick: %s", e)
                return cls(name, ffg_freq_hz, None)
            return cls(name, ffg_freq_hz, None, fallback_reason=str(e))  # said by the daemon once it takes it: said()
        return cls(name, ffg_freq_hz, tree, model_file=model_file)

    def said(self) -> Policy:
        """Log what this policy decides from (the tree loaded, or why MLG falls back to FFG): once the daemon takes it,
        at start or at a reload it accepts; a reload it refuses must not log a fallback it never made."""
        if self.fallback_reason:
            log.warning("MLG falls back to FFG at %.0f MHz: %s", self.ffg_freq_hz / 1e6, self.fallback_reason)
        elif self.tree is not None:
            log.info("MLG tree loaded from %s (source: %s, %d nodes, leaves %s MHz)", self.model_file,
                     self.tree.source, len(self.tree.nodes), ", ".join(mhz(hz, unit=False)
                                                                       for hz in self.tree.leaves_hz()))
        return self

    def needs_gpu_util(self, features: Features, policy: PolicyName | None = None) -> bool:
        """Whether the decision for these features depends on gpu_util: the tree's path for them tests it."""
        name = PolicyName(policy) if policy is not None else self.name
        if name is PolicyName.FFG or self.tree is None:
            return False
        values = dict(zip(FEATURE_ORDER, features.model_copy(update={"gpu_util": 0.0}).vector(), strict=True))
        node = self.tree.nodes[0]
        while isinstance(node, Split):
            if node.feature == "gpu_util":
                return True
            node = self.tree.nodes[node.left if values[node.feature] <= node.threshold else node.right]
        return False

    def decide(self, features: Features, levels_hz: tuple[int, ...],
               policy: PolicyName | None = None) -> Decision:
        """The decision. gpu_util may be unknown (None) only where needs_gpu_util says it does not matter."""
        name = PolicyName(policy) if policy is not None else self.name
        if features.gpu_util is None:
            if self.needs_gpu_util(features, name):
                raise ValueError("gpu_util must be measured before this decision")
            features = features.model_copy(update={"gpu_util": 0.0})  # not on the path: any value decides the same
        if name is PolicyName.OBSERVE:
            why = "observe: no pin, the default governor runs"
            if self.tree is not None:
                would = self.tree.decide(features)
                level = nearest_level(levels_hz, would.freq_hz)
                if level == would.freq_hz:
                    why += f" (mlg would pick {mhz(level)}: {would.explain()})"
                else:  # one pick, two tables: say which number is whose
                    why += (f" (mlg would pick {mhz(level)}: the Orin tree's {mhz(would.freq_hz)} maps to "
                            f"{mhz(level)} on this GPU's table; {' -> '.join(would.path)})")
            return Decision(name, None, why)
        if name is PolicyName.FFG or self.tree is None:
            level = nearest_level(levels_hz, self.ffg_freq_hz)
            why = f"ffg: fixed {mhz(self.ffg_freq_hz)}"
            fell_back_to = None
            if name is not PolicyName.FFG:
                why = f"{name} fell back to ffg ({self.fallback_reason}); " + why
                fell_back_to = PolicyName.FFG
            return Decision(name, level, why + _level_note(level, self.ffg_freq_hz), fell_back_to)
        tree_decision = self.tree.decide(features)
        level = nearest_level(levels_hz, tree_decision.freq_hz)
        return Decision(name, level, f"{self.tree.source} tree: {tree_decision.explain()}"
                        + _level_note(level, tree_decision.freq_hz))


def _level_note(level_hz: int, wanted_hz: int) -> str:
    return "" if level_hz == wanted_hz else f" (nearest level {mhz(level_hz)})"


def combine(freqs_hz: list[int | None]) -> int | None:
    """THE rule for several jobs on one GPU: pin the highest frequency any job needs, so no job is slowed below its
    own pick. Jobs that pin nothing (observe) do not count; with none left, the GPU returns to its baseline (None)."""
    pins = [f for f in freqs_hz if f is not None]
    return max(pins) if pins else None
