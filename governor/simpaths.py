"""Where a simulated daemon keeps its files, for the commands that find them from the shell's environment.

ftgovd --simulate keeps its socket, state file, tree (sim-orin) and measurement store side by side in one state
directory (governor/daemon/main.py, build_config), and `eval "$(ftgovd --simulate --print-env)"` exports
FTGOV_SOCKET and FTGOV_SIM_TREE. A command given neither its own paths nor a config finds that directory from them,
where it would otherwise read the board's /run/ftgov and /var/lib/ftgov. Only os and pathlib: the client and the
daemon may import it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from governor import SOCKET_ENV

SIM_TREE_ENV = "FTGOV_SIM_TREE"
SIMULATED_TREE_NAME = "sim-orin"
STORE_NAME = "measurements.sqlite"
SOCKET_NAME = "ftgov.sock"
# What to run to point a shell at a simulated daemon: named in the hints of commands that found no daemon or store.
PRINT_ENV = 'eval "$(ftgovd --simulate --print-env)"'


def simulate_runtime_dir() -> Path:
    """Where --simulate keeps its socket, state and tree unless told otherwise: never the real /run/ftgov."""
    if os.geteuid() == 0:
        return Path("/run/ftgov-sim")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "ftgov-sim" if xdg else Path(f"/tmp/ftgov-sim-{os.getuid()}")


def start_simulated(state_dir: str | os.PathLike, socket: str | os.PathLike) -> str:
    """The command that starts the simulated daemon of this state dir and socket again: ``ftgovd --simulate &``,
    with ``--state-dir`` where the dir is not --simulate's default and ``--socket`` where the socket is not the one in
    it (a hint that omitted them would start a daemon that another shell, not this one, looks for)."""
    args = ["ftgovd", "--simulate"]
    if Path(state_dir) != simulate_runtime_dir():
        args += ["--state-dir", os.fspath(state_dir)]
    if Path(socket) != Path(state_dir) / SOCKET_NAME:
        args += ["--socket", os.fspath(socket)]
    return shlex.join(args) + " &"


def tree_state_dir(sysfs_root: str | None) -> str | None:
    """The state dir of the daemon that governs the tree at sysfs_root, where the tree tells: beside a tree that
    ftgovd --simulate built. None: the config's (a board's /run/ftgov)."""
    if sysfs_root and Path(sysfs_root).name == SIMULATED_TREE_NAME:
        return str(Path(sysfs_root).parent)
    return None


def tree_socket(sysfs_root: str | None) -> str | None:
    """The socket ftgovd --simulate listens on for the tree at sysfs_root (beside it), where the tree tells; None for
    another tree."""
    state_dir = tree_state_dir(sysfs_root)
    return None if state_dir is None else str(Path(state_dir) / SOCKET_NAME)


def env_tree(environ: Mapping[str, str] = os.environ) -> str | None:
    """$FTGOV_SIM_TREE, the simulated tree the shell was pointed at; None when unset or empty."""
    return environ.get(SIM_TREE_ENV) or None


def holds_simulated_tree(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a simulated daemon's state dir: its tree lies there."""
    return (Path(directory) / SIMULATED_TREE_NAME).is_dir()


def simulated_state_dir(socket: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The state dir of the simulated daemon named by ``socket`` (a --socket given) or, without one, by the
    environment: beside $FTGOV_SIM_TREE, else beside $FTGOV_SOCKET. A socket names one only where the simulated tree
    lies next to it (ftgovd --simulate --socket elsewhere leaves its tree behind). None: no simulated daemon named."""
    if socket is None:
        beside_tree = tree_state_dir(env_tree(environ))
        if beside_tree is not None:
            return beside_tree
        socket = environ.get(SOCKET_ENV) or None
    if socket is None:
        return None
    state_dir = Path(socket).parent
    return str(state_dir) if holds_simulated_tree(state_dir) else None


def simulated_store(socket: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The measurement store of the simulated daemon named as simulated_state_dir says; None: none named."""
    state_dir = simulated_state_dir(socket, environ)
    return str(Path(state_dir) / STORE_NAME) if state_dir is not None else None


def missing_store_hint(offer_simulated: bool) -> str:
    """What follows "no measurement store at PATH" where PATH was a command's default: the option that names a store,
    and with ``offer_simulated`` (the command would read a simulated daemon's store, but the shell names none), how
    to point the shell at ftgovd --simulate's."""
    if not offer_simulated:
        return "give --store PATH"
    return f"give --store PATH, or for ftgovd --simulate's: {PRINT_ENV}"
