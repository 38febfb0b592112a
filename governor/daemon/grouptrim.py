"""Trimming a job group's ranks that wait (governor.policy.trim), driven by the ranks' own step reports.

Once the group's level is chosen (its tuner converged, or its policy pinned one level), while all its ranks are here
and each reports when its steps end (``step_end_s``) and how long its compute took (``compute_s``, the client's
``job.compute_done()`` before the collective): every rank runs ``warmup_steps`` then ``window_steps`` steps at its own
level; the group's step time over the window is the slowest rank's (from the step ends, not the meters), and each
rank's compute time orders the trials. The Trimmer lowers one rank a level per window while the step time holds, and
gives the level back when it rises. A change of membership drops the trim; the next whole group starts over from the
group's level.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from governor.errors import FtgovError
from governor.policy.trim import Trimmer
from governor.units import mhz

log = logging.getLogger("ftgovd")


@dataclass
class RankWindow:
    begin_steps: int  # the step count at which the rank's level landed
    mark: tuple[int, float, float] | None = None  # (steps, step_end_s, compute_sum_s) where the window opened
    step_s: float | None = None
    compute_s: float | None = None


@dataclass
class Compute:
    """A rank's compute time so far: the sum over its reported steps, from each report's mean ``compute_s``."""

    sum_s: float = 0.0
    last_steps: int = 0


class GroupTrim:
    """One group's trim: ``trimmer`` over its ranks (job ids), each rank's window at its level."""

    def __init__(self, levels_hz, group_hz: int, job_ids, warmup_steps: int, window_steps: int):
        self.trimmer = Trimmer(levels_hz, group_hz, sorted(job_ids))
        self.warmup_steps, self.window_steps = warmup_steps, window_steps
        self.windows: dict[int, RankWindow] = {}

    def describe(self) -> dict:
        return self.trimmer.state()

    def progress(self, gov, group, job, compute: Compute) -> None:
        """One rank's report (its step end and compute counted already): its window fed; when every rank's window
        has closed, the trimmer judges it and the ranks whose level changed move."""
        w = self.windows.get(job.job_id)
        if w is None:
            # The group's step time depends on every rank's clock: a window opens only once every pin landed.
            if all(gov.gpus[m.job.gpu_id].pinned_hz == self.trimmer.level_of(job_id)
                   and not gov.repin_pending(m.job.gpu_id) for job_id, m in group.members.items()):
                self.windows[job.job_id] = RankWindow(job.steps)
            return
        if w.step_s is not None or job.step_end_s is None:
            return
        if w.mark is None:
            if job.steps >= w.begin_steps + self.warmup_steps:
                w.mark = (job.steps, job.step_end_s, compute.sum_s)
            return
        steps = job.steps - w.mark[0]
        if steps < self.window_steps or job.step_end_s <= w.mark[1]:
            return
        w.step_s = (job.step_end_s - w.mark[1]) / steps
        w.compute_s = (compute.sum_s - w.mark[2]) / steps
        if len(self.windows) == len(group.members) and all(x.step_s is not None for x in self.windows.values()):
            self._judge(gov, group)

    def _judge(self, gov, group) -> None:
        step_s = max(w.step_s for w in self.windows.values() if w.step_s is not None)
        compute = {job_id: w.compute_s for job_id, w in self.windows.items()}
        before = {job_id: self.trimmer.level_of(job_id) for job_id in group.members}
        self.trimmer.observe(step_s, compute)
        self.windows = {}
        for job_id, member in group.members.items():
            level = self.trimmer.level_of(job_id)
            if level == before[job_id]:
                continue
            log.info("%s: trim: job %d %s -> %s (group step %.4f s, reference %.4f s)", group.label(), job_id,
                     mhz(before[job_id]), mhz(level), step_s, self.trimmer.reference_s, extra=member.job.fields())
            try:
                gov.set_freq(member.job, level, f"trim: {mhz(level)}, under the level of {group.label()} while "
                             "the group's step time holds")
            except FtgovError as e:
                log.error("%s: trim stopped: %s", group.label(), e, extra=member.job.fields())
                self.trimmer.stop()
