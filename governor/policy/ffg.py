"""FFG's frequency file (ffg.json, written by the pipeline's `ffg` stage): the one reader, for the daemon and the
pipeline alike. Plain JSON and the standard library only, so that neither side pulls in the other's dependencies."""

from __future__ import annotations

import json
import os

from governor.errors import ModelError
from governor.policy.tree import MAX_LEAF_HZ, MIN_LEAF_HZ, read_model_bytes


def read_ffg_hz(path: str | os.PathLike[str]) -> int:
    """``freq_hz`` of an ffg.json: an integer in Hz, read as a GPU clock as a tree's leaf is (816, meant as MHz, would
    pin every job at the lowest level). ModelError naming the file and the fault otherwise."""
    try:
        doc = json.loads(read_model_bytes(path))
    except OSError as e:
        raise ModelError(f"cannot read FFG frequency from {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise ModelError(f"cannot read FFG frequency from {path}: not JSON ({e})") from e
    hz = doc.get("freq_hz") if isinstance(doc, dict) else None
    if not isinstance(hz, int) or isinstance(hz, bool) or hz <= 0:
        raise ModelError(f"{path}: freq_hz must be a positive integer (Hz), got {hz!r}")
    if not MIN_LEAF_HZ <= hz <= MAX_LEAF_HZ:
        raise ModelError(f"{path}: freq_hz {hz} is no GPU clock in Hz (1 MHz to 10 GHz; 816 MHz is 816000000)")
    return hz
