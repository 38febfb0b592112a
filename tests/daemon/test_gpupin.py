"""governor.daemon.gpupin: one GPU's pin, with a fake GPU (no daemon, no files but a counter of saves)."""

from __future__ import annotations

import pytest

from governor.backends.base import Limits
from governor.daemon.gpupin import GpuPin
from governor.daemon.powermode import PowerModeCap
from governor.errors import BackendError
from tests.daemon.test_controller import BASELINE, LEVELS, FakeGpu


class Recording(FakeGpu):
    """Writes go into ``events`` next to the saves, so the order of save and write shows."""

    def __init__(self, events: list):
        super().__init__()
        self.events = events

    def pin(self, freq_hz: int) -> None:
        self.events.append(("pin", freq_hz))
        super().pin(freq_hz)

    def restore(self, limits: Limits) -> None:
        if self.fail_pins:
            raise BackendError("the fake cannot restore")
        self.events.append(("restore", limits))
        super().restore(limits)


def pin_of(gpu, events: list, pin_above: bool = False) -> GpuPin:
    pins: dict[str, GpuPin] = {}
    pins[gpu.id] = GpuPin(gpu, PowerModeCap(pins, pin_above),
                          lambda: events.append(("save", pins[gpu.id].baseline, pins[gpu.id].pinned_hz)))
    return pins[gpu.id]


def test_the_first_pin_saves_the_baseline_before_it_writes_and_a_restore_gives_it_back():
    events: list = []
    gpu = Recording(events)
    pin = pin_of(gpu, events)
    assert pin.set(LEVELS[2], None)
    assert events == [("save", BASELINE, LEVELS[2]), ("pin", LEVELS[2])]
    assert not pin.set(LEVELS[2], None) and len(events) == 2  # held already: nothing written, nothing saved
    assert pin.set(None, None)
    assert events[2:] == [("restore", BASELINE), ("save", None, None)]
    assert gpu.limits == BASELINE and pin.baseline is None and not pin.restore_failed


def test_a_pin_stays_under_the_power_modes_cap_unless_pin_above_allows_it():
    events: list = []
    gpu = Recording(events)
    gpu.limits = Limits(LEVELS[0], LEVELS[1])  # a power mode capped at 612 MHz
    assert pin_of(gpu, events).set(LEVELS[-1], None) and gpu.limits == Limits(LEVELS[1], LEVELS[1])
    other = Recording([])
    other.limits = Limits(LEVELS[0], LEVELS[1])
    assert pin_of(other, [], pin_above=True).set(LEVELS[-1], None) and other.limits.max_hz == LEVELS[-1]


def test_a_failed_restore_is_marked_for_retry_and_saved():
    events: list = []
    gpu = Recording(events)
    pin = pin_of(gpu, events)
    pin.set(LEVELS[2], None)
    gpu.fail_pins = 1
    with pytest.raises(BackendError):
        pin.set(None, None)
    assert pin.restore_failed and pin.baseline == BASELINE and events[-1] == ("save", BASELINE, LEVELS[2])
    gpu.fail_pins = 0
    assert pin.set(None, None) and gpu.limits == BASELINE and not pin.restore_failed


def test_a_cap_outside_the_gpus_range_is_not_tried_again_but_a_reloaded_cap_is():
    """CapOutOfRange marks that value alone: the same cap is not tried at the next first pin, another one (a config
    reloaded with a cap the GPU allows) is, and takes; a GPU that refuses every limit (CannotCap) is not asked again."""
    from governor.errors import CannotCap, CapOutOfRange

    class Capped(FakeGpu):
        has_power_cap = True

        def __init__(self, refuse):
            super().__init__()
            self.refuse, self.asked = refuse, []

        def set_power_cap_mw(self, power_mw: int) -> None:
            self.asked.append(power_mw)
            if (error := self.refuse(power_mw)) is not None:
                raise error

    gpu = Capped(lambda mw: CapOutOfRange(f"{mw} outside") if mw > 350_000 else None)
    pin = pin_of(gpu, [])
    for cap_mw in (500_000, 500_000, 300_000):
        assert pin.set(LEVELS[2], cap_mw) and pin.set(None, None)
    assert gpu.asked == [500_000, 300_000] and pin.cannot_cap is None
    never = Capped(lambda mw: CannotCap("not supported"))
    pin = pin_of(never, [])
    for cap_mw in (500_000, 300_000):
        assert pin.set(LEVELS[2], cap_mw) and pin.set(None, None)
    assert never.asked == [500_000] and pin.cannot_cap == "not supported"
