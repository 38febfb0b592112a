"""benchmarks/group_tuner.py: the real GroupCoordinator in one simulated rank, read through the simulated NVML
counter at step ends. A handful of runs, not the benchmark's figures (docs/benchmarks.md, "group-tuner")."""

from __future__ import annotations

import pytest

from benchmarks.group_tuner import one_rank, run_group
from benchmarks.tuner_curves import real_curves

pytest.importorskip("torch")  # the coordinator's collectives are torch tensors


def test_a_group_sized_by_the_rule_converges_near_the_minimum_on_windows_of_seconds():
    curve = real_curves()[3]  # 27-270 ms steps: a fixed 8-step window is a few updates of the counter
    for seed in range(3):
        sized = run_group(curve, "top", seed, 2000, sized=True)
        assert sized["converged"] and sized["level"] < 0.06, sized
        assert sized["window_s"] and sized["window_s"][0] >= 1.0, sized  # at least the rule's shortest


def test_a_group_searching_from_the_bottom_closes_windows_early_where_they_read_clearly_worse():
    """The reads inside a window are collectives while the search runs: a window at a level far above the incumbent
    closes at one of them (WindowRule.differs at explore_z), as a single job's window does."""
    curve = real_curves()[3]
    runs = [run_group(curve, "bottom", seed, 2000, sized=True) for seed in range(3)]
    assert all(r["converged"] and r["level"] < 0.06 for r in runs), runs
    assert sum(r["closed_early"] for r in runs) > 0, runs
    fixed = run_group(curve, "bottom", 0, 2000, sized=False)
    assert fixed["closed_early"] == 0  # no rule: no reads inside, no early close


@pytest.mark.parametrize("registers_at", [8, 30])
def test_a_rank_that_registers_after_its_first_steps_sizes_its_windows_by_the_rule(registers_at):
    """A job that measures its seq_len from its first batches registers at its 8th step (measure_batches; later with
    a larger one), after the coordination began at its first: the start waits until every rank is registered (it
    was stopped for good when the first edge came first), and the daemon's rule, read from the reply once it is
    there, sizes the windows (they stayed fixed 8-step windows of half a second)."""
    from benchmarks.bench_groups import SimulatedCollectives
    from governor.client.group import GroupCoordinator

    curve = real_curves()[3]
    rank, _ = one_rank(curve, curve.levels_hz[-1], 2000, sized=True)
    registration, rank.registration, rank.job_id = rank.registration, None, None
    coordinator = GroupCoordinator(rank, SimulatedCollectives(1))  # built at the first step, before the reply
    for n, _joules, _seconds in exact_steps(curve, rank, coordinator):
        if n == registers_at:
            rank.registration, rank.job_id = registration, 1
    assert coordinator.rule is not None and coordinator.tuner.converged, coordinator.describe()
    # sized by the rule (a window behind: about its shortest, 1 s), not the fixed 8 steps (0.56 s)
    assert coordinator.last_window["seconds"] >= 0.9 * coordinator.rule.shortest_s, coordinator.last_window
    assert "stopped" not in coordinator.status


def test_a_group_with_fixed_windows_still_runs_as_before():
    """An older daemon (no window rule in its reply): every window 8 steps, the tuner converges on something."""
    run = run_group(real_curves()[3], "mid-table", 0, 2000, sized=False)
    assert run["converged"] and run["window_s"] and run["window_s"][0] < 1.0, run


def exact_steps(curve, rank, coordinator, steps: int = 2000):
    """Rank 0's steps on ``curve``, its daemon's reads exact: after each step's coordination, yields the step count
    and that step's J and s (a caller may add an evaluation's energy and time to ``rank.read`` meanwhile)."""
    for n in range(1, steps + 1):
        joules, seconds = curve.expected(rank.level_hz)
        rank.read = (rank.read[0] + joules, rank.read[1] + seconds)
        coordinator.step(n)
        yield n, joules, seconds


def test_long_steps_make_the_stretch_before_the_first_edge_the_start_window():
    """Steps of 4.6 s at the bottom of the table: GROUP_WINDOW_STEPS of them would be 37 s at a level 3.5 times the
    least energy. The stretch from the first step is measured as a window, and at a read inside it (a collective on
    every rank) rank 0 ends it once the rule would have closed it: the tuner takes it as the start's window and moves
    on after a few steps (here 2-3: the reads are exact, the steps taken to scatter as the H200's until they show
    otherwise, UNKNOWN_STEPS). Steps of 70 ms at the top: the stretch
    (0.56 s) only times them, and the first window the tuner takes is the rule's shortest after it."""
    from governor.client.group import GROUP_WINDOW_STEPS
    from governor.policy.windows import WindowRule

    rule = WindowRule()
    for curve, start, moved_by in ((real_curves()[40], 0, 1 + rule.min_steps), (real_curves()[3], -1, None)):
        rank, coordinator = one_rank(curve, curve.levels_hz[start], 2000, sized=True)
        first_move = None
        for n, _joules, _seconds in exact_steps(curve, rank, coordinator, steps=200):
            if first_move is None and rank.level_hz != curve.levels_hz[start]:
                first_move = (n, coordinator.windows, coordinator.last_window)
                assert coordinator.status.startswith("searching"), coordinator.status  # not "starting" any more
        assert first_move is not None
        n, windows, window = first_move
        assert windows == 1 and window["level_hz"] == curve.levels_hz[start]
        if moved_by is not None:  # the start's window: the stretch, ended where the rule would close it
            assert n == 1 + window["steps"] <= moved_by + 1, first_move
            assert window["seconds"] >= rule.shortest_s, first_move
            assert window["noise_rel"] <= rule.target_rel or window["seconds"] >= rule.max_s, first_move
            assert coordinator.closed_early >= 1
        else:  # the stretch timed the steps; the start's window came after the first edge and a warm-up step
            assert n > 1 + GROUP_WINDOW_STEPS + 1 and window["seconds"] >= rule.shortest_s, first_move


def recording(observed: list):
    """A tuner factory for GroupCoordinator._new_tuner whose tuners add each window they observe (level, J/step,
    s/step) to ``observed``."""
    from governor.policy.tuner import OnlineTuner

    def make(*args, **kwargs):
        tuner = OnlineTuner(*args, **kwargs)
        plain = tuner.observe
        tuner.observe = lambda hz, j, s, **kw: (observed.append((hz, j, s)), plain(hz, j, s, **kw))[1]
        return tuner

    return make


def test_a_data_phase_around_every_batch_costs_no_reads_and_stays_in_the_windows():
    """A loop that reports `data` around each batch's loading (Job.phase("data"), then "train"): each stretch, a few
    ms, is training, as the daemon's windows count it (SHORT_PHASE_S). Once its window has read its training inside
    (the energy at a long stretch's start can then be estimated) it makes no job_energy call, before that one (the
    start of a stretch that might be long); two a step before, blocking the training on its daemon at every step.
    The windows measure the steps with their data loading (it was cut out of them)."""
    curve = real_curves()[3]
    observed: list[tuple[int, float, float]] = []
    rank, coordinator = one_rank(curve, curve.levels_hz[-1], 2000, sized=True)
    coordinator._new_tuner = recording(observed)
    free = paid = 0
    for _n, joules, seconds in exact_steps(curve, rank, coordinator):
        if coordinator.done:
            break
        before, estimable = dict(rank.calls), coordinator._estimable()
        coordinator.left_training()  # the next batch's loading: 10% of a step's time at a fifth of its power
        rank.read = (rank.read[0] + 0.02 * joules, rank.read[1] + 0.1 * seconds)
        coordinator.back_to_training()
        reads = rank.calls.get("job_energy", 0) - before.get("job_energy", 0)
        assert reads == (0 if estimable or coordinator._mark is None else 1), (estimable, rank.calls, before)
        free += estimable
        paid += reads
    assert free > 100 and free > 3 * paid and coordinator.tuner.converged, (free, paid, coordinator.describe())
    for hz, joules_per_step, seconds_per_step in observed:
        joules, seconds = curve.expected(hz)
        assert joules_per_step == pytest.approx(1.02 * joules, rel=1e-9), (hz, joules_per_step, joules)
        assert seconds_per_step == pytest.approx(1.1 * seconds, rel=1e-9)


@pytest.mark.parametrize("where", ["after a read inside", "before any read inside"])
def test_a_window_that_runs_across_an_evaluation_has_it_cut_out(where):
    """Rank 0's job evaluates for 5 s (its GPU busy, no steps) in the middle of a window, its callback saying so
    (Job.phase("eval"), then "train": left_training, back_to_training). The window pauses: its energy is read as
    training comes back (one call), the energy as the evaluation began taken from the window's reads so far (its mean
    power, carried on from its last read), or, before the window's first read inside, read as it began (a second
    call), and what ran between is cut out, so the tuner gets the steps' J/step and the window is not lost. Untold,
    the evaluation inflates the window."""
    curve = real_curves()[3]
    observed: list[tuple[int, float, float]] = []
    for tell in (True, False):
        observed.clear()
        rank, coordinator = one_rank(curve, curve.levels_hz[-1], 2000, sized=True)
        coordinator._new_tuner = recording(observed)
        evaluated = False
        for n, joules, seconds in exact_steps(curve, rank, coordinator):
            inside = len(coordinator._reads) >= 2 if where == "after a read inside" else len(coordinator._reads) == 1
            if (not evaluated and coordinator.windows >= 1 and coordinator._mark is not None and inside
                    and coordinator._reads[-1][0] < n and coordinator._edge - n > 5):
                # inside a window of the search, steps after its last read: an evaluation of 5 s at the step's power
                evaluated = True
                reads = rank.calls["job_energy"]
                if tell:
                    coordinator.left_training()
                rank.read = (rank.read[0] + 5.0 * joules / seconds, rank.read[1] + 5.0)
                if tell:
                    coordinator.back_to_training()
                    cut = coordinator._cut
                    # the read as training came back; as it left, only where the window had nothing to estimate by
                    assert rank.calls["job_energy"] == reads + (1 if where == "after a read inside" else 2)
        spoiled = [j / curve.expected(hz)[0] - 1 for hz, j, _s in observed if j > 1.2 * curve.expected(hz)[0]]
        assert evaluated
        if tell:
            assert observed and not spoiled, observed
            assert coordinator.tuner.converged
            # the evaluation's seconds and energy, cut out of its window (the steps before it estimated exactly:
            # the simulated steps draw a constant power)
            assert cut == pytest.approx((5.0 * joules / seconds, 5.0), rel=1e-9), cut
            assert all(j == pytest.approx(curve.expected(hz)[0], rel=1e-9) for hz, j, _s in observed), observed
        else:
            assert spoiled, observed  # the check can fail: untold, the evaluation lands in a window


@pytest.mark.parametrize("why", ["the read fails", "the read as it left failed"])
def test_a_long_pause_that_cannot_be_cut_out_spoils_the_window_and_rank_0_measures_it_again(why):
    """Where the energy cannot be read as the job comes back to training, or, in a window that had read nothing of
    its training yet to tell the energy at the pause's start by (the pause came before its first read inside), the
    read as the job left training failed, the pause cannot be cut out: the rank sends measured -1 and rank 0 repeats
    the window at the same level rather than observe it or stop."""
    curve = real_curves()[3]
    rank, coordinator = one_rank(curve, curve.levels_hz[-1], 2000, sized=True)
    spoilt_at = None
    windows, level = coordinator.windows, coordinator.level_hz
    for n, joules, seconds in exact_steps(curve, rank, coordinator):
        if spoilt_at is not None and coordinator.windows == windows and coordinator._mark is None and not spoilt_at[1]:
            spoilt_at = (spoilt_at[0], (level, coordinator.level_hz))  # the spoilt window closed: nothing observed
        first_read = coordinator._mark is not None and len(coordinator._reads) == 1
        if spoilt_at is None and coordinator.windows >= 1 and coordinator._mark is not None and (
                first_read if why == "the read as it left failed" else len(coordinator._reads) >= 2):
            real = coordinator._energy_j
            if why == "the read as it left failed":
                coordinator._energy_j = lambda: None  # the daemon does not answer this once
            coordinator.left_training()
            coordinator._energy_j = real
            rank.read = (rank.read[0] + 5.0 * joules / seconds, rank.read[1] + 5.0)
            if why == "the read fails":
                coordinator._energy_j = lambda: None
            coordinator.back_to_training()
            coordinator._energy_j = real
            assert coordinator._left
            spoilt_at = (n, None)
        windows, level = coordinator.windows, coordinator.level_hz
    assert spoilt_at is not None and spoilt_at[1] is not None, spoilt_at
    before, after = spoilt_at[1]
    assert before == after  # measured again at the same level
    assert coordinator.tuner.converged and "stopped" not in coordinator.status
