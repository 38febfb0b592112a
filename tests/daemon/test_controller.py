"""The pin controller's state machine with a fake GPU: admit, decide, end, adopt. No sockets, no processes."""

from __future__ import annotations

import dataclasses

import pytest

from governor.backends import devfreq
from governor.backends.base import GpuBase, Limits, Reading
from governor.cli.ops import format_status
from governor.daemon.controller import Controller
from governor.daemon.settings import PinSettings
from governor.daemon.status import status
from governor.errors import BackendError, FtgovError, PinError, StateError
from governor.features import Features
from governor.policy import Policy, PolicyName
from governor.store.state import StateFile
from governor.sysfs import trusted_root
from tests.support.daemon import DEVFREQ, limits

LEVELS = (306_000_000, 612_000_000, 714_000_000, 918_000_000, 1_300_500_000)
BASELINE = Limits(306_000_000, 1_300_500_000)
ENCODER = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


class FakeGpu(GpuBase):
    """Holds limits like a devfreq node; ``fail_pins`` makes the next pins fail, ``broken`` every restore and read."""

    id = "0"

    def __init__(self):
        self.levels_hz = LEVELS
        self.limits = BASELINE
        self.writes: list[int | None] = []  # each pin (Hz) and each restore (None)
        self.fail_pins = 0
        self.broken = ""

    def describe(self) -> dict:
        return {"backend": "fake"}

    def snapshot(self) -> Limits:
        return self.limits

    def pin(self, freq_hz: int) -> None:
        if self.fail_pins:
            self.fail_pins -= 1
            raise PinError("the fake refuses")
        self.limits = Limits(freq_hz, freq_hz)
        self.writes.append(freq_hz)

    def restore(self, limits: Limits) -> None:
        if self.broken:
            raise BackendError(self.broken)
        self.limits = limits
        self.writes.append(None)

    def read(self) -> Reading:
        if self.broken:
            raise BackendError(self.broken)
        return Reading(self.limits.min_hz, self.limits.max_hz, self.limits.max_hz, 50.0)

    def pin_holds(self, reading: Reading | None = None) -> bool:
        return self.limits.min_hz == self.limits.max_hz


@pytest.fixture
def gpu():
    return FakeGpu()


SETTINGS = {f.name for f in dataclasses.fields(PinSettings)}


def controller(gpu, tmp_path, ffg_hz=714_000_000, **kwargs) -> Controller:
    """A controller of ``gpu`` under the FFG policy; the keywords that name a setting go into its PinSettings."""
    settings = {k: kwargs.pop(k) for k in list(kwargs) if k in SETTINGS}
    if "low_phases" in settings:
        settings["low_phases"] = frozenset(settings["low_phases"])
    policy = Policy(PolicyName.FFG, ffg_hz, None)
    return Controller([gpu], PinSettings(policy, **settings), StateFile(tmp_path / "state"), "boot-1", **kwargs)


def job(pins: Controller, pid=100, features=ENCODER, **kwargs):
    return pins.admit(pid=pid, start_ticks=5000 + pid, uid=1000, name=None, gpu_id="0", features=features, **kwargs)


def test_admit_pins_nothing_until_decided(gpu, tmp_path):
    pins = controller(gpu, tmp_path)
    j = job(pins)
    assert j.decision is None and gpu.writes == [] and pins.target_hz("0") is None


def test_decide_pins_and_end_restores_the_baseline(gpu, tmp_path):
    pins = controller(gpu, tmp_path)
    j = job(pins)
    assert pins.decide(j).freq_hz == 714_000_000
    assert gpu.limits == Limits(714_000_000, 714_000_000) and pins.gpus["0"].baseline == BASELINE
    ended = pins.end(j.job_id, "unregistered")
    assert ended.why == "unregistered" and gpu.limits == BASELINE and gpu.writes == [714_000_000, None]
    assert pins.end(j.job_id, "again") is None


def test_two_jobs_hold_the_higher_pick_until_both_end(gpu, tmp_path):
    pins = controller(gpu, tmp_path)
    low, high = job(pins, 100), job(pins, 101)
    pins.decide(low)
    pins.set_freq(high, 918_000_000, "tune: probing")
    assert gpu.limits.max_hz == 918_000_000
    pins.end(high.job_id, "unregistered")
    assert gpu.limits.max_hz == 714_000_000  # back to the remaining job's pick, not the baseline
    pins.end(low.job_id, "unregistered")
    assert gpu.limits == BASELINE


def test_a_low_phase_drops_to_the_lowest_level(gpu, tmp_path):
    pins = controller(gpu, tmp_path, low_phases=("checkpoint",))
    j = job(pins)
    pins.decide(j)
    pins.set_phase(j, "checkpoint")
    assert gpu.limits.max_hz == LEVELS[0]
    pins.set_phase(j, "train")
    assert gpu.limits.max_hz == 714_000_000


def test_a_failed_first_pin_drops_the_job_and_leaves_the_baseline(gpu, tmp_path):
    pins = controller(gpu, tmp_path)
    j = job(pins)
    gpu.fail_pins = 1
    with pytest.raises(PinError):
        pins.decide(j)
    assert j.job_id not in pins.jobs and gpu.limits == BASELINE and not pins.pending_restores()


def test_a_restore_that_keeps_failing_is_logged_when_it_fails_and_when_it_takes_not_on_every_tick(gpu, tmp_path,
                                                                                                  caplog):
    """The tick retries a failed restore (every sample_interval_s, a second): each retry had its error line, and the
    tick's check of the pin its warning, for as long as the node was gone. `ftgov status` says what is retried."""
    pins = controller(gpu, tmp_path)
    j = job(pins)
    pins.decide(j)
    gpu.broken = "cannot read max_freq: No such file or directory"
    with caplog.at_level("INFO", logger="ftgovd"):
        pins.end(j.job_id, "unregistered")
        for _ in range(5):
            pins.tick()
        assert status(pins)["gpus"][0]["write_error"] == gpu.broken
        assert f"GPU 0: its last write failed and is being retried: {gpu.broken}" in format_status(status(pins))
        gpu.broken = "cannot read max_freq: No such device"
        pins.tick()
        gpu.broken = ""
        pins.tick()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelname != "DEBUG"]
    assert [level for level, _ in said if level != "INFO"] == ["ERROR", "WARNING", "WARNING", "ERROR"], said
    assert "restored to its baseline" in said[-1][1] and gpu.limits == BASELINE
    assert status(pins)["gpus"][0]["write_error"] is None


def test_a_tuners_move_that_failed_mid_write_is_retried_not_taken_for_another_tools_change(orin, tmp_path):
    """A tuner's move raises to the tuner, which stops: the move was not retried, and the tick read the limits our
    failed write left as another tool's change under the pin, taking our old pin for the baseline's max."""
    (gpu,) = devfreq.probe(trusted_root(orin))
    node = (orin / DEVFREQ).resolve()
    pins = controller(gpu, tmp_path)
    j = job(pins)
    pins.decide(j)
    assert limits(orin) == (714_000_000, 714_000_000)
    saved = (node / "min_freq").read_text()
    (node / "min_freq").unlink()  # the move down writes min first: it fails, nothing written
    with pytest.raises(BackendError):
        pins.set_freq(j, 510_000_000, "tune: a move")
    (node / "min_freq").write_text(saved)
    pins.tick()
    assert limits(orin) == (510_000_000, 510_000_000)
    pins.end(j.job_id, "unregistered")
    assert limits(orin) == (BASELINE.min_hz, BASELINE.max_hz)


def test_a_tuners_move_whose_save_failed_is_not_taken_for_made_and_is_retried(gpu, tmp_path):
    """A move's save fails (a full /run) before its write: nothing is written. The pin was taken for moved all the
    same, so status showed the new level over the old one, and the move was never made once the disk had room."""
    pins = controller(gpu, tmp_path)
    j = job(pins)
    pins.decide(j)
    pins.saver.state_file = StateFile("/proc/ftgov-no-state")  # every save fails, as on a full state dir
    with pytest.raises(StateError):
        pins.set_freq(j, 612_000_000, "tune: a move")
    assert gpu.limits == Limits(714_000_000, 714_000_000) and status(pins)["gpus"][0]["pinned_hz"] == 714_000_000
    pins.saver.state_file = StateFile(tmp_path / "state")  # room again
    pins.tick()
    assert gpu.limits == Limits(612_000_000, 612_000_000) and status(pins)["gpus"][0]["pinned_hz"] == 612_000_000


def test_listeners_and_deferral_come_through_the_constructor(gpu, tmp_path):
    seen, deferred = [], []
    pins = controller(gpu, tmp_path, listeners=(lambda p: seen.append(len(p.jobs)),),
                      defer=lambda fn, delay_s: deferred.append((fn, delay_s)))
    j = job(pins)
    pins.decide(j)
    second = job(pins, 101)
    pins.decide(second)  # same pin: only the job list changed, so its save is deferred
    assert seen and deferred and deferred[-1][1] > 0
    deferred[-1][0]()
    assert {r.job_id for r in pins.saver.state_file.read("boot-1").jobs} == {j.job_id, second.job_id}


def test_deciding_attaches_the_tuner(gpu, tmp_path):
    attached = []
    pins = controller(gpu, tmp_path, attach_tuner=lambda p, j: attached.append((j.job_id, j.decision.policy)))
    j = job(pins, policy=PolicyName.TUNE)
    pins.decide(j)
    assert attached == [(j.job_id, PolicyName.TUNE)]


def test_adopt_takes_back_live_jobs_and_the_baseline(gpu, tmp_path):
    first = controller(gpu, tmp_path)
    j = job(first)
    first.decide(j)
    state = first.saver.state_file.read("boot-1")  # what a crashed daemon left: pinned, one job
    assert state.gpus["0"].pinned_hz == 714_000_000 and state.jobs[0].start_ticks == 5100

    again = controller(gpu, tmp_path)
    adopted = again.adopt(state)
    assert [a.job_id for a in adopted] == [j.job_id] and adopted[0].adopted
    assert adopted[0].decision.label == "ffg" and again.gpus["0"].baseline == BASELINE
    assert gpu.limits.max_hz == 714_000_000 and again.jobs.next_job_id == j.job_id + 1
    again.end(j.job_id, "process exited")
    assert gpu.limits == BASELINE



def test_adopt_takes_back_more_live_jobs_than_a_lowered_max_jobs(gpu, tmp_path):
    # An operator lowered limits.max_jobs and restarted while jobs held the pin: they are taken back all the same
    # (refusing them failed the start, pin left in place); new jobs wait for room.
    first = controller(gpu, tmp_path)
    for pid in (100, 101, 102):
        first.decide(job(first, pid=pid))
    state = first.saver.state_file.read("boot-1")
    again = controller(gpu, tmp_path, max_jobs=2)
    assert len(again.adopt(state)) == 3 and gpu.limits.max_hz == 714_000_000
    with pytest.raises(FtgovError, match="max_jobs"):
        job(again, pid=103)

def test_adopt_with_no_live_job_restores(gpu, tmp_path):
    first = controller(gpu, tmp_path)
    first.decide(job(first))
    state = first.saver.state_file.read("boot-1")
    state.jobs.clear()  # the server drops the records whose processes are gone
    again = controller(gpu, tmp_path)
    assert again.adopt(state) == []
    assert gpu.limits == BASELINE and again.gpus["0"].baseline is None


def test_an_unknown_uuid_on_a_single_uuidless_gpu_is_that_gpu(gpu, tmp_path):
    pins = controller(gpu, tmp_path)
    assert pins.find_gpu("GPU-1234abcd") == "0" and pins.find_gpu(None) == "0" and pins.find_gpu(0) == "0"


def test_a_gpu_not_found_names_the_gpus_there_are():
    """It read 'no GPU with index 3: there are 0 (no UUID)' on a board whose one GPU is 0: as if there were none."""
    from governor.backends.gpuid import GpuNotFound, find_gpu

    class Gpu:
        def __init__(self, gid, uuid=None):
            self.id, self.uuid = gid, uuid

    with pytest.raises(GpuNotFound, match=r"^no GPU with index 3: the only GPU here is 0 \(no UUID\)$"):
        find_gpu([Gpu("0")], 3)
    with pytest.raises(GpuNotFound, match=r"^no GPU named 'x': the GPUs here are 0 \(GPU-a\), 1 \(GPU-b\)$"):
        find_gpu([Gpu("0", "GPU-a"), Gpu("1", "GPU-b")], "x")


def test_a_job_waiting_for_its_gpu_util_holds_no_pin_until_decided(gpu, tmp_path):
    pins = controller(gpu, tmp_path)
    j = job(pins, features=ENCODER.model_copy(update={"gpu_util": None}))
    assert pins.hold_unpinned(j, "waiting").freq_hz is None and gpu.writes == []
    j.features = j.features.model_copy(update={"gpu_util": 70.0})
    pins.decide(j, why_util="measured")
    assert gpu.limits.max_hz == 714_000_000 and j.decision.reason.endswith("; measured")


def test_a_pick_above_the_power_modes_cap_is_moved_down_to_it(gpu, tmp_path):
    gpu.limits = Limits(306_000_000, 612_000_000)  # nvpmodel MODE_30W
    pins = controller(gpu, tmp_path, ffg_hz=918_000_000)
    d = pins.decide(job(pins))
    assert d.freq_hz == 612_000_000 and "capped by the power mode at 612 MHz" in d.reason
    assert pins.power_mode.allowed_levels("0") == LEVELS[:2]
    allowed = controller(FakeGpu(), tmp_path / "b", ffg_hz=918_000_000, pin_above_power_mode=True)
    allowed.gpus["0"].gpu.limits = Limits(306_000_000, 612_000_000)
    assert allowed.decide(job(allowed)).freq_hz == 918_000_000


def test_a_tuned_job_off_devfreq_starts_at_the_top_and_its_end_logs_the_measured_saving(gpu, tmp_path, caplog):
    from governor.daemon.tuning import TunerAttach

    attach = TunerAttach()
    pins = controller(gpu, tmp_path, attach_tuner=attach, plan_tune=attach.plan)
    j = job(pins, policy=PolicyName.TUNE)
    decision = pins.decide(j)
    assert decision.freq_hz == LEVELS[-1] and "top of the table" in decision.reason  # the fake GPU is no devfreq node

    class Measured:  # what a JobTuner's finish returns for a job with a baseline window (governor.daemon.tuning)
        def finish(self, job):
            return {"saved_pct": 21.5, "saved_rel": 0.215, "measured_steps": 54, "basis": "default governor"}

        def state(self):
            return {}

    j.tuner = Measured()
    with caplog.at_level("INFO", logger="ftgovd"):
        ended = pins.end(j.job_id, "unregistered")
    assert ended.saving["saved_pct"] == 21.5
    record = next(r for r in caplog.records if "ended (unregistered)" in r.getMessage())
    assert "saved 21.5% energy per step vs the default governor, measured over 54 steps" in record.getMessage()
    assert record.SAVED_PCT == "21.5" and record.SAVED_MEASURED_STEPS == 54  # journald fields


def test_the_decision_line_carries_the_new_decisions_journald_fields(gpu, tmp_path, caplog):
    # The line is written before the pin (so a hung write leaves it), when the job does not hold the decision yet:
    # its FREQ_HZ and POLICY must be the decision's, or `journalctl FREQ_HZ=...` finds nothing.
    pins = controller(gpu, tmp_path)
    j = job(pins)
    with caplog.at_level("INFO", logger="ftgovd"):
        pins.decide(j)
    record = next(r for r in caplog.records if "-> ffg" in r.getMessage())
    assert record.FREQ_HZ == 714_000_000 and record.POLICY == "ffg" and record.JOB_ID == j.job_id
