"""The `observe` policy's measurement: the tuner's windows, run read-only on a job at the clock it already has.

Observe pins nothing. So that an operator can see what `tune` would measure on this GPU and this job before letting
it move clocks, each observed job that reports progress gets the same windows a tuned job would (the config's
``tuner.window_rule``, on the job's own meter: the GPU's energy counter on NVML, the rails on a Jetson), one after
another at the unchanged clock. Each closed window is logged (J/step, steps, seconds) and kept for the measurement
store (as windows at no pinned level); ``status`` shows the last window and the spread of successive windows: how
far two windows of the job at one clock disagree, which is what a tuner's comparison between two levels has to beat.
"""

from __future__ import annotations

import logging
import math

from governor.config import TunerConfig
from governor.daemon.energy import MeterFeed
from governor.errors import FtgovError
from governor.policy.windows import Measurement, ProbeWindow, StepScatter

log = logging.getLogger("ftgovd")

KEPT = 64  # windows kept per job for the spread and the store: a long job keeps its most recent ones
INFO_FIRST, INFO_EVERY = 5, 60  # windows logged at info: the first ones, then one in INFO_EVERY


def successive_spread(values: list[float]) -> float | None:
    """The relative spread of successive windows: the RMS of their differences over sqrt(2), over the mean (for
    independent windows of equal noise, the noise of one window). None with fewer than two."""
    if len(values) < 2:
        return None
    diffs = [b - a for a, b in zip(values, values[1:], strict=False)]
    mean = sum(values) / len(values)
    return math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2) / mean if mean > 0 else None


class JobObserver:
    """The windows of one observed job. Same hooks as governor.daemon.tuning.JobTuner (progress, set_total_steps,
    describe, saving, finish, windows), so that the daemon drives and records both alike; it never moves a pin."""

    def __init__(self, gov, job, cfg: TunerConfig):
        self.cfg = cfg
        # The tuner's own feed of meter edges: the same windows, read the same way (governor.daemon.energy).
        self.feed = MeterFeed(gov.energy, gov.gpus[job.gpu_id].gpu, gov.defer, cfg.edge_every_s)
        self.meter = self.feed.meter
        if self.meter is None:
            raise FtgovError("no energy source (no rails, no GPU counter)")
        self.rule = cfg.window(self.meter.update_s)
        self._window: ProbeWindow | None = None
        self._scatter: StepScatter | None = None  # the steps' scatter in the windows closed so far, pooled
        self.windows: list[tuple[Measurement, float | None]] = []  # for the store, as a tuned job's: the last KEPT
        self.closed = 0  # windows closed in all
        self.status = "waiting for progress reports"

    keep_hz = None  # a restarted daemon re-adopts an observed job at its own level: observe moves no pin

    def progress(self, gov, job) -> None:
        if self.meter is None:
            return
        points = self.feed.report_points(job)
        if self._window is None:
            if job.steps < 1:
                return
            # The first window of a job discards warm-up steps (the loop's first steps compile and allocate); the
            # clock never changes under observe, so the windows after it start where the last one ended.
            self._window = self._new_window(job.steps, self.cfg.warmup_steps if not self.closed else 0)
            self.status = "measuring"
            return
        for steps, energy_j, time_s in points:
            try:
                m = self._window.feed(steps, energy_j, time_s, job.phase or "train")
            except FtgovError as e:
                log.warning("%s: observe windows stopped: %s", job.label(), e, extra=job.fields())
                self.meter, self.status = None, f"stopped: {e}"
                return
            if m is not None:
                # The steps' scatter in the windows so far is the next one's prior, as a tuner's session pools it.
                self._scatter = self._window.scatter_with(self._scatter)
                self._window = self._new_window(steps, 0)
                self._closed(job, m)

    def _new_window(self, steps: float, warmup_steps: int) -> ProbeWindow:
        return ProbeWindow(None, steps, warmup_steps, self.cfg.window_steps, rule=self.feed.window_rule(self.rule),
                           meter_update_s=self.meter.update_s, step_prior=self._scatter)

    def _closed(self, job, m: Measurement) -> None:
        self.windows.append((m, job.features.gpu_util))
        del self.windows[:-KEPT]
        self.closed += 1
        spread = self.spread_rel()
        # The first windows at info, where an operator trying observe looks, then one in INFO_EVERY: a job observed for
        # hours logged a line a window (6 a minute at the time rule's cap), as a tuner's watching windows are kept to
        # debug for (status and the store have the last KEPT windows).
        level = logging.INFO if self.closed <= INFO_FIRST or self.closed % INFO_EVERY == 0 else logging.DEBUG
        log.log(level, "%s: observe window %d: %.4f J/step, %.4f s/step over %d steps in %.2f s%s", job.label(),
                 self.closed, m.joules_per_step, m.seconds_per_step, m.measured_steps, m.duration_s or 0.0,
                 "" if spread is None else f"; successive windows differ by {100 * spread:.1f}%",
                 extra={**job.fields(), "OBSERVE_J_PER_STEP": f"{m.joules_per_step:.6f}",
                        "OBSERVE_STEPS": m.measured_steps, "OBSERVE_S": f"{m.duration_s or 0.0:.3f}"})

    def spread_rel(self) -> float | None:
        return successive_spread([m.joules_per_step for m, _ in self.windows])

    def set_total_steps(self, gov, job) -> None:
        """A job's length changes nothing here: observe has no budget to spend."""

    def describe(self) -> dict:
        last = self.windows[-1][0] if self.windows else None
        return {"mode": "observe", "status": self.status, "rule": self.cfg.window_rule, "windows": self.closed,
                "spread_rel": self.spread_rel(), "unreported_pauses": self.feed.gaps,
                "last_window": None if last is None else {
                    "joules_per_step": last.joules_per_step, "seconds_per_step": last.seconds_per_step,
                    "steps": last.measured_steps, "seconds": last.duration_s, "noise_rel": last.noise_rel}}

    def saving(self) -> None:
        return None

    def finish(self, job) -> None:
        return None

    def unmeasured_why(self) -> None:
        """Nothing to say of a saving: observe pins nothing, so it measures none by design."""
        return None
