"""Which GPU a job runs on: the daemon matches a job's ``gpu`` field to a device, the client fills that field.

The names are NVML's: an index ("0", in NVML's order) or a UUID ("GPU-8f1c..."). A UUID is exact everywhere. NVML's
reference promises neither a stable index order nor any relation to CUDA's ("The NVML index may not correlate with
other APIs, such as the CUDA device index", nvmlDeviceGetHandleByIndex); in practice NVML's follows the PCI bus id,
and CUDA's does with CUDA_DEVICE_ORDER=PCI_BUS_ID (its default orders fastest first; that alike GPUs then still come
in PCI order is unverified, and a cgroup that hides GPUs renumbers CUDA's). So the client sends a UUID whenever it
can find one, and an index is only as right as those assumptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from governor.errors import BackendError


class GpuNotFound(BackendError):
    """A job named a GPU the daemon does not have (or named none where there are several)."""


def _names(gpus: Sequence[Any]) -> str:
    return ", ".join(f"{g.id} ({g.uuid or 'no UUID'})" for g in gpus) or "none"


def _here(gpus: Sequence[Any]) -> str:
    """The GPUs there are, as a clause ("there are 0 (no UUID)" read as if there were none)."""
    if not gpus:
        return "there is no GPU here"
    if len(gpus) == 1:
        return f"the only GPU here is {_names(gpus)}"
    return f"the GPUs here are {_names(gpus)}"


# How Slurm's GPU numbers (SLURM_JOB_GPUS, the prolog's CUDA_VISIBLE_DEVICES) name this node's GPUs: "index", in
# NVML's order; "device_file", in the order of their device files /dev/nvidiaN; "auto", where both orders agree.
SlurmNumbering = Literal["auto", "index", "device_file"]
SLURM_NUMBERINGS: tuple[str, ...] = get_args(SlurmNumbering)


def find_slurm_gpu(gpus: Sequence[Any], number: int, numbering: str = "auto"):
    """The device among ``gpus`` that Slurm's GPU ``number`` names on this node.

    Slurm's number is its own GRES index: the GPU's place in slurmd's list of the node's GPUs (Slurm 22.05 gives the
    prolog 0 for a node's first GPU whose device file is /dev/nvidia1: tests/slurm). That list is in the order of
    the device files where gres.conf lists them (File=/dev/nvidia[0-7]), and in NVML's where Slurm's AutoDetect=nvml
    orders it so (gres_gpu.c, in the releases that sort by NVML's enumeration; unverified on a node). The two orders
    agree on most nodes; where they do not (PrincetonUniversity/jobstats#34: /dev/nvidia0 was nvidia-smi's GPU 6),
    "auto" takes neither: pinning another job's GPU is worse than pinning none, and the error says which setting
    decides. "device_file" counts the node's GPUs by device file, so it assumes gres.conf lists all of them. Where
    no GPU reports a device file (a Jetson), NVML's (the backend's) index; where only some do, only "index" reads.
    """
    if numbering not in SLURM_NUMBERINGS:
        raise GpuNotFound(f"gpu_numbering {numbering!r} is none of {', '.join(SLURM_NUMBERINGS)}")
    unknown = [g for g in gpus if g.device_minor is None]
    if numbering == "index" or len(unknown) == len(gpus):
        return find_gpu(gpus, number)
    if unknown:  # the files' order is unknown, so neither device_file nor auto's check that both orders agree holds
        raise GpuNotFound(f"Slurm's GPU {number} is not read by device file here: NVML's GPU(s) "
                          f"{', '.join(g.id for g in unknown)} report no device file (nvmlDeviceGetMinorNumber failed "
                          "for them); set gpu_numbering in the prolog's slurm.yaml to "
                          "index where Slurm orders GPUs as NVML does: see docs/slurm.md")
    by_file = sorted(gpus, key=lambda g: g.device_minor)
    in_file_order = by_file[number] if 0 <= number < len(by_file) else None
    if numbering == "device_file":
        if in_file_order is None:
            raise GpuNotFound(f"Slurm's GPU {number} is not here: the GPUs here, by device file, are {_files(by_file)}")
        return in_file_order
    in_index_order = next((g for g in gpus if g.id == str(number)), None)
    if in_file_order is not None and in_file_order is in_index_order:
        return in_file_order
    if in_file_order is None and in_index_order is None:
        raise GpuNotFound(f"Slurm's GPU {number} is not here: the GPUs here are {_files(by_file)}")
    raise GpuNotFound(f"Slurm's GPU {number} is ambiguous on this node: in NVML's order it is "
                      f"{_file(in_index_order)}, in the device files' {_file(in_file_order)}; set gpu_numbering in the "
                      "prolog's slurm.yaml to index (Slurm orders GPUs as NVML does) or device_file (as their device "
                      "files): see docs/slurm.md")


def orders_differ(minors: dict[str, int | None]) -> str | None:
    """Where NVML's order of this node's GPUs (``minors``: NVML's index -> its device file's number) is not their
    device files' order, in words, for the log and `ftgov doctor`; None where they agree or a file is unknown."""
    if not minors or any(m is None for m in minors.values()):
        return None
    by_index = sorted(minors, key=int)
    if by_index == sorted(minors, key=lambda gid: minors[gid]):
        return None
    pairs = ", ".join(f"{gid} is /dev/nvidia{minors[gid]}" for gid in by_index)
    return (f"NVML's order of the GPUs is not their device files' ({pairs}): a Slurm prolog's GPU numbers need "
            "gpu_numbering in its slurm.yaml (docs/slurm.md)")


def _file(gpu) -> str:
    return "no GPU" if gpu is None else f"NVML's GPU {gpu.id} (/dev/nvidia{gpu.device_minor})"


def _files(gpus: Sequence[Any]) -> str:
    return ", ".join(f"{g.id} (/dev/nvidia{g.device_minor})" for g in gpus)


def as_index(key: str | int) -> int | None:
    """The index ``key`` names as find_gpu reads it (an int, or ASCII digits with blanks around them); None where it
    names none (a UUID). Whatever decides by a key's kind asks this, so that no key reads as a UUID there and as an
    index here."""
    if isinstance(key, int):
        return key
    text = str(key).strip()
    # ASCII digits only: str.isdigit() also takes "²" (which int() refuses) and int() takes "٣" (Arabic-Indic three).
    return int(text) if text.isascii() and text.isdigit() else None


def find_gpu(gpus: Sequence[Any], key: str | int | None):
    """The device among ``gpus`` (objects with ``id`` and ``uuid``, None where the device has none) that ``key`` names.

    key: an index (int or decimal string), a full UUID, or a unique UUID prefix such as "GPU-8f1c" (as
    CUDA_VISIBLE_DEVICES accepts); None picks the only GPU, and is an error when there are several.
    A single GPU that has no UUID (the Orin's devfreq GPU) takes any UUID: clients fill ``gpu`` from CUDA (torch
    reports a UUID on a Jetson too), and there is no other GPU it could mean. A wrong index is still wrong.
    """
    if key is None:
        if len(gpus) == 1:
            return gpus[0]
        raise GpuNotFound(f"the job names no GPU and there are {len(gpus)} ({_names(gpus)}): pass gpu (index or UUID)")
    if isinstance(key, bool):
        raise GpuNotFound(f"gpu must be an index or a UUID, not {key!r}")
    index = as_index(key)
    if index is not None:
        for gpu in gpus:
            if gpu.id == str(index):
                return gpu
        raise GpuNotFound(f"no GPU with index {index}: {_here(gpus)}")
    text = str(key).strip()
    if text.upper().startswith("GPU-") and len(gpus) == 1 and not gpus[0].uuid:
        return gpus[0]
    if text.upper().startswith("MIG-"):
        raise GpuNotFound(f"{text} is a MIG instance: clocks belong to the whole GPU, so name the GPU it is part of")
    matches = [g for g in gpus if g.uuid and g.uuid.lower().startswith(text.lower())]
    exact = [g for g in matches if g.uuid.lower() == text.lower()]
    if exact:
        return exact[0]
    if len(matches) == 1 and text.upper().startswith("GPU-"):
        return matches[0]
    if len(matches) > 1:
        raise GpuNotFound(f"{text} matches several GPUs ({_names(matches)}): give more of the UUID")
    raise GpuNotFound(f"no GPU named {text!r}: {_here(gpus)}")
