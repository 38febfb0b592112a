"""One GPU's pin: the baseline (its limits before our first pin), the pin it holds, and how a change is made.

A pin goes under the power mode's cap (governor.daemon.powermode), the state file is saved before the first write
(a crash in between still finds the baseline on disk), then the backend writes it (devfreq widens first, so min never
crosses max); None restores the baseline. What the pin should be is the controller's to say (its job table and
policy.combine); what watches a pin once held is governor.daemon.checks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from governor.backends.base import POWER_LIMIT_KEY, Gpu, Limits
from governor.daemon import logs
from governor.daemon.powermode import PowerModeCap
from governor.errors import BackendError, CannotCap, CannotPin, CapOutOfRange, FtgovError, StateError
from governor.units import mhz

log = logging.getLogger("ftgovd")


def without_power_limit(limits: Limits) -> Limits:
    """``limits`` with no power limit to put back: a restore of it leaves the power limit as it finds it."""
    return replace(limits, extra=tuple(kv for kv in limits.extra if kv[0] != POWER_LIMIT_KEY))


class GpuPin:
    """save_state(): the state save (governor.daemon.saving) (every GPU's pin and the jobs), made before every write.
    power_mode: the cap a pin stays under; it reads this GPU's baseline."""

    def __init__(self, gpu: Gpu, power_mode: PowerModeCap, save_state: Callable[[], None]):
        self.gpu = gpu
        self.power_mode = power_mode
        self.save_state = save_state
        self.baseline: Limits | None = None  # snapshot taken before our first pin; None while we hold nothing
        self.pinned_hz: int | None = None
        self.restore_failed = False
        # The last error of a write that failed (the tick retries it) and of a read of the limits under the pin:
        # each is logged when it first comes and when it changes, not on every tick it lasts.
        self.write_error: str | None = None
        self.read_error: str | None = None
        self.stood_down = False  # someone else changed the limits under our pin and config says let them be
        self.capped_mw: int | None = None  # the power limit our first pin set (NVML's power_cap_w), while it holds
        self.throttled_hz: int | None = None  # the clock read below our pin (thermal throttling, a power cap)
        self.below_pin_reads = 0  # consecutive ticks that read the clock below the pin
        # Why the GPU refused a lock as it refuses every lock (CannotPin: it cannot lock its clocks, or this process
        # may not): no pin is tried again while the daemon runs, and its jobs run as observe (the controller's).
        self.cannot_pin: str | None = None
        # Why the GPU refused the power cap as it refuses every power limit (CannotCap): its pins go on without one,
        # and no cap is tried again while the daemon runs.
        self.cannot_cap: str | None = None
        self.cap_out_of_range_mw: int | None = None  # the cap refused as outside the GPU's range (CapOutOfRange)

    def set(self, target_hz: int | None, power_cap_mw: int | None) -> bool:
        """Pin target_hz (under the power mode's cap), or restore the baseline for None; with the first pin,
        power_cap_mw where the GPU has a power limit. False: the GPU holds that already, nothing was written."""
        if target_hz is not None:
            target_hz = self._under_cap(target_hz)
        if target_hz == self.pinned_hz and not self.restore_failed:
            return False
        logs.flush()  # the hardware is touched next: the decision's lines go out first, should a write hang
        if target_hz is None:
            self.restore()
            return True
        first = self.baseline is None
        if first:
            if (held := self.gpu.foreign_lock()) is not None:
                log.warning("GPU %s: %s: the end of its jobs resets it to the driver's default (NVML cannot read a "
                            "lock back); remove it (sudo nvidia-smi -i %s -rgc) or run ftgovd with policy observe",
                            self.gpu.id, held, self.gpu.id)
            self.baseline = self.gpu.snapshot()  # an NVML snapshot carries the power limit to restore
            if not self._caps(power_cap_mw):
                # No cap of ours: the limit is someone else's (an operator's nvidia-smi -pl while the job runs), and
                # no restore (the job's end, the next start, `ftgov restore`) may set it back.
                self.baseline = without_power_limit(self.baseline)
            if self.baseline.min_hz is not None and self.baseline.min_hz == self.baseline.max_hz:
                # Nothing governs a clock held at one level: jetson_clocks, or a pin whose holder is gone (a crashed
                # ftgovd whose state file could not be read, a killed characterize). It is what every job's end puts
                # back, and its max caps every pin: said once a pin, where the operator looks.
                log.warning("GPU %s: its limits read min = max = %s before this pin: another tool holds the clock "
                            "(jetson_clocks, or a pin whose holder is gone); it is the baseline each job's end puts "
                            "back, and no pin goes above it. 'ftgov doctor' says how to free it", self.gpu.id,
                            mhz(self.baseline.min_hz))
            target_hz = self._under_cap(target_hz)
        held_hz = self.pinned_hz
        self.pinned_hz, self.below_pin_reads = target_hz, 0  # a read under the old pin is not one under this one
        try:
            self.save_state()  # before the write: a crash now still finds the baseline on disk
        except StateError:
            # Nothing was written: the GPU holds what it held (nothing of ours before a first pin), and the tick
            # tries again whoever asked (a tuner's move too).
            self.pinned_hz, self.restore_failed = held_hz, True
            if first:
                self.baseline = None
            raise
        try:
            self.gpu.pin(target_hz)
        except CannotPin as e:
            self.refused(e, first=first)
            raise
        except BackendError:
            # Retried on the tick whoever asked (a tuner's move too), and meanwhile not checked as a pin that holds
            # (checks.limits_changed): the limits read our last pin, or half of this one.
            self.restore_failed = True
            raise
        if first and power_cap_mw is not None and self._caps(power_cap_mw):
            try:
                self.gpu.set_power_cap_mw(power_cap_mw)
                self.capped_mw, self.cannot_cap, self.cap_out_of_range_mw = power_cap_mw, None, None
            except CannotCap as e:  # the clock pin stands: the cap is what the GPU refuses, not the pin
                self._cap_refused(e, power_cap_mw)
        self.restore_failed, self.write_error = False, None
        log.info("GPU %s pinned to %s", self.gpu.id, mhz(target_hz), extra={"FREQ_HZ": target_hz})
        return True

    def refused(self, e: CannotPin, *, first: bool) -> None:
        """The GPU refused a lock as it refuses every lock: said once, with what the operator can do, and remembered
        (cannot_pin) so that no pin is tried again. ``first``: the refused lock was the first of ours, so nothing of
        ours is on the GPU (the lock was refused, the power cap comes after it): the baseline goes without a write,
        which under NO_PERMISSION would fail as the lock did and be retried on every tick. Otherwise an earlier pin
        of ours may stand, and the baseline stays for the restore that follows."""
        if self.cannot_pin is None:
            log.warning("GPU %s cannot be pinned: %s. ftgovd will not try again while it runs: its jobs run as "
                        "observe there (measured, never pinned; `ftgov status` shows it). If this GPU should be "
                        "pinned, fix the cause and restart ftgovd; if it never can, policy: observe in the config says "
                        "so from the start", self.gpu.id, e)
        self.cannot_pin = str(e)
        if first:
            self.baseline, self.pinned_hz, self.capped_mw = None, None, None
            self.save_state()

    def _caps(self, power_cap_mw: int | None) -> bool:
        """Whether a first pin sets the power cap: one is configured, and the GPU has not refused every limit, nor
        this one as outside its range (a reloaded config's other cap is tried)."""
        if power_cap_mw is None or not self.gpu.has_power_cap:
            return False
        if self.cap_out_of_range_mw is not None:
            return power_cap_mw != self.cap_out_of_range_mw
        return self.cannot_cap is None

    def _cap_refused(self, e: CannotCap, power_cap_mw: int) -> None:
        """The GPU refused the power cap as it refuses every limit: nothing was written, so the baseline has no power
        limit to put back (a restore would be refused alike, and retried on every tick); said once, remembered."""
        if isinstance(e, CapOutOfRange):  # this value only: a reloaded config's other cap is tried (``_caps``)
            log.warning("GPU %s: power_cap_w (%s W) is not applied: %s. Its pins go on without it, and this cap is not "
                        "tried there again (`ftgov status` shows it); a reload with a power_cap_w within its range "
                        "tries that one", self.gpu.id, f"{power_cap_mw / 1000:g}", e)
        else:
            log.warning("GPU %s: its power limit cannot be set: %s. Its pins go on without power_cap_w (%s W), and "
                        "ftgovd will not try again while it runs (`ftgov status` shows it); if it should be capped, "
                        "fix the cause and restart ftgovd, else remove power_cap_w", self.gpu.id, e,
                        f"{power_cap_mw / 1000:g}")
        self.cannot_cap = str(e)
        self.cap_out_of_range_mw = power_cap_mw if isinstance(e, CapOutOfRange) else None
        if self.baseline is not None:
            self.baseline = without_power_limit(self.baseline)
            self.save_state()

    def _under_cap(self, target_hz: int) -> int:
        capped = self.power_mode.clamp(self, target_hz)
        if capped != target_hz and self.baseline is not None:  # a cap is the baseline's max: there is one
            log.warning("GPU %s: %s is above the power mode's cap %s: pinning %s", self.gpu.id, mhz(target_hz),
                        mhz(self.baseline.max_hz), mhz(capped), extra={"FREQ_HZ": capped})
        return capped

    def restore(self) -> None:
        """Write the baseline back; BackendError (marked restore_failed, for a retry) when that fails."""
        if self.baseline is None:  # nothing of ours on the GPU: nothing to retry either
            self.pinned_hz, self.restore_failed = None, False
            self.save_state()
            return
        try:
            self.gpu.restore(self.baseline)
        except BackendError:
            self.restore_failed = True
            self.save_state()
            raise
        log.info("GPU %s restored to its baseline %s..%s", self.gpu.id, mhz(self.baseline.min_hz),
                 mhz(self.baseline.max_hz))
        self.baseline, self.pinned_hz, self.restore_failed, self.capped_mw = None, None, False, None
        self.write_error = None
        self.save_state()

    def stand_down(self) -> None:
        """Another tool owns the clock limits now: forget our baseline so that we do not undo its change later. The
        power limit our pin set is ours alone (a clock reset does not touch it): put back while it still reads ours,
        else it would outlive every job (after a restart, no cap is known and none is put back)."""
        self._give_back_power_cap()
        self.stood_down, self.baseline, self.pinned_hz, self.capped_mw = True, None, None, None
        self.save_state()

    def _give_back_power_cap(self) -> None:
        before_mw = None if self.baseline is None else dict(self.baseline.extra).get(POWER_LIMIT_KEY)
        if self.capped_mw is None or before_mw is None or before_mw == self.capped_mw:
            return
        try:
            now_mw = dict(self.gpu.snapshot().extra).get(POWER_LIMIT_KEY)
            if now_mw != self.capped_mw:
                log.info("GPU %s: its power limit reads %s mW, not our cap of %s mW: left as the other tool set it",
                         self.gpu.id, now_mw, self.capped_mw)
                return
            self.gpu.set_power_cap_mw(before_mw)
        except FtgovError as e:
            log.warning("GPU %s: cannot put the power limit back to %s mW: %s", self.gpu.id, before_mw, e)
            return
        log.info("GPU %s: power limit back to %s mW", self.gpu.id, before_mw)
