"""The NVML backend against the fake pynvml (tests/support/fakenvml): probing, levels, pin/restore, power cap, errors,
reads."""

from __future__ import annotations

import csv
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor.backends.base import Gpu, Limits
from governor.backends.gpuid import GpuNotFound, find_gpu
from governor.backends.nvml import POWER_LIMIT_KEY, NvmlReadOnly, ReadOnlyNvml, coarse_levels, probe
from governor.client.features import visible_gpu
from governor.errors import BackendError, CannotCap, CannotPin, NodeNotFound, PinError
from tests.support import FAKENVML_DIR as FAKE_DIR
from tests.support import REPO

MHZ = 1_000_000


@pytest.fixture
def nvml():
    """The fake pynvml, imported the way the product imports the real one (first on sys.path), then taken away."""
    saved = {k: v for k, v in sys.modules.items() if k == "pynvml" or k.startswith("pynvml.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(FAKE_DIR))
    try:
        module = importlib.import_module("pynvml")
        assert Path(module.__file__).parent.parent == FAKE_DIR
        module.fake_reset(module.FakeSystem(gpus=module.default_gpus(2), clock=module.ManualClock()))
        yield module
    finally:
        sys.path.remove(str(FAKE_DIR))
        for k in [k for k in sys.modules if k == "pynvml" or k.startswith("pynvml.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture
def system(nvml):
    return nvml.fake_system()


# ---- probing ----
def test_probe_finds_every_gpu_with_index_uuid_and_levels(nvml, system):
    gpus = probe(nvml)
    assert [g.id for g in gpus] == ["0", "1"]
    assert [g.uuid for g in gpus] == [g.uuid for g in system.gpus]
    gpu = gpus[0]
    assert isinstance(gpu, Gpu)
    table_hz = sorted(mhz * MHZ for mhz in system.gpus[0].graphics_table(3201))
    assert gpu.supported_hz == tuple(table_hz)
    assert 10 <= len(gpu.levels_hz) <= 15
    assert list(gpu.levels_hz) == sorted(set(gpu.levels_hz))
    assert set(gpu.levels_hz) <= set(gpu.supported_hz)
    assert gpu.levels_hz[-1] == table_hz[-1] and gpu.levels_hz[0] == table_hz[0]
    assert system.writes() == []  # probing only reads


def test_levels_come_from_the_highest_memory_clock(nvml, system):
    system.gpus[0].memory_clocks_mhz = (1593, 3201)
    system.gpus[0].graphics_clocks_mhz = {1593: tuple(range(1200, 299, -100)), 3201: tuple(range(1980, 599, -60))}
    gpu = probe(nvml)[0]
    assert gpu.memory_clock_mhz == 3201
    assert gpu.supported_hz[-1] == 1980 * MHZ and gpu.supported_hz[0] == 600 * MHZ


def test_probe_without_driver_or_gpus_says_so(nvml, system):
    system.driver_loaded = False
    with pytest.raises(NodeNotFound, match="no NVIDIA driver"):
        probe(nvml)
    system.driver_loaded, system.gpus = True, []
    with pytest.raises(NodeNotFound, match="sees no GPU"):
        probe(nvml)


def test_probe_without_the_python_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what an absent package looks like to import
    with pytest.raises(NodeNotFound, match="nvidia-ml-py"):
        probe()


def test_the_legacy_pynvml_packages_bytes_are_decoded_so_that_jobs_find_their_gpu(nvml, system):
    # The legacy pynvml package (NGC PyTorch containers ship 11.4.1) shadows nvidia-ml-py and returns bytes: read as
    # str(b"GPU-..."), no job's "GPU-..." named its GPU and the name and driver version read "b'...'".
    system.legacy_bytes = True
    gpus = probe(nvml)
    assert [g.uuid for g in gpus] == [g.uuid for g in system.gpus]
    assert gpus[1].name == "NVIDIA H200" and gpus[1].driver_version() == system.driver_version
    assert find_gpu(gpus, system.gpus[1].uuid) is gpus[1]


def test_a_lost_gpu_is_skipped_and_the_others_kept(nvml, system):
    system.gpus[0].lost = True
    assert [g.id for g in probe(nvml)] == ["1"]


@given(table=st.lists(st.integers(100, 3000), min_size=1, max_size=200), count=st.integers(2, 20))
def test_coarse_levels_are_an_ascending_subset_with_both_ends(table, count):
    levels = coarse_levels(tuple(table), count)
    distinct = sorted(set(table))
    assert list(levels) == sorted(set(levels))
    assert set(levels) <= set(distinct)
    assert levels[0] == distinct[0] and levels[-1] == distinct[-1]
    assert len(levels) == min(count, len(distinct))


# ---- pin and restore ----
def test_pin_locks_min_and_max_and_restore_unlocks(nvml, system):
    gpu = probe(nvml)[0]
    system.set_utilization(0, 100)
    baseline = gpu.snapshot()
    assert (baseline.min_hz, baseline.max_hz) == (gpu.supported_hz[0], gpu.supported_hz[-1])
    level = gpu.levels_hz[4]
    gpu.pin(level)
    assert system.gpus[0].locked_mhz == (level // MHZ, level // MHZ)
    reading = gpu.read()
    assert reading.cur_hz == level and (reading.min_hz, reading.max_hz) == (level, level)
    gpu.restore(baseline)
    assert system.gpus[0].locked_mhz is None
    assert gpu.read().cur_hz == gpu.supported_hz[-1]
    assert system.writes() == ["nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"]


def test_pin_refuses_a_clock_the_gpu_does_not_support(nvml, system):
    gpu = probe(nvml)[0]
    with pytest.raises(PinError, match="not a supported graphics clock"):
        gpu.pin(gpu.supported_hz[-1] + 7 * MHZ)
    assert system.writes() == []


def test_pin_that_does_not_take_is_an_error(nvml, system):
    system.gpus[0].ignores_lock = True
    system.set_utilization(0, 100)
    gpu = probe(nvml)[0]
    with pytest.raises(PinError, match="did not take"):
        gpu.pin(gpu.levels_hz[2])


def test_a_clock_below_the_pin_because_of_the_power_cap_is_not_an_error(nvml, system):
    system.set_utilization(0, 100)
    system.gpus[0].power_limit_mw = 300_000
    gpu = probe(nvml)[0]
    gpu.pin(gpu.supported_hz[-1])
    assert gpu.read().cur_hz < gpu.supported_hz[-1]
    assert system.gpus[0].locked_mhz == (1980, 1980)


def test_a_narrower_snapshot_is_restored_as_a_lock(nvml, system):
    gpu = probe(nvml)[0]
    gpu.restore(Limits(900 * MHZ, 1500 * MHZ))
    assert system.gpus[0].locked_mhz == (900, 1500)
    assert (gpu.read().min_hz, gpu.read().max_hz) == (900 * MHZ, 1500 * MHZ)


def test_pin_holds_until_another_tool_resets_the_lock(nvml, system):
    system.set_utilization(0, 100)
    gpu = probe(nvml)[0]
    assert gpu.pin_holds()  # no lock held: nothing to lose
    gpu.pin(gpu.levels_hz[3])
    assert gpu.pin_holds()
    nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByIndex(0))  # as `nvidia-smi -rgc` would
    assert not gpu.pin_holds()
    assert gpu.snapshot().max_hz == gpu.supported_hz[-1]  # the snapshot cannot tell: it never sees a lock


# ---- permission and support ----
def test_without_root_pin_and_restore_say_root_is_needed(nvml, system):
    system.root = False
    gpu = probe(nvml)[0]
    with pytest.raises(CannotPin, match="needs root") as pinned:  # every lock would be refused alike
        gpu.pin(gpu.levels_hz[0])
    assert isinstance(pinned.value.__cause__, nvml.NVMLError_NoPermission)
    assert "NVML_ERROR_NO_PERMISSION" in str(pinned.value)
    # ftgovd itself runs such a GPU's jobs as observe: advice to "use the observe policy" read as the user's to do
    assert "observe" not in str(pinned.value) and "virtual GPUs" in str(pinned.value)
    with pytest.raises(BackendError, match="needs root"):
        gpu.restore(gpu.snapshot())
    with pytest.raises(PinError, match="needs root"):
        gpu.set_power_cap_mw(400_000)


def test_a_gpu_that_cannot_lock_clocks_says_so(nvml, system):
    system.gpus[1].supports_locking = False
    gpu = probe(nvml)[1]
    with pytest.raises(CannotPin, match="cannot lock its clocks") as pinned:
        gpu.pin(gpu.levels_hz[0])
    assert isinstance(pinned.value.__cause__, nvml.NVMLError_NotSupported)
    assert pinned.value.__cause__.value == nvml.NVML_ERROR_NOT_SUPPORTED


def test_a_lock_that_fails_for_a_lost_gpu_is_that_pins_error_only(nvml, system):
    gpu = probe(nvml)[0]
    system.gpus[0].lost = True
    with pytest.raises(PinError, match="GPU_IS_LOST") as pinned:
        gpu.pin(gpu.levels_hz[0])
    assert not isinstance(pinned.value, CannotPin)  # it may pass: the daemon tries again


# ---- power cap ----
def test_power_cap_is_set_read_back_and_restored(nvml, system):
    gpu = probe(nvml)[0]
    baseline = gpu.snapshot()
    assert dict(baseline.extra)[POWER_LIMIT_KEY] == 700_000
    gpu.set_power_cap_mw(450_000)
    assert system.gpus[0].power_limit_mw == 450_000
    gpu.restore(baseline)
    assert system.gpus[0].power_limit_mw == 700_000


def test_a_power_cap_refused_as_every_limit_would_be_is_cannot_cap(nvml, system):
    """No permission (not root), or a GPU with no power management (many virtual GPUs: even the constraints answer
    Not Supported): every limit is refused alike, so the daemon can stop trying (a lost GPU is that cap's error)."""
    system.gpus[1].supports_power_limit = False
    no_limit, gpu = probe(nvml)[1], probe(nvml)[0]
    with pytest.raises(CannotCap, match="does not allow its power limit to be changed"):
        no_limit.set_power_cap_mw(450_000)
    system.root = False
    with pytest.raises(CannotCap, match="NO_PERMISSION"):
        gpu.set_power_cap_mw(450_000)
    system.root, system.gpus[0].lost = True, True
    with pytest.raises(BackendError, match="GPU_IS_LOST") as lost:
        gpu.set_power_cap_mw(450_000)
    assert not isinstance(lost.value, CannotCap)
    assert system.gpus[0].power_limit_mw == 700_000


def test_power_cap_outside_the_constraints_is_refused_before_any_write(nvml, system):
    gpu = probe(nvml)[0]
    with pytest.raises(PinError, match="200000..700000"):
        gpu.set_power_cap_mw(100_000)
    assert system.writes() == []


def test_restore_after_a_crash_needs_only_the_saved_snapshot(nvml, system):
    gpu = probe(nvml)[0]
    saved = gpu.snapshot().to_dict()  # what the daemon's state file keeps
    gpu.set_power_cap_mw(300_000)
    gpu.pin(gpu.levels_hz[3])
    fresh = probe(nvml)[0]  # a new daemon process: it never saw the pin or the cap
    fresh.restore(Limits.from_dict(saved))
    assert system.gpus[0].locked_mhz is None and system.gpus[0].power_limit_mw == 700_000


def test_restore_puts_the_power_limit_back_even_when_the_clock_reset_fails(nvml, system, monkeypatch):
    gpu = probe(nvml)[0]
    baseline = gpu.snapshot()
    gpu.set_power_cap_mw(300_000)

    def reset_fails(handle):
        raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(nvml, "nvmlDeviceResetGpuLockedClocks", reset_fails)
    with pytest.raises(BackendError, match="reset locked clocks"):
        gpu.restore(baseline)
    assert system.gpus[0].power_limit_mw == 700_000


def test_restore_on_a_gpu_that_cannot_lock_is_done_not_a_failure(nvml, system):
    # NVML answers NOT_SUPPORTED to ResetGpuLockedClocks on a GPU without locked clocks (pre-Volta, some boards; NVML
    # API reference, Device Commands): no lock can be in force there, so there is nothing to undo. As a failure it
    # left the daemon retrying the restore on every tick after a pin that could not take (doctor's pin check too).
    gpu = probe(nvml)[1]
    baseline = gpu.snapshot()
    system.gpus[1].supports_locking = False
    with pytest.raises(PinError):
        gpu.pin(gpu.levels_hz[0])
    gpu.restore(baseline)  # no error
    gpu.set_power_cap_mw(300_000)
    gpu.restore(baseline)
    assert system.gpus[1].power_limit_mw == 700_000


def test_a_driver_without_the_lock_calls_refuses_every_lock_and_has_none_to_reset(nvml, system, tmp_path):
    # pynvml raises NVMLError(FUNCTION_NOT_FOUND) for a function the driver's libnvidia-ml.so lacks (its
    # _nvmlGetFunctionPointer), on every call alike: a PinError there was tried again at every pin, and the reset's
    # failure left the restore after it retried on every tick, as NOT_SUPPORTED once did.
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"system": {"nvmlDeviceSetGpuLockedClocks": nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                                             "nvmlDeviceResetGpuLockedClocks": nvml.NVML_ERROR_FUNCTION_NOT_FOUND}}))
    system.faults_path = str(faults)
    gpu = probe(nvml)[0]
    baseline = gpu.snapshot()
    with pytest.raises(CannotPin, match="update the driver"):
        gpu.pin(gpu.levels_hz[0])
    gpu.restore(baseline)  # no error: no lock can be in force where the driver has no call to set one


def test_restore_leaves_an_unchanged_power_limit_alone(nvml, system):
    gpu = probe(nvml)[0]
    gpu.restore(gpu.snapshot())
    assert "nvmlDeviceSetPowerManagementLimit" not in system.calls


# ---- reads ----
def test_clock_event_reasons_fall_back_to_the_throttle_reasons_of_a_driver_before_r535(nvml, system):
    # nvmlDeviceGetCurrentClocksEventReasons exists from driver R535 (leptonai/gpud PR #48: "clock events are supported
    # in versions 535 and above"); before it pynvml answers FUNCTION_NOT_FOUND and the same bits come from the older
    # nvmlDeviceGetCurrentClocksThrottleReasons (deprecated, "will be removed in CUDA 14.0", nvidia-ml-py 13).
    gpu = probe(nvml)[0]
    gpu.pin(gpu.levels_hz[2])
    assert gpu.clock_event_reasons() & nvml.nvmlClocksEventReasonApplicationsClocksSetting
    system.clock_events_api = False
    reasons = gpu.clock_event_reasons()
    assert reasons is not None and reasons & nvml.nvmlClocksEventReasonApplicationsClocksSetting
    assert system.calls[-1] == "nvmlDeviceGetCurrentClocksThrottleReasons"


def test_a_mig_enabled_gpu_reads_no_load_but_its_clock_and_energy(nvml, system):
    # NVML reports no utilization for a MIG-enabled GPU (nvitop issue #5); the counter is the whole GPU's.
    system.gpus[0].mig_mode = True
    system.set_utilization(0, 80)
    gpu = probe(nvml)[0]
    reading = gpu.read()
    assert reading.load_pct is None and reading.cur_hz is not None
    assert gpu.energy_mj() >= 0


def test_clock_event_reasons_are_none_where_neither_call_answers(nvml, system, monkeypatch):
    gpu = probe(nvml)[0]
    system.clock_events_api = False
    monkeypatch.delattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")  # a future nvidia-ml-py without it
    assert gpu.clock_event_reasons() is None


def test_energy_counter_follows_power_over_time(nvml, system):
    system.gpus[0].meter_update_s = 0  # an exact counter: this checks the arithmetic, not the meter's updates
    gpu = probe(nvml)[0]
    system.set_utilization(0, 100)
    before_mj = gpu.energy_mj()
    power_mw = gpu.power_mw()
    system.clock.advance(2.0)
    assert gpu.energy_mj() - before_mj == pytest.approx(power_mw * 2.0, abs=1)
    assert gpu.energy_j() == pytest.approx(gpu.energy_mj() / 1000.0)
    system.set_utilization(0, 0)
    idle_power_mw = gpu.power_mw()
    assert idle_power_mw < power_mw
    idle_start_mj = gpu.energy_mj()
    system.clock.advance(3.0)
    assert gpu.energy_mj() - idle_start_mj == pytest.approx(idle_power_mw * 3.0, abs=1)


def test_energy_counter_and_power_move_only_every_100_ms_as_a_real_h200s(nvml, system):
    """As recorded on an H200 (benchmarks/data/h200-meter): both hold between updates 100 ms apart; the power read is
    the mean over the last period."""
    system.gpus[0].meter_jitter_s = 0
    gpu = probe(nvml)[0]
    system.clock.now_s = 1000.0  # an update instant (multiples of 100 ms)
    system.set_utilization(0, 100)
    busy_mw = system.gpus[0].power_mw()
    start_mj = gpu.energy_mj()
    system.clock.advance(0.05)
    assert gpu.energy_mj() == start_mj  # held: no update yet
    system.clock.advance(0.049)
    assert gpu.energy_mj() == start_mj
    system.clock.advance(0.002)  # past 1000.1
    assert gpu.energy_mj() - start_mj == pytest.approx(busy_mw * 0.1, abs=1)
    system.clock.advance(0.05)  # 1000.151: half-way to 1000.2, the load stops
    system.set_utilization(0, 0)
    idle_mw = system.gpus[0].power_mw()
    assert gpu.power_mw() == pytest.approx(busy_mw, abs=1)  # the period 1000.0-1000.1, all busy
    system.clock.advance(0.05)  # 1000.201
    assert gpu.power_mw() == pytest.approx((busy_mw * 0.051 + idle_mw * 0.049) / 0.1, abs=1)
    assert gpu.energy_mj() - start_mj == pytest.approx(busy_mw * 0.151 + idle_mw * 0.049, abs=1)


def test_energy_on_a_gpu_without_a_counter_says_why(nvml, system):
    system.gpus[0].supports_energy = False
    with pytest.raises(BackendError, match="no energy counter"):
        probe(nvml)[0].energy_mj()


def test_utilization_and_clock_are_read(nvml, system):
    gpu = probe(nvml)[0]
    system.set_utilization(0, 37)
    reading = gpu.read()
    assert reading.load_pct == 37.0 and gpu.utilization_pct() == 37.0
    assert reading.cur_hz == gpu.supported_hz[-1]
    system.set_utilization(0, 0)
    assert gpu.read().cur_hz == system.gpus[0].idle_clock_mhz * MHZ


# ---- read-only handle (observe mode) ----
def test_a_read_only_handle_reads_but_refuses_every_change(nvml, system):
    gpu = probe(nvml, read_only=True)[0]
    system.set_utilization(0, 50)
    assert gpu.read().load_pct == 50.0 and gpu.energy_mj() >= 0 and gpu.snapshot().max_hz == gpu.supported_hz[-1]
    with pytest.raises(NvmlReadOnly):
        gpu.pin(gpu.levels_hz[0])
    with pytest.raises(NvmlReadOnly):
        gpu.restore(Limits(0, 10**12))
    with pytest.raises(NvmlReadOnly):
        ReadOnlyNvml(nvml).nvmlDeviceSetPowerManagementLimit(None, 1)
    assert system.writes() == []


# ---- which GPU a job names ----
def test_find_gpu_by_index_uuid_and_prefix(nvml, system):
    gpus = probe(nvml)
    uuid1 = system.gpus[1].uuid
    assert find_gpu(gpus, 1) is gpus[1]
    assert find_gpu(gpus, "0") is gpus[0]
    assert find_gpu(gpus, uuid1) is gpus[1]
    assert find_gpu(gpus, uuid1.lower()) is gpus[1]
    assert find_gpu(gpus, uuid1[:12]) is gpus[1]  # "GPU-00000001", unique


@pytest.mark.parametrize("key, message", [
    (2, "no GPU with index 2"), ("GPU-ffff", "no GPU named"), ("GPU-0000000", "matches several"),
    ("MIG-1234", "MIG instance"), (None, "names no GPU"), (True, "index or a UUID"),
])
def test_find_gpu_refuses_what_it_cannot_match(nvml, key, message):
    with pytest.raises(GpuNotFound, match=message):
        find_gpu(probe(nvml), key)


def test_find_gpu_without_a_key_takes_the_only_gpu(nvml, system):
    system.gpus = system.gpus[:1]
    gpus = probe(nvml)
    assert find_gpu(gpus, None) is gpus[0]


class _Props:
    def __init__(self, uuid):
        if uuid is not None:
            self.uuid = uuid


class _Cuda:
    """Stands in for torch.cuda on a machine with GPUs (this one has none), once the process has initialized CUDA."""

    def __init__(self, ordinal, uuid=None):
        self.ordinal, self.uuid = ordinal, uuid

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def current_device(self):
        return self.ordinal

    def get_device_properties(self, ordinal):
        return _Props(self.uuid)


class _Torch:
    def __init__(self, cuda):
        self.cuda = cuda


def test_visible_gpu_prefers_the_uuid_torch_reports():
    torch = _Torch(_Cuda(1, uuid="8f1c2d3e-0000-1111-2222-333344445555"))
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "2,3"}, torch) == "GPU-8f1c2d3e-0000-1111-2222-333344445555"


def _no_driver(cuda_ordinal):
    return None


def test_visible_gpu_maps_the_current_device_through_cuda_visible_devices():
    """A torch before 2.4 and a driver that cannot tell: the environment's entry, CUDA's numbering."""
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}, _Torch(_Cuda(1)), _no_driver) == "GPU-bbb"
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "2,3"}, _Torch(_Cuda(0)), _no_driver) == "2"
    assert visible_gpu({}, _Torch(_Cuda(3)), _no_driver) == "3"


def test_visible_gpu_asks_the_driver_when_torch_has_no_uuid():
    """Inside a Slurm cgroup the job's only GPU is CUDA's 0 whatever NVML calls it: a torch before 2.4 has no UUID
    to give, so the driver's is sent, never the renumbered index."""
    asked = []

    def driver(cuda_ordinal):
        asked.append(cuda_ordinal)
        return "GPU-8f1c2d3e-0000-1111-2222-333344445555"

    uuid = visible_gpu({"CUDA_VISIBLE_DEVICES": "0"}, _Torch(_Cuda(0)), driver)
    assert uuid == "GPU-8f1c2d3e-0000-1111-2222-333344445555"
    assert asked == [0]
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "0"}, _Torch(_Cuda(0, uuid="8f1c")), driver) == "GPU-8f1c"
    assert asked == [0]  # torch's own answer first


def test_a_launcher_names_its_commands_gpu_by_the_drivers_uuid():
    """`ftgov run` runs no CUDA: a number in CUDA_VISIBLE_DEVICES is CUDA's (inside a Slurm job Slurm's, or the
    cgroup's 0 whichever GPU it is), not NVML's index, so it asks the driver for CUDA's device 0."""
    from governor.client.features import launched_gpu

    asked = []

    def driver(cuda_ordinal):
        asked.append(cuda_ordinal)
        return "GPU-8f1c2d3e-0000-1111-2222-333344445555"

    assert launched_gpu({"CUDA_VISIBLE_DEVICES": "0"}, driver) == "GPU-8f1c2d3e-0000-1111-2222-333344445555"
    assert launched_gpu({}, driver) == "GPU-8f1c2d3e-0000-1111-2222-333344445555"
    assert asked == [0, 0]
    assert launched_gpu({"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}, driver) == "GPU-aaa"  # named as it is
    assert launched_gpu({"CUDA_VISIBLE_DEVICES": "-1"}, driver) is None  # CUDA shows the command no GPU
    assert asked == [0, 0]
    assert launched_gpu({"CUDA_VISIBLE_DEVICES": "MIG-abc"}, driver).startswith("GPU-8f1c")  # the driver's GPU
    assert launched_gpu({"CUDA_VISIBLE_DEVICES": "MIG-abc"}, _no_driver) == "MIG-abc"  # the daemon says why not
    assert launched_gpu({"CUDA_VISIBLE_DEVICES": "3"}, _no_driver) == "3"  # no driver: the number, as before
    assert launched_gpu({}, _no_driver) is None


class _LibCuda:
    """libcuda as ctypes loads it: each call writes through its pointer arguments and returns a CUresult."""

    def __init__(self, uuid: bytes, results=(0, 0, 0)):
        self.uuid, self.results, self.ordinals = uuid, results, []

    def cuInit(self, flags):  # noqa: N802 (the driver's names)
        return self.results[0]

    def cuDeviceGet(self, device_ref, ordinal):  # noqa: N802
        self.ordinals.append(ordinal)
        device_ref._obj.value = 40 + ordinal
        return self.results[1]

    def cuDeviceGetUuid(self, raw, device):  # noqa: N802
        assert device.value == 40 + self.ordinals[-1]
        raw[:] = list(self.uuid)
        return self.results[2]


def test_driver_gpu_uuid_reads_libcuda():
    from governor.client.features import driver_gpu_uuid

    lib = _LibCuda(bytes.fromhex("8f1c2d3e00001111222233334444abcd"))
    assert driver_gpu_uuid(2, lambda name: lib) == "GPU-8f1c2d3e-0000-1111-2222-33334444abcd"
    assert lib.ordinals == [2]
    for results in ((3, 0, 0), (0, 101, 0), (0, 0, 999)):  # not initialized, invalid device, unknown error
        assert driver_gpu_uuid(0, lambda name, r=results: _LibCuda(b"\x01" * 16, r)) is None
    assert driver_gpu_uuid(0, lambda name: _LibCuda(bytes(16))) is None

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    assert driver_gpu_uuid(0, no_driver) is None
    assert driver_gpu_uuid(0, lambda name: object()) is None  # a libcuda without cuDeviceGetUuid


def test_visible_gpu_from_the_environment_alone():
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "5"}) == "5"
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "-1"}) is None  # no GPU visible
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "4,junk,6"}, _Torch(_Cuda(1)), _no_driver) is None  # CUDA stops at junk
    assert visible_gpu({}) is None


def test_visible_gpu_with_a_cpu_only_torch_is_none():
    import torch  # here, not at the top: importing torch costs seconds that only this test needs

    assert not torch.cuda.is_available()  # this machine: CPU torch
    assert visible_gpu({}, torch) is None


# ---- the fake keeps to the real module's names ----
def test_the_fake_has_the_real_names_signatures_and_codes(nvml):
    real_spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if p != str(FAKE_DIR)])
    assert real_spec is not None and real_spec.origin != nvml.__file__, "nvidia-ml-py must be installed"
    real = importlib.util.module_from_spec(real_spec)
    # The real module builds its error classes on sys.modules["pynvml"], so it must be that while it loads. Loading
    # it reads no library: that happens in nvmlInit.
    sys.modules["pynvml"] = real
    try:
        real_spec.loader.exec_module(real)
    finally:
        sys.modules["pynvml"] = nvml
    for name in dir(nvml):
        value = getattr(nvml, name)
        if name.startswith("nvml") and callable(value) and not name.startswith("nvmlClocks"):
            assert hasattr(real, name), f"{name} is not in nvidia-ml-py"
            fake_params = list(inspect.signature(value).parameters)
            real_params = list(inspect.signature(getattr(real, name)).parameters)
            assert fake_params == real_params[:len(fake_params)], name
        elif name.startswith(("NVML_", "nvmlClocks")):
            assert getattr(real, name) == value, name
        elif name.startswith("NVMLError_"):
            assert getattr(real, name).__name__ == name
            assert value(0).value == getattr(real, name)(0).value  # the code each class carries


# ---- scripts/nvml_observe.py, end to end on the CPU against the fake NVML ----
SCRIPT = REPO / "scripts" / "nvml_observe.py"
TINY = ["--device", "cpu", "--arch", "gpt2", "--layers", "2", "--hidden", "64", "--heads", "2", "--vocab", "500",
        "--seq-len", "32", "--batch", "2", "--warmup-steps", "1", "--idle-s", "0.3", "--status-every", "2"]


def _observe(tmp_path, *args, gpu_util_pct=50):
    config = tmp_path / "fakenvml.json"
    # An exact counter: the segments (tenths of a second on the CPU) check the script's arithmetic, not the meter.
    config.write_text(json.dumps({"gpus": [{"util_gpu_pct": gpu_util_pct, "meter_update_s": 0}]}))
    calls = tmp_path / "calls.log"
    out = tmp_path / "out"
    env = dict(os.environ, FAKENVML_CONFIG=str(config), FAKENVML_LOG=str(calls),
               PYTHONPATH=os.pathsep.join([str(FAKE_DIR), str(SCRIPT.parent.parent)]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *TINY, *args], env=env,
                          capture_output=True, text=True, timeout=300)
    daemon_log = out / "ftgovd.log"
    assert proc.returncode == 0, proc.stderr[-4000:] + (daemon_log.read_text() if daemon_log.exists() else "")
    with open(out / "segments.csv") as f:
        segments = list(csv.DictReader(f))
    return out, segments, calls.read_text().split()


def test_observe_script_records_energy_per_step_through_the_daemon_and_changes_nothing(tmp_path):
    out, segments, calls = _observe(tmp_path, "--steps", "6", "--eval-every", "3", "--eval-steps", "2",
                                    "--checkpoint-every", "4", "--data-every", "5", "--data-tokens", "20000")
    assert [s for s in calls if s.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))] == []  # script and daemon
    assert "nvmlDeviceGetTotalEnergyConsumption" in calls
    phases = [s["phase"] for s in segments]
    assert phases.count("train") == 6 and {"idle", "eval", "checkpoint", "data"} <= set(phases)
    # The fake H200 at 50% load and its top clock draws 90 W + 0.5 x 560 W = 370 W: energy per segment / its
    # duration must give that back, which checks the mJ counter, the deltas and the units end to end.
    train = [s for s in segments if s["phase"] == "train"]
    power_w = sum(float(s["energy_j"]) for s in train) / sum(float(s["duration_s"]) for s in train)
    assert power_w == pytest.approx(370.0, rel=0.05)
    assert {s["graphics_mhz_end"] for s in train} == {"1980"}
    seen_by_daemon = {s["daemon_phase"] for s in segments if s["daemon_phase"]}
    assert {"train", "eval", "checkpoint", "data"} <= seen_by_daemon
    assert any(s["daemon_cur_mhz"] == "1980.0" and s["daemon_load_pct"] == "50.0" for s in segments)
    summary = (out / "summary.md").read_text()
    assert "policy `observe`" in summary and "| 700.0 | 700.0 | True |" in summary
    run = json.loads((out / "run.json").read_text())
    assert len(run["supported_graphics_mhz"]) == 110 and run["daemon"]["exit_code"] == 0


def test_observe_script_without_the_daemon_reads_nvml_alone(tmp_path):
    out, segments, calls = _observe(tmp_path, "--steps", "2", "--eval-every", "0", "--checkpoint-every", "0",
                                    "--data-every", "0", "--daemon", "off", gpu_util_pct=0)
    assert [s for s in calls if s.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))] == []
    assert [s["phase"] for s in segments] == ["idle", "train", "train"]
    idle_power_w = float(segments[0]["energy_j"]) / float(segments[0]["duration_s"])
    assert idle_power_w == pytest.approx(90.0, rel=0.05)  # the fake's idle draw
    assert not (out / "ftgovd.log").exists() and "Not run: --daemon off" in (out / "summary.md").read_text()


def test_an_nvml_gpus_identity_goes_into_the_store(nvml, system, tmp_path):
    # The store keeps the driver version as text; a backend that reports none gives None.
    from governor.daemon.recorder import board_identity
    from governor.store.measurements import JobRecord, Store
    from governor.sysfs import Root

    identity = board_identity(Root(tmp_path), probe(nvml)[0])
    assert isinstance(identity["driver"], str) and identity["backend"] == "nvml"
    store = Store(tmp_path / "s.sqlite")
    store.add(JobRecord(ended_at=1.0, model_type="decoder", num_layers=12, hidden_size=768, seq_len=128.0, **identity))
    assert store.totals()["jobs"] == 1


@pytest.mark.parametrize("tool_sets_power", [False, True], ids=["clock-reset", "clock-and-power"])
def test_standing_down_gives_back_the_power_cap_the_pin_set_unless_the_tool_set_it_too(nvml, system, tool_sets_power):
    """on_external_change: stand_down leaves the clocks to the tool that reset them; the power limit our pin set is
    ours (a clock reset leaves it), so it goes back, or it would outlive every job."""
    from governor.daemon.gpupin import GpuPin
    from governor.daemon.powermode import PowerModeCap

    gpu = probe(nvml)[0]
    pins: dict = {}
    pins[gpu.id] = pin = GpuPin(gpu, PowerModeCap(pins, False), lambda: None)
    pin.set(gpu.levels_hz[3], 450_000)
    assert system.gpus[0].power_limit_mw == 450_000 and system.gpus[0].locked_mhz is not None
    nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByIndex(0))  # another tool's reset
    if tool_sets_power:
        nvml.nvmlDeviceSetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(0), 500_000)
    pin.stand_down()
    assert system.gpus[0].power_limit_mw == (500_000 if tool_sets_power else 700_000)
    assert system.gpus[0].locked_mhz is None and pin.baseline is None and pin.stood_down


def test_a_probe_again_fails_a_gpu_whose_call_is_still_stuck_at_once_without_another_thread(nvml, system, tmp_path):
    """The daemon probes again every probe_retry_s while it has no GPU (a node whose only GPU does not answer). Each
    probe gave that GPU a worker of its own: one more thread blocked on it for good, and the event loop waiting out
    its deadline again, at every probe. The GPU's worker is the process's, as NVML's handles are: a probe again
    fails it at once while its call is stuck."""
    import threading
    import time

    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"gpus": {"0": {"hang_s": {"*": 3}}}}))
    system.faults_path = str(faults)
    assert [g.id for g in probe(nvml, call_timeout_s=0.2)] == ["1"]
    threads = threading.active_count()
    started = time.monotonic()
    assert [g.id for g in probe(nvml, call_timeout_s=0.2)] == ["1"]
    assert time.monotonic() - started < 0.2
    assert threading.active_count() == threads
