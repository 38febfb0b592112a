"""governor.daemon.settings: what the config sets for the controller, swapped whole on reload."""

from __future__ import annotations

import dataclasses

import pytest

from governor.config import Config
from governor.daemon.settings import PinSettings
from governor.errors import FtgovError
from governor.policy import Policy, PolicyName
from tests.daemon.test_controller import ENCODER, FakeGpu, controller, job

POLICY = Policy(PolicyName.FFG, 714_000_000, None)


def test_every_setting_comes_from_its_config_key():
    config = Config.model_validate({"limits": {"max_jobs": 7, "max_jobs_per_uid": 5, "max_ranks_per_uid": 6,
                                               "repin_interval_s": 2.5},
                                    "low_phases": ["eval"], "on_external_change": "stand_down", "power_cap_w": 12.5,
                                    "pin_above_power_mode": True, "tuner": {"baseline_window": False}})
    settings = PinSettings.from_config(config, POLICY)
    defaults = PinSettings(POLICY)
    assert settings == PinSettings(POLICY, max_jobs=7, max_jobs_per_uid=5, max_ranks_per_uid=6,
                                   low_phases=frozenset({"eval"}),
                                   on_external_change="stand_down", power_cap_mw=12_500,
                                   pin_above_power_mode=True, repin_interval_s=2.5, tuner=config.tuner)
    assert not settings.tuner.baseline_window
    # Each field differs from its default: a field from_config forgot would show here.
    assert all(getattr(settings, f.name) != getattr(defaults, f.name)
               for f in dataclasses.fields(PinSettings) if f.name != "policy")


def test_configure_swaps_every_setting_the_controller_acts_on(tmp_path):
    gpu = FakeGpu()
    pins = controller(gpu, tmp_path, defer=lambda fn, delay_s: None)
    first = job(pins)
    pins.decide(first)
    assert pins.power_mode.ceiling_hz("0") == gpu.levels_hz[-1]
    new_policy = Policy(PolicyName.FFG, 918_000_000, None)
    pins.configure(PinSettings(new_policy, max_jobs=1, low_phases=frozenset({"checkpoint"}),
                               pin_above_power_mode=True, repin_interval_s=3.0))
    assert pins.policy is new_policy
    assert pins.power_mode.ceiling_hz("0") is None  # pin_above_power_mode
    assert pins.phase_repins.interval_s == 3.0
    first.phase = "checkpoint"
    assert pins.needs_hz(first) == gpu.levels_hz[0]  # low_phases
    with pytest.raises(FtgovError, match="limits.max_jobs"):  # max_jobs: 1, held already
        pins.admit(pid=101, start_ticks=1, uid=1000, name=None, gpu_id="0", features=ENCODER)


def test_a_reload_gives_new_tuned_jobs_the_new_tuner_config_and_running_ones_keep_theirs(tmp_path):
    from governor.config import TunerConfig
    from governor.daemon.tuning import TunerAttach

    attach = TunerAttach()
    pins = controller(FakeGpu(), tmp_path, attach_tuner=attach, plan_tune=attach.plan)
    running = job(pins, policy=PolicyName.TUNE)
    pins.decide(running)
    assert running.tuner is not None and running.tuner.cfg.baseline_window
    pins.configure(dataclasses.replace(pins.settings, tuner=TunerConfig(baseline_window=False)))
    new = job(pins, pid=101, policy=PolicyName.TUNE)
    pins.decide(new)
    assert new.tuner is not None and not new.tuner.cfg.baseline_window
    assert running.tuner.cfg.baseline_window
