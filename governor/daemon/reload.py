"""SIGHUP: read the config file and the model again while the jobs run on (`systemctl reload ftgovd`).

Pins and jobs stay: a running job keeps the decision it has, a new job is decided by the new policy. A new config
that does not validate, or a model file the new policy cannot load, is refused with the reason, and the running
config and model stay. Settings that only take effect at start (the socket, the roots, the backend) keep their
running values until a restart, and the log says so; so does leaving the observe policy where the GPUs were opened
read-only for it (NVML).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.config import Config
from governor.daemon import admission
from governor.daemon.settings import PinSettings
from governor.errors import FtgovError
from governor.policy import Policy

if TYPE_CHECKING:
    from governor.daemon.server import Server

log = logging.getLogger("ftgovd")

AT_START_ONLY = ("socket", "sysfs_root", "state_dir", "backend", "node_wait_s", "store", "nvml_init_timeout_s")


class Reloader:
    def __init__(self, load: Callable[[], Config], build_policy: Callable[[Config], Policy]):
        self.load = load
        self.build_policy = build_policy

    def __call__(self, server: Server) -> None:
        """RELOADING=1, the reload, then READY=1 whatever happened: systemd waits for it to end `systemctl reload`
        (an exception that escaped before it, which the server logs, left the unit reloading)."""
        notifier = server.notifier
        notifier.send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        status = "reload failed (see the journal); the running config and model stay"
        try:
            status = self._reload(server)
        except FtgovError as e:
            log.error("reload refused: %s; the running config and model stay", e)
            status = f"reload refused: {e}"
        finally:
            notifier.send(f"READY=1\nSTATUS={status}")

    def _reload(self, server: Server) -> str:
        new, policy = self._checked(server)
        controller = server.controller
        controller.configure(PinSettings.from_config(new, policy))
        server.ticker.set_interval(new.sample_interval_s, controller)
        server.fd_limit = admission.raise_fd_limit(new.limits)  # raised connection limits need their descriptors
        server.config = server.methods.config = new
        # The connection limits (root's reserve, per uid) are read at each accept; an idle timeout also applies to the
        # connections open now.
        for conn in server.conns:
            if conn.idle is not None:
                conn.idle.set_timeout(new.limits.idle_timeout_s)
        for name in ("ftgovd", "governor", "asyncio"):  # the daemon's loggers (governor.daemon.main.route_loggers)
            logging.getLogger(name).setLevel(new.log_level.upper())
        log.info("config and model reloaded: policy %s; %d running job(s) keep their pins",
                 controller.policy.name, len(controller.jobs))
        return f"config reloaded; {server.status_line()}"

    def _checked(self, server: Server) -> tuple[Config, Policy]:
        old = server.config
        new = self.load()
        kept = [k for k in AT_START_ONLY if getattr(new, k) != getattr(old, k)]
        if kept:
            log.warning("reload: %s take effect only at start; keeping the running values until a restart",
                        ", ".join(kept))
            new = new.model_copy(update={k: getattr(old, k) for k in kept})
        if new.power_cap_w != old.power_cap_w and server.controller.holds_pins():
            log.info("reload: power_cap_w applies from a GPU's next first pin; a GPU pinned now keeps the cap it has "
                     "until its jobs end")
        if new.policy != "observe" and any(pin.gpu.read_only for pin in server.controller.gpus.values()):
            log.warning("reload: policy %s takes effect only at start: the GPUs were opened read-only for observe; "
                        "keeping observe until a restart", new.policy)
            new = new.model_copy(update={"policy": old.policy})
        policy = self.build_policy(new)
        if policy.fallback_reason and not server.controller.policy.fallback_reason:
            raise FtgovError(f"the new model cannot be used ({policy.fallback_reason})")
        return new, policy.said()
