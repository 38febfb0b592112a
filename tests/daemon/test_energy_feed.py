"""MeterFeed (governor/daemon/energy.py): what each progress report gives the tuner's and observe's windows."""

from __future__ import annotations

from types import SimpleNamespace

from governor.backends.rails import CounterMeter
from governor.daemon import energy


class Job(SimpleNamespace):
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
