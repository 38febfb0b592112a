"""governor.daemon.joins: what a registration joins, with the scheduler's holds and the groups stood in for (the real
ones, through the daemon: tests/daemon/test_slurm_hold.py and tests/daemon/test_groups.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from governor.daemon.groups import GroupRefused
from governor.daemon.jobs import ActiveJob, GroupTag, Registration
from governor.daemon.joins import Joins
from governor.daemon.scheduler import SchedulerHolds
from governor.features import Features
from governor.policy import PolicyName

FEATURES = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


class Scheduler:
    def __init__(self, hold_policy: str | None):
        self.hold = None if hold_policy is None else SimpleNamespace(policy=hold_policy)
        self.joined: list[int] = []

    def joinable(self, slurm_job_id: int, uid: int, gpu_id: str):
        return (self.hold, "") if self.hold is not None else (None, f"no hold for Slurm job {slurm_job_id}")

    inside_policy = staticmethod(SchedulerHolds.inside_policy)

    def join(self, hold, job: ActiveJob) -> None:
        self.joined.append(job.job_id)


class Groups:
    def __init__(self, refuse: GroupRefused | None = None):
        self.refuse, self.members, self.departed = refuse, [], []

    def check_join(self, uid: int, tag: GroupTag, gpu_id: str) -> None:
        if self.refuse is not None:
            raise self.refuse

    def join(self, gov, job: ActiveJob) -> None:
        self.members.append(job.job_id)

    def left(self, job_id: int, why: str) -> None:
        self.departed.append((job_id, why))

    def window_rule(self, job: ActiveJob) -> dict | None:
        return {"min_s": 1.0}


GOV = SimpleNamespace(power_mode=SimpleNamespace(allowed_levels=lambda gpu_id: (306_000_000, 612_000_000)))


def registered(reg: Registration) -> ActiveJob:
    return ActiveJob(3, 100, 1, reg.uid, None, "0", FEATURES, group=reg.group)


def test_a_joined_hold_gives_its_policy_and_the_reply_says_so():
    scheduler, groups = Scheduler("mlg"), Groups()
    joins = Joins(scheduler, groups)  # type: ignore[arg-type]
    reg = Registration(1000, None, FEATURES, slurm_job_id=42)
    joining = joins.check(reg, "0", None, observe_only=False)
    assert joining.policy is PolicyName.MLG and joining.reply == {"slurm": {"slurm_job_id": 42, "joined": True}}
    joins.join(joining, GOV, registered(reg))
    assert scheduler.joined == [3] and groups.members == []
    # tune inside a tune hold, on a daemon that pins nothing: observed
    tuned = Joins(Scheduler("tune"), groups).check(Registration(1000, None, FEATURES, tune=True, slurm_job_id=42),  # type: ignore[arg-type]
                                                   "0", PolicyName.TUNE, observe_only=True)
    assert tuned.policy is PolicyName.OBSERVE


def test_a_hold_that_cannot_be_joined_leaves_the_job_its_own_policy_and_says_why():
    joining = Joins(Scheduler(None), Groups()).check(  # type: ignore[arg-type]
        Registration(1000, None, FEATURES, tune=True, slurm_job_id=7), "0", PolicyName.TUNE, observe_only=False)
    assert joining.policy is PolicyName.TUNE and joining.hold is None
    assert joining.reply["slurm"] == {"slurm_job_id": 7, "joined": False, "why": "no hold for Slurm job 7"}


def test_a_group_rank_joins_is_told_its_table_and_leaves_when_its_first_pin_failed():
    groups = Groups()
    joins = Joins(Scheduler(None), groups)  # type: ignore[arg-type]
    reg = Registration(1000, None, FEATURES, group=GroupTag("run", 1, 2))
    joining = joins.check(reg, "0", None, observe_only=False)
    job = registered(reg)
    joins.join(joining, GOV, job)
    assert groups.members == [3]
    assert joining.reply == {"group": "run", "rank": 1, "levels_hz": [306_000_000, 612_000_000],
                             "window": {"min_s": 1.0}}  # what a run across nodes sizes its windows by
    joins.failed(joining, job)
    assert groups.departed == [(3, "its first pin failed")]


def test_a_group_that_refuses_the_rank_refuses_the_registration():
    joins = Joins(Scheduler(None), Groups(GroupRefused("rank", "rank 1 of run is live already")))  # type: ignore[arg-type]
    with pytest.raises(GroupRefused, match="rank: rank 1"):
        joins.check(Registration(1000, None, FEATURES, group=GroupTag("run", 1, 2)), "0", None, observe_only=False)
