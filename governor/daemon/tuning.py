"""The `tune` policy in the daemon: one job's OnlineTuner, driven by its progress reports and the board's energy.

The job starts at MLG's pick (the tuner's start level). Each `progress` notification feeds a TuningSession with the
job's step count, a cumulative energy reading (the INA3221 rails integrated at every report, or the GPU's own
counter on NVML) and the clock; a closed window becomes one tuner observation, and the job is moved to the next level
to measure, then to the level the tuner converges on. Every probe is logged with journald fields.

Tuning needs the GPU to itself: the rails measure the whole board, so while another job shares the GPU the windows
would mix both. The tuner then pauses (its last best level stays the job's pick) and resumes when the job is alone.
Without progress reports nothing is measured and the job keeps MLG's pick; `reason` says so.
"""

from __future__ import annotations

import logging
import time

from governor.daemon.config import TunerConfig
from governor.daemon.recorder import window_util_pct
from governor.errors import FtgovError
from governor.policy import PolicyName
from governor.policy.tuner import OnlineTuner, TuningSession

log = logging.getLogger("ftgovd")


class JobTuner:
    def __init__(self, gov, job, cfg: TunerConfig):
        self.cfg = cfg
        # Never a level above the power mode's cap (unless the config allows it): the tuner probes only what it may pin.
        self.tuner = OnlineTuner(gov.power_mode.allowed_levels(job.gpu_id), job.freq_hz, max_slowdown=cfg.max_slowdown,
                                 noise_rel=cfg.noise_rel,
                                 max_probes=cfg.max_probes)
        self.session: TuningSession | None = None
        self.windows: list = []  # (Measurement, gpu_util) per closed window, for the measurement store
        self.status = "waiting for progress reports (without them the job keeps MLG's pick)"
        self._total_mw = gov.energy.total_mw
        # The tuner's own meter: its windows must not depend on the job's.
        self.meter = gov.energy.new_meter(gov.gpus[job.gpu_id].gpu)
        if self.meter is None:
            self.status = "no energy source (no rails, no GPU counter): keeping MLG's pick"

    def energy_j(self) -> float:
        return self.meter.add(time.monotonic(), self._total_mw())

    def progress(self, gov, job) -> None:
        if self.meter is None or self.tuner.converged:
            return
        energy_j = self.energy_j()  # integrate at every report, shared or not, so the counter stays continuous
        if any(j.gpu_id == job.gpu_id and j is not job for j in gov.jobs.values()):
            if self.session is not None:
                log.info("%s: tuning paused: another job shares GPU %s and the rails would measure both",
                         job.label(), job.gpu_id, extra=job.fields())
            self.session, self.status = None, "paused: another job shares the GPU"
            return
        if self.session is None:
            # (Re)start windows from here, at the level the tuner wants next.
            self._move(gov, job, self.tuner.next_level_hz(), "tune: probing")
            self.session = TuningSession(self.tuner, job.steps, self.cfg.warmup_steps, self.cfg.window_steps)
            self.status = "measuring"
            return
        try:
            m = self.session.on_progress(job.steps, energy_j, time.monotonic(), job.phase or "train")
        except FtgovError as e:
            log.warning("%s: tuning stopped: %s; keeping %g MHz", job.label(), e, self.tuner.best_hz / 1e6,
                        extra=job.fields())
            self.meter, self.status = None, f"stopped: {e}"
            self._move(gov, job, self.tuner.best_hz, f"tune: stopped ({e}); best measured")
            return
        if m is None:
            return
        self.windows.append((m, window_util_pct(gov, job)))
        state = self.tuner.state()
        log.info("%s: tune probe %d at %g MHz: %.4f J/step, %.4f s/step over %d steps -> %s", job.label(),
                 state["probes"], m.level_hz / 1e6, m.joules_per_step, m.seconds_per_step, m.measured_steps,
                 f"converged on {self.tuner.best_hz / 1e6:g} MHz" if self.tuner.converged
                 else f"next {self.session.level_hz / 1e6:g} MHz ({state['reason']})",
                 extra={**job.fields(), "TUNE_PROBE": state["probes"], "TUNE_LEVEL_HZ": m.level_hz,
                        "TUNE_J_PER_STEP": f"{m.joules_per_step:.6f}", "TUNE_S_PER_STEP": f"{m.seconds_per_step:.6f}"})
        if self.tuner.converged:
            self.status = "converged"
            self._move(gov, job, self.tuner.best_hz,
                       f"tune: converged on the least energy per step after {state['probes']} probes "
                       f"({self.session.profiled_steps} steps)")
        else:
            self._move(gov, job, self.session.level_hz, f"tune: probing ({state['reason']})")

    def _move(self, gov, job, level_hz: int, reason: str) -> None:
        if job.freq_hz == level_hz and job.decision.reason == reason:
            return
        try:
            gov.set_freq(job, level_hz, reason)
        except FtgovError as e:
            log.error("%s: could not pin %g MHz for tuning: %s", job.label(), level_hz / 1e6, e, extra=job.fields())
            self.meter, self.status = None, f"stopped: {e}"

    def state(self) -> dict:
        return {**self.tuner.state(), "status": self.status,
                "profiled_steps": self.session.profiled_steps if self.session else 0}


class TunerAttach:
    """The PinController's attach_tuner: gives a job a tuner when its policy is tune and it has a pin to start from
    (a new one after an update). ``cfg`` is replaced when the config is reloaded; running tuners keep theirs."""

    def __init__(self, cfg: TunerConfig):
        self.cfg = cfg

    def __call__(self, gov, job) -> None:
        attach(self.cfg, gov, job)


def attach(cfg: TunerConfig, gov, job) -> None:
    job.tuner = None
    if job.decision is None or job.freq_hz is None or job.decision.policy is not PolicyName.TUNE:
        return
    try:
        job.tuner = JobTuner(gov, job, cfg)
    except FtgovError as e:
        log.warning("%s: cannot tune: %s; keeping %s", job.label(), e, job.decision.reason, extra=job.fields())
