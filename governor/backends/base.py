"""The protocol every GPU backend implements: probe (read only), snapshot, pin, restore, read.

A backend drives one kind of hardware (Jetson devfreq, NVML). ``probe`` finds the devices and only reads; the daemon
then snapshots each device's limits before its first pin, pins the level its jobs need, and restores the snapshot when
the last job on that device ends. Frequencies are always in Hz, power in mW, energy in J.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Protocol, runtime_checkable

from pydantic import BeforeValidator, ConfigDict, Field

from governor.errors import BackendError

MAX_HZ = 10**12  # above any clock: a bound for validating saved frequencies


def _extra_from_json(value):
    """``extra`` as to_dict writes it (a dict) into the class's sorted pairs; anything else is left to fail."""
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return value


@dataclass(frozen=True)
class Limits:
    """A device's frequency limits as the hardware reports them: what we snapshot and restore.

    The bounds are the state file's schema (governor/store/state.py validates a saved baseline as this class)."""

    __pydantic_config__ = ConfigDict(strict=True, extra="forbid")

    min_hz: Annotated[int, Field(ge=1, le=MAX_HZ)]
    max_hz: Annotated[int, Field(ge=1, le=MAX_HZ)]
    # Backend-specific settings restored with the limits (e.g. an NVML power cap); a dict in JSON (to_dict).
    extra: Annotated[tuple[tuple[str, int], ...], BeforeValidator(_extra_from_json), Field(max_length=16)] = ()

    def to_dict(self) -> dict:
        return {"min_hz": self.min_hz, "max_hz": self.max_hz, "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, d: dict) -> Limits:
        extra = tuple(sorted((str(k), int(v)) for k, v in d.get("extra", {}).items()))
        return cls(int(d["min_hz"]), int(d["max_hz"]), extra)


@dataclass(frozen=True)
class Reading:
    """One look at a device: its limits now, the current frequency, and utilization if the hardware reports it."""

    min_hz: int
    max_hz: int
    cur_hz: int | None
    load_pct: float | None

    def to_dict(self) -> dict:
        return asdict(self)


# Where a snapshot (Limits.extra) carries the GPU's power limit, in mW (has_power_cap: NVML).
POWER_LIMIT_KEY = "power_limit_mw"


@runtime_checkable
class Gpu(Protocol):
    """One GPU whose clock the daemon can pin."""

    id: str  # stable key: "0" for the Orin's single GPU, the NVML index otherwise
    uuid: str | None  # NVML's GPU-... UUID; None for the Orin's devfreq GPU
    # The number of its device file, /dev/nvidiaN (the driver's minor number), which is how Slurm's GRES numbers it;
    # None where there is none to go by (devfreq, an NVML that does not report it).
    device_minor: int | None
    levels_hz: tuple[int, ...]  # ascending; every pin is one of these
    # Optional capabilities, declared rather than guessed: the daemon asks these flags before calling the methods.
    has_energy_counter: bool  # energy_j() reads the GPU's own cumulative energy counter (NVML; a Jetson has rails)
    has_power_cap: bool  # set_power_cap_mw() sets a power limit (NVML), restored with the snapshot
    read_only: bool  # opened so that it can change nothing (observe mode on NVML): pin and restore refuse
    # How far back read().load_pct looks: a reading taken less than this after a loop started still counts time
    # before it (NVML's covers its last sample period).
    load_lag_s: float

    def describe(self) -> dict:
        """Where the device lives (paths, names): shown by status and logged at start."""

    def snapshot(self) -> Limits:
        """Read the limits to restore later."""

    def pin(self, freq_hz: int) -> None:
        """Pin min = max = freq_hz (a level of levels_hz), verified by reading back; PinError if it did not take."""

    def restore(self, limits: Limits) -> None:
        """Put back a snapshot; raise BackendError if that failed (the caller logs and retries)."""

    def read(self) -> Reading:
        """Current limits, frequency and load."""

    def pin_holds(self, reading: Reading | None = None) -> bool:
        """False when there is evidence that our pin was changed by someone else (nvpmodel, jetson_clocks, a reset);
        judged from ``reading`` (a read() just taken) when given, so that one read serves every check of a tick."""

    def energy_j(self) -> float:
        """The GPU's cumulative energy counter (has_energy_counter); BackendError when it cannot be read."""

    def driver_version(self) -> str | None:
        """The GPU driver's version where the backend reports one (NVML); None otherwise."""

    def set_power_cap_mw(self, power_mw: int) -> None:
        """Set a power limit (has_power_cap); BackendError when refused."""

    def foreign_lock(self) -> str | None:
        """Evidence, in words, of a hold on the clock that someone else set and that snapshot() cannot read, so that
        a restore would undo it; None where none is seen (a backend whose limits show every hold says None)."""


class GpuBase:
    """Defaults for a backend without the optional capabilities: the flags say no, and the methods refuse."""

    uuid: str | None = None
    device_minor: int | None = None
    has_energy_counter = False
    has_power_cap = False
    read_only = False
    load_lag_s = 0.0  # devfreq: the Orin's load file (its own averaging period is not documented; unverified)

    def energy_j(self) -> float:
        raise BackendError(f"GPU {self.id} has no energy counter")

    def set_power_cap_mw(self, power_mw: int) -> None:
        raise BackendError(f"GPU {self.id} has no power cap")

    def driver_version(self) -> str | None:
        return None  # devfreq: none beyond the L4T release, which the store records apart

    def foreign_lock(self) -> str | None:
        return None  # devfreq: another tool's hold reads in min_freq/max_freq, which the snapshot keeps


def nearest_level(levels_hz: tuple[int, ...], freq_hz: int) -> int:
    """The lowest level at or above freq_hz (never slow a job below what it asked for), else the top level."""
    for level in levels_hz:
        if level >= freq_hz:
            return level
    return levels_hz[-1]


def describe_text(gpu: Gpu) -> str:
    """A GPU's describe() as one line of key=value text, for logs: lists as a,b,c; absent values left out."""
    def text(value) -> str:
        return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)

    return " ".join(f"{key}={text(value)}" for key, value in gpu.describe().items() if value is not None)
