"""Job groups: the ranks of one training run (torchrun, a Slurm step), each a job on its own GPU, governed as one.

Membership is by (uid, group key): a key registered by another uid is another group, so a member cannot join someone
else's run. Each rank is an ordinary job (its own hold, pidfd and pin, through the one ``combine`` rule with whatever
else shares its GPU); what the group adds is one decision for all its GPUs and one tuner:

- The first rank's registration is decided as any job's; every later rank gets the group's features (all ranks train
  the same model) and, under tune, the group's level, so that the GPUs run at one level.
- Under tune the daemon tunes the group itself while all ``world_size`` ranks are registered here (one node): a window
  closes when every live rank has measured its steps at the level, and the tuner sees the ranks' summed energy per
  step and the slowest rank's step time (the group's step time: the others wait for it at every all-reduce). A change
  of membership (a rank joins, dies, leaves) starts the windows over; while the group is not whole, or a member's GPU
  is shared with another job (the meters would measure both), the tuner pauses and the pins stay.
- A group whose ranks span nodes is never whole on one daemon: its rank 0 tunes it in the training process and each
  rank moves its own GPU with ``set_level`` (governor.client.group, docs/distributed.md).
- A rank whose process dies ends as any job does: its GPU is restored at once, the others keep their pins. The group
  ends with its last rank.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from governor.backends.rails import EnergyMeter
from governor.config import TunerConfig
from governor.daemon.energy import MeterFeed
from governor.daemon.grouptrim import Compute, GroupTrim
from governor.daemon.jobs import ActiveJob, GroupTag, Refused
from governor.errors import FtgovError
from governor.policy import Decision, PolicyName
from governor.policy.tuner import Measurement, OnlineTuner, ProbeWindow
from governor.policy.windows import Reference, StepScatter, summed_noise_rel
from governor.units import mhz

log = logging.getLogger("ftgovd")

GroupKey = tuple[int, str]  # (uid, key)
# The WindowRule fields a multi-node group's ranks are told (Groups.window_rule); the rest keep their defaults there.
RULE_FIELDS = ("target_rel", "min_s", "max_s", "min_updates", "meter_update_s", "min_steps", "prior_rel")
AttachTuner = Callable[[object, ActiveJob], None]
PlanTune = Callable[[object, ActiveJob, Decision], Decision]


class GroupRefused(Refused):
    """A registration that cannot join its group (a rank already live, a GPU already held by the group), or a
    set_level that is not the caller's to make. ``field``: the request's field at fault."""


@dataclass
class Member:
    job: ActiveJob
    feed: MeterFeed | None = None  # the group tuner's own meter on this rank's GPU (None: no energy source)
    window: ProbeWindow | None = None  # this rank's window at the group's level, once the pin landed
    measured: Measurement | None = None  # this rank's closed window, waiting for the other ranks'
    last_joules_per_step: float | None = None  # its part of the group's last window: its share of the next reference
    scatter: StepScatter | None = None  # its steps' scatter over its windows so far, the next window's prior
    compute: Compute = field(default_factory=Compute)  # its compute time so far, for the trim


@dataclass
class GroupWindow:
    """One closed window of the whole group: what its tuner observed."""

    level_hz: int
    joules_per_step: float  # summed over the ranks
    seconds_per_step: float  # the slowest rank's
    ranks: int
    steps: int  # the fewest steps a rank's window measured
    seconds: float | None  # the longest a rank's window lasted
    noise_rel: float | None  # the sum's relative uncertainty (summed_noise_rel); None: fixed-step windows


@dataclass
class Group:
    uid: int
    key: str
    world_size: int | None
    members: dict[int, Member] = field(default_factory=dict)  # job id -> member
    features: object | None = None  # the first rank's Features: every later rank is decided on them
    level_hz: int | None = None  # the level the group runs at (its tuner's, or its rank 0's through set_level)
    tuner: OnlineTuner | None = None
    total_steps: int | None = None  # the group's length as its tuner was last told it (Groups._tell_length)
    status: str = "no tuner (the group's policy pins one level)"
    remote: bool = False  # its rank 0 tunes it through set_level: this daemon's tuner stays off
    windows: list[GroupWindow] = field(default_factory=list)
    trim: GroupTrim | None = None  # after convergence: the ranks that wait, lowered (governor.daemon.grouptrim)

    def whole(self) -> bool:
        """Every rank is registered here (a group that never said its world size is whole with what it has)."""
        return self.world_size is None or len(self.members) == self.world_size

    def label(self) -> str:
        return f"group {self.key!r} (uid {self.uid})"

    def restart_windows(self) -> None:
        for m in self.members.values():
            m.window = m.measured = None

    def membership_changed(self) -> None:
        self.restart_windows()
        self.trim = None


class Groups:
    """The job groups of one daemon: the one owner of which job is in which group. ``tuner_config()``: the tuner's
    knobs in force (a reload replaces them; a running group keeps its tuner)."""

    def __init__(self, tuner_config: Callable[[], TunerConfig] | None = None):
        if tuner_config is None:
            defaults = TunerConfig.model_validate({})
            tuner_config = lambda: defaults  # noqa: E731
        self._tuner_config = tuner_config
        self._groups: dict[GroupKey, Group] = {}
        self._of_job: dict[int, Group] = {}

    # ---- membership -------------------------------------------------------------------------------------------------
    def of(self, job_id: int) -> Group | None:
        return self._of_job.get(job_id)

    def check_join(self, uid: int, tag: GroupTag, gpu_id: str) -> None:
        """Refuse a rank that the group has live already, or a second rank on one of the group's GPUs."""
        group = self._groups.get((uid, tag.key))
        if group is None:
            return
        if tag.world_size is not None and group.world_size is not None and tag.world_size != group.world_size:
            raise GroupRefused("world_size", f"{tag.world_size}, but {group.label()} has {group.world_size}")
        # Whichever registration said the world size, the group holds at most that many ranks, each below it: a rank
        # that does not fit would leave the group never whole, its tuner paused for good.
        world = group.world_size if group.world_size is not None else tag.world_size
        if world is not None:
            if group.world_size is None:  # this registration says it first: the ranks already in must fit
                ranked = [m.job.group.rank for m in group.members.values()
                          if m.job.group is not None and m.job.group.rank is not None]
                if ranked and max(ranked) >= world:
                    raise GroupRefused("world_size", f"{world}, but {group.label()} has rank {max(ranked)} "
                                                     "registered already")
                if len(group.members) >= world:
                    raise GroupRefused("world_size", f"{world}, but {group.label()} has {len(group.members)} ranks "
                                                     "registered already")
            elif len(group.members) >= world:
                raise GroupRefused("group", f"{group.label()} has {len(group.members)} of {world} ranks registered "
                                            "here already")
            if tag.rank is not None and tag.rank >= world:
                raise GroupRefused("rank", f"rank {tag.rank} is not below {group.label()}'s world_size {world}")
        for m in group.members.values():
            if tag.rank is not None and m.job.group is not None and m.job.group.rank == tag.rank:
                raise GroupRefused("rank", f"rank {tag.rank} of {group.label()} is live already (job {m.job.job_id})")
            if m.job.gpu_id == gpu_id:
                # Mostly a launcher's ranks that all default to GPU 0 (a host without CUDA, no CUDA_VISIBLE_DEVICES).
                raise GroupRefused("gpu", f"GPU {gpu_id} already holds job {m.job.job_id} of {group.label()}: two "
                                          "ranks on one GPU; give each rank its own (CUDA_VISIBLE_DEVICES, or gpu= "
                                          "per rank)")

    def join(self, gov, job: ActiveJob) -> Group:
        """Put an admitted job (its ``group`` tag set) in its group, before it is decided: a later rank takes the
        group's features, so that the policy decides the same for it."""
        tag = job.group
        assert tag is not None, "only a job that registered with a group joins one"
        group = self._groups.get((job.uid, tag.key))
        if group is None:
            group = self._groups[(job.uid, tag.key)] = Group(job.uid, tag.key, tag.world_size)
            log.info("%s: started by %s (world size %s)", group.label(), job.label(),
                     "not told" if tag.world_size is None else tag.world_size, extra=job.fields())
        if group.world_size is None and tag.world_size is not None:
            group.world_size = tag.world_size
        if group.features is None:
            group.features = job.features
        else:
            job.features = group.features  # type: ignore[assignment]
        group.members[job.job_id] = Member(job, self._feed(gov, job))
        self._of_job[job.job_id] = group
        job.group_kept_hz = lambda: self.kept_hz(job)
        group.membership_changed()
        return group

    def left(self, job_id: int, why: str) -> None:
        """A rank's job ended (its process died, it unregistered, its connection closed): its GPU was restored by its
        end; the others carry on. The group ends with its last rank."""
        group = self._of_job.pop(job_id, None)
        if group is None:
            return
        group.members.pop(job_id, None)  # kept_hz answers None for it from now on (no group)
        group.membership_changed()
        if not group.members:
            del self._groups[(group.uid, group.key)]
            log.info("%s ended with its last rank (%s)", group.label(), why)
        else:
            log.info("%s: job %d left (%s); %d rank(s) carry on at %s", group.label(), job_id, why,
                     len(group.members), mhz(group.level_hz, none="no pin"))

    def readopt(self, gov, jobs: list[ActiveJob]) -> None:
        """A restarted daemon's re-adopted jobs: the groups rebuilt from their tags, at the level they were left at.
        Their tuner does not resume (its windows are gone): the group keeps that level. Each rank's meter goes on, as
        join's: a run across nodes reads its ranks' energy (job_energy), and a rank that registers again (its job lost
        by the restart) starts the group's tuner over."""
        for job in jobs:
            if job.group is None:
                continue
            group = self._groups.get((job.uid, job.group.key))
            if group is None:
                group = self._groups[(job.uid, job.group.key)] = Group(job.uid, job.group.key, job.group.world_size)
                group.features, group.level_hz = job.features, job.freq_hz
                group.status = "re-adopted after a daemon restart: keeps its level"
            group.members[job.job_id] = Member(job, self._feed(gov, job))
            self._of_job[job.job_id] = group

    def kept_hz(self, job: ActiveJob) -> int | None:
        """The level a restarted daemon re-adopts a rank at (ActiveJob.kept_hz), where its group's tuner is here:
        what stopping the tuning now would keep, as for a single job (JobTuner.keep_hz). A restart loses the search,
        and a re-adopted group keeps its level until its ranks end: the level a window was measuring would be held
        that long. While the search runs, the best level measured so far; while the trim searches, the group's
        level (a rank's trim probe may slow the group's steps); None where the rank's own level stands (no tuner
        here, a converged or trimmed group, one tuned by its rank 0 across nodes)."""
        group = self._of_job.get(job.job_id)
        if group is None or group.remote:
            return None
        if group.trim is not None and not group.trim.trimmer.done:
            return group.level_hz
        if group.tuner is None or group.tuner.converged:
            return None
        return group.tuner.best_hz

    @staticmethod
    def _feed(gov, job: ActiveJob) -> MeterFeed:
        """The group's own meter of a rank's GPU. The rails' sampler integrates only the jobs' meters and their
        tuners': a group's windows read the job's."""
        return MeterFeed(gov.energy, gov.gpus[job.gpu_id].gpu,
                         meter=job.meter if isinstance(job.meter, EnergyMeter) else None)

    # ---- the decision ----------------------------------------------------------------------------------------------
    def plan_tune(self, plan: PlanTune) -> PlanTune:
        """The Controller's plan_tune: a group's later ranks start at the group's level, not at their own."""
        def planned(gov, job: ActiveJob, decision: Decision) -> Decision:
            group = self._of_job.get(job.job_id)
            if group is None:
                return plan(gov, job, decision)
            if group.level_hz is not None and group.level_hz in gov.power_mode.allowed_levels(job.gpu_id):
                job.tune_start_hz = group.level_hz
                return Decision(PolicyName.TUNE, group.level_hz, f"tune: at the level of {group.label()}")
            decided = plan(gov, job, decision)
            group.level_hz = decided.freq_hz
            return decided
        return planned

    def attach_tuner(self, attach: AttachTuner) -> AttachTuner:
        """The Controller's attach_tuner: a group's ranks share the group's tuner instead of each having one."""
        def attached(gov, job: ActiveJob) -> None:
            group = self._of_job.get(job.job_id)
            observing = None if group is None else self._observing_rank(gov, group)
            if group is None or job.decision is None or job.decision.policy is not PolicyName.TUNE:
                attach(gov, job)
                return
            job.tuner = None
            if group.tuner is None and not group.remote and job.decision.freq_hz is not None and observing is None:
                cfg = self._tuner_config()
                levels = gov.power_mode.allowed_levels(job.gpu_id)
                if job.decision.freq_hz in levels:
                    # No follow-up (tuner.follow_up): a converged group measures no more windows (its trim
                    # follows), so a near-tie its tuner would go on to confirm would be where it stayed.
                    group.tuner = cfg.model_copy(update={"follow_up": False}).new_tuner(levels, job.decision.freq_hz)
                    group.total_steps = None
                    group.status = "waiting for every rank" if not group.whole() else "measuring"
                    self._tell_length(gov, group)
        return attached

    @staticmethod
    def _observing_rank(gov, group: Group) -> ActiveJob | None:
        """A rank whose GPU cannot be pinned (Controller.unpinned: it observes), or None. The group's windows need
        every rank at the group's level, which that one never reaches: the group gets no tuner, and one it has stops
        (its trim too), rather than wait for ever; the other ranks keep the level they run at."""
        job = next((m.job for m in group.members.values() if gov.gpus[m.job.gpu_id].cannot_pin is not None), None)
        if job is None or group.remote:
            return job
        status = (f"no tuner: GPU {job.gpu_id} (job {job.job_id}) cannot be pinned and observes; the other ranks "
                  f"keep {mhz(group.level_hz, none='no pin')}")
        if group.tuner is not None or group.trim is not None:
            group.tuner, group.trim = None, None
            log.warning("%s: tuning stopped: GPU %s (job %d) cannot be pinned (%s); the other ranks keep %s",
                        group.label(), job.gpu_id, job.job_id, gov.gpus[job.gpu_id].cannot_pin,
                        mhz(group.level_hz, none="no pin"), extra=job.fields())
        group.status = status
        return job

    # ---- the group's tuner -----------------------------------------------------------------------------------------
    def progress(self, gov, job: ActiveJob, compute_s: float | None = None) -> None:
        """A rank's progress report (``job.steps`` updated already; ``compute_s``: its mean compute time per step
        since its last report): its meter read, and its window fed; the group's window closes when every rank's
        has. After convergence, the trim's windows instead."""
        group = self._of_job.get(job.job_id)
        if group is None:
            return
        member = group.members[job.job_id]
        if compute_s is not None:
            member.compute.sum_s += compute_s * max(0, job.steps - member.compute.last_steps)
            member.compute.last_steps = job.steps
        if group.tuner is None or group.remote:
            return  # no meter read: a group without a tuner here costs its reports nothing more
        self._tell_length(gov, group)
        tuner = group.tuner
        if tuner is None:  # the length ended the search, and a pin at its choice failed
            return
        points: list = []
        if member.feed is not None and member.feed.meter is not None and not tuner.converged:
            # Read at every report while searching, so that the counter's edges stay continuous.
            points = member.feed.report_points(job)
        if not group.whole():
            group.status = f"paused: {len(group.members)} of {group.world_size} ranks registered here"
            group.membership_changed()
            return
        # No two ranks share a GPU (check_join): another job on a member's GPU is none of the group's.
        shared = [m.job.gpu_id for m in group.members.values() if gov.jobs.shares_gpu(m.job)]
        if shared:
            group.status = f"paused: another job shares GPU {shared[0]} (its meter would measure both)"
            group.membership_changed()
            return
        if tuner.converged:
            self._trim(gov, group, job)
            return
        if any(m.feed is None or m.feed.meter is None for m in group.members.values()):
            group.status = "stopped: a rank's GPU has no energy source"
            group.tuner = None
            return
        group.status = "measuring"
        level = group.level_hz
        assert member.feed is not None and member.feed.meter is not None, "checked for every member above"
        if member.window is None:
            # The window opens at the first report after every rank's pin landed (a move may wait for the GPU's
            # re-pin interval; the group's step time depends on every clock), and skips the warm-up steps after it.
            if level is not None and all(gov.gpus[m.job.gpu_id].pinned_hz == level
                                         and not gov.repin_pending(m.job.gpu_id) for m in group.members.values()):
                cfg = self._tuner_config()
                update_s = member.feed.meter.update_s
                rule = member.feed.window_rule(cfg.window(update_s))
                member.window = ProbeWindow(level, job.steps, cfg.warmup_steps, cfg.window_steps,
                                            rule=rule, meter_update_s=update_s,
                                            settle_s=member.feed.settle_s(cfg.settle_updates),
                                            reference=self._reference(group, member) if rule is not None else None,
                                            least=not group.windows, step_prior=member.scatter)
            return
        if member.measured is None:
            try:
                for steps, e_j, t_s in points:
                    member.measured = member.window.feed(steps, e_j, t_s, job.phase or "train")
                    if member.measured is not None:
                        break
            except FtgovError as e:
                log.warning("%s: window of job %d dropped: %s", group.label(), job.job_id, e, extra=job.fields())
                group.restart_windows()
                return
        if all(m.measured is not None for m in group.members.values()):
            self._window_closed(gov, group)

    def _tell_length(self, gov, group: Group) -> None:
        """The group's length, once told or changed, to its tuner, priced over the steps left as a single job's is
        (TuningSession.set_total_steps); a search the new length ends pins every rank at its choice at once. The
        group's length is the largest its ranks told (each rank's latest, at register or with progress): the ranks of
        one run tell the same; where they differ, the search is priced for the longest."""
        tuner = group.tuner
        told = [m.job.total_steps for m in group.members.values() if m.job.total_steps is not None]
        if tuner is None or not told or max(told) == group.total_steps:
            return
        group.total_steps = max(told)
        if tuner.converged:
            return  # a converged group's tuner measures no more windows: its trim follows
        left = max(0, group.total_steps - self._steps(group))
        tuner.set_steps_left(left)
        if tuner.converged:
            group.restart_windows()  # a window open at a level of the search is none of the level chosen
            group.status = "converged"
            log.info("%s: %d steps left of %d: the search ends on %s", group.label(), left, group.total_steps,
                     mhz(tuner.best_hz))
            self._move(gov, group, tuner.best_hz,
                       f"tune: converged for {group.label()} (the group's length ended the search)")

    @staticmethod
    def _steps(group: Group) -> int:
        """The group's steps so far: its ranks run the same steps, the one that reported last counted the most."""
        return max(m.job.steps for m in group.members.values())

    @staticmethod
    def _reference(group: Group, member: Member) -> Reference | None:
        """What a rank's window is compared with, so that it closes once that is clear, as a single job's does
        (TuningSession): the tuner's reference for the group's sum, scaled to this rank's share of the group's last
        window (the ranks run the same steps; their shares hold from one level to the next)."""
        ref = group.tuner.window_reference(group.level_hz) if group.tuner is not None and group.level_hz else None
        parts = [m.last_joules_per_step for m in group.members.values()]
        if ref is None or member.last_joules_per_step is None or any(p is None for p in parts):
            return None
        share = member.last_joules_per_step / sum(cast(float, p) for p in parts)
        return dataclasses.replace(ref, joules_per_step=ref.joules_per_step * share)

    def _trim(self, gov, group: Group, job: ActiveJob) -> None:
        """After convergence, while every rank reports its step ends and compute times: the trim's windows."""
        if group.trim is None:
            if group.level_hz is None or not all(m.compute.last_steps and m.job.step_end_s is not None
                                                 for m in group.members.values()):
                return  # the ranks do not say how long their compute takes (job.compute_done()): no trim
            cfg = self._tuner_config()
            group.trim = GroupTrim(gov.power_mode.allowed_levels(job.gpu_id), group.level_hz, list(group.members),
                                   cfg.warmup_steps, cfg.window_steps)
            group.status = "converged; trimming the ranks that wait"
            self._move(gov, group, group.level_hz, f"tune: converged for {group.label()}")
        group.trim.progress(gov, group, job, group.members[job.job_id].compute)
        if group.trim is not None and group.trim.trimmer.done:
            group.status = "converged; trimmed"

    def _window_closed(self, gov, group: Group) -> None:
        tuner = group.tuner
        assert tuner is not None and group.level_hz is not None, "a window closes at a level of a tuner"
        measured = [m.measured for m in group.members.values() if m.measured is not None]
        durations = [m.duration_s for m in measured if m.duration_s is not None]
        w = GroupWindow(group.level_hz, sum(m.joules_per_step for m in measured),
                        max(m.seconds_per_step for m in measured), len(measured),
                        min(m.measured_steps for m in measured), max(durations) if durations else None,
                        summed_noise_rel([(m.joules_per_step, m.noise_rel) for m in measured]))
        group.windows.append(w)
        for m in group.members.values():
            if m.measured is not None:
                m.last_joules_per_step = m.measured.joules_per_step
            if m.window is not None:
                m.scatter = m.window.scatter_with(m.scatter)
        group.restart_windows()
        if w.noise_rel is not None:
            # A window's length in steps is known only once windows have run: the next one is priced from the
            # mean of those so far, as a single job's (TuningSession).
            sized = [g.steps for g in group.windows if g.noise_rel is not None]
            tuner.set_job(probe_steps=self._tuner_config().warmup_steps + round(sum(sized) / len(sized)))
        steps = self._steps(group)
        # The group's own count of the steps left, when its length is known, as TuningSession gives a single job's:
        # the windows' steps alone undercount it (the steps that wait for the pins, a pause).
        left = None if group.total_steps is None else max(0, group.total_steps - steps)
        try:
            # The window's middle step, for the tuner's drift (as TuningSession gives a single job's).
            tuner.observe(w.level_hz, w.joules_per_step, w.seconds_per_step, noise_rel=w.noise_rel,
                          at_step=steps - w.steps / 2, steps_left=left)
        except FtgovError as e:
            log.warning("%s: tuning stopped: %s; keeping %s", group.label(), e, mhz(group.level_hz))
            group.tuner, group.status = None, f"stopped: {e}"
            return
        nxt = tuner.best_hz if tuner.converged else tuner.next_level_hz()
        noise = "" if w.noise_rel is None else f" +-{100 * w.noise_rel:.1f}%"
        log.info("%s: window %d at %s: %.4f J/step%s over %d ranks, %.4f s/step (slowest), %d steps -> %s",
                 group.label(), tuner.probes, mhz(w.level_hz), w.joules_per_step, noise, w.ranks, w.seconds_per_step,
                 w.steps, f"converged on {mhz(nxt)}" if tuner.converged else f"next {mhz(nxt)}")
        if tuner.converged:
            group.status = "converged"
        self._move(gov, group, nxt, f"tune: converged for {group.label()}" if tuner.converged
                   else f"tune: probing for {group.label()}")

    def _move(self, gov, group: Group, level_hz: int, reason: str) -> None:
        group.level_hz = level_hz
        for m in list(group.members.values()):
            try:
                gov.set_freq(m.job, level_hz, reason)
            except FtgovError as e:
                log.error("%s: could not pin %s on GPU %s: %s; tuning stopped", group.label(), mhz(level_hz),
                          m.job.gpu_id, e, extra=m.job.fields())
                group.tuner, group.status = None, f"stopped: {e}"

    # ---- across nodes ----------------------------------------------------------------------------------------------
    def set_level(self, gov, job: ActiveJob, freq_hz: int) -> None:
        """A rank moves its own GPU to the level its group's rank 0 chose (governor.client.group). The caller has
        checked that it holds the job; this checks the rest (docs/distributed.md, "Across nodes")."""
        group = self._of_job.get(job.job_id)
        if group is None:
            raise GroupRefused("job_id", "this job is in no group (set_level moves a group's rank)")
        if group.tuner is not None and not group.remote and group.whole():
            raise GroupRefused("job_id", f"{group.label()} is tuned by this daemon (all its ranks are here): "
                               "set_level is for a group whose ranks span nodes")
        if (why := gov.gpus[job.gpu_id].cannot_pin) is not None:
            raise GroupRefused("job_id", f"GPU {job.gpu_id} cannot be pinned ({why}): this rank observes")
        if job.decision is None or job.decision.policy is PolicyName.OBSERVE:
            raise GroupRefused("job_id", "the observe policy pins nothing")
        if freq_hz not in gov.gpus[job.gpu_id].gpu.levels_hz:
            raise GroupRefused("freq_hz", f"{freq_hz} is not a level of GPU {job.gpu_id}")
        if freq_hz not in gov.power_mode.allowed_levels(job.gpu_id):
            raise GroupRefused("freq_hz", f"{mhz(freq_hz)} is above the power mode's cap on GPU {job.gpu_id}")
        if not group.remote:
            group.remote, group.tuner = True, None
            log.info("%s: tuned by its rank 0 across nodes (set_level from job %d)", group.label(), job.job_id,
                     extra=job.fields())
        group.status = "tuned by its rank 0 (set_level)"
        group.level_hz = freq_hz
        gov.set_freq(job, freq_hz, f"tune: the level {group.label()}'s rank 0 chose")

    def window_rule(self, job: ActiveJob) -> dict | None:
        """What a multi-node group's windows are sized by (governor.client.group), for the register reply: the tuner's
        window rule (tuner.window_*) on this rank's meter. None for fixed-step windows, or a GPU with no energy
        source."""
        group = self._of_job.get(job.job_id)
        member = group.members.get(job.job_id) if group is not None else None
        if member is None or member.feed is None or member.feed.meter is None:
            return None
        rule = self._tuner_config().window(member.feed.meter.update_s)
        return None if rule is None else {name: getattr(rule, name) for name in RULE_FIELDS}

    def energy_j(self, job: ActiveJob) -> float | None:
        """A rank's energy so far on the group's own meter of its GPU, read now (None: no energy source)."""
        group = self._of_job.get(job.job_id)
        member = group.members.get(job.job_id) if group is not None else None
        if member is None or member.feed is None or member.feed.meter is None:
            return None
        return member.feed.energy_j(job)

    # ---- status -----------------------------------------------------------------------------------------------------
    def describe(self, uid: int, sees_all: bool) -> list[dict]:
        """The groups as ``status`` shows them to ``uid``: others' groups without their key."""
        out = []
        for (g_uid, key), g in self._groups.items():
            ranks = [{"job_id": m.job.job_id, "rank": m.job.group.rank if m.job.group else None, "gpu": m.job.gpu_id,
                      "freq_hz": m.job.freq_hz} for m in g.members.values()]
            entry: dict = {"world_size": g.world_size, "ranks": sorted(ranks, key=lambda r: r["job_id"]),
                           "level_hz": g.level_hz}
            if sees_all or g_uid == uid:
                entry.update(key=key, uid=g_uid, status=g.status, remote=g.remote,
                             tuner=g.tuner.state() if g.tuner is not None else None,
                             trim=g.trim.describe() if g.trim is not None else None,
                             windows=[vars(w) for w in g.windows[-8:]])
            else:
                entry["redacted"] = True
            out.append(entry)
        return out
