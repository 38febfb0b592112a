"""Crash-safe state: the baseline and the active pins, on disk before the first write to the hardware.

A SIGKILLed daemon runs no handler, so whatever it pinned must be recoverable from disk: ``ftgov restore`` (systemd's
ExecStopPost, or by hand) and the next ftgovd start read this file. It lives in the state dir (/run/ftgov: gone at
reboot, kept across restarts by RuntimeDirectoryPreserve=yes), is written atomically (temp file, fsync, rename) and is
tagged with the boot id, so a file from another boot is ignored rather than "restored" onto a board that has since
been reset.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from governor.backends.base import Limits
from governor.errors import StateError
from governor.sysfs import Root, read_text

log = logging.getLogger("ftgovd")

STATE_FILE = "state.json"
FORMAT = "ftgov-state/1"


def boot_id(root: Root) -> str:
    """The kernel's boot id: from the root's /proc when it has one (a simulated board), else this machine's."""
    for path in (root.path("/proc/sys/kernel/random/boot_id"), Path("/proc/sys/kernel/random/boot_id")):
        if path.exists():
            return read_text(path)
    return "unknown"


@dataclass
class GpuState:
    describe: dict
    baseline: Limits
    pinned_hz: Optional[int] = None

    def to_dict(self) -> dict:
        return {"describe": self.describe, "baseline": self.baseline.to_dict(), "pinned_hz": self.pinned_hz}


@dataclass
class JobRecord:
    """What re-adoption needs: the process (pid + its start time, against PID reuse) and what it asked for."""

    job_id: int
    pid: int
    start_ticks: int
    gpu: str
    name: Optional[str]
    uid: int
    features: dict
    freq_hz: Optional[int]
    policy: str


@dataclass
class State:
    boot_id: str
    gpus: dict[str, GpuState] = field(default_factory=dict)
    jobs: list[JobRecord] = field(default_factory=list)
    next_job_id: int = 1

    def to_dict(self) -> dict:
        return {"format": FORMAT, "boot_id": self.boot_id, "next_job_id": self.next_job_id,
                "gpus": {k: v.to_dict() for k, v in self.gpus.items()},
                "jobs": [vars(j) for j in self.jobs]}

    @classmethod
    def from_dict(cls, d: dict) -> "State":
        if d.get("format") != FORMAT:
            raise StateError(f"unknown state format {d.get('format')!r}")
        gpus = {k: GpuState(v.get("describe", {}), Limits.from_dict(v["baseline"]), v.get("pinned_hz"))
                for k, v in d["gpus"].items()}
        jobs = [JobRecord(**j) for j in d.get("jobs", [])]
        return cls(str(d["boot_id"]), gpus, jobs, int(d.get("next_job_id", 1)))


class StateFile:
    def __init__(self, state_dir: str | os.PathLike):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def write(self, state: State) -> None:
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        data = json.dumps(state.to_dict(), separators=(",", ":"), sort_keys=True).encode()
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise StateError(f"cannot write state file {self.path}: {e.strerror or e}") from e

    def read(self, current_boot_id: str) -> Optional[State]:
        """The saved state of this boot, or None (no file, another boot's, or unreadable: each is logged)."""
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"cannot read state file {self.path}: {e.strerror or e}") from e
        try:
            state = State.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError, StateError) as e:
            log.warning("ignoring unreadable state file %s: %s", self.path, e)
            return None
        if state.boot_id != current_boot_id:
            log.info("ignoring state file %s from another boot (%s)", self.path, state.boot_id)
            return None
        return state
