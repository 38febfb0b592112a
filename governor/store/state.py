"""Crash-safe state: the baseline and the active pins, on disk before the first write to the hardware.

A SIGKILLed daemon runs no handler, so whatever it pinned must be recoverable from disk: ``ftgov restore`` (systemd's
ExecStopPost, or by hand) and the next ftgovd start read this file. It lives in the state dir (/run/ftgov: gone at
reboot, kept across restarts by RuntimeDirectoryPreserve=yes), is written atomically (temp file, fsync, rename) and is
tagged with the boot id, so a file from another boot is ignored rather than "restored" onto a board that has since
been reset.

Root acts on what this file says (it writes the baselines back to the GPU, and re-adopts the jobs' processes), so the
file is trusted only as far as nobody else can have written it (docs/security.md): the state dir must belong to the
daemon's user (root) and be writable by no one else, every file in it is opened relative to the directory and without
following a symlink, temp files are created exclusively with mode 0600, and the file is read with a size cap and
validated whole against a strict schema. A file that fails any of this is logged, set aside (renamed to
state.json.invalid) and ignored: the daemon starts without it rather than crash or obey it.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from governor.backends.base import MAX_HZ, Limits
from governor.errors import StateError
from governor.features import Features
from governor.safefile import replace_at
from governor.sysfs import Root, read_text
from governor.text import MAX_NAME_CHARS

log = logging.getLogger("ftgovd")

STATE_FILE = "state.json"
SET_ASIDE = "state.json.invalid"
FORMAT = "ftgov-state/1"
# A state file of the default limits (64 jobs) is about 50 KB; 65536 jobs of long names would be ~50 MB. Past this the
# file is not ours: it is set aside unread, never loaded whole into memory.
MAX_STATE_BYTES = 64 * 1024 * 1024
# The ids of the registrations that joined one scheduler hold, at most: the daemon keeps no more (SchedulerHolds.join).
MAX_JOINED = 1024


def boot_id(root: Root) -> str:
    """The kernel's boot id: from the root's /proc when it has one (a simulated board), else this machine's."""
    for path in (root.path("/proc/sys/kernel/random/boot_id"), Path("/proc/sys/kernel/random/boot_id")):
        if path.exists():
            return read_text(path)
    return "unknown"


# ---- the schema: the classes the daemon uses are, through pydantic's TypeAdapter (_state_file_schema), the state
# file's schema: every field typed and bounded; anything else makes the whole file invalid.
_STRICT = ConfigDict(strict=True, extra="forbid")


@dataclass(kw_only=True)
class GpuState:
    __pydantic_config__ = _STRICT

    describe: Annotated[dict[str, Any], Field(max_length=64)] = field(default_factory=dict)
    baseline: Limits
    pinned_hz: Annotated[int | None, Field(ge=1, le=MAX_HZ)] = None

    def to_dict(self) -> dict:
        return {"describe": self.describe, "baseline": self.baseline.to_dict(), "pinned_hz": self.pinned_hz}


def _valid_features(v: dict[str, Any]) -> dict[str, Any]:
    Features.model_validate(v)  # what re-adoption builds from it: checked now, not at adoption
    return v


@dataclass(kw_only=True)
class HeldJob:
    """What re-adoption needs: the process (pid + its start time, against PID reuse) and what it asked for."""

    __pydantic_config__ = _STRICT

    job_id: Annotated[int, Field(ge=1, le=1 << 53)]
    pid: Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
    start_ticks: Annotated[int, Field(ge=0, le=(1 << 63) - 1)]
    gpu: Annotated[str, Field(max_length=128)]
    name: Annotated[str | None, Field(max_length=MAX_NAME_CHARS)] = None
    uid: Annotated[int, Field(ge=0, le=(1 << 32) - 1)]
    features: Annotated[dict[str, Any], AfterValidator(_valid_features)]
    freq_hz: Annotated[int | None, Field(ge=1, le=MAX_HZ)] = None
    policy: Annotated[str, Field(max_length=32)]
    # So that a job re-adopted after a restart keeps its history: when it registered (wall clock, s since the epoch)
    # and the energy measured for it up to the last save (J). None: not known (a file from an older daemon).
    started_at: Annotated[float | None, Field(ge=0, le=1e11)] = None
    energy_j: Annotated[float | None, Field(ge=0, le=1e15)] = None
    # The job group it registered in (governor.daemon.groups), so that a restart rebuilds the group: its key, the
    # job's rank and the group's world size (None: a job of its own, or not told).
    group: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    rank: Annotated[int | None, Field(ge=0, le=1 << 20)] = None
    world_size: Annotated[int | None, Field(ge=1, le=1 << 20)] = None
    # Where the daemon measured the job's gpu_util under a pin (governor.daemon.jobs.ActiveJob.gpu_util_at_hz).
    gpu_util_at_hz: Annotated[int | None, Field(ge=1, le=MAX_HZ)] = None

    def to_dict(self) -> dict:
        """A job outside any group is written without the group's fields, and one whose gpu_util was not measured under
        a pin without gpu_util_at_hz (the file of a daemon without them)."""
        return {k: v for k, v in vars(self).items() if v is not None or k not in _OMITTED_WHEN_NONE}


_OMITTED_WHEN_NONE = ("group", "rank", "world_size", "gpu_util_at_hz")


@dataclass(kw_only=True)
class SchedulerHold:
    """A scheduler's hold on a job's GPUs (governor.daemon.scheduler): no process holds it, the epilog ends it, so it
    is kept across daemon restarts with the energy measured so far (J, per GPU) and the inside registrations that
    joined it (daemon job ids)."""

    __pydantic_config__ = _STRICT

    slurm_job_id: Annotated[int, Field(ge=1, le=1 << 53)]
    het_job_id: Annotated[int | None, Field(ge=1, le=1 << 53)] = None  # a heterogeneous job's leader
    uid: Annotated[int, Field(ge=0, le=(1 << 32) - 1)]
    partition: Annotated[str | None, Field(max_length=128)] = None
    policy: Annotated[str, Field(max_length=32)]
    freq_hz: Annotated[dict[str, Annotated[int, Field(ge=1, le=MAX_HZ)] | None], Field(max_length=64)]
    energy_j: Annotated[dict[str, Annotated[float, Field(ge=0, le=1e15)]], Field(max_length=64)] = \
        field(default_factory=dict)
    joined: Annotated[list[Annotated[int, Field(ge=1, le=1 << 53)]], Field(max_length=MAX_JOINED)] = \
        field(default_factory=list)
    started_at: Annotated[float, Field(ge=0, le=1e11)]

    def to_dict(self) -> dict:
        """A hold of no heterogeneous job is written without het_job_id: the file of a daemon before them, which
        sets aside a whole file with a key it does not know."""
        return {k: v for k, v in vars(self).items() if v is not None or k != "het_job_id"}


def _format_given(v: Any) -> Any:
    """The file must say its format: State's default is for states built in memory, not for a file without one."""
    if isinstance(v, dict) and "format" not in v:
        raise ValueError("format: Field required")
    return v


@dataclass
class State:
    __pydantic_config__ = _STRICT

    boot_id: Annotated[str, Field(max_length=128)]
    gpus: Annotated[dict[str, GpuState], Field(max_length=64)] = field(default_factory=dict)
    jobs: Annotated[list[HeldJob], Field(max_length=65536)] = field(default_factory=list)
    next_job_id: Annotated[int, Field(ge=1, le=1 << 53)] = 1
    format: Literal["ftgov-state/1"] = FORMAT
    holds: Annotated[list[SchedulerHold], Field(max_length=4096)] = field(default_factory=list)
    # GPUs whose limits another tool took under our pin (on_external_change: stand_down) while jobs still run there:
    # a restart leaves them alone too, until those jobs end (their records still name the level they had).
    stood_down: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=64)] = \
        field(default_factory=list)

    def to_dict(self) -> dict:
        out = {"format": self.format, "boot_id": self.boot_id, "next_job_id": self.next_job_id,
               "gpus": {k: v.to_dict() for k, v in self.gpus.items()},
               "jobs": [j.to_dict() for j in self.jobs]}
        if self.holds:  # absent when empty: a file without holds reads the same to an older daemon
            out["holds"] = [h.to_dict() for h in self.holds]
        if self.stood_down:  # likewise
            out["stood_down"] = list(self.stood_down)
        return out

    @classmethod
    def from_json(cls, raw: bytes) -> State:
        """Parse and validate a whole file; StateError naming the first problem (pydantic's JSON parser bounds the
        nesting, so a 100,000-deep array is an error, not a RecursionError)."""
        try:
            return _state_file_schema().validate_json(raw)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise StateError(f"{where}: {err['msg'][:120]}") from e


@functools.cache
def _state_file_schema() -> TypeAdapter[State]:
    """The classes above as the file's validator, built on first use rather than at import."""
    return TypeAdapter(Annotated[State, BeforeValidator(_format_given)])


def baseline_problem(baseline: Limits, levels_hz: Sequence[int]) -> str | None:
    """Why a saved baseline must not be written back to a GPU with these levels (None: it may).

    A baseline is what the GPU's limits were before our pin, so it lies within the GPU's own table: anything else
    (1 Hz, min above max) did not come from this GPU.
    """
    lo, hi = min(levels_hz), max(levels_hz)
    if not (lo <= baseline.min_hz <= baseline.max_hz <= hi):
        return f"baseline {baseline.min_hz}..{baseline.max_hz} Hz is outside the GPU's range {lo}..{hi} Hz"
    return None


def renumbered(state: State, uuids: Mapping[str, str | None]) -> State:
    """``state`` with each saved GPU under the id it has now (``uuids``: id now -> its UUID, None: it has none).

    NVML numbers the GPUs it finds at its init, so one gone since the save (drained, fallen off the bus) renumbers
    those after it: a GPU is found by the UUID its saved describe() records, and its jobs and holds go with it. A
    saved GPU whose UUID is nowhere now gets an id no GPU has (and is dropped as such); one without a UUID (devfreq),
    and jobs on a GPU that held no pin (no saved GPU to go by), keep their ids."""
    now = {uuid: gid for gid, uuid in uuids.items() if uuid}
    moved: dict[str, str] = {}
    for gid, gs in state.gpus.items():
        uuid = gs.describe.get("uuid")
        if not isinstance(uuid, str) or uuids.get(gid) == uuid:
            continue
        moved[gid] = now.get(uuid, f"{gid} ({uuid}, not here now)")
        if uuid in now:
            log.info("state file: GPU %s (%s) is GPU %s now", gid, uuid, now[uuid])
    if not moved:
        return state

    def new(gid: str) -> str:
        return moved.get(gid, gid)

    return State(state.boot_id, {new(gid): gs for gid, gs in state.gpus.items()},
                 [replace(rec, gpu=new(rec.gpu)) for rec in state.jobs], state.next_job_id,
                 holds=[replace(hold, freq_hz={new(g): hz for g, hz in hold.freq_hz.items()},
                                            energy_j={new(g): j for g, j in hold.energy_j.items()})
                        for hold in state.holds],
                 stood_down=[new(gid) for gid in state.stood_down])


def absent(state: State | None, uuids: Mapping[str, str | None]) -> dict[str, GpuState]:
    """The saved GPUs that are not here now (``uuids``: id now -> its UUID), by their UUID: fallen off the bus, being
    reset or hidden when NVML counted its GPUs. A pin of ours may still stand on one, so its baseline stays in the
    state file under its UUID (StateSaver keeps it), for the next start or `ftgov restore` that finds it back
    (``renumbered`` finds it by the UUID its describe() records). A GPU without a UUID (devfreq) has no such key."""
    if state is None:
        return {}
    here = {uuid for uuid in uuids.values() if uuid}
    return {uuid: gs for gs in state.gpus.values()
            if isinstance(uuid := gs.describe.get("uuid"), str) and uuid not in here}


def checked(state: State | None, levels_hz: dict[str, Sequence[int]],
            uuids: Mapping[str, str | None] | None = None) -> State | None:
    """The part of a saved state that may be acted on for GPUs with these levels (and these UUIDs: renumbered):
    each GPU's baseline and pin within its table, each job on a GPU we have at one of its levels (or no pin) with a
    pid above 1. The rest is logged and dropped. The uid of a job's process is checked when it is held
    (peers.hold_recorded)."""
    if state is None:
        return None
    if uuids is not None:
        state = renumbered(state, uuids)
    gpus = {}
    for gid, gs in state.gpus.items():
        levels = levels_hz.get(gid)
        problem = None if levels else "no such GPU"
        uuid = gs.describe.get("uuid")
        if problem and uuids is not None and isinstance(uuid, str) and uuid not in uuids.values():
            log.warning("state file: GPU %s: its baseline %s..%s Hz stays in the state file (under its UUID) for the "
                        "next start, or `ftgov restore` with ftgovd stopped, once it is back", gid,
                        gs.baseline.min_hz, gs.baseline.max_hz)
            continue
        if levels and (problem := baseline_problem(gs.baseline, levels)) is None:
            if gs.pinned_hz is not None and gs.pinned_hz not in levels:
                problem = f"pinned_hz {gs.pinned_hz} is not one of the GPU's levels"
        if problem:
            log.warning("state file: ignoring GPU %s: %s", gid, problem)
            continue
        gpus[gid] = gs
    jobs = []
    for rec in state.jobs:
        levels = levels_hz.get(rec.gpu)
        if rec.pid <= 1:
            problem = f"pid {rec.pid} is never a job"
        elif not levels:
            problem = f"no GPU {rec.gpu!r}"
        elif rec.freq_hz is not None and rec.freq_hz not in levels:
            problem = f"freq_hz {rec.freq_hz} is not one of the GPU's levels"
        else:
            jobs.append(rec)
            continue
        log.warning("state file: ignoring job %d: %s", rec.job_id, problem)
    holds = []
    for hold in state.holds:
        bad = [f"GPU {gid!r}" if gid not in levels_hz else f"freq_hz {hz} on GPU {gid}"
               for gid, hz in hold.freq_hz.items()
               if gid not in levels_hz or (hz is not None and hz not in levels_hz[gid])]
        if bad:
            log.warning("state file: ignoring the hold of Slurm job %d: %s is not this host's", hold.slurm_job_id,
                        bad[0])
            continue
        holds.append(hold)
    return State(state.boot_id, gpus, jobs, state.next_job_id, holds=holds,
                 stood_down=[gid for gid in state.stood_down if gid in levels_hz])


def _check_dir(fd: int, path: Path) -> None:
    """The state dir must be a directory of the daemon's user (root, in service) that no one else may write to."""
    st = os.fstat(fd)
    euid = os.geteuid()
    if st.st_uid != euid:
        raise StateError(f"state dir {path} belongs to uid {st.st_uid}, not to uid {euid} that runs ftgovd: "
                         "another user could replace the state file")
    if st.st_mode & 0o022:
        raise StateError(f"state dir {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                         "another user could replace the state file")


class StateFile:
    def __init__(self, state_dir: str | os.PathLike):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def _open_dir(self, *, create: bool) -> int | None:
        """The state dir, opened (not through a symlink in its last component) and checked; None when absent."""
        if create:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if create:
                raise
            return None
        try:
            _check_dir(fd, self.dir)
        except StateError:
            os.close(fd)
            raise
        return fd

    def check(self) -> None:
        """Create the state dir if missing and check it as every use of it does; StateError when it fails."""
        try:
            fd = self._open_dir(create=True)
        except OSError as e:
            raise StateError(f"cannot open the state dir {self.dir}: {e.strerror or e}") from e
        assert fd is not None  # created
        os.close(fd)

    def hold(self) -> int | None:
        """The daemon's claim on this state dir for as long as it runs: an exclusive flock on the directory, the fd
        returned (kept open; the kernel drops the lock when the process ends, however it ends). None when another
        process holds it (a second daemon on the same state dir). ``held_elsewhere`` asks without connecting to the
        daemon's socket, which would start a socket-activated one."""
        try:
            fd = self._open_dir(create=True)
        except OSError as e:
            raise StateError(f"cannot open the state dir {self.dir}: {e.strerror or e}") from e
        assert fd is not None  # created
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def held_elsewhere(self) -> bool:
        """Whether a running daemon holds this state dir (``hold``). False where the dir cannot be opened: reading
        the state file then says why."""
        try:
            fd = self._open_dir(create=False)
        except (OSError, StateError):
            return False
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def write(self, state: State) -> None:
        data = json.dumps(state.to_dict(), separators=(",", ":"), sort_keys=True).encode()
        try:
            dirfd = self._open_dir(create=True)
        except OSError as e:
            raise StateError(f"cannot write state file {self.path}: {e.strerror or e}") from e
        try:
            # A temp name that cannot be planted, 0600 whatever the umask, then renamed: governor/safefile.py. The
            # directory is not fsynced: the file serves one boot only (its boot id), and /run is empty after a
            # power cut anyway.
            replace_at(dirfd, STATE_FILE, data, 0o600, sync_dir=False)
        except OSError as e:
            raise StateError(f"cannot write state file {self.path}: {e.strerror or e}") from e
        finally:
            os.close(dirfd)

    def read(self, current_boot_id: str, *, set_aside: bool = True) -> State | None:
        """The saved state of this boot, or None (no file, another boot's, or invalid: each is logged, an invalid
        file set aside). StateError for a state dir that cannot be trusted or read at all, and, with
        ``set_aside=False`` (a diagnosis, which must change nothing), for an invalid file, left where it is."""
        try:
            dirfd = self._open_dir(create=False)
        except OSError as e:
            raise StateError(f"cannot read state file {self.path}: {e.strerror or e}") from e
        if dirfd is None:
            return None
        try:
            try:
                raw = self._read_capped(dirfd)
            except FileNotFoundError:
                return None
            except (OSError, StateError) as e:
                return self._invalid(dirfd, e.strerror if isinstance(e, OSError) and e.strerror else str(e), set_aside)
            try:
                state = State.from_json(raw)
            except StateError as e:
                return self._invalid(dirfd, str(e), set_aside)
        finally:
            os.close(dirfd)
        if state.boot_id != current_boot_id:
            log.info("ignoring state file %s from another boot (%s)", self.path, state.boot_id[:40])
            return None
        return state

    def _invalid(self, dirfd: int, why: str, set_aside: bool) -> None:
        if not set_aside:
            raise StateError(f"state file {self.path} is invalid: {why}")
        self._set_aside(dirfd, why)
        return None

    def _read_capped(self, dirfd: int) -> bytes:
        fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StateError("not a regular file")
            if st.st_uid != os.geteuid():
                raise StateError(f"owned by uid {st.st_uid}, not by uid {os.geteuid()} that runs ftgovd")
            if st.st_size > MAX_STATE_BYTES:
                raise StateError(f"{st.st_size} bytes, more than {MAX_STATE_BYTES}")
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
                if total > MAX_STATE_BYTES:  # grew since the fstat
                    raise StateError(f"more than {MAX_STATE_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _set_aside(self, dirfd: int, why: str) -> None:
        try:
            os.replace(STATE_FILE, SET_ASIDE, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            where = f"moved to {self.dir / SET_ASIDE}"
        except OSError as e:
            where = f"and could not be moved aside: {e.strerror or e}"
        # What the file held is lost with it: a pin a crashed ftgovd recorded there has no baseline to go back to, and
        # the next pin takes the limits it finds (that pin) as the baseline. Said here, where the cause is.
        log.warning("ignoring invalid state file %s (%s): %s. A pin it recorded (a crashed ftgovd's) stays on the "
                    "GPU, and the next pin's warning says so (on a Jetson 'ftgov doctor' says how to free it; on NVML, "
                    "nvidia-smi -rgc)", self.path, where, why)
