"""How real energy meters report, in one place: the simulated board's INA3221 rails, the fake NVML's energy counter and
power reading, and the benchmarks all read a true power trace through these models.

Calibrated on real NVML readings from an H200 (benchmarks/data/h200-meter, read every ~5 ms and at every step's end):

- the energy counter and the power reading move only at update instants NVML_UPDATE_S (100 ms) apart (median 100.0
  ms; the 5 ms polling puts p10-p90 at 96-103 ms, so the instants' own jitter is at most a few ms) and hold between
  them: a read returns the energy accumulated up to the last update, and the power averaged over the last period;
- step times scatter with a coefficient of variation of 13-17% (STEP_TIME_CV is the middle).

The INA3221 (hwmon, a Jetson's rails) reports the average over its ``update_interval`` and refreshes at it: the same
model as NVML's power reading, with the period read from the tree's hwmon attribute. MeteredSteps reads a job's
steps through either meter for the simulated tuned jobs (governor/sim/tuned_job.py): NVML's counter as it holds, at
each step's end; the INA3221's readings as the daemon integrates them, its sampler at the sensor's refresh, each read
an edge of the windows with the steps counted between step ends.

Power within a step follows two phases (PHASES): forward/backward, the longer and hungrier part, then the optimizer
step and data loading. The split is a stated assumption, not a measurement: the H200's 100 ms readings cannot resolve
a 26-82 ms step, and no Jetson trace at a finer grain than its 140 ms average has been recorded.

The model's steps scatter independently of each other; the H200's do not: successive steps' times correlate (lag-1
autocorrelation +0.2 to +0.5) and their means drift, in anti-phase with the power, while the SM clock held 1980 MHz
(the GPU waiting on the host: its utilization falls as they lengthen), so sums of many steps scatter more than
independent ones would.
A model step's energy moves with its time at its level's power. A real step's scatters less: over 1-s windows on the
counter's updates J/step scattered 0.32-0.81 times s/step on the eleven H200 runs (the time a step runs over is mostly
the GPU waiting on the host, at low power), but its windows scattered as much as the model's or more, the steps
correlating and drifting (docs/benchmarks.md, "baseline-drift"). The model keeps the two errors, which cancel at a
window's length; a step's energy at half the elasticity, its steps still independent, made the simulated 1-s windows
scatter 1.3-2.2% where the real ones scatter 3.2-4.6% (an experiment of 2026-12, not kept).
ReplaySteps (``nvml-replay``) replays the real runs' own steps instead: each simulated step takes the time and energy
of the next step of a real trace (StepSequence), relative to that run's means, so windows see the real drift and
correlation at any level's step time and power.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from governor.backends.rails import EnergyMeter

NVML_UPDATE_S = 0.100
NVML_UPDATE_JITTER_S = 0.002
STEP_TIME_CV = 0.15
# (share of the step's time, power relative to the step's mean): forward/backward 80% of the step at 1.11x, the
# optimizer step and data loading 20% at 0.56x. Their time-weighted mean is 1, so a step's energy is unchanged.
PHASES = ((0.8, 1.0 / 0.9), (0.2, 0.5 / 0.9))


class PowerTrace:
    """Piecewise-constant power over time, appended in order: the truth that meters read. Segments older than
    ``keep_s`` behind the end are forgotten, so a long-running fake keeps a bounded history."""

    def __init__(self, t0_s: float, keep_s: float | None = None):
        self._t = [float(t0_s)]  # segment edges
        self._e = [0.0]  # energy (J) up to each edge
        self._w: list[float] = []  # power (W) of each segment
        self.keep_s = keep_s

    @property
    def start_s(self) -> float:
        """The earliest instant still kept."""
        return self._t[0]

    @property
    def end_s(self) -> float:
        return self._t[-1]

    def append(self, duration_s: float, power_w: float) -> None:
        if duration_s <= 0:
            return
        self._e.append(self._e[-1] + duration_s * power_w)
        self._t.append(self._t[-1] + duration_s)
        self._w.append(float(power_w))
        if self.keep_s is not None and len(self._t) > 64 and self._t[1] < self._t[-1] - self.keep_s:
            cut = bisect.bisect_left(self._t, self._t[-1] - self.keep_s) - 1
            if cut > 0:
                del self._t[:cut], self._e[:cut], self._w[:cut]

    def energy_j(self, t_s: float) -> float:
        """Energy from the trace's origin to ``t_s`` (clamped to the span kept)."""
        t_s = min(max(t_s, self._t[0]), self._t[-1])
        i = max(0, bisect.bisect_right(self._t, t_s) - 1)
        if i >= len(self._w):
            return self._e[-1]
        return self._e[i] + (t_s - self._t[i]) * self._w[i]

    def mean_w(self, t0_s: float, t1_s: float) -> float:
        """Mean power over [t0_s, t1_s]; the power at t1_s's segment when the interval is empty."""
        if t1_s <= t0_s:
            i = min(len(self._w) - 1, max(0, bisect.bisect_right(self._t, t1_s) - 1))
            return self._w[i] if self._w else 0.0
        return (self.energy_j(t1_s) - self.energy_j(t0_s)) / (t1_s - t0_s)


@dataclass(frozen=True)
class UpdateClock:
    """A meter's update instants: ``origin_s + k * period_s``, each moved by up to ``jitter_s`` (deterministic in k and
    ``seed``, so any reader at any time sees the same instants). period_s 0: an exact meter, updated at every read."""

    period_s: float = NVML_UPDATE_S
    jitter_s: float = NVML_UPDATE_JITTER_S
    origin_s: float = 0.0
    seed: int = 0

    def instant(self, k: int) -> float:
        u = zlib.crc32(f"{self.seed}/{k}".encode()) / 2**32 * 2.0 - 1.0
        return self.origin_s + k * self.period_s + self.jitter_s * u

    def last_at(self, t_s: float) -> float:
        """The last update instant at or before ``t_s`` (``t_s`` itself for an exact meter)."""
        if self.period_s <= 0:
            return t_s
        k = math.floor((t_s - self.origin_s) / self.period_s) + 1
        while self.instant(k) > t_s:
            k -= 1
        return self.instant(k)

    def previous(self, t_s: float) -> float:
        """The update instant before the one at ``t_s`` (an instant of this clock)."""
        if self.period_s <= 0:
            return t_s
        k = round((t_s - self.origin_s) / self.period_s)
        return self.instant(k - 1)


def held_energy_j(trace: PowerTrace, clock: UpdateClock, t_s: float) -> float:
    """An NVML-style energy counter read at ``t_s``: the energy up to its last update, held since."""
    return trace.energy_j(clock.last_at(t_s))


def averaged_power_w(trace: PowerTrace, clock: UpdateClock, t_s: float) -> float:
    """A power reading that refreshes at the clock's instants and reports the mean over the period before each (NVML's
    power reading; an INA3221 over its hwmon update_interval). An exact clock reports the power at ``t_s``."""
    last = clock.last_at(t_s)
    if clock.period_s <= 0:
        return trace.mean_w(t_s, t_s)
    return trace.mean_w(clock.previous(last), last)


def step_times_s(mean_s: float, seed: int, cv: float = STEP_TIME_CV) -> Iterator[float]:
    """Step durations with the measured scatter: gamma distributed (positive, skewed to long steps as real ones are),
    mean ``mean_s``, coefficient of variation ``cv``."""
    rng = random.Random(seed)
    if cv <= 0:
        while True:
            yield mean_s
    shape = 1.0 / (cv * cv)
    while True:
        yield rng.gammavariate(shape, mean_s / shape)


def append_step(trace: PowerTrace, duration_s: float, mean_w: float) -> None:
    """One step of ``duration_s`` whose mean power is ``mean_w``, in its phases (PHASES)."""
    for share, ratio in PHASES:
        trace.append(share * duration_s, ratio * mean_w)


class Ina3221:
    """A board's rails as its INA3221 reports them: each reading is the mean power over the ``update_s`` before the
    sensor's last refresh, and holds until the next. The true power is set by the board (``set``): steady, or, while
    steps run, in PHASES on the rails in ``phased`` (the GPU's), each step's length scattering by STEP_TIME_CV around
    the step time given. Powers are in mW throughout."""

    def __init__(self, t0_s: float, update_s: float, phased: tuple[str, ...] = (), seed: int = 0):
        self.clock = UpdateClock(update_s, jitter_s=0.0, origin_s=t0_s)
        self.phased = phased
        self._t0 = t0_s
        self._end = t0_s  # the true power is known up to here (a running step is laid down whole)
        self._traces: dict[str, PowerTrace] = {}
        self._state: tuple[dict[str, float], float | None] = ({}, None)
        self._rng = random.Random(seed)
        self._first_mw: dict[str, float] = {}

    def set(self, t_s: float, rails_mw: dict[str, float], step_s: float | None) -> None:
        """From ``t_s`` (once the step running then has ended) the rails draw ``rails_mw`` on average."""
        self._extend(t_s)
        if not self._traces:
            self._first_mw = dict(rails_mw)  # what the rails read until the sensor's first refresh
        for name in rails_mw:
            if name not in self._traces:
                self._traces[name] = PowerTrace(self._end, keep_s=max(2.0, 4 * self.clock.period_s))
        self._state = (dict(rails_mw), step_s)

    def rescale(self, t_s: float, update_s: float) -> None:
        """Refresh every ``update_s`` from the last refresh before ``t_s`` on (a simulation's time compressed)."""
        if update_s != self.clock.period_s:
            self.clock = UpdateClock(update_s, jitter_s=0.0, origin_s=self.clock.last_at(t_s))

    @property
    def steady_mw(self) -> dict[str, float]:
        """The rails' mean power in the state set last (what readings settle to)."""
        return dict(self._state[0])

    @property
    def stepping(self) -> bool:
        return self._state[1] is not None

    def reading(self, t_s: float) -> dict[str, float]:
        """What the rails read at ``t_s``: each the mean over the interval before the last refresh."""
        last = self.clock.last_at(t_s)
        self._extend(last)
        start = max(self.clock.previous(last), self._t0)
        if last <= start:
            return dict(self._first_mw)
        return {name: 1000.0 * trace.mean_w(max(start, trace.start_s), last)
                for name, trace in self._traces.items() if name in self._state[0]}

    def next_refresh_s(self, t_s: float) -> float:
        return self.clock.last_at(t_s) + self.clock.period_s

    def _extend(self, t_s: float) -> None:
        rails, step_s = self._state
        if not rails:
            self._end = max(self._end, t_s)
            return
        while self._end < t_s:
            if step_s is None:
                duration, phases = t_s - self._end, ((1.0, 1.0),)
            else:
                shape = 1.0 / (STEP_TIME_CV * STEP_TIME_CV)
                duration, phases = self._rng.gammavariate(shape, step_s / shape), PHASES
            for name, trace in self._traces.items():
                mean_w = rails.get(name, 0.0) / 1000.0
                for share, ratio in (phases if name in self.phased else ((1.0, 1.0),)):
                    trace.append(share * duration, ratio * mean_w)
            self._end += duration


INA3221_UPDATE_S = 0.140  # hwmon update_interval of the simulated Orin's tree
METER_UPDATE_S = {"nvml": NVML_UPDATE_S, "ina3221": INA3221_UPDATE_S}


class MeteredSteps:
    """One job's true power, step by step, and what ``meter`` reads of it: ``points``, what the daemon's windows take
    of each step (NVML's counter read at the step's end, as for a client that sends no step_end_s; the INA3221's
    sampler samples that fell in the step, steps counted between the step's ends, as for every client)."""

    def __init__(self, meter: str, seed: int, step_cv: float = STEP_TIME_CV):
        if meter not in METER_UPDATE_S:
            raise ValueError(f"meter {meter!r}: one of {', '.join(METER_UPDATE_S)}")
        self.meter = meter
        self.update_s = METER_UPDATE_S[meter]
        self.on_updates = meter == "ina3221"  # the sampler's samples; NVML's counter is read where a step ends
        self._rng = random.Random(seed)
        self._shape = 1.0 / (step_cv * step_cv) if step_cv > 0 else None
        origin_s = self._rng.uniform(0.0, self.update_s)  # the job starts anywhere in the meter's period
        jitter_s = NVML_UPDATE_JITTER_S if meter == "nvml" else 0.0
        self.clock = UpdateClock(self.update_s, jitter_s=jitter_s, origin_s=origin_s, seed=seed)
        self.trace = PowerTrace(0.0, keep_s=2.0)
        self.steps = 0
        self.start_j = 0.0  # what the meter read as the first step began (the job's registration)
        self._true_start_j = 0.0  # the trace's energy then
        # ina3221, from the first step: the daemon's meters, the tuner's and the job's own, each integrating the
        # sampler's reads alone.
        self._rails: EnergyMeter | None = None
        self._job: EnergyMeter | None = None
        self._sample_s = self._rng.uniform(0.0, self.update_s)  # ina3221: the sampler's next read

    @property
    def time_s(self) -> float:
        return self.trace.end_s

    def step(self, joules_per_step: float, seconds_per_step: float) -> tuple[int, float, float]:
        """NVML: run one step at a level of this J/step and s/step; the counter read at its end: (steps, energy_j,
        time_s). The INA3221 is read by the daemon's sampler alone, never at a step's end: ``points``."""
        if self.meter != "nvml":
            raise ValueError(f"{self.meter} is read by the daemon's sampler, not at step ends: use points()")
        before = self._run(joules_per_step, seconds_per_step)
        if self.steps == 1:
            self.start_j = held_energy_j(self.trace, self.clock, before)
        return self.steps, held_energy_j(self.trace, self.clock, self.time_s), self.time_s

    def points(self, joules_per_step: float, seconds_per_step: float) -> list[tuple[float, float, float]]:
        """Run one step; the (steps, energy_j, time_s) points the daemon's windows take of it (see the class)."""
        if self.meter == "nvml":
            return [self.step(joules_per_step, seconds_per_step)]
        n0, t0 = self.steps, self.time_s
        self._run(joules_per_step, seconds_per_step)
        t1 = self.time_s
        return [(n0 + (t_s - t0) / (t1 - t0), e_j, t_s) for t_s, e_j in self._sample_until(t1) if t_s > t0]

    def _draw(self, joules_per_step: float, seconds_per_step: float) -> tuple[float, float]:
        """The next step at a level of this J/step and s/step as it runs: (its duration_s, its mean power_w). Its
        time scatters (gamma, the step_cv given), its power is the level's."""
        duration = (seconds_per_step if self._shape is None
                    else self._rng.gammavariate(self._shape, seconds_per_step / self._shape))
        return duration, joules_per_step / seconds_per_step

    def _run(self, joules_per_step: float, seconds_per_step: float) -> float:
        """One step's power into the trace (``_draw``); the time it began."""
        duration, mean_w = self._draw(joules_per_step, seconds_per_step)
        before = self.time_s
        append_step(self.trace, duration, mean_w)
        self.steps += 1
        if self.steps == 1:
            self._true_start_j = self.trace.energy_j(before)
        if self.meter != "nvml" and (self._rails is None or self._job is None):  # the job registers
            self._rails = EnergyMeter(before, self._mw(before), self.update_s)
            self._job = EnergyMeter(before, self._mw(before), self.update_s)
            self._sample_s += math.ceil((before - self._sample_s) / self.update_s) * self.update_s
        return before

    def _sample_until(self, t_s: float) -> list[tuple[float, float]]:
        """The sampler's reads up to ``t_s`` into the INA3221's meters: (time_s, the tuner's meter's energy_j) each."""
        assert self._rails is not None and self._job is not None
        out = []
        while self._sample_s < t_s:
            mw = self._mw(self._sample_s)
            out.append((self._sample_s, self._rails.add(self._sample_s, mw)))
            self._job.add(self._sample_s, mw)
            self._sample_s += self.update_s
        return out

    def window_opened(self) -> None:
        """Nothing: the meter reads steps, it knows no windows."""

    def true_energy_j(self) -> float:
        """The energy the steps really took, from the first's beginning to the last's end (the trace's own)."""
        return self.trace.energy_j(self.time_s) - self._true_start_j

    def job_energy_j(self) -> float:
        """The job's energy as the daemon reports it at the end of the last step: NVML's counter since the first
        began, the INA3221's readings over its sampler to then (EnergyMeter.total_j)."""
        t = self.time_s
        if self.meter == "nvml":
            return held_energy_j(self.trace, self.clock, t) - self.start_j
        return 0.0 if self._job is None else self._job.total_j(t, self._mw(t))

    def _mw(self, t_s: float) -> float:
        return 1000.0 * averaged_power_w(self.trace, self.clock, t_s)


# A meter read on its update instants, as the daemon reads NVML's counter when the client sends step_end_s
# (governor.daemon.energy.MeterFeed): one edge each EDGE_EVERY_S (tuner.window_min_s / 2), steps counted between step
# ends. Named apart from the meters read at step ends, whose windows carry up to an update's error at each end.
# nvml-replay: the same, over steps replayed from the H200's recorded runs (ReplaySteps), not the model's.
EDGE_METERS = {"nvml-edges": "nvml", "nvml-replay": "nvml"}
EDGE_EVERY_S = 0.5


class EdgeSteps(MeteredSteps):
    """NVML's counter read at its update instants: ``points`` gives, for each step, the edges that fell in it, each
    with the counter's exact value there and the steps run by then (fractional between the step's ends)."""

    def __init__(self, seed: int, every_s: float = EDGE_EVERY_S, step_cv: float = STEP_TIME_CV):
        super().__init__("nvml", seed, step_cv)
        self.on_updates = True
        self.stride = max(1, int(every_s / self.update_s + 1e-9))
        self._k = 1  # the next update whose edge is taken (origin_s + k * update_s; origin_s is under one period)

    def points(self, joules_per_step: float, seconds_per_step: float) -> list[tuple[float, float, float]]:
        n0, t0 = self.steps, self.time_s
        self.step(joules_per_step, seconds_per_step)
        t1 = self.time_s
        out = []
        while (t := self.clock.instant(self._k)) <= t1:
            if t > t0:
                out.append((n0 + (t - t0) / (t1 - t0), self.trace.energy_j(t), t))
            self._k += self.stride
        return out



# Real runs' steps, replayed: the H200 traces of a checkout (benchmarks/data/h200-meter; the replay meter serves the
# benchmarks, which run from one).
H200_TRACES = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200-meter"  # 400 steps a run
H200_LONG_TRACES = H200_TRACES.parent / "h200-meter-2000"  # 2,000 steps a run, the SM clock read too
H200_RUNS = ("bert-small-L6H512", "bert-base-L12H768", "bert-large-L24H1024")  # the same three shapes in each


def read_h200(name: str, directory: Path = H200_TRACES) -> tuple[list[tuple[int, float, float]],
                                                                   list[tuple[float, float]]]:
    """One recorded run: its step-end reports (steps, energy_j, time_s), the counter read right after each step,
    and the counter's update instants (time_s, energy_j), each the first 5 ms sample that shows a new value."""
    with open(directory / f"{name}-steps.csv") as f:
        reports = [(int(r["step"]), int(r["energy_counter_mj"]) / 1000.0, float(r["t_s"])) for r in csv.DictReader(f)]
    with open(directory / f"{name}-samples.csv") as f:
        samples = [(float(r["t_s"]), int(r["energy_counter_mj"]) / 1000.0) for r in csv.DictReader(f)]
    updates = [(t, e) for (_, prev), (t, e) in zip(samples, samples[1:], strict=False) if e != prev]
    return reports, updates


class CounterBetweenUpdates:
    """A recorded energy counter as a function of time: linear between its update instants (time_s, energy_j), so
    that an instant between two updates gets its share of the energy the later one reports."""

    def __init__(self, name: str, updates: Sequence[tuple[float, float]]):
        self.updates = list(updates)
        self.times_s = [t for t, _ in self.updates]
        if len(self.times_s) < 2 or any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise ValueError(f"{name}: the counter's updates must be at least two, in time order")

    def __call__(self, t_s: float) -> float:
        i = min(len(self.times_s) - 1, max(1, bisect.bisect_left(self.times_s, t_s)))
        (t0, e0), (t1, e1) = self.updates[i - 1], self.updates[i]
        return e0 + (e1 - e0) * (t_s - t0) / (t1 - t0)


@dataclass(frozen=True)
class StepSequence:
    """A real run's steps in order, each relative to the run's mean step: its time and its energy. The energy of a
    step is the counter between its ends, interpolated linearly between the counter's updates (100 ms apart on an
    H200, so power within that is not resolved: a step's energy is its time times the power of the updates around
    it). Steps outside the updates' span are left out."""

    name: str
    time_rel: tuple[float, ...]
    energy_rel: tuple[float, ...]

    @classmethod
    def from_readings(cls, name: str, step_ends_s: Sequence[float],
                      updates: Sequence[tuple[float, float]]) -> StepSequence:
        energy_j = CounterBetweenUpdates(name, updates)
        times = energy_j.times_s
        ends = [t for t in step_ends_s if times[0] <= t <= times[-1]]
        steps = [(b - a, energy_j(b) - energy_j(a)) for a, b in zip(ends, ends[1:], strict=False)]
        if len(steps) < 2 or any(d <= 0 or e <= 0 for d, e in steps):
            raise ValueError(f"{name}: {len(steps)} steps within the counter's updates; need at least two, each "
                             "with time and energy")
        mean_s = math.fsum(d for d, _ in steps) / len(steps)
        mean_j = math.fsum(e for _, e in steps) / len(steps)
        return cls(name, tuple(d / mean_s for d, _ in steps), tuple(e / mean_j for _, e in steps))

    @classmethod
    def h200(cls, name: str, directory: Path = H200_TRACES) -> StepSequence:
        if not directory.is_dir():
            raise FileNotFoundError(f"no H200 traces at {directory}: the replay meter reads a checkout's "
                                    "benchmarks/data/h200-meter")
        reports, updates = read_h200(name, directory)
        return cls.from_readings(name, [t for _, _, t in reports], updates)

    def __len__(self) -> int:
        return len(self.time_rel)


class ReplaySteps(EdgeSteps):
    """NVML's counter read at its update instants (EdgeSteps), over steps replayed from real runs (``sequences``):
    each step the level's J/step and s/step times the real step's energy and time relative to its run's means. A
    replay starts at a seeded point of a seeded run, in a seeded direction, and steps through it in order; at the
    run's end it goes on from a new random point of a random run, so that a long job's replay repeats no period (a
    period would alias with anything spread at equal steps over the job, such as the baseline's parts). The update
    clock is the meter's own; the recorded run's power within its 100 ms updates is spread over each step in PHASES."""

    def __init__(self, seed: int, sequences: Sequence[StepSequence], every_s: float = EDGE_EVERY_S):
        super().__init__(seed, every_s)
        self._replay_rng = random.Random(f"replay/{seed}")
        self._sequences = tuple(sequences)
        self._jump()

    def _jump(self) -> None:
        rng = self._replay_rng
        self.sequence = self._sequences[rng.randrange(len(self._sequences))]
        self._next = rng.randrange(len(self.sequence))
        self._direction = rng.choice((1, -1))

    def _draw(self, joules_per_step: float, seconds_per_step: float) -> tuple[float, float]:
        if not 0 <= self._next < len(self.sequence):
            self._jump()
        time_rel, energy_rel = self.sequence.time_rel[self._next], self.sequence.energy_rel[self._next]
        self._next += self._direction
        duration = seconds_per_step * time_rel
        return duration, joules_per_step * energy_rel / duration
