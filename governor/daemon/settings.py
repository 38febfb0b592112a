"""What the config sets for the controller (governor.daemon.controller), as one object that a reload swaps whole
(governor.daemon.reload)."""

from __future__ import annotations

from dataclasses import dataclass, field

from governor.config import Config, TunerConfig
from governor.daemon import ratelimit
from governor.policy import Policy


@dataclass(frozen=True)
class PinSettings:
    """policy: decides new jobs (running ones keep their decision). max_jobs, max_jobs_per_uid, max_ranks_per_uid:
    limits' (None: no cap per uid). low_phases: phases that need only the lowest level. on_external_change:
    "reapply" or "stand_down". power_cap_mw: the power limit set with a first pin (NVML), None: left alone.
    pin_above_power_mode: pins may go above the power mode's cap. repin_interval_s: the least time between two re-pins
    of a GPU for phases and tuner moves. tuner: what a new tuned job's tuner runs with (running tuners keep theirs)."""

    policy: Policy
    max_jobs: int = 64
    max_jobs_per_uid: int | None = None
    max_ranks_per_uid: int | None = None
    low_phases: frozenset[str] = frozenset()
    on_external_change: str = "reapply"
    power_cap_mw: int | None = None
    pin_above_power_mode: bool = False
    repin_interval_s: float = ratelimit.REDECIDE_INTERVAL_S
    tuner: TunerConfig = field(default_factory=lambda: TunerConfig.model_validate({}))

    @classmethod
    def from_config(cls, config: Config, policy: Policy) -> PinSettings:
        return cls(policy, max_jobs=config.limits.max_jobs, max_jobs_per_uid=config.limits.max_jobs_per_uid,
                   max_ranks_per_uid=config.limits.ranks_per_uid,
                   low_phases=frozenset(config.low_phases),
                   on_external_change=config.on_external_change,
                   power_cap_mw=round(config.power_cap_w * 1000) if config.power_cap_w else None,
                   pin_above_power_mode=config.pin_above_power_mode,
                   repin_interval_s=config.limits.repin_interval_s, tuner=config.tuner)
