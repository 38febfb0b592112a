"""The tuner's estimates as an object of their own: a search is given the settings and a view of the estimates, and
the views of one job share its windows and what exploration has spent."""

from __future__ import annotations

import math
import random
import statistics

from governor.policy.estimates import Estimates, TunerSettings
from governor.policy.search import Search
from governor.policy.tuner import OnlineTuner, TuningSession
from governor.sim.meters import H200_LONG_TRACES, H200_TRACES, StepSequence

LEVELS = tuple(300_000_000 + k * 100_000_000 for k in range(11))


def settings(**changes) -> TunerSettings:
    values = dict(max_slowdown=None, noise_rel=0.03, z_confirm=2.0, explore_budget_frac=0.015, total_steps=2000,
                  probe_steps=5, confirm_windows=2, max_probes=40)
    return TunerSettings(**{**values, **changes})


def test_a_search_plans_from_the_settings_and_estimates_it_is_given():
    s = settings()
    est = Estimates(LEVELS, 5, s)
    search = Search(s, est.subset(range(11), 5), list(range(11)), list(range(11)), probes=0)
    assert (search.plan.phase, search.plan.index) == ("start", 5)
    est.add(5, 2.0, 1.0, 0.03, charge=True)
    search.replan(probes=1)
    assert search.plan.phase == "descend"
    s.max_probes = 1  # one settings object: the search reads the change
    search.replan(probes=1)
    assert search.chosen == 5 and search.plan.reason.startswith("safety cap of 1 windows reached")


def test_views_share_the_windows_and_the_budget_spent():
    est = Estimates(LEVELS, 0, settings())
    grid = est.subset([0, 4, 8], 4)
    assert grid.levels_hz == (LEVELS[0], LEVELS[4], LEVELS[8]) and grid.start == 1
    est.add(0, 3.0, 1.0, 0.03, charge=True)  # the first window: free
    grid.add(1, 2.0, 1.0, 0.03, charge=True)  # cheaper than the incumbent: free
    est.add(0, 3.0, 1.0, 0.03, charge=True)  # above the incumbent (level 4's 2.0)
    assert est.windows(4) == 1 and grid.windows(0) == 2
    assert math.isclose(est.explore_spent_j, 5 * (3.0 - 2.0)) and grid.explore_spent_j == est.explore_spent_j
    est.add(0, 9.0, 1.0, 0.03, charge=False)  # after convergence: recorded, not charged
    assert grid.windows(0) == 3 and grid.explore_spent_j == est.explore_spent_j
    assert math.isclose(est.explore_spent_j, 5.0)


def test_the_tuner_reads_its_settings_from_one_object():
    tuner = OnlineTuner(LEVELS, LEVELS[5], total_steps=100)
    tuner.set_job(total_steps=1000, probe_steps=10)
    assert tuner.settings.total_steps == tuner.total_steps == 1000
    assert tuner.settings.probe_steps == tuner.probe_steps == 10


def test_max_slowdown_judges_a_levels_step_time_by_its_windows_own_uncertainty():
    """A level 8% slower than the top under max_slowdown 0.1: feasible (it may be chosen) when its windows and the top's
    are precise, as a noise_rel of 3% would judge one window each; not when the windows say their own uncertainty is
    larger (short windows of scattering steps), so that a level is not chosen on a ratio its windows cannot tell."""
    top, slow = len(LEVELS) - 1, 4

    def judged(noise_rel: float) -> bool:
        est = Estimates(LEVELS, slow, settings(max_slowdown=0.10))
        est.add(top, 3.0, 1.00, noise_rel, charge=True)
        est.add(slow, 2.0, 1.08, noise_rel, charge=True)
        return est.feasible(slow, [1.0] * len(LEVELS))

    assert judged(0.005)  # 1.08 + 1 s.d. of 0.7% is within 1.10
    assert not judged(0.05)  # 1 s.d. is 7%: 1.08 may be well over 1.10


def test_without_drift_a_levels_estimate_is_its_windows_mean_each_weighted_by_its_own_uncertainty():
    est = Estimates(LEVELS, 0, settings())  # drift_rel 0: the windows are independent
    est.add(0, 2.0, 1.0, 0.01, charge=True)
    est.add(0, 2.2, 1.0, 0.02, charge=True)
    w1, w2 = 1 / 0.01 ** 2, 1 / 0.02 ** 2
    assert math.isclose(est.log_energy()[0], (w1 * math.log(2.0) + w2 * math.log(2.2)) / (w1 + w2))
    assert math.isclose(est.var_mean(0), 1 / (w1 + w2))
    est.add(3, 2.0, 1.0, 0.03, charge=True, at_step=10_000)  # when it was measured changes nothing
    assert math.isclose(est.sd_diff(0, 3), math.sqrt(1 / (w1 + w2) + 0.03 ** 2))


def test_levels_measured_far_apart_in_time_are_compared_less_sharply_when_the_job_may_drift():
    def sd(drift_rel: float, apart_steps: float) -> float:
        est = Estimates(LEVELS, 0, settings(drift_rel=drift_rel, drift_steps=50.0))
        est.add(0, 2.0, 1.0, 0.03, charge=True, at_step=0)
        est.add(1, 2.0, 1.0, 0.03, charge=True, at_step=apart_steps)
        return est.sd_diff(0, 1)

    assert math.isclose(sd(0.0, 5), sd(0.0, 500)) and math.isclose(sd(0.0, 5), math.sqrt(2) * 0.03)
    assert sd(0.03, 5) < sd(0.03, 50) < sd(0.03, 500)


def test_a_level_measured_again_corrects_the_level_measured_between_for_the_drift():
    """The job runs 10% hungrier from step 100 on (its host stalls more, say): a level measured after the change
    reads high by that, not by its own cost. Measured again, the first level tells the tuner how far the job moved,
    and the estimates of both levels come out near equal, as they are."""
    est = Estimates(LEVELS, 0, settings(drift_rel=0.03, drift_steps=50.0))
    for at in (0, 30, 60, 90):
        est.add(0, 2.0, 1.0, 0.01, charge=True, at_step=at)
    est.add(0, 2.2, 1.0, 0.01, charge=True, at_step=110)
    est.add(1, 2.2, 1.0, 0.01, charge=True, at_step=120)  # the same cost as level 0, read 10% high
    est.add(0, 2.2, 1.0, 0.01, charge=True, at_step=130)
    log_j = est.log_energy()
    raw = math.log(2.2) - (4 * math.log(2.0) + 2 * math.log(2.2)) / 6  # the windows' means differ by 6.4%
    assert abs(log_j[1] - log_j[0]) < 0.3 * raw
    assert est.drift.sd_rel > 0.03  # the windows say the job drifts by more than the default's 3%


def test_steady_windows_teach_the_estimates_that_the_job_does_not_drift():
    rng = random.Random(4)
    est = Estimates(LEVELS, 0, settings(drift_rel=0.03, drift_steps=50.0))
    for k in range(40):
        est.add(k % 2, (2.0, 2.1)[k % 2] * math.exp(rng.gauss(0, 0.01)), 1.0, 0.01, charge=True, at_step=20 * k)
    assert est.drift.sd_rel < 0.005
    assert est.sd_diff(0, 1) < 1.2 * math.sqrt(2 / 20) * 0.01  # what 20 independent windows each give, nearly


def test_a_session_tells_the_tuner_when_each_window_was_measured():
    """TuningSession gives the tuner each window's middle in the job's steps, what the drift is reckoned from."""
    seen: list[float] = []
    tuner = OnlineTuner(LEVELS, LEVELS[5], total_steps=400)
    observe = tuner.observe

    def recording(*args, at_step=None, **kwargs):
        seen.append(at_step)
        observe(*args, at_step=at_step, **kwargs)

    tuner.observe = recording  # type: ignore[method-assign]
    session = TuningSession(tuner, steps=100, warmup_steps=1, window_steps=4, total_steps=500)
    energy = 0.0
    for step in range(101, 130):
        energy += 2.0
        session.on_progress(step, energy, 0.1 * step)
    assert seen[:3] == [103.0, 108.0, 113.0]  # warm-up step 101, then steps 102-105 (the middle: 103), ...


def drift_learnt_on(directory, name: str, steps: int = 30, windows: int = 40) -> float:
    """Windows of ``steps`` steps of a recorded H200 run, alternately at two levels of equal cost (each window's own
    uncertainty from its sub-windows' scatter): the drift the estimates weigh afterwards."""
    seq = StepSequence.h200(name, directory)
    est = Estimates(LEVELS, 0, settings(drift_rel=0.03, drift_steps=50.0))
    for w in range(windows):
        e = seq.energy_rel[w * steps:(w + 1) * steps]
        subs = [statistics.fmean(e[j:j + 6]) for j in range(0, steps, 6)]
        noise = statistics.stdev(subs) / math.sqrt(len(subs)) / statistics.fmean(e)
        est.add(w % 2, statistics.fmean(e), 1.0, max(noise, 0.003), charge=False, at_step=w * steps + steps / 2)
    return est.drift.sd_rel


def test_on_real_h200_steps_a_host_bound_job_is_learnt_to_drift_and_a_gpu_bound_one_not():
    """The same windows on real steps: the small and base models, host-bound (the GPU busy 18-38%), drift by a few
    percent; the GPU-bound run (busy 91%) does not (benchmarks/data/h200-meter-gpubound)."""
    for name in ("bert-small-L6H512", "bert-base-L12H768"):
        assert drift_learnt_on(H200_LONG_TRACES, name) > 0.02, name
    assert drift_learnt_on(H200_TRACES.parent / "h200-meter-gpubound", "bert-gpubound-L24H1024") < 0.003
