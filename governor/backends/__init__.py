"""GPU backends behind one protocol (governor.backends.base.Gpu), probed in a fixed order.

As power-profiles-daemon's drivers and Zeus's device factories: each backend module exposes ``probe(...)``, which only
reads and raises NodeNotFound when its hardware is not there; the first backend in ORDER that finds a GPU governs.
devfreq comes first: a Jetson's GPU node is the device to pin there even if an NVML library is installed. The devfreq
node can appear late at boot (it shows up only after the GPU first powers up), so probe_gpus waits for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from governor.backends import devfreq, nvml
from governor.backends.base import Gpu
from governor.backends.nvmlcalls import INIT_TIMEOUT_S
from governor.errors import FtgovError, NodeNotFound
from governor.sysfs import Root

log = logging.getLogger("ftgovd")

ORDER = ("devfreq", "nvml")
LATE = frozenset({"devfreq"})  # backends whose device may still appear: waited for up to node_wait_s


def probe_one(name: str, root: Root, *, read_only: bool = False,
              nvml_init_timeout_s: float = INIT_TIMEOUT_S) -> list[Gpu]:
    """One backend's GPUs; NodeNotFound when it finds none."""
    if name == "devfreq":
        return devfreq.probe(root)
    if name == "nvml":
        # In observe mode the NVML handle refuses every call that would change the GPU: safe on a shared machine.
        return nvml.probe(read_only=read_only, init_timeout_s=nvml_init_timeout_s)
    raise ValueError(f"unknown backend {name!r}; known: {', '.join(ORDER)}")


def may_appear_later(backend: str) -> bool:
    """Whether a GPU of this backend setting ("auto" or one name) may still appear after a probe found none."""
    return any(name in LATE for name in (ORDER if backend == "auto" else (backend,)))


def probe_gpus(backend: str, root: Root, *, node_wait_s: float = 0.0, read_only: bool = False,
               on_wait: Callable[[str, float], None] | None = None,
               nvml_init_timeout_s: float = INIT_TIMEOUT_S) -> list[Gpu]:
    """The GPUs of the first backend that finds any (``backend``: "auto" for ORDER, or one name).

    A backend in LATE is retried until node_wait_s has passed; the others are asked once (an NVML library without a
    driver does not come later). ``on_wait(why, wait_s)`` is told once, when the waiting starts. NodeNotFound after
    the wait, naming what each backend said.
    """
    names = ORDER if backend == "auto" else (backend,)
    deadline = time.monotonic() + node_wait_s
    delay_s, waiting, errors = 0.25, False, {}
    while True:
        for name in names:
            if waiting and name not in LATE:
                continue
            try:
                return probe_one(name, root, read_only=read_only, nvml_init_timeout_s=nvml_init_timeout_s)
            except NodeNotFound as e:
                errors[name] = e
            except FtgovError as e:
                if backend != "auto":
                    raise
                errors[name] = e  # auto: a broken NVML must not hide a devfreq node that is still to come
        why = "; ".join(str(e) for e in errors.values())
        if not any(n in LATE for n in names) or time.monotonic() >= deadline:
            waited = (f" (waited {node_wait_s:g} s; node_wait_s in the config)"
                      if node_wait_s > 0 and any(n in LATE for n in names) else "")
            raise NodeNotFound(f"{why}{waited}") from errors.get(names[0])
        if not waiting:
            log.warning("%s; waiting up to %g s for it", why, node_wait_s)
            if on_wait is not None:
                on_wait(why, node_wait_s)
            waiting = True
        time.sleep(min(delay_s, max(0.0, deadline - time.monotonic())))
        delay_s = min(delay_s * 2, 5.0)
