"""The daemon's timers: the measurement tick while jobs run, the rails' sampler, STATUS= after changes, the systemd
watchdog.

Nothing here polls: the tick runs only while jobs are active or a restore waits for a retry, and goes quiet when
neither is true, so an idle daemon wakes only for the watchdog. The sampler runs while jobs are active on a board
with INA3221 rails: it reads them once per sensor refresh (hwmon update_interval), the one reading the jobs' energy
and their tuners' windows integrate, at instants that owe nothing to when steps end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.daemon.notify import Notifier
from governor.units import mhz

if TYPE_CHECKING:
    from governor.daemon.controller import Controller


def defer_on_loop(fn: Callable[[], None], delay_s: float) -> None:
    """The Controller's ``defer``: run fn on the running event loop after delay_s (next turn for 0)."""
    loop = asyncio.get_running_loop()
    if delay_s > 0:
        loop.call_later(delay_s, fn)
    else:
        loop.call_soon(fn)


# A STATUS= the reader's full queue dropped is sent again (the state then) after this, doubling up to the most: the
# last of a burst of changes (a job's end after a run of progress reports) has no later one to supersede it. Seen
# where the reader read late and its queue holds 10 datagrams (net.unix.max_dgram_qlen's default): the daemon's
# "0 job(s)" never came.
STATUS_RETRY_S = 0.1
STATUS_RETRY_MAX_S = 5.0


class Ticker:
    """A listener of the Controller (``changed``): schedules the tick and one STATUS= per loop turn."""

    def __init__(self, notifier: Notifier, sample_interval_s: float):
        self.notifier = notifier
        self.sample_interval_s = sample_interval_s
        self._tick: asyncio.TimerHandle | None = None
        self._sampler: asyncio.TimerHandle | None = None
        self._status_pending = False
        self._retry: asyncio.TimerHandle | None = None
        self._retry_s = STATUS_RETRY_S

    def changed(self, ctl: Controller) -> None:
        # One STATUS= per event-loop turn, however many changes a burst of requests made in it.
        loop = asyncio.get_running_loop()
        if not self._status_pending:
            self._status_pending = True
            loop.call_soon(self._send_status, ctl)
        busy = ctl.busy()
        if self._tick is None and (busy or ctl.pending_restores()):
            self._tick = loop.call_later(self.sample_interval_s, self._on_tick, ctl)
        if busy:
            self._schedule_sampler(ctl)

    def set_interval(self, sample_interval_s: float, ctl: Controller) -> None:
        """A reload's sample_interval_s, from now: a tick already scheduled at the old interval (up to an hour) is
        scheduled again at the new one."""
        self.sample_interval_s = sample_interval_s
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
            self.changed(ctl)

    def _schedule_sampler(self, ctl: Controller) -> None:
        """While jobs or scheduler holds run (the caller checks): the rails' sampler, at the sensors' refresh."""
        refresh_s = ctl.energy.refresh_s
        if self._sampler is None and refresh_s:
            self._sampler = asyncio.get_running_loop().call_later(refresh_s, self._on_sample, ctl)

    def _on_sample(self, ctl: Controller) -> None:
        self._sampler = None
        ctl.sample_energy()
        if ctl.busy():
            self._schedule_sampler(ctl)

    def _send_status(self, ctl: Controller) -> None:
        self._status_pending = False
        if self.notifier.status(status_line(ctl)):
            self._retry_s = STATUS_RETRY_S
        elif self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(self._retry_s, self._resend_status, ctl)
            self._retry_s = min(2 * self._retry_s, STATUS_RETRY_MAX_S)

    def _resend_status(self, ctl: Controller) -> None:
        self._retry = None
        self._send_status(ctl)

    def _on_tick(self, ctl: Controller) -> None:
        self._tick = None
        ctl.tick()
        self.changed(ctl)

    def start_watchdog(self) -> None:
        if self.notifier.watchdog_s:
            self.notifier.watchdog()
            asyncio.get_running_loop().call_later(self.notifier.watchdog_s / 3, self.start_watchdog)

    def stop(self) -> None:
        for timer in (self._tick, self._sampler, self._retry):
            if timer is not None:
                timer.cancel()
        self._tick = self._sampler = self._retry = None


def status_line(ctl: Controller) -> str:
    states = [f"GPU {gid} {'pinned to ' + mhz(c.pinned_hz) if c.pinned_hz else 'at baseline'}"
              for gid, c in ctl.gpus.items()]
    if not ctl.gpus:
        return f"{len(ctl.jobs)} job(s); no GPU: {ctl.missing_why or 'none found'}"
    return f"{len(ctl.jobs)} job(s); " + ", ".join(states)
