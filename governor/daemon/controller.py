"""The daemon's controller: the one owner of the jobs and the GPU pins they imply, with no sockets in it.

It composes the job table (governor.daemon.jobtable), one pin per GPU (governor.daemon.gpupin: the cap, the baseline,
the write), the checks that watch a pin (governor.daemon.checks) and the state saves (governor.daemon.saving), behind
one PinSettings that a reload swaps whole. Every change (a job registers, changes its features, ends; the limits
change underneath) ends in ``_apply``, which gives each GPU's pin the target its jobs imply. The RPC layer translates
requests into the methods here (governor.daemon.rpc); which connection and process hold a job is
governor.daemon.holds's. Tests drive this class directly (tests/daemon/test_controller.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from governor.backends import gpuid
from governor.backends.base import Gpu
from governor.backends.rails import Rails
from governor.daemon import checks, ratelimit
from governor.daemon.energy import BoardEnergy
from governor.daemon.gpupin import GpuPin
from governor.daemon.jobs import ActiveJob, Ended, Refused, Registered, Registration
from governor.daemon.jobtable import JobTable, needs_hz
from governor.daemon.powermode import PowerModeCap
from governor.daemon.saving import Defer, StateSaver
from governor.daemon.settings import PinSettings
from governor.errors import BackendError, CannotPin, FtgovError
from governor.features import Features
from governor.policy import Decision, Policy, PolicyName
from governor.store import state as state_mod
from governor.store.state import SchedulerHold, State, StateFile
from governor.units import mhz

if TYPE_CHECKING:
    from governor.daemon.peers import HeldProcess
    from governor.daemon.recorder import Recorder

log = logging.getLogger("ftgovd")

MEASURING = ("waiting for gpu_util, which this decision needs: it is measured over the job's first training steps "
             "(or after a settling delay without progress reports); no pin until then, the default governor runs")

MEASURED = (PolicyName.TUNE, PolicyName.OBSERVE)  # the policies whose jobs have a tuner (observe: windows only)

Listener = Callable[["Controller"], None]
AttachTuner = Callable[["Controller", ActiveJob], None]
PlanTune = Callable[["Controller", ActiveJob, Decision], Decision]


class HeldGpus(Protocol):
    """What the controller asks of a batch scheduler's holds (governor.daemon.scheduler.SchedulerHolds)."""

    def needs(self, gpu_id: str) -> list[int | None]: ...
    def metered(self) -> list: ...
    def active(self) -> bool: ...
    def records(self) -> list[SchedulerHold]: ...
    def describe(self) -> list[dict]: ...


class Joins(Protocol):
    """What the controller asks of a registration's joins (governor.daemon.joins.Joins): whether it may join what it
    names (a Joining: its ``policy`` and ``reply``), to join once admitted, to leave when its first pin failed; and
    the GPU a registration inside a Slurm job held here names by a number (SchedulerHolds.only_gpu; None: found as
    any job's; GpuNotFound: a number that is none of a several-GPU job's)."""

    def gpu_of(self, reg: Registration) -> str | None: ...
    def check(self, reg: Registration, gpu_id: str, policy: PolicyName | None, observe_only: bool) -> Any: ...
    def join(self, joining: Any, gov: Controller, job: ActiveJob) -> None: ...
    def failed(self, joining: Any, job: ActiveJob) -> None: ...


class Controller:
    """The jobs and the pins they imply, for every GPU.

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
        self.settings = settings
        self.jobs = JobTable()
        self.gpus: dict[str, GpuPin] = {}
        self.saver = StateSaver(state_file, boot_id, self.jobs, self.gpus, defer,
                                holds=lambda: self.scheduler.records() if self.scheduler is not None else [])
        self.rails = rails
        self.energy = BoardEnergy(rails)
        self.power_mode = PowerModeCap(self.gpus, settings.pin_above_power_mode)
        for gpu in gpus:
            self.gpus[gpu.id] = GpuPin(gpu, self.power_mode, self.saver.save)
        self.missing_why = missing_why  # why there is no GPU (none found at start); None once one is governed
        self.listeners = tuple(listeners)
        # Phase reports (checkpoint/data: the lowest level) and tuner probes move the pin at most once per
        # repin_interval_s per GPU (limits.repin_interval_s, a second): each is a sysfs write and a state save, and a
        # client alternating phases, or reporting steps fast, must not drive them at the rate it sends notifications.
        # The latest move takes effect at the window's end.
        self.phase_repins = ratelimit.Coalescer(defer, settings.repin_interval_s) if defer is not None else None
        self.attach_tuner = attach_tuner
        self.plan_tune = plan_tune
        self.recorder = recorder
        self.defer = defer  # the loop's timer, also for the tuners' meter reads (governor.daemon.energy.MeterFeed)
        # A batch scheduler's holds (governor.daemon.scheduler), one more voice in each GPU's combine, and what a
        # registration joins (governor.daemon.joins): set by the server that owns them.
        self.scheduler: HeldGpus | None = None
        # The daemon stops with restore_on_stop: every GPU goes back to its baseline, the jobs stay (state file).
        self.stopping = False
        self.joins: Joins | None = None

    @property
    def policy(self) -> Policy:
        """The policy new jobs are decided by."""
        return self.settings.policy

    def configure(self, settings: PinSettings) -> None:
        """The config was reloaded: new jobs are decided by ``settings``; running jobs keep their decisions."""
        self.settings = settings
        self.power_mode.pin_above = settings.pin_above_power_mode
        if self.phase_repins is not None:
            self.phase_repins.interval_s = settings.repin_interval_s

    # ---- GPUs -------------------------------------------------------------------------------------------------------
    def add_gpus(self, gpus: list[Gpu]) -> None:
        """GPUs that appeared after start (a late devfreq node, NVML's GPUs, found by a later probe). One that the
        state file kept while it was absent (StateSaver.absent) gets that baseline back: a pin of ours may stand."""
        for gpu in gpus:
            pin = self.gpus.setdefault(gpu.id, GpuPin(gpu, self.power_mode, self.saver.save))
            kept = self.saver.absent.pop(gpu.uuid, None) if gpu.uuid else None
            if kept is None:
                continue
            if (problem := state_mod.baseline_problem(kept.baseline, gpu.levels_hz)) is not None:
                # as the start's check says it of a saved GPU whose baseline does not fit (state.checked)
                log.warning("GPU %s (%s) is back, but the baseline the state file kept for it is not restored: %s",
                            gpu.id, gpu.uuid, problem)
                continue
            log.info("GPU %s (%s) is back: restoring the baseline the state file kept for it", gpu.id, gpu.uuid)
            pin.baseline, pin.pinned_hz, pin.restore_failed = kept.baseline, kept.pinned_hz, True
            self._apply_quietly(gpu.id)
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

    def holds_pins(self) -> bool:
        """Whether any GPU is pinned now."""
        return any(c.pinned_hz is not None for c in self.gpus.values())

    def predict(self, features: Features, why_util: str = "") -> Decision:
        """What a job of these features would get on the first GPU now (the predict method): nothing is pinned."""
        gid = self.default_gpu()
        d = self.unpinned(gid, self.power_mode.within(gid, self.settings.policy.decide(features,
                                                                                        self.gpus[gid].gpu.levels_hz)))
        return replace(d, reason=f"{d.reason}; {why_util}") if why_util else d

    # ---- jobs -------------------------------------------------------------------------------------------------------
    def admit(self, *, pid: int, start_ticks: int, uid: int, name: str | None, gpu_id: str,
              features: Features, policy: PolicyName | None = None, job_id: int | None = None) -> ActiveJob:
        """Put a job in the table, undecided: the simulated board sees its load before the daemon measures it. A job
        re-adopted with its old ``job_id`` is not a new admission: max_jobs (perhaps lowered since) does not apply,
        or a restart with more live jobs than the new limit would fail before serving, its pins left in place."""
        job = self._admit(pid=pid, start_ticks=start_ticks, uid=uid, name=name, gpu_id=gpu_id, features=features,
                          policy=policy, job_id=job_id)
        self._notify()
        return job

    def _admit(self, **job) -> ActiveJob:
        meter = self.energy.new_meter(self.gpus[job["gpu_id"]].gpu)
        added = self.jobs.admit(**job, max_jobs=self.settings.max_jobs)
        added.meter = meter
        return added

    def register(self, reg: Registration, process: HeldProcess) -> Registered:
        """A new job held by ``process``, on the GPU ``reg`` names, within the limits, joined to its batch job's hold
        and its group (governor.daemon.joins), decided: pinned now, or held unpinned while its gpu_util is measured.
        Refused, GpuNotFound, GroupRefused or TableFull when it cannot be taken as asked; a failed pin drops the job
        and is raised."""
        observe_only = self.settings.policy.name is PolicyName.OBSERVE
        if reg.tune and observe_only:
            raise Refused("tune", "this daemon runs the observe policy and pins nothing")
        joins = self.joins
        gpu_id = (joins.gpu_of(reg) if joins is not None else None) or self.find_gpu(reg.gpu)
        policy = PolicyName.TUNE if reg.tune else None
        joining = joins.check(reg, gpu_id, policy, observe_only) if joins is not None else None
        job = self._admit(pid=process.pid, start_ticks=process.start_ticks, uid=reg.uid, name=reg.name,
                          gpu_id=gpu_id, features=reg.features, policy=joining.policy if joining else policy,
                          group=reg.group, max_per_uid=self.settings.max_jobs_per_uid,
                          max_ranks_per_uid=self.settings.max_ranks_per_uid)
        job.total_steps = reg.total_steps
        if joins is not None and joining is not None:
            joins.join(joining, self, job)
        extra = joining.reply if joining is not None else {}
        if self.needs_gpu_util(job):
            self.hold_unpinned(job, MEASURING)
            self._notify()  # the job holds no pin: nothing was written, but the table changed
            return Registered(job, True, extra)
        try:
            told = self._decide(job)
        except FtgovError:
            if joins is not None and joining is not None:
                joins.failed(joining, job)
            self._notify()  # the job is gone, but a failed restore may wait for the tick's retry
            raise
        if not told:
            self._notify()
        return Registered(job, False, extra)

    def needs_gpu_util(self, job: ActiveJob) -> bool:
        """Whether the job's decision waits for a gpu_util it did not send (governor.daemon.utilization)."""
        return (job.features.gpu_util is None and self.gpus[job.gpu_id].cannot_pin is None
                and self.settings.policy.needs_gpu_util(job.features, job.policy))

    def adopt(self, state: State) -> list[ActiveJob]:
        """Take back what a previous daemon of this boot left (its state file): each GPU's baseline and pin, and the
        jobs whose processes still run (the caller drops the others from ``state`` first). Then apply: the adopted
        jobs' pin, or the baseline where none is left. Returns the adopted jobs."""
        self.jobs.continue_ids(state.next_job_id)
        for gid, gs in state.gpus.items():
            if gid in self.gpus:
                ctl = self.gpus[gid]
                # The hardware may hold a pin we no longer stand behind: force the next apply to write, either the
                # re-adopted jobs' pin or the baseline.
                ctl.baseline, ctl.pinned_hz, ctl.restore_failed = gs.baseline, gs.pinned_hz, True
                log.info("state file: GPU %s baseline %s..%s, left pinned at %s", gid, mhz(gs.baseline.min_hz),
                         mhz(gs.baseline.max_hz), mhz(gs.pinned_hz, none="no pin"))
        for gid in state.stood_down:
            if gid in self.gpus:  # another tool's limits, left alone until the jobs there end (GpuPin.stand_down)
                self.gpus[gid].stood_down = True
                log.info("state file: GPU %s was stood down from (another tool changed its limits under the pin): "
                         "its re-adopted jobs leave them alone", gid)
        adopted = []
        for rec in state.jobs:
            if rec.gpu not in self.gpus:
                log.warning("job %d from before the restart ran on GPU %s, which is not here now: not re-adopted",
                            rec.job_id, rec.gpu)
                continue
            try:
                decision = Decision.from_label(rec.policy, rec.freq_hz, "re-adopted after a daemon restart")
            except ValueError:  # a file a newer ftgov wrote: its schema holds the label as any string
                log.warning("job %d from before the restart has policy %r, which this ftgov does not know: not "
                            "re-adopted", rec.job_id, rec.policy)
                continue
            job = self.admit(pid=rec.pid, start_ticks=rec.start_ticks, uid=rec.uid, name=rec.name, gpu_id=rec.gpu,
                             features=Features(**rec.features), job_id=rec.job_id)
            job.adopted = True
            job.resume(rec)
            job.decision = decision
            adopted.append(job)
            log.info("%s re-adopted after a daemon restart at %s", job.label(), mhz(rec.freq_hz, none="no pin"),
                     extra=job.fields())
        self.reapply()
        return adopted

    def decide(self, job: ActiveJob, *, why_util: str = "") -> Decision:
        """Decide the job's frequency and apply the combined pin; then attach a tuner if its policy is tune. On a
        failed pin the job is dropped (when it had no decision before) and the error re-raised."""
        self._decide(job, why_util)
        assert job.decision is not None, "_decide sets it or raises"
        return job.decision

    def _decide(self, job: ActiveJob, why_util: str = "") -> bool:
        """decide(); True when the listeners were told (the pin changed)."""
        decision = self.unpinned(job.gpu_id, self.settings.policy.decide(job.features,
                                                                         self.gpus[job.gpu_id].gpu.levels_hz,
                                                                         job.policy))
        if why_util:
            decision = replace(decision, reason=f"{decision.reason}; {why_util}")
        # Logged before any hardware access: a read or write that hangs (and is killed by the watchdog) leaves it.
        f, label, freq_hz = job.features, decision.label, decision.freq_hz
        fields = {**job.fields(), "POLICY": label,  # the new decision's, not the job's last one
                  "FREQ_HZ": freq_hz if freq_hz is not None else ""}
        log.info("%s: %s L%d H%d seq %g util %s -> %s %s: %s", job.label(), f.model_type, f.num_layers,
                 f.hidden_size, f.seq_len, "?" if f.gpu_util is None else f"{f.gpu_util:g}%", label,
                 mhz(freq_hz, none="no pin"), decision.reason, extra=fields)
        capped = self.power_mode.within(job.gpu_id, decision)
        if capped is not decision:
            log.info("%s: %s instead of %s (pin_above_power_mode: true allows more)", job.label(),
                     capped.reason.rsplit("; ", 1)[1], mhz(freq_hz, none="no pin"),
                     extra={**fields, "FREQ_HZ": capped.freq_hz if capped.freq_hz is not None else ""})
        decision = capped
        if self.plan_tune is not None and decision.policy is PolicyName.TUNE and decision.freq_hz is not None:
            decision = self.plan_tune(self, job, decision)
        previous, job.decision = job.decision, decision
        try:
            told = self._apply(job.gpu_id)
        except FtgovError:
            job.decision = previous
            if previous is None:
                self.jobs.remove(job.job_id)
            self._apply_quietly(job.gpu_id)
            raise
        # Only a tuned or observed job has (or had) a tuner: for the others there is nothing to attach or drop.
        if self.attach_tuner is not None and (job.tuner is not None or decision.policy in MEASURED):
            self.attach_tuner(self, job)
        return told

    def hold_unpinned(self, job: ActiveJob, why: str) -> Decision:
        """A job whose decision waits for its gpu_util (governor.daemon.utilization): in the table with no pin, so the
        default governor runs, which is the clock the feature is defined at."""
        job.decision = Decision(job.policy or self.settings.policy.name, None, why)
        log.info("%s: %s", job.label(), why, extra=job.fields())
        self._apply_quietly(job.gpu_id)
        if self.attach_tuner is not None and (job.tuner is not None or job.decision.policy in MEASURED):
            self.attach_tuner(self, job)  # a tuned job measures its baseline window while it waits unpinned
        return job.decision

    def set_freq(self, job: ActiveJob, freq_hz: int | None, reason: str) -> None:
        """Move one job's pick (the tuner does this; None: no pin, for its baseline window) and apply the combined
        pin: at once (a failure raised to the tuner), or, within a second of the GPU's last re-pin, when that window
        ends (phase_repins, as for phases: a client's tuned jobs close windows as fast as it reports steps, and each
        move is a sysfs write and a state save). The tuner's windows wait for the pin meanwhile (repin_pending). On a
        GPU that cannot be pinned the job observes, and stays so (a group's move of all its ranks)."""
        if self.gpus[job.gpu_id].cannot_pin is not None:
            return
        job.decision = Decision(PolicyName.TUNE, freq_hz, reason)
        gpu_id = job.gpu_id
        if self.phase_repins is None:
            self._apply(gpu_id)
        else:
            self.phase_repins.request(gpu_id, lambda: self._apply(gpu_id), later=lambda: self._apply_quietly(gpu_id))

    def progress(self, job: ActiveJob, phase: str | None, *, total_steps_changed: bool = False) -> None:
        """A progress report's steps were taken (the RPC layer checked and set them): a new total re-prices the
        tuner's search, a new phase may move the pin, and the tuner, if any, measures on."""
        if total_steps_changed and job.tuner is not None:
            job.tuner.set_total_steps(self, job)
        self.set_phase(job, phase)
        if job.tuner is not None:
            job.tuner.progress(self, job)

    def end(self, job_id: int, why: str) -> Ended | None:
        job = self.jobs.remove(job_id)
        if job is None:
            return None
        energy_j: float | None = None
        unknown = "unknown (no rails or energy counter)"
        pin = self.gpus.get(job.gpu_id)
        if job.meter is None and pin is not None and pin.gpu.has_energy_counter:
            unknown = "unknown (its GPU's energy counter could not be read when it started)"
        if job.meter is not None:
            try:
                energy_j = job.earlier_energy_j + job.meter.total_j(time.monotonic(), self.energy.total_mw())
            except BackendError as e:
                # A GPU off the bus is what ends most jobs on it (Xid 79 kills their CUDA context), and its counter
                # answers no more: the last read (a tuner's, the state file's: seconds old) stands for the energy of
                # the whole run, short by what ran since, where "unknown" lost all of it.
                so_far_j, at_s = job.meter.last_read()
                energy_j = job.earlier_energy_j + so_far_j
                log.warning("%s: cannot read energy at its end: %s; its energy is counted up to the last read, "
                            "%.1f s before", job.label(), e, time.monotonic() - at_s)
        saving = job.tuner.finish(job) if job.tuner is not None else None
        # A tuned job without a saving says why (an observed one has nothing to say: it measures none by design).
        unmeasured = job.tuner.unmeasured_why() if saving is None and job.tuner is not None else None
        ended = Ended(job, time.monotonic() - job.started_s, energy_j, why, saving, unmeasured)
        self._apply_quietly(job.gpu_id, removed=True)
        energy = unknown if energy_j is None else f"{energy_j:.1f} J ({self.energy.source()})"
        err = None if saving is None else saving.get("saved_pct_err")
        saved = ("" if unmeasured is None else f"; no saving measured: {unmeasured}") if saving is None else (
            f"; saved {saving['saved_pct']:g}% energy per step vs the default governor, measured over "
            f"{saving['measured_steps']} steps" + ("" if err is None else f" (+/- {err:g} points)"))
        log.info("%s ended (%s) after %.1f s, %d steps, at %s, energy %s%s", job.label(), why, ended.duration_s,
                 job.steps, mhz(job.freq_hz, none="no pin"), energy, saved,
                 extra={**job.fields(), "DURATION_S": f"{ended.duration_s:.3f}", "STEPS": job.steps,
                        "ENERGY_J": "" if energy_j is None else f"{energy_j:.3f}",
                        **({} if saving is None else {"SAVED_PCT": f"{saving['saved_pct']:g}",
                                                      **({} if err is None else {"SAVED_PCT_ERR": f"{err:g}"}),
                                                      "SAVED_MEASURED_STEPS": saving["measured_steps"]})})
        if self.recorder is not None:
            self.recorder.job_ended(ended, self.gpus[job.gpu_id].gpu, self.settings.policy)
        return ended

    # ---- pins -------------------------------------------------------------------------------------------------------
    def needs_hz(self, job: ActiveJob) -> int | None:
        """What one job needs now (governor.daemon.jobtable.needs_hz)."""
        return needs_hz(job, self.settings.low_phases, self.gpus[job.gpu_id].gpu.levels_hz[0])

    def target_hz(self, gpu_id: str) -> int | None:
        extra = self.scheduler.needs(gpu_id) if self.scheduler is not None else ()
        return self.jobs.target_hz(gpu_id, self.settings.low_phases, self.gpus[gpu_id].gpu.levels_hz[0], extra)

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

    def _apply(self, gpu_id: str, *, removed: bool = False) -> bool:
        """Give the GPU's pin the target its jobs imply. True when that wrote, and the listeners were told."""
        pin = self.gpus[gpu_id]
        if pin.stood_down:
            if not self.jobs.on_gpu(gpu_id):
                pin.stood_down = False
            self.saver.soon(prompt=removed)
            return False
        target_hz = None if pin.cannot_pin is not None or self.stopping else self.target_hz(gpu_id)
        try:
            wrote = pin.set(target_hz, self.settings.power_cap_mw)
        except CannotPin:  # GpuPin.refused has said so and marked the GPU
            self._observe_on(gpu_id)
            return True
        if not wrote:
            self.saver.soon(prompt=removed)  # only the job list changed: re-adoption data, not safety data
            return False
        self._notify()
        return True

    def unpinned(self, gpu_id: str, decision: Decision) -> Decision:
        """``decision`` as it stands on this GPU: on one that cannot be pinned, observe (measured, never pinned)."""
        why = self.gpus[gpu_id].cannot_pin
        if why is None or decision.policy is PolicyName.OBSERVE:
            return decision
        return Decision(PolicyName.OBSERVE, None, f"observe: GPU {gpu_id} cannot be pinned, so this job is measured "
                                                  f"at the clocks the driver chooses, never pinned ({why})")

    def _observe_on(self, gpu_id: str) -> None:
        """The GPU turned out unable to be pinned (GpuPin.cannot_pin): every job on it observes from now on, as later
        ones will (``unpinned``); a group with a rank here stops its tuner (governor.daemon.groups). Then the GPU is
        given its baseline back, should an earlier pin of ours stand (a failure there is retried on every tick)."""
        for job in [j for j in self.jobs.values() if j.gpu_id == gpu_id]:
            if job.decision is None:  # a registration being decided: its decision is ``unpinned``'s
                continue
            decided = self.unpinned(gpu_id, job.decision)
            if decided is job.decision:
                continue
            job.decision = decided
            log.info("%s: %s", job.label(), decided.reason, extra=job.fields())
            if self.attach_tuner is not None:
                self.attach_tuner(self, job)
        self._apply_quietly(gpu_id)
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
            pin = self.gpus[gpu_id]
            pin.restore_failed = True
            if pin.write_error == str(e):  # the tick's retry, failing as before: said already
                log.debug("GPU %s: the retry failed: %s", gpu_id, e)
                return
            pin.write_error = str(e)
            log.error("GPU %s: could not apply the pin after a change: %s (will retry on every tick; logged again "
                      "when the error changes, and when it takes)", gpu_id, e)

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
        observing = self.settings.policy.name is PolicyName.OBSERVE
        for gid, pin in self.gpus.items():
            if observing:  # a GPU opened read-only keeps the daemon in observe (Reloader)
                # Observe changes nothing, not even for a moment; a read-only handle would refuse the pin and then
                # the restore, leaving a restore to retry for ever.
                results.append({"gpu": gid, "ok": True, "wrote": False,
                                "detail": "not checked: the observe policy writes no limits"
                                          + (" (this GPU was opened read-only: pinning needs a restart in another "
                                             "policy)" if pin.gpu.read_only else "")})
                continue
            results.append({"gpu": gid, **checks.pin_check(pin)})
            if pin.cannot_pin is not None:  # the check's pin was refused as every pin would be: its jobs observe
                self._observe_on(gid)
            elif results[-1]["wrote"]:
                self._notify()
        return results

    def tick(self) -> None:
        """The daemon's tick while jobs run or a restore waits: energy, the checks under each pin, the retries."""
        self.sample()
        self.check_pins()
        if self.pending_restores():
            self.retry()

    # ---- state, energy ----------------------------------------------------------------------------------------------
    def leftovers(self) -> State | None:
        """What a previous daemon of this boot left, of what fits these GPUs (found by UUID where NVML numbered them
        anew; a baseline within the GPU's table, no job on pid 0 or 1); None: nothing to take back. The saved GPUs not
        here now stay in the state file (StateSaver.absent): nothing re-probes NVML while the daemon runs, so a GPU
        back after a reset is restored by the next start, or by `ftgov restore`."""
        saved, uuids = self.saver.read(), {gid: c.gpu.uuid for gid, c in self.gpus.items()}
        self.saver.absent = state_mod.absent(saved, uuids)  # kept in the file until a start finds them back
        return state_mod.checked(saved, {gid: c.gpu.levels_hz for gid, c in self.gpus.items()}, uuids)

    def flush(self) -> None:
        """Write a save that is still waiting (the daemon is stopping and leaves its jobs for the next start)."""
        self.saver.flush()

    def sample(self) -> None:
        """Integrate energy for every active job and held GPU (on the daemon's tick while any is active); every few
        ticks the state file gets the jobs' energy so far, which a re-adopting daemon continues
        (governor.daemon.saving)."""
        self.energy.sample(self.metered())
        self.saver.ticked()

    def sample_energy(self) -> None:
        """Integrate energy between ticks (the rails' sampler, at the sensors' refresh)."""
        self.energy.sample(self.metered())

    def _notify(self) -> None:
        for listener in self.listeners:
            try:
                listener(self)
            except Exception:  # a listener (the simulated board) must never break the daemon
                log.exception("listener failed")
