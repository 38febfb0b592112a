"""A fake ``pynvml`` (nvidia-ml-py) backed by simulated GPUs, for tests on machines without an NVIDIA driver.

Put ``tests/support/fakenvml`` first on sys.path (or PYTHONPATH) and ``import pynvml`` gets this module. It has the real
module's function names, signatures, return types (MHz, mW, mJ, percent), constants with the real values, and the same
error classes: ``NVMLError(code)`` returns the subclass for the code (``NVMLError_NoPermission`` ...), built the way
nvidia-ml-py builds them. Only the functions ftgov uses are simulated; anything else is absent, so code that strays
from them fails loudly.

Control (fake only, not in the real module): ``fake_reset(system=None)`` installs a FakeSystem (default: two
simulated H200s, root), ``fake_system()`` returns it for inspection and configuration. A process started by a test reads
its system from the JSON file named by FAKENVML_CONFIG and appends each call's name to FAKENVML_LOG.
"""

from __future__ import annotations

import itertools
import os
import string
import sys
import time

from ._sim import FakeGpu, FakeSystem, ManualClock, default_gpus, system_from_config, system_from_environment

# ---- constants (values as in nvidia-ml-py 13.x) ----
# FAKENVML_ENERGY_READ_S: CPU seconds each energy counter read spends (a real H200's took 8-10 ms); a comma-separated
# list is taken in turn (a driver that answers some reads from a cache: "0.004,0.012,0.012").
ENERGY_READ_S = itertools.cycle([float(s) for s in os.environ.get("FAKENVML_ENERGY_READ_S", "0").split(",")])

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_CLOCK_COUNT = 4

NVML_CLOCK_ID_CURRENT = 0
NVML_CLOCK_ID_APP_CLOCK_TARGET = 1
NVML_CLOCK_ID_APP_CLOCK_DEFAULT = 2
NVML_CLOCK_ID_CUSTOMER_BOOST_MAX = 3

NVML_CLOCK_LIMIT_ID_RANGE_START = 0xFFFFFF00
NVML_CLOCK_LIMIT_ID_TDP = 0xFFFFFF01
NVML_CLOCK_LIMIT_ID_UNLIMITED = 0xFFFFFF02

NVML_TEMPERATURE_GPU = 0

nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonApplicationsClocksSetting = nvmlClocksEventReasonApplicationsClocksSetting
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap

_REASON_BITS = {
    "GpuIdle": nvmlClocksEventReasonGpuIdle,
    "ApplicationsClocksSetting": nvmlClocksEventReasonApplicationsClocksSetting,
    "SwPowerCap": nvmlClocksEventReasonSwPowerCap,
}


# ---- errors, built as nvidia-ml-py builds them ----
class NVMLError(Exception):
    _valClassMapping: dict = dict()
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value:d}")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def nvmlExceptionClass(nvmlErrorCode):
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


def _extractNVMLErrorsAsClasses():
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)
            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


def nvmlErrorString(result):
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


class c_nvmlUtilization_t:
    """The fields of the real ctypes structure: percent over the driver's last sample period."""

    def __init__(self, gpu: int, memory: int):
        self.gpu = gpu
        self.memory = memory


class _Handle:
    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"<fake nvmlDevice_t {self.index}>"


# ---- the simulated system (fake only) ----
_system: FakeSystem | None = None


def fake_reset(system: FakeSystem | None = None) -> FakeSystem:
    """Install a fresh system (default: what FAKENVML_CONFIG describes, else two H200s) and return it."""
    global _system
    _system = system if system is not None else system_from_environment()
    return _system


def fake_system() -> FakeSystem:
    return _system if _system is not None else fake_reset()


def _hang(hang_s: dict, name: str) -> None:
    """Block as a call the driver does not answer would (a faults file's hang_s: FN, or "*" for every call)."""
    seconds = hang_s.get(name, hang_s.get("*"))
    if seconds:
        time.sleep(seconds)


def _enter(name: str, *, needs_init: bool = True) -> FakeSystem:
    system = fake_system()
    system.record(name)
    _hang(system.faults().get("hang_s", {}), name)
    code = system.faults().get(name)
    if code is not None:
        raise NVMLError(code)
    if needs_init and system.init_count == 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return system


def _gpu(system: FakeSystem, handle) -> FakeGpu:
    if not isinstance(handle, _Handle) or not 0 <= handle.index < len(system.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = system.gpus[handle.index]
    if gpu.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    faults = system.faults(gpu.index)
    name = system.current  # before the hang: a call on another GPU's thread may be recorded meanwhile
    _hang(faults.get("hang_s", {}), name)
    code = faults.get(name, faults.get("*"))
    if code is not None:
        raise NVMLError(code)
    return gpu


def _privileged(system: FakeSystem) -> None:
    if not system.root:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)


# ---- the API ----
def nvmlInitWithFlags(flags):
    system = _enter("nvmlInitWithFlags", needs_init=False)
    if not system.library_found:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if not system.driver_loaded:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    system.init_count += 1


def nvmlInit():
    nvmlInitWithFlags(0)


def nvmlShutdown():
    system = _enter("nvmlShutdown")
    system.init_count -= 1


def _string(system: FakeSystem, text: str):
    """A string as the installed bindings return it: str (nvidia-ml-py), bytes (the legacy pynvml package)."""
    return text.encode() if system.legacy_bytes else text


def nvmlSystemGetDriverVersion():
    system = _enter("nvmlSystemGetDriverVersion")
    return _string(system, system.driver_version)


def nvmlDeviceGetCount():
    return len(_enter("nvmlDeviceGetCount").gpus)


def nvmlDeviceGetHandleByIndex(index):
    system = _enter("nvmlDeviceGetHandleByIndex")
    if not 0 <= int(index) < len(system.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(int(index))


def nvmlDeviceGetHandleByUUID(uuid):
    system = _enter("nvmlDeviceGetHandleByUUID")
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in system.gpus:
        if gpu.uuid == text:
            return _Handle(gpu.index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle):
    system = _enter("nvmlDeviceGetIndex")
    return _gpu(system, handle).index


def nvmlDeviceGetUUID(handle):
    system = _enter("nvmlDeviceGetUUID")
    return _string(system, _gpu(system, handle).uuid)


def nvmlDeviceGetMinorNumber(handle):
    gpu = _gpu(_enter("nvmlDeviceGetMinorNumber"), handle)
    if gpu.minor_number == -1:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.index if gpu.minor_number is None else gpu.minor_number


def nvmlDeviceGetName(handle):
    system = _enter("nvmlDeviceGetName")
    return _string(system, _gpu(system, handle).name)


def nvmlDeviceGetSupportedMemoryClocks(handle):
    system = _enter("nvmlDeviceGetSupportedMemoryClocks")
    return sorted(_gpu(system, handle).memory_clocks_mhz, reverse=True)


def nvmlDeviceGetSupportedGraphicsClocks(handle, memoryClockMHz):
    system = _enter("nvmlDeviceGetSupportedGraphicsClocks")
    table = _gpu(system, handle).graphics_table(int(memoryClockMHz))
    if table is None:
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # the documented answer for a memory clock the GPU does not support
    return sorted(table, reverse=True)


def nvmlDeviceGetClockInfo(handle, type):
    system = _enter("nvmlDeviceGetClockInfo")
    gpu = _gpu(system, handle)
    with system.lock:
        if type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
            return gpu.clock_and_reasons()[0]
        if type == NVML_CLOCK_MEM:
            return max(gpu.memory_clocks_mhz)
        if type == NVML_CLOCK_VIDEO:
            return 1350
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetMaxClockInfo(handle, type):
    system = _enter("nvmlDeviceGetMaxClockInfo")
    gpu = _gpu(system, handle)
    if type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
        return gpu.top_clock_mhz
    if type == NVML_CLOCK_MEM:
        return max(gpu.memory_clocks_mhz)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def _clock_reasons(name, handle):
    system = _enter(name)
    gpu = _gpu(system, handle)
    with system.lock:
        reasons = gpu.clock_and_reasons()[1]
    bits = 0
    for reason in reasons:
        bits |= _REASON_BITS[reason]
    return bits


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    if not fake_system().clock_events_api:  # pynvml's answer for a symbol the driver's library lacks (< R535)
        fake_system().record("nvmlDeviceGetCurrentClocksEventReasons")
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _clock_reasons("nvmlDeviceGetCurrentClocksEventReasons", handle)


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    return _clock_reasons("nvmlDeviceGetCurrentClocksThrottleReasons", handle)


def nvmlDeviceGetUtilizationRates(handle):
    system = _enter("nvmlDeviceGetUtilizationRates")
    gpu = _gpu(system, handle)
    if gpu.mig_mode:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return c_nvmlUtilization_t(gpu.utilization_read_pct(system.clock()), gpu.util_memory_pct)


def nvmlDeviceGetPowerUsage(handle):
    system = _enter("nvmlDeviceGetPowerUsage")
    gpu = _gpu(system, handle)
    with system.lock:
        system.settle(gpu)
        return int(gpu.reported_power_mw())


def nvmlDeviceGetTotalEnergyConsumption(handle):
    system = _enter("nvmlDeviceGetTotalEnergyConsumption")
    gpu = _gpu(system, handle)
    if not gpu.supports_energy:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    cost_s = next(ENERGY_READ_S)
    if cost_s:  # what a read costs on a real GPU (an H200: 8-10 ms), spent here as CPU
        end_s = time.perf_counter() + cost_s
        while time.perf_counter() < end_s:
            pass
    with system.lock:
        system.settle(gpu)
        return max(0, gpu.counter_mj() + int(system.faults(gpu.index).get("energy_offset_mj", 0)))


def nvmlDeviceGetTemperature(handle, sensor):
    system = _enter("nvmlDeviceGetTemperature")
    _gpu(system, handle)
    return 45


def nvmlDeviceGetPowerManagementLimit(handle):
    system = _enter("nvmlDeviceGetPowerManagementLimit")
    gpu = _gpu(system, handle)
    if not gpu.supports_power_limit:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.power_limit_mw


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return nvmlDeviceGetPowerManagementLimit(handle)


def nvmlDeviceGetPowerManagementDefaultLimit(handle):
    system = _enter("nvmlDeviceGetPowerManagementDefaultLimit")
    gpu = _gpu(system, handle)
    if not gpu.supports_power_limit:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.default_power_limit_mw


def nvmlDeviceGetPowerManagementLimitConstraints(handle):
    system = _enter("nvmlDeviceGetPowerManagementLimitConstraints")
    gpu = _gpu(system, handle)
    if not gpu.supports_power_limit:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return list(gpu.power_limit_range_mw)


def nvmlDeviceSetPowerManagementLimit(handle, limit):
    system = _enter("nvmlDeviceSetPowerManagementLimit")
    gpu = _gpu(system, handle)
    if not gpu.supports_power_limit:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    _privileged(system)
    low, high = gpu.power_limit_range_mw
    if not low <= int(limit) <= high:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    with system.lock:
        system.settle(gpu)
        gpu.power_limit_mw = int(limit)


def nvmlDeviceSetGpuLockedClocks(handle, minGpuClockMHz, maxGpuClockMHz):
    system = _enter("nvmlDeviceSetGpuLockedClocks")
    gpu = _gpu(system, handle)
    if not gpu.supports_locking:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    _privileged(system)
    low, high = int(minGpuClockMHz), int(maxGpuClockMHz)
    symbolic = {NVML_CLOCK_LIMIT_ID_TDP, NVML_CLOCK_LIMIT_ID_UNLIMITED}
    if (low in symbolic) != (high in symbolic) or low > high:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # mixed numeric and symbolic values are refused (NVML docs)
    with system.lock:
        system.settle(gpu)
        if low == high == NVML_CLOCK_LIMIT_ID_UNLIMITED:
            gpu.locked_mhz = None
        elif low in symbolic:
            gpu.locked_mhz = (gpu.top_clock_mhz, gpu.top_clock_mhz)
        else:
            gpu.locked_mhz = (low, high)


def nvmlDeviceResetGpuLockedClocks(handle):
    system = _enter("nvmlDeviceResetGpuLockedClocks")
    gpu = _gpu(system, handle)
    if not gpu.supports_locking:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    _privileged(system)
    with system.lock:
        system.settle(gpu)
        gpu.locked_mhz = None


__all__ = [name for name in dir() if name.startswith(("nvml", "NVML", "c_nvml"))] + [
    "FakeGpu", "FakeSystem", "ManualClock", "default_gpus", "system_from_config", "fake_reset", "fake_system",
]
