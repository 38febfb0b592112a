"""The tests' view of the launcher (governor/sim/launch.py: ftgovd on a real socket against a fake tree, and a raw
JSON-RPC client), with what only tests use."""

from __future__ import annotations

import signal

import yaml

from governor.sim.launch import (  # noqa: F401  (re-exported for the tests)
    DEVFREQ,
    FEATURES,
    WORKDIRS_ENV,
    Daemon,
    DaemonExited,
    NotifyListener,
    Rpc,
    limits,
    scaled,
)
from tests.support import REPO  # noqa: F401


def rewrite_config(d: Daemon, **changes) -> None:
    """Change top-level keys of a running daemon's config file (a reload reads them)."""
    cfg = yaml.safe_load(d.config_path.read_text())
    cfg.update(changes)
    d.config_path.write_text(yaml.safe_dump(cfg))


def reload(d: Daemon, outcome: str) -> str:
    """SIGHUP, then the status line the reload ends with (one containing ``outcome``)."""
    d.proc.send_signal(signal.SIGHUP)
    return d.wait_status(lambda m: outcome in m)


class ProgressJob:
    """What a client library's job does per step, on the raw protocol: report the total steps (for governor.sim.job's
    run(), which drives a job through ``step()``)."""

    def __init__(self, rpc: Rpc, job_id: int):
        self.rpc, self.job_id, self.steps = rpc, job_id, 0

    def step(self) -> None:
        self.steps += 1
        self.rpc.notify("progress", job_id=self.job_id, steps=self.steps)


def held_phase(rpc, job) -> str | None:
    """The phase the daemon holds for a client's ``job`` now: read after a call on the job's own connection, whose
    answer comes after every report the job sent before it (``rpc``: another client of the daemon)."""
    job.update()
    return next(j for j in rpc.call("status")["jobs"] if j["job_id"] == job.job_id)["phase"]
