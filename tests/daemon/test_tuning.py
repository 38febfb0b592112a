"""governor.daemon.tuning.JobTuner's states, as progress reports move it, on a Controller over a GPU with an
energy counter."""

import math
import time

import pytest

from governor.backends.base import Limits
from governor.config import TunerConfig
from governor.daemon.controller import Controller
from governor.daemon.settings import PinSettings
from governor.daemon.tuning import TunerAttach, TunerState
from governor.features import Features
from governor.policy import Policy, PolicyName
from governor.store.state import StateFile
from tests.support.fakegpu import LimitsGpu

LEVELS = (345_000_000, 900_000_000, 1_500_000_000, 1_980_000_000)
BERT = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


class _CountingGpu(LimitsGpu):
    """A GPU whose energy counter gains 10 J at each read."""

    backend = "nvml"
    levels_hz = LEVELS

    def __init__(self, has_energy_counter: bool = True):
        self.has_energy_counter = has_energy_counter
        self.limits = Limits(LEVELS[0], LEVELS[-1])
        self.counter_j = 0.0

    def describe(self) -> dict:
        return {"backend": self.backend, "name": "NVIDIA H200"}

    def energy_j(self) -> float:
        self.counter_j += 10.0
        return self.counter_j



def _controller(tmp_path, gpu: _CountingGpu, baseline_window: bool = False, follow_up: bool = True,
                warmup_max_s: float = 0.0) -> Controller:
    # The counter is exact at every read (no update interval to settle over, 4-step windows exact), and no time
    # passes between reports (so no warm-up is waited for, unless a test times its steps).
    attach = TunerAttach()
    tuner = TunerConfig(baseline_window=baseline_window, follow_up=follow_up, settle_updates=0, window_rule="steps",
                        baseline_warmup_max_s=warmup_max_s)
    settings = PinSettings(Policy(PolicyName.FFG, LEVELS[0], None), tuner=tuner)
    return Controller([gpu], settings, StateFile(tmp_path / "state"), "boot-1", attach_tuner=attach,
                      plan_tune=attach.plan)


def _tuned_job(pins: Controller, pid: int):
    job = pins.admit(pid=pid, start_ticks=pid * 10, uid=1000, name=None, gpu_id="0", features=BERT,
                     policy=PolicyName.TUNE)
    pins.decide(job)
    return job


def _report(pins: Controller, job, steps: int) -> TunerState:
    job.steps = steps
    job.tuner.progress(pins, job)
    return job.tuner.state


def test_a_tuned_job_waits_searches_pauses_while_shared_and_searches_again(tmp_path):
    pins = _controller(tmp_path, _CountingGpu())
    job = _tuned_job(pins, 100)
    assert job.tuner.state is TunerState.WAITING
    assert _report(pins, job, 1) is TunerState.SEARCHING
    assert job.tuner.status == "measuring"
    other = _tuned_job(pins, 200)
    assert _report(pins, job, 2) is TunerState.PAUSED
    assert job.tuner.session is None and job.tuner.status == "paused: another job shares the GPU"
    pins.end(other.job_id, "unregistered")
    assert _report(pins, job, 3) is TunerState.SEARCHING
    assert job.tuner.session is not None and job.tuner.status == "measuring"


def test_the_baseline_window_comes_first_then_the_search_from_the_start_pin(tmp_path):
    pins = _controller(tmp_path, _CountingGpu(), baseline_window=True)
    job = _tuned_job(pins, 100)
    start_hz = job.freq_hz
    assert job.tuner.state is TunerState.BASELINE and start_hz is not None
    assert _report(pins, job, 1) is TunerState.BASELINE
    assert job.freq_hz is None and job.tuner.status == "measuring the baseline window at the default governor"
    steps = 1
    while job.tuner.state is TunerState.BASELINE and steps < 50:  # warm-up, then one window of window_steps
        steps += 1
        _report(pins, job, steps)
    assert job.tuner.state is TunerState.WAITING and job.tuner.baseline_status == "measured"
    assert job.freq_hz == start_hz and job.tuner.status == "waiting for progress reports"
    assert _report(pins, job, steps + 1) is TunerState.SEARCHING


def _baseline_opens_at(tmp_path, step_s: list[float], warmup_max_s: float = 120.0) -> tuple[int, list[str]]:
    """The job step at whose report the baseline window opened (the job unpinned) for steps that take ``step_s``
    (their ends sent with the reports), and the tuner's statuses before."""
    pins = _controller(tmp_path, _CountingGpu(), baseline_window=True, warmup_max_s=warmup_max_s)
    job = _tuned_job(pins, 100)
    start_hz, statuses = job.freq_hz, []
    end_s = time.monotonic() - sum(step_s)  # the steps' ends, all in the past
    for steps, seconds in enumerate(step_s, start=1):
        end_s += seconds
        job.step_end_s = end_s
        _report(pins, job, steps)
        if job.freq_hz is None:
            return steps, statuses
        assert job.freq_hz == start_hz  # waiting at the start pin
        statuses.append(job.tuner.status)
    return 0, statuses


def test_the_baseline_waits_for_the_jobs_slow_first_steps_to_end(tmp_path):
    """A newcomer's short tuned job "saved" 40% with its power flat: its first steps ran at up to 0.9 s, the rest at
    0.22 s, and the baseline was measured over the slow ones. Here they fade: 0.53 s, 0.44 s, ... 0.22 s."""
    step_s = [0.22 * (1 + 2 * 0.7**k) for k in range(1, 120)]
    opened, statuses = _baseline_opens_at(tmp_path, step_s)
    assert step_s[opened - 1] < 1.02 * 0.22, opened  # the steps after it within 2% of the job's own
    assert set(statuses) == {"waiting for the job's steps to stop speeding up (its warm-up) before the baseline"}
    steady, _ = _baseline_opens_at(tmp_path, [0.22] * 100)
    assert steady == 2 * 5 + 1  # no warm-up: two blocks of 5 steps, 0.5 s at least each, after the first report
    slowing, _ = _baseline_opens_at(tmp_path, [0.2] * 5 + [0.3] * 100)
    assert slowing == 2 * 5 + 1  # a job that slows down is not warming up
    forever, _ = _baseline_opens_at(tmp_path, [1.0 / k for k in range(1, 200)], warmup_max_s=2.0)
    assert forever and sum(1.0 / k for k in range(2, forever + 1)) >= 2.0  # the wait is bounded


def test_without_an_energy_source_the_tuner_is_stopped_and_reports_change_nothing(tmp_path):
    pins = _controller(tmp_path, _CountingGpu(has_energy_counter=False))
    job = _tuned_job(pins, 100)
    assert job.tuner.state is TunerState.STOPPED
    assert _report(pins, job, 1) is TunerState.STOPPED
    assert job.tuner.session is None
    assert job.tuner.status == "no energy source (no rails, no GPU counter): keeping the start"


def test_a_search_converges_and_stays_pinned_at_its_choice(tmp_path):
    pins = _controller(tmp_path, _CountingGpu(), follow_up=False)
    job = _tuned_job(pins, 100)
    steps = 0
    while job.tuner.state is not TunerState.CONVERGED and steps < 2000:
        steps += 1
        assert _report(pins, job, steps) in (TunerState.SEARCHING, TunerState.CONVERGED)
    assert job.tuner.state is TunerState.CONVERGED and job.tuner.status == "converged"
    assert job.freq_hz == job.tuner.tuner.best_hz
    assert _report(pins, job, steps + 1) is TunerState.CONVERGED
    assert job.freq_hz == job.tuner.tuner.best_hz


def test_the_baselines_later_parts_run_unpinned_while_converged_spread_over_the_job(tmp_path):
    """tuner.baseline_parts (5): after the first part at the start, four more, each unpinned for a window at the
    default governor once the job runs converged, due at equal steps over its 1,000; between them the job is back at
    its pick, and the saving pools the five."""
    from governor.daemon.tuning import BASELINE_PART_REASON

    pins = _controller(tmp_path, _CountingGpu(), baseline_window=True, follow_up=False)
    job = _tuned_job(pins, 100)
    job.total_steps = 1000
    steps = 0
    while job.tuner.baseline_parts is None and steps < 50:
        steps += 1
        _report(pins, job, steps)
    parts = job.tuner.baseline_parts
    assert parts is not None and len(parts.measured) == 1
    due = [steps + (1000 - steps) * k / 5 for k in range(1, 5)]
    assert parts.due_at == due
    while job.tuner.state is not TunerState.CONVERGED and steps < 1000:
        steps += 1
        _report(pins, job, steps)
    pick, unpinned = job.freq_hz, []
    assert pick is not None and steps < parts.due_at[0]
    while steps < 1000:
        steps += 1
        assert _report(pins, job, steps) is TunerState.CONVERGED
        if job.freq_hz is None:
            assert job.decision.reason == BASELINE_PART_REASON and job.tuner.describe()["baseline"]["measuring_part"]
            unpinned.append(steps)
        else:
            assert job.freq_hz == pick
    # Four stretches unpinned (warm-up and one window each), each from the first report at or after its due step.
    starts = [a for a in unpinned if a - 1 not in unpinned]
    assert starts == [math.ceil(d) for d in due]
    assert all(len([a for a in unpinned if a >= start]) >= 2 for start in starts)
    assert len(parts.measured) == 5 and not parts.due_at
    state = job.tuner.describe()["baseline"]
    assert state["parts"] == 5 and state["parts_planned"] == 5 and not state["measuring_part"]
    saving = job.tuner.saving()
    assert saving["baseline_parts"] == 5
    assert saving["baseline_steps"] == sum(m.measured_steps for m in parts.measured)


def _in_a_baseline_part(tmp_path):
    """A tuned job of 400 steps run until converged, then until its first later baseline part runs unpinned: the
    controller, the job, its steps so far, its pick and the step the part was due at."""
    pins = _controller(tmp_path, _CountingGpu(), baseline_window=True, follow_up=False)
    job = _tuned_job(pins, 100)
    job.total_steps = 400
    steps = 0
    while job.tuner.state is not TunerState.CONVERGED and steps < 400:
        steps += 1
        _report(pins, job, steps)
    pick, due = job.freq_hz, job.tuner.baseline_parts.due_at[0]
    while job.freq_hz is not None and steps < 400:
        steps += 1
        _report(pins, job, steps)
    assert job.freq_hz is None and steps >= due and job.tuner.describe()["baseline"]["measuring_part"]
    return pins, job, steps, pick, due


def test_a_baseline_part_is_dropped_when_another_job_shares_the_gpu(tmp_path):
    pins, job, steps, _, due = _in_a_baseline_part(tmp_path)
    parts = job.tuner.baseline_parts
    other = _tuned_job(pins, 200)
    _report(pins, job, steps + 1)
    assert len(parts.measured) == 1 and parts.due_at and parts.due_at[0] > due  # dropped: the next one's turn
    assert job.tuner._part_window is None
    pins.end(other.job_id, "unregistered")


def test_a_job_that_ends_in_a_baseline_part_is_summed_up_at_its_pick(tmp_path):
    _, job, _, pick, _ = _in_a_baseline_part(tmp_path)
    saving = job.tuner.finish(job)
    assert job.decision.freq_hz == pick and job.decision.reason.startswith("tune: converged on")
    assert saving is not None and saving["freq_hz"] == pick


def _tell_length(pins: Controller, job, total_steps: int) -> None:
    """A progress report that tells the job's length (the RPC layer's path: the count stays, the total changes)."""
    job.total_steps = total_steps
    pins.progress(job, None, total_steps_changed=True)


def _converged_at(pins: Controller, job, until: int) -> int:
    steps = job.steps
    while job.tuner.state is not TunerState.CONVERGED and steps < until:
        steps += 1
        _report(pins, job, steps)
    assert job.tuner.state is TunerState.CONVERGED
    return steps


@pytest.mark.parametrize("planned_for, told", [(200, 2000), (2000, 400)])
def test_a_new_length_plans_the_baselines_parts_not_measured_yet_over_the_steps_left(tmp_path, planned_for, told):
    """The parts were planned over the length known when the first closed: one the client then makes longer (a run
    extended or resumed) had them crowded into its first 200 steps, one it makes shorter had them all past its end.
    Told at step 150, the parts not measured yet fall due at equal steps from there to the new end; those measured
    stay, and by the end the baseline has its five parts, spread over the job's real length."""
    pins = _controller(tmp_path, _CountingGpu(), baseline_window=True, follow_up=False)
    job = _tuned_job(pins, 100)
    job.total_steps = planned_for
    steps = _converged_at(pins, job, 150)
    while steps < 150:
        steps += 1
        _report(pins, job, steps)
    parts = job.tuner.baseline_parts
    measured = list(parts.measured)
    assert job.freq_hz is not None and not job.tuner.describe()["baseline"]["measuring_part"]
    _tell_length(pins, job, told)
    left = 5 - len(measured)
    assert parts.measured == measured and parts.due_at == [150 + (told - 150) * k / (left + 1)
                                                           for k in range(1, left + 1)]
    while steps < told:
        steps += 1
        _report(pins, job, steps)
    assert parts.measured[:len(measured)] == measured and len(parts.measured) == 5 and not parts.due_at
    assert parts.at_steps[-1] > 150 + (told - 150) * left / (left + 1) - 1  # the last one near the new end
    assert job.tuner.saving()["baseline_parts"] == 5


def test_a_new_length_while_a_baseline_part_is_measured_lets_it_close_and_plans_the_rest(tmp_path):
    """The part being measured goes on and counts as measured; the plan for the new length follows it: 4,000 steps
    plan ten parts (five for each 2,000), eight after those two."""
    pins, job, steps, pick, _ = _in_a_baseline_part(tmp_path)
    parts = job.tuner.baseline_parts
    assert len(parts.measured) == 1
    _tell_length(pins, job, 4000)
    assert job.freq_hz is None and job.tuner.describe()["baseline"]["measuring_part"]
    assert parts.due_at[1:] == [steps + (4000 - steps) * k / 9 for k in range(1, 9)]
    while job.freq_hz is None and steps < 400:
        steps += 1
        _report(pins, job, steps)
    assert job.freq_hz == pick and len(parts.measured) == 2
    assert len(parts.due_at) == 8 and parts.due_at[0] > 400

class _UnpinFailsGpu(_CountingGpu):
    """A GPU whose restore (the unpin for the baseline window) fails."""

    def restore(self, limits: Limits) -> None:
        from governor.errors import BackendError

        raise BackendError("restore refused")


def test_a_failed_unpin_for_the_baseline_stops_tuning_without_an_error(tmp_path):
    """The unpin for the baseline window failed: tuning stops, with the reason, and the report that asked for it
    must not then read the cleared meter (it raised AttributeError)."""
    pins = _controller(tmp_path, _UnpinFailsGpu(), baseline_window=True)
    job = _tuned_job(pins, 100)
    assert _report(pins, job, 1) is TunerState.STOPPED
    assert job.tuner.status.startswith("stopped: ") and "restore refused" in job.tuner.status
    assert _report(pins, job, 2) is TunerState.STOPPED


def test_with_follow_up_a_tie_is_confirmed_then_the_pick_is_watched_at_its_pin(tmp_path):
    """Every level reads 10 J a step: all tie, so the pick's neighbours are confirmed (CONFIRMING, the pin moving to
    them) until the steps left no longer pay; then CONVERGED, pinned at the pick, whose windows go on."""
    pins = _controller(tmp_path, _CountingGpu())
    job = _tuned_job(pins, 100)
    job.total_steps = 3000
    seen, pins_confirming = [], set()
    steps = 0
    while steps < 3000:
        steps += 1
        state = _report(pins, job, steps)
        if not seen or seen[-1] is not state:
            seen.append(state)
        if state is TunerState.CONFIRMING:
            assert job.tuner.describe()["state"] == "confirming" and job.tuner.status.startswith("confirming: ")
            pins_confirming.add(job.freq_hz)
        if state is TunerState.CONVERGED and TunerState.CONFIRMING in seen and steps > 2500:
            break
    assert seen[0] is TunerState.SEARCHING and TunerState.CONFIRMING in seen, seen
    assert TunerState.STOPPED not in seen and seen[-1] is TunerState.CONVERGED
    assert len(pins_confirming) >= 2  # the pick and a near-tie of it
    best = job.tuner.tuner.best_hz
    assert job.freq_hz == best and job.tuner.describe()["state"] == "converged"
    probes = job.tuner.tuner.probes
    for k in range(1, 30):  # watched: its windows go on at the pin
        assert _report(pins, job, steps + k) is TunerState.CONVERGED and job.freq_hz == best
    assert job.tuner.tuner.probes > probes and job.tuner.tuner.re_searches == 0


def test_windows_that_only_watch_the_pick_are_logged_at_debug_and_the_search_at_info(tmp_path, caplog):
    """A follow-up watches its pick for as long as the job runs: one info line a window would flood the journal of a
    long job. The search's windows stay at info; once the pick holds (CONVERGED, the pick unchanged), its windows go
    to debug."""
    pins = _controller(tmp_path, _CountingGpu())
    job = _tuned_job(pins, 100)
    job.total_steps = 400  # near its end, confirming no longer pays: the follow-up only watches the pick
    job.tuner.set_total_steps(pins, job)
    reports = []  # (state after the report, its "tune probe" records)
    with caplog.at_level("DEBUG", logger="ftgovd"):
        for steps in range(1, 400):
            caplog.clear()
            state = _report(pins, job, steps)
            reports.append((state, [r for r in caplog.records if "tune probe" in r.getMessage()]))
    searching = [r for state, lines in reports if state is TunerState.SEARCHING for r in lines]
    assert searching and all(r.levelname == "INFO" for r in searching)
    last_change = max(i for i, (state, _) in enumerate(reports) if i and state is not reports[i - 1][0])
    assert reports[-1][0] is TunerState.CONVERGED
    watched = [r for _, lines in reports[last_change:] for r in lines]
    picks = [r.getMessage().rsplit("converged on ", 1)[1] for r in watched]
    for prev, now, r in zip(picks, picks[1:], watched[1:], strict=False):  # info exactly where the pick moved
        assert r.levelname == ("DEBUG" if now == prev else "INFO"), (prev, r.levelname, r.getMessage())
    assert sum(r.levelname == "DEBUG" for r in watched) >= 5


def test_a_long_tuned_jobs_windows_are_kept_within_a_bound_and_pooled_by_level():
    """tuner.follow_up watches a converged job's pick for as long as it runs: a window every 1-10 s, up to 86,000 a
    day, each kept in the root daemon's memory and written to the store as a row. Past WINDOWS_KEPT, each level's
    later windows are pooled into one entry: the steps, the J and the time are all there, in a bounded list."""
    from governor.daemon.tuning import kept_windows
    from governor.policy.measured_saving import WINDOWS_KEPT
    from governor.policy.tuner import Measurement

    kept = kept_windows()
    levels = (612_000_000, 714_000_000, 816_000_000)
    windows = [Measurement(levels[k % 7 % 3], 2.0 + (k % 5) / 10, 0.03, 40 + k % 11, 45 + k % 11, 0.02, 1.2)
               for k in range(20_000)]
    for k, m in enumerate(windows):
        kept.append((m, 80.0 + k % 3))
        if k == 500:
            kept.first((Measurement(None, 3.0, 0.02, 100, 104, 0.01, 2.0), 90.0))  # the baseline, late
    entries = list(kept)
    assert len(entries) == len(kept) <= WINDOWS_KEPT + 1 + len(levels)
    assert entries[0][0].level_hz is None  # the baseline heads the list
    assert kept.last_pinned is windows[-1]
    for level in levels:
        mine = [m for m in windows if m.level_hz == level]
        at = [m for m, _ in entries if m.level_hz == level]
        steps = sum(m.measured_steps for m in mine)
        assert sum(m.measured_steps for m in at) == steps
        joules = sum(m.joules_per_step * m.measured_steps for m in mine)
        assert sum(m.joules_per_step * m.measured_steps for m in at) == pytest.approx(joules)
        assert sum(m.duration_s or 0 for m in at) == pytest.approx(sum(m.duration_s or 0 for m in mine))
        assert all(0 < (m.noise_rel or 0) <= 0.02 for m in at)
    assert all(80.0 <= (u or 0) <= 82.0 for _, u in entries[1:])  # gpu_util pooled by steps
