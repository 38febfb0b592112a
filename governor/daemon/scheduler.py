"""Scheduler holds: a batch job's GPUs held from its prolog to its epilog, with no process behind the hold.

`ftgov slurm prolog` (run by slurmd as root) asks for a hold on the GPUs Slurm gave the job, with a policy; `ftgov
slurm epilog` releases it. The hold is one more voice in each GPU's combine rule (governor.policy.combine), next to
the jobs of the pin table, so plain jobs and held GPUs follow the one rule. A process inside the job that registers
with the job's SLURM_JOB_ID *joins* the hold on its GPU: while it lives, its own decision (its features, its tuner)
speaks for that GPU instead of the hold's; when it ends, the hold's pin is back. Only the release ends the hold: it
ends any joined job still running, restores each GPU to what the jobs that remain need (its baseline when none),
and records the job's energy in the store.

A hold has no process and no connection, so nothing ends it but a release: the state file keeps it across daemon
restarts, and a lost epilog is caught by the next prolog on the node, which releases the holds of jobs that Slurm no
longer runs (docs/slurm.md). Only root may hold or release (governor.daemon.rpc).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from governor.backends import gpuid
from governor.backends.base import nearest_level
from governor.backends.rails import CounterMeter, EnergyMeter
from governor.daemon.jobs import STATE_ENERGY_AGE_S
from governor.errors import BackendError, FtgovError
from governor.policy import Decision, PolicyName
from governor.store.measurements import SchedulerJobRecord
from governor.store.state import MAX_JOINED, SchedulerHold
from governor.units import mhz, rounded

if TYPE_CHECKING:
    from governor.daemon.controller import Controller
    from governor.daemon.jobs import ActiveJob, Ended

log = logging.getLogger("ftgovd")

# What a hold may ask for. tune and mlg need what only the job's own registration gives (its features, its steps):
# until it registers from inside, their GPUs run at FFG's level. off pins nothing and still measures the energy.
POLICIES = ("tune", "mlg", "ffg", "off")
_INSIDE_POLICY = {"tune": PolicyName.TUNE, "mlg": PolicyName.MLG, "ffg": PolicyName.FFG, "off": PolicyName.OBSERVE}

EndJob = Callable[[int, str], "Ended | None"]


class UnknownHold(FtgovError):
    """No hold for this scheduler job id."""


@dataclass
class HeldGpu:
    """One GPU of a hold: the hold's own decision for it and its energy meter. ``tuner`` is None: the board's sampler
    (governor.daemon.energy.BoardEnergy.sample) reads ``meter`` and ``tuner`` of what it is given."""

    gpu_id: str
    decision: Decision
    meter: EnergyMeter | CounterMeter | None
    earlier_energy_j: float = 0.0  # measured by the daemon before a restart
    tuner: None = None

    def so_far_j(self) -> float | None:
        """The energy up to the meter's last sample (the state file's figure; reading it samples nothing)."""
        if self.meter is None:
            return None
        try:
            return self.earlier_energy_j + self.meter.recent_j(STATE_ENERGY_AGE_S)
        except BackendError:  # a counter that cannot be read now: what was measured before the restart
            return self.earlier_energy_j or None

    def energy_j(self, total_mw: float) -> float | None:
        """The energy up to now (read at ``total_mw``, the board's power now: EnergyMeter.total_j)."""
        if self.meter is None:
            return None
        try:
            return self.earlier_energy_j + self.meter.total_j(time.monotonic(), total_mw)
        except BackendError as e:
            log.warning("GPU %s: cannot read energy for a held job: %s", self.gpu_id, e)
            return None


class PooledSaving:
    """The joined jobs' measured savings as one figure, weighted by the steps each measured, kept as running sums: a
    hold may outlive any number of short joined jobs, so it keeps no list of them."""

    def __init__(self) -> None:
        self.steps = 0
        self.pct_steps = 0.0  # sum of saved_pct * measured_steps
        self.err_steps_sq = 0.0  # sum of (saved_pct_err * measured_steps) ** 2
        self.err_known = True  # every saving counted so far stated its error

    def add(self, saving: dict) -> None:
        n = saving.get("measured_steps")
        if saving.get("saved_pct") is None or not n:
            return
        self.steps += n
        self.pct_steps += saving["saved_pct"] * n
        err = saving.get("saved_pct_err")
        if err is None:
            self.err_known = False
        else:
            self.err_steps_sq += (err * n) ** 2

    def summary(self) -> dict:
        """saved_pct and saved_pct_err over what was added (None: none measured; the error None if one had none)."""
        if not self.steps:
            return {"saved_pct": None, "saved_pct_err": None}
        err = self.err_steps_sq ** 0.5 / self.steps if self.err_known else None
        return {"saved_pct": rounded(self.pct_steps / self.steps, 2),
                "saved_pct_err": None if err is None else rounded(err, 2)}


@dataclass
class Hold:
    slurm_job_id: int
    uid: int
    partition: str | None
    policy: str
    gpus: dict[str, HeldGpu]
    started_s: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    joined: set[int] = field(default_factory=set)  # daemon job ids of registrations from inside the job
    savings: PooledSaving = field(default_factory=PooledSaving)  # the measured savings of joined jobs that ended
    het_job_id: int | None = None  # a heterogeneous job's component: the leader's id, which its steps' tasks see

    def label(self) -> str:
        return f"Slurm job {self.slurm_job_id}"

    def fields(self) -> dict:
        return {"SLURM_JOB_ID": self.slurm_job_id, "POLICY": self.policy, "GPUS": ",".join(self.gpus)}


class SchedulerHolds:
    """The holds, by scheduler job id: the one owner of them. ``pins`` consults ``needs`` for each GPU's target and
    ``records`` for the state file; ``end_job(job_id, why)`` ends a daemon job (governor.daemon.holds.Holds.end)."""

    def __init__(self, pins: Controller, end_job: EndJob):
        self.pins = pins
        self.end_job = end_job
        self._holds: dict[int, Hold] = {}
        self.suspended = False  # the daemon stops and restores: the holds are kept (state file) but pin nothing

    # ---- what the pin controller asks -------------------------------------------------------------------------------
    def needs(self, gpu_id: str) -> list[int | None]:
        """The holds' needs on this GPU: each hold's pin, except where a registration from inside speaks for it."""
        out: list[int | None] = []
        if self.suspended:
            return out
        for hold in self._holds.values():
            held = hold.gpus.get(gpu_id)
            if held is not None and not self._joined_on(hold, gpu_id):
                out.append(held.decision.freq_hz)
        return out

    def _joined_on(self, hold: Hold, gpu_id: str) -> bool:
        jobs = self.pins.jobs
        return any(job_id in jobs and jobs[job_id].gpu_id == gpu_id for job_id in hold.joined)

    def metered(self) -> list[HeldGpu]:
        return [g for hold in self._holds.values() for g in hold.gpus.values() if g.meter is not None]

    def active(self) -> bool:
        return bool(self._holds)

    def records(self) -> list[SchedulerHold]:
        out = []
        for h in self._holds.values():
            energy = {gid: e for gid, g in h.gpus.items() if (e := g.so_far_j()) is not None}
            out.append(SchedulerHold(slurm_job_id=h.slurm_job_id, het_job_id=h.het_job_id, uid=h.uid,
                                     partition=h.partition, policy=h.policy,
                                     freq_hz={gid: g.decision.freq_hz for gid, g in h.gpus.items()},
                                     energy_j=energy, joined=sorted(h.joined), started_at=h.started_at))
        return out

    def describe(self) -> list[dict]:
        """For status."""
        now = time.monotonic()
        return [{"slurm_job_id": h.slurm_job_id, "uid": h.uid, "partition": h.partition, "policy": h.policy,
                 "gpus": {gid: {**self._in_effect(g), "joined": self._joined_on(h, gid)} for gid, g in h.gpus.items()},
                 "joined": sorted(h.joined), "duration_s": round(now - h.started_s, 3),
                 **({"het_job_id": h.het_job_id} if h.het_job_id is not None else {})} for h in self._holds.values()]

    # ---- hold and release -------------------------------------------------------------------------------------------
    def hold(self, *, slurm_job_id: int, uid: int, partition: str | None, policy: str,
             gpus: list[str | int] | None, gpu_numbering: str = "auto", node_gpus: int | None = None,
             het_job_id: int | None = None) -> dict:
        """Hold the job's GPUs (``gpus``: Slurm's numbers, read by ``gpu_numbering`` (gpuid.find_slurm_gpu), or
        UUIDs; None: the node's one integrated GPU, as on a Jetson where Slurm knows no GRES) under ``policy``. A
        second hold for the same job on the same GPUs (a prolog run again) answers the first; on other GPUs (or for
        another uid) the first is stale: a requeued job whose epilog here was lost, run again on this node under
        the same id, which no sweep releases (squeue lists it). It is released, and the job's GPUs now are held.
        ``het_job_id``: the job is a heterogeneous job's component, whose steps' tasks see the leader's id as
        SLURM_JOB_ID (Slurm's slurmstepd sets it so): their registrations join it by that id too.
        FtgovError when a GPU is unknown or ambiguous, or a pin fails (nothing is held then)."""
        if policy not in POLICIES:
            raise FtgovError(f"policy: {policy!r} is none of {', '.join(POLICIES)}")
        existing = self._holds.get(slurm_job_id)
        try:
            gpu_ids = self._gpu_ids(gpus, gpu_numbering, node_gpus)
        except FtgovError:
            if existing is not None:  # what Slurm gave the job now is unknown: the old run's GPUs are not it
                self._drop_stale(existing, "its GPUs now cannot be told")
            raise
        if existing is not None:
            if set(existing.gpus) == set(gpu_ids) and existing.uid == uid:
                return {**self._describe_one(existing), "already_held": True}
            self._drop_stale(existing, f"held on GPU(s) {', '.join(existing.gpus)} for uid {existing.uid}, now "
                                       f"asked for GPU(s) {', '.join(gpu_ids) or 'none'} for uid {uid}")
        if not gpu_ids:
            why = ("the job was given no GPU" if gpus is not None else
                   "no GPU named and this node's GPUs are not one integrated GPU: name them (SLURM_JOB_GPUS)")
            log.info("Slurm job %d: nothing to hold: %s", slurm_job_id, why)
            return {"slurm_job_id": slurm_job_id, "gpus": {}, "policy": policy, "why": why}
        hold = Hold(slurm_job_id, uid, partition, policy,
                    {gid: HeldGpu(gid, self._decide(policy, gid), self.pins.energy.new_meter(self.pins.gpus[gid].gpu))
                     for gid in gpu_ids}, het_job_id=het_job_id if het_job_id != slurm_job_id else None)
        self._holds[slurm_job_id] = hold
        log.info("%s (uid %d, partition %s) held: %s", hold.label(), uid, partition or "?",
                 "; ".join(f"GPU {gid} {mhz(d['freq_hz'], none='no pin')} ({d['reason']})"
                           for gid, d in self._describe_one(hold)["gpus"].items()), extra=hold.fields())
        try:
            for gid in gpu_ids:
                self.pins.apply_gpu(gid)
        except FtgovError:
            del self._holds[slurm_job_id]
            for gid in gpu_ids:
                self.pins.apply_gpu(gid, quietly=True, removed=True)
            raise
        return self._describe_one(hold)

    def _drop_stale(self, hold: Hold, why: str) -> None:
        """A prolog for a job held here already, on other GPUs: the hold is a former run's (requeued), released."""
        log.warning("%s: a prolog for a job held here already (%s): the hold is a former run's (a requeued job whose "
                    "epilog here was lost), released", hold.label(), why, extra=hold.fields())
        self.release(hold.slurm_job_id, "stale")

    def _gpu_ids(self, gpus: list[str | int] | None, numbering: str, node_gpus: int | None) -> list[str]:
        if gpus is None:
            only = list(self.pins.gpus.values())
            if len(only) == 1 and only[0].gpu.describe().get("backend") == "devfreq":
                return [only[0].gpu.id]
            return []
        ids: list[str] = []
        backends = [c.gpu for c in self.pins.gpus.values()]
        # A number sent as text ("0") is Slurm's too: find_gpu would read it as NVML's index.
        keys = [key if (n := gpuid.as_index(key)) is None else n for key in gpus]
        if node_gpus is not None and node_gpus != len(backends) and any(isinstance(k, int) for k in keys):
            raise gpuid.GpuNotFound(
                f"slurmd offers {node_gpus} GPU(s) on this node and ftgovd governs {len(backends)}: Slurm's numbers "
                "count only what slurmd offers (a gres.conf that lists some GPUs, or MIG instances), which no "
                "gpu_numbering reads; a Slurm that names GPUs by UUID avoids it: see docs/slurm.md, 'slurm.conf, "
                "gres.conf'")
        for key in keys:
            # Slurm's numbers are NVML's indexes on some nodes, device files' (/dev/nvidiaN) on others.
            gid = (gpuid.find_slurm_gpu(backends, key, numbering).id if isinstance(key, int) else
                   self.pins.find_gpu(key))
            if gid not in ids:
                ids.append(gid)
        return ids

    def _decide(self, policy: str, gpu_id: str) -> Decision:
        if policy == "off":
            return Decision(PolicyName.OBSERVE, None, "slurm: policy off: no pin; the job's energy is measured")
        ffg_hz = self.pins.policy.ffg_freq_hz
        level = nearest_level(self.pins.gpus[gpu_id].gpu.levels_hz, ffg_hz)
        if policy == "ffg":
            decision = Decision(PolicyName.FFG, level, f"slurm: ffg at {mhz(level)}")
        else:
            decision = Decision(PolicyName(policy), level, f"slurm: {policy} decides on what the job registers from "
                                f"inside (features, steps); ffg's {mhz(level)} until then", PolicyName.FFG)
        return self.pins.power_mode.within(gpu_id, decision)

    def release(self, slurm_job_id: int, why: str) -> dict:
        """End the hold: its joined jobs still running end, each GPU goes back to what the remaining jobs need (its
        baseline when none), and the job's energy and measured saving go to the store. UnknownHold if not held."""
        hold = self._holds.get(slurm_job_id)
        if hold is None:
            raise UnknownHold(f"no hold for Slurm job {slurm_job_id}")
        for job_id in sorted(hold.joined):
            if job_id in self.pins.jobs:
                self.end_job(job_id, f"its Slurm job {slurm_job_id} ended ({why})")
        del self._holds[slurm_job_id]
        total_mw = self.pins.energy.total_mw()
        energy = {gid: g.energy_j(total_mw) for gid, g in hold.gpus.items()}
        for gid in hold.gpus:
            self.pins.apply_gpu(gid, quietly=True, removed=True)
        duration_s = time.monotonic() - hold.started_s
        known = [e for e in energy.values() if e is not None]
        energy_j = sum(known) if known and len(known) == len(energy) else None
        saving = hold.savings.summary()
        gpus = {gid: {"freq_hz": self._in_effect(g)["freq_hz"], "energy_j": energy[gid],
                      "pinned_hz_after": self.pins.gpus[gid].pinned_hz,
                      "restore_failed": self.pins.gpus[gid].restore_failed} for gid, g in hold.gpus.items()}
        out = {"slurm_job_id": slurm_job_id, "policy": hold.policy, "duration_s": round(duration_s, 3),
               "energy_j": energy_j, "energy_source": self.pins.energy.source(), "gpus": gpus,
               "joined": sorted(hold.joined), **saving,
               "restored": not any(g["restore_failed"] for g in gpus.values())}
        log.info("%s released (%s) after %.1f s: energy %s%s; GPUs %s", hold.label(), why, duration_s,
                 "unknown" if energy_j is None else f"{energy_j:.1f} J",
                 "" if saving["saved_pct"] is None else f", saved {saving['saved_pct']:g}% (measured)",
                 ", ".join(f"{gid} {'restore failed, will retry' if g['restore_failed'] else 'restored'}"
                           for gid, g in gpus.items()),
                 extra={**hold.fields(), "DURATION_S": f"{duration_s:.3f}",
                        "ENERGY_J": "" if energy_j is None else f"{energy_j:.3f}"})
        self._record(hold, out, why)
        return out

    def _record(self, hold: Hold, out: dict, why: str) -> None:
        recorder = self.pins.recorder
        if recorder is None:
            return
        recorder.scheduler_job_ended(SchedulerJobRecord(
            ended_at=time.time(), scheduler="slurm", sched_job_id=hold.slurm_job_id, boot_id=self.pins.saver.boot_id,
            uid=hold.uid, partition=hold.partition, policy=hold.policy, gpus=json.dumps(out["gpus"]),
            duration_s=out["duration_s"], energy_j=out["energy_j"], saved_pct=out["saved_pct"],
            saved_pct_err=out["saved_pct_err"], daemon_job_ids=json.dumps(out["joined"]), ended=why))

    # ---- registrations from inside the job --------------------------------------------------------------------------
    def only_gpu(self, slurm_job_id: int | None, uid: int, gpu: str | int | None) -> str | None:
        """The GPU of a registration from inside a Slurm job held here, where the registration names its GPU by no
        UUID: a number in the job's CUDA_VISIBLE_DEVICES is Slurm's own, or the job's cgroup's (0..k-1), not NVML's
        index. In a one-GPU job it can name only that GPU. In a job given several it is taken as NVML's index only
        where that is one of the job's GPUs (at worst another of the same job's); else GpuNotFound: NVML's GPU of
        that number is another job's or none's. Inside a Slurm job with no hold here that it may join, on a node of
        several GPUs, a number tells no GPU at all: GpuNotFound. None where the registration is outside Slurm, names
        a UUID, or the node has one GPU (the GPU is found as any job's)."""
        if slurm_job_id is None:
            return None
        index = None if gpu is None else gpuid.as_index(gpu)  # as find_gpu reads it: " 0" is a number there too
        if gpu is not None and index is None:
            return None
        holds = [h for h in self._holds_of(slurm_job_id) if uid in (0, h.uid)]
        if not holds:
            if index is not None and len(self.pins.gpus) > 1:
                raise gpuid.GpuNotFound(
                    f"GPU {gpu} inside Slurm job {slurm_job_id}: a number there is Slurm's or the job's cgroup's, "
                    "not NVML's index, and no hold of the job here says which GPU Slurm gave it; name the GPU by "
                    "its UUID (nvidia-smi -L; the clients and ftgov run send it where CUDA's driver loads)")
            return None
        gpus = sorted({gid for h in holds for gid in h.gpus})
        if len(gpus) == 1:
            return gpus[0]
        if index is None or str(index) in gpus:
            return None
        raise gpuid.GpuNotFound(
            f"GPU {gpu} inside Slurm job {slurm_job_id}, which holds GPUs {', '.join(gpus)}: a number there is "
            "Slurm's or the job's cgroup's, not NVML's index, and NVML's GPU of that number is not the job's; name "
            "the GPU by its UUID (nvidia-smi -L)")

    def _holds_of(self, slurm_job_id: int) -> list[Hold]:
        """The holds a registration that says SLURM_JOB_ID may join: the job's own, and where it is a heterogeneous
        job's leader, its components' here (their tasks see the leader's id)."""
        own = self._holds.get(slurm_job_id)
        return ([own] if own is not None else []) + [h for h in self._holds.values() if h.het_job_id == slurm_job_id]

    def joinable(self, slurm_job_id: int, uid: int, gpu_id: str) -> tuple[Hold | None, str]:
        """The hold a registration joins, or None and why not (it then registers as a job of its own)."""
        holds = self._holds_of(slurm_job_id)
        none_here = f"no hold of yours for Slurm job {slurm_job_id} on this node"
        if not holds:
            return None, none_here
        hold = next((h for h in holds if gpu_id in h.gpus), holds[0])
        if uid not in (0, hold.uid):
            # Answered as no hold at all: whose batch job runs here is what status hides of another's hold
            # (governor.daemon.redact); the log has it.
            log.info("uid %d: a registration naming Slurm job %d joins nothing: Slurm job %d is uid %d's", uid,
                     slurm_job_id, slurm_job_id, hold.uid)
            return None, none_here
        if gpu_id not in hold.gpus:
            return None, f"GPU {gpu_id} is not one of Slurm job {slurm_job_id}'s ({', '.join(hold.gpus)})"
        if sum(job_id in self.pins.jobs for job_id in hold.joined) >= MAX_JOINED:
            return None, f"Slurm job {slurm_job_id} already has {MAX_JOINED} registrations joined"
        return hold, ""

    @staticmethod
    def inside_policy(hold: Hold, tune: bool | None) -> PolicyName:
        """A joined registration's policy: the hold's, refined by the job's own tune; off stays off."""
        if hold.policy != "off" and tune:
            return PolicyName.TUNE
        return _INSIDE_POLICY[hold.policy]

    def join(self, hold: Hold, job: ActiveJob) -> None:
        hold.joined.add(job.job_id)
        if len(hold.joined) > MAX_JOINED:
            # The state file keeps at most MAX_JOINED a hold, and its reader refuses the whole file past that: a job's
            # user registering short jobs in a loop would lose the hold and the baseline at the next restart. The
            # oldest ended job's id goes (joinable keeps the live ones under the bound; their savings are kept).
            hold.joined.discard(min(j for j in hold.joined if j not in self.pins.jobs))
        log.info("%s joins the hold of %s on GPU %s", job.label(), hold.label(), job.gpu_id,
                 extra={**job.fields(), "SLURM_JOB_ID": hold.slurm_job_id})

    def job_ended(self, ended: Ended) -> None:
        """A daemon job ended: a joined one's measured saving is kept for the hold's summary; the hold's own pin on
        its GPU is back (the pin controller applies after the end)."""
        for hold in self._holds.values():
            if ended.job.job_id in hold.joined and ended.saving is not None:
                hold.savings.add(ended.saving)

    # ---- restart ----------------------------------------------------------------------------------------------------
    def adopt(self, records: list[SchedulerHold]) -> None:
        """Take back the holds a previous daemon of this boot left (the state file; checked against these GPUs)."""
        for rec in records:
            gpus = {}
            for gid, hz in rec.freq_hz.items():
                d = Decision(_INSIDE_POLICY[rec.policy] if rec.policy in _INSIDE_POLICY else PolicyName.FFG, hz,
                             "slurm: held before a daemon restart")
                gpus[gid] = HeldGpu(gid, d, self.pins.energy.new_meter(self.pins.gpus[gid].gpu),
                                    rec.energy_j.get(gid, 0.0))
            ran_s = max(0.0, time.time() - rec.started_at)
            hold = Hold(rec.slurm_job_id, rec.uid, rec.partition, rec.policy, gpus,
                        started_s=time.monotonic() - ran_s, started_at=rec.started_at, joined=set(rec.joined),
                        het_job_id=rec.het_job_id)
            self._holds[rec.slurm_job_id] = hold
            log.info("%s: hold re-adopted after a daemon restart (GPUs %s)", hold.label(), ", ".join(gpus),
                     extra=hold.fields())

    def _describe_one(self, hold: Hold) -> dict:
        return {"slurm_job_id": hold.slurm_job_id, "policy": hold.policy,
                "gpus": {gid: self._in_effect(g) for gid, g in hold.gpus.items()}}

    def _in_effect(self, held: HeldGpu) -> dict:
        """The hold's pin on that GPU as it stands: none, and why, on a GPU that cannot be pinned (the controller's
        ``unpinned``: it observes). The hold keeps its own decision (the state file's), for a start that may pin."""
        decision = self.pins.unpinned(held.gpu_id, held.decision)
        return {"freq_hz": decision.freq_hz, "reason": decision.reason}
