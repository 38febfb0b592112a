"""NVML calls with a deadline: each GPU's calls run on a thread of its own, so a call the driver never answers (a GPU
off the bus, Xid 79; a wedged driver) holds up that GPU alone, and its caller for no longer than the deadline.

NVML has no timeouts of its own, and such a call blocks in the kernel (an ioctl in uninterruptible sleep, where even
SIGKILL waits). ctypes releases the GIL for the call, so the caller can stop waiting while the thread stays blocked,
and NVML allows it: "NVML is thread-safe so it is safe to make simultaneous NVML calls from multiple threads" (NVML API
Reference). One plain daemon thread per GPU, fed by a queue: not a ThreadPoolExecutor, whose threads the interpreter
joins at exit, so that a hung one would keep ftgovd and `ftgov restore` from exiting.

A call past its deadline raises NvmlNotAnswering. From then on the GPU's calls fail at once with the same message
(the same text, so that the daemon's checks, which log an error when it first comes and when it changes, say it
once) and nothing queues behind the stuck call; once it has returned, the GPU's next call goes through, and says so
in the log. Everything is logged from the caller's thread: the daemon's handler writes after the event loop's turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from governor.errors import BackendError

log = logging.getLogger(__name__)

# An NVML call normally takes microseconds to a few ms (an H200's energy counter read, the dearest the daemon makes
# often: 4-12 ms, docs/daemon-cpu.md); a clock lock's latency is not documented (unverified). 1 s is a hundred times
# the dearest measured. The daemon's event loop waits out one deadline per GPU that stops answering (later calls
# fail at once): eight GPUs of a wedged driver cost it 8 s, under the 13 s a stall may last unnoticed by systemd's
# watchdog (WatchdogSec 20 s in systemd/ftgovd.service, pinged every third of it).
CALL_TIMEOUT_S = 1.0
# nvmlInit: with persistence mode off the driver brings every GPU up at each init, which takes seconds on a node of
# several GPUs (nvidia-persistenced keeps them up). Before READY=1 systemd's TimeoutStartSec (180 s) bounds start.
INIT_TIMEOUT_S = 15.0
# nvmlInit while the daemon serves (a probe again after none was found at start): on the event loop, so well under
# what the watchdog lets pass, whatever nvml_init_timeout_s says.
SERVING_INIT_TIMEOUT_S = 5.0


class NvmlNotAnswering(BackendError):
    """An NVML call did not return within its deadline: the GPU (or the driver) is not answering."""


class _Call:
    __slots__ = ("fn", "args", "name", "done", "returned", "result", "error", "started_s")

    def __init__(self, fn: Callable, args: tuple, name: str):
        self.fn, self.args, self.name = fn, args, name
        self.done = threading.Event()
        self.returned = False  # set under the caller's lock, so a deadline and a late return agree on which came first
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_s = time.monotonic()


class NvmlWorker:
    """The thread that makes one GPU's NVML calls (or NVML's process-wide ones: init, device count).

    ``who`` names the GPU in errors ("GPU 1 (GPU-8f1c...)"); set it again once the UUID is known. The thread starts at
    the first call and lives as long as the process (a daemon thread, never joined).
    """

    def __init__(self, who: str, timeout_s: float = CALL_TIMEOUT_S,
                 cause: str = "the GPU may have fallen off the bus (Xid 79) or its driver hung"):
        self.who = who
        self.cause = cause  # the likely cause, in an error's words
        self.timeout_s = timeout_s
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stuck: _Call | None = None  # a call past its deadline that has not returned
        self._stuck_error: str | None = None
        self._answered_again: str | None = None  # said at the next call, from the caller's thread

    def call(self, name: str, fn: Callable, *args, timeout_s: float | None = None) -> Any:
        """``fn(*args)`` on this worker's thread; what it returns or raises, or NvmlNotAnswering after the deadline
        (``timeout_s``, else the worker's), or at once while an earlier call is still stuck."""
        with self._lock:
            if self._stuck is not None:
                raise NvmlNotAnswering(self._stuck_error)
            again, self._answered_again = self._answered_again, None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"nvml {self.who}", daemon=True)
                self._thread.start()
        if again is not None:
            log.info("%s answers again: %s", self.who, again)
        call = _Call(fn, args, name)
        self._calls.put(call)
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        if not call.done.wait(deadline_s):
            with self._lock:
                if not call.returned:
                    self._stuck = call
                    self._stuck_error = (
                        f"{self.who}: NVML did not answer {name} within {deadline_s:g} s; {self.cause}: look for "
                        "an Xid in `dmesg` and check `nvidia-smi`. Its calls fail at once until that one returns")
                    log.warning("%s is not answering: %s has not returned after %g s (its other calls fail at once "
                                "until it does; look for an Xid in `dmesg`, check `nvidia-smi`)", self.who, name,
                                deadline_s)
                    raise NvmlNotAnswering(self._stuck_error)
        if call.error is not None:
            raise call.error
        return call.result

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            try:
                call.result = call.fn(*call.args)
            except BaseException as e:  # handed to the caller, whatever it is
                call.error = e
            with self._lock:
                call.returned = True
                if self._stuck is call:
                    self._stuck = self._stuck_error = None
                    self._answered_again = f"{call.name} returned after {time.monotonic() - call.started_s:.1f} s"
            call.done.set()


class BoundedNvml:
    """The pynvml module (or a ReadOnlyNvml over it) with every ``nvml*`` function called through one worker, so all
    of a GPU's calls, whoever makes them, have the deadline. Constants and error classes pass through."""

    def __init__(self, nvml: Any, worker: NvmlWorker):
        self._nvml = nvml
        self.worker = worker

    def __dir__(self):
        return dir(self._nvml)  # the NVML_ERROR_* names, for the messages

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not (callable(value) and name.startswith("nvml")):
            return value
        worker = self.worker

        def bounded(*args):
            return worker.call(name, value, *args)
        return bounded
