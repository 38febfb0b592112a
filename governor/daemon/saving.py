"""When the state file is written: at once before a pin moves, soon after the job list changes, and every
SAVE_ENERGY_TICKS ticks with the running jobs' energy so far.

A job joining at the pin already held changes only the re-adoption list: one write for a burst of registrations,
SAVE_COALESCE_S after the first of them. Should the daemon crash first, the job is just not re-adopted: the restart
restores the clocks, and the Python client registers the job again (governor.client.job, _register_again). A job
that left is saved on the next event-loop turn (prompt): a job that unregistered while its process lives on must
not be re-adopted after a crash and keep a pin it gave up. The baseline and any change of pin are saved before the
write (governor.daemon.gpupin).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from governor.daemon.gpupin import GpuPin
from governor.daemon.jobtable import JobTable
from governor.errors import StateError
from governor.store.state import GpuState, SchedulerHold, State, StateFile

log = logging.getLogger("ftgovd")

SAVE_COALESCE_S = 0.05
SAVE_ENERGY_TICKS = 10  # ticks (sample_interval_s each) between saves of the running jobs' energy so far

Defer = Callable[[Callable[[], None], float], None]


class StateSaver:
    """Writes what ``jobs`` and ``pins`` (the controller's table and GPU pins, read only) and ``holds()`` (a batch
    scheduler's, governor.daemon.scheduler) hold to ``state_file``. defer(fn, delay_s): how a save that is not urgent
    is scheduled (the event loop); None saves at once."""

    def __init__(self, state_file: StateFile, boot_id: str, jobs: JobTable, pins: Mapping[str, GpuPin],
                 defer: Defer | None = None, holds: Callable[[], list[SchedulerHold]] = list):
        self.state_file = state_file
        self.boot_id = boot_id
        self._jobs = jobs
        self._pins = pins
        self._defer = defer
        self._holds = holds
        self._pending = False
        self._prompt = False
        self._ticks = 0
        self._failing = False  # the last save failed: said once, until one succeeds again
        # Saved GPUs not here at start (state.absent), by UUID: written on with every save, so that their baselines
        # outlive this daemon for the start (or `ftgov restore`) that finds them back.
        self.absent: dict[str, GpuState] = {}

    def state(self) -> State:
        """What a restarted daemon of this boot needs: each GPU's baseline and pin, the decided jobs, the next id."""
        gpus = {gid: GpuState(describe=pin.gpu.describe(), baseline=pin.baseline, pinned_hz=pin.pinned_hz)
                for gid, pin in self._pins.items() if pin.baseline is not None}
        gpus.update(self.absent)
        return State(self.boot_id, gpus, self._jobs.records(), self._jobs.next_job_id, holds=self._holds(),
                     stood_down=[gid for gid, pin in self._pins.items() if pin.stood_down])

    def read(self) -> State | None:
        """What a previous daemon of this boot left (None: nothing, or another boot's)."""
        return self.state_file.read(self.boot_id)

    def save(self) -> None:
        """Write the state now. Written even with nothing pinned: next_job_id must survive restarts, so that a job id
        names one job for the whole boot."""
        self._pending = self._prompt = False
        self._ticks = 0
        state = self.state()
        try:
            self.state_file.write(state)
        except StateError as e:
            # Without a state file a crash could leave the pin: refuse to pin rather than risk it.
            if state.gpus and any(p.pinned_hz is not None and not p.restore_failed for p in self._pins.values()):
                raise
            self._failed(e)
            return
        if self._failing:
            self._failing = False
            log.info("state file %s written again", self.state_file.path)

    def _failed(self, e: StateError) -> None:
        """A save that failed where nobody waits for it (a timer's, a job's end): one line for a run of failures (a
        full /run fails every save until space is freed, and the energy's save comes every SAVE_ENERGY_TICKS ticks)."""
        if self._failing:
            log.debug("%s", e)
            return
        self._failing = True
        log.error("%s; the file keeps its last contents until a later save succeeds (a crash meanwhile re-adopts the "
                  "jobs listed there)", e)

    def soon(self, *, prompt: bool) -> None:
        """Save a change of the job list without making the client wait for it: on the next loop turn (``prompt``,
        a job left) or within SAVE_COALESCE_S (a job joined)."""
        if self._defer is None:
            self.save()
            return
        if self._pending and (self._prompt or not prompt):
            return  # a save that comes soon enough is already on its way
        self._pending, self._prompt = True, prompt
        self._defer(self._flush_later, 0.0 if prompt else SAVE_COALESCE_S)

    def flush(self) -> None:
        """Write a save that is still waiting (its timer, or the daemon stopping with jobs for the next start)."""
        if self._pending:
            self.save()

    def _flush_later(self) -> None:
        """flush() on its timer, where a StateError has no caller to go to: the pin already held is not moved by a
        save of the job list, so the failure is only logged (an escaped exception was a traceback in the journal
        each time)."""
        try:
            self.flush()
        except StateError as e:
            self._failed(e)

    def ticked(self) -> None:
        """One tick of the daemon passed: every SAVE_ENERGY_TICKS ticks the running jobs' energy so far is saved, for
        a re-adopting daemon to continue."""
        self._ticks += 1
        if self._ticks >= SAVE_ENERGY_TICKS and (any(j.meter is not None for j in self._jobs.values())
                                                 or self._holds()):
            self.soon(prompt=False)
