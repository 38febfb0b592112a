"""governor.daemon.checks: what watches a held pin (another tool's change, a throttled clock, the pin check)."""

from __future__ import annotations

import sys

from governor.backends.base import Limits, Reading
from governor.daemon import checks
from governor.daemon.gpupin import GpuPin
from governor.daemon.powermode import PowerModeCap
from tests.daemon.test_controller import BASELINE, LEVELS, FakeGpu

PIN = LEVELS[2]


class ClockGpu(FakeGpu):
    """Its clock reads ``cur_hz`` (the fake's max otherwise)."""

    cur_hz: int | None = None

    def read(self) -> Reading:
        cur = self.cur_hz if self.cur_hz is not None else self.limits.max_hz
        return Reading(self.limits.min_hz, self.limits.max_hz, cur, 50.0)


def pinned(saves: list) -> GpuPin:
    gpu = ClockGpu()
    pins: dict[str, GpuPin] = {}
    pins[gpu.id] = pin = GpuPin(gpu, PowerModeCap(pins), lambda: saves.append((pin.baseline, pin.pinned_hz)))
    pin.set(PIN, None)
    return pin


def test_a_pin_that_holds_is_not_a_change():
    pin = pinned([])
    assert not checks.limits_changed(pin, reapply=True) and pin.pinned_hz == PIN and pin.baseline == BASELINE


def test_limits_changed_under_the_pin_become_the_baseline_when_reapplying():
    pin = pinned([])
    pin.gpu.limits = Limits(LEVELS[0], LEVELS[1])  # nvpmodel: a 612 MHz cap
    assert checks.limits_changed(pin, reapply=True)
    assert pin.pinned_hz is None and pin.baseline == Limits(LEVELS[0], LEVELS[1]) and not pin.stood_down


def test_limits_changed_under_the_pin_stand_it_down_otherwise():
    saves: list = []
    pin = pinned(saves)
    pin.gpu.limits = Limits(LEVELS[0], LEVELS[1])  # nvpmodel: a 612 MHz cap
    assert checks.limits_changed(pin, reapply=False)
    assert pin.stood_down and pin.baseline is None and pin.pinned_hz is None and saves[-1] == (None, None)
    assert not checks.limits_changed(pin, reapply=False)  # stood down: nothing more to watch


def test_a_clock_below_the_pin_is_throttled_from_the_second_read_and_until_it_comes_back():
    pin = pinned([])
    pin.gpu.cur_hz = LEVELS[0]
    checks.limits_changed(pin, reapply=True)
    assert pin.throttled_hz is None  # one read may catch the clock on its way to the pin
    checks.limits_changed(pin, reapply=True)
    assert pin.throttled_hz == LEVELS[0]
    pin.gpu.cur_hz = PIN
    checks.limits_changed(pin, reapply=True)
    assert pin.throttled_hz is None


def test_the_pin_check_of_an_idle_gpu_pins_at_its_clock_and_restores_after_saving_first():
    saves: list = []
    gpu = ClockGpu()
    pins: dict[str, GpuPin] = {}
    pins[gpu.id] = pin = GpuPin(gpu, PowerModeCap(pins), lambda: saves.append((pin.baseline, pin.pinned_hz)))
    gpu.cur_hz = LEVELS[3]
    result = checks.pin_check(pin)
    assert result == {"ok": True, "wrote": True, "pinned_hz": LEVELS[3],
                      "detail": "pinned at the current 918 MHz and restored"}
    assert gpu.writes == [LEVELS[3], None] and saves == [(BASELINE, LEVELS[3]), (None, None)]
    assert checks.pin_check(pinned([]))["wrote"] is False  # pinned for jobs: checked by reading


def test_pin_check_on_an_nvml_gpu_that_cannot_lock_leaves_no_restore_to_retry(monkeypatch):
    """NVML's ResetGpuLockedClocks answers NOT_SUPPORTED where SetGpuLockedClocks does: the check's pin fails, and
    its restore must not then be left failing (and retried on every tick) for a lock that cannot exist."""
    from tests.support import FAKENVML_DIR

    monkeypatch.syspath_prepend(str(FAKENVML_DIR))
    for name in [k for k in sys.modules if k == "pynvml" or k.startswith("pynvml.")]:
        monkeypatch.delitem(sys.modules, name)
    import pynvml

    from governor.backends.nvml import probe

    try:
        system = pynvml.fake_reset(pynvml.FakeSystem(gpus=pynvml.default_gpus(1), clock=pynvml.ManualClock()))
        system.gpus[0].supports_locking = False
        gpu = probe(pynvml)[0]
        pins: dict = {}
        pins[gpu.id] = pin = GpuPin(gpu, PowerModeCap(pins), lambda: None)
        result = checks.pin_check(pin)
        assert result["ok"] is False and "cannot lock its clocks" in result["detail"]
        assert not pin.restore_failed and pin.baseline is None
    finally:
        for name in [k for k in sys.modules if k == "pynvml" or k.startswith("pynvml.")]:
            del sys.modules[name]
