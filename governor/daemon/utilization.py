"""gpu_util for a job that did not send it: measured while the job trains, not when it registers.

The tree's gpu_util is the GPU load of the running fine-tuning loop at the default governor (that is how the
training data defines it). When a job registers, its loop has not started, and the load then reads near 0. So:

1. At register, a decision that does not depend on gpu_util is made at once. Otherwise the job holds no pin yet:
   the default governor runs, which is the clock the feature is defined at.
2. The job's first progress report of a training step starts the sampling: the GPU's load is read every
   SAMPLE_EVERY_S for util_sample_s, and the job is decided once, on the mean. Where the load reading covers a past
   period (NVML's: up to 1 s, the GPU's ``load_lag_s``), the first read waits that long after the step.
3. A job that reports no progress is sampled util_settle_s after it registered; windows of util_sample_s go on while
   the mean load stays under util_active_pct (the script is still setting up), and the window after the first one
   that reaches it decides. A job still under it util_settle_max_s after registering is decided on what it shows.
4. A GPU that reports no load: 100% is assumed (the branch that slows a job least), and the reason says so.

While another job holds a pin on the same GPU the load is not measured at the default governor; the log says so.
The figure, when it was taken and over how many samples are in the decision's reason and the log. Why a fixed delay
is not enough on a real GPU: docs/clients.md, "When gpu_util is not given".
A job whose decision did not need gpu_util is measured the same way, only to record it: status and the store show
its load (read at its pin; the log says so), and its decision stays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from governor.config import Config
from governor.daemon.controller import Controller
from governor.daemon.jobs import ActiveJob
from governor.errors import FtgovError
from governor.units import mhz

log = logging.getLogger("ftgovd")

SAMPLE_EVERY_S = 0.05
ASSUMED_UTIL_PCT = 100.0


@dataclass
class _Pending:
    settle: asyncio.TimerHandle | None
    sampling: bool = False
    samples: list[float] = field(default_factory=list)
    waiting_for_load: bool = False  # no progress reports: windows go on until the load shows the loop runs
    ramp_seen: bool = False  # a window has reached the active load; the next one decides
    decide: bool = True  # False: the measurement is only recorded, the job's decision stands


class UtilizationSampler:
    """``config`` returns the config in force, so that a reload's util_* values apply to the next window."""

    def __init__(self, controller: Controller, config: Callable[[], Config]):
        self.controller = controller
        self._config = config
        self._pending: dict[int, _Pending] = {}

    @property
    def sample_s(self) -> float:
        return self._config().util_sample_s

    @property
    def settle_s(self) -> float:
        return self._config().util_settle_s

    @property
    def active_pct(self) -> float:
        return self._config().util_active_pct

    @property
    def settle_max_s(self) -> float:
        return self._config().util_settle_max_s

    def waiting(self, job: ActiveJob) -> bool:
        """Whether the job's decision waits for its gpu_util (not a measurement only to be recorded)."""
        pending = self._pending.get(job.job_id)
        return pending is not None and pending.decide

    def start(self, job: ActiveJob, *, decide: bool = True) -> None:
        """Measure the job's gpu_util from its first training step (or the settling delay); decide on it, or with
        ``decide=False`` only record it (the decision did not need it)."""
        self.forget(job.job_id)
        settle = asyncio.get_running_loop().call_later(self.settle_s, self._settled, job.job_id)
        self._pending[job.job_id] = _Pending(settle, decide=decide)

    def progress(self, job: ActiveJob, phase: str | None) -> None:
        pending = self._pending.get(job.job_id)
        if pending is None or pending.sampling or job.steps < 1 or phase not in (None, "train"):
            return
        lag_s = self.controller.gpus[job.gpu_id].gpu.load_lag_s
        when = f"from training step {job.steps}"
        if lag_s > 0:  # a read sooner would count the GPU's idling before the loop (0% on an H200 at step 1)
            when += f", read from {lag_s:g} s after it (the GPU's load covers its last {lag_s:g} s)"
        self._begin(job.job_id, pending, when, lag_s)

    def forget(self, job_id: int) -> None:
        pending = self._pending.pop(job_id, None)
        if pending is not None and pending.settle is not None:
            pending.settle.cancel()

    def _settled(self, job_id: int) -> None:
        pending = self._pending.get(job_id)
        if pending is not None and not pending.sampling:
            pending.settle = None
            pending.waiting_for_load = True
            self._begin(job_id, pending, "with no progress reports, after the settling delay (util_settle_s)")

    def _begin(self, job_id: int, pending: _Pending, when: str, lag_s: float = 0.0) -> None:
        """Sample for sample_s, the first read ``lag_s`` from now."""
        if pending.settle is not None:
            pending.settle.cancel()
            pending.settle = None
        pending.sampling = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lag_s + self.sample_s
        if lag_s > 0:
            loop.call_later(lag_s, self._sample, job_id, pending, deadline, when)
        else:
            self._sample(job_id, pending, deadline, when)

    def _sample(self, job_id: int, pending: _Pending, deadline: float, when: str) -> None:
        job = self.controller.jobs.get(job_id)
        if job is None or self._pending.get(job_id) is not pending:
            return  # ended meanwhile
        try:
            load_pct = self.controller.gpus[job.gpu_id].gpu.read().load_pct
        except FtgovError as e:
            log.debug("%s: cannot read the GPU's load: %s", job.label(), e)
            load_pct = None
        if load_pct is not None:
            pending.samples.append(load_pct)
        loop = asyncio.get_running_loop()
        if loop.time() + SAMPLE_EVERY_S <= deadline:
            loop.call_later(SAMPLE_EVERY_S, self._sample, job_id, pending, deadline, when)
        elif self._another_window(job, pending):
            pending.samples = []  # the next window opens after one read interval, as every read does
            loop.call_later(SAMPLE_EVERY_S, self._sample, job_id, pending,
                            loop.time() + SAMPLE_EVERY_S + self.sample_s, when)
        else:
            self._finish(job, pending, when)

    def _another_window(self, job: ActiveJob, pending: _Pending) -> bool:
        """Without progress reports, whether the window just closed shows the job still setting up (or ramping up)."""
        if not pending.waiting_for_load or not pending.samples:
            return False
        if pending.ramp_seen:
            return False  # this window came after the load first reached active_pct: it decides
        if sum(pending.samples) / len(pending.samples) >= self.active_pct:
            pending.ramp_seen = True
            return True
        return time.monotonic() - job.started_s < self.settle_max_s

    def _finish(self, job: ActiveJob, pending: _Pending, when: str) -> None:
        del self._pending[job.job_id]
        after_s = time.monotonic() - job.started_s
        if pending.samples:
            util_pct = sum(pending.samples) / len(pending.samples)
            why = (f"gpu_util measured while the job trains: {util_pct:.1f}% over {len(pending.samples)} samples "
                   f"in {self.sample_s:g} s, {when}, {after_s:.1f} s after registering")
            if pending.waiting_for_load and not pending.ramp_seen:
                why += (f" (the load stayed under {self.active_pct:g}% for util_settle_max_s: decided on what the "
                        "job shows)")
        else:
            util_pct = ASSUMED_UTIL_PCT
            why = f"gpu_util not given and the GPU reports no load: assumed {ASSUMED_UTIL_PCT:g}%"
        pinned_hz = self.controller.gpus[job.gpu_id].pinned_hz
        if not pending.decide:
            at = f"at the pin of {mhz(pinned_hz)}" if pinned_hz is not None else "at the default governor"
            why += f" ({at}; recorded only: the job's decision did not test gpu_util)"
        elif pinned_hz is not None:
            why += f" (while other jobs held the GPU at {mhz(pinned_hz)}, not at the default governor)"
        log.info("%s: %s", job.label(), why, extra={**job.fields(), "GPU_UTIL_PCT": f"{util_pct:.1f}"})
        job.features = job.features.model_copy(update={"gpu_util": util_pct})
        job.gpu_util_at_hz = pinned_hz  # the feature means the load at the default governor only where this is None
        if not pending.decide:
            return
        try:
            self.controller.decide(job, why_util=why)
        except FtgovError as e:  # the pin did not take: the job runs on unpinned, as a client would be told
            log.error("%s: could not pin after measuring gpu_util: %s; it runs at the default clocks", job.label(), e,
                      extra=job.fields())


async def measure_load_pct(gpu, sample_s: float) -> tuple[float, str]:
    """The GPU's load averaged over sample_s, read every SAMPLE_EVERY_S (predict: nothing is pinned, nothing waits
    on a training step), with what was done for the reason; ASSUMED_UTIL_PCT when the GPU reports no load."""
    samples = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + sample_s
    while True:
        try:
            load_pct = gpu.read().load_pct
        except FtgovError:
            load_pct = None
        if load_pct is not None:
            samples.append(load_pct)
        if loop.time() >= deadline:
            break
        await asyncio.sleep(min(SAMPLE_EVERY_S, sample_s))
    if not samples:
        return ASSUMED_UTIL_PCT, f"gpu_util not given and the GPU reports no load: assumed {ASSUMED_UTIL_PCT:g}%"
    util_pct = sum(samples) / len(samples)
    return util_pct, f"gpu_util measured from the GPU's load: {util_pct:.1f}% over {len(samples)} samples"
