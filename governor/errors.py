"""One error hierarchy for the whole package.

OSError and friends are converted to these at the boundary where they happen (``raise ... from e``), so callers above
the backends never see a bare OSError and the daemon can tell a client exactly what went wrong.
"""


class FtgovError(Exception):
    """Base class of every error ftgov raises on purpose."""


class ConfigError(FtgovError):
    """The configuration file or a command-line value is invalid; the message names the key."""


class BackendError(FtgovError):
    """A hardware backend could not read or write what it needed (sysfs, NVML)."""


class NodeNotFound(BackendError):
    """No GPU frequency node was found (yet): the caller may wait and retry."""


class PinError(BackendError):
    """A pin did not take: the files did not read back what was written."""


class CannotPin(PinError):
    """The GPU refused the pin as it refuses every pin: it cannot lock its clocks at all (NVML NOT_SUPPORTED: before
    Volta, some boards) or this process may not (NO_PERMISSION: not root, some containers and virtual GPUs). Nothing
    was written, and trying again will not help: the daemon stops pinning that GPU (governor.daemon.gpupin)."""


class CannotCap(PinError):
    """The GPU refused a power limit as it refuses every power limit: it has no settable limit (NVML NOT_SUPPORTED:
    many virtual and cloud GPUs, some boards) or this process may not set it (NO_PERMISSION). Nothing was written, and
    trying again will not help: the clock pin stands without the cap (governor.daemon.gpupin)."""


class CapOutOfRange(CannotCap):
    """The power cap is outside the GPU's own range (one power_cap_w for a node of unlike GPUs): nothing was written,
    and this value will never take there; another (a reloaded config's) may."""


class ModelError(FtgovError):
    """A decision-tree export is missing or malformed."""


class StateError(FtgovError):
    """The crash-safety state file could not be written or read."""


# The JSON-RPC error codes of the daemon's replies: the daemon sends them, the client maps them to its exceptions.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000  # the backend failed (a pin did not take): the job is not registered
PERMISSION_DENIED = -32001
LIMIT_EXCEEDED = -32002
UNKNOWN_JOB = -32003
