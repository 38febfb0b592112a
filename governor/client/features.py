"""What the client works out about the job it registers: the workload features from a model or its Hugging Face
config, the average tokens per sample from the batches, and the GPU this process computes on."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from governor.features import Features, IncompleteHFConfig, from_hf_config


def find_hf_config(model):
    """The Hugging Face config of a model, a PEFT wrapper, a LightningModule holding one, or a config itself; or
    None."""
    if model is None:
        return None
    if isinstance(model, Mapping) or _looks_like_config(model):
        return model
    config = getattr(model, "config", None)
    if _looks_like_config(config):
        return config
    modules = getattr(model, "modules", None)
    if callable(modules):  # a torch Module wrapping a transformers model somewhere inside
        for sub in modules():
            config = getattr(sub, "config", None)
            if _looks_like_config(config):
                return config
    return None


def _looks_like_config(obj) -> bool:
    return obj is not None and not isinstance(obj, Mapping) and hasattr(obj, "model_type") and hasattr(obj, "to_dict")


def resolve_features(model=None, **explicit) -> dict:
    """The features known so far: the model's config first, explicit numbers over it. seq_len may still be missing.

    Raises ValueError when what is known is invalid, or when the structure (model_type, num_layers, hidden_size) is
    neither given nor readable from ``model``.
    """
    known: dict = {}
    config = find_hf_config(model)
    if config is not None:
        try:
            known.update(from_hf_config(config, explicit))
        except IncompleteHFConfig as e:
            raise ValueError(f"{e.why}: pass {', '.join(e.missing)}") from None
    known.update({k: v for k, v in explicit.items() if v is not None})
    missing = [k for k in ("model_type", "num_layers", "hidden_size") if k not in known]
    if missing:
        source = f"no Hugging Face config found on {type(model).__name__}" if model is not None else "no model given"
        raise ValueError(f"job features missing: {', '.join(missing)} ({source}: pass model_type, num_layers "
                         "and hidden_size)")
    check_partial_features(known)  # seq_len may still be to measure: a bad number fails now, before training
    return known


def check_partial_features(values: dict) -> None:
    """Validate the features given so far, with stand-ins for the rest: a bad number fails when it is given."""
    stand_ins = {"model_type": "encoder", "num_layers": 1, "hidden_size": 1, "seq_len": 1.0}
    check_features({**stand_ins, **{k: v for k, v in values.items() if v is not None}})


def check_features(values: dict) -> Features:
    try:
        return Features(**values)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"invalid job features: {problems}") from None


def batch_tokens(batch=None, *, attention_mask=None) -> tuple[float, int] | None:
    """(non-padding tokens, samples) in one batch, from its attention mask; None when it carries no 2-D mask.

    ``batch`` is a mapping (a dict, a BatchEncoding, the keyword arguments of a forward call) or a tuple/list holding
    one. Without a mask the padded length is all there is, and the policy wants the real one, so we do not guess.
    """
    mask = attention_mask if attention_mask is not None else _find_mask(batch)
    if mask is None:
        return None
    shape = getattr(mask, "shape", None)
    if shape is not None:
        if len(shape) != 2 or shape[0] == 0:
            return None
        return float(mask.sum()), int(shape[0])
    if isinstance(mask, (list, tuple)) and mask and all(isinstance(row, (list, tuple)) for row in mask):
        return float(sum(sum(row) for row in mask)), len(mask)
    return None


def _find_mask(batch):
    if isinstance(batch, Mapping):
        return batch.get("attention_mask")
    if isinstance(batch, (list, tuple)):
        for item in batch:
            if isinstance(item, Mapping) and item.get("attention_mask") is not None:
                return item["attention_mask"]
    return None


def visible_entries(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: entries up to the first one that is not a valid name."""
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if (entry.isascii() and entry.isdigit()) or entry.upper().startswith(("GPU-", "MIG-")):
            entries.append(entry)
        else:
            break  # CUDA ignores an invalid entry and everything after it ("-1" hides every GPU)
    return entries


def driver_gpu_uuid(cuda_ordinal: int, load: Callable[[str], Any] = ctypes.CDLL) -> str | None:
    """NVML's "GPU-..." UUID of the process's CUDA device ``cuda_ordinal``, from CUDA's driver API (libcuda's
    cuDeviceGetUuid), for a torch older than 2.4 that does not report it; None when the driver cannot tell.

    Called only once torch has initialized CUDA in this process (cuInit is then a no-op): initializing it here first
    would leave a process that forks its data loaders unable to use CUDA in them.
    """
    try:
        cuda = load("libcuda.so.1")
        device, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), cuda_ordinal) or cuda.cuDeviceGetUuid(raw, device):
            return None  # a CUresult other than CUDA_SUCCESS
    except (OSError, AttributeError):
        return None  # no libcuda (no NVIDIA driver), or one without the call (before CUDA 9.2)
    b = bytes(raw)
    if not any(b):
        return None
    # nvidia-smi's form: GPU-8 4 4 4 12 hex digits. cuDeviceGetUuid (the first version) gives the GPU's own UUID
    # under MIG too, as the daemon wants (clocks are the whole GPU's); unverified on a MIG GPU.
    return f"GPU-{b[:4].hex()}-{b[4:6].hex()}-{b[6:8].hex()}-{b[8:10].hex()}-{b[10:].hex()}"


def visible_gpu(environ: Mapping[str, str] | None = None, torch_module: Any = None,
                driver_uuid: Callable[[int], str | None] = driver_gpu_uuid) -> str | None:
    """The GPU this process computes on, as the daemon's ``gpu`` field: a UUID when torch or the CUDA driver can
    tell, else an index.

    Uses torch only if the process has already imported it (importing torch here would cost seconds) or one is
    passed, and only once torch has initialized CUDA (cuda_pending): asking it for the current device earlier would
    initialize CUDA here, a context of a few hundred MB on device 0, which under torchrun is every rank's before it
    calls set_device, and the answer would be 0 for every rank. The UUID comes from torch (2.4 and later), else from
    the driver (``driver_uuid``): a CUDA index is the process's own numbering, which inside a cgroup that hides GPUs
    (Slurm's ConstrainDevices) need not be NVML's. None when nothing says which GPU: the daemon then picks the only
    one, or asks.
    """
    env = os.environ if environ is None else environ
    torch = torch_module if torch_module is not None else sys.modules.get("torch")
    cuda_ordinal: int | None = None
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                cuda_ordinal = int(torch.cuda.current_device())
                uuid = getattr(torch.cuda.get_device_properties(cuda_ordinal), "uuid", None)  # torch >= 2.4
                if uuid is not None and str(uuid):
                    text = str(uuid)
                    return text if text.upper().startswith(("GPU-", "MIG-")) else f"GPU-{text}"
                text = driver_uuid(cuda_ordinal)
                if text is not None:
                    return text
        except (RuntimeError, AssertionError, AttributeError):
            pass  # torch built without CUDA or a broken driver: fall back to the environment
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None if cuda_ordinal is None else str(cuda_ordinal)
    entries = visible_entries(visible)
    ordinal = cuda_ordinal or 0
    return entries[ordinal] if ordinal < len(entries) else None


def cuda_pending(torch_module: Any = None) -> bool:
    """Whether this process has imported a torch built with CUDA that has not initialized CUDA yet: the GPU it will
    compute on is not chosen yet (torch.cuda.set_device, a model's .to("cuda:N")). Initializes nothing."""
    torch = torch_module if torch_module is not None else sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.backends.cuda.is_built()) and not torch.cuda.is_initialized()
    except AttributeError:
        return False


def launched_gpu(environ: Mapping[str, str] | None = None,
                 driver_uuid: Callable[[int], str | None] = driver_gpu_uuid) -> str | None:
    """The GPU a command that a launcher starts will compute on (asked by `ftgov run`'s keeper), as the daemon's
    ``gpu`` field: a GPU's UUID named in CUDA_VISIBLE_DEVICES as it is, else the UUID of the first device
    CUDA's driver shows under this process's environment and cgroup, else visible_gpu's answer (an index, or a MIG
    instance's UUID, which the daemon refuses with its reason).

    A number in CUDA_VISIBLE_DEVICES is CUDA's, and inside a Slurm job Slurm's or its cgroup's (ConstrainDevices
    makes it 0 whichever GPU it is), not NVML's index, so the launcher asks the driver. Initializing CUDA there is
    harmless (driver_gpu_uuid's caution is for a process that forks data loaders): `ftgov run` asks in its keeper, a
    process of its own that forks nothing after, and the command inherits none of it. ``environ`` must be the
    environment CUDA sees (this process's, the command's copy) for the driver's answer to be the command's.
    """
    env = os.environ if environ is None else environ
    named = visible_gpu(env)  # the launcher imports no torch: the environment's name
    if named is not None and named.upper().startswith("GPU-"):
        return named  # a MIG instance's UUID goes to the driver, which may give its GPU's (unverified under MIG)
    if env.get("CUDA_VISIBLE_DEVICES") is not None and named is None:
        return None  # CUDA shows the command no GPU
    return driver_uuid(0) or named


def slurm_job_id(environ: Mapping[str, str] | None = None) -> int | None:
    """The Slurm job this process runs in (SLURM_JOB_ID), for the daemon to join it to the prolog's hold of the job's
    GPUs; None outside Slurm or when the variable is not a job id."""
    env = os.environ if environ is None else environ
    value = env.get("SLURM_JOB_ID", "")
    return int(value) if value.isascii() and value.isdigit() and 0 < int(value) <= 1 << 53 else None
