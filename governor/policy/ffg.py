"""FFG's frequency file (ffg.json, written by the pipeline's `ffg` stage): the one reader, for the daemon and the
pipeline alike. Plain JSON and the standard library only, so that neither side pulls in the other's dependencies."""

from __future__ import annotations

import json
import os

from governor.errors import ModelError
from governor.policy.tree import read_model_bytes


def read_ffg_hz(path: str | os.PathLike[str]) -> int:
    """``freq_hz`` of an ffg.json: a positive integer in Hz. ModelError naming the file and the fault otherwise."""
    try:
        doc = json.loads(read_model_bytes(path))
    except OSError as e:
        raise ModelError(f"cannot read FFG frequency from {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise ModelError(f"cannot read FFG frequency from {path}: not JSON ({e})") from e
    hz = doc.get("freq_hz") if isinstance(doc, dict) else None
    if not isinstance(hz, int) or isinstance(hz, bool) or hz <= 0:
        raise ModelError(f"{path}: freq_hz must be a positive integer (Hz), got {hz!r}")
    return hz
