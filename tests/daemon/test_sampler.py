"""The rails' sampler in the real daemon: the INA3221 read once per sensor refresh while jobs run, whatever their
progress reports do, and not at all while none runs. Reads of the fake tree's rail files are seen by inotify."""

import os
import time
from pathlib import Path

import pytest

from governor.backends import rails
from governor.sim.tree import replace_file
from governor.sysfs import Root
from tests.support.daemon import FEATURES
from tests.support.fswatch import IN_CLOSE_NOWRITE, Watch


def rail_reads(watch: Watch, name: str, seconds: float) -> list[float]:
    """The instants the daemon finished reading the rail file ``name`` within the next ``seconds``."""
    out, end = [], time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        out += [time.monotonic() for file, _kind in watch.read(left) if file == name]
    return out


def test_the_rails_are_sampled_at_the_sensors_refresh_while_a_job_runs_and_never_when_none_does(orin, start_daemon):
    found = rails.discover(Root(orin))
    _volt, curr = next(iter(found.channels.values()))
    curr = Path(os.path.realpath(curr))
    d = start_daemon(config={"sample_interval_s": 5.0})  # the tick, which reads the rails too, out of the way
    c = d.client()
    watch = Watch(curr.parent, mask=IN_CLOSE_NOWRITE)
    try:
        job_id = c.call("register", **FEATURES)["job_id"]  # no progress at all: the sampler alone reads
        reads = rail_reads(watch, curr.name, 1.5)
        gaps = [b - a for a, b in zip(reads, reads[1:], strict=False)]
        assert len(reads) >= 8, reads  # 1.5 s / 140 ms
        assert sorted(gaps)[len(gaps) // 2] == pytest.approx(found.update_interval_s, abs=0.03), gaps
        c.call("unregister", job_id=job_id)
        watch.drain()
        assert rail_reads(watch, curr.name, 1.0) == []  # no job: no sampler (the tick is 5 s away)
    finally:
        watch.close()


def test_a_rail_read_that_fails_is_not_counted_as_zero_power(orin, start_daemon):
    """A board's INA3221 is read over I2C, and a read can fail (an I2C error; a simulated file never does). The job's
    energy must bridge the failed reads with the readings on either side, not integrate them as 0 mW: on a board at
    constant power, a job's energy is that power times its duration however many reads failed meanwhile."""
    root = Root(orin)
    found = rails.discover(root)
    power_w = found.total_mw(found.read_mw()) / 1000.0  # a plain tree: the rails hold still
    volt = Path(os.path.realpath(found.channels[rails.RAIL_GPU_SOC][0]))
    good = volt.read_text()
    d = start_daemon(config={"sample_interval_s": 5.0})  # the sampler alone reads the rails
    c = d.client()
    watch = Watch(volt.parent, mask=IN_CLOSE_NOWRITE)
    try:
        job_id = c.call("register", **FEATURES)["job_id"]

        def reads() -> int:
            return sum(1 for name, kind in watch.events if name == volt.name and kind == "close_nowrite")

        watch.drain()
        replace_file(root, volt, "garbage\n")  # a read that fails, as an I2C error would
        watch.events.clear()
        watch.wait(lambda: reads() >= 6)  # six samples (840 ms at 140 ms) fail
        replace_file(root, volt, good)
        watch.events.clear()
        watch.wait(lambda: reads() >= 2)  # and two read the rail again
        end = c.call("unregister", job_id=job_id)
    finally:
        watch.close()
    assert end["energy_j"] == pytest.approx(power_w * end["duration_s"], rel=0.05), end
    assert "cannot read the power rails" in d.log()
