"""The job table and the GPU pins it implies: the daemon's logic, with no sockets in it.

Every change (a job starts, changes its features, ends; the limits change underneath) goes through ``_apply``, which
computes each GPU's target with ``policy.combine`` (the one rule for several jobs), saves the state file before the
first write to a GPU, then pins or restores. The server (governor.daemon.server) owns connections and process watching and
calls in here; tests can drive this class directly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from governor.backends import gpuid
from governor.backends.base import Gpu, Limits
from governor.errors import BackendError, FtgovError, StateError
from governor.features import Features
from governor.policy import Decision, Policy, combine
from governor.backends.rails import CounterMeter, EnergyMeter, Rails
from governor.daemon.state import GpuState, JobRecord, State, StateFile

log = logging.getLogger("ftgovd")

POWER_CACHE_S = 0.02
# A job joining at the pin already held changes only the re-adoption list in the state file: one write for a burst
# of registrations, this long after the first of them. The baseline and any change of pin are saved before the write.
SAVE_COALESCE_S = 0.05


@dataclass
class Job:
    job_id: int
    pid: int
    start_time: float  # the process's start time (clock ticks since boot, /proc/PID/stat), against PID reuse
    uid: int
    name: Optional[str]
    gpu_id: str
    features: Features
    policy: Optional[str] = None  # per-job policy request (tune), else the daemon's
    decision: Optional[Decision] = None
    started_s: float = field(default_factory=time.monotonic)
    steps: int = 0
    phase: Optional[str] = None
    meter: Optional[EnergyMeter] = None
    adopted: bool = False
    tuner: object = None  # governor.policy.tuner.JobTuner when the tune policy drives this job

    @property
    def freq_hz(self) -> Optional[int]:
        return self.decision.freq_hz if self.decision else None

    def fields(self) -> dict:
        """Structured fields for journald (JOB_ID=3 finds a job's whole story)."""
        out = {"JOB_ID": self.job_id, "JOB_PID": self.pid, "JOB_NAME": self.name or ""}
        if self.decision:
            out["POLICY"] = self.decision.policy
            out["FREQ_HZ"] = self.decision.freq_hz if self.decision.freq_hz is not None else ""
        return out

    def label(self) -> str:
        return f"job {self.job_id}" + (f" {self.name!r}" if self.name else "") + f" (pid {self.pid})"

    def record(self) -> JobRecord:
        return JobRecord(self.job_id, self.pid, self.start_time, self.gpu_id, self.name, self.uid,
                         self.features.model_dump(), self.freq_hz, self.decision.policy if self.decision else "")


@dataclass
class GpuControl:
    gpu: Gpu
    baseline: Optional[Limits] = None  # snapshot taken before our first pin; None while we hold nothing
    pinned_hz: Optional[int] = None
    restore_failed: bool = False
    stood_down: bool = False  # someone else changed the limits under our pin and config says let them be


@dataclass(frozen=True)
class Ended:
    job: Job
    duration_s: float
    energy_j: Optional[float]
    why: str


class Governor:
    def __init__(self, gpus: list[Gpu], policy: Policy, state_file: StateFile, boot_id: str, *,
                 rails: Optional[Rails] = None, on_external_change: str = "reapply", max_jobs: int = 64,
                 low_phases: tuple[str, ...] = (), power_cap_mw: Optional[int] = None):
        self.gpus = {g.id: GpuControl(g) for g in gpus}
        self.policy = policy
        self.state_file = state_file
        self.boot_id = boot_id
        self.rails = rails
        self.on_external_change = on_external_change
        self.max_jobs = max_jobs
        self.low_phases = frozenset(low_phases)
        self.power_cap_mw = power_cap_mw
        self.jobs: dict[int, Job] = {}
        self.next_job_id = 1
        self.listeners: list[Callable[["Governor"], None]] = []  # told after every change (simulated board, notify)
        # How a save that is not urgent gets scheduled: defer(fn, delay_s) (the server: a loop timer). None: at once.
        self.defer: Optional[Callable[[Callable[[], None], float], None]] = None
        self._save_pending = False
        self._save_prompt = False
        self._power_cache: tuple[float, float] = (-1.0, 0.0)
        self.recorder = None  # governor.daemon.recorder.Recorder: told of every job that ends (the measurement store)

    # ---- jobs -------------------------------------------------------------------------------------------------------
    def default_gpu(self) -> str:
        return next(iter(self.gpus))

    def find_gpu(self, key) -> str:
        """A GPU id from a job's `gpu` field (index or UUID; none: the only GPU). GpuNotFound otherwise.

        A board with one GPU that has no UUID (the Orin's devfreq GPU) takes any UUID: clients fill `gpu` from CUDA
        (torch reports a UUID on a Jetson too), and there is no other GPU it could mean. A wrong index is still wrong.
        """
        if key is None and len(self.gpus) == 1:  # the usual register: no gpu field, one GPU
            return next(iter(self.gpus))
        gpus = [c.gpu for c in self.gpus.values()]
        if (isinstance(key, str) and key.upper().startswith("GPU-") and len(gpus) == 1
                and not gpus[0].describe().get("uuid")):
            return gpus[0].id
        return gpuid.find_gpu(gpus, key).id

    def admit(self, *, pid: int, start_time: float, uid: int, name: Optional[str], gpu_id: str,
              features: Features, policy: Optional[str] = None, job_id: Optional[int] = None) -> Job:
        """Put a job in the table, undecided: the simulated board sees its load before the daemon measures it."""
        if len(self.jobs) >= self.max_jobs:
            raise FtgovError(f"the daemon already holds {len(self.jobs)} jobs (limits.max_jobs)")
        if job_id is None:
            job_id, self.next_job_id = self.next_job_id, self.next_job_id + 1
        job = Job(job_id, pid, start_time, uid, name, gpu_id, features, policy)
        job.meter = self.new_meter(gpu_id)
        self.jobs[job_id] = job
        self._notify()
        return job

    def decide(self, job: Job, *, why_util: str = "") -> Decision:
        """Decide the job's frequency and apply the combined pin. On a failed pin the job is dropped and re-raised."""
        ctl = self.gpus[job.gpu_id]
        decision = self.policy.decide(job.features, ctl.gpu.levels_hz, job.policy)
        if why_util:
            decision = Decision(decision.policy, decision.freq_hz, f"{decision.reason}; {why_util}")
        previous, job.decision = job.decision, decision
        try:
            self._apply(job.gpu_id)
        except FtgovError:
            job.decision = previous
            if previous is None:
                self.jobs.pop(job.job_id, None)
            self._apply_quietly(job.gpu_id)
            raise
        f = job.features
        log.info("%s: %s L%d H%d seq %g util %s -> %s %s: %s", job.label(), f.model_type, f.num_layers,
                 f.hidden_size, f.seq_len, "?" if f.gpu_util is None else f"{f.gpu_util:g}%", decision.policy,
                 _mhz(decision.freq_hz), decision.reason, extra=job.fields())
        return decision

    def set_freq(self, job: Job, freq_hz: int, policy: str, reason: str) -> None:
        """Move one job's pick (the tuner does this) and apply the combined pin."""
        job.decision = Decision(policy, freq_hz, reason)
        self._apply(job.gpu_id)

    def end(self, job_id: int, why: str) -> Optional[Ended]:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        energy_j = None
        if job.meter is not None:
            try:
                energy_j = job.meter.add(time.monotonic(), self.total_mw())
            except BackendError as e:
                log.warning("%s: cannot read energy at its end: %s", job.label(), e)
        ended = Ended(job, time.monotonic() - job.started_s, energy_j, why)
        self._apply_quietly(job.gpu_id, removed=True)
        energy = "unknown (no rails)" if energy_j is None else f"{energy_j:.1f} J ({self.energy_source()})"
        log.info("%s ended (%s) after %.1f s, %d steps, at %s, energy %s", job.label(), why, ended.duration_s,
                 job.steps, _mhz(job.freq_hz), energy,
                 extra={**job.fields(), "DURATION_S": f"{ended.duration_s:.3f}", "STEPS": job.steps,
                        "ENERGY_J": "" if energy_j is None else f"{energy_j:.3f}"})
        if self.recorder is not None:
            self.recorder.job_ended(ended)
        return ended

    # ---- pins -------------------------------------------------------------------------------------------------------
    def needs_hz(self, job: Job) -> Optional[int]:
        """What one job needs now: its pick, or the GPU's lowest level while it checkpoints or loads data (the GPU
        mostly idles then; a job that reports no phases always needs its pick)."""
        hz = job.decision.freq_hz if job.decision is not None else None
        if hz is not None and job.phase is not None and job.phase in self.low_phases:
            return self.gpus[job.gpu_id].gpu.levels_hz[0]
        return hz

    def target_hz(self, gpu_id: str) -> Optional[int]:
        # On every register and unregister, over every job: keep the loop lean. A job that has reported no phase
        # needs its pick (as needs_hz says), read without a call.
        return combine([j.decision.freq_hz if j.phase is None else self.needs_hz(j)
                        for j in self.jobs.values() if j.gpu_id == gpu_id and j.decision is not None])

    def set_phase(self, job: Job, phase: Optional[str]) -> None:
        """A job reported a phase: re-apply when that changes what it needs."""
        if phase is None or phase == job.phase:
            return
        before = self.needs_hz(job)
        job.phase = phase
        if self.needs_hz(job) != before:
            log.info("%s: phase %s, needs %s", job.label(), phase, _mhz(self.needs_hz(job)), extra=job.fields())
            self._apply_quietly(job.gpu_id)

    def _apply(self, gpu_id: str, *, removed: bool = False) -> None:
        ctl = self.gpus[gpu_id]
        target = self.target_hz(gpu_id)
        if ctl.stood_down:
            if not any(j.gpu_id == gpu_id for j in self.jobs.values()):
                ctl.stood_down = False
            self._save_soon(prompt=removed)
            return
        if target == ctl.pinned_hz and not ctl.restore_failed:
            self._save_soon(prompt=removed)  # only the job list changed: re-adoption data, not safety data
            return
        if target is None:
            self._restore(ctl)
        else:
            first = ctl.baseline is None
            if first:
                ctl.baseline = ctl.gpu.snapshot()  # an NVML snapshot carries the power limit to restore
            ctl.pinned_hz = target
            self._save()  # before the write: a crash now still finds the baseline on disk
            ctl.gpu.pin(target)
            if first and self.power_cap_mw is not None and callable(getattr(ctl.gpu, "set_power_cap_mw", None)):
                ctl.gpu.set_power_cap_mw(self.power_cap_mw)
            ctl.restore_failed = False
            log.info("GPU %s pinned to %s", gpu_id, _mhz(target), extra={"FREQ_HZ": target})
        self._notify()

    def _apply_quietly(self, gpu_id: str, *, removed: bool = False) -> None:
        """Apply after a job left; a failure here is logged and retried later, never raised to a client."""
        try:
            self._apply(gpu_id, removed=removed)
        except FtgovError as e:
            log.error("GPU %s: could not apply the pin after a change: %s (will retry)", gpu_id, e)
            self.gpus[gpu_id].restore_failed = True

    def _restore(self, ctl: GpuControl) -> None:
        if ctl.baseline is None:
            ctl.pinned_hz = None
            self._save()
            return
        try:
            ctl.gpu.restore(ctl.baseline)
        except BackendError:
            ctl.restore_failed = True
            self._save()
            raise
        log.info("GPU %s restored to its baseline %s..%s", ctl.gpu.id, _mhz(ctl.baseline.min_hz),
                 _mhz(ctl.baseline.max_hz))
        ctl.baseline, ctl.pinned_hz, ctl.restore_failed = None, None, False
        self._save()

    def pending_restores(self) -> bool:
        return any(ctl.restore_failed for ctl in self.gpus.values())

    def retry(self) -> None:
        for gid, ctl in self.gpus.items():
            if ctl.restore_failed:
                self._apply_quietly(gid)

    def check_pins(self) -> None:
        """Notice limits changed under a pin (nvpmodel, jetson_clocks) and re-apply or stand down, as configured."""
        for gid, ctl in self.gpus.items():
            if ctl.pinned_hz is None or ctl.stood_down:
                continue
            try:
                if ctl.gpu.pin_holds():
                    continue
                now = ctl.gpu.read()
            except BackendError as e:
                log.warning("GPU %s: cannot read limits to check the pin: %s", gid, e)
                continue
            log.warning("GPU %s: limits changed under our pin of %s (now min %s max %s, clock %s): nvpmodel, "
                        "jetson_clocks or another tool? %s", gid, _mhz(ctl.pinned_hz), _mhz(now.min_hz),
                        _mhz(now.max_hz), _mhz(now.cur_hz),
                        "Re-applying" if self.on_external_change == "reapply" else "Standing down until the jobs end",
                        extra={"FREQ_HZ": ctl.pinned_hz})
            if self.on_external_change == "reapply":
                try:
                    ctl.gpu.pin(ctl.pinned_hz)
                except FtgovError as e:
                    log.error("GPU %s: re-applying the pin failed: %s", gid, e)
            else:
                # The other tool owns the limits now: forget our baseline so that we do not undo its change later.
                ctl.stood_down, ctl.baseline, ctl.pinned_hz = True, None, None
                self._save()
            self._notify()

    def pin_check(self) -> list[dict]:
        """Show that each GPU can be pinned, without moving its clock (for `ftgov doctor`). A GPU pinned for jobs is
        checked by reading (the pin holds); an idle one is pinned at the level it runs at now and restored at once,
        through the same save-before-write path as a job's pin. One call, one event-loop turn: no job interleaves."""
        return [{"gpu": gid, **self._pin_check(ctl)} for gid, ctl in self.gpus.items()]

    def _pin_check(self, ctl: GpuControl) -> dict:
        if ctl.stood_down:
            return {"ok": False, "wrote": False, "detail": "stood down: another tool changed the limits under a pin"}
        if ctl.restore_failed:
            return {"ok": False, "wrote": False, "detail": "a restore failed and is being retried: see the journal"}
        if ctl.pinned_hz is not None:
            holds = ctl.gpu.pin_holds()
            return {"ok": holds, "wrote": False, "pinned_hz": ctl.pinned_hz,
                    "detail": f"pinned for jobs at {_mhz(ctl.pinned_hz)}; "
                              + ("the pin holds" if holds else "the limits no longer read the pin")}
        reading = ctl.gpu.read()
        now_hz = reading.cur_hz if reading.cur_hz is not None else reading.max_hz
        # Within the limits in force (another tool's min = max included), the level nearest the clock now.
        allowed = [hz for hz in ctl.gpu.levels_hz if reading.min_hz <= hz <= reading.max_hz] or ctl.gpu.levels_hz
        level = min(allowed, key=lambda hz: abs(hz - now_hz))
        ctl.baseline, ctl.pinned_hz = ctl.gpu.snapshot(), level
        self._save()  # before the write, as for a job: a crash in between still finds the baseline
        result: dict = {"ok": True, "wrote": True, "pinned_hz": level}
        log.info("GPU %s: pin check: pinning at the current %s, restoring at once", ctl.gpu.id, _mhz(level))
        try:
            ctl.gpu.pin(level)
            result["detail"] = f"pinned at the current {_mhz(level)} and restored"
        except FtgovError as e:
            result.update(ok=False, detail=f"pin at {_mhz(level)} failed: {e}")
        try:
            self._restore(ctl)
        except BackendError as e:  # _restore marked it: the tick retries, as after a job
            result.update(ok=False, detail=f"{result['detail']}; restore failed: {e} (retrying)")
        (log.info if result["ok"] else log.warning)("GPU %s: pin check: %s", ctl.gpu.id, result["detail"])
        self._notify()
        return result

    # ---- state, energy, status -------------------------------------------------------------------------------------
    def state(self) -> State:
        gpus = {gid: GpuState(ctl.gpu.describe(), ctl.baseline, ctl.pinned_hz)
                for gid, ctl in self.gpus.items() if ctl.baseline is not None}
        return State(self.boot_id, gpus, [j.record() for j in self.jobs.values() if j.decision], self.next_job_id)

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

    def total_mw(self) -> float:
        """Board power now (ENERGY_RAILS). Reused for POWER_CACHE_S: the INA3221 itself refreshes only every ~140 ms
        (update_interval), so a burst of registrations need not read eight files each."""
        if self.rails is None:
            return 0.0
        now = time.monotonic()
        if now - self._power_cache[0] < POWER_CACHE_S:
            return self._power_cache[1]
        try:
            mw = self.rails.total_mw(self.rails.read_mw())
        except BackendError as e:
            log.warning("cannot read the power rails: %s", e)
            return 0.0
        self._power_cache = (now, mw)
        return mw

    def new_meter(self, gpu_id: str):
        """An energy meter from now: rails integrated over time (Jetson), else the GPU's own energy counter (NVML),
        else None. Feed it ``meter.add(time.monotonic(), self.total_mw())``; a counter meter ignores the power."""
        if self.rails is not None and self.rails.energy_rails:
            return EnergyMeter(time.monotonic(), self.total_mw())
        gpu = self.gpus[gpu_id].gpu
        if callable(getattr(gpu, "energy_j", None)):
            try:
                return CounterMeter(gpu.energy_j)
            except BackendError as e:
                log.info("GPU %s has no energy counter: %s", gpu_id, e)
        return None

    def energy_source(self) -> str:
        if self.rails is not None:
            return "+".join(self.rails.energy_rails)
        return "GPU energy counter (whole GPU)"

    def sample(self) -> None:
        """Integrate energy for every active job (called on the daemon's tick while jobs are active)."""
        if self.rails is None or not self.jobs:
            return
        t, mw = time.monotonic(), self.total_mw()
        for job in self.jobs.values():
            if job.meter is not None:
                job.meter.add(t, mw)

    def status(self) -> dict:
        gpus = []
        for gid, ctl in self.gpus.items():
            try:
                reading = ctl.gpu.read().to_dict()
            except BackendError as e:
                reading = {"error": str(e)}
            gpus.append({"id": gid, **ctl.gpu.describe(), "available_hz": list(ctl.gpu.levels_hz), **reading,
                         "pinned_hz": ctl.pinned_hz, "stood_down": ctl.stood_down,
                         "baseline_min_hz": ctl.baseline.min_hz if ctl.baseline else None,
                         "baseline_max_hz": ctl.baseline.max_hz if ctl.baseline else None})
        power = None
        if self.rails is not None:
            try:
                power = self.rails.read_mw()
            except BackendError:
                power = None
        now = time.monotonic()
        jobs = []
        for j in self.jobs.values():
            try:
                energy = j.meter.energy_j if j.meter else None
            except BackendError:
                energy = None
            jobs.append({"job_id": j.job_id, "name": j.name, "pid": j.pid, "uid": j.uid, "gpu": j.gpu_id,
                         "policy": j.decision.policy if j.decision else None, "freq_hz": j.freq_hz,
                         "reason": j.decision.reason if j.decision else None, "features": j.features.model_dump(),
                         "duration_s": round(now - j.started_s, 3), "steps": j.steps, "phase": j.phase,
                         "energy_j": energy, "adopted": j.adopted,
                         "tuner": j.tuner.state() if j.tuner is not None else None})
        return {"policy": self.policy.name, "jobs": jobs, "gpu": gpus[0] if len(gpus) == 1 else None,
                "gpus": gpus, "power_mw": power,
                "energy_rails": self.rails.energy_rails if self.rails else [], "energy_source": self.energy_source(),
                "store": self.recorder.status() if self.recorder is not None else None}

    def _notify(self) -> None:
        for listener in self.listeners:
            try:
                listener(self)
            except Exception:  # a listener (the simulated board) must never break the daemon
                log.exception("listener failed")


def _mhz(hz: Optional[int]) -> str:
    return "no pin" if hz is None else f"{hz / 1e6:g} MHz"
