"""Energy for the daemon's jobs: the board's INA3221 rails integrated over time (Jetson), else the GPU's own counter."""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable

from governor.backends.base import Gpu
from governor.backends.rails import CounterMeter, CounterReads, EnergyMeter, Rails
from governor.errors import BackendError
from governor.policy.windows import (
    AVERAGE_SETTLE_UPDATES,
    COUNTER_SETTLE_UPDATES,
    SHORT_PHASE_S,
    UpdateEdges,
    WindowRule,
)

log = logging.getLogger("ftgovd")

POWER_CACHE_S = 0.02
GRID_KNOWN_S = 0.01  # a tenth of NVML's 100 ms update period
GRID_WAIT_S = 2.0
READS_IDLE_S = 2.0  # the timer's reads stop this long after a job's last report with step_end_s

Defer = Callable[[Callable[[], None], float], None]


class BoardEnergy:
    def __init__(self, rails: Rails | None):
        self.rails = rails
        self._power_cache: tuple[float, float] = (-1.0, 0.0)  # (when, mW) of the last read that succeeded
        self._failing = False  # the last read failed (logged once a run of failures, not at every sample)
        self._counters: dict[str, CounterReads] = {}  # GPU id -> its counter's reads, shared by its meters

    def read_mw(self) -> float | None:
        """Board power now (ENERGY_RAILS), or None when the rails cannot be read now. Reused for POWER_CACHE_S: the
        INA3221 itself refreshes only every update_interval, so a burst of registrations need not read eight files
        each. A board's rails are read over I2C, and a read can fail: the failure is logged when it starts and ends."""
        if self.rails is None:
            return None
        now = time.monotonic()
        if now - self._power_cache[0] < POWER_CACHE_S:
            return self._power_cache[1]
        try:
            mw = self.rails.total_mw(self.rails.read_mw())
        except BackendError as e:
            if not self._failing:
                log.warning("cannot read the power rails: %s (energy bridges the failed reads with the readings "
                            "on either side)", e)
            self._failing = True
            return None
        if self._failing:
            log.info("the power rails read again")
        self._failing = False
        self._power_cache = (now, mw)
        return mw

    def total_mw(self) -> float:
        """Board power now (ENERGY_RAILS): the last reading that succeeded where this one fails (the sensor's own
        reading, too, holds between refreshes), 0 without rails or before any read succeeded. A failed read is
        never a power of 0 mW in a job's energy."""
        mw = self.read_mw()
        return self._power_cache[1] if mw is None else mw

    def new_meter(self, gpu: Gpu):
        """An energy meter from now: rails integrated over time (Jetson), else the GPU's own energy counter (NVML),
        else None. Feed it ``meter.add(time.monotonic(), self.total_mw())``; a counter meter ignores the power."""
        if self.rails is not None and self.rails.energy_rails:
            return EnergyMeter(time.monotonic(), self.total_mw(), self.rails.update_interval_s)
        if gpu.has_energy_counter:
            try:
                reads = self._counters.get(gpu.id)
                if reads is None:
                    reads = self._counters[gpu.id] = CounterReads(gpu.energy_j, f"GPU {gpu.id}'s energy counter")
                return CounterMeter(reads)
            except BackendError as e:
                # the error says why (no counter on this GPU, or the GPU not answering): the words are its own
                log.warning("GPU %s's energy counter cannot be read, so this job's energy goes unmeasured: %s",
                            gpu.id, e)
        return None

    def counter_reads(self, gpu_id: str) -> CounterReads | None:
        """The GPU's energy counter as its meters read it (their count and cost, for status); None: not read."""
        return self._counters.get(gpu_id)

    def source(self) -> str:
        if self.rails is not None:
            return "+".join(self.rails.energy_rails)
        return "GPU energy counter (whole GPU)"

    def sample(self, jobs: Iterable) -> None:
        """Integrate energy for the jobs given (their meters, and their tuners' own), at one power reading."""
        if self.rails is None:
            return
        meters = []
        for job in jobs:
            meters += [m for m in (job.meter, getattr(job.tuner, "meter", None))
                       if isinstance(m, EnergyMeter) and m not in meters]
        if not meters:
            return
        t, mw = time.monotonic(), self.read_mw()
        if mw is None:
            return  # a failed read adds no sample: the next good one integrates across the gap
        for meter in meters:
            meter.add(t, mw)

    @property
    def refresh_s(self) -> float | None:
        """How often the sampler reads the rails while jobs run: the INA3221's refresh (None: no rails to read)."""
        if self.rails is None or not self.rails.energy_rails:
            return None
        return self.rails.update_interval_s


# The CPU a job's energy-counter reads may take, as a share of a core (issue 23: the sampler at most 1% of a core while
# jobs run). A read of NVML's counter cost 3.9-9.5 ms of CPU on an H200 (scripts/daemon_cpu.py), against 5-10 us for
# a power reading: the reads are paced by what each costs, measured as they are made.
COUNTER_READ_CPU_FRAC = 0.008
# A read's cost is the mean of the last few (the mean, not the least: a driver may answer some reads from a cache and
# others not, and an H200's cost 4 and 12 ms in turn), but the dearest is left out where it is over OUTLIER_COST times
# their median (a garbage collection or a preemption adds to one read). A pace from the mean but the dearest always
# read 7% too often on the H200, over the budget. A counter that reads in under PACED_READ_MIN_S (100 reports a
# second would cost 1% of a core) is read as often as asked. Until READ_COSTS_MIN reads are timed the reads are not
# paced: one read preempted on a busy host cost 1 ms where its neighbours cost 40 us, and a pace taken from it alone
# (125 ms) skipped a whole update of the counter.
READ_COSTS_KEPT = 8
READ_COSTS_MIN = 3
OUTLIER_COST = 2.0
PACED_READ_MIN_S = 0.0001

# A pause the job does not report (a plain loop's checkpoint save, an epoch's new DataLoader workers, an HF Trainer's
# save_strategy="best" decided after its evaluation): two step ends further apart than the steps between them take by
# more than GAP_MIN_S and GAP_STEPS of the job's steps (the median of its last STEP_TIMES_KEPT reports, once
# STEP_TIMES_MIN are in). Spread over the next step as the points count steps, a 60 s save at 80 W read a 20-step
# baseline part of 50 ms steps at 300 W 17 times dearer, and a measured saving of 20% came out at -86% +/- 460. Such a
# gap is cut out of the points as a reported pause is (MeterFeed's docstring). Steps that scatter 13-17% (the H200's)
# never come near it.
GAP_MIN_S = SHORT_PHASE_S  # a stretch shorter than that is training, reported or not
GAP_STEPS = 3.0
STEP_TIMES_KEPT = 32
STEP_TIMES_MIN = 4
# Two long steps in a row are the job slowing down (another workload) when they take alike, within this ratio; a long
# step unlike the last one is another pause (a host's 1 s stall right before a checkpoint save: the save, taken for a
# slowdown, read a window 6 times dearer).
SLOWDOWN_RATIO = 2.0
PACE_POINTS_KEPT = 16  # the points before a gap whose J and s a step stand in for the step that held it


class MeterFeed:
    """A job's own energy meter, and what each of its progress reports gives measurement windows: (steps, energy_j,
    time_s) points. With the step's end time (``job.step_end_s``): the meter's update instants (NVML's counter) or
    samples (the rails' sampler) since the last such report, each with the steps run by then, counted fractionally
    between the two reports' step ends, so a window's ends are the meter's. Without it (an older client): on the
    rails, the same with each report's arrival as its step's end (the rails are read by the sampler alone, never at a
    report, so no reading is locked to the steps' phase); on a counter, the report itself as it arrives, with the
    energy read then. Shared by the tuner's windows and observe's, so that observe measures what tune would.
    ``meter`` is None where there is no energy source.

    A change of phase (``job.phase``: eval, checkpoint, data, then train again) cuts the points: what ran between
    the two reports was not steps of one phase. The report that leaves training gives one point of its new phase (a
    window fed it pauses: ProbeWindow.feed), and the report that comes back gives one training point at its arrival,
    where the windows go on, and starts the steps' count afresh from there: the step end it carries is the last
    training step's, before the evaluation, and counted from there the evaluation's energy would have been spread
    over the next step. That point's energy is the meter's as of its last update (a counter's) or sample (the rails')
    and what the pause drew since, at the pause's own mean power: waiting for the next edge instead cost a job that
    evaluates every 2 s most of its training between (on an H100 the first edge came a second after).

    A pause the job does not report (GAP_MIN_S) is cut out the same way, found by its length: the points across it
    are dropped, and from the first point after it every point's energy and time are less what the gap drew and
    lasted beyond the pace of the steps before it (the step or two around it counted at that pace), so windows, the
    baseline's parts and the steps at the pick read the steps' own J. The job's own energy (``energy_j``, the meter)
    keeps all of it."""

    def __init__(self, energy: BoardEnergy, gpu: Gpu, defer: Defer | None = None, edge_every_s: float = 0.0,
                 meter: EnergyMeter | None = None):
        self.meter = meter if meter is not None else energy.new_meter(gpu)  # ``meter``: one already integrated
        counter = isinstance(self.meter, CounterMeter)
        self._edges = UpdateEdges(self.meter.update_s if counter else 0.0, every_s=edge_every_s)
        # A counter is also read on a timer (defer: the daemon's loop), at the instants UpdateEdges asks for: reports
        # at the counter's own pace (the HF callback's 10 a second against NVML's 100 ms) never show the grid.
        self._defer = defer if counter else None
        self._reading = False
        self._timed_j: float | None = None  # the timer's last read
        self._last_report_s = -math.inf
        self._last_end: tuple[int, float] | None = None  # (steps, step_end_s) of the last report that had one
        self._seen_s = -math.inf  # the rails' samples up to here are edges already
        self.grid_found = not counter  # a sampler's samples are exact in time from the first
        # The last report's points sit on the meter's updates (a counter's edges) or samples (the rails', always).
        self.on_updates = not counter
        self._timed_since: float | None = None  # the first report with step_end_s, while the grid is not known
        self._edge_every_s = edge_every_s
        self._read_costs_s: collections.deque[float] = collections.deque(maxlen=READ_COSTS_KEPT)
        self._report_read_s = -math.inf  # an older client's last report that read the counter
        self._phase: str | None = None  # the phase of the last report (None: none yet)
        self._paused_at: tuple[float, float] | None = None  # (time_s, energy_j) of the reading as training paused
        # Unreported pauses (GAP_MIN_S): the job's recent seconds a step, the points since the last gap (raw, for its
        # pace), the last point before a gap not yet cut, and what the gaps cut so far (J, s).
        self._step_times_s: collections.deque[float] = collections.deque(maxlen=STEP_TIMES_KEPT)
        self._recent: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=PACE_POINTS_KEPT)
        self._gap_from: tuple[float, float, float] | None = None
        self._cut_j = self._cut_s = 0.0
        self._gap_last: float | None = None  # the last report's step ends held one: its seconds a step
        self.gaps = 0  # unreported pauses cut out
        self.read_error: str | None = None  # why the counter could not be read at the last report that read it

    def settle_s(self, updates: float | None = None) -> float:
        """How long the meter takes to show a change of clock or an unpin wholly: ``updates`` of its updates (None:
        its own, NVML's counter its next update, 100 ms; the INA3221's average two of its update_interval, read from
        the tree)."""
        if self.meter is None:
            return 0.0
        if updates is None:
            updates = COUNTER_SETTLE_UPDATES if isinstance(self.meter, CounterMeter) else AVERAGE_SETTLE_UPDATES
        return updates * self.meter.update_s

    def energy_j(self, job) -> float:
        if not isinstance(self.meter, CounterMeter):
            return self.meter.energy_j  # the sampler's samples alone: none locked to the steps' phase
        if self._timer_serves():
            return self._timed_j  # type: ignore[return-value]  # the edges come from the timer's reads alone
        return self._read()

    def report_points(self, job) -> list[tuple[float, float, float]]:
        """What one progress report gives windows (points). An older client's report (no step_end_s) reads a counter
        at most once a pace_s (a read has its cost): the reports in between give nothing, and windows end on those
        that read."""
        phase = job.phase or "train"
        if phase != self._phase:
            was, self._phase = self._phase, phase
            if was is not None:
                self._recent.clear()  # the pace of a gap is the training steps'
                self._gap_last = None
                return self._less_gaps(self._phase_changed(job, phase))
        if job.step_end_s is None and isinstance(self.meter, CounterMeter):
            now_s = time.monotonic()
            if now_s - self._report_read_s < self.pace_s():  # a cheap counter: read at every report
                return []
            self._report_read_s = now_s
        try:
            energy_j = self.energy_j(job)
        except BackendError as e:
            # A counter that cannot be read now (a GPU off the bus, NVML's Unknown or Timeout once): no point, and
            # the windows wait for the next read (the counter counts on meanwhile, so the window loses nothing).
            # Raised, it failed the whole report, at every report for as long as it lasted: a warning line each,
            # and the load sampler and the job's group never heard of its steps.
            if self.read_error is None:
                log.warning("%s: its energy counter cannot be read: %s; its windows wait for it (said again when "
                            "it reads)", job.label(), e, extra=job.fields())
            self.read_error = str(e)
            return []
        if self.read_error is not None:
            log.info("%s: its energy counter reads again", job.label(), extra=job.fields())
            self.read_error = None
        return self._less_gaps(self.points(job, energy_j))

    def _less_gaps(self, points: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
        """``points`` less what the unreported pauses so far drew and lasted (the class's docstring). The first point
        after a gap sets the cut: what it and the last point before the gap span, less its steps at the pace of the
        points before the gap."""
        out = []
        for point in points:
            if self._gap_from is not None:
                steps0, j0, s0 = self._gap_from
                steps = max(0.0, point[0] - steps0)
                pace = self._pace()
                j_step, s_step = pace if pace is not None else (0.0, 0.0)
                self._cut_j += max(0.0, point[1] - j0 - steps * j_step)
                self._cut_s += max(0.0, point[2] - s0 - steps * s_step)
                self._gap_from = None
                self._recent.clear()
            self._recent.append(point)
            out.append((point[0], point[1] - self._cut_j, point[2] - self._cut_s))
        return out

    def _pace(self) -> tuple[float, float] | None:
        """J and s a step over the points since the last gap; None: too few."""
        if len(self._recent) < 2:
            return None
        (n0, j0, s0), (n1, j1, s1) = self._recent[0], self._recent[-1]
        return None if n1 <= n0 else ((j1 - j0) / (n1 - n0), (s1 - s0) / (n1 - n0))

    def _unreported_pause(self, job, prev: tuple[int, float], end: tuple[int, float]) -> bool:
        """Whether the two step ends hold a pause the job did not report (GAP_MIN_S); the job's step times meanwhile."""
        (n0, t0), (n1, t1) = prev, end
        if n1 <= n0:
            return False
        gap_s = t1 - t0
        step_s = statistics.median(self._step_times_s) if len(self._step_times_s) >= STEP_TIMES_MIN else None
        long = step_s is not None and gap_s - (n1 - n0) * step_s > max(GAP_MIN_S, GAP_STEPS * step_s)
        per_step_s = gap_s / (n1 - n0)
        last = self._gap_last
        if not long or (last is not None and max(per_step_s, last) <= SLOWDOWN_RATIO * min(per_step_s, last)):
            if long:
                # Two long steps running, alike: the job's steps slowed down (its workload changed), not a pause:
                # their time is the steps' from here (cut, every step would be charged the old pace from now on).
                self._step_times_s.clear()
            self._gap_last = None
            self._step_times_s.append(per_step_s)
            return False
        assert step_s is not None, "a long gap is long against the job's steps"
        self._gap_last = per_step_s
        if self._gap_from is None and self._recent:
            self._gap_from = self._recent[-1]
        self.gaps += 1
        (log.info if self.gaps == 1 else log.debug)(
            "%s: %.1f s between the ends of steps %d and %d, whose steps take %.3f s: a pause it did not report "
            "(an evaluation or a checkpoint save?), cut out of the tuner's windows and the saving%s", job.label(),
            gap_s, n0, n1, step_s, " (report pauses with the client's phase(): they then also run at low_phases' "
            "clock)" if self.gaps == 1 else "", extra=job.fields())
        return True

    def _phase_changed(self, job, phase: str) -> list[tuple[float, float, float]]:
        """A report in a new phase: the edges up to now dropped, the steps counted afresh from now (this report's
        arrival, when the phase changed) at the job's count, and one point at now: of the new phase, or, back in
        training, where the windows go on (the class's docstring)."""
        now_s = time.monotonic()
        energy_j: float | None = None
        at_s: float | None = None
        if isinstance(self.meter, CounterMeter):
            try:
                energy_j = self._read()  # a fresh read: the timer's last may be several updates old
            except BackendError as e:
                log.debug("%s: energy counter read failed at a change of phase: %s", job.label(), e)
            else:
                self._edges.read(now_s, energy_j)
                at_s = self._edges.last_update_s(now_s)
            self._last_report_s = now_s  # the timer's reads go on
        else:
            energy_j = self.meter.energy_j
            if self.meter.samples:
                at_s = self.meter.samples[-1][0]
                self._seen_s = max(self._seen_s, at_s)
        self._edges.take_until(now_s)
        self._last_end = (job.steps, now_s)
        if energy_j is None:
            # No reading now: the windows still pause (a point of the new phase carries no energy they use), and
            # coming back they go on at the counter's next edge instead.
            self._paused_at = None
            return [] if phase == "train" else [(job.steps, 0.0, now_s)]
        at_s = now_s if at_s is None or at_s > now_s else at_s  # the instant the reading stands for
        if phase != "train":
            self._paused_at = (at_s, energy_j)
            return [(job.steps, energy_j, now_s)]
        paused, self._paused_at = self._paused_at, None
        if paused is not None and at_s > paused[0]:
            energy_j += (energy_j - paused[1]) / (at_s - paused[0]) * (now_s - at_s)
        return [(job.steps, energy_j, now_s)]

    def window_rule(self, rule: WindowRule | None) -> WindowRule | None:
        """``rule`` for a window opened on this feed's points now: ends on the meter's updates or samples count no
        held counter's staleness (WindowRule.held_ends)."""
        return rule.on_updates() if rule is not None and self.on_updates else rule

    def pace_s(self, reads: float = 1.0) -> float:
        """How far apart ``reads`` counter reads must come to stay within COUNTER_READ_CPU_FRAC of a core."""
        if len(self._read_costs_s) < READ_COSTS_MIN:
            return 0.0
        costs = sorted(self._read_costs_s)
        if costs[-1] > OUTLIER_COST * statistics.median(costs):
            costs.pop()  # a read that was preempted or met a garbage collection
        cost_s = sum(costs) / len(costs)
        return reads * cost_s / COUNTER_READ_CPU_FRAC if cost_s >= PACED_READ_MIN_S else 0.0

    def _read(self) -> float:
        """The counter, read now; what the read cost (CounterReads.last_cost_s) goes into the pace of the reads."""
        meter = self.meter
        assert isinstance(meter, CounterMeter)  # the rails are read by the sampler alone
        energy_j = meter.energy_j
        self._read_costs_s.append(meter.read_j.last_cost_s)
        self._edges.pace(max(self._edge_every_s, self.pace_s(self._edges.reads_per_stride)))
        return energy_j

    def _timer_serves(self) -> bool:
        """The timer's reads give the edges: a report reads nothing (a read of NVML's counter took 3.9-9.5 ms of CPU
        on an H200; the timer's are paced within COUNTER_READ_CPU_FRAC of a core, a callback's reports are 10 a
        second)."""
        return self._reading and self._timed_j is not None and self._grid_known()

    def _grid_known(self) -> bool:
        """A counter's edges are used once its update grid is known to GRID_KNOWN_S (about a second of reads at the
        steps' pace): before that an edge may be off by part of an update, and a window between two such edges by
        several percent. A sampler's samples are exact in time from the first."""
        if not isinstance(self.meter, CounterMeter):
            return True
        width = self._edges.phase_width_s
        return width is not None and width <= GRID_KNOWN_S

    def _timed_read(self) -> None:
        """One of the timer's reads (see UpdateEdges.next_read_s); they stop READS_IDLE_S after the last report, so a
        job that ended or stopped reporting costs nothing. A read that fails stops them until the next report."""
        now_s = time.monotonic()
        if now_s - self._last_report_s > READS_IDLE_S or self._defer is None:
            self._reading, self._timed_j = False, None
            return
        try:
            energy_j = self._read()
        except BackendError as e:
            log.debug("energy counter read failed: %s", e)
            self._reading, self._timed_j = False, None
            return
        read_s = (now_s + time.monotonic()) / 2
        self._edges.read(read_s, energy_j)
        self._timed_j = energy_j
        self._defer(self._timed_read, max(0.0, self._edges.next_read_s(read_s) - time.monotonic()))

    def points(self, job, energy_j: float) -> list[tuple[float, float, float]]:
        now_s = time.monotonic()
        counter = isinstance(self.meter, CounterMeter)
        end_s = job.step_end_s if job.step_end_s is not None or counter else now_s  # rails: the report's arrival
        if end_s is None:
            self._last_end = None
            self.on_updates = False
            return [(job.steps, energy_j, now_s)]
        if counter:
            if not self._timer_serves():  # energy_j was read now
                self._edges.read(now_s, energy_j)
            self._last_report_s = now_s
            if self._defer is not None and not self._reading:
                self._reading = True
                self._defer(self._timed_read, 0.0)
        else:
            for t_s, e_j in self.meter.samples:
                if t_s > self._seen_s:
                    self._edges.read(t_s, e_j)
                    self._seen_s = t_s
        prev, self._last_end = self._last_end, (job.steps, end_s)
        edges = self._edges.take_until(end_s)
        if prev is None or end_s <= prev[1] or self._unreported_pause(job, prev, self._last_end):
            return []
        if not self._grid_known():
            # Windows wait for the grid a little (reads at the steps' pace find it within about a second); past that
            # they take the report itself, as without step_end_s, until it is found.
            if self._timed_since is None:
                self._timed_since = now_s
            self.on_updates = False
            return [] if now_s - self._timed_since < GRID_WAIT_S else [(job.steps, energy_j, now_s)]
        if not self.grid_found:
            self.grid_found = True
            log.info("%s: the energy counter's update instants are known to %.1f ms: windows end on them from now on",
                     job.label(), 1000 * (self._edges.phase_width_s or 0.0), extra=job.fields())
        self.on_updates = True
        (n0, t0), (n1, t1) = prev, self._last_end
        return [(n0 + (n1 - n0) * (t_s - t0) / (t1 - t0), e_j, t_s) for t_s, e_j in edges if t_s > t0]
