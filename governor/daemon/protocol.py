"""JSON-RPC 2.0 framing and validation: one JSON object per line, UTF-8, at most MAX_LINE_BYTES a line.

Everything a client sends is checked here and turned into either a typed request or an RpcFault with a standard code
and a message naming the field; the server never sees raw, unchecked input.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from governor.backends.gpuid import SlurmNumbering
from governor.errors import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from governor.features import MAX_SEQ_LEN, MIN_SEQ_LEN, Features, finite_number
from governor.text import MAX_NAME_CHARS, name_problem, unprintable_at

MAX_LINE_BYTES = 64 * 1024


class RpcFault(Exception):
    """An error reply to one request (the client's counterpart is governor.client.RpcError)."""

    def __init__(self, code: int, message: str, data: dict | None = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def to_dict(self) -> dict:
        err = {"code": self.code, "message": self.message}
        if self.data:
            err["data"] = self.data
        return err


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)



class FeatureParams(Features, _Params):
    """The job's features: the fields, limits and checks of governor.features.Features itself, so they cannot drift."""


def _total_steps(v):
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 62):
        raise ValueError("must be a positive integer: the step count the job ends at (as counted in progress steps)")
    return v


class RegisterParams(FeatureParams):
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    pid: int | None = Field(default=None, ge=1, le=(1 << 31) - 1)
    gpu: str | int | None = None
    tune: bool | None = None
    total_steps: int | None = None  # the job's length, for the tuner's energy budget
    # The batch job this process runs in (SLURM_JOB_ID): the registration joins that job's hold on its GPU
    # (governor.daemon.scheduler) instead of adding a second voice.
    slurm_job_id: int | None = Field(default=None, ge=1, le=1 << 53)
    # A rank of a job group (governor.daemon.groups): the run's key, this rank, the number of ranks.
    group: str | None = Field(default=None, min_length=1, max_length=256)
    rank: int | None = Field(default=None, ge=0, le=1 << 20)
    world_size: int | None = Field(default=None, ge=1, le=1 << 20)

    _total_steps = field_validator("total_steps", mode="before")(_total_steps)

    @field_validator("group")
    @classmethod
    def _printable_group(cls, v):
        bad = unprintable_at(v) if v is not None else None
        if bad is not None:
            raise ValueError(f"must not contain control or format characters (U+{ord(v[bad]):04X} at index {bad})")
        return v

    @model_validator(mode="after")
    def _rank_in_world(self):
        if (self.rank is not None or self.world_size is not None) and self.group is None:
            raise ValueError("rank and world_size belong to a job group: pass group too")
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self

    @field_validator("name")
    @classmethod
    def _printable(cls, v):
        problem = name_problem(v) if v is not None else None
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, v):
        return v if v is None else _gpu_key(v)


class JobParams(_Params):
    job_id: int = Field(ge=1)


class UpdateParams(JobParams):
    gpu_util: float | None = Field(default=None, ge=0, le=100)
    seq_len: float | None = Field(default=None, ge=MIN_SEQ_LEN, le=MAX_SEQ_LEN)

    _finite = field_validator("seq_len", "gpu_util", mode="before")(finite_number)


class ProgressParams(JobParams):
    steps: int = Field(ge=0, le=1 << 62)
    phase: Literal["train", "eval", "checkpoint", "data"] | None = None
    total_steps: int | None = None  # the job's length, when it becomes known (or changes) after register
    # When step number ``steps`` ended: CLOCK_MONOTONIC of the daemon's host, seconds (the daemon checks it against
    # its own clock: governor.daemon.rpc). Windows count steps from these times, not from when reports arrive.
    step_end_s: float | None = Field(default=None, ge=0, le=1 << 40)
    # A group's rank: its mean compute time per step since its last report, up to the collective (seconds; the
    # client's job.compute_done()), for the trim of the ranks that wait (governor.daemon.grouptrim).
    compute_s: float | None = Field(default=None, ge=0, le=86400)

    _total_steps = field_validator("total_steps", mode="before")(_total_steps)

    @field_validator("step_end_s", "compute_s", mode="before")
    @classmethod
    def _finite_time(cls, v):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ValueError("must be a finite number of seconds")
        return v


class SetLevelParams(JobParams):
    freq_hz: int = Field(ge=1, le=1 << 40)  # a level of the job's GPU's table (a group's level, chosen by its rank 0)


class EmptyParams(_Params):
    pass


def _gpu_key(v):
    if isinstance(v, bool) or (isinstance(v, int) and v < 0) or (isinstance(v, str) and not 0 < len(v) <= 128):
        raise ValueError("must be a GPU index (int >= 0) or a UUID string")
    return v


class SlurmHoldParams(_Params):
    """``ftgov slurm prolog``: hold a Slurm job's GPUs (root only)."""

    slurm_job_id: int = Field(ge=1, le=1 << 53)
    uid: int = Field(ge=0, le=(1 << 32) - 1)  # the job's user (SLURM_JOB_UID): who may join the hold from inside
    policy: Literal["tune", "mlg", "ffg", "off"]
    # Slurm's numbers (read by gpu_numbering: governor.backends.gpuid.find_slurm_gpu) or UUIDs; None: the one
    # integrated GPU
    gpus: list[str | int] | None = Field(default=None, max_length=64)
    gpu_numbering: SlurmNumbering = "auto"
    node_gpus: int | None = Field(default=None, ge=0, le=4096)  # how many GPUs slurmd offers here (None: unknown)
    # A heterogeneous job's component: its leader's id (SLURM_HET_JOB_ID), the SLURM_JOB_ID its steps' tasks see
    het_job_id: int | None = Field(default=None, ge=1, le=1 << 53)
    partition: str | None = Field(default=None, max_length=128)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v):
        if v is not None and isinstance(v, list):
            for key in v:
                _gpu_key(key)
        return v

    @field_validator("partition")
    @classmethod
    def _printable(cls, v):
        if v is not None and unprintable_at(v) is not None:
            raise ValueError("must be printable text (a Slurm partition name)")
        return v


class SlurmReleaseParams(_Params):
    """``ftgov slurm epilog``: release a Slurm job's hold (root only)."""

    slurm_job_id: int = Field(ge=1, le=1 << 53)
    why: Literal["epilog", "stale", "operator"] = "epilog"


METHODS: dict[str, type[_Params]] = {
    "register": RegisterParams,
    "update": UpdateParams,
    "unregister": JobParams,
    "resume": JobParams,  # a job's client, connected again, holds its job re-adopted after a daemon restart
    "progress": ProgressParams,
    "status": EmptyParams,
    "predict": FeatureParams,
    "ping": EmptyParams,
    "pin_check": EmptyParams,  # `ftgov doctor`: can the daemon pin each GPU? (Controller.pin_check)
    "set_level": SetLevelParams,  # a group's rank moves its own GPU to the level its rank 0 chose (multi-node)
    "job_energy": JobParams,  # a job's energy so far, read now (a multi-node group's windows)
    "slurm_hold": SlurmHoldParams,  # root: `ftgov slurm prolog` (governor.daemon.scheduler)
    "slurm_release": SlurmReleaseParams,  # root: `ftgov slurm epilog`
}


@dataclass
class Request:
    id: Any
    method: str
    params: _Params
    is_notification: bool = False  # no "id" member at all ("id": null is a request, answered with a null id)


def _reject_constant(name: str):
    # Python's json accepts NaN and Infinity; JSON does not.
    raise ValueError(f"{name} is not valid JSON")


# Made once: json.loads/dumps with any option build a new decoder or encoder on every call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def parse_line(line: bytes) -> Request:
    """Parse and validate one line. Raises RpcFault; ``err.data["id"]`` carries the request id when it was readable."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RpcFault(PARSE_ERROR, f"invalid UTF-8 at byte {e.start}") from e
    try:
        msg = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise RpcFault(PARSE_ERROR, f"not valid JSON: {e}") from e
    if not isinstance(msg, dict):
        raise RpcFault(INVALID_REQUEST, f"a request must be a JSON object, not {type(msg).__name__}")
    req_id = msg.get("id")
    if req_id is not None and (isinstance(req_id, bool) or not isinstance(req_id, (int, str))):
        raise RpcFault(INVALID_REQUEST, "id must be a string or an integer", {"field": "id"})
    if isinstance(req_id, str) and len(req_id) > 256:
        raise RpcFault(INVALID_REQUEST, "id is too long", {"field": "id"})
    if isinstance(req_id, int) and abs(req_id) > (1 << 53):
        raise RpcFault(INVALID_REQUEST, "id is out of range", {"field": "id"})

    # A well-formed notification (no "id" member) gets no reply even when its method or params are wrong (JSON-RPC 2.0
    # section 4.1): its sender is not waiting for one, and an unexpected reply would answer its next request. A
    # request that is not well formed (Invalid Request) is answered with a null id, as the spec says.
    notification = "id" not in msg

    def fail(code: int, message: str, data: dict | None = None) -> RpcFault:
        quiet = notification and code in (METHOD_NOT_FOUND, INVALID_PARAMS)
        return RpcFault(code, message, {**(data or {}), "id": req_id, "notification": quiet})

    if msg.get("jsonrpc") != "2.0":
        raise fail(INVALID_REQUEST, 'jsonrpc must be "2.0"', {"field": "jsonrpc"})
    method = msg.get("method")
    if not isinstance(method, str):
        raise fail(INVALID_REQUEST, "method must be a string", {"field": "method"})
    unknown = set(msg) - {"jsonrpc", "id", "method", "params"}
    if unknown:
        raise fail(INVALID_REQUEST, f"unknown member {sorted(unknown)[0]!r}", {"field": sorted(unknown)[0]})
    model = METHODS.get(method)
    if model is None:
        raise fail(METHOD_NOT_FOUND, f"unknown method {method[:64]!r}; known: {', '.join(METHODS)}",
                   {"field": "method"})
    params = msg.get("params", {})
    if not isinstance(params, dict):
        raise fail(INVALID_PARAMS, "params must be an object (named parameters)", {"field": "params"})
    try:
        return Request(req_id, method, model.model_validate({k: _clean(v) for k, v in params.items()}), notification)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "params"
        raise fail(INVALID_PARAMS, f"{field}: {err['msg']}", {"field": field}) from e
    except RecursionError as e:
        raise fail(INVALID_PARAMS, "params are nested too deeply") from e


def _clean(value):
    """A JSON string may escape a lone surrogate (\\ud800), which is no Unicode text: replace it (U+FFFD) rather than
    refuse an otherwise good request over a name."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def encode(obj: dict) -> bytes:
    return _ENCODER.encode(obj).encode() + b"\n"


def result(req_id: Any, value: dict) -> bytes:
    return encode({"jsonrpc": "2.0", "id": req_id, "result": value})


def error(req_id: Any, err: RpcFault) -> bytes:
    data = dict(err.data or {})
    data.pop("id", None)
    data.pop("notification", None)
    return encode({"jsonrpc": "2.0", "id": req_id, "error": RpcFault(err.code, err.message, data).to_dict()})


def finite(x: float | None) -> float | None:
    """JSON has no NaN: report an unknown float as null."""
    return x if x is None or math.isfinite(x) else None
