"""The client core: a JSON-RPC connection to ftgovd and the ``job`` that training code holds for its life.

Everything else that talks to the daemon (the Hugging Face and Lightning callbacks, ``ftgov run``, ``ftgov status``)
is a thin layer over this module. It needs nothing beyond the standard library and pydantic (through
governor.features), so importing it costs nothing on a training machine.

The job's hold on the GPU frequency lives as long as its connection: the daemon ends a job at ``unregister``, when the
connection closes, or when the process exits. A job therefore keeps its connection open and closes it on every way out.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket as socketlib
import time
import warnings
from collections.abc import Mapping

from pydantic import ValidationError

from governor import errors
from governor.errors import FtgovError
from governor.features import Features, from_hf_config

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/run/ftgov/ftgov.sock"
SOCKET_ENV = "FTGOV_SOCKET"
# The group that may use the socket (the systemd .socket unit's SocketGroup).
SOCKET_GROUP = "ftgov"
# Progress goes out at most this often. A fine-tuning step on an Orin takes 100 ms or more, so every step is reported
# (the tuner times steps from these reports); faster loops are sampled, and a step costs a clock read.
DEFAULT_REPORT_EVERY_S = 0.1
# One reply line is a few hundred bytes; a status with many jobs a few kilobytes. Anything past this is not ftgovd.
MAX_REPLY_BYTES = 1 << 20


class DaemonUnavailable(FtgovError):
    """ftgovd cannot be reached: no socket, nobody listening, or the connection broke."""


class SocketPermissionError(DaemonUnavailable):
    """The socket exists but this user may not connect to it."""


class RpcError(FtgovError):
    """ftgovd answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data=None, method: str | None = None):
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        field = data.get("field") if isinstance(data, dict) else None
        where = f" (field {field!r})" if field else ""
        super().__init__(f"{method + ': ' if method else ''}{message}{where} [JSON-RPC {code}]")


class ParseError(RpcError):
    """-32700: the daemon could not parse what was sent."""


class InvalidRequest(RpcError):
    """-32600: not a valid JSON-RPC request."""


class MethodNotFound(RpcError):
    """-32601: the daemon has no such method (an older daemon?)."""


class InvalidParams(RpcError):
    """-32602: a parameter is missing or out of range; ``data["field"]`` names it."""


class ServerError(RpcError):
    """-32000: the daemon could not do it (a failed pin, a backend error)."""


class NotPermitted(RpcError):
    """-32001: the daemon refused this caller (e.g. registering a process it does not own)."""


class LimitExceeded(RpcError):
    """-32002: a daemon limit (connections, jobs) is reached."""


class UnknownJob(RpcError):
    """-32003: no such job on this connection (it ended: its process exited, or it was unregistered)."""


_ERROR_CLASSES: dict[int, type[RpcError]] = {
    errors.PARSE_ERROR: ParseError,
    errors.INVALID_REQUEST: InvalidRequest,
    errors.METHOD_NOT_FOUND: MethodNotFound,
    errors.INVALID_PARAMS: InvalidParams,
    errors.SERVER_ERROR: ServerError,
    errors.PERMISSION_DENIED: NotPermitted,
    errors.LIMIT_EXCEEDED: LimitExceeded,
    errors.UNKNOWN_JOB: UnknownJob,
}


def rpc_error(code: int, message: str, data=None, method: str | None = None) -> RpcError:
    """The RpcError subclass for a JSON-RPC error code (RpcError itself for codes we do not know)."""
    return _ERROR_CLASSES.get(code, RpcError)(code, message, data, method)


class GovernorWarning(UserWarning):
    """Training goes on, but without the governor (the daemon is absent or refused the job)."""


def socket_path(socket: str | os.PathLike | None = None) -> str:
    """Where the daemon listens: the ``socket`` argument, else $FTGOV_SOCKET, else /run/ftgov/ftgov.sock."""
    if socket:
        return os.fspath(socket)
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class Connection:
    """A synchronous JSON-RPC 2.0 connection to ftgovd: one JSON object per line over a Unix stream socket.

    Not thread-safe: one connection belongs to one thread (the training loop).
    """

    def __init__(self, socket: str | os.PathLike | None = None, timeout_s: float = 10.0):
        self.path = socket_path(socket)
        self.timeout_s = timeout_s
        self._next_id = 1
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise _connect_error(self.path, e) from e
        self._sock = sock
        self._reader = sock.makefile("rb")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def closed_by_daemon(self) -> bool:
        """Whether ftgovd has closed its end (read without waiting, nothing consumed): it closes a connection that
        holds no job and sends nothing for its limits.idle_timeout_s, and it may have restarted meanwhile."""
        if self._sock is None:
            return True
        poll = select.poll()
        poll.register(self._sock, select.POLLIN)
        if not poll.poll(0):
            return False
        try:
            return self._sock.recv(1, socketlib.MSG_PEEK | socketlib.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:  # reset by the daemon
            return True

    def close(self) -> None:
        """Close the connection. The daemon ends any job still held by it."""
        if self._sock is not None:
            self._reader.close()
            self._sock.close()
            self._sock = None

    def call(self, method: str, **params) -> dict:
        """Send a request and wait for its reply; a JSON-RPC error becomes an RpcError subclass."""
        request_id = self._next_id
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": _drop_none(params)})
        reply = self._receive(method)
        # An error with a null id answers whatever we sent last: a refusal at connect time, an unparsable line.
        if reply.get("id") != request_id and not ("error" in reply and reply.get("id") is None):
            self.close()
            raise DaemonUnavailable(f"{method}: reply for request {reply.get('id')!r}, expected {request_id}")
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise rpc_error(int(error.get("code", -32603)), str(error.get("message", "unknown error")),
                            error.get("data"), method)
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    def notify(self, method: str, **params) -> None:
        """Send a notification: no id, and the daemon sends no reply."""
        self._send({"jsonrpc": "2.0", "method": method, "params": _drop_none(params)})

    def _send(self, message: dict) -> None:
        if self._sock is None:
            raise DaemonUnavailable(f"connection to {self.path} is closed")
        line = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        try:
            self._sock.sendall(line)
        except OSError as e:  # the daemon went away (EPIPE), or stopped reading for timeout_s
            self.close()
            raise DaemonUnavailable(f"lost the connection to ftgovd at {self.path}: {e}") from e

    def _receive(self, method: str) -> dict:
        # Lines without an id would be notifications from the daemon; the protocol has none yet, so skip them.
        while True:
            try:
                line = self._reader.readline(MAX_REPLY_BYTES)
            except OSError as e:  # includes the timeout
                self.close()
                raise DaemonUnavailable(f"{method}: no reply from ftgovd at {self.path}: {e}") from e
            if not line:
                self.close()
                raise DaemonUnavailable(f"{method}: ftgovd closed the connection at {self.path}")
            if not line.endswith(b"\n"):
                self.close()
                raise DaemonUnavailable(f"{method}: reply longer than {MAX_REPLY_BYTES} bytes")
            try:
                reply = json.loads(line)
            except ValueError as e:
                self.close()
                raise DaemonUnavailable(f"{method}: ftgovd sent something that is not JSON: {line[:80]!r}") from e
            if isinstance(reply, dict) and ("id" in reply or "error" in reply):
                return reply


def _connect_error(path: str, e: OSError) -> DaemonUnavailable:
    if isinstance(e, PermissionError):
        return SocketPermissionError(
            f"permission denied on {path}: join the group '{SOCKET_GROUP}' "
            f"(sudo usermod -aG {SOCKET_GROUP} $USER, then log in again), or run as root")
    if isinstance(e, FileNotFoundError):
        return DaemonUnavailable(
            f"ftgovd is not running: no socket at {path} "
            f"(start it with 'systemctl start ftgovd', or point {SOCKET_ENV} / --socket at its socket)")
    if isinstance(e, ConnectionRefusedError):
        return DaemonUnavailable(f"nothing listens on {path}: ftgovd stopped and left its socket behind?")
    return DaemonUnavailable(f"cannot connect to ftgovd at {path}: {e}")


def _drop_none(params: dict) -> dict:
    return {k: v for k, v in params.items() if v is not None}


# ----------------------------------------------------------------------------------------------------------------------
# Features


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
        known.update(from_hf_config(config))
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


# ----------------------------------------------------------------------------------------------------------------------
# The job


class Job:
    """A fine-tuning job registered with ftgovd for the life of a ``with`` block (see ``job``).

    States: created -> started (connected) -> registered -> closed. When the daemon is absent or refuses, the job
    warns once and becomes a no-op: every method still works and does nothing, so training never stops for us.

    When seq_len is not given, registration waits until ``observe_batch`` has seen ``measure_batches`` batches, so the
    daemon decides once, on the measured average, instead of pinning a guess and moving the pin a few steps later.
    """

    def __init__(self, features: dict, *, name: str | None = None, socket: str | os.PathLike | None = None,
                 pid: int | None = None, gpu: str | int | None = None, tune: bool | None = None,
                 report_every_s: float = DEFAULT_REPORT_EVERY_S,
                 measure_batches: int = 8, timeout_s: float = 10.0, total_steps: int | None = None):
        if report_every_s < 0:
            raise ValueError("report_every_s must be >= 0")
        if measure_batches < 1:
            raise ValueError("measure_batches must be >= 1")
        self.features = dict(features)
        self.name = name
        self.socket = socket
        self.pid = pid
        self.gpu = gpu
        self.tune = tune  # True: ask for the online tuner (policy tune) for this job
        # The step count the job ends at (same count as step()), when known: the tuner's exploration budget is a
        # fraction of the job's energy, so a short job explores less. None: the daemon's tuner assumes its default.
        self.total_steps = _check_total_steps(total_steps)
        self._sent_total_steps: int | None = None
        self.report_every_s = report_every_s
        self.measure_batches = measure_batches
        self.timeout_s = timeout_s
        self.job_id: int | None = None
        self.registration: dict | None = None  # the daemon's answer to register: policy, freq_hz, reason, gpu
        self.result: dict | None = None  # the daemon's answer to unregister: duration_s, energy_j, steps
        self.steps = 0
        self.disabled = False
        self._conn: Connection | None = None
        self._started = False
        self._closed = False
        self._reported_steps = 0
        self._next_report_s = 0.0
        self._phase: str | None = None
        self._tokens = 0.0
        self._samples = 0
        self._batches_seen = 0
        self._unmeasurable_batches = 0

    def __enter__(self) -> Job:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def registered(self) -> bool:
        return self.job_id is not None and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def seq_len_known(self) -> bool:
        return "seq_len" in self.features

    def start(self) -> Job:
        """Connect, and register now if the features are complete. Idempotent."""
        if self._started or self.disabled:
            return self
        self._started = True
        try:
            self._conn = Connection(self.socket, timeout_s=self.timeout_s)
        except DaemonUnavailable as e:
            self._disable(str(e))
            return self
        if self.seq_len_known:
            self._register()
        return self

    def observe_batch(self, batch=None, *, attention_mask=None) -> None:
        """Measure the average non-padding sequence length from the first batches; register once it is known.

        Costs nothing once the measurement is done (or when seq_len was given).
        """
        if self.seq_len_known or self.disabled or self._closed:
            return
        counted = batch_tokens(batch, attention_mask=attention_mask)
        if counted is None:
            self._unmeasurable_batches += 1
            if self._unmeasurable_batches == self.measure_batches and self._batches_seen == 0:
                self._disable("cannot measure the sequence length: the batches carry no 2-D attention_mask; "
                              "pass seq_len= (average tokens per sample)")
            return
        tokens, samples = counted
        self._tokens += tokens
        self._samples += samples
        self._batches_seen += 1
        if self._batches_seen >= self.measure_batches and self._tokens > 0:
            self.features["seq_len"] = self._tokens / self._samples
            log.info("ftgov: measured seq_len %.1f tokens/sample over %d samples", self.features["seq_len"],
                     self._samples)
            if self._started:
                self._register()

    def step(self, n: int = 1) -> None:
        """Count n training steps. Reports the total at most every report_every_s, so a step costs a clock read."""
        self.steps += n
        if self.job_id is None or self._conn is None:
            if (self._conn is not None and not self.seq_len_known and self.steps >= self.measure_batches
                    and self._batches_seen == 0 and self._unmeasurable_batches == 0):
                self._disable("seq_len is unknown and no batch was observed: pass seq_len= "
                              "or call job.observe_batch(batch) on the first batches")
            return
        now_s = time.monotonic()
        if now_s >= self._next_report_s:
            self._next_report_s = now_s + self.report_every_s
            self._report()

    def phase(self, phase: str) -> None:
        """Tell the daemon what the job does now ("train", "eval", "checkpoint", "data"); sent only on a change."""
        if phase == self._phase:
            return
        self._phase = phase
        if self.job_id is not None and self._conn is not None:
            self._report()

    def set_total_steps(self, total_steps: int | None) -> None:
        """The job's length (the step count it ends at), once known: sent with register, or with the next progress
        report when the job is registered already."""
        self.total_steps = _check_total_steps(total_steps)
        if self.job_id is not None and self._conn is not None and self.total_steps != self._sent_total_steps:
            self._report()

    def update(self, *, gpu_util: float | None = None, seq_len: float | None = None) -> dict | None:
        """Send new feature values; the daemon may move the pin. Returns its answer, None when not registered."""
        if seq_len is not None:
            self.features["seq_len"] = float(seq_len)
        if gpu_util is not None:
            self.features["gpu_util"] = float(gpu_util)
        if self.job_id is None or self._conn is None:
            if self._started and not self.disabled and self.seq_len_known:
                self._register()
            return None
        try:
            return self._conn.call("update", job_id=self.job_id, gpu_util=gpu_util, seq_len=seq_len)
        except FtgovError as e:
            self._disable(f"update refused: {e}")
            return None

    def close(self) -> None:
        """Report the final step count, unregister and close. Idempotent; never raises for the daemon's sake."""
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if self.job_id is not None:
                if self.steps != self._reported_steps:
                    conn.notify("progress", job_id=self.job_id, steps=self.steps, phase=self._phase)
                self.result = conn.call("unregister", job_id=self.job_id)
                log.info("ftgov: job %s ended: %s", self.job_id, describe_reply(self.result))
        except UnknownJob:
            log.info("ftgov: job %s had already ended (its process exited)", self.job_id)
        except FtgovError as e:
            # The job is over either way: closing the connection below ends it daemon-side.
            log.warning("ftgov: unregister of job %s failed (%s); closing the connection ends it", self.job_id, e)
        finally:
            conn.close()

    def _register(self) -> None:
        if self.job_id is not None or self._conn is None:
            return
        try:
            features = check_features(self.features)
        except ValueError as e:
            self._disable(str(e))
            return
        if self._conn.closed_by_daemon():
            # Measuring seq_len took longer than the daemon keeps a connection that holds no job (or the daemon
            # restarted): nothing was sent on it yet, so connecting again cannot register the job twice.
            log.info("ftgov: ftgovd closed the connection while the job started; connecting again")
            self._conn.close()
            try:
                self._conn = Connection(self.socket, timeout_s=self.timeout_s)
            except DaemonUnavailable as e:
                self._conn = None
                self._disable(str(e))
                return
        if self.gpu is None:
            from governor.backends.gpuid import visible_gpu

            self.gpu = visible_gpu()  # the GPU this process trains on (CUDA_VISIBLE_DEVICES / torch), when known
        try:
            self.registration = self._conn.call(
                "register", **features.model_dump(exclude_none=True), name=self.name, pid=self.pid, gpu=self.gpu,
                tune=self.tune, total_steps=self.total_steps)
        except FtgovError as e:
            self._disable(f"register refused: {e}")
            return
        self.job_id = self.registration.get("job_id")
        self._sent_total_steps = self.total_steps
        log.info("ftgov: job %s registered: %s", self.job_id, describe_reply(self.registration))
        if self.steps:
            self._report()

    def _report(self) -> None:
        total = self.total_steps if self.total_steps != self._sent_total_steps else None
        try:
            self._conn.notify("progress", job_id=self.job_id, steps=self.steps, phase=self._phase, total_steps=total)
            self._reported_steps = self.steps
            self._sent_total_steps = self.total_steps
        except DaemonUnavailable as e:
            self._disable(str(e))

    def _disable(self, why: str) -> None:
        """Warn once and carry on without the governor."""
        if self.disabled:
            return
        self.disabled = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        warnings.warn(f"ftgov: training goes on without the GPU frequency governor: {why}", GovernorWarning,
                      stacklevel=3)


def _check_total_steps(total_steps):
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                    or total_steps < 1):
        raise ValueError(f"total_steps must be a positive integer (the step count the job ends at), "
                         f"got {total_steps!r}")
    return total_steps


def describe_reply(reply: dict) -> str:
    """One line for a register/update/unregister answer: policy, frequency, duration, steps, energy, reason."""
    parts = []
    if reply.get("policy"):
        parts.append(str(reply["policy"]))
    if reply.get("freq_hz"):
        parts.append(f"{reply['freq_hz'] / 1e6:g} MHz")
    if reply.get("duration_s") is not None:
        parts.append(f"{reply['duration_s']:.1f} s")
    if reply.get("steps") is not None:
        parts.append(f"{reply['steps']} steps")
    if reply.get("energy_j") is not None:
        parts.append(f"{reply['energy_j']:.1f} J")
    if reply.get("saved_pct") is not None:
        parts.append(f"saved {reply['saved_pct']:g}% energy per step vs the default governor, measured over "
                     f"{reply.get('saved_measured_steps')} steps")
    if reply.get("reason"):
        parts.append(f"({reply['reason']})")
    return " ".join(parts)


def job(model=None, *, model_type: str | None = None, num_layers: int | None = None, hidden_size: int | None = None,
        seq_len: float | None = None, gpu_util: float | None = None, name: str | None = None,
        socket: str | os.PathLike | None = None, pid: int | None = None, gpu: str | int | None = None,
        tune: bool | None = None, report_every_s: float = DEFAULT_REPORT_EVERY_S, measure_batches: int = 8,
        total_steps: int | None = None) -> Job:
    """A job to hold for the life of a training run::

        with governor.job(model, name="bert-sst2") as job:
            for batch in loader:
                job.observe_batch(batch)   # measures seq_len from the first batches, then registers
                ...
                job.step()

    ``model`` is a Hugging Face model or config (its model_type, layers and hidden size are read); explicit numbers
    override it. ``total_steps``: the step count the job ends at, when known (the tuner explores less for a short
    job). Bad feature values raise ValueError here, before training starts; a daemon that is absent or refuses
    only warns (GovernorWarning), and the job does nothing.
    """
    features = resolve_features(model, model_type=model_type, num_layers=num_layers, hidden_size=hidden_size,
                                seq_len=float(seq_len) if seq_len is not None else None,
                                gpu_util=float(gpu_util) if gpu_util is not None else None)
    return Job(features, name=name, socket=socket, pid=pid, gpu=gpu, tune=tune, report_every_s=report_every_s,
               measure_batches=measure_batches, total_steps=total_steps)


def start_job(model=None, *, name: str | None = None, socket: str | os.PathLike | None = None,
              report_every_s: float = DEFAULT_REPORT_EVERY_S, measure_batches: int = 8,
              total_steps: int | None = None, **explicit) -> Job:
    """For the framework adapters: ``job(...).start()``, except that features which cannot be read from the model
    warn and give a no-op job, because a callback added with no arguments must never stop training."""
    explicit = {k: (float(v) if k in ("seq_len", "gpu_util") and v is not None else v) for k, v in explicit.items()}
    options = dict(name=name, socket=socket, report_every_s=report_every_s, measure_batches=measure_batches)
    try:
        features = resolve_features(model, **explicit)
    except ValueError as e:
        idle = Job({}, **options)
        idle._disable(str(e))
        return idle
    return Job(features, **options, total_steps=total_steps).start()


class AdapterCore:
    """What the Hugging Face and Lightning callbacks share: their options, starting the job once per training run,
    closing it (idempotent), and use as a context manager. Every argument is optional; explicit numbers override
    the model's."""

    def __init__(self, *, model_type: str | None = None, num_layers: int | None = None,
                 hidden_size: int | None = None, seq_len: float | None = None, gpu_util: float | None = None,
                 name: str | None = None, socket: str | None = None, report_every_s: float = DEFAULT_REPORT_EVERY_S,
                 measure_batches: int = 8):
        self._explicit = dict(model_type=model_type, num_layers=num_layers, hidden_size=hidden_size,
                              seq_len=seq_len, gpu_util=gpu_util)
        check_partial_features(self._explicit)
        self._options = dict(name=name, socket=socket, report_every_s=report_every_s,
                             measure_batches=measure_batches)
        self.job: Job | None = None

    def _start(self, model, default_name: str | None, total_steps: int | None = None) -> bool:
        """Start the job for this training run; False when one is already open (a retried or repeated train on the
        same model and data: the job and its pin carry on). ``total_steps``: the run's optimizer steps, when the
        framework knows them."""
        if self.job is not None and not self.job.closed:
            return False
        options = dict(self._options)
        options["name"] = options["name"] or default_name
        self.job = start_job(model, **options, total_steps=total_steps, **self._explicit)
        return True

    def close(self) -> None:
        """End the job (unregister). Safe to call more than once."""
        if self.job is not None:
            self.job.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
