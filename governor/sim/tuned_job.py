"""One simulated tuned job: the tuner driven step by step through the daemon's TuningSession, on a board read through
a meter. Every simulation of the `tune` policy runs this loop: ``ftgov evaluate`` (governor/pipeline/policies.py), the
learning board's jobs (governor/sim/learning.py) and the tuner benchmarks (benchmarks/bench_tuner.py, tuner_bound.py).

A board (``Board``) gives a level's step as it runs (``step``: noisy on the energy model) and noise-free
(``expected``). A meter (``METERS``) turns the steps into the progress reports the daemon reads, (steps, energy_j,
time_s) at each step's end:

- ``exact``: the steps' own energy and time summed (the board's noise is the only noise);
- ``gauss``: each window's steps scaled by 1 + N(0, noise_rel) in energy and, apart, in time, drawn as the window
  opens: a window reads its level's J/step and s/step times a Gaussian error of its own;
- ``nvml``, ``ina3221``: each step's time scattered and its power in two phases, read through the meter's updates
  (governor.sim.meters.MeteredSteps): NVML's counter at each step's end, as for a client that sends no step_end_s;
  the INA3221's average by the daemon's sampler at each refresh, steps counted between step ends (every client);
- ``nvml-edges``: the same steps, NVML's counter read at its update instants, as the daemon reads it when the client
  sends step_end_s (governor.sim.meters.EdgeSteps: an edge each 0.5 s, steps counted between step ends);
- ``nvml-replay``: read as nvml-edges, the steps replayed from the H200's recorded runs (their times and energies
  relative to each run's means, in order: governor.sim.meters.ReplaySteps) instead of the model's independent ones.

The windows follow the TunerConfig's rule (``rule``: ``steps``, warm-up then window_steps; ``time``, the daemon's
WindowRule on the meter's updates). The job starts pinned at ``start_hz`` and re-pins as each window closes (the next
step is the warm-up). It stops when the tuner converges (a tuner that follows its pick up, later: WATCHED_WINDOWS):
the rest of the job is charged at the chosen level's noise-free figures (``TunedJob.clean_energy_j``).

With ``saving`` (SavingRun) the job runs as the daemon runs one whose saving it measures (tuner.baseline_window):
the board idle before it, its first steps at the start pin until they stop speeding up (WarmUp), then the baseline
window unpinned at the default governor
(the top level, what it runs a busy GPU at), then the search, every step to the job's end, the windows waiting for
the meter to settle after each change of clock; the steps run at the pick after convergence are kept for the saving.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Protocol

from governor.config import TunerConfig
from governor.errors import FtgovError
from governor.policy.measured_saving import BaselineParts, MeasuredSaving
from governor.policy.tuner import OnlineTuner
from governor.policy.windows import (
    AVERAGE_SETTLE_UPDATES,
    COUNTER_SETTLE_UPDATES,
    Measurement,
    ProbeWindow,
    StepScatter,
    TuningSession,
    WindowRule,
)
from governor.sim.energy import Calibration, OrinEnergyModel, Workload
from governor.sim.meters import (
    EDGE_METERS,
    H200_LONG_TRACES,
    H200_RUNS,
    H200_TRACES,
    METER_UPDATE_S,
    EdgeSteps,
    MeteredSteps,
    ReplaySteps,
    StepSequence,
)

METERS = ("exact", "gauss", *METER_UPDATE_S, *EDGE_METERS)
RULES = ("steps", "time")
# A follow-up that has only watched its pick for this many windows is not simulated further (the rest of the job is
# charged at the pick, as if its watch saw no drift): benchmarks' time.
WATCHED_WINDOWS = 20
IDLE_SHARE = 1 / 3  # an idle board's power, of the top level's


class Board(Protocol):
    """What a tuned job runs on: per step at one level, joules and seconds."""

    name: str

    @property
    def levels_hz(self) -> tuple[int, ...]: ...

    def expected(self, level_hz: int) -> tuple[float, float]:
        """The noise-free step: (energy_j, time_s)."""
        ...

    def step(self, level_hz: int) -> tuple[float, float]:
        """One step as it runs (noisy where the board is): (energy_j, time_s)."""
        ...


class ModelBoard:
    """One workload on the simulated Orin's energy model (governor.sim.energy), its noise seeded by ``seed``."""

    def __init__(self, workload: Workload, noise: float = 0.0, seed: int = 0, calibration: Calibration | None = None):
        self.model = OrinEnergyModel(noise=noise, seed=seed, calibration=calibration)
        self.workload = workload
        self.name = workload.name

    @property
    def levels_hz(self) -> tuple[int, ...]:
        return tuple(self.model.levels_hz)

    def expected(self, level_hz: int) -> tuple[float, float]:
        s = self.model.expected(self.workload, level_hz)
        return s.energy_j, s.time_s

    def step(self, level_hz: int) -> tuple[float, float]:
        s = self.model.step(self.workload, level_hz)
        return s.energy_j, s.time_s


class ExactMeter:
    """The steps' energy and time, summed as they run."""

    update_s = 0.0
    on_updates = True  # an exact meter's readings have no held ends

    def __init__(self):
        self.steps, self.energy_j, self.time_s = 0, 0.0, 0.0

    def step(self, energy_j: float, time_s: float) -> tuple[int, float, float]:
        self.steps += 1
        self.energy_j += energy_j
        self.time_s += time_s
        return self.steps, self.energy_j, self.time_s

    def window_opened(self) -> None:
        pass


class GaussMeter(ExactMeter):
    """Each window's steps read at (1 + N(0, noise_rel)) times their energy and, drawn apart, their time."""

    def __init__(self, noise_rel: float, seed: int):
        super().__init__()
        self.noise_rel = noise_rel
        self._rng = random.Random(seed)
        self._energy_factor = self._time_factor = 1.0

    def step(self, energy_j: float, time_s: float) -> tuple[int, float, float]:
        return super().step(energy_j * self._energy_factor, time_s * self._time_factor)

    def window_opened(self) -> None:
        self._energy_factor = 1 + self._rng.gauss(0, self.noise_rel)
        self._time_factor = 1 + self._rng.gauss(0, self.noise_rel)


def make_meter(meter: str, seed: int = 0, noise_rel: float = 0.03) -> ExactMeter | MeteredSteps:
    """A meter by name (METERS); ``seed`` drives its noise, ``noise_rel`` is the gauss meter's."""
    if meter == "exact":
        return ExactMeter()
    if meter == "gauss":
        return GaussMeter(noise_rel, seed)
    if meter in METER_UPDATE_S:
        return MeteredSteps(meter, seed)
    if meter == "nvml-replay":
        return ReplaySteps(seed, h200_sequences())
    if meter in EDGE_METERS:
        return EdgeSteps(seed)
    raise ValueError(f"meter {meter!r}: one of {', '.join(METERS)}")


@functools.cache
def h200_sequences() -> tuple[StepSequence, ...]:
    """The H200's six recorded runs (three of 400 steps, three of 2,000), as the replay meter steps through them (read
    once)."""
    return tuple(StepSequence.h200(name, directory) for directory in (H200_TRACES, H200_LONG_TRACES)
                 for name in H200_RUNS)


@dataclass(frozen=True)
class SavingRun:
    """A tuned job run as the daemon runs one whose saving it measures (run_tuned_job's ``saving``)."""

    idle_s: float = 5.0  # the board idle before the job, at IDLE_SHARE of the top level's power (a meter's trace)
    settle: bool = True  # windows wait for the meter to settle after each change of clock (tuner.settle_updates)


def settle_s(cfg: TunerConfig, meter: str, update_s: float) -> float:
    """How long the daemon's windows wait after a change of clock on ``meter`` (governor.daemon.energy.MeterFeed)."""
    updates = cfg.settle_updates
    if updates is None:
        updates = COUNTER_SETTLE_UPDATES if EDGE_METERS.get(meter, meter) == "nvml" else AVERAGE_SETTLE_UPDATES
    return updates * update_s


def window_rule(meter: str) -> WindowRule:
    """The daemon's rule (TunerConfig's defaults) on this meter's updates."""
    rule = TunerConfig(window_rule="time").window(METER_UPDATE_S[EDGE_METERS.get(meter, meter)])
    assert rule is not None
    return rule


def _rule_for(reader: ExactMeter | MeteredSteps, rule: WindowRule | None) -> WindowRule | None:
    """``rule`` for windows on ``reader``'s points (governor.daemon.energy.MeterFeed.window_rule)."""
    return rule.on_updates() if rule is not None and reader.on_updates else rule


@dataclass
class TunedJob:
    """A simulated tuned job, run until its tuner converged."""

    session: TuningSession
    job_steps: int
    profiled_steps: int = 0  # steps run before the tuner converged (its search), warm-ups included
    baseline_steps: int = 0  # with a SavingRun: the steps run before the search (the first, the baseline window's)
    steps_at_hz: dict[int, int] = field(default_factory=dict)  # level -> steps run there before the tuner converged
    windows: list[Measurement] = field(default_factory=list)  # every window the tuner was given, in order
    window_at_steps: list[int] = field(default_factory=list)  # the job's step as each window closed
    windows_by_phase: dict[str, int] = field(default_factory=dict)  # the tuner's phase when it asked for each window
    measured_energy_j: float = 0.0  # what the meter read over the steps run
    measured_time_s: float = 0.0
    # With a SavingRun: the baseline window, the tuned side of the saving (as the daemon's JobTuner feeds it), the
    # job's energy as the daemon reports it at the end (the meter's), and the true energy of every step run (the
    # board's; on a meter with a trace, the trace's: its steps scatter around the board's figures).
    baseline: Measurement | None = None
    baseline_parts: BaselineParts | None = None  # the baseline's parts (tuner.baseline_parts), the first included
    default_steps: int = 0  # steps run at the default governor for the baseline: its parts, warm-ups included
    start_pin_steps: int = 0  # steps run at the start pin before the baseline (the wait for the steps' warm-up)
    measured: MeasuredSaving | None = None
    reported_energy_j: float | None = None
    true_energy_j: float = 0.0
    # The whole job of job_steps at noise-free figures: each step run within the job at its level's, the rest at the
    # chosen level's (a search longer than the job is charged up to the job's end only).
    clean_energy_j: float = 0.0
    clean_time_s: float = 0.0

    @property
    def tuner(self) -> OnlineTuner:
        return self.session.tuner  # type: ignore[return-value]  # run_tuned_job gives it an OnlineTuner

    @property
    def converged(self) -> bool:
        return self.session.converged

    @property
    def best_hz(self) -> int:
        return self.tuner.best_hz

    @property
    def probes(self) -> int:
        return self.tuner.probes

    @property
    def outlasted(self) -> bool:
        """The search ran past the job's last step."""
        return self.baseline_steps + self.profiled_steps > self.job_steps

    def saving(self) -> dict | None:
        """The measured saving as the daemon reports it at the job's end (MeasuredSaving.result); None without a
        SavingRun, a baseline or a tuned side."""
        if self.measured is None or self.baseline is None:
            return None
        baseline, parts = self.baseline, 1
        if self.baseline_parts is not None and self.baseline_parts.baseline is not None:
            baseline, parts = self.baseline_parts.baseline, self.baseline_parts.pooled_parts
        floor = self.tuner.noise_rel if baseline.noise_rel is None else 0.0
        return self.measured.result(baseline, self.best_hz, self.windows, baseline_floor_rel=floor,
                                    baseline_parts=parts)

    @property
    def window_steps(self) -> float:
        """Measured steps per window, mean."""
        return sum(m.measured_steps for m in self.windows) / max(1, len(self.windows))


def run_tuned_job(board: Board, start_hz: int, job_steps: int, *, meter: str = "exact", seed: int = 0,
                  noise_rel: float = 0.03, config: TunerConfig | None = None, rule: str | None = None,
                  tuner: OnlineTuner | None = None, max_steps: int | None = None,
                  must_converge: bool = True, saving: SavingRun | None = None) -> TunedJob:
    """Run a job of ``job_steps`` steps on ``board`` under the tuner from ``start_hz``, read through ``meter``
    (METERS; ``seed`` and ``noise_rel`` are its own), windows by ``rule`` (RULES; default the config's).

    ``config`` sets the windows (warmup_steps, window_steps, the rule's settings) and, unless ``tuner`` is given, the
    tuner's knobs. The search may run ``max_steps`` steps (default ``job_steps``); a tuner still searching then
    raises FtgovError if ``must_converge``, else the job ends there. ``saving``: the job runs as the daemon runs one
    whose saving it measures (SavingRun), every step of it.
    """
    # Exact counters in model time take 4-step windows and freeze the pick, as the rest of the job is charged at it;
    # a real meter's the daemon's defaults (time windows).
    cfg = config or (TunerConfig.exact_meter() if meter in ("exact", "gauss") else TunerConfig())
    if rule is not None:
        if rule not in RULES:
            raise ValueError(f"rule {rule!r}: one of {', '.join(RULES)}")
        cfg = cfg.model_copy(update={"window_rule": rule})
    if meter == "gauss" and cfg.window_rule == "time":
        raise ValueError("window rule time needs steps that scatter (meter exact, nvml, ina3221): a gauss meter "
                         "draws each window's error, not its steps'")
    reader = make_meter(meter, seed, noise_rel)
    online = tuner if tuner is not None else cfg.new_tuner(board.levels_hz, start_hz)
    wait_s = settle_s(cfg, meter, reader.update_s) if saving is not None and saving.settle else 0.0
    run = _Steps(board, reader, job_steps)
    start_steps = at_start_pin = 0
    if saving is not None:
        start_steps, at_start_pin = _baseline(run, cfg, start_hz, saving, wait_s)
    job = TunedJob(cfg.new_session(online, start_steps, total_steps=job_steps, meter_update_s=reader.update_s,
                                   settle_s=wait_s), job_steps)
    if reader.on_updates:  # as the daemon's MeterFeed tells its sessions
        job.session.ends_on_updates()
    job.baseline, job.baseline_steps = run.baseline, run.steps_run
    job.start_pin_steps = at_start_pin
    job.default_steps = max(0, run.steps_run - at_start_pin)
    if run.baseline is not None:
        job.baseline_parts = cfg.new_baseline_parts(job_steps)
        job.baseline_parts.first(run.baseline, run.steps_run)
    if saving is not None:
        job.measured = MeasuredSaving(cfg.noise_rel, cfg.window_steps,
                                      prior_s=cfg.window_min_s if cfg.window_rule == "time" else 0.0,
                                      meter_update_s=reader.update_s, settle_s=wait_s)
    session = job.session
    reader.window_opened()
    limit = job_steps if max_steps is None else max_steps
    hz = session.measuring_hz
    phase = online.state()["phase"]
    watched = 0  # windows that only watched the pick since it last moved or confirmed
    # The daemon's JobTuner states: CONVERGED (its steps are the saving's), CONFIRMING (its windows are).
    steady = confirming = False

    def going() -> bool:
        if saving is not None:
            return run.steps_run < (job_steps if session.converged else limit)
        if not session.converged:
            return job.profiled_steps < limit
        # A tuner that follows its pick up gets windows after converging too (confirming near-ties, watching for
        # drift), up to the job's end or until it has only watched for WATCHED_WINDOWS windows.
        return session.measuring and job.profiled_steps < job_steps and watched < WATCHED_WINDOWS

    while going():
        parts = job.baseline_parts
        if parts is not None and job.measured is not None and steady and parts.due(run.steps_run):
            # A later part of the baseline, unpinned (the daemon's JobTuner._measure_part), then back to the pick.
            job.measured.interrupt()
            before = run.steps_run
            closed = _at_default(run, cfg, wait_s, run.steps_run, step_prior=session.step_scatter)
            job.default_steps += run.steps_run - before
            if closed is None:
                parts.skip()
            else:
                parts.add(closed[0], run.steps_run)
            if session.measuring:
                session.repinned(run.steps_run)
            continue
        reports = run.step(hz)
        job.profiled_steps += 1
        job.steps_at_hz[hz] = job.steps_at_hz.get(hz, 0) + 1
        m = None
        for report in reports:
            if job.measured is not None and steady:
                job.measured.converged_at(hz, [report], on_updates=run.reader.on_updates)
            m = session.on_progress(*report)
            if m is not None:  # the rest of the step's edges fall in the next window's warm-up
                break
        if m is None:
            continue
        job.windows.append(m)
        job.window_at_steps.append(run.steps_run)
        job.windows_by_phase[phase] = job.windows_by_phase.get(phase, 0) + 1
        watched = watched + 1 if session.converged and not online.confirming else 0
        if job.measured is not None:
            if confirming:
                job.measured.window_at_pick(m)
            steady, confirming = online.converged and not online.confirming, online.converged and online.confirming
            if not steady:
                job.measured.interrupt()
        hz = session.measuring_hz if session.measuring else online.best_hz
        if session.measuring:
            phase = online.state()["phase"]
            reader.window_opened()
    job.measured_energy_j, job.measured_time_s = run.measured_energy_j, run.measured_time_s
    if saving is not None and isinstance(reader, MeteredSteps):
        job.reported_energy_j = reader.job_energy_j()
    job.clean_energy_j, job.clean_time_s, job.true_energy_j = run.clean_energy_j, run.clean_time_s, run.true_energy_j
    if isinstance(reader, MeteredSteps):  # its steps' times (and a replay's energies) scatter around the board's
        job.true_energy_j = reader.true_energy_j()
    if not session.converged and must_converge:
        raise FtgovError(f"{board.name}: the tuner had not converged after {job.profiled_steps} steps "
                         f"({session.profiled_steps} profiled); use a longer job")
    rest = max(0, job_steps - run.steps_run)
    clean_j, clean_s = board.expected(job.best_hz)
    job.clean_energy_j += rest * clean_j
    job.clean_time_s += rest * clean_s
    return job


class _Steps:
    """A job's steps as they run on ``board`` through ``reader``: the reports each gives, and the job's figures."""

    def __init__(self, board: Board, reader, job_steps: int):
        self.board, self.reader, self.job_steps = board, reader, job_steps
        self.steps_run = 0
        self.clean_energy_j = self.clean_time_s = 0.0
        self.true_energy_j = 0.0  # the board's energy of every step run
        self.measured_energy_j = self.measured_time_s = 0.0
        self.baseline: Measurement | None = None

    def step(self, hz: int) -> list[tuple[float, float, float]]:
        """One step at ``hz``: the reports it gives (a meter read at its updates, the edges that fell in the step,
        maybe none; the others the step's end)."""
        energy_j, time_s = self.board.step(hz)
        reader = self.reader
        metered = isinstance(reader, MeteredSteps)
        reports = reader.points(energy_j, time_s) if metered else [reader.step(energy_j, time_s)]
        self.steps_run += 1
        self.true_energy_j += energy_j
        if reports:
            self.measured_energy_j, self.measured_time_s = reports[-1][1], reports[-1][2]
        if self.steps_run <= self.job_steps:
            clean_j, clean_s = self.board.expected(hz)
            self.clean_energy_j += clean_j
            self.clean_time_s += clean_s
        return reports


def _baseline(run: _Steps, cfg: TunerConfig, start_hz: int, saving: SavingRun, wait_s: float) -> tuple[int, int]:
    """The daemon's steps before the search (tuner.baseline_window): the board idle, the first steps at the start
    pin until their time stops falling (tuner.baseline_warmup_max_s), then unpinned (the top level) for the baseline
    window (``run.baseline``). The step count the search starts at, and the steps run at the start pin."""
    board, reader = run.board, run.reader
    top_hz = board.levels_hz[-1]
    if saving.idle_s > 0:
        if not isinstance(reader, MeteredSteps):
            raise ValueError(f"an idle board before the job needs a meter with a trace (nvml, ina3221), not {reader}")
        top_j, top_s = board.expected(top_hz)
        reader.trace.append(saving.idle_s, IDLE_SHARE * top_j / top_s)
    # At the start pin until the job's steps stop speeding up (WarmUp: the simulated steps have no warm-up, so two
    # blocks of them); the daemon unpins as the report that ends the wait arrives.
    warmup = cfg.new_warmup()
    opening: list[tuple[float, float, float]] = []
    while run.steps_run < run.job_steps and not opening:
        reports = run.step(start_hz)
        for k, report in enumerate(reports):
            if report[0] >= 1 and warmup.feed(report[0], report[2]):
                opening = reports[k:]
                break
    pinned = run.steps_run  # the step that ended the wait ran pinned too: the unpin follows its report
    if not opening:
        return run.steps_run, pinned
    closed = _at_default(run, cfg, wait_s, opening[0][0], opening)
    if closed is None:
        return run.steps_run, pinned
    run.baseline, steps = closed
    return int(steps), pinned


def _at_default(run: _Steps, cfg: TunerConfig, wait_s: float, begin_steps: float,
                opening: list[tuple[float, float, float]] | None = None,
                step_prior: StepScatter | None = None) -> tuple[Measurement, float] | None:
    """A window of the baseline (its first part or a later one): steps at the default governor (the top level) from
    job step ``begin_steps``, the ``opening`` reports fed first, until the window closes: its measurement and the
    step count of the report that closed it (None if the job ends first)."""
    top_hz = run.board.levels_hz[-1]
    window = ProbeWindow(None, begin_steps, cfg.warmup_steps, cfg.window_steps,
                         rule=_rule_for(run.reader, cfg.baseline_window_rule(run.reader.update_s, run.job_steps)),
                         meter_update_s=run.reader.update_s, settle_s=wait_s, step_prior=step_prior)
    for report in opening or []:
        window.feed(*report)
    while run.steps_run < run.job_steps:
        for report in run.step(top_hz):
            m = window.feed(*report)
            if m is not None:
                return m, report[0]
    return None


def level_windows(meter: str, joules_per_step: float, seconds_per_step: float, seed: int, windows: int,
                  rule: WindowRule | None = None, window_steps: int = 4) -> list[Measurement]:
    """``windows`` consecutive windows at one level (no warm-up: the level does not change), as the daemon's
    ProbeWindow closes them on ``meter``'s readings (``nvml``, ``ina3221``): their Measurements."""
    steps = MeteredSteps(meter, seed)
    rule = _rule_for(steps, rule)
    out: list[Measurement] = []
    pending: list[tuple[float, float, float]] = []  # points not yet fed: a window may close inside a step
    report: tuple[float, float, float] = (0, 0.0, 0.0)
    while len(out) < windows:
        w = ProbeWindow(None, report[0], 0, window_steps, rule=rule, meter_update_s=steps.update_s)
        w.feed(*report)  # the window opens where the last one closed
        m = None
        while m is None:
            if not pending:
                pending = steps.points(joules_per_step, seconds_per_step)
                continue
            report = pending.pop(0)
            m = w.feed(*report)
        out.append(m)
    return out
