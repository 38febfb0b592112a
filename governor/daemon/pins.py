"""The job table and the GPU pins it implies: the daemon's logic, with no sockets in it.

Every change (a job starts, changes its features, ends; the limits change underneath) goes through ``_apply``, which
computes each GPU's target with ``policy.combine`` (the one rule for several jobs) and hands it to that GPU's pin
(governor.daemon.gpupin: the cap, the state saved before the first write, the pin or the restore). What watches a held
pin is governor.daemon.checks; which connection and process hold a job, governor.daemon.holds. Tests drive this class
directly (tests/pure/test_pin_controller.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from governor.backends import gpuid
from governor.backends.base import Gpu
from governor.backends.rails import Rails
from governor.daemon import checks, ratelimit
from governor.daemon.energy import BoardEnergy
from governor.daemon.gpupin import GpuPin
from governor.daemon.jobs import ActiveJob, Ended
from governor.daemon.powermode import PowerModeCap
from governor.daemon.settings import PinSettings
from governor.errors import BackendError, FtgovError, StateError
from governor.features import Features
from governor.policy import Decision, Policy, PolicyName, combine
from governor.store.state import GpuState, SchedulerHold, State, StateFile
from governor.units import mhz

if TYPE_CHECKING:
    from governor.daemon.recorder import Recorder

log = logging.getLogger("ftgovd")

# A job joining at the pin already held changes only the re-adoption list in the state file: one write for a burst
# of registrations, this long after the first of them. The baseline and any change of pin are saved before the write.
SAVE_COALESCE_S = 0.05
SAVE_ENERGY_TICKS = 10  # ticks (sample_interval_s each) between saves of the running jobs' energy so far


class HeldGpus(Protocol):
    """What the pin controller asks of a batch scheduler's holds (governor.daemon.scheduler.SchedulerHolds)."""

    def needs(self, gpu_id: str) -> list[int | None]: ...
    def metered(self) -> list: ...
    def active(self) -> bool: ...
    def records(self) -> list[SchedulerHold]: ...
    def describe(self) -> list[dict]: ...


Listener = Callable[["PinController"], None]
Defer = Callable[[Callable[[], None], float], None]
AttachTuner = Callable[["PinController", ActiveJob], None]
PlanTune = Callable[["PinController", ActiveJob, Decision], Decision]


class PinController:
    """The job table and the pins it implies, for every GPU.

    settings: what the config sets (configure() swaps it whole on reload). listeners: told after every change (the
    simulated board, the server's STATUS=). defer(fn, delay_s): how a save that is not urgent is scheduled (the
    server: a loop timer); None saves at once. attach_tuner(controller, job): called after each decision (and when a
    job is held unpinned), so that a job whose policy is tune gets (or loses) its tuner as part of deciding.
    plan_tune(controller, job, decision): a tuned job's decision as the tuner wants it applied (its start level, or no
    pin while its baseline window runs). recorder: told of every job that ends (the measurement store).
    """

    def __init__(self, gpus: list[Gpu], settings: PinSettings, state_file: StateFile, boot_id: str, *,
                 rails: Rails | None = None, listeners: tuple[Listener, ...] = (), defer: Defer | None = None,
                 attach_tuner: AttachTuner | None = None, plan_tune: PlanTune | None = None,
                 recorder: Recorder | None = None, missing_why: str | None = None):
        self.gpus: dict[str, GpuPin] = {}
        self.settings = settings
        self.state_file = state_file
        self.boot_id = boot_id
        self.rails = rails
        self.energy = BoardEnergy(rails)
        self.power_mode = PowerModeCap(self.gpus, lambda: self.settings.pin_above_power_mode)
        for gpu in gpus:
            self.gpus[gpu.id] = GpuPin(gpu, self.power_mode, self._save)
        self.missing_why = missing_why  # why there is no GPU (none found at start); None once one is governed
        self.jobs: dict[int, ActiveJob] = {}
        self.next_job_id = 1
        self.listeners = tuple(listeners)
        self.defer = defer
        # Phase reports (checkpoint/data: the lowest level) and tuner probes move the pin at most once per
        # repin_interval_s per GPU (limits.repin_interval_s, a second): each is a sysfs write and a state save, and a
        # client alternating phases, or reporting steps fast, must not drive them at the rate it sends notifications.
        # The latest move takes effect at the window's end.
        self.phase_repins = ratelimit.Coalescer(defer, settings.repin_interval_s) if defer is not None else None
        self.attach_tuner = attach_tuner
        self.plan_tune = plan_tune
        self.recorder = recorder
        # A batch scheduler's holds (governor.daemon.scheduler), one more voice in each GPU's combine; set by the
        # server that owns them.
        self.scheduler: HeldGpus | None = None
        self._save_pending = False
        self._ticks_since_save = 0
        self._save_prompt = False

    @property
    def policy(self) -> Policy:
        return self.settings.policy

    def configure(self, settings: PinSettings) -> None:
        """The config was reloaded: new jobs are decided by ``settings``; running jobs keep their decisions."""
        self.settings = settings
        if self.phase_repins is not None:
            self.phase_repins.interval_s = settings.repin_interval_s

    # ---- jobs -------------------------------------------------------------------------------------------------------
    def add_gpus(self, gpus: list[Gpu]) -> None:
        """GPUs that appeared after start (a late devfreq node found by a later probe)."""
        for gpu in gpus:
            self.gpus.setdefault(gpu.id, GpuPin(gpu, self.power_mode, self._save))
        self.missing_why = None
        self._notify()

    def no_gpu(self, why: str) -> None:
        """Why there is still no GPU to govern (the wait for its node is over): status and STATUS= say it."""
        self.missing_why = why
        self._notify()

    def default_gpu(self) -> str:
        return next(iter(self.gpus))

    def find_gpu(self, key) -> str:
        """A GPU id from a job's `gpu` field (index or UUID; none: the only GPU). GpuNotFound otherwise."""
        if key is None and len(self.gpus) == 1:  # the usual register: no gpu field, one GPU
            return next(iter(self.gpus))
        return gpuid.find_gpu([c.gpu for c in self.gpus.values()], key).id

    def admit(self, *, pid: int, start_ticks: int, uid: int, name: str | None, gpu_id: str,
              features: Features, policy: PolicyName | None = None, job_id: int | None = None) -> ActiveJob:
        """Put a job in the table, undecided: the simulated board sees its load before the daemon measures it. A job
        re-adopted with its old ``job_id`` is not a new admission: max_jobs (perhaps lowered since) does not apply,
        or a restart with more live jobs than the new limit would fail before serving, its pins left in place."""
        if job_id is None:
            if len(self.jobs) >= self.settings.max_jobs:
                raise FtgovError(f"the daemon already holds {len(self.jobs)} jobs (limits.max_jobs)")
            job_id, self.next_job_id = self.next_job_id, self.next_job_id + 1
        job = ActiveJob(job_id, pid, start_ticks, uid, name, gpu_id, features, policy)
        job.meter = self.energy.new_meter(self.gpus[gpu_id].gpu)
        self.jobs[job_id] = job
        self._notify()
        return job

    def adopt(self, state: State) -> list[ActiveJob]:
        """Take back what a previous daemon of this boot left (its state file): each GPU's baseline and pin, and the
        jobs whose processes still run (the caller drops the others from ``state`` first). Then apply: the adopted
        jobs' pin, or the baseline where none is left. Returns the adopted jobs."""
        self.next_job_id = max(self.next_job_id, state.next_job_id)
        for gid, gs in state.gpus.items():
            if gid in self.gpus:
                ctl = self.gpus[gid]
                # The hardware may hold a pin we no longer stand behind: force the next apply to write, either the
                # re-adopted jobs' pin or the baseline.
                ctl.baseline, ctl.pinned_hz, ctl.restore_failed = gs.baseline, gs.pinned_hz, True
                log.info("state file: GPU %s baseline %d..%d Hz, left pinned at %s", gid, gs.baseline.min_hz,
                         gs.baseline.max_hz, gs.pinned_hz)
        adopted = []
        for rec in state.jobs:
            if rec.gpu not in self.gpus:
                log.warning("job %d from before the restart ran on GPU %s, which is not here now: not re-adopted",
                            rec.job_id, rec.gpu)
                continue
            job = self.admit(pid=rec.pid, start_ticks=rec.start_ticks, uid=rec.uid, name=rec.name, gpu_id=rec.gpu,
                             features=Features(**rec.features), job_id=rec.job_id)
            job.adopted = True
            job.resume(rec)
            job.decision = Decision.from_label(rec.policy, rec.freq_hz, "re-adopted after a daemon restart")
            adopted.append(job)
            log.info("%s re-adopted after a daemon restart at %s", job.label(), mhz(rec.freq_hz, none="no pin"),
                     extra=job.fields())
        self.reapply()
        return adopted

    def decide(self, job: ActiveJob, *, why_util: str = "") -> Decision:
        """Decide the job's frequency and apply the combined pin; then attach a tuner if its policy is tune. On a
        failed pin the job is dropped (when it had no decision before) and the error re-raised."""
        ctl = self.gpus[job.gpu_id]
        decision = self.policy.decide(job.features, ctl.gpu.levels_hz, job.policy)
        if why_util:
            decision = replace(decision, reason=f"{decision.reason}; {why_util}")
        # Logged before any hardware access: a read or write that hangs (and is killed by the watchdog) leaves it.
        f = job.features
        fields = {**job.fields(), "POLICY": decision.label,  # the new decision's, not the job's last one
                  "FREQ_HZ": decision.freq_hz if decision.freq_hz is not None else ""}
        log.info("%s: %s L%d H%d seq %g util %s -> %s %s: %s", job.label(), f.model_type, f.num_layers,
                 f.hidden_size, f.seq_len, "?" if f.gpu_util is None else f"{f.gpu_util:g}%", decision.label,
                 mhz(decision.freq_hz, none="no pin"), decision.reason, extra=fields)
        capped = self.power_mode.within(job.gpu_id, decision)
        if capped is not decision:
            log.info("%s: %s instead of %s (pin_above_power_mode: true allows more)", job.label(),
                     capped.reason.rsplit("; ", 1)[1], mhz(decision.freq_hz, none="no pin"),
                     extra={**fields, "FREQ_HZ": capped.freq_hz if capped.freq_hz is not None else ""})
        decision = capped
        if self.plan_tune is not None and decision.policy is PolicyName.TUNE and decision.freq_hz is not None:
            decision = self.plan_tune(self, job, decision)
        previous, job.decision = job.decision, decision
        try:
            self._apply(job.gpu_id)
        except FtgovError:
            job.decision = previous
            if previous is None:
                self.jobs.pop(job.job_id, None)
            self._apply_quietly(job.gpu_id)
            raise
        if self.attach_tuner is not None:
            self.attach_tuner(self, job)
        return decision

    def hold_unpinned(self, job: ActiveJob, why: str) -> Decision:
        """A job whose decision waits for its gpu_util (governor.daemon.utilization): in the table with no pin, so the
        default governor runs, which is the clock the feature is defined at."""
        job.decision = Decision(job.policy or self.policy.name, None, why)
        log.info("%s: %s", job.label(), why, extra=job.fields())
        self._apply_quietly(job.gpu_id)
        if self.attach_tuner is not None:
            self.attach_tuner(self, job)  # a tuned job measures its baseline window while it waits unpinned
        return job.decision

    def set_freq(self, job: ActiveJob, freq_hz: int | None, reason: str) -> None:
        """Move one job's pick (the tuner does this; None: no pin, for its baseline window) and apply the combined
        pin: at once (a failure raised to the tuner), or, within a second of the GPU's last re-pin, when that window
        ends (phase_repins, as for phases: a client's tuned jobs close windows as fast as it reports steps, and each
        move is a sysfs write and a state save). The tuner's windows wait for the pin meanwhile (repin_pending)."""
        job.decision = Decision(PolicyName.TUNE, freq_hz, reason)
        gpu_id = job.gpu_id
        if self.phase_repins is None:
            self._apply(gpu_id)
        else:
            self.phase_repins.request(gpu_id, lambda: self._apply(gpu_id), later=lambda: self._apply_quietly(gpu_id))

    def end(self, job_id: int, why: str) -> Ended | None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        energy_j = None
        if job.meter is not None:
            try:
                energy_j = job.earlier_energy_j + job.meter.add(time.monotonic(), self.energy.total_mw())
            except BackendError as e:
                log.warning("%s: cannot read energy at its end: %s", job.label(), e)
        saving = job.tuner.finish(job) if job.tuner is not None else None
        ended = Ended(job, time.monotonic() - job.started_s, energy_j, why, saving)
        self._apply_quietly(job.gpu_id, removed=True)
        energy = "unknown (no rails)" if energy_j is None else f"{energy_j:.1f} J ({self.energy.source()})"
        err = None if saving is None else saving.get("saved_pct_err")
        saved = "" if saving is None else (f"; saved {saving['saved_pct']:g}% energy per step vs the default governor, "
                                           f"measured over {saving['measured_steps']} steps"
                                           + ("" if err is None else f" (+/- {err:g} points)"))
        log.info("%s ended (%s) after %.1f s, %d steps, at %s, energy %s%s", job.label(), why, ended.duration_s,
                 job.steps, mhz(job.freq_hz, none="no pin"), energy, saved,
                 extra={**job.fields(), "DURATION_S": f"{ended.duration_s:.3f}", "STEPS": job.steps,
                        "ENERGY_J": "" if energy_j is None else f"{energy_j:.3f}",
                        **({} if saving is None else {"SAVED_PCT": f"{saving['saved_pct']:g}",
                                                      **({} if err is None else {"SAVED_PCT_ERR": f"{err:g}"}),
                                                      "SAVED_MEASURED_STEPS": saving["measured_steps"]})})
        if self.recorder is not None:
            self.recorder.job_ended(ended, self.gpus[job.gpu_id].gpu, self.policy)
        return ended

    # ---- pins -------------------------------------------------------------------------------------------------------
    def needs_hz(self, job: ActiveJob) -> int | None:
        """What one job needs now: its pick, or the GPU's lowest level while it checkpoints or loads data (the GPU
        mostly idles then; a job that reports no phases always needs its pick)."""
        hz = job.decision.freq_hz if job.decision is not None else None
        if hz is not None and job.phase is not None and job.phase in self.settings.low_phases:
            return self.gpus[job.gpu_id].gpu.levels_hz[0]
        return hz

    def target_hz(self, gpu_id: str) -> int | None:
        needs = [self.needs_hz(j) for j in self.jobs.values() if j.gpu_id == gpu_id and j.decision is not None]
        if self.scheduler is not None:
            needs += self.scheduler.needs(gpu_id)
        return combine(needs)

    def apply_gpu(self, gpu_id: str, *, quietly: bool = False, removed: bool = False) -> None:
        """Apply one GPU's target after a change outside the job table (a scheduler's hold); ``quietly``: a failure is
        logged and retried rather than raised."""
        if quietly:
            self._apply_quietly(gpu_id, removed=removed)
        else:
            self._apply(gpu_id, removed=removed)

    def busy(self) -> bool:
        """Jobs or holds are active: the tick samples their energy."""
        return bool(self.jobs) or (self.scheduler is not None and self.scheduler.active())

    def metered(self) -> list:
        """What the board's energy sampler integrates for: the jobs, and the held GPUs of scheduler holds."""
        return [*self.jobs.values(), *(self.scheduler.metered() if self.scheduler is not None else ())]

    def set_phase(self, job: ActiveJob, phase: str | None) -> None:
        """A job reported a phase: re-apply when that changes what it needs."""
        if phase is None or phase == job.phase:
            return
        before = self.needs_hz(job)
        job.phase = phase
        if self.needs_hz(job) != before:
            log.info("%s: phase %s, needs %s", job.label(), phase, mhz(self.needs_hz(job), none="no pin"),
                     extra=job.fields())
            gpu_id = job.gpu_id
            if self.phase_repins is None:
                self._apply_quietly(gpu_id)
            else:
                self.phase_repins.request(gpu_id, lambda: self._apply_quietly(gpu_id))

    def repin_pending(self, gpu_id: str) -> bool:
        """A re-pin (a phase's, a tuner's move) waits for its window (phase_repins): the pin lags the jobs' picks and
        phases until it runs."""
        return self.phase_repins is not None and gpu_id in self.phase_repins.pending

    def _apply(self, gpu_id: str, *, removed: bool = False) -> None:
        pin = self.gpus[gpu_id]
        if pin.stood_down:
            if not any(j.gpu_id == gpu_id for j in self.jobs.values()):
                pin.stood_down = False
            self._save_soon(prompt=removed)
            return
        if not pin.set(self.target_hz(gpu_id), self.settings.power_cap_mw):
            self._save_soon(prompt=removed)  # only the job list changed: re-adoption data, not safety data
            return
        self._notify()

    def reapply(self) -> None:
        """Apply every GPU's pin (or baseline) again; failures are logged and left for retry."""
        for gid in self.gpus:
            self._apply_quietly(gid)

    def _apply_quietly(self, gpu_id: str, *, removed: bool = False) -> None:
        """Apply after a job left; a failure here is logged and retried later, never raised to a client."""
        try:
            self._apply(gpu_id, removed=removed)
        except FtgovError as e:
            log.error("GPU %s: could not apply the pin after a change: %s (will retry)", gpu_id, e)
            self.gpus[gpu_id].restore_failed = True

    def pending_restores(self) -> bool:
        return any(ctl.restore_failed for ctl in self.gpus.values())

    def retry(self) -> None:
        for gid, ctl in self.gpus.items():
            if ctl.restore_failed:
                self._apply_quietly(gid)

    def check_pins(self) -> None:
        """Notice limits changed under a pin (nvpmodel, jetson_clocks) and re-apply or stand down, as configured."""
        reapply = self.settings.on_external_change == "reapply"
        for gid, pin in self.gpus.items():
            if not checks.limits_changed(pin, reapply):
                continue
            if reapply:
                try:
                    self._apply(gid)
                except FtgovError as e:
                    log.error("GPU %s: re-applying the pin failed: %s (will retry)", gid, e)
                    pin.restore_failed = True
            self._notify()

    def pin_check(self) -> list[dict]:
        """Show that each GPU can be pinned, without moving its clock (governor.daemon.checks.pin_check). One call,
        one event-loop turn: no job interleaves."""
        results = []
        for gid, pin in self.gpus.items():
            results.append({"gpu": gid, **checks.pin_check(pin)})
            if results[-1]["wrote"]:
                self._notify()
        return results

    # ---- state, energy, status -------------------------------------------------------------------------------------
    def state(self) -> State:
        gpus = {gid: GpuState(describe=ctl.gpu.describe(), baseline=ctl.baseline, pinned_hz=ctl.pinned_hz)
                for gid, ctl in self.gpus.items() if ctl.baseline is not None}
        return State(self.boot_id, gpus, [j.record() for j in self.jobs.values() if j.decision], self.next_job_id,
                     holds=self.scheduler.records() if self.scheduler is not None else [])

    def _save_soon(self, *, prompt: bool) -> None:
        """Save a change of the job list without making the client wait for it.

        A job that joined is saved within SAVE_COALESCE_S (one write for a burst): should the daemon crash first, the
        job is just not re-adopted, and runs on at the default clocks (safe, and what a job whose client lost the
        daemon does anyway). A job that left is saved on the next event-loop turn (prompt): a job that unregistered
        while its process lives on must not be re-adopted after a crash and keep a pin it gave up.
        """
        if self.defer is None:
            self._save()
            return
        if self._save_pending and (self._save_prompt or not prompt):
            return  # a save that comes soon enough is already on its way
        self._save_pending, self._save_prompt = True, prompt
        self.defer(self._save_if_pending, 0.0 if prompt else SAVE_COALESCE_S)

    def _save_if_pending(self) -> None:
        if self._save_pending:
            self._save()

    def flush(self) -> None:
        """Write a save that is still waiting (the daemon is stopping and leaves its jobs for the next start)."""
        self._save_if_pending()

    def _save(self) -> None:
        self._save_pending = self._save_prompt = False
        self._ticks_since_save = 0
        state = self.state()
        try:
            # Written even with nothing pinned: next_job_id must survive restarts so that a job id names one job
            # for the whole boot (journalctl JOB_ID=3 finds one story).
            self.state_file.write(state)
        except StateError as e:
            # Without a state file a crash could leave the pin: refuse to pin rather than risk it.
            if any(ctl.pinned_hz is not None and not ctl.restore_failed for ctl in self.gpus.values()) and state.gpus:
                raise
            log.error("%s", e)

    def sample(self) -> None:
        """Integrate energy for every active job (called on the daemon's tick while jobs are active); every
        SAVE_ENERGY_TICKS ticks the state file gets the jobs' energy so far, which a re-adopting daemon continues."""
        metered = self.metered()
        self.energy.sample(metered)
        self._ticks_since_save += 1
        if self._ticks_since_save >= SAVE_ENERGY_TICKS and any(j.meter is not None for j in metered):
            self._save_soon(prompt=False)

    def _notify(self) -> None:
        for listener in self.listeners:
            try:
                listener(self)
            except Exception:  # a listener (the simulated board) must never break the daemon
                log.exception("listener failed")

