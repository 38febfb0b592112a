"""The checks that watch a GPU's pin once held: limits changed under it by another tool (nvpmodel, jetson_clocks), a
clock throttled below it, and the pin check `ftgov doctor` asks for. The controller calls them on its tick and
on request; they act on one GpuPin (governor.daemon.gpupin)."""

from __future__ import annotations

import logging

from governor.backends.base import Limits
from governor.daemon.gpupin import GpuPin
from governor.errors import BackendError, CannotPin, FtgovError, StateError
from governor.units import mhz

log = logging.getLogger("ftgovd")

# A clock this far below the pin is throttled: a devfreq clock reads its level exactly (1%: rounding to kHz).
CLOCK_SLACK = 0.01
THROTTLED_READS = 2


def limits_changed(pin: GpuPin, reapply: bool) -> bool:
    """Read the limits under the pin. True when another tool changed them: with ``reapply`` the baseline becomes
    what it set and pinned_hz None (the caller writes the pin again, under the new cap); otherwise the pin stands
    down. A pin that holds has its clock checked for throttling instead (False)."""
    if pin.pinned_hz is None or pin.baseline is None or pin.stood_down:  # a pin always has its baseline
        pin.throttled_hz, pin.below_pin_reads = None, 0
        return False
    gid = pin.gpu.id
    try:
        now = pin.gpu.read()
        holds = pin.gpu.pin_holds(now)
    except BackendError as e:
        if pin.read_error != str(e):  # said when it first comes and when it changes, not on every tick it lasts
            log.warning("GPU %s: cannot read limits to check the pin: %s", gid, e)
        pin.read_error = str(e)
        return False
    if pin.read_error is not None:
        pin.read_error = None
        log.info("GPU %s: its limits read again", gid)
    if holds:
        check_clock(pin, now.cur_hz)
        return False
    if pin.restore_failed:
        # A write of ours failed (the tick retries it): the limits read our last pin, or half of this one. Taken for
        # another tool's, our old pin became the baseline's max (reapply) or stayed on the GPU for good (stand_down).
        return False
    log.warning("GPU %s: limits changed under our pin of %s (now min %s max %s, clock %s): nvpmodel, "
                "jetson_clocks or another tool? %s", gid, mhz(pin.pinned_hz), mhz(now.min_hz),
                mhz(now.max_hz), mhz(now.cur_hz, none="no pin"),
                "Re-applying" if reapply else "Standing down until the jobs end",
                extra={"FREQ_HZ": pin.pinned_hz})
    if reapply:
        # What the tool set is what the jobs' end restores (not undone), and its max is the cap from now on.
        pin.baseline = after_external_change(pin.baseline, now.min_hz, now.max_hz, pin.pinned_hz)
        log.info("GPU %s: the jobs' end restores %s..%s, what it set", gid, mhz(pin.baseline.min_hz),
                 mhz(pin.baseline.max_hz))
        pin.pinned_hz = None  # the limits no longer read our pin: the pin is written again, under the cap
    else:
        pin.stand_down()
    return True


def check_clock(pin: GpuPin, cur_hz: int | None) -> None:
    """Under a pin that holds, the clock itself can sit below it (L4T's thermal throttling; on NVML, a power or
    thermal cap; no pin: nothing to check): logged when it starts and when it ends, and shown in status. A tuned
    job's windows go on (what a pin costs under the board's throttling is what the job gets for it; a throttle that
    lasts, a power-limited top clock say, must not stall the search). A plain test tree, whose cur_freq never
    follows a pin, reads as throttled too: only a board (or the running simulated one) tells."""
    gid, pinned_hz = pin.gpu.id, pin.pinned_hz
    if pinned_hz is None:
        return
    below = cur_hz is not None and cur_hz < pinned_hz * (1 - CLOCK_SLACK)
    pin.below_pin_reads = pin.below_pin_reads + 1 if below else 0
    # Two ticks in a row: one read right after our own pin write may catch the clock still on its way (a CI run
    # of the simulated board read 408 MHz under a 612 MHz pin written 1 ms before).
    throttled = pin.below_pin_reads >= THROTTLED_READS
    if throttled and pin.throttled_hz is None:
        log.warning("GPU %s runs at %s under its pin of %s: thermal throttling or a power cap? Energy measured "
                    "meanwhile is that clock's", gid, mhz(cur_hz), mhz(pinned_hz),
                    extra={"FREQ_HZ": pinned_hz, "CUR_HZ": cur_hz})
    elif not throttled and pin.throttled_hz is not None:
        log.info("GPU %s runs at its pin of %s again", gid, mhz(pinned_hz), extra={"FREQ_HZ": pinned_hz})
    pin.throttled_hz = cur_hz if throttled else None


def pin_check(pin: GpuPin) -> dict:
    """Show that the GPU can be pinned, without moving its clock (for `ftgov doctor`). A GPU pinned for jobs is
    checked by reading (the pin holds); an idle one is pinned at the level it runs at now and restored at once,
    through the same save-before-write path as a job's pin."""
    if pin.stood_down:
        return {"ok": False, "wrote": False, "detail": "stood down: another tool changed the limits under a pin"}
    if pin.restore_failed:
        return {"ok": False, "wrote": False, "detail": "a restore failed and is being retried: see the journal"}
    if pin.cannot_pin is not None:
        return {"ok": False, "wrote": False,
                "detail": f"cannot be pinned, so its jobs run as observe: {pin.cannot_pin}"}
    # The reads come before any write: one that fails (a GPU off the bus, a devfreq node gone) fails this GPU's
    # check alone. Raised, it failed the whole check, every other GPU's answer with it, on the node an operator runs
    # `ftgov doctor` on because a GPU is in trouble.
    try:
        return _checked(pin)
    except BackendError as e:
        return {"ok": False, "wrote": False, "detail": f"cannot be read: {e}"}


def _checked(pin: GpuPin) -> dict:
    if pin.pinned_hz is not None:
        holds = pin.gpu.pin_holds()
        return {"ok": holds, "wrote": False, "pinned_hz": pin.pinned_hz,
                "detail": f"pinned for jobs at {mhz(pin.pinned_hz)}; "
                          + ("the pin holds" if holds else "the limits no longer read the pin")}
    if (held := pin.gpu.foreign_lock()) is not None:
        # NVML cannot read a lock back: the check's restore would reset it to the driver's default.
        return {"ok": False, "wrote": False,
                "detail": f"not checked: {held}; the check's restore would reset it (NVML cannot read a lock back), "
                          f"and so will the end of ftgovd's jobs on this GPU: remove it (sudo nvidia-smi -i "
                          f"{pin.gpu.id} -rgc) or run ftgovd with policy observe"}
    reading = pin.gpu.read()
    now_hz = reading.cur_hz if reading.cur_hz is not None else reading.max_hz
    # Within the limits in force (another tool's min = max included), the level nearest the clock now.
    allowed = [hz for hz in pin.gpu.levels_hz if reading.min_hz <= hz <= reading.max_hz] or pin.gpu.levels_hz
    level = min(allowed, key=lambda hz: abs(hz - now_hz))
    pin.baseline, pin.pinned_hz = pin.gpu.snapshot(), level
    try:
        pin.save_state()  # before the write, as for a job: a crash in between still finds the baseline
    except StateError as e:  # nothing written, as a job's pin would not be: no pin of ours to show or restore
        pin.baseline, pin.pinned_hz = None, None
        return {"ok": False, "wrote": False, "detail": f"not checked: {e}; no job can be pinned until it can be"}
    result: dict = {"ok": True, "wrote": True, "pinned_hz": level}
    log.info("GPU %s: pin check: pinning at the current %s, restoring at once", pin.gpu.id, mhz(level))
    try:
        pin.gpu.pin(level)
        result["detail"] = f"pinned at the current {mhz(level)} and restored"
    except CannotPin as e:  # nothing was written: there is nothing to restore (the baseline goes unwritten)
        pin.refused(e, first=True)
        result.update(ok=False, wrote=False, detail=f"pin at {mhz(level)} refused as every pin would be, so its jobs "
                      f"run as observe (measured, never pinned) until ftgovd restarts: {e}")
    except FtgovError as e:
        result.update(ok=False, detail=f"pin at {mhz(level)} failed: {e}")
    try:
        pin.restore()
    except BackendError as e:  # restore() marked it: the tick retries, as after a job
        result.update(ok=False, detail=f"{result['detail']}; restore failed: {e} (retrying)")
    (log.info if result["ok"] else log.warning)("GPU %s: pin check: %s", pin.gpu.id, result["detail"])
    return result


def after_external_change(baseline: Limits, min_hz: int, max_hz: int, pinned_hz: int) -> Limits:
    """The limits to restore once another tool (nvpmodel, jetson_clocks) changed the limits read under our pin of
    pinned_hz to min_hz..max_hz: the bounds it wrote are its, the others stay the baseline's. They all write the
    same one request (the kernel keeps one user request for all of them), so a bound that still reads our pin
    was not written; and a min that reads as the max may be the kernel's clamp of our min under a lowered max
    (min := max when they cross), so the baseline's min is kept there, under the new max. The power limit (an
    NVML extra) stays the baseline's."""
    new_max = max_hz if max_hz != pinned_hz else baseline.max_hz
    new_min = min_hz if min_hz != pinned_hz and min_hz < max_hz else min(baseline.min_hz, new_max)
    return Limits(new_min, new_max, baseline.extra)
