"""A job's phase as the daemon acts on it (the pin under low_phases, the tuner's windows, the measured saving).

A stretch out of training shorter than a second (governor.policy.windows.SHORT_PHASE_S, which the client's windows of
a group across nodes follow too; or limits.repin_interval_s where that is longer) is training: a loop that reports
`data` around each batch's loading, or evaluates every step or two, is measured and pinned as the same loop without
phase reports is, its data loading inside its steps. Acted on at once, each such report would pause the tuner's
windows, leaving them no training between two reports to measure (the job is never tuned), and `data` in low_phases
would move the pin to the lowest level, where the training after it runs until the re-pin interval lets the pin back.
A second is where a pause the job does not report is cut out of the windows (governor.daemon.energy.GAP_MIN_S); a
stretch shorter than the re-pin interval is one the pin cannot follow.

A longer stretch (an evaluation, a checkpoint save) is acted on once it has lasted that long, as if reported then:
the windows cut it out from the last step that ended before it (no step ended meanwhile, so nothing of it was
measured), and the pin moves to low_phases' level. A change between two phases out of training, and back to
training from one acted on, is acted on at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from governor.daemon.jobs import ActiveJob

log = logging.getLogger("ftgovd")

Defer = Callable[[Callable[[], None], float], None]


class PhaseHold:
    """Holds back a job's report that leaves training until the stretch has lasted ``hold_s``; then ``lasted(job,
    phase)`` acts on it. One timer per job at a time, however fast its phases flip."""

    def __init__(self, defer: Defer, lasted: Callable[[ActiveJob, str], None]):
        self._defer = defer
        self._lasted = lasted
        self._held: dict[int, tuple[ActiveJob, str, float]] = {}  # job_id -> (job, phase, when it is acted on)
        self._timed: set[int] = set()  # job_ids with a timer set

    def reported(self, job: ActiveJob, phase: str | None, hold_s: float) -> str | None:
        """The phase a progress report of ``phase`` is acted on with now (None: no change); the job's phase_said is
        ``phase``."""
        if phase is None:
            return None
        job.phase_said = phase
        if phase == "train" or (job.phase or "train") != "train":
            self._held.pop(job.job_id, None)  # a stretch shorter than the hold: training
            return phase
        held = self._held.get(job.job_id)
        due_s = held[2] if held is not None else time.monotonic() + hold_s  # data, then checkpoint: one stretch
        self._held[job.job_id] = (job, phase, due_s)
        if job.job_id not in self._timed:
            self._set_timer(job.job_id, hold_s)
        return None

    def _set_timer(self, job_id: int, delay_s: float) -> None:
        self._timed.add(job_id)
        self._defer(lambda: self._due(job_id), delay_s)

    def _due(self, job_id: int) -> None:
        self._timed.discard(job_id)
        held = self._held.get(job_id)
        if held is None:
            return
        job, phase, due_s = held
        wait_s = due_s - time.monotonic()
        if wait_s > 0:  # a stretch that began after the one this timer was set for
            self._set_timer(job_id, wait_s)
            return
        del self._held[job_id]
        try:
            self._lasted(job, phase)
        except Exception as e:  # deferred: there is no client waiting to be told
            log.error("%s: phase %s not acted on: %s", job.label(), phase, e, extra=job.fields())
