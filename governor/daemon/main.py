"""ftgovd: the command line, start-up and the event loop (see governor.daemon.server for the loop itself)."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import select
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from governor import DEFAULT_CONFIG_PATH, DEFAULT_SOCKET_PATH, SOCKET_ENV, __version__, backends, simpaths
from governor.argtypes import absolute_path
from governor.backends import devfreq, gpuid
from governor.backends import rails as rails_mod
from governor.backends.base import describe_text
from governor.backends.nvmlcalls import SERVING_INIT_TIMEOUT_S
from governor.config import Config, default_ffg_hz, default_model_path, load_config, store_path
from governor.daemon import admission, logs, peers, tuning
from governor.daemon.controller import Controller
from governor.daemon.groups import Groups
from governor.daemon.listen import bind_socket
from governor.daemon.notify import Notifier, listen_fds
from governor.daemon.reload import Reloader
from governor.daemon.server import Server
from governor.daemon.settings import PinSettings
from governor.daemon.ticks import Ticker, defer_on_loop
from governor.errors import ConfigError, FtgovError, NodeNotFound
from governor.policy import Policy
from governor.store.state import StateError, StateFile, boot_id
from governor.sysfs import Root, trusted_root
from governor.units import mhz

log = logging.getLogger("ftgovd")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ftgovd", description="Energy-saving GPU frequency governor for fine-tuning jobs.")
    p.add_argument("--config", default=None, help=f"YAML config (default {DEFAULT_CONFIG_PATH}; absent = defaults)")
    p.add_argument("--socket", type=absolute_path,
                   help="Unix socket path (default from config: /run/ftgov/ftgov.sock); its directory must exist, "
                        "except the daemon's own /run/ftgov, which is created")
    p.add_argument("--sysfs-root", type=absolute_path, help="root under which /sys is read and written (default /)")
    p.add_argument("--state-dir", type=absolute_path,
                   help="where the crash-safety state file lives (default /run/ftgov)")
    p.add_argument("--simulate", action="store_true",
                   help="build a simulated Jetson AGX Orin (JetPack 6 layout), start its board, and govern it: "
                        "try ftgov without a Jetson")
    p.add_argument("--sim-meters", choices=["ina3221", "exact"], default=None,
                   help="with --simulate: the simulated rails report as an INA3221 does (an average over its "
                        "update_interval, refreshed at it; the default, as on a board), or exact (the energy model's "
                        "mean power at once, refreshed every 20 ms: for jobs whose time is scaled, as the tests' are)")
    p.add_argument("--print-env", action="store_true",
                   help="with --simulate: print the shell lines that point ftgov at that daemon (FTGOV_SOCKET, "
                        "FTGOV_SIM_TREE) and exit, for eval \"$(ftgovd --simulate --print-env)\"")
    p.add_argument("--log-level", type=str.lower, choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="version", version=f"ftgovd {__version__}")
    args = p.parse_args(argv)
    if args.sim_meters is not None and not args.simulate:  # without it, a real daemon would start on the host
        p.error("--sim-meters goes with --simulate")
    args.sim_meters = args.sim_meters or "ina3221"
    return args


def socket_dir_is_ours(config: Config, simulate: bool) -> bool:
    """The socket's directory is the daemon's own runtime directory (default /run/ftgov; with --simulate its state
    directory), created if missing as systemd's RuntimeDirectory= would; any other directory must exist."""
    own = {os.path.dirname(DEFAULT_SOCKET_PATH)}
    if simulate:
        own |= {str(simpaths.simulate_runtime_dir()), os.path.abspath(config.state_dir)}
    return os.path.dirname(os.path.abspath(config.socket.path)) in own


def build_config(args: argparse.Namespace) -> Config:
    explicit = args.config is not None
    overrides = {"socket.path": args.socket, "sysfs_root": args.sysfs_root, "state_dir": args.state_dir,
                 "log_level": args.log_level}
    if args.simulate:
        if args.sysfs_root:
            raise FtgovError("--simulate builds its own tree (under the state directory); to serve a tree of your "
                             f"own, run {shlex.quote(sys.executable)} -m governor.sim.board --tree DIR beside ftgovd "
                             "--sysfs-root DIR")
        # Everything in one directory: --state-dir moves the socket too (a second simulated daemon needs only it).
        overrides["state_dir"] = args.state_dir or str(simpaths.simulate_runtime_dir())
        overrides["socket.path"] = args.socket or str(Path(overrides["state_dir"]) / simpaths.SOCKET_NAME)
        overrides["sysfs_root"] = str(Path(overrides["state_dir"]) / simpaths.SIMULATED_TREE_NAME)
        overrides["store.path"] = str(Path(overrides["state_dir"]) / simpaths.STORE_NAME)  # never the board's
    return load_config(args.config or DEFAULT_CONFIG_PATH, overrides, must_exist=explicit)


def say_unused_paths(config_path: str, state_dir: str) -> None:
    """--simulate --config FILE: a file written for a board names paths the simulation does not use; said once at the
    start (build_config runs again at each reload), not silently dropped."""
    own, default = load_config(config_path, {}, must_exist=True), Config.model_validate({})
    ignored = [f"{name} {mine}" for name, mine, theirs in (
        ("socket.path", own.socket.path, default.socket.path), ("state_dir", own.state_dir, default.state_dir),
        ("store.path", own.store.path, default.store.path)) if mine != theirs]
    if ignored:
        print(logs.stderr_line(f"ftgovd: --simulate keeps its own paths under {state_dir}; {config_path}'s "
                               f"{', '.join(ignored)} not used (--socket, --state-dir set them)", 4),
              file=sys.stderr, flush=True)


def probe_gpus(config: Config, root: Root, *, serving: bool = False) -> list:
    """The GPUs to govern now, from the backend registry (governor.backends): devfreq, then NVML for backend auto.
    NodeNotFound when there is none. ``serving``: a probe again on the event loop, where an nvmlInit that hangs is
    given up on sooner than at start (the watchdog)."""
    init_timeout_s = config.nvml_init_timeout_s
    if serving:
        init_timeout_s = min(init_timeout_s, SERVING_INIT_TIMEOUT_S)
    return backends.probe_gpus(config.backend, root, read_only=config.policy == "observe",
                               nvml_init_timeout_s=init_timeout_s)


def probe_at_start(config: Config, root: Root) -> tuple[list, str | None, float]:
    """The GPUs, or none and why, and for how long (s) a node may still appear (node_wait_s; 0: no wait).

    The socket is served either way: a client asking while the node is awaited is told so, where a daemon that waited
    before listening looked "not running". A board whose node never appears (headless, rail-gated) gets a daemon that
    says why it governs nothing and probes again, instead of one that exits and is restarted in a loop."""
    try:
        return probe_gpus(config, root), None, 0.0
    except NodeNotFound as e:
        why = str(e)
        if config.backend == "auto":  # neither a devfreq GPU nor NVML: the first try on a laptop, most likely
            why += " (no Jetson or NVIDIA GPU here? `ftgovd --simulate` runs on a simulated Orin)"
        if config.node_wait_s > 0 and backends.may_appear_later(config.backend):
            log.warning("%s; serving meanwhile and waiting up to %g s for it (node_wait_s)", why, config.node_wait_s)
            return [], f"waiting for the GPU node: {why}", config.node_wait_s
        log.error("no GPU to govern: %s; serving without one and probing again every %g s (probe_retry_s)", why,
                  config.probe_retry_s)
        return [], why, 0.0


def policy_name(config: Config, gpus: list) -> str:
    """The configured policy, else the backend's default: the paper's tree on a Jetson, the tuner on NVML GPUs."""
    if config.policy is not None:
        return config.policy
    return "tune" if any(g.describe().get("backend") == "nvml" for g in gpus) else "mlg"


TREE_LOCK = ".ftgovd.lock"


def lock_simulated_tree(sim_dir: Path) -> int:
    """Take the simulated tree for this daemon, before anything in it changes: another --simulate daemon on the same
    state directory holds the lock for its whole life, and rebuilding its tree would reset its pins under it. Returns
    the lock's descriptor, to keep open until the daemon exits (the lock ends with it, however it ends)."""
    sim_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(sim_dir / TREE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FtgovError(f"another ftgovd --simulate is using the simulated tree {sim_dir}; stop it, or give this "
                         "one another --state-dir") from None
    return fd


def start_simulated_board(config: Config, meters: str = "ina3221") -> None:
    """--simulate: build a simulated Orin at sysfs_root and start its board, a process of its own (governor.sim is
    never imported here) that reacts to what is written into the tree as a board does. Returns once the board
    watches the tree, its rails reporting as ``meters`` says (--sim-meters). The board ends when this process does: it
    waits for EOF on a pipe only this process holds.
    The caller holds the tree's lock (lock_simulated_tree): everything in it but the lock file is rebuilt."""
    sim_dir = Path(config.sysfs_root)
    for entry in sim_dir.iterdir():
        if entry.name == TREE_LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    keep_r, keep_w = os.pipe()  # keep_w stays open (close-on-exec) for the daemon's lifetime, unreferenced
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}  # readiness is the daemon's to tell
    # Power mode 0 (MAXN, no cap): a board's /etc/nvpmodel.conf and nvpmodel's status are there, as on a devkit, and
    # the table's top is the GPU's.
    proc = subprocess.Popen([sys.executable, "-m", "governor.sim.board", "--tree", str(sim_dir), "--build", "jp6",
                             "--power-mode", "0", "--meters", meters, "--until-stdin-closes"], stdin=keep_r,
                            stdout=subprocess.PIPE, env=env)
    os.close(keep_r)
    assert proc.stdout is not None  # stdout=PIPE
    with proc.stdout:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        proc.kill()
        raise FtgovError(f"the simulated board did not start (exit status {proc.wait()}; its errors are above)")
    log.info("simulated Jetson AGX Orin (JetPack 6 layout) at %s, board process %d", sim_dir, proc.pid)
    for note in (f"ftgovd: simulated Orin sysfs tree at {sim_dir}; socket {config.socket.path}",
                 f"ftgovd: clients: export {SOCKET_ENV}={shlex.quote(config.socket.path)} "
                 f"{simpaths.SIM_TREE_ENV}={shlex.quote(str(sim_dir))}"):
        print(logs.stderr_line(note, 6), file=sys.stderr, flush=True)


def run(config: Config, *, simulate: bool = False, sim_meters: str = "ina3221",
        load_config_again: Callable[[], Config] | None = None) -> int:
    """Listen first, so that a socket that cannot be served (taken by another daemon, in a directory that does not
    exist) is refused before anything else happens; then start and serve; the socket goes when the daemon does."""
    admission.raise_fd_limit(config.limits)
    fds = listen_fds()
    if fds:
        sock = socket.socket(fileno=fds[0])
        log.info("socket-activated: listening on %s", sock.getsockname())
    else:
        sock = bind_socket(config.socket.path, config.socket.mode, config.socket.group,
                           create_dir=socket_dir_is_ours(config, simulate))
        if (config.socket.group and not simulate and os.geteuid() == 0
                and peers.group_id(config.socket.group) is None):
            # Safe (the socket stays root's group: only root connects), but nobody else could tell why they are
            # refused: systemd's socket unit would not start without the group; started by hand, this is the only word.
            # Not for --simulate (the demo, a try-out as root): its socket is its user's to try with.
            log.warning("socket.group %r does not exist: %s stays root's, and only root can register jobs; create the "
                        "group (`systemd-sysusers`, or `groupadd --system %s`), add the users, and restart ftgovd",
                        config.socket.group, config.socket.path, config.socket.group)
    tree_lock = None
    try:
        if simulate:
            # The tree lies in the state dir and is emptied to be rebuilt: a state dir others can write (/tmp) would
            # let them plant it as a link to any directory, which root emptied before serve() checked the dir.
            StateFile(config.state_dir).check()
            tree_lock = lock_simulated_tree(Path(config.sysfs_root))
            start_simulated_board(config, sim_meters)
        serve(config, sock, load_config_again, simulated=simulate)
    finally:
        sock.close()
        if not fds:
            try:
                os.unlink(config.socket.path)
            except OSError:
                pass
        if tree_lock is not None:
            os.close(tree_lock)
    log.info("ftgovd stopped")
    return 0


def serve(config: Config, sock: socket.socket, load_config_again: Callable[[], Config] | None, *,
          simulated: bool = False) -> None:
    """Find the GPUs, build the controller and the server, and serve on sock until stopped. The socket is bound
    already: clients that connect meanwhile wait in its queue. ``simulated``: the GPU is ftgovd --simulate's."""
    notifier = Notifier()
    root = trusted_root(config.sysfs_root)
    gpus, missing_why, node_wait_s = probe_at_start(config, root)
    for gpu in gpus:
        log.info("GPU %s: %s, levels %s MHz", gpu.id, describe_text(gpu),
                 " ".join(mhz(hz, unit=False) for hz in gpu.levels_hz))
        node = gpu.describe().get("devfreq")
        if node is not None and not devfreq.under_sandbox(node):
            # JetPack 4 (kernel 4.9) puts it directly under /sys/devices: `ftgov doctor` fails the board, and under
            # the shipped unit (ReadWritePaths=/sys/devices/platform) every pin would fail read-only.
            log.warning("GPU %s: its devfreq node %s is outside /sys/devices/platform: the shipped unit's sandbox "
                        "leaves it read-only, so pins will fail (JetPack 4 is not supported; elsewhere add a "
                        "ReadWritePaths= drop-in: systemctl edit ftgovd)", gpu.id, node)
    if (differ := gpuid.orders_differ({g.id: g.device_minor for g in gpus})) is not None:
        log.info("%s", differ)
    if (why := peers.pidfd_problem()) is not None:
        log.error("%s", why)
    rails = rails_mod.discover(root)
    if rails is not None:
        (log.info if rails.energy_rails else log.warning)("power rails: %s; %s", ", ".join(rails.names),
                                                          rails.describe_energy())
    elif any(g.has_energy_counter for g in gpus):
        log.info("no INA3221 power rails: job energy from the GPU's own energy counter")
    else:
        log.info("no INA3221 power rails found: job energy will be reported as null")
    if rails is None or not rails.energy_rails:
        for g in gpus:
            if not g.has_energy_counter:  # an NVIDIA GPU before Volta, a virtual GPU, a Jetson without its rails
                log.warning("GPU %s has neither power rails nor an energy counter: its jobs' energy is unknown, and "
                            "the tuner cannot measure there (a tuned job keeps its start pin)", g.id)
    policy = build_policy(config, gpus).said()
    boot = boot_id(root)
    recorder, starts = _store_users(config, root, boot, simulated)
    tuner = tuning.TunerAttach(starts)
    ticker = Ticker(notifier, config.sample_interval_s)
    # A group's ranks share one tuner (governor.daemon.groups), on the tuner config of the controller's settings.
    groups = Groups(lambda: controller.settings.tuner)
    state_file = StateFile(config.state_dir)
    # Held for the process's life (ftgov restore asks it, not the socket). A dir that cannot be opened is the state
    # file's to report (the daemon serves and refuses to pin); a second daemon on this dir goes on.
    try:
        if state_file.hold() is None:
            log.warning("another process holds the state dir %s (a second ftgovd on it?)", config.state_dir)
    except StateError as e:
        log.warning("%s: ftgov restore cannot tell that this daemon runs", e)
    controller = Controller(gpus, PinSettings.from_config(config, policy), state_file, boot,
                            rails=rails, listeners=(ticker.changed,), defer=defer_on_loop,
                            attach_tuner=groups.attach_tuner(tuner), plan_tune=groups.plan_tune(tuner.plan),
                            recorder=recorder, missing_why=missing_why)
    reloader = None
    if load_config_again is not None:
        reloader = Reloader(load_config_again, lambda new: build_policy(new, gpus))
    server = Server(controller, config, notifier, ticker, reloader,
                    probe=lambda: probe_gpus(config, root, serving=True), node_wait_s=node_wait_s, groups=groups)

    sock.setblocking(False)
    try:
        asyncio.run(server.serve(sock))
    finally:
        if recorder is not None:
            recorder.close()  # the jobs shutdown just ended are written before we exit


def route_loggers() -> None:
    """The daemon's modules that log under their own names (governor.backends.nvml), asyncio's own messages (an
    accept that ran out of file descriptors) and any other library's (through the root logger, at warning) go
    through the daemon's handler, and so through its bound on lines per uid and per logger (ratelimit.LogLimit)."""
    daemon = logging.getLogger("ftgovd")
    for name in ("governor", "asyncio", ""):
        logger = logging.getLogger(name)
        logger.handlers = list(daemon.handlers)
        logger.setLevel(daemon.level if name else max(daemon.level, logging.WARNING))
        logger.propagate = False


def build_policy(config: Config, gpus: list) -> Policy:
    shipped_model = default_model_path()
    model_file = config.model_file or str(shipped_model)
    ffg_hz, ffg_from = config.ffg_freq_hz, "config"
    if ffg_hz is None:
        ffg_hz, ffg_from = default_ffg_hz(model_file)
    else:
        check_ffg_in_a_table(ffg_hz, gpus)
    log.info("FFG frequency %s (from %s)", mhz(ffg_hz), ffg_from)
    return Policy.from_config(policy_name(config, gpus), ffg_hz, model_file)


def check_ffg_in_a_table(ffg_hz: int, gpus: list) -> None:
    """A configured FFG frequency outside every GPU's range of levels was written in another unit or for another
    board: refuse it rather than pin every job at the lowest (or highest) level. With no GPU yet, nothing to check."""
    if not gpus or any(g.levels_hz[0] <= ffg_hz <= g.levels_hz[-1] for g in gpus):
        return
    tables = "; ".join(f"GPU {g.id}: {mhz(g.levels_hz[0], unit=False)}..{mhz(g.levels_hz[-1])}" for g in gpus)
    raise ConfigError(f"ffg_freq_hz: {ffg_hz} Hz ({mhz(ffg_hz)}) is in no GPU's table of levels ({tables}); "
                      "the value is in Hz")


def _store_users(config: Config, root: Root, boot: str, simulated: bool):
    """The measurement store's recorder, told of every job that ends, and the tuned jobs' starts read from it before
    READY=1 (where tuned jobs start on NVML GPUs); (None, None): no store. ``simulated``: its jobs are recorded as
    the simulated board's."""
    path = store_path(config)
    if path is None:
        log.info("no measurement store (store.path %s)", "auto: no $STATE_DIRECTORY" if config.store.path else "null")
        return None, None
    from governor.daemon.recorder import Recorder, StoreWriter
    from governor.daemon.starts import TuneStarts

    return Recorder(StoreWriter(path, config.store.max_jobs), root, boot, simulated), TuneStarts.load(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_env and not args.simulate:
        print("ftgovd: error: --print-env goes with --simulate", file=sys.stderr)
        return 2
    try:
        config = build_config(args)
    except FtgovError as e:
        print(logs.stderr_line(f"ftgovd: error: {e}"), file=sys.stderr)
        return 2
    if args.simulate and args.config:
        say_unused_paths(args.config, config.state_dir)
    if args.print_env:
        # Printed rather than spelled out in the README: a /tmp path pasted by root could be another user's.
        print(f"export {SOCKET_ENV}={shlex.quote(config.socket.path)}\n"
              f"export {simpaths.SIM_TREE_ENV}={shlex.quote(str(config.sysfs_root))}")
        return 0
    logs.setup(config.log_level)
    route_loggers()
    try:
        return run(config, simulate=args.simulate, sim_meters=args.sim_meters,
                   load_config_again=lambda: build_config(args))
    except FtgovError as e:
        log.error("%s", e)
        return 1

