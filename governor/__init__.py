"""ftgov: an energy-saving GPU frequency governor for fine-tuning on NVIDIA Jetson AGX Orin.

Nothing is done at import time: the daemon, the client and the model pipeline import only what they use.
"""

__version__ = "0.1.0"
# Here, not in governor.config: `ftgov --help` names it without importing pydantic.
DEFAULT_CONFIG_PATH = "/etc/ftgov/ftgov.yaml"
# Where ftgovd listens and which group may connect (systemd/ftgovd.socket and sysusers.d say the same): the daemon's
# defaults and the client's, from this one place.
DEFAULT_SOCKET_PATH = "/run/ftgov/ftgov.sock"
SOCKET_ENV = "FTGOV_SOCKET"  # the client's socket, when set (ftgovd --simulate --print-env sets it)
SOCKET_GROUP = "ftgov"


def job(*args, **kwargs):
    """Register a fine-tuning job with ftgovd for the life of a ``with`` block (see governor.client.job)."""
    from governor.client import job as _job

    return _job(*args, **kwargs)
