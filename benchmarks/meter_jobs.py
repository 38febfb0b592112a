"""Tuning jobs read through a simulated meter, for benchmarks/bench_tuner.py and tuner_bound.py (``--meter``).

A curve gives each level's J/step and s/step; its power is their ratio (J/s). A job on a meter is run step by step:
each step's length scatters by STEP_TIME_CV around the level's s/step (gamma distributed), its power follows the two
phases of governor.sim.meters (PHASES) around the level's power, and the job reports its step count, the meter's energy
and the time at every step's end, to the daemon's own TuningSession (governor.policy.windows), which sizes the windows
(1 warm-up + 4 steps, or a WindowRule) and hands the tuner their J/step, s/step and, with a rule, their own noise_rel.

Meters (METERS):

- ``nvml``: NVML's energy counter, updated every 100 ms (with its measured jitter) and held between, read at each
  step's end: a window's edges fall up to one update stale;
- ``ina3221``: a Jetson's rails, each reading the mean power over the 140 ms before the sensor's last refresh,
  integrated by trapezoids over the daemon's reads: its sampler's, one every refresh (at a phase of its own), and one
  at each step's end, as the daemon adds a read at every progress report of a client that sends no step end times.
  Windows end at the steps' ends on both meters.

``gauss`` (bench_tuner's own default) is not here: each window there is the curve times (1 + N(0, noise)), with no
steps to size by a rule (tuner_curves.run_window_job).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.tuner_curves import WATCHED_WINDOWS, Curve, JobResult
from governor.policy.windows import TuningSession, WindowRule
from governor.sim.meters import (
    NVML_UPDATE_JITTER_S,
    NVML_UPDATE_S,
    STEP_TIME_CV,
    PowerTrace,
    UpdateClock,
    append_step,
    averaged_power_w,
    held_energy_j,
)

INA3221_UPDATE_S = 0.140  # hwmon update_interval of the simulated Orin's tree
METER_UPDATE_S = {"nvml": NVML_UPDATE_S, "ina3221": INA3221_UPDATE_S}
METERS = tuple(METER_UPDATE_S)
# A search still open after this many steps is a bug in the tuner or here, not a slow curve.
MAX_STEPS = 200_000


class MeteredSteps:
    """One job's true power, step by step, and what ``meter`` reads of it at each step's end (``step``)."""

    def __init__(self, meter: str, seed: int, step_cv: float = STEP_TIME_CV):
        if meter not in METER_UPDATE_S:
            raise ValueError(f"meter {meter!r}: one of {', '.join(METERS)}")
        self.meter = meter
        self.update_s = METER_UPDATE_S[meter]
        self._rng = random.Random(seed)
        self._shape = 1.0 / (step_cv * step_cv) if step_cv > 0 else None
        origin_s = self._rng.uniform(0.0, self.update_s)  # the job starts anywhere in the meter's period
        jitter_s = NVML_UPDATE_JITTER_S if meter == "nvml" else 0.0
        self.clock = UpdateClock(self.update_s, jitter_s=jitter_s, origin_s=origin_s, seed=seed)
        self.trace = PowerTrace(0.0, keep_s=2.0)
        self.steps = 0
        self._rails_j = 0.0  # ina3221: the readings integrated over the daemon's reads
        self._last: tuple[float, float] | None = None  # ina3221: (time_s, power_w) of the last read
        self._sample_s = self._rng.uniform(0.0, self.update_s)  # ina3221: the sampler's next read

    @property
    def time_s(self) -> float:
        return self.trace.end_s

    def step(self, joules_per_step: float, seconds_per_step: float) -> tuple[int, float, float]:
        """Run one step at a level of this J/step and s/step; the report at its end: (steps, energy_j, time_s)."""
        duration = (seconds_per_step if self._shape is None
                    else self._rng.gammavariate(self._shape, seconds_per_step / self._shape))
        before = self.time_s
        append_step(self.trace, duration, joules_per_step / seconds_per_step)
        self.steps += 1
        t = self.time_s
        if self.meter == "nvml":
            return self.steps, held_energy_j(self.trace, self.clock, t), t
        if self._last is None:
            self._last = (before, averaged_power_w(self.trace, self.clock, before))
        while self._sample_s < t:
            self._read(self._sample_s)
            self._sample_s += self.update_s
        self._read(t)
        return self.steps, self._rails_j, t

    def _read(self, t_s: float) -> None:
        w = averaged_power_w(self.trace, self.clock, t_s)
        last_s, last_w = self._last
        self._rails_j += (t_s - last_s) * (w + last_w) / 2.0
        self._last = (t_s, w)


def window_rule(meter: str) -> WindowRule:
    """The daemon's rule (WindowRule's defaults) on this meter's updates."""
    return WindowRule(meter_update_s=METER_UPDATE_S[meter])


@dataclass
class MeterJob(JobResult):
    outlasted: bool = False  # the search ran past the job's last step (the rest of the search is not charged)
    window_steps: float = 0.0  # measured steps per window, mean


def run_meter_job(tuner, curve: Curve, meter: str, seed: int, job_steps: int,
                  rule: WindowRule | None = None) -> MeterJob:
    """Drive ``tuner`` through the daemon's TuningSession on ``curve`` read by ``meter``, step by step, until it
    converges (with a tuner that follows its pick up, on as run_window_job does). Every step of the job's ``job_steps``
    is charged at the noise-free J/step of the level it ran at (warm-up steps and long windows included; a search that
    outlasts the job is charged only up to its end), so the job's energy compares exactly with a job run at one
    level."""
    steps = MeteredSteps(meter, seed)
    session = TuningSession(tuner, 0, total_steps=job_steps, rule=rule, meter_update_s=steps.update_s)
    energy_j = 0.0
    at: dict[int, int] = {}
    by_phase: dict[str, int] = {}
    measured: list[int] = []
    hz = session.measuring_hz
    phase = tuner.state()["phase"]
    watched = 0
    while not session.converged or (session.measuring and steps.steps < job_steps and watched < WATCHED_WINDOWS):
        if steps.steps >= MAX_STEPS and not session.converged:
            raise RuntimeError(f"{curve.name}: no convergence in {MAX_STEPS} steps on {meter}")
        i = curve.levels_hz.index(hz)
        report = steps.step(curve.energy_j[i], curve.time_s[i])
        at[hz] = at.get(hz, 0) + 1
        if steps.steps <= job_steps:
            energy_j += curve.energy_j[i]
        m = session.on_progress(*report)
        if m is not None:
            by_phase[phase] = by_phase.get(phase, 0) + 1
            measured.append(m.measured_steps)
            phase = tuner.state()["phase"]
            watched = watched + 1 if session.converged and not tuner.confirming else 0
            hz = session.measuring_hz if session.measuring else tuner.best_hz
    energy_j += max(0, job_steps - steps.steps) * curve.energy_at(tuner.best_hz)
    return MeterJob(tuner.best_hz, tuner.probes, steps.steps, energy_j, at, by_phase,
                    outlasted=steps.steps > job_steps, window_steps=sum(measured) / max(1, len(measured)))


def level_windows(meter: str, joules_per_step: float, seconds_per_step: float, seed: int, windows: int,
                  rule: WindowRule | None = None, window_steps: int = 4) -> list:
    """``windows`` consecutive windows at one level (no warm-up: the level does not change), as the daemon's
    ProbeWindow closes them on ``meter``'s readings: their Measurements."""
    from governor.policy.windows import ProbeWindow

    steps = MeteredSteps(meter, seed)
    out = []
    report = (0, 0.0, 0.0)
    while len(out) < windows:
        w = ProbeWindow(None, report[0], 0, window_steps, rule=rule, meter_update_s=steps.update_s)
        w.feed(*report)
        m = None
        while m is None:
            report = steps.step(joules_per_step, seconds_per_step)
            m = w.feed(*report)
        out.append(m)
    return out
