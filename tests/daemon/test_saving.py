"""governor.daemon.saving: when the state file is written (at once, coalesced, flushed, with the energy ticks)."""

from __future__ import annotations

import pytest

from governor.backends.base import Limits
from governor.backends.rails import EnergyMeter
from governor.daemon.gpupin import GpuPin
from governor.daemon.jobtable import JobTable
from governor.daemon.powermode import PowerModeCap
from governor.daemon.saving import SAVE_COALESCE_S, SAVE_ENERGY_TICKS, StateSaver
from governor.errors import StateError
from governor.store.state import StateFile
from tests.daemon.test_controller import BASELINE, FakeGpu
from tests.daemon.test_jobtable import admit, decided


class CountingFile(StateFile):
    """A state file that counts its writes; ``fail`` makes them fail."""

    def __init__(self, path):
        super().__init__(path)
        self.writes = 0
        self.fail = False

    def write(self, state) -> None:
        if self.fail:
            raise StateError("the test's state file cannot be written")
        self.writes += 1
        super().write(state)


@pytest.fixture
def parts(tmp_path):
    jobs, pins = JobTable(), {}
    gpu = FakeGpu()
    pins[gpu.id] = GpuPin(gpu, PowerModeCap(pins), lambda: None)
    timers: list = []
    saver = StateSaver(CountingFile(tmp_path / "state"), "boot-1", jobs, pins,
                       defer=lambda fn, delay_s: timers.append((fn, delay_s)))
    return jobs, pins, saver, timers


def test_the_state_is_the_tables_decided_jobs_and_the_pinned_gpus(parts):
    jobs, pins, saver, _timers = parts
    decided(admit(jobs, 100), 714_000_000)
    admit(jobs, 101)  # undecided: not re-adopted after a crash
    assert saver.state().gpus == {}  # no baseline taken: nothing to restore
    pins["0"].baseline, pins["0"].pinned_hz = BASELINE, 714_000_000
    saver.save()
    state = saver.read()
    assert state is not None and state.gpus["0"].baseline == BASELINE and state.gpus["0"].pinned_hz == 714_000_000
    assert [r.job_id for r in state.jobs] == [1] and state.next_job_id == 3


def test_a_burst_of_joins_is_one_deferred_write_and_a_leave_comes_sooner(parts):
    _jobs, _pins, saver, timers = parts
    saver.soon(prompt=False)
    saver.soon(prompt=False)
    assert [delay_s for _fn, delay_s in timers] == [SAVE_COALESCE_S] and saver.state_file.writes == 0
    saver.soon(prompt=True)  # a job left: on the next turn, not behind the coalescing window
    assert [delay_s for _fn, delay_s in timers] == [SAVE_COALESCE_S, 0.0]
    saver.soon(prompt=False)  # the prompt one covers it
    assert len(timers) == 2
    for fn, _delay_s in timers:
        fn()
    assert saver.state_file.writes == 1  # the second timer finds nothing pending


def test_flush_writes_only_what_waits(parts):
    _jobs, _pins, saver, _timers = parts
    saver.flush()
    assert saver.state_file.writes == 0
    saver.soon(prompt=False)
    saver.flush()
    saver.flush()
    assert saver.state_file.writes == 1


def test_without_defer_a_save_is_at_once(tmp_path):
    saver = StateSaver(CountingFile(tmp_path / "state"), "boot-1", JobTable(), {})
    saver.soon(prompt=False)
    assert saver.state_file.writes == 1


def test_the_running_jobs_energy_is_saved_every_few_ticks(parts):
    jobs, _pins, saver, timers = parts
    for _ in range(SAVE_ENERGY_TICKS):
        saver.ticked()
    assert timers == []  # no job has a meter: nothing to save
    job = decided(admit(jobs), 714_000_000)
    job.meter = EnergyMeter(0.0, 5000.0)
    for _ in range(SAVE_ENERGY_TICKS - 1):
        saver.ticked()
    assert len(timers) == 1  # the count went on over the ticks without a meter
    timers.pop()[0]()
    for _ in range(SAVE_ENERGY_TICKS - 1):
        saver.ticked()
    assert timers == []  # a save restarts the count
    saver.ticked()
    assert len(timers) == 1


def test_a_failed_write_is_raised_only_while_a_pin_stands(parts):
    _jobs, pins, saver, _timers = parts
    saver.state_file.fail = True
    saver.save()  # nothing pinned: logged, nothing to lose
    pins["0"].baseline, pins["0"].pinned_hz = Limits(306_000_000, 1_300_500_000), 714_000_000
    with pytest.raises(StateError):
        saver.save()
    pins["0"].restore_failed = True  # the tick retries the restore: the pin is not one we stand behind
    saver.save()
