"""Trimming the ranks that wait: once a synchronous group's level is chosen, lower each rank that finishes its compute
early, one level at a time, while the group's measured step time does not rise, and put it back when it does.

In a synchronous data-parallel step every rank waits at the all-reduce for the slowest. Nominally identical GPUs
differ in speed (8% on average, 22% at most: SC'22), so at one level for the whole group the faster ranks idle part of
every step; a lower clock on them costs nothing in step time, and saves their dynamic power. What a rank's clock may be
lowered to is measured, never modelled: a trial that makes the group's step time rise beyond ``tolerance_rel`` is
undone, and that rank is done. The ranks' compute times (each rank's own, up to the collective) only order the trials:
the rank that waits the most first.

Nothing here touches hardware: the daemon's group tuner (governor.daemon.groups) and the benchmark's simulation
(benchmarks/bench_groups.py) feed it one window at a time.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A window whose step time is within this of the reference counts as "did not rise". Each kept trial may carry a
# rise hidden in one window's noise, and a group keeps many: on the simulated groups (benchmarks/bench_groups.py, 0.2%
# step-time noise a window) 0.5% let the p99 slowdown reach 1.2% at 64 ranks, 0.3% keeps it under 1% at 4 to 64 ranks.
DEFAULT_TOLERANCE_REL = 0.003

Rank = Hashable


@dataclass
class Trimmer:
    """``levels_hz``: the table (ascending); ``group_hz``: the group's level; ``ranks``: the ranks to trim.

    Feed ``observe(step_s, compute_s)`` one window at a time, with each rank at ``level_of(rank)``: the group's step
    time over the window and each rank's mean compute time per step in it (None: not reported; the trials then go in
    rank order). The first window is the reference, at the group's level on every rank. Each later window judges the
    trial open: kept if the step time stayed within ``tolerance_rel`` of the reference (the rank is tried one level
    lower next), else undone (the rank is done). ``done`` once every rank is; ``undo_rise`` then keeps watching: a
    window that rises beyond the tolerance raises the rank trimmed last by one level.
    """

    levels_hz: Sequence[int]
    group_hz: int
    ranks: Sequence[Rank]
    tolerance_rel: float = DEFAULT_TOLERANCE_REL
    offsets: dict = field(default_factory=dict)  # rank -> levels below the group's level
    reference_s: float | None = None
    trying: Rank | None = None
    windows: int = 0
    _queue: list = field(default_factory=list)
    _trimmed: list = field(default_factory=list)  # ranks in the order they were last lowered

    def __post_init__(self) -> None:
        self.levels_hz = sorted(self.levels_hz)
        if self.group_hz not in self.levels_hz:
            raise ValueError(f"group_hz {self.group_hz} is not one of the levels")
        self.offsets = {r: 0 for r in self.ranks}

    @property
    def done(self) -> bool:
        return self.reference_s is not None and self.trying is None and not self._queue

    def level_of(self, rank: Rank) -> int:
        return self.levels_hz[self.levels_hz.index(self.group_hz) - self.offsets[rank]]

    def _can_lower(self, rank: Rank) -> bool:
        return self.levels_hz.index(self.group_hz) - self.offsets[rank] > 0

    def observe(self, step_s: float, compute_s: Mapping[Any, float | None] | None = None) -> None:
        self.windows += 1
        if self.reference_s is None:
            self.reference_s = step_s
            compute = compute_s or {}
            slowest = max(self.ranks, key=lambda r: compute.get(r) or 0.0) if compute else None
            # The rank that waits the most first; the slowest rank sets the step time: never trimmed.
            order = sorted((r for r in self.ranks if r != slowest), key=lambda r: compute.get(r) or 0.0)
            self._queue = [r for r in order if self._can_lower(r)]
            self._next()
            return
        rose = step_s > self.reference_s * (1.0 + self.tolerance_rel)
        if self.trying is None:
            if rose and self._trimmed:  # drift after the trials: give back one level where it was taken last
                self._raise(self._trimmed[-1])
            return
        rank = self.trying
        if rose:
            self._raise(rank)
            self._next()
        elif self._can_lower(rank):
            self._lower(rank)
        else:
            self._next()

    def _next(self) -> None:
        self.trying = None
        while self._queue:
            rank = self._queue.pop(0)
            if self._can_lower(rank):
                self._lower(rank)
                return

    def _lower(self, rank: Rank) -> None:
        self.trying = rank
        self.offsets[rank] += 1
        if rank in self._trimmed:
            self._trimmed.remove(rank)
        self._trimmed.append(rank)

    def stop(self) -> None:
        """No more trials (a move failed): the levels stay as they are."""
        self.trying = None
        self._queue.clear()

    def _raise(self, rank: Rank) -> None:
        self.offsets[rank] -= 1
        if self.offsets[rank] == 0:
            self._trimmed.remove(rank)

    def state(self) -> dict:
        return {"done": self.done, "windows": self.windows, "reference_s": self.reference_s,
                "trying": self.trying, "levels_hz": {str(r): self.level_of(r) for r in self.ranks}}
