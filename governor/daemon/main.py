"""ftgovd: the command line, start-up and the event loop (see governor.daemon.server for the loop itself)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from governor import DEFAULT_CONFIG_PATH, __version__
from governor.daemon import logs
from governor.daemon.config import Config, default_ffg_hz, default_model_path, load_config
from governor.errors import FtgovError, NodeNotFound
from governor.daemon.notify import Notifier, listen_fds
from governor.sysfs import Root, trusted_root

log = logging.getLogger("ftgovd")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ftgovd", description="Energy-saving GPU frequency governor for fine-tuning jobs.")
    p.add_argument("--config", default=None, help=f"YAML config (default {DEFAULT_CONFIG_PATH}; absent = defaults)")
    p.add_argument("--socket", help="Unix socket path (default from config: /run/ftgov/ftgov.sock)")
    p.add_argument("--sysfs-root", help="root under which /sys is read and written (default /)")
    p.add_argument("--state-dir", help="where the crash-safety state file lives (default /run/ftgov)")
    p.add_argument("--simulate", action="store_true",
                   help="build a simulated Jetson AGX Orin (JetPack 6 layout) and govern it: try ftgov without a Jetson")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="version", version=f"ftgovd {__version__}")
    return p.parse_args(argv)


def simulate_runtime_dir() -> Path:
    """Where --simulate keeps its socket, state and tree unless told otherwise: never the real /run/ftgov."""
    if os.geteuid() == 0:
        return Path("/run/ftgov-sim")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "ftgov-sim" if xdg else Path(f"/tmp/ftgov-sim-{os.getuid()}")


def build_config(args: argparse.Namespace) -> Config:
    explicit = args.config is not None
    overrides = {"socket.path": args.socket, "sysfs_root": args.sysfs_root, "state_dir": args.state_dir,
                 "log_level": args.log_level}
    if args.simulate:
        base = simulate_runtime_dir()
        overrides["socket.path"] = args.socket or str(base / "ftgov.sock")
        overrides["state_dir"] = args.state_dir or str(base)
    return load_config(args.config or DEFAULT_CONFIG_PATH, overrides, must_exist=explicit)


def probe_gpus(config: Config, root: Root, notifier: Optional[Notifier] = None) -> list:
    """Find the GPUs to govern: the Jetson devfreq node first, then NVML (backend: auto), waiting up to node_wait_s
    for a devfreq node that appears late at boot (it shows up only after the GPU first powers up)."""
    from governor.backends import devfreq

    if config.backend == "nvml":
        return _nvml_probe(config)
    deadline = time.monotonic() + config.node_wait_s
    delay_s, announced = 0.25, False
    while True:
        try:
            return devfreq.probe(root)
        except NodeNotFound as e:
            if config.backend == "auto" and not announced:
                try:
                    return _nvml_probe(config)
                except (ImportError, FtgovError):
                    pass  # no NVML GPUs either: keep waiting for the Jetson node
            if time.monotonic() >= deadline:
                raise NodeNotFound(f"{e} (waited {config.node_wait_s:g} s; node_wait_s in the config)") from e
            if not announced:
                log.warning("%s; waiting up to %g s for it", e, config.node_wait_s)
                if notifier is not None:
                    notifier.status("waiting for the GPU devfreq node")
                announced = True
            time.sleep(min(delay_s, max(0.0, deadline - time.monotonic())))
            delay_s = min(delay_s * 2, 5.0)


def _nvml_probe(config: Config) -> list:
    from governor.backends import nvml

    # In observe mode the NVML handle refuses every call that would change the GPU: safe on a shared machine.
    return nvml.probe(read_only=config.policy == "observe")


def policy_name(config: Config, gpus: list) -> str:
    """The configured policy, else the backend's default: the paper's tree on a Jetson, the tuner on NVML GPUs."""
    if config.policy is not None:
        return config.policy
    return "tune" if any(g.describe().get("backend") == "nvml" for g in gpus) else "mlg"


def raise_fd_limit(config: Config) -> None:
    """Room for the configured limits: a connection takes two descriptors (its socket and a pidfd for its process),
    a job one more. The soft limit is 1024 by default (for select()'s sake; the daemon never uses select()), the hard
    limit under systemd 524288: take what the limits need, never more than the hard limit allows."""
    import resource

    need = 2 * (config.limits.max_connections + config.limits.root_reserve_connections) + config.limits.max_jobs + 64  # + listening socket, epolls, files, logs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < need:
            log.warning("open files limited to %d (hard limit), but limits.max_connections=%d and max_jobs=%d need "
                        "about %d: some connections will wait or be refused", new, config.limits.max_connections,
                        config.limits.max_jobs, need)


def run(config: Config, *, simulate: bool = False) -> int:
    from governor.backends import rails as rails_mod
    from governor.daemon.pins import Governor
    from governor.policy import Policy
    from governor.daemon.listen import bind_socket
    from governor.daemon.server import Server
    from governor.daemon.state import StateFile, boot_id

    notifier = Notifier()
    raise_fd_limit(config)
    root = trusted_root(config.sysfs_root)
    board = None
    if simulate:
        from governor.sim import tree

        sim_dir = Path(config.state_dir) / "sim-orin"
        shutil.rmtree(sim_dir, ignore_errors=True)
        root = tree.build(sim_dir, "jp6")
        log.info("simulated Jetson AGX Orin (JetPack 6 layout) at %s", sim_dir)
        print(f"ftgovd: simulated Orin sysfs tree at {sim_dir}; socket {config.socket.path}\n"
              f"ftgovd: clients: export FTGOV_SOCKET={config.socket.path}", file=sys.stderr, flush=True)
    gpus = probe_gpus(config, root, notifier)
    for gpu in gpus:
        log.info("GPU %s: %s, levels %s MHz", gpu.id, gpu.describe(),
                 " ".join(f"{hz / 1e6:g}" for hz in gpu.levels_hz))
    rails = rails_mod.discover(root)
    if rails is not None:
        log.info("power rails: %s; job energy counts %s", ", ".join(rails.names), "+".join(rails.energy_rails))
    elif any(callable(getattr(g, "energy_j", None)) for g in gpus):
        log.info("no INA3221 power rails: job energy from the GPU's own energy counter")
    else:
        log.info("no INA3221 power rails found: job energy will be reported as null")
    shipped_model = default_model_path()
    model_file = config.model_file or str(shipped_model)
    ffg_hz, ffg_from = config.ffg_freq_hz, "config"
    if ffg_hz is None:
        ffg_hz, ffg_from = default_ffg_hz(shipped_model)
    log.info("FFG frequency %g MHz (from %s)", ffg_hz / 1e6, ffg_from)
    policy = Policy.from_config(policy_name(config, gpus), ffg_hz, model_file)
    governor = Governor(gpus, policy, StateFile(config.state_dir), boot_id(root), rails=rails,
                        on_external_change=config.on_external_change, max_jobs=config.limits.max_jobs,
                        low_phases=tuple(config.low_phases),
                        power_cap_mw=round(config.power_cap_w * 1000) if config.power_cap_w else None)
    if simulate:
        from governor.sim.board import Board

        board = Board(root, gpus[0])
        governor.listeners.append(board.update)
        board.update(governor)
    from governor.daemon import tuning as tune_job

    server = Server(governor, config, notifier, tuner_factory=lambda gov, job: tune_job.attach(gov, job, config.tuner))

    fds = listen_fds()
    if fds:
        sock = socket.socket(fileno=fds[0])
        log.info("socket-activated: listening on %s", sock.getsockname())
    else:
        sock = bind_socket(config.socket.path, config.socket.mode, config.socket.group)
    sock.setblocking(False)
    try:
        asyncio.run(server.serve(sock))
    finally:
        if not fds:
            try:
                os.unlink(config.socket.path)
            except OSError:
                pass
    log.info("ftgovd stopped")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        config = build_config(args)
    except FtgovError as e:
        print(f"ftgovd: error: {e}", file=sys.stderr)
        return 2
    logs.setup(config.log_level)
    try:
        return run(config, simulate=args.simulate)
    except FtgovError as e:
        log.error("%s", e)
        return 1

