"""ftgov: an energy-saving GPU frequency governor for fine-tuning on NVIDIA Jetson AGX Orin.

Nothing is done at import time: the daemon, the client and the model pipeline import only what they use.
"""

__version__ = "0.1.0"
DEFAULT_CONFIG_PATH = "/etc/ftgov/ftgov.yaml"  # here, not in governor.daemon.config: `ftgov --help` names it without pydantic


def job(*args, **kwargs):
    """Register a fine-tuning job with ftgovd for the life of a ``with`` block (see governor.client.job)."""
    from governor.client import job as _job

    return _job(*args, **kwargs)
