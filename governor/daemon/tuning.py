"""The `tune` policy in the daemon: one job's OnlineTuner, driven by its progress reports and the board's energy.

Where it starts (``TunerAttach.plan``): on a Jetson devfreq board at MLG's pick; on an NVML GPU at the level the last
tuned job of the same shape converged on, on the same kind of GPU (governor.daemon.starts), else the top of the table.

The baseline window (``TunerConfig.baseline_window``): once the job's training steps stop speeding up (its warm-up,
governor.policy.measured_saving.WarmUp, tuner.baseline_warmup_max_s), while it is alone on its GPU, one probe runs
unpinned at the default governor before the search begins, and with tuner.baseline_parts
the baseline's other parts later, unpinned again while the job runs converged and alone, spread over the job
(governor.policy.measured_saving.BaselineParts); at the job's end the saving per step against them is reported with its
uncertainty, saved_pct_err (unregister, SAVED_PCT and SAVED_PCT_ERR in the log, status, Prometheus and the store).

Each `progress` notification feeds a TuningSession. With ``step_end_s`` (the client's CLOCK_MONOTONIC at the step's
end), the windows' edges are the energy meter's updates (NVML's counter, the rails' sampler at the INA3221's refresh),
each with the steps run by then counted fractionally between the reports' step ends (``MeterFeed.points``); without
it, the report itself as it arrives. A closed window becomes one tuner observation, and the job is moved to the next
level to measure, then to the level the tuner converges on. While another job shares the GPU the tuner pauses (the
rails measure the whole board). How the daemon drives the tuner, and why: docs/tuner.md, "How the daemon drives it".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from enum import Enum
from typing import Any

from governor.config import TunerConfig
from governor.daemon.energy import MeterFeed
from governor.daemon.observing import JobObserver
from governor.daemon.recorder import window_util_pct
from governor.daemon.starts import TuneStarts, gpu_key, read_on
from governor.errors import FtgovError
from governor.policy import Decision, PolicyName
from governor.policy.measured_saving import BaselineParts, KeptWindows, MeasuredSaving, pooled_pair
from governor.policy.tuner import Measurement, ProbeWindow, TuningSession, WindowRule
from governor.units import mhz

log = logging.getLogger("ftgovd")

BASELINE_REASON = "tune: one window at the default governor (the baseline for the measured saving)"
BASELINE_PART_REASON = "tune: a part of the baseline at the default governor (spread over the job, for the saving)"


Window = tuple[Measurement, float | None]  # a closed window and the gpu_util measured with it, for the store


def _pool(a: Window, b: Window) -> Window:
    """Two windows at one level as one, the gpu_util weighed by their steps (None where either has none)."""
    both = pooled_pair(a[0], b[0])
    util = None if a[1] is None or b[1] is None else (
        (a[1] * a[0].measured_steps + b[1] * b[0].measured_steps) / both.measured_steps)
    return both, util


def kept_windows(entries: list[Window] | None = None) -> KeptWindows[Window]:
    """A tuned job's windows for the store and status, bounded (governor.policy.measured_saving.KeptWindows)."""
    return KeptWindows(lambda w: w[0], _pool, entries or [])


class TunerState(Enum):
    """Where one job's tuner is. ``JobTuner.progress`` runs the step of its state; ``JobTuner._enter`` moves it."""

    WAITING = "waiting"  # no search session: for the policy's decision (no tuner yet), or for the next report
    BASELINE = "baseline"  # the baseline window is wanted, or being measured unpinned at the default governor
    SEARCHING = "searching"  # a search session measures windows, one level after another
    PAUSED = "paused"  # another job shares the GPU: no windows (the rails would measure both)
    # The search has picked (tuner.follow_up): near-ties of the pick are measured while the job's steps left pay
    # for them, and the pick may move to one of them.
    CONFIRMING = "confirming"
    # Pinned at the level chosen; the steps run there measure the saving. With tuner.follow_up its windows go on (the
    # pick watched): one out of its interval twice in a row (the curve moved) starts a search again.
    CONVERGED = "converged"
    STOPPED = "stopped"  # no energy source, the GPU left the level measured, or a pin failed: the pin stays


class JobTuner:
    """One job's tuner. ``carry`` is the job's previous JobTuner (a new decision after an update): the energy meter and
    the baseline window carry over, the search starts again."""

    def __init__(self, gov, job, cfg: TunerConfig, starts: TuneStarts | None = None, carry: JobTuner | None = None):
        self.cfg = cfg
        gpu = gov.gpus[job.gpu_id].gpu
        self.starts = starts if read_on(gpu) else None  # kept only where a start is looked up
        self.gpu_key = gpu_key(gpu)
        # Never a level above the power mode's cap (unless the config allows it): the tuner probes only what it may pin.
        self.levels_hz = gov.power_mode.allowed_levels(job.gpu_id)
        start = job.tune_start_hz
        # None while the job waits, unpinned, for its decision (gpu_util being measured).
        self.tuner = cfg.new_tuner(self.levels_hz, start) if start in self.levels_hz else None
        self.session: TuningSession | None = None
        self.windows = kept_windows()  # (Measurement, gpu_util) per closed window, for the measurement store
        self.status = "waiting for progress reports (without them the job keeps its start)"
        self.baseline: Measurement | None = None
        self.baseline_status = "wanted" if cfg.baseline_window else "off (tuner.baseline_window: false)"
        self._baseline_window: ProbeWindow | None = None
        self._warmup = cfg.new_warmup()  # the baseline's first part opens after the job's warm-up
        # The baseline's parts (tuner.baseline_parts): planned once the first closes, again when the job's length
        # changes (set_total_steps); a later one measured while _part_window is open (the job unpinned while converged).
        self.baseline_parts: BaselineParts | None = None
        self._part_window: ProbeWindow | None = None
        # A window's pin waited for the GPU's re-pin interval: the window starts over once it lands. It outlives a
        # pause (and a skipped baseline): the first window of the next session then starts over at its first report.
        self._pin_waited = False
        self.feed: MeterFeed
        if carry is not None:
            self.feed, self.baseline, self.baseline_status = carry.feed, carry.baseline, carry.baseline_status
            self._baseline_window = carry._baseline_window
            self._warmup = carry._warmup
            self.baseline_parts = carry.baseline_parts  # a part open when the decision changed is not resumed
            self.windows = kept_windows([w for w in carry.windows if w[0].level_hz is None])
        else:
            # The tuner's own meter: its windows must not depend on the job's.
            self.feed = MeterFeed(gov.energy, gov.gpus[job.gpu_id].gpu, gov.defer, cfg.edge_every_s)
        self.meter = self.feed.meter  # None once tuning stops
        # The steps run converged at the pick and its windows while confirming: the tuned side of the saving.
        self._saving = MeasuredSaving(cfg.noise_rel, cfg.window_steps,
                                      prior_s=cfg.window_min_s if cfg.window_rule == "time" else 0.0,
                                      meter_update_s=self.meter.update_s if self.meter is not None else 0.0,
                                      settle_s=self._settle_s)
        self.state = TunerState.WAITING
        self._pick_hz: int | None = None  # the best level as the last window left it
        if self.meter is None:
            self._stop("no energy source (no rails, no GPU counter): keeping the start")
        elif self.baseline_wanted:
            self._enter(TunerState.BASELINE)

    def _enter(self, state: TunerState, status: str | None = None) -> None:
        if state is not TunerState.CONVERGED:
            self._saving.interrupt()  # confirmations, a search again, a pause: other levels, or no measurement
        self.state = state
        if status is not None:
            self.status = status

    def _stop(self, status: str) -> None:
        """Tuning stops for good: no more windows, the pin stays where it is last moved."""
        self.meter = None
        self._enter(TunerState.STOPPED, status)

    @property
    def _settle_s(self) -> float:
        """How long after a change of clock or an unpin no window opens: until the meter shows it wholly."""
        return self.feed.settle_s(self.cfg.settle_updates)

    @property
    def keep_hz(self) -> int | None:
        """The level this job keeps should the daemon restart (ActiveJob.kept_hz): what stopping the tuning now would
        keep, the best level measured so far (the start before any, the pick once converged); None before the policy
        decided (no tuner) or once tuning stopped (the pin it left stands)."""
        if self.tuner is None or self.state is TunerState.STOPPED:
            return None
        return self.tuner.best_hz

    @property
    def baseline_wanted(self) -> bool:
        return self.baseline is None and self.baseline_status == "wanted" and self.meter is not None

    @property
    def baseline_open(self) -> bool:
        """The job is measuring its baseline window now (unpinned)."""
        return self._baseline_window is not None and self.baseline is None

    def progress(self, gov, job) -> None:
        if self.state is TunerState.STOPPED:
            return
        points = self.feed.report_points(job)  # at every report, shared or not, so the meter stays continuous
        shared = gov.jobs.shares_gpu(job)
        self._STEPS[self.state](self, gov, job, points, shared)

    def _waiting(self, gov, job, points: list, shared: bool) -> None:
        if self.tuner is None:
            return  # the policy has not decided: nothing to search
        if self.tuner.converged:  # a search with nothing left to measure
            self._enter(TunerState.CONVERGED)
            self._converged(gov, job, points, shared)
            return
        self._paused(gov, job, points, shared)

    def _paused(self, gov, job, points: list, shared: bool) -> None:
        assert self.tuner is not None, "a search pauses over a tuner"
        if shared:
            self._enter(TunerState.PAUSED, "paused: another job shares the GPU")
            return
        # (Re)start windows from here, at the level the tuner wants next (the session tells the tuner the job's
        # length first, which can re-plan it: pinned after, so that the pin is the window's level).
        self.session = self.cfg.new_session(self.tuner, job.steps, total_steps=job.total_steps,
                                            meter_update_s=self.meter.update_s, settle_s=self._settle_s)
        self._enter(self._converged_state() if self.tuner.converged else TunerState.SEARCHING, "measuring")
        self._move(gov, job, self.session.measuring_hz, "tune: probing")

    def _converged_state(self) -> TunerState:
        assert self.tuner is not None, "a converged state is of a tuner"
        return TunerState.CONFIRMING if self.tuner.confirming else TunerState.CONVERGED

    def _searching(self, gov, job, points: list, shared: bool) -> None:
        assert self.tuner is not None and self.session is not None, "a search runs a session over a tuner"
        if shared:
            log.info("%s: tuning paused: another job shares GPU %s and the rails would measure both",
                     job.label(), job.gpu_id, extra=job.fields())
            self.session = None
            self._enter(TunerState.PAUSED, "paused: another job shares the GPU")
            return
        self._feed(gov, job, points)

    def _feed(self, gov, job, points: list) -> None:
        """Feed the session's window at the level it measures; a closed window moves the pin (_window_closed)."""
        assert self.tuner is not None and self.session is not None, "windows are fed to a session of a tuner"
        if self.feed.on_updates:
            self.session.ends_on_updates()
        ctl = gov.gpus[job.gpu_id]
        pinned_hz = ctl.pinned_hz
        phase = job.phase or "train"
        # A clock throttled under the pin (ctl.throttled_hz) does not hold the windows back: what a pin costs under
        # the board's throttling is what the job gets for it, and a throttle that lasts must not stall the search.
        measuring_hz = self.session.measuring_hz
        if phase not in gov.settings.low_phases and pinned_hz != measuring_hz:
            if gov.repin_pending(job.gpu_id):
                # Back from a checkpoint, or a probe's move within the GPU's re-pin interval: the pin follows within
                # a second; no window meanwhile, and a fresh one (warm-up first) once it lands.
                phase, self._pin_waited = "re-pinning", True
            else:
                # The power mode's cap fell under the level measured (the pin was lowered to the cap), or another
                # tool took the limits and the daemon stood down: a window here would be charged to the wrong level.
                now = ("is not pinned (another tool holds the limits)" if pinned_hz is None
                       else f"is pinned at {mhz(pinned_hz)}")
                log.warning("%s: tuning stopped: the GPU %s, not at the %s being measured; keeping %s", job.label(),
                            now, mhz(measuring_hz, none="no pin"), mhz(self.tuner.best_hz), extra=job.fields())
                self._stop(f"stopped: the GPU {now}, not at the level being measured")
                self._move(gov, job, self.tuner.best_hz,
                           "tune: stopped (the GPU left the level measured); best measured")
                return
        if self._pin_waited and phase != "re-pinning":
            # The pin landed: a fresh window from this step, warm-up first; the edges before it ran at the old pin.
            self._pin_waited = False
            self.session.repinned(job.steps)
            points = []
        for steps, e_j, t_s in points:
            try:
                m = self.session.on_progress(steps, e_j, t_s, phase)
            except FtgovError as e:
                log.warning("%s: tuning stopped: %s; keeping %s", job.label(), e, mhz(self.tuner.best_hz),
                            extra=job.fields())
                self._stop(f"stopped: {e}")
                self._move(gov, job, self.tuner.best_hz, f"tune: stopped ({e}); best measured")
                return
            if m is not None:
                self._window_closed(gov, job, m)
                if self.state in (TunerState.SEARCHING, TunerState.CONFIRMING, TunerState.CONVERGED):
                    # The pin moved as this report arrived: the next level's warm-up begins at its step, and the
                    # rest of its edges ran at the level measured before.
                    self.session.reopen(job.steps)
                return

    def _window_closed(self, gov, job, m: Measurement) -> None:
        assert self.tuner is not None and self.session is not None, "a window closes in a session of the tuner"
        self.windows.append((m, window_util_pct(gov, job)))
        state = self.tuner.state()
        was = self.state
        # A window that only watched the pick and left it there is logged at debug: a long job would otherwise log
        # one line a window for as long as it runs (status and the store still have every window).
        watched = was is TunerState.CONVERGED and self.tuner.converged and self.tuner.best_hz == self._pick_hz
        self._pick_hz = self.tuner.best_hz
        log.log(logging.DEBUG if watched else logging.INFO,
                "%s: tune probe %d at %s: %.4f J/step, %.4f s/step over %d steps -> %s", job.label(),
                 state["probes"], mhz(m.level_hz, none="no pin"), m.joules_per_step, m.seconds_per_step,
                 m.measured_steps,
                 f"converged on {mhz(self.tuner.best_hz)}" if self.tuner.converged
                 else f"next {mhz(self.session.level_hz, none='no pin')} ({state['reason']})",
                 extra={**job.fields(), "TUNE_PROBE": state["probes"], "TUNE_LEVEL_HZ": m.level_hz,
                        "TUNE_J_PER_STEP": f"{m.joules_per_step:.6f}", "TUNE_S_PER_STEP": f"{m.seconds_per_step:.6f}"})
        if was is TunerState.CONFIRMING:
            self._saving.window_at_pick(m)
        if self.tuner.converged:
            new = self._converged_state()
            self._enter(new, "converged" if new is TunerState.CONVERGED else
                        f"confirming: {state['follow_up']['reason']}")
            if was is TunerState.SEARCHING:
                self._move(gov, job, self.session.level_hz,
                           f"tune: converged on the least energy per step after {state['probes']} probes "
                           f"({self.session.profiled_steps} steps)")
            elif job.freq_hz != self.session.level_hz:
                self._move(gov, job, self.session.level_hz,
                           f"tune: converged on {mhz(self.tuner.best_hz)}, provisionally; {self.status}")
            return
        if was is not TunerState.SEARCHING:
            log.warning("%s: the energy per step at %s left its interval twice in a row (the job's curve moved): "
                        "searching again", job.label(), mhz(m.level_hz), extra=job.fields())
            self._enter(TunerState.SEARCHING, "measuring (searching again: the curve moved)")
        self._move(gov, job, self.session.level_hz, f"tune: probing ({state['reason']})")

    def set_total_steps(self, gov, job) -> None:
        """The client told the job's length, or a new one. The baseline's parts not measured yet are planned again
        over the steps left (BaselineParts.replan; a part being measured goes on). After the search began, its
        budget is re-priced over the steps left: the window open goes on at its level (the re-plan decides the one
        after it); a search the new length ends is pinned at its choice at once, where the follow-up's windows go on
        from a fresh one (also one stopped: its pin moves to the level chosen, its windows stay off)."""
        if job.total_steps is None:
            return
        if self.baseline_parts is not None:
            self.baseline_parts.replan(self.cfg.new_baseline_parts(job.total_steps), job.steps,
                                       measuring=self._part_window is not None)
        if self.tuner is None or self.session is None:  # a session runs over a tuner
            return
        searching, window_hz = not self.tuner.converged, self.session.measuring_hz
        self.session.set_total_steps(job.total_steps, job.steps)
        if searching and self.tuner.converged:
            stopped = self.state is TunerState.STOPPED
            self._enter(TunerState.STOPPED if stopped else self._converged_state(), "converged")
            # The follow-up's window (the session opened it at its level): where the job is pinned from now on.
            level_hz = self.session.measuring_hz if self.session.measuring and not stopped else self.tuner.best_hz
            if self.session.measuring_hz != window_hz:
                # That window starts over at the next report, warm-up first: this report's points are of steps before
                # the one it opened at, run at the level measured before.
                self._pin_waited = True
            self._move(gov, job, level_hz,
                       f"tune: converged on {mhz(self.tuner.best_hz)} (the job's length ended the search)")

    # ---- the baseline window ----------------------------------------------------------------------------------------

    def _measuring_baseline(self, gov, job, points: list, shared: bool) -> None:
        if shared:
            self.baseline_status = "skipped: another job shares the GPU (the default governor does not run then)"
            self._baseline_window = None
            self._enter(TunerState.WAITING)
            log.info("%s: no baseline window: %s", job.label(), self.baseline_status, extra=job.fields())
            if self.tuner is not None and job.freq_hz is None:
                self._move(gov, job, self.tuner.start_hz, "tune: start (no baseline: the GPU is shared)")
            return
        if self._baseline_window is None:
            if job.steps < 1 or (job.phase or "train") != "train":
                return
            if not self._warmup.feed(job.steps, time.monotonic() if job.step_end_s is None else job.step_end_s):
                self.status = "waiting for the job's steps to stop speeding up (its warm-up) before the baseline"
                return
            if job.freq_hz is not None:
                self._move(gov, job, None, BASELINE_REASON)
                if self.state is TunerState.STOPPED:  # the unpin failed: no baseline, no tuning, the pin stays
                    return
            self._baseline_window = self._baseline_probe(job)
            self.status = "measuring the baseline window at the default governor"
            return
        self._baseline_window, m, failed = self._feed_unpinned(gov, job, points, self._baseline_window)
        if failed is not None:
            self.baseline_status, self._baseline_window = f"failed: {failed}", None
        if m is None:
            if self.baseline_status == "wanted":
                return
        else:
            self.baseline, self.baseline_status = m, "measured"
            self.baseline_parts = self.cfg.new_baseline_parts(job.total_steps)
            self.baseline_parts.first(m, job.steps)
            self.windows.first((m, window_util_pct(gov, job)))
            log.info("%s: baseline at the default governor: %.4f J/step, %.4f s/step over %d steps", job.label(),
                     m.joules_per_step, m.seconds_per_step, m.measured_steps,
                     extra={**job.fields(), "BASELINE_J_PER_STEP": f"{m.joules_per_step:.6f}",
                            "BASELINE_S_PER_STEP": f"{m.seconds_per_step:.6f}"})
        self._enter(TunerState.WAITING)
        if self.tuner is not None:  # decided already: pin the start; the search begins at the next report
            self.status = "waiting for progress reports"
            self._move(gov, job, self.tuner.start_hz, f"tune: start at {mhz(self.tuner.start_hz)}")

    # ---- the measured saving ----------------------------------------------------------------------------------------

    def _converged(self, gov, job, points: list, shared: bool) -> None:
        """After convergence: the steps run at the chosen level, from the first report after the re-pin (the steps
        before it are its warm-up), for the saving. A stretch shared with another job is no measurement of this one.
        With tuner.follow_up the pick's windows go on (no window while shared: it starts over after, warm-up
        first)."""
        if self._part_window is not None:
            self._measure_part(gov, job, points, shared)
            return
        if self._part_due(gov, job, shared):
            self._saving.interrupt()
            self._move(gov, job, None, BASELINE_PART_REASON)
            if self.state is TunerState.STOPPED:  # the unpin failed: the pin stays, tuning ends
                return
            self._part_window = self._baseline_probe(job)
            self.status = "converged; measuring a part of the baseline at the default governor"
            return
        self._record_stretch(gov, job, points, shared)
        if self.session is None or not self.session.measuring:
            return
        if shared:
            self._pin_waited = True
            return
        self._feed(gov, job, points)

    def _part_due(self, gov, job, shared: bool) -> bool:
        """A later part of the baseline is due: the job runs converged at its pick, alone, training."""
        parts = self.baseline_parts
        return (parts is not None and self.state is TunerState.CONVERGED and not shared
                and (job.phase or "train") == "train" and job.freq_hz is not None
                and not gov.repin_pending(job.gpu_id) and parts.due(job.steps))

    def _baseline_probe(self, job, rule: WindowRule | None = None) -> ProbeWindow:
        """A window of the baseline (its first part or a later one) from the job's step now, warm-up first: the
        baseline's rule for the job's length, or ``rule`` (a window that starts over keeps its own); the steps' scatter
        in the search's windows, where there were any, is its prior."""
        return ProbeWindow(None, job.steps, self.cfg.warmup_steps, self.cfg.window_steps,
                           rule=rule or self.feed.window_rule(self.cfg.baseline_window_rule(self.meter.update_s,
                                                                                          job.total_steps)),
                           meter_update_s=self.meter.update_s, settle_s=self._settle_s,
                           step_prior=None if self.session is None else self.session.step_scatter)

    def _feed_unpinned(self, gov, job, points: list,
                       window: ProbeWindow) -> tuple[ProbeWindow, Measurement | None, str | None]:
        """Feed a window of the baseline, measured unpinned. The unpin may wait for the GPU's re-pin interval
        (Controller.set_freq): until then the steps run at the old pin, and the window starts over (warm-up first)
        at the first report after it. The window (a fresh one once a waited unpin landed), its measurement if this
        report closed it, and why it failed (a TuningError's message)."""
        if gov.repin_pending(job.gpu_id):
            self._pin_waited = True
            return window, None, None
        if self._pin_waited:
            self._pin_waited = False
            return self._baseline_probe(job, window.rule), None, None
        try:
            for steps, e_j, t_s in points:
                m = window.feed(steps, e_j, t_s, job.phase or "train")
                if m is not None:
                    return window, m, None
        except FtgovError as e:
            return window, None, str(e)
        return window, None, None

    def _measure_part(self, gov, job, points: list, shared: bool) -> None:
        """A later part of the baseline, unpinned: fed until it closes, then back to the pick (its stretch and the
        follow-up's window start over from there, warm-up first). Shared or failed, it is dropped."""
        assert self.baseline_parts is not None and self.tuner is not None, "a baseline part follows the first"
        assert self._part_window is not None, "a part is measured while its window is open"
        parts, m, failed = self.baseline_parts, None, None
        if shared:
            failed = "another job shares the GPU"
        else:
            self._part_window, m, failed = self._feed_unpinned(gov, job, points, self._part_window)
            if m is None and failed is None:
                return
        self._part_window = None
        if m is None:
            parts.skip()
            log.info("%s: a part of the baseline dropped: %s", job.label(), failed, extra=job.fields())
        else:
            parts.add(m, job.steps)
            self.baseline = parts.baseline
            self.windows.append((m, window_util_pct(gov, job)))
            log.info("%s: baseline part %d of %d at the default governor: %.4f J/step, %.4f s/step over %d steps",
                     job.label(), len(parts.measured), len(parts.measured) + len(parts.due_at), m.joules_per_step,
                     m.seconds_per_step, m.measured_steps,
                     extra={**job.fields(), "BASELINE_J_PER_STEP": f"{m.joules_per_step:.6f}",
                            "BASELINE_S_PER_STEP": f"{m.seconds_per_step:.6f}"})
        self.status = "converged"
        self._move(gov, job, self.tuner.best_hz, f"tune: converged on {mhz(self.tuner.best_hz)}")
        if self.session is not None and self.session.measuring and self.state is TunerState.CONVERGED:
            self.session.repinned(job.steps)

    def _record_stretch(self, gov, job, points: list, shared: bool) -> None:
        """The steps run converged at one pinned level, from the first report at it (the steps before are its
        warm-up), for the saving."""
        if shared:
            self._saving.shared()
        elif gov.repin_pending(job.gpu_id):  # the pin has not landed: these steps ran at the level before
            self._saving.interrupt()
        elif (job.phase or "train") != "train":  # an evaluation's (a checkpoint's) energy is no step's at the pick
            self._saving.interrupt()
        elif job.freq_hz is not None:
            self._saving.converged_at(job.freq_hz, points, on_updates=self.feed.on_updates)

    def saving(self) -> dict | None:
        """The saving per step measured so far against the baseline window (governor.policy.measured_saving); None
        without both ends."""
        if self.baseline is None or self.tuner is None:
            return None
        parts = 1 if self.baseline_parts is None else self.baseline_parts.pooled_parts
        out = self._saving.result(self.baseline, self.tuner.best_hz, [m for m, _ in self.windows],
                                  baseline_floor_rel=self.cfg.noise_rel if self.baseline.noise_rel is None else 0.0,
                                  baseline_parts=parts)
        if out is not None:
            out["converged"] = self.tuner.converged
        return out

    def _noise_rel(self, m: Measurement) -> float:
        """A window's relative uncertainty: its own (window_rule time), else what the tuner assumes (noise_rel)."""
        return max(m.noise_rel or 0.0, self.cfg.noise_rel)

    def finish(self, job) -> dict | None:
        """The job ends: its measured saving (None without a baseline); a converged level is learnt for the next
        job of this shape on this kind of GPU. A job that ends in a confirmation window at a near-tie ends at its
        pick: its summary (unregister, the log, the store) names the level it was tuned to, not the window's (nor
        the default governor of a baseline part it ended in)."""
        if self.tuner is not None and self.tuner.converged:
            if self.starts is not None:
                self.starts.learn(self.gpu_key, job.features, self.tuner.best_hz, job.uid)
            if (self.state is TunerState.CONFIRMING or self._part_window is not None) and job.decision is not None:
                # The job is leaving (Controller.end re-applies its GPU without it next): no pin to move.
                job.decision = dataclasses.replace(job.decision, freq_hz=self.tuner.best_hz,
                                                   reason=f"tune: converged on {mhz(self.tuner.best_hz)}")
        return self.saving()

    def unmeasured_why(self) -> str:
        """Why a job that ends without a measured saving has none (finish gave None): its end says so, where the
        reply's saving was only missing and status, gone with the job, was the one place that told."""
        if self.baseline is None:
            return {"wanted": "its baseline window at the default governor had not closed when it ended"}.get(
                self.baseline_status, f"its baseline at the default governor: {self.baseline_status}")
        if self.tuner is None:
            return f"tuning {self.status}" if self.status.startswith("stopped") else f"no search: {self.status}"
        return "no window at its level closed to set against the baseline"

    # ---- pins, status -----------------------------------------------------------------------------------------------

    def _move(self, gov, job, level_hz: int | None, reason: str) -> None:
        if job.freq_hz == level_hz and job.decision.reason == reason:
            return
        try:
            gov.set_freq(job, level_hz, reason)
        except FtgovError as e:
            log.error("%s: could not pin %s for tuning: %s", job.label(), mhz(level_hz, none="no pin"), e,
                      extra=job.fields())
            self._stop(f"stopped: {e}")

    _STEPS = {TunerState.WAITING: _waiting, TunerState.BASELINE: _measuring_baseline,
              TunerState.SEARCHING: _searching, TunerState.PAUSED: _paused, TunerState.CONFIRMING: _searching,
              TunerState.CONVERGED: _converged}

    def describe(self) -> dict:
        search = self.tuner.state() if self.tuner is not None else {
            "phase": "undecided", "probes": 0, "converged": False, "estimates": [], "start_hz": None}
        last = self.windows.last_pinned
        window = None if last is None else {
            "rule": self.cfg.window_rule, "freq_hz": last.level_hz, "steps": last.measured_steps,
            "seconds": last.duration_s, "noise_rel": last.noise_rel}
        return {**search, "state": self.state.value, "status": self.status, "baseline": self._baseline_state(),
                "last_window": window,
                "profiled_steps": self.session.profiled_steps if self.session else 0,
                "burst_windows": self.session.bursts if self.session else 0, "unreported_pauses": self.feed.gaps}

    def _baseline_state(self) -> dict:
        out: dict[str, Any] = {"status": self.baseline_status}
        if self.baseline is not None:
            out.update(joules_per_step=self.baseline.joules_per_step, seconds_per_step=self.baseline.seconds_per_step,
                       steps=self.baseline.measured_steps, seconds=self.baseline.duration_s,
                       noise_rel=self._noise_rel(self.baseline))
        if self.baseline_parts is not None:
            out.update(parts=len(self.baseline_parts.measured), parts_planned=len(self.baseline_parts.measured)
                       + len(self.baseline_parts.due_at), measuring_part=self._part_window is not None)
        return out


class TunerAttach:
    """The controller's tuner hooks: ``plan`` picks a tuned job's start (and keeps it unpinned while its baseline
    window runs); ``__call__`` (attach_tuner) gives a job whose policy is tune its JobTuner, after each decision and
    when it is held unpinned, with the tuner config of the controller's settings in force (a reload swaps them; running
    tuners keep theirs). ``starts``: the converged levels of past tuned jobs (read at start-up from the store)."""

    def __init__(self, starts: TuneStarts | None = None):
        self.starts = starts if starts is not None else TuneStarts()

    def plan(self, gov, job, decision: Decision) -> Decision:
        """The decision to apply for a tuned job whose policy decided ``decision`` (a pin)."""
        levels = gov.power_mode.allowed_levels(job.gpu_id)
        gpu = gov.gpus[job.gpu_id].gpu
        start, reason = decision.freq_hz, decision.reason
        if read_on(gpu):
            learnt = self.starts.lookup(gpu_key(gpu), job.features, job.uid)
            if learnt in levels:
                start, reason = learnt, (f"tune: starts at {mhz(learnt)}, where the last tuned job of this shape "
                                         "(yours, else root's) converged on this kind of GPU")
            else:
                start, reason = levels[-1], (f"tune: starts at the top of the table, {mhz(levels[-1])} (what the "
                                             "default governor runs a busy GPU at); no tuned job of this shape has "
                                             "converged on this kind of GPU yet")
        job.tune_start_hz = start
        prev = job.tuner if isinstance(job.tuner, JobTuner) else None
        # Unpinned already and reporting training steps (it waited for its gpu_util): the baseline window is taken
        # there, not after a pin. A job that reports no progress gets its pin: it would measure no window.
        if prev is not None and (prev.baseline_open or (prev.baseline_wanted and job.freq_hz is None and job.steps)):
            return Decision(PolicyName.TUNE, None, f"{BASELINE_REASON}, then {mhz(start)}; {reason}")
        return Decision(decision.policy, start, reason, decision.fell_back_to)

    def __call__(self, gov, job) -> None:
        attach(gov.settings.tuner, gov, job, self.starts)


def attach(cfg: TunerConfig, gov, job, starts: TuneStarts | None = None) -> None:
    if job.decision is not None and job.decision.policy is PolicyName.OBSERVE:
        # Observe moves no clock, but measures what tune would (governor.daemon.observing).
        if not isinstance(job.tuner, JobObserver):
            try:
                job.tuner = JobObserver(gov, job, cfg)
            except FtgovError as e:
                job.tuner = None
                log.info("%s: no observe windows: %s", job.label(), e, extra=job.fields())
        return
    prev = job.tuner if isinstance(job.tuner, JobTuner) else None
    job.tuner = None
    if job.decision is None or job.decision.policy is not PolicyName.TUNE:
        return
    if job.decision.freq_hz is None and not (cfg.baseline_window or job.tune_start_hz is not None):
        return  # held unpinned with nothing to measure
    try:
        job.tuner = JobTuner(gov, job, cfg, starts, carry=prev)
    except FtgovError as e:
        log.warning("%s: cannot tune: %s; keeping %s", job.label(), e, job.decision.reason, extra=job.fields())
