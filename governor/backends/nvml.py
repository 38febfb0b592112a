"""NVML backend for datacenter GPUs (H100/H200 class): lock the graphics clock, cap power, read energy and load.

What NVML offers, and what that means for the Gpu protocol (docs/nvml.md has the long form):

- The clocks a GPU can lock to come from nvmlDeviceGetSupportedGraphicsClocks, which needs a memory clock; we use the
  table at the highest memory clock (the one training runs at). The table has ~100 entries 15 MHz apart on H100, so
  ``levels_hz`` is a coarse, evenly spread subset of it for tuning; ``supported_hz`` keeps the whole table.
- pin = nvmlDeviceSetGpuLockedClocks(min = max = MHz); restore of the unlocked state = nvmlDeviceResetGpuLockedClocks.
- NVML has no call that reads the locked range back (none among the API reference's Device Queries). So
  ``snapshot()`` cannot see a lock: it reports the full supported range, which is what "unlocked" means, and restoring
  a full-range snapshot resets the lock, to the driver's default ("the gpu clock that will be used after system reboot
  or driver reload", NVML reference), not to what was there. A lock set by someone else before ftgovd's first pin is
  therefore not preserved: restore always ends in "unlocked".
- The power limit can be read back, so it is snapshotted exactly (in Limits.extra as ``power_limit_mw``) and restored
  only when it differs from the snapshot.
- Every Set*/Reset* needs root (NVML_ERROR_NO_PERMISSION otherwise) and a GPU that supports it (Volta or newer;
  NVML_ERROR_NOT_SUPPORTED otherwise). NVMLError is converted to governor.errors here, with what to do about it.
- NVML has no timeouts, and a GPU off the bus can leave a call blocked for good: every call goes through the GPU's
  own worker thread and is given up on after a deadline (governor.backends.nvmlcalls).

Units: NVML speaks MHz, mW and mJ; this module's interface speaks Hz, mW and mJ/J like the rest of ftgov.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from governor.backends.base import POWER_LIMIT_KEY, GpuBase, Limits, Reading
from governor.backends.nvmlcalls import (
    CALL_TIMEOUT_S,
    INIT_TIMEOUT_S,
    BoundedNvml,
    NvmlNotAnswering,
    NvmlWorker,
)
from governor.errors import BackendError, CannotCap, CannotPin, CapOutOfRange, NodeNotFound, PinError

log = logging.getLogger(__name__)

MHZ = 1_000_000
DEFAULT_LEVEL_COUNT = 12
# nvmlClocksEventReasonApplicationsClocksSetting (alias UserDefinedClocks; ...ThrottleReason... before R535): a clock
# lock or applications clocks are in force.
APPLICATIONS_CLOCKS_SETTING = 0x2

# Readers that never change a GPU's settings: the only functions a read-only handle lets through.
READ_ONLY_PREFIXES = ("nvmlInit", "nvmlShutdown", "nvmlDeviceGet", "nvmlSystemGet", "nvmlErrorString",
                      "nvmlExceptionClass")


class NvmlReadOnly(BackendError):
    """A function that changes GPU settings was called through a read-only NVML handle (observe mode)."""


class ReadOnlyNvml:
    """The pynvml module with every function that could change a GPU refused (an allow-list of readers).

    Observe mode and scripts/nvml_observe.py use it on shared machines, so that not even a bug can lock a clock or
    move a power limit there.
    """

    def __init__(self, nvml: Any):
        self._nvml = nvml

    def __dir__(self):
        return dir(self._nvml)  # the NVML_ERROR_* names, for the messages

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if callable(value) and name.startswith("nvml") and not name.startswith(READ_ONLY_PREFIXES):
            def refused(*args, **kwargs):
                raise NvmlReadOnly(f"{name} refused: this NVML handle is read-only (observe mode changes nothing)")
            return refused
        return value


def _text(value: Any) -> str:
    """A string NVML returned, as str: nvidia-ml-py decodes them, the legacy ``pynvml`` package (gpuopenanalytics,
    11.4.1 in NGC PyTorch containers) returns bytes, and its pynvml/ package shadows nvidia-ml-py's pynvml.py where
    both are installed (vllm-project/vllm#7649). str() of bytes would be "b'GPU-...'", which no job's GPU matches."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _error_name(nvml: Any, code: int | None) -> str:
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == code:
            return name
    return f"NVML error {code}"


def _advice(nvml: Any, code: int | None, not_supported: str) -> str:
    if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", None):
        # No "use the observe policy": a GPU whose every lock is refused already runs its jobs as observe (CannotPin).
        return ("changing clocks or power limits needs root (CAP_SYS_ADMIN), and some containers and virtual GPUs "
                "refuse it even to root: run ftgovd as root")
    if code == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", None):
        return not_supported
    if code in (getattr(nvml, "NVML_ERROR_GPU_IS_LOST", None), getattr(nvml, "NVML_ERROR_RESET_REQUIRED", None)):
        return "the GPU fell off the bus or needs a reset: check dmesg and nvidia-smi"
    if code in (getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", None),
                getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None)):
        return "no NVIDIA driver: install it (libnvidia-ml.so.1) or choose the devfreq backend"
    if code == getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None):
        return "the driver's libnvidia-ml.so lacks this call (a driver older than the call): update the driver"
    return "see nvidia-smi -q for the GPU's state"


def refuses_every(nvml: Any, e: Exception) -> bool:
    """Whether an NVMLError answers every such write alike on this GPU (NOT_SUPPORTED, NO_PERMISSION, and
    FUNCTION_NOT_FOUND: the driver's library lacks the call, which pynvml says before calling anything), rather than
    failing this one (a lost GPU, a driver that did not answer)."""
    return getattr(e, "value", None) in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION,
                                         _missing(nvml))


def _missing(nvml: Any) -> int | None:
    """NVML_ERROR_FUNCTION_NOT_FOUND: what pynvml raises for a function the driver's libnvidia-ml.so lacks."""
    return getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None)


NOT_SUPPORTED_ADVICE = "this GPU or driver does not support it"
POWER_LIMIT_NOT_SUPPORTED = "this GPU does not allow its power limit to be changed (many virtual and cloud GPUs)"


def converted(nvml: Any, what: str, e: Exception, error: type = BackendError,
              not_supported: str = NOT_SUPPORTED_ADVICE) -> BackendError:
    """The governor error for an NVMLError: what failed, NVML's code, and what to do about it."""
    code = getattr(e, "value", None)
    return error(f"{what}: {e} ({_error_name(nvml, code)}): {_advice(nvml, code, not_supported)}")


def nvml_call(nvml: Any, what: str, fn: Callable, *args, error: type = BackendError,
              not_supported: str = NOT_SUPPORTED_ADVICE) -> Any:
    """Call an NVML function, turning NVMLError into ``error`` (raise ... from the NVMLError)."""
    try:
        return fn(*args)
    except nvml.NVMLError as e:
        raise converted(nvml, what, e, error, not_supported) from e


def coarse_levels(supported_hz: tuple[int, ...], count: int = DEFAULT_LEVEL_COUNT) -> tuple[int, ...]:
    """``count`` clocks spread evenly over the supported table (by position, so they follow its own spacing).

    Ascending; always holds the lowest and the top clock, so "no slowdown" is always a level and phases with no GPU
    work (checkpoint, data) have somewhere low to go.
    """
    table = sorted(set(supported_hz))
    if count < 2:
        raise ValueError("at least two levels: the lowest and the top clock")
    if len(table) <= count:
        return tuple(table)
    picks = {round(i * (len(table) - 1) / (count - 1)) for i in range(count)}
    return tuple(table[i] for i in sorted(picks))


class NvmlGpu(GpuBase):
    """One NVIDIA GPU seen through NVML. ``id`` is its NVML index as a string; ``uuid`` its GPU-... UUID."""

    has_energy_counter = True
    has_power_cap = True
    # nvmlDeviceGetUtilizationRates: the share of "a sample period that may be between 1 second and 1/6 second,
    # depending on the product being queried" (NVML's reference) in which a kernel ran. The longest is assumed: on an
    # H200 a read at a Trainer's first step, 0.05 s in, gave 0% (docs/observe-windows/).
    load_lag_s = 1.0

    def __init__(self, nvml: Any, index: int, *, level_count: int = DEFAULT_LEVEL_COUNT,
                 call_timeout_s: float = CALL_TIMEOUT_S):
        self.read_only = isinstance(nvml, ReadOnlyNvml)
        # Every call on this GPU, from here on, runs on its own thread and is given up on after call_timeout_s.
        self._worker = _gpu_worker(nvml, index, call_timeout_s)
        self._nvml = nvml = BoundedNvml(nvml, self._worker)
        self.index = index
        self.id = str(index)
        self._handle = nvml_call(nvml, f"GPU {index}: open", nvml.nvmlDeviceGetHandleByIndex, index)
        self.uuid = _text(nvml_call(nvml, f"GPU {index}: UUID", nvml.nvmlDeviceGetUUID, self._handle))
        self._worker.who = f"GPU {index} ({self.uuid})"
        self.name = _text(nvml_call(nvml, f"GPU {index}: name", nvml.nvmlDeviceGetName, self._handle))
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except nvml.NVMLError as e:
            if getattr(e, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                # Before Volta, and some virtual GPUs: a job's energy is unknown there, and tune cannot measure.
                self.has_energy_counter = False
        # Not NVML's index: the driver numbers device files in its PCI probe order, NVML enumerates in its own, and
        # the two differ on some hosts (PrincetonUniversity/jobstats#34).
        try:
            self.device_minor: int | None = int(nvml.nvmlDeviceGetMinorNumber(self._handle))
        except nvml.NVMLError:  # NOT_SUPPORTED on some platforms (NVIDIA/k8s-device-plugin#332)
            self.device_minor = None
        memory_mhz = nvml_call(nvml, f"GPU {index}: memory clocks", nvml.nvmlDeviceGetSupportedMemoryClocks,
                               self._handle, not_supported="this GPU reports no clock table, so it cannot be pinned")
        if not memory_mhz:
            raise BackendError(f"GPU {index} ({self.name}) reports no supported memory clocks")
        # Training runs at the top memory clock; the graphics clocks valid with it are the ones a lock can choose.
        self.memory_clock_mhz = max(memory_mhz)
        graphics_mhz = nvml_call(nvml, f"GPU {index}: graphics clocks", nvml.nvmlDeviceGetSupportedGraphicsClocks,
                                 self._handle, self.memory_clock_mhz)
        if not graphics_mhz:
            raise BackendError(f"GPU {index} ({self.name}) reports no graphics clocks at {self.memory_clock_mhz} MHz")
        self.supported_hz: tuple[int, ...] = tuple(sorted({int(m) * MHZ for m in graphics_mhz}))
        self.levels_hz: tuple[int, ...] = coarse_levels(self.supported_hz, level_count)
        gaps = [b - a for a, b in zip(self.supported_hz, self.supported_hz[1:], strict=False)]
        # A locked GPU may read a clock one table step off the lock; more than that above it means no lock.
        self._clock_tolerance_hz = max(gaps, default=0)
        # NVML cannot read a lock back, so the range this process last locked (min, max) is the only record of it.
        self._lock_hz: tuple[int, int] | None = None

    def describe(self) -> dict:
        return {
            "backend": "nvml",
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_clock_mhz": self.memory_clock_mhz,
            "supported_mhz": [self.supported_hz[0] // MHZ, self.supported_hz[-1] // MHZ, len(self.supported_hz)],
            "levels_mhz": [hz // MHZ for hz in self.levels_hz],
            "device_file": None if self.device_minor is None else f"/dev/nvidia{self.device_minor}",
        }

    def _call(self, what: str, fn: Callable, *args, **kwargs) -> Any:
        return nvml_call(self._nvml, f"GPU {self.id} ({self.name}): {what}", fn, self._handle, *args, **kwargs)

    # ---- reads ----
    def power_limit_mw(self) -> int | None:
        """The power limit in force now, or None on a GPU without power management."""
        try:
            return int(self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle))
        except self._nvml.NVMLError as e:
            if getattr(e, "value", None) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise converted(self._nvml, f"GPU {self.id} ({self.name}): power limit", e) from e

    def power_limit_range_mw(self) -> tuple[int, int]:
        low, high = self._call("power limit constraints", self._nvml.nvmlDeviceGetPowerManagementLimitConstraints)
        return int(low), int(high)

    def energy_mj(self) -> int:
        """The GPU's energy counter in mJ since the driver loaded (Volta or newer). Differences give a job's energy."""
        return int(self._call("energy counter", self._nvml.nvmlDeviceGetTotalEnergyConsumption,
                              not_supported="this GPU has no energy counter (it needs Volta or newer)"))

    def energy_j(self) -> float:
        return self.energy_mj() / 1000.0

    def power_mw(self) -> int:
        return int(self._call("power draw", self._nvml.nvmlDeviceGetPowerUsage))

    def utilization_pct(self) -> float:
        """Percent of the driver's last sample period (1/6 s to 1 s) in which a kernel ran."""
        return float(self._call("utilization", self._nvml.nvmlDeviceGetUtilizationRates).gpu)

    def clock_hz(self) -> int:
        return int(self._call("graphics clock", self._nvml.nvmlDeviceGetClockInfo,
                              self._nvml.NVML_CLOCK_GRAPHICS)) * MHZ

    def clocks_mhz(self) -> dict[str, int]:
        """Current graphics, SM and memory clocks in MHz (NVML's unit, kept for logs and tables)."""
        nvml = self._nvml
        kinds = {"graphics": nvml.NVML_CLOCK_GRAPHICS, "sm": nvml.NVML_CLOCK_SM, "memory": nvml.NVML_CLOCK_MEM}
        return {name: int(self._call(f"{name} clock", nvml.nvmlDeviceGetClockInfo, kind))
                for name, kind in kinds.items()}

    def driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except (self._nvml.NVMLError, NvmlNotAnswering) as e:
            log.debug("driver version: %s", e)
            return None

    def clock_event_reasons(self) -> int | None:
        """Why the clock is below its maximum now (nvmlClocksEventReason* bits: idle, lock, power cap, thermal), or
        None where the driver does not say. The lock bit (ApplicationsClocksSetting) hints at a lock NVML cannot
        read back (nvmlClocksEventReasonUserDefinedClocks is its deprecated alias, and what a lock sets; unverified
        here on real hardware).

        nvmlDeviceGetCurrentClocksEventReasons exists from driver R535 on (leptonai/gpud PR #48); an older driver's
        library lacks it (pynvml: NVML_ERROR_FUNCTION_NOT_FOUND), so the same bits then come from the older
        nvmlDeviceGetCurrentClocksThrottleReasons, which nvidia-ml-py 13 marks "will be removed in CUDA 14.0"."""
        nvml = self._nvml
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nvml, name, None)
            if fn is None:
                continue
            try:
                return int(fn(self._handle))
            except nvml.NVMLError as e:
                if getattr(e, "value", None) == getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None):
                    continue
                log.debug("%s", converted(nvml, f"GPU {self.id} ({self.name}): clock event reasons", e))
                return None
        log.debug("GPU %s: this driver or nvidia-ml-py reads no clock event reasons", self.id)
        return None

    def foreign_lock(self) -> str | None:
        """Where this process holds no lock but the clock event reasons show one (or applications clocks): a lock
        an operator set (nvidia-smi -lgc), which NVML cannot read back, so a restore resets it."""
        if self._lock_hz is not None:
            return None
        reasons = self.clock_event_reasons()
        if reasons is None or not reasons & APPLICATIONS_CLOCKS_SETTING:
            return None
        return (f"GPU {self.id}'s clock event reasons show a clock lock (nvidia-smi -lgc) or applications clocks "
                "(-ac) not set by ftgovd (ApplicationsClocksSetting)")

    def read(self) -> Reading:
        """Limits are those this process locked (NVML cannot read a lock back), else the full range; cur and load
        are read from the GPU, None when NVML cannot give them."""
        low, high = self._lock_hz or (self.supported_hz[0], self.supported_hz[-1])
        try:
            cur_hz: int | None = self.clock_hz()
        except BackendError as e:
            log.debug("%s", e)
            cur_hz = None
        try:
            load_pct: float | None = self.utilization_pct()
        except BackendError as e:
            log.debug("%s", e)
            load_pct = None
        return Reading(low, high, cur_hz, load_pct)

    def snapshot(self) -> Limits:
        """The full clock range (= unlocked: a lock cannot be read back) and the power limit in force now."""
        power_mw = self.power_limit_mw()
        extra = ((POWER_LIMIT_KEY, power_mw),) if power_mw is not None else ()
        return Limits(self.supported_hz[0], self.supported_hz[-1], extra)

    # ---- writes (root only) ----
    def pin(self, freq_hz: int) -> None:
        """Lock the graphics clock to freq_hz (min = max) and check, as far as NVML can tell, that it took.

        The check: the clock must not read above the lock by more than one table step. A clock below the lock is
        normal (idle, power cap, thermal), so it is not an error. Whether the clock has settled when the Set call
        returns is unverified on real hardware.
        """
        if freq_hz not in self.supported_hz:
            raise PinError(f"GPU {self.id}: {freq_hz} Hz is not a supported graphics clock "
                           f"({self.supported_hz[0] // MHZ}..{self.supported_hz[-1] // MHZ} MHz)")
        mhz = freq_hz // MHZ
        nvml = self._nvml
        try:
            nvml.nvmlDeviceSetGpuLockedClocks(self._handle, mhz, mhz)
        except nvml.NVMLError as e:
            # Not Supported and No Permission answer every lock alike: CannotPin, so that the daemon stops trying.
            # Anything else (a lost GPU, a driver that did not answer) may pass: PinError, this pin failed.
            raise converted(nvml, f"GPU {self.id} ({self.name}): lock graphics clock at {mhz} MHz", e,
                            CannotPin if refuses_every(nvml, e) else PinError,
                            not_supported="this GPU cannot lock its clocks (it needs Volta or newer and a board that "
                            "allows it)") from e
        self._lock_hz = (freq_hz, freq_hz)
        if not self.pin_holds():
            raise PinError(f"GPU {self.id}: locked at {mhz} MHz but the graphics clock reads "
                           f"{self.clock_hz() // MHZ} MHz: the lock did not take (does another tool reset clocks?)")

    def pin_holds(self, reading: Reading | None = None) -> bool:
        """False when there is evidence that our lock is gone: the clock reads above it by more than a table step.

        What the daemon's periodic pin check should call for NVML, instead of comparing snapshot() with the pin
        (snapshot() always reports the full range, since NVML cannot read a lock back). True when we hold no lock.
        """
        if self._lock_hz is None:
            return True
        clock_hz = reading.cur_hz if reading is not None and reading.cur_hz is not None else self.clock_hz()
        return clock_hz <= self._lock_hz[1] + self._clock_tolerance_hz

    def set_power_cap_mw(self, power_mw: int) -> None:
        """Set the power limit (mW) and read it back. Snapshot first: restore puts the snapshot's limit back.
        CannotCap where the GPU refuses every power limit (NOT_SUPPORTED, NO_PERMISSION): nothing was written."""
        nvml = self._nvml
        what = f"GPU {self.id} ({self.name}): set power limit to {power_mw} mW"
        try:
            low, high = self.power_limit_range_mw()
        except BackendError as e:
            # No constraints to read: a GPU without power management, where no limit can be set either.
            cause = e.__cause__
            if getattr(cause, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            raise converted(nvml, what, cause, CannotCap, not_supported=POWER_LIMIT_NOT_SUPPORTED) from cause
        if not low <= power_mw <= high:
            raise CapOutOfRange(f"GPU {self.id}: power cap {power_mw} mW is outside what it allows "
                                f"({low}..{high} mW)")
        try:
            nvml.nvmlDeviceSetPowerManagementLimit(self._handle, power_mw)
        except nvml.NVMLError as e:
            # As for a lock: these two answer every limit alike (CannotCap, so that the daemon stops trying).
            raise converted(nvml, what, e, CannotCap if refuses_every(nvml, e) else PinError,
                            not_supported=POWER_LIMIT_NOT_SUPPORTED) from e
        got = self.power_limit_mw()
        if got != power_mw:
            raise PinError(f"GPU {self.id}: set the power limit to {power_mw} mW but it reads {got} mW")

    def _reset_locked_clocks(self) -> None:
        """nvmlDeviceResetGpuLockedClocks: back to the driver's default ("the gpu clock that will be used after system
        reboot or driver reload", NVML API reference, Device Commands), not to a lock someone held before us.

        NOT_SUPPORTED means the GPU has no locked clocks at all (Volta or newer only; Set answers the same), and
        FUNCTION_NOT_FOUND a driver without the call (nor the one that sets a lock), so no lock can be in force and
        there is nothing to undo: done, not a failure. As a failure it left every restore after a refused pin
        (doctor's pin check included) failing, retried on every tick for ever."""
        try:
            self._nvml.nvmlDeviceResetGpuLockedClocks(self._handle)
        except self._nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code not in (self._nvml.NVML_ERROR_NOT_SUPPORTED, _missing(self._nvml)):
                raise converted(self._nvml, f"GPU {self.id} ({self.name}): reset locked clocks", e) from e
            log.debug("GPU %s: no locked clocks to reset (%s)", self.id, _error_name(self._nvml, code))
        self._lock_hz = None

    def restore(self, limits: Limits) -> None:
        """Undo pins and caps: a full-range snapshot resets the lock (NVML's "unlocked"), a narrower one locks to it;
        the power limit goes back to the snapshot's when it differs. Tries both, then raises BackendError if either
        failed. Safe to repeat, and safe in a new process (after a crash): it needs no memory of what was set."""
        failures: list[BackendError] = []
        try:
            if limits.min_hz <= self.supported_hz[0] and limits.max_hz >= self.supported_hz[-1]:
                self._reset_locked_clocks()
            else:
                self._call(f"lock clocks to {limits.min_hz // MHZ}..{limits.max_hz // MHZ} MHz",
                           self._nvml.nvmlDeviceSetGpuLockedClocks, limits.min_hz // MHZ, limits.max_hz // MHZ)
                self._lock_hz = (limits.min_hz, limits.max_hz)
        except BackendError as e:
            failures.append(e)
        power_mw = dict(limits.extra).get(POWER_LIMIT_KEY)
        if power_mw is not None:
            try:
                if self.power_limit_mw() != power_mw:
                    self._call(f"restore power limit to {power_mw} mW",
                               self._nvml.nvmlDeviceSetPowerManagementLimit, power_mw)
                    got = self.power_limit_mw()
                    if got != power_mw:
                        raise BackendError(f"GPU {self.id}: restored the power limit to {power_mw} mW but it reads "
                                           f"{got} mW")
            except BackendError as e:
                failures.append(e)
        said = list(dict.fromkeys(str(f) for f in failures))  # a GPU not answering fails both alike: said once
        if len(said) == 1:
            raise failures[0]
        if failures:
            raise BackendError("; ".join(said)) from failures[0]


def import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise NodeNotFound("NVML backend: the nvidia-ml-py package is not installed (pip install 'ftgov[nvml]')") from e
    return pynvml


# NVML's process-wide calls (init, device count) on one thread for the process, as NVML's own state is one per process:
# a probe again while an init is still stuck fails at once instead of leaving another thread blocked behind it.
_PROCESS_WORKER = NvmlWorker("NVML (process-wide: init, device count)",
                             cause="a GPU may have fallen off the bus (Xid 79) or the driver hung")
# Each GPU's worker, by NVML module and index, for the process's life as NVML's handles are: a probe again (the
# daemon's, while it has no GPU) fails a GPU whose call is still stuck at once, instead of leaving one more thread
# blocked on it and the event loop waiting out its deadline again at every probe.
_GPU_WORKERS: dict[tuple[Any, int], NvmlWorker] = {}


def _gpu_worker(nvml: Any, index: int, timeout_s: float) -> NvmlWorker:
    module = nvml._nvml if isinstance(nvml, ReadOnlyNvml) else nvml
    worker = _GPU_WORKERS.get((module, index))
    if worker is None:
        worker = _GPU_WORKERS[(module, index)] = NvmlWorker(f"GPU {index}")
    worker.who, worker.timeout_s = f"GPU {index}", timeout_s
    return worker


def probe(nvml_module: Any = None, *, read_only: bool = False, level_count: int = DEFAULT_LEVEL_COUNT,
          init_timeout_s: float = INIT_TIMEOUT_S, call_timeout_s: float = CALL_TIMEOUT_S) -> list[NvmlGpu]:
    """Initialise NVML and open every GPU it sees (reads only). NodeNotFound when there is no driver or no GPU.

    ``read_only`` wraps NVML so that no function that changes a GPU can be called (observe mode). A GPU that cannot
    be opened (lost, hidden by the container, not answering within ``call_timeout_s``) is skipped with a warning; the
    others are still governed. An nvmlInit that does not return within ``init_timeout_s`` is NvmlNotAnswering.
    """
    nvml = nvml_module if nvml_module is not None else import_pynvml()
    if read_only:
        nvml = ReadOnlyNvml(nvml)
    process = BoundedNvml(nvml, _PROCESS_WORKER)
    try:
        _PROCESS_WORKER.call("nvmlInit", nvml.nvmlInit, timeout_s=init_timeout_s)
    except NvmlNotAnswering as e:  # not answering still: `ftgov restore` keeps the baselines, as for a GPU away
        raise NvmlNotAnswering(f"NVML backend: {e}. With persistence mode off, each init brings every GPU up, which "
                               "can take seconds: run nvidia-persistenced, or raise nvml_init_timeout_s in the "
                               "config") from e
    except nvml.NVMLError as e:
        code = getattr(e, "value", None)
        if code in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED):
            raise NodeNotFound(f"NVML backend: {e} ({_error_name(nvml, code)}): no NVIDIA driver here") from e
        raise BackendError(f"NVML backend: nvmlInit failed: {e} ({_error_name(nvml, code)})") from e
    count = nvml_call(process, "count GPUs", process.nvmlDeviceGetCount)
    if count == 0:
        raise NodeNotFound("NVML backend: the driver is loaded but sees no GPU")
    gpus = []
    for index in range(count):
        try:
            gpus.append(NvmlGpu(nvml, index, level_count=level_count, call_timeout_s=call_timeout_s))
        except BackendError as e:
            log.warning("skipping GPU %d: %s", index, e)
    if not gpus:
        raise NodeNotFound(f"NVML backend: none of the {count} GPUs could be opened (see the warnings above)")
    return gpus
