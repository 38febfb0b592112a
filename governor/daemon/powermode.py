"""The power mode's cap: nvpmodel's modes cap the GPU through max_freq (AGX Orin MODE_30W: 612 MHz; 15 W and 50 W
have their own). ftgovd never pins above the max found before its first pin unless pin_above_power_mode allows it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from governor.backends.base import Gpu, Limits
from governor.daemon import logs
from governor.errors import BackendError
from governor.policy import Decision
from governor.units import mhz

log = logging.getLogger("ftgovd")


class Pinned(Protocol):
    """What the cap reads of a GPU's pin (governor.daemon.gpupin.GpuPin)."""

    gpu: Gpu
    baseline: Limits | None


class PowerModeCap:
    """pin_above: pin_above_power_mode in the settings in force (the controller sets it again on a reload)."""

    def __init__(self, gpus: Mapping[str, Pinned], pin_above: bool = False):
        self.gpus = gpus  # the controller's, shared: a baseline taken there is the cap here
        self.pin_above = pin_above

    def ceiling_hz(self, gpu_id: str) -> int | None:
        """The highest clock a pin may take: the max_freq found before our first pin, which is the power mode's cap
        (nvpmodel writes it: AGX Orin MODE_30W 612 MHz), unless pin_above_power_mode. None: no ceiling."""
        if self.pin_above:
            return None
        ctl = self.gpus[gpu_id]
        if ctl.baseline is not None:
            return ctl.baseline.max_hz
        logs.flush()  # a hardware read follows: the lines before it must be out should it hang
        try:
            return ctl.gpu.snapshot().max_hz
        except BackendError as e:
            log.warning("GPU %s: cannot read the power mode's cap: %s", gpu_id, e)
            return None

    def allowed_levels(self, gpu_id: str) -> tuple[int, ...]:
        """The GPU's levels a pin may take (see ceiling_hz); the lowest level at least."""
        return self._under(gpu_id, self.ceiling_hz(gpu_id))

    def _under(self, gpu_id: str, ceiling: int | None) -> tuple[int, ...]:
        levels = self.gpus[gpu_id].gpu.levels_hz
        if ceiling is None:
            return levels
        return tuple(hz for hz in levels if hz <= ceiling) or levels[:1]

    def clamp(self, ctl: Pinned, target_hz: int) -> int:
        """What a pin of target_hz may write: itself, or the highest level under the cap of ctl's baseline (taken
        before its first pin, or what another tool set since: governor.daemon.checks). Every pin goes through it,
        so a tuner's next level or a re-applied pin stays under a power mode that changed after the decision."""
        if self.pin_above or ctl.baseline is None or target_hz <= ctl.baseline.max_hz:
            return target_hz
        return self._under(ctl.gpu.id, ctl.baseline.max_hz)[-1]

    def within(self, gpu_id: str, decision: Decision) -> Decision:
        """The decision, moved down to the highest level under the power mode's cap when it is above it."""
        if decision.freq_hz is None:
            return decision
        ceiling = self.ceiling_hz(gpu_id)
        if ceiling is None or decision.freq_hz <= ceiling:
            return decision
        level = self._under(gpu_id, ceiling)[-1]  # the ceiling just read: not a second read of the limits
        note = f"capped by the power mode at {mhz(ceiling)}" + ("" if level == ceiling else f" (level {mhz(level)})")
        return replace(decision, freq_hz=level, reason=f"{decision.reason}; {note}")
