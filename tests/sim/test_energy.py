"""The simulated Orin energy model shows what the paper reports, and its physics is self-consistent.

These check properties, not stored numbers: a change to the calibration that breaks the paper's shape fails here.
"""

from __future__ import annotations

import statistics

import pytest

from governor.backends.rails import ENERGY_RAILS
from governor.pipeline.workloads import (
    MODELS,
    characterization_workloads,
    held_out_workloads,
    make_workload,
    model_by_name,
)
from governor.sim.energy import OrinEnergyModel, Workload

MHZ = 1_000_000
CHAR = characterization_workloads()


@pytest.fixture(scope="module")
def model():
    return OrinEnergyModel()


def optimum_hz(model, w):
    return min(model.levels_hz, key=lambda f: model.expected(w, f).energy_j)


def savings_pct(model, w):
    best = model.expected(w, optimum_hz(model, w)).energy_j
    return 100.0 * (1.0 - best / model.expected(w, None).energy_j)


def test_levels_are_the_jetpack6_table(model):
    assert len(model.levels_hz) == 11
    assert model.levels_hz[0] == 306 * MHZ and model.levels_hz[-1] == 1300500000
    assert list(model.levels_hz) == sorted(set(model.levels_hz))


def test_27_distinct_characterization_configurations():
    assert len(CHAR) == 27
    assert len({w.name for w in CHAR}) == 27
    assert {w.name.split("/")[0] for w in CHAR} == {m.name for m in MODELS}


@pytest.mark.parametrize("w", CHAR, ids=lambda w: w.name)
def test_energy_is_u_shaped_with_minimum_between_510_and_816_mhz(model, w):
    energy = [model.expected(w, f).energy_j for f in model.levels_hz]
    i = energy.index(min(energy))
    assert 510 * MHZ <= model.levels_hz[i] <= 816 * MHZ
    # U: falls to the minimum, rises after it (a flat step of <0.5% counts as level, not a second dip)
    assert all(a >= b * 0.995 for a, b in zip(energy[:i], energy[1 : i + 1], strict=False))
    assert all(b >= a * 0.995 for a, b in zip(energy[i:], energy[i + 1 :], strict=False))
    assert energy[0] > 1.1 * energy[i] and energy[-1] > 1.3 * energy[i]


@pytest.mark.parametrize("w", CHAR, ids=lambda w: w.name)
def test_time_falls_and_power_rises_with_frequency(model, w):
    samples = [model.expected(w, f) for f in model.levels_hz]
    assert all(a.time_s >= b.time_s for a, b in zip(samples, samples[1:], strict=False))
    assert all(a.power_mw < b.power_mw for a, b in zip(samples, samples[1:], strict=False))


@pytest.mark.parametrize("task", ["sst2", "qnli", "mrpc", "cola", "rte"])
@pytest.mark.parametrize("family", ["bert", "pythia"])
def test_larger_models_never_favour_a_lower_frequency(model, family, task):
    members = [m for m in MODELS if m.name.startswith(family)]  # listed smallest first
    picks = [optimum_hz(model, make_workload(m, task)) for m in members]
    assert picks == sorted(picks)
    assert picks[-1] > picks[0]


@pytest.mark.parametrize("name", [m.name for m in MODELS])
def test_longer_sequences_never_favour_a_lower_frequency(model, name):
    shape = model_by_name(name)
    picks = [optimum_hz(model, Workload("w", shape.model_type, shape.num_layers, shape.hidden_size, seq))
             for seq in (10, 20, 35, 50, 70, 100, 140)]
    assert picks == sorted(picks)


def test_savings_at_the_optimum_match_the_paper(model):
    big = [savings_pct(model, w) for w in CHAR if w.total_params_m > 70.5]
    small = [savings_pct(model, w) for w in CHAR if w.total_params_m <= 70.5]
    assert all(22.0 <= s <= 32.0 for s in big), big
    # Small models: smaller on average and far more spread out.
    assert statistics.mean(small) < statistics.mean(big) - 5.0
    assert statistics.pstdev(small) > 3 * statistics.pstdev(big)


@pytest.mark.parametrize("w", CHAR + held_out_workloads()[::7], ids=lambda w: w.name)
def test_maxn_follows_load_and_is_not_the_top_level(model, w):
    maxn = model.expected(w, None)
    top = model.expected(w, model.levels_hz[-1])
    assert maxn.freq_hz is None
    # MAXN never draws more than a fixed top clock; it is not the cheapest either
    assert maxn.power_mw <= top.power_mw
    assert maxn.energy_j > model.expected(w, optimum_hz(model, w)).energy_j
    # the governor reacts after the fact: never faster than the top clock
    assert maxn.time_s >= top.time_s


def test_maxn_scales_down_for_a_host_bound_workload_only(model):
    tiny = make_workload(model_by_name("pythia-31m"), "sst2")
    huge = make_workload(model_by_name("pythia-1b"), "mrpc")
    assert model.expected(tiny, None).mean_freq_hz < 0.6 * model.levels_hz[-1]
    assert model.expected(huge, None).mean_freq_hz == model.levels_hz[-1]


def test_gpu_util_depends_on_workload_and_frequency(model):
    top = model.levels_hz[-1]
    utils = {w.name: model.expected(w, top).gpu_util_pct for w in CHAR}
    assert utils["pythia-31m/sst2"] < utils["bert-base/sst2"] < utils["bert-xlarge/sst2"]
    assert max(utils.values()) - min(utils.values()) > 30
    w = make_workload(model_by_name("bert-base"), "mnli")
    by_freq = [model.expected(w, f).gpu_util_pct for f in model.levels_hz]
    assert by_freq == sorted(by_freq, reverse=True)  # a slower GPU is busy for more of the step
    assert all(0 < u <= 100 for u in by_freq)


def test_energy_is_time_times_energy_rails(model):
    s = model.expected(CHAR[0], 714 * MHZ)
    assert set(s.rails_mw) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert s.energy_j == pytest.approx(s.time_s * sum(s.rails_mw[r] for r in ENERGY_RAILS) / 1e3)
    # VDDQ is fed from the 5 V rail: smaller than it, and not in the total
    assert s.rails_mw["VDDQ_VDD2_1V8AO"] < s.rails_mw["VIN_SYS_5V0"]


def test_voltage_has_a_floor_and_rises_convexly(model):
    v = [model.voltage(f) for f in model.levels_hz]
    assert v[0] == v[1]  # 306 and 408 MHz share the floor
    hz = model.levels_hz
    slopes = [(v[i + 1] - v[i]) / (hz[i + 1] - hz[i]) for i in range(2, len(hz) - 1)]  # V per Hz; levels are uneven
    assert all(s > 0 for s in slopes) and slopes == sorted(slopes)


def test_idle_rails_are_below_any_training_step(model):
    idle = model.idle_rails_mw()
    busy = model.expected(CHAR[0], model.levels_hz[0]).rails_mw
    assert sum(idle[r] for r in ENERGY_RAILS) < sum(busy[r] for r in ENERGY_RAILS)


def test_noise_free_step_equals_expected_and_noise_is_seeded(model):
    w = CHAR[5]
    assert model.step(w, 612 * MHZ) == model.expected(w, 612 * MHZ)
    a = [OrinEnergyModel(noise=1.0, seed=7).step(w, 612 * MHZ) for _ in range(2)]
    assert a[0] == a[1]
    noisy = OrinEnergyModel(noise=1.0, seed=7)
    times = [noisy.step(w, 612 * MHZ).time_s for _ in range(3000)]
    expected = model.expected(w, 612 * MHZ).time_s
    assert len(set(times)) == len(times)
    assert statistics.mean(times) == pytest.approx(expected, rel=0.08)


def test_small_models_are_noisier_than_large_ones():
    def spread(name):
        m = OrinEnergyModel(noise=1.0, seed=3)
        w = make_workload(model_by_name(name), "sst2")
        t = [m.step(w, 714 * MHZ).time_s for _ in range(400)]
        return statistics.pstdev(t) / statistics.mean(t)
    assert spread("pythia-31m") > 1.5 * spread("pythia-1b")


def test_bad_inputs_are_refused(model):
    with pytest.raises(ValueError):
        Workload("x", "seq2seq", 4, 256, 20.0)
    with pytest.raises(ValueError):
        model.expected(CHAR[0], 0)
    with pytest.raises(ValueError):
        OrinEnergyModel(noise=-1)
