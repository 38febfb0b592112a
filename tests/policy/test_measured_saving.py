"""governor.policy.measured_saving: a tuned job's measured saving, the tuned side's steps and its own uncertainty."""

from __future__ import annotations

import math
import random

import pytest

from governor.policy.measured_saving import MeasuredSaving
from governor.policy.windows import Measurement

PICK, OTHER = 800_000_000, 900_000_000
BASELINE = Measurement(None, 2.0, 0.5, 100, 101, noise_rel=0.01, duration_s=50.0)


def _points(start: tuple[float, float, float], steps: int, joules: float, step_s: list[float]) -> list:
    """Step-end points from ``start``: ``joules`` a step at a steady power (so a step's energy is its time's share)."""
    n, e, t = start
    power_w = joules / (sum(step_s) / len(step_s))
    out = []
    for k in range(steps):
        n, e, t = n + 1, e + power_w * step_s[k], t + step_s[k]
        out.append((n, e, t))
    return out


def test_the_tuned_side_is_every_step_at_the_pick_once_the_meter_settled():
    s = MeasuredSaving(0.03, 4, meter_update_s=0.1, settle_s=1.0)
    pts = _points((0, 0.0, 0.0), 400, 1.5, [0.5] * 400)
    s.converged_at(PICK, pts[:200])
    s.interrupt()  # a confirmation window elsewhere
    s.window_at_pick(Measurement(OTHER, 9.0, 0.5, 20, 21, noise_rel=0.02, duration_s=10.0))
    s.window_at_pick(Measurement(PICK, 1.5, 0.5, 20, 21, noise_rel=0.02, duration_s=10.0))
    s.converged_at(PICK, pts[200:])
    out = s.result(BASELINE, PICK, [])
    # Each stretch begins 1 s (two steps) after its first point: 200 - 1 - 2 steps in each, and the window's 20.
    assert out["tuned_steps"] == 2 * 197 + 20 and out["tuned_over"] == "steps after convergence"
    assert out["saved_pct"] == pytest.approx(25.0) and out["tuned_j_per_step"] == pytest.approx(1.5)
    assert out["baseline_steps"] == 100 and out["measured_steps"] == 100 + 414


def test_the_tuned_sides_uncertainty_is_its_steps_scatter_over_their_number():
    """Independent steps: the intervals' scatter over sqrt(steps) (and the meter's ends); the blocks of the baseline's
    length (100 steps) say the same of the tuned side, and the baseline's own 1% is raised to what 100 of these steps
    scatter by."""
    rng = random.Random(4)
    for cv, steps in ((0.15, 1000), (0.15, 4000), (0.05, 1000)):
        s = MeasuredSaving(0.03, 4, meter_update_s=0.1)
        times = [rng.gammavariate(1 / cv**2, 0.5 * cv**2) for _ in range(steps + 1)]
        s.converged_at(PICK, [(0, 0.0, 0.0), *_points((0, 0.0, 0.0), steps, 1.5, times)])
        out = s.result(BASELINE, PICK, [])
        expected = math.hypot(cv / math.sqrt(steps), 0.1 / (0.5 * steps * math.sqrt(6)))
        assert out["tuned_rel"] == pytest.approx(expected, rel=0.3), (cv, steps)
        assert out["blocks"] == steps // 100 and out["block_rel"] == pytest.approx(cv / 10, rel=0.4), (cv, steps)
        assert out["baseline_rel"] == max(0.01, out["block_rel"])
        # The saving's s.d.: the ratio times the two sides' in quadrature.
        ratio = out["tuned_j_per_step"] / 2.0
        assert out["saved_pct_err"] == pytest.approx(100 * ratio * math.hypot(out["baseline_rel"], out["tuned_rel"]),
                                                     abs=0.01)


def test_stretches_on_the_meters_updates_count_no_held_ends():
    """Points on the meter's updates (the rails' samples, NVML's counter at its update instants) carry its own energy
    at a stretch's ends: the tuned side states only its steps' scatter there; read off a held counter, an update's
    energy over sqrt 12 at each end as well. A stretch whose ends are of both kinds counts the held one."""
    steps, update_s = 40, 0.5
    pts = [(0, 0.0, 0.0), *_points((0, 0.0, 0.0), steps, 1.5, [0.5] * steps)]
    rel = {}
    for on_updates in ((True, True), (False, False), (False, True)):  # the first points', the rest's
        s = MeasuredSaving(0.03, 4, meter_update_s=update_s)
        s.converged_at(PICK, pts[:2], on_updates=on_updates[0])
        s.converged_at(PICK, pts[2:], on_updates=on_updates[1])
        rel[on_updates] = s.result(BASELINE, PICK, [])["tuned_rel"]
    end2 = (update_s / (0.5 * steps)) ** 2 / 12
    assert rel[(False, False)] ** 2 == pytest.approx(rel[(True, True)] ** 2 + 2 * end2)
    assert rel[(False, True)] ** 2 == pytest.approx(rel[(True, True)] ** 2 + end2)  # the grid found mid-stretch


def test_steps_that_drift_raise_both_sides_uncertainty_to_what_segments_of_the_baselines_length_scatter_by():
    """Steps whose mean wanders (an AR(1) drift of 5% with a memory of 50 steps on top of 10% independent scatter,
    as the H200's do): the intervals see only the 10%, while 100-step segments scatter by far more than 1%. The
    blocks measure that, for the baseline's uncertainty and, over their number, the tuned side's."""
    rng = random.Random(7)
    steps, memory = 6000, 50
    a = math.exp(-1 / memory)
    drift, times = 0.0, []
    for _ in range(steps + 1):
        drift = a * drift + math.sqrt(1 - a * a) * rng.gauss(0, 0.05)
        times.append(0.5 * (1 + drift) * rng.gammavariate(100, 0.01))
    s = MeasuredSaving(0.03, 4, meter_update_s=0.1)
    s.converged_at(PICK, [(0, 0.0, 0.0), *_points((0, 0.0, 0.0), steps, 1.5, times)])
    out = s.result(BASELINE, PICK, [])
    segments = [sum(times[k:k + 100]) / 100 for k in range(1, steps - 99, 100)]
    truth = math.sqrt(sum((x / (sum(segments) / len(segments)) - 1) ** 2 for x in segments) / (len(segments) - 1))
    assert truth > 0.025  # the drift dominates: independent steps would give 1%
    assert out["block_rel"] == pytest.approx(truth, rel=0.1)
    assert out["baseline_rel"] == out["block_rel"]
    assert out["tuned_rel"] == pytest.approx(truth / math.sqrt(steps // 100), rel=0.1)
    assert out["tuned_rel"] > 2 * 0.1 / math.sqrt(steps)


def test_the_marks_stay_bounded_on_a_long_job_and_still_cut_the_baselines_blocks():
    from governor.policy.measured_saving import MAX_MARKS

    s = MeasuredSaving(0.03, 4)
    s.converged_at(PICK, _points((0, 0.0, 0.0), 20_000, 1.5, [0.5] * 20_000))
    assert sum(len(st.marks) for st in s.stretches) <= MAX_MARKS and s.mark_steps >= 8
    out = s.result(BASELINE, PICK, [])
    assert 180 <= out["blocks"] <= 199 and out["block_rel"] == pytest.approx(0.0, abs=1e-9)  # blocks of 100-107


def test_a_stretch_shared_with_another_job_leaves_the_tuner_windows_as_the_tuned_side():
    s = MeasuredSaving(0.03, 4)
    s.converged_at(PICK, _points((0, 0.0, 0.0), 100, 1.5, [0.5] * 100))
    s.shared()
    windows = [Measurement(PICK, 1.6, 0.5, 10, 11, noise_rel=0.02), Measurement(OTHER, 1.8, 0.4, 10, 11)]
    out = s.result(BASELINE, PICK, windows)
    assert out["tuned_over"] == "tuner windows" and out["tuned_steps"] == 10
    assert out["saved_pct"] == pytest.approx(20.0) and out["tuned_rel"] == pytest.approx(0.03)  # the prior's floor


def test_no_tuned_side_no_saving():
    assert MeasuredSaving(0.03, 4).result(BASELINE, PICK, []) is None


def test_the_baselines_parts_fall_due_at_equal_steps_and_a_late_one_spreads_the_rest():
    from governor.policy.measured_saving import BaselineParts

    part = Measurement(None, 2.0, 0.5, 20, 21, noise_rel=0.01, duration_s=10.0)
    parts = BaselineParts(5, 100, 2000)
    parts.first(part, 100)
    assert parts.due_at == [480, 860, 1240, 1620]
    assert not parts.due(479) and parts.due(480)
    parts.add(part, 500)
    # The job searched again from 500 to 1300: the part due at 860 runs at 1300, the next two over what is left.
    assert parts.due(1300) and parts.due_at == [1300, 1300 + 700 / 3, 1300 + 1400 / 3]
    parts.add(part, 1320)
    assert not parts.due(1500) and parts.due(1534)
    parts.skip()  # the GPU was shared: the next one's turn
    assert parts.due_at == [1300 + 1400 / 3] and not parts.due(2000) and parts.due_at == []  # past the job's length
    assert len(parts.measured) == 3 and parts.baseline.measured_steps == 60


def test_the_budget_left_after_the_first_part_sets_how_many_follow():
    from governor.policy.measured_saving import BaselineParts

    parts = BaselineParts(5, 100, 2000)
    parts.first(Measurement(None, 2.0, 0.5, 40, 41, noise_rel=0.01), 0)  # short steps: a part of window_min_s is 40
    assert len(parts.due_at) == 2  # 60 steps left: two more of 40 (rounded), not four of 20
    fixed = BaselineParts(5, None, None)  # fixed-step windows: every part one window, over the assumed 2,000 steps
    fixed.first(Measurement(None, 2.0, 0.5, 4, 5), 5)
    assert len(fixed.due_at) == 4 and fixed.due_at[-1] < 2000


def test_pooled_parts_weigh_by_their_steps_and_their_scatter_shows_in_the_uncertainty():
    from governor.policy.measured_saving import pooled

    calm = [Measurement(None, 2.0, 0.5, 20, 21, noise_rel=0.01, duration_s=10.0) for _ in range(5)]
    one = pooled(calm)
    assert one.joules_per_step == pytest.approx(2.0) and one.measured_steps == 100 and one.duration_s == 50.0
    assert one.noise_rel == pytest.approx(0.01 / math.sqrt(5))
    drifting = [Measurement(None, j, 0.5, 20, 21, noise_rel=0.01) for j in (1.9, 2.0, 2.1, 2.0, 2.0)]
    assert pooled(drifting).noise_rel == pytest.approx(math.sqrt(0.02 / 4) / 2.0 / math.sqrt(5), rel=1e-6)
    assert pooled(calm[:1]) is calm[0]
    with pytest.raises(ValueError):
        pooled([])
    # Weighed by the stretches they stand for: the part standing for three quarters of the job counts three times.
    two = [Measurement(None, j, 0.5, 20, 21, noise_rel=0.01) for j in (1.0, 2.0)]
    assert pooled(two, [250.0, 750.0]).joules_per_step == pytest.approx(1.75)
    with pytest.raises(ValueError):
        pooled(two, [1.0])


def _part(j: float, steps: int = 20) -> Measurement:
    return Measurement(None, j, 0.5, steps, steps + 1, noise_rel=0.005)


def test_parts_that_scatter_beyond_the_target_ask_for_more_while_the_budget_lasts():
    from governor.policy.measured_saving import MAX_PARTS, BaselineParts

    parts = BaselineParts(5, 1000, 20000, target_rel=0.0075)
    parts.first(_part(2.0), 100)
    assert parts.due_at == [4080, 8060, 12040, 16020]
    for steps, j in ((4080, 2.1), (8060, 1.9)):  # 5% either side of the first: the job drifts
        assert parts.due(steps)
        parts.add(_part(j), steps + 20)
    # Three parts scattering by 5% want (5% / 0.75%)^2 = 45 in all; the budget pays 47 more of 20 steps: 42 more,
    # evenly over the steps left.
    assert parts.added == 42 - 2 and len(parts.due_at) == 42 <= MAX_PARTS - 3
    assert parts.due_at[0] > 8080 and parts.due_at[-1] < 20000
    gaps = [b - a for a, b in zip(parts.due_at, parts.due_at[1:], strict=False)]
    assert max(gaps) - min(gaps) < 1e-6
    # Each weighs by the stretch of the job it stands for: the first from the job's start, the last to its end.
    assert parts.at_steps == [90, 4090, 8070]
    assert parts.spans == pytest.approx([2090, 3990, 13920])
    assert parts.baseline.joules_per_step == pytest.approx((2090 * 2.0 + 3990 * 2.1 + 13920 * 1.9) / 20000)
    # The budget bounds them: 200 steps for the baseline, 60 spent, 7 more parts of 20.
    tight = BaselineParts(5, 200, 20000, target_rel=0.0075)
    tight.first(_part(2.0), 100)
    for steps, j in ((4080, 2.1), (8060, 1.9)):
        tight.due(steps)
        tight.add(_part(j), steps + 20)
    assert len(tight.due_at) == 7


def test_parts_that_agree_or_a_spent_budget_ask_for_no_more():
    from governor.policy.measured_saving import BaselineParts

    calm = BaselineParts(5, 1000, 20000, target_rel=0.0075)
    calm.first(_part(2.0), 100)
    for steps in (4080, 8060):
        calm.due(steps)
        calm.add(_part(2.0), steps + 20)
    assert calm.added == 0 and len(calm.due_at) == 2
    spent = BaselineParts(5, 100, 2000, target_rel=0.0075)  # 2,000 steps: 100 for the baseline, 5 parts of 20
    spent.first(_part(2.0), 100)
    for steps, j in ((480, 2.1), (860, 1.9)):
        spent.due(steps)
        spent.add(_part(j), steps + 20)
    assert spent.added == 0 and len(spent.due_at) == 2  # the 40 steps left pay the two planned, no more
    untargeted = BaselineParts(5, 1000, 20000)  # no target: the plan stands
    untargeted.first(_part(2.0), 100)
    for steps, j in ((4080, 2.1), (8060, 1.9)):
        untargeted.due(steps)
        untargeted.add(_part(j), steps + 20)
    assert untargeted.added == 0


def test_a_new_length_plans_the_parts_left_over_the_steps_left_within_its_budget():
    """replan: the parts measured stay, and those of the new length's plan beyond them fall due at equal steps over
    the steps left, as many as what its budget has left pays for (baseline_max_share holds)."""
    from governor.policy.measured_saving import BaselineParts, pooled

    parts = BaselineParts(5, 100, 2000, target_rel=0.0075)
    parts.first(_part(2.0), 100)
    assert parts.due(480)
    parts.add(_part(2.2), 500)
    measured = list(parts.measured)
    # Extended to 20,000 steps: 50 parts and 1,000 steps; 40 spent, 48 more of 20 over the 19,500 steps left.
    parts.replan(BaselineParts(50, 1000, 20000, target_rel=0.0075), 500)
    assert parts.measured == measured and parts.due_at == [500 + 19500 * k / 49 for k in range(1, 49)]
    # Measured over 500 steps of a job of 20,000, the two weigh by the stretches they stand for, not by their steps.
    assert parts.due(parts.due_at[0])
    parts.add(_part(2.0), parts.due_at[0] + 20)
    assert parts.baseline.joules_per_step == pytest.approx(pooled(parts.measured, parts.spans).joules_per_step)
    assert parts.baseline.joules_per_step < pooled(parts.measured).joules_per_step
    # Cut short to 600 steps: its budget, 30 steps, is spent.
    parts.replan(BaselineParts(5, 30, 600), 550)
    assert parts.due_at == [] and len(parts.measured) == 3
    # A part being measured stays due and counts as measured: 4,000 steps, 10 parts and 200 steps, 2 of them
    # measured or measuring, 8 more (160 steps left).
    open_part = BaselineParts(5, 100, 2000)
    open_part.first(_part(2.0), 100)
    assert open_part.due(480)
    open_part.replan(BaselineParts(10, 200, 4000), 490, measuring=True)
    assert open_part.due_at[0] == 480 and len(open_part.due_at) == 1 + 8
    open_part.add(_part(2.0), 500)
    assert open_part.due_at == [490 + 3510 * k / 9 for k in range(1, 9)]


def test_a_first_part_a_slow_warm_up_made_dear_is_left_out_of_the_baseline():
    """The first part opens once WarmUp's blocks stop speeding up; a warm-up that fades slower than they can tell
    (a real H100's cold start: the first part 24-31% dear) would put the whole baseline off. Against three later
    parts or more, a first part more than FIRST_PART_STRAY_Z s.d. away is left out; one within the parts' scatter
    stays, and so does any first part with fewer than three to compare with."""
    from governor.policy.measured_saving import BaselineParts, pooled

    def parts(first: float, later: list[float]) -> BaselineParts:
        b = BaselineParts(1 + len(later), None, None)
        b.first(Measurement(None, first, 0.5, 20, 21, noise_rel=0.01), 20)
        for k, j in enumerate(later):
            b.add(Measurement(None, j, 0.5, 20, 21, noise_rel=0.01), 500 * (k + 1))
        return b

    warm = parts(2.6, [2.0, 2.04, 1.97, 2.01])
    assert warm.first_strays
    assert warm.baseline.joules_per_step == pytest.approx(pooled(warm.measured[1:]).joules_per_step)
    sound = parts(2.08, [2.0, 2.04, 1.97, 2.01])  # 4% off: within what parts of 1% noise and 3% scatter say
    assert not sound.first_strays
    assert sound.baseline.joules_per_step == pytest.approx(pooled(sound.measured).joules_per_step)
    assert not parts(2.6, [2.0, 2.04]).first_strays  # two to compare with: not enough to tell
    fixed = BaselineParts(5, None, None)  # fixed-step windows know no uncertainty of their own: nothing is left out
    fixed.measured = [Measurement(None, j, 0.5, 4, 5) for j in (2.6, 2.0, 2.04, 1.97, 2.01)]
    assert not fixed.first_strays


def test_without_its_stray_first_part_a_drifting_baseline_weighs_the_second_from_the_jobs_start():
    """Parts added for a drift weigh by the stretch each stands for; the first part left out, the second stands for the
    job from its start, not from halfway to the first (which leant the baseline towards the job's end), and the
    saving counts the parts pooled."""
    from governor.policy.measured_saving import BaselineParts, pooled

    parts = BaselineParts(5, 1000, 20000, target_rel=0.0075)
    parts.first(_part(3.0), 100)  # 50% dear: a warm-up the gate did not see
    for steps, j in ((4080, 2.1), (8060, 1.9)):
        parts.due(steps)
        parts.add(_part(j), steps + 20)
    assert parts.added > 0
    parts.add(_part(2.0), parts.due_at[0] + 20)
    assert parts.first_strays
    at = parts.at_steps[1:]
    spans = [(at[0] + at[1]) / 2, (at[2] - at[0]) / 2, 20000 - (at[1] + at[2]) / 2]
    assert parts.baseline.joules_per_step == pytest.approx(pooled(parts.measured[1:], spans).joules_per_step)
    assert parts.pooled_parts == 3


def test_a_sound_first_part_is_rarely_left_out_where_the_parts_drift():
    """The later parts' scatter, from a few of them, may come out small by chance: how often a first part drawn like
    the others is left out (FIRST_PART_STRAY_Z's comment states these rates)."""
    import random

    from governor.policy.measured_saving import BaselineParts

    rng = random.Random(1)
    for later, drift, at_most in ((3, 0.0, 0.0), (4, 0.02, 0.002), (3, 0.03, 0.008)):
        left_out = 0
        for _ in range(20000):
            b = BaselineParts(1 + later, None, None)
            b.measured = [Measurement(None, (1 + rng.gauss(0, drift)) * (1 + rng.gauss(0, 0.01)), 0.1, 20, 21,
                                      noise_rel=0.01) for _ in range(1 + later)]
            left_out += b.first_strays
        assert left_out / 20000 <= at_most, (later, drift, left_out)


def test_confirmation_windows_at_the_pick_are_kept_within_a_bound_and_the_saving_is_the_same():
    """A job whose curve a member keeps moving (drift, a new search, new confirmations) added a window to at_pick at
    each confirmation for as long as it ran. Past WINDOWS_KEPT they are pooled by level: the saving and its
    uncertainty are what every window kept one by one gives."""
    from governor.policy.measured_saving import WINDOWS_KEPT, KeptWindows

    bounded, whole = MeasuredSaving(0.03, 4), MeasuredSaving(0.03, 4)
    whole.at_pick = KeptWindows(lambda m: m, lambda a, b: a, kept=10**9)
    for s in (bounded, whole):  # a stretch at the pick, then the confirmations
        s.converged_at(PICK, _points((0, 0.0, 0.0), 200, 1.5, [0.5] * 200))
        s.interrupt()
    for k in range(3000):
        m = Measurement(PICK if k % 3 else OTHER, 1.5 + (k % 7) / 100, 0.5, 20 + k % 5, 21 + k % 5,
                        noise_rel=0.02 + (k % 4) / 100, duration_s=10.0)
        bounded.window_at_pick(m)
        whole.window_at_pick(m)
    assert len(bounded.at_pick) <= WINDOWS_KEPT + 2 and len(whole.at_pick) == 3000
    got, want = bounded.result(BASELINE, PICK, []), whole.result(BASELINE, PICK, [])
    assert got is not None and want is not None
    for key in ("saved_rel", "tuned_rel", "tuned_steps", "tuned_j_per_step"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key
