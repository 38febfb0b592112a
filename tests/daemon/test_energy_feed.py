"""MeterFeed (governor/daemon/energy.py): what each progress report gives the tuner's and observe's windows."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from governor.backends.rails import CounterMeter
from governor.daemon import energy
from governor.policy.windows import WindowRule


class Job(SimpleNamespace):
    phase: str | None = None

    def label(self) -> str:
        return "job 1"

    def fields(self) -> dict:
        return {}


def test_a_counter_whose_update_grid_is_never_found_falls_back_to_the_reports(monkeypatch):
    """A client reporting at the counter's own pace (10 a second against 100 ms updates) may never show where the
    updates fall: windows wait GRID_WAIT_S for the grid, then take the reports themselves, as without step_end_s,
    rather than never closing (seen on an H200 under the HF Trainer's callback)."""
    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    counter = [0.0]
    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(lambda: counter[0]), total_mw=float),
                            gpu=None)
    job = Job(steps=0, step_end_s=None)
    got = []
    for n in range(1, 40):  # a report every 100 ms, just after each update: the grid's phase never narrows
        now[0] += 0.1
        counter[0] += 50.0
        job.steps, job.step_end_s = n, now[0] - 0.001
        got.append(feed.points(job, feed.energy_j(job)))
    waiting = int(energy.GRID_WAIT_S / 0.1)
    assert all(p == [] for p in got[:waiting - 1]), got[:waiting]
    assert all(p and p[0][0] == n for n, p in enumerate(got, start=1) if n > waiting + 2), got
    assert not feed.grid_found
    assert not feed.on_updates and feed.window_rule(WindowRule()).held_ends  # the reports' reads: held ends


def test_windows_on_a_counters_update_instants_count_no_held_ends(monkeypatch):
    """Reports with step_end_s at a pace of their own find the counter's update grid: from then on the points sit on
    its updates and the windows opened on them count no held counter's ends (WindowRule.held_ends); an older
    client's reports, read as they arrive, keep them."""
    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    meter = CounterMeter(lambda: 50.0 * math.floor((now[0] - 0.033) / 0.1))  # 500 W, updates every 100 ms
    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: meter, total_mw=float), gpu=None)
    job = Job(steps=0, step_end_s=None)
    rule = WindowRule()
    assert not feed.on_updates and feed.window_rule(rule) is rule
    points = []
    for n in range(1, 80):  # steps of 43 ms: reads that straddle updates at every phase narrow the grid
        now[0] += 0.043
        job.steps, job.step_end_s = n, now[0] - 0.002
        points += feed.points(job, feed.energy_j(job))
    assert feed.grid_found and feed.on_updates
    assert feed.window_rule(rule).held_ends is False and feed.window_rule(None) is None
    assert len(points) > 20 and all(p[1] % 50.0 == 0 for p in points)  # each the counter at one of its updates
    job.step_end_s = None  # an older client
    now[0] += 0.043
    job.steps += 1
    feed.points(job, feed.energy_j(job))
    assert not feed.on_updates and feed.window_rule(rule) is rule


def test_counter_reads_are_paced_by_what_each_costs(monkeypatch):
    """A read of NVML's counter burnt 9.5 ms of CPU on an H200: an older client's 10 reports a second would have the
    daemon spend 9.5% of a core on them, and the timer's edges every 0.5 s about 3%. The reads are paced to stay
    within COUNTER_READ_CPU_FRAC of a core, by the cost measured as they are made; a cheap counter is read as before."""
    now, cpu = [100.0], [0.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(energy.time, "perf_counter", lambda: cpu[0])
    read_cost_s = [0.0095]
    reads = []

    def read_j() -> float:
        cpu[0] += read_cost_s[0]
        reads.append(now[0])
        return 50.0 * len(reads)

    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(read_j), total_mw=float), gpu=None,
                            edge_every_s=0.5)
    job = Job(steps=0, step_end_s=None)  # an older client: no step_end_s
    got = []
    for n in range(1, 101):  # 10 s of reports, 10 a second
        now[0] += 0.1
        job.steps = n
        got.append(feed.report_points(job))
    pace_s = read_cost_s[0] / energy.COUNTER_READ_CPU_FRAC  # 1.19 s: within the budget
    # after the meter's first read and the reports' first READ_COSTS_MIN reads, which time it:
    first = energy.READ_COSTS_MIN
    unpaced = [b - a for a, b in zip(reads[1:first + 1], reads[2:first + 1], strict=False)]
    assert unpaced == [pytest.approx(0.1)] * (first - 1)
    gaps = [b - a for a, b in zip(reads[first:], reads[first + 1:], strict=False)]
    assert gaps and all(pace_s <= gap < pace_s + 0.1 + 1e-9 for gap in gaps), reads
    assert sum(1 for p in got if p) == len(reads) - 1  # a point at each report that read, none between
    assert feed._edges.stride * 0.1 >= 0.0095 * feed._edges.reads_per_stride / energy.COUNTER_READ_CPU_FRAC - 0.1
    # A counter that costs nothing to read: every report reads it, as before, and the edges keep their 0.5 s.
    read_cost_s[0], reads[:] = 0.0, []
    cheap = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(read_j), total_mw=float), gpu=None,
                             edge_every_s=0.5)
    for n in range(1, 11):
        now[0] += 0.1
        job.steps = n
        assert cheap.report_points(job)
    assert len(reads) == 11 and cheap._edges.stride == 5  # the meter's first read, then one a report


def test_one_dear_read_does_not_set_the_pace(monkeypatch):
    """A read preempted on a busy host costs 1 ms where the others cost 40 us. Taken alone it would pace an older
    client's reads 125 ms apart, past an update of NVML's counter (CI saw a window miss its update that way): the
    first reads are not paced until READ_COSTS_MIN are timed, and the dearest of those kept is left out."""
    now, cpu = [100.0], [0.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(energy.time, "perf_counter", lambda: cpu[0])
    costs_s = iter([0.0, 0.001] + [0.00004] * 50)  # the meter's own first read, then the reports'
    reads = []

    def read_j() -> float:
        cpu[0] += next(costs_s)
        reads.append(now[0])
        return 50.0 * len(reads)

    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(lambda: 0.0), total_mw=float),
                            gpu=None)
    feed.meter = CounterMeter(read_j)
    job = Job(steps=0, step_end_s=None)
    for n in range(1, 21):  # 40 ms apart: each would be skipped at a 125 ms pace
        now[0] += 0.04
        job.steps = n
        assert feed.report_points(job), (n, feed.pace_s())
    assert len(reads) == 21 and feed.pace_s() < 0.04  # the meter's first read, then one a report


def test_a_driver_that_answers_some_reads_from_a_cache_is_paced_on_the_mean_and_the_stride_rounds_up(monkeypatch):
    """An H200's counter reads cost 4 and 12 ms in turn (a cache answers some). Leaving the dearest of the last eight
    out ran the pace 7% fast, and a stride rounded down to whole updates read up to one update in eleven too often:
    the reads took 1.0% of a core there. The dearest is left out only where it is an outlier, and the stride is the
    pace rounded up, so the timer's reads stay within COUNTER_READ_CPU_FRAC."""
    now, cpu = [100.0], [0.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(energy.time, "perf_counter", lambda: cpu[0])
    costs_s = iter([0.004, 0.012, 0.012] * 20)

    def read_j() -> float:
        cpu[0] += next(costs_s)
        return 50.0

    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(read_j), total_mw=float), gpu=None,
                            edge_every_s=0.5)
    for _ in range(8):
        feed._read()
    costs = list(feed._read_costs_s)
    assert feed.pace_s() == pytest.approx(sum(costs) / len(costs) / energy.COUNTER_READ_CPU_FRAC)
    per_s = feed._edges.reads_per_stride / (feed._edges.stride * feed.meter.update_s)
    assert per_s * sum(costs) / len(costs) <= energy.COUNTER_READ_CPU_FRAC
    assert feed.meter.read_j.reads == 9 and feed.meter.read_j.read_s == pytest.approx(0.004 + sum(costs))


def test_a_jobs_total_takes_the_averaged_readings_lag_out():
    """An INA3221 reading is the mean over the update interval before its refresh: at a job's end the sensor has yet
    to show its last interval, at its start it still showed the board before the job. total_j adds the one and takes
    the other out; the integral itself (windows' edges) is left as it was."""
    from governor.backends.rails import EnergyMeter

    meter = EnergyMeter(0.0, 1000.0, update_s=0.2)  # 1 W idle when the job registers
    for k in range(1, 51):
        meter.add(0.1 * k, 1000.0 if k <= 2 else 5000.0)  # the job draws 5 W; the readings show it from 0.3 s
    assert meter.energy_j == pytest.approx(0.2 + 0.3 + 0.5 * 47)
    assert meter.total_j(5.0, 5000.0) == pytest.approx(meter.energy_j + 0.2 * 4.0)
    assert meter.energy_j == pytest.approx(0.2 + 0.3 + 0.5 * 47)


def test_a_gpus_meters_share_its_counters_reads_and_the_state_file_takes_a_recent_one(monkeypatch):
    """The state file saves each job's energy every few ticks: a fresh read of NVML's counter each time would cost
    milliseconds of CPU for a figure a restart continues from. Meters on one GPU share the counter's reads, and the
    saved figure takes one at most STATE_ENERGY_AGE_S old (a tuner's or observer's reads keep it fresh)."""
    from governor.backends import rails
    from governor.daemon.jobs import STATE_ENERGY_AGE_S, ActiveJob
    from governor.features import Features

    now, reads = [50.0], []
    monkeypatch.setattr(rails.time, "monotonic", lambda: now[0])

    def read_j() -> float:
        reads.append(now[0])
        return 1000.0 + 10.0 * len(reads)

    board = energy.BoardEnergy(None)
    gpu = SimpleNamespace(id="0", has_energy_counter=True, energy_j=read_j)
    job_meter, tuner_meter = board.new_meter(gpu), board.new_meter(gpu)
    assert job_meter.read_j is tuner_meter.read_j and len(reads) == 2
    job = ActiveJob(1, 100, 1, 1000, None, "0", Features(model_type="encoder", num_layers=2, hidden_size=64,
                                                        seq_len=8.0), meter=job_meter)
    now[0] += 1.0
    assert tuner_meter.energy_j == 10.0  # a window's read (the job's meter started a read earlier)
    assert job.energy_so_far_j(STATE_ENERGY_AGE_S) == 20.0 and len(reads) == 3  # that read, none of its own
    now[0] += STATE_ENERGY_AGE_S + 1
    assert job.energy_so_far_j(STATE_ENERGY_AGE_S) == 30.0 and len(reads) == 4  # too old: read now
    assert job.energy_so_far_j() == 40.0 and len(reads) == 5  # unregister's and status's: always fresh


def test_an_older_clients_reports_on_the_rails_take_the_samplers_samples_not_a_reading_of_their_own(monkeypatch):
    """A client without step_end_s reports right at its steps' ends: a reading of the rails there would sample one
    phase of every step (the optimizer's, say), and an INA3221's average taken at a report bent a tuner's curve by
    18% on long steps. Its windows take the sampler's samples, at the sensor's refresh, as a newer client's do, the
    steps counted fractionally between the reports' arrivals; the rails are never read at a report."""
    from governor.backends.rails import EnergyMeter

    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    reads = []
    board = SimpleNamespace(total_mw=lambda: reads.append(now[0]) or 0.0)
    meter = EnergyMeter(now[0], 0.0, update_s=0.14)
    feed = energy.MeterFeed(board, gpu=None, meter=meter)
    job = Job(steps=0, step_end_s=None)
    points = []
    power_mw = 5000.0
    sample_s = 100.0
    for k in range(1, 41):  # steps of 0.25 s, the sampler at 0.14 s: never in step with them
        t_end = 100.0 + 0.25 * k
        while sample_s + 0.14 <= t_end:
            sample_s += 0.14
            now[0] = sample_s
            meter.add(sample_s, power_mw)  # the sampler (governor.daemon.ticks): 5 W throughout
        now[0] = t_end  # the report arrives as the step ends
        job.steps = k
        points += feed.report_points(job)
    assert not reads  # the rails were read by the sampler alone
    assert feed.on_updates and feed.window_rule(WindowRule()).held_ends is False  # the points are samples
    assert len(points) > 30
    for (n0, e0, t0), (n1, e1, t1) in zip(points, points[1:], strict=False):
        assert t1 - t0 == pytest.approx(0.14)  # each edge a sample of the sampler's
        assert (n1 - n0) == pytest.approx(0.14 / 0.25)  # steps counted fractionally by the reports' arrivals
        assert (e1 - e0) / (n1 - n0) == pytest.approx(5.0 * 0.25)  # 5 W over a 0.25 s step: 1.25 J a step


def test_an_evaluation_between_two_training_steps_lands_in_no_window(monkeypatch):
    """A job evaluates (phase eval) for 2 s between two steps, the GPU busy throughout, then trains again. Its
    reports around the evaluation carry the last training step's end (the client has run no step since), so counted
    from it the evaluation's energy was spread over the next step (found by an independent emulated Orin: a window
    read 8 times the truth, a measured saving 48% against 20%). The report that leaves training starts the windows
    over; the one that comes back counts the steps afresh from its arrival: every window reads the steps' own J."""
    from governor.policy.windows import ProbeWindow, WindowRule

    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    power_w, step_s = 100.0, 0.025  # 2.5 J a step; the evaluation draws the same power for 2 s

    def counter_j() -> float:  # NVML's: the energy at the last 100 ms update, held between updates
        return power_w * (int(now[0] / 0.1) * 0.1)

    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(counter_j), total_mw=float),
                            gpu=None)
    job = Job(steps=0, step_end_s=None, phase="train")
    rule = WindowRule(meter_update_s=0.1, max_s=30.0)
    window = ProbeWindow(None, 0, 1, rule=rule, meter_update_s=0.1)
    measured = []

    def report() -> None:
        for steps, e_j, t_s in feed.report_points(job):
            nonlocal window
            m = window.feed(steps, e_j, t_s, job.phase)
            if m is not None:
                measured.append(m)
                window = ProbeWindow(None, steps, 0, rule=rule, meter_update_s=0.1)

    def train(steps: int) -> None:
        for _ in range(steps):
            now[0] += step_s
            job.steps += 1
            job.step_end_s = now[0]
            report()

    train(200)
    before = len(measured)
    job.phase = "eval"
    now[0] += 0.001
    report()  # the phase change: steps and step end as they were
    now[0] += 2.0
    job.phase = "train"
    report()
    train(1200)
    assert before >= 1 and len(measured) - before >= 5, measured
    assert all(m.joules_per_step == pytest.approx(power_w * step_s, rel=0.05) for m in measured), measured


def test_a_counter_that_cannot_be_read_at_a_change_of_phase_still_pauses_the_windows(monkeypatch):
    """A failed read as the job leaves training: the windows get their pause (a point of the new phase) all the same,
    the report is not refused, and coming back (the counter readable again) they go on at its arrival."""
    from governor.errors import BackendError

    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    failing = [False]

    def counter_j() -> float:
        if failing[0]:
            raise BackendError("NVML: GPU is lost")
        return 100.0 * (int(now[0] / 0.1) * 0.1)

    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(counter_j), total_mw=float),
                            gpu=None)
    job = Job(steps=0, step_end_s=None, phase="train")
    for _ in range(60):
        now[0] += 0.025
        job.steps += 1
        job.step_end_s = now[0]
        feed.report_points(job)
    failing[0], job.phase = True, "eval"
    assert [p[0] for p in feed.report_points(job)] == [60]  # the pause's point
    failing[0], job.phase = False, "train"
    now[0] += 1.0
    assert [p[0] for p in feed.report_points(job)] == [60]  # where the windows go on (the counter read again)



class Board:
    """Energy drawn over time, piecewise at constant power; NVML's counter reads it at its last 100 ms update."""

    def __init__(self, now: list[float]):
        self.now = now
        self.trace = [(now[0], 0.0)]

    def run(self, seconds: float, power_w: float) -> None:
        t, e = self.trace[-1]
        self.trace.append((t + seconds, e + power_w * seconds))
        self.now[0] = t + seconds

    def energy_at(self, t_s: float) -> float:
        for (t0, e0), (t1, e1) in zip(self.trace, self.trace[1:], strict=False):
            if t0 <= t_s <= t1:
                return e0 + (e1 - e0) * (t_s - t0) / (t1 - t0)
        return self.trace[-1][1] if t_s > self.trace[-1][0] else 0.0

    def counter_j(self) -> float:
        return self.energy_at(math.floor(round(self.now[0] / 0.1, 9)) * 0.1)


def _windows(feed, job, board: Board, steps, update_s: float, on_sample=None):
    """Back-to-back rule windows over a job's steps, a report at each step's end (job.step_end_s): each step a list of
    (seconds, watts) that run before its report (an unreported pause: its seconds at low power, then the step)."""
    from governor.policy.windows import ProbeWindow, WindowRule

    rule = WindowRule(meter_update_s=update_s, max_s=30.0)
    window = ProbeWindow(None, 0, 1, rule=rule, meter_update_s=update_s)
    measured = []
    for segments in steps:
        for seconds, watts in segments:
            if on_sample is None:
                board.run(seconds, watts)
            else:
                on_sample(seconds, watts)
        job.steps += 1
        job.step_end_s = board.now[0]
        for n, e_j, t_s in feed.report_points(job):
            m = window.feed(n, e_j, t_s, job.phase)
            if m is not None:
                measured.append(m)
                window = ProbeWindow(None, n, 0, rule=rule.on_updates() if feed.on_updates else rule,
                                     meter_update_s=update_s)
    return measured


def _counter_feed(monkeypatch) -> tuple[Board, energy.MeterFeed, Job]:
    """A board read through NVML's counter (Board.counter_j) on the feed's clock, its feed, and a training job."""
    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    board = Board(now)
    feed = energy.MeterFeed(SimpleNamespace(new_meter=lambda gpu: CounterMeter(board.counter_j), total_mw=float),
                            gpu=None)
    return board, feed, Job(steps=0, step_end_s=None, phase="train")


def test_a_pause_the_job_does_not_report_lands_in_no_window(monkeypatch):
    """A plain loop saves a checkpoint for 60 s between two steps (the GPU idle at 20 W) without reporting a phase:
    spread over the next step, as the points count steps between step ends, it made a window read its level many
    times dearer (a 20-step baseline part 17 times: the tuner walked away from its minimum, a measured saving of 20%
    read -86% +/- 460). The gap is cut out as a reported pause is: every window reads the steps' own J, and the
    job's own energy keeps the pause's."""
    board, feed, job = _counter_feed(monkeypatch)
    step = [(0.025, 100.0)]  # 2.5 J a step
    measured = _windows(feed, job, board, [step] * 300 + [[(60.0, 20.0)] + step] + [step] * 1500, 0.1)
    assert len(measured) >= 5, measured
    assert all(m.joules_per_step == pytest.approx(2.5, rel=0.05) for m in measured), \
        [round(m.joules_per_step, 3) for m in measured]
    assert feed.gaps == 1
    assert all((m.duration_s or 0) < 30.0 for m in measured)  # the pause's minute is in none
    assert feed.meter.energy_j == pytest.approx(board.counter_j())  # the job's energy: all of it, the pause's too


def test_a_pause_on_the_rails_is_cut_and_a_lasting_slowdown_is_not(monkeypatch):
    """On a Jetson (the rails' sampler at the INA3221's refresh, steps of 0.4 s): a 20 s pause the job does not
    report is cut out of the windows. The job's steps then slow down to 2.5 s for good (another workload): only the
    first long step is taken for a pause; from the second the steps' new pace is the job's, and the windows read it."""
    from governor.backends.rails import EnergyMeter

    now = [100.0]
    monkeypatch.setattr(energy.time, "monotonic", lambda: now[0])
    meter = EnergyMeter(now[0], 0.0, update_s=0.14)
    feed = energy.MeterFeed(SimpleNamespace(total_mw=lambda: 0.0), gpu=None, meter=meter)
    board = Board(now)
    next_sample = [now[0] + 0.14]

    def run(seconds: float, watts: float) -> None:  # the board runs; the sampler samples every 0.14 s meanwhile
        end = now[0] + seconds
        while next_sample[0] <= end:
            board.run(next_sample[0] - now[0], watts)
            meter.add(now[0], watts * 1000.0)
            next_sample[0] += 0.14
        board.run(end - now[0], watts)

    job = Job(steps=0, step_end_s=None, phase="train")
    fast, slow = [(0.4, 10.0)], [(2.5, 12.0)]  # 4 J a step, then 30 J a step
    measured = _windows(feed, job, board, [fast] * 120 + [[(20.0, 3.0)] + fast] + [fast] * 200 + [slow] * 80, 0.14,
                        on_sample=run)
    fast = [m for m in measured if m.joules_per_step == pytest.approx(4.0, rel=0.05)]
    slow = [m for m in measured if m.joules_per_step == pytest.approx(30.0, rel=0.05)]
    other = [m for m in measured if m not in fast and m not in slow]
    assert len(fast) >= 20 and len(slow) >= 4, measured
    # One window straddles the change of pace (fast steps, then slow ones); none holds the pause.
    assert len(other) == 1 and other[0].seconds_per_step > 1.0 and measured.index(other[0]) == len(fast), measured
    assert feed.gaps == 2  # the pause, and the first of the slow steps


def test_steps_that_scatter_are_no_pause(monkeypatch):
    """Steps that scatter as an H200's did (15% a step) and now and then run three times their median (a logging
    step) are the job's: nothing is cut, and the windows read their mean J."""
    import random

    board, feed, job = _counter_feed(monkeypatch)
    rng = random.Random(7)
    steps = [[(0.04 * (3.0 if k % 50 == 49 else rng.lognormvariate(0.0, 0.15)), 200.0)] for k in range(3000)]
    measured = _windows(feed, job, board, steps, 0.1)
    true_j = 200.0 * sum(seg[0][0] for seg in steps) / len(steps)
    steps_in = sum(m.measured_steps for m in measured)
    pooled = sum(m.joules_per_step * m.measured_steps for m in measured) / steps_in
    assert pooled == pytest.approx(true_j, rel=0.02)
    assert feed.gaps == 0


def test_a_pause_right_after_a_stalled_step_is_cut_too(monkeypatch):
    """A host stalls 1.1 s in one step, and the loop then saves a checkpoint for 3 s without reporting it (seen in a
    dry run of scripts/gpu_recheck.py): two long steps in a row were taken for the job slowing down, the save kept as
    steps, and its window read 6 times dearer. Long steps unlike each other are pauses, each cut."""
    board, feed, job = _counter_feed(monkeypatch)
    step = [(0.025, 100.0)]  # 2.5 J a step
    stall, save = [(1.1, 20.0)] + step, [(3.0, 20.0)] + step
    measured = _windows(feed, job, board, [step] * 300 + [stall, save] + [step] * 600, 0.1)
    assert len(measured) >= 5, measured
    assert all(m.joules_per_step == pytest.approx(2.5, rel=0.05) for m in measured), \
        [round(m.joules_per_step, 3) for m in measured]
    assert feed.gaps == 2
