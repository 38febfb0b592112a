"""`ftgov doctor`: check a board for what ftgovd needs; each line OK, WARN or FAIL, with the fix.

It runs as root or not, with ftgovd running or not; what it cannot check from where it runs it says (WARN) rather
than guesses. Every file is read through the configurable root (--sysfs-root, else the config's sysfs_root), so the
same checks run against a simulated Orin. Its only writes: through a running ftgovd, one pin at the GPU's current
level and its restore (the daemon's pin_check); as root with ftgovd stopped, min_freq and max_freq written back with
the values they read. Exit 0 when nothing FAILs, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

from governor import DEFAULT_CONFIG_PATH, SOCKET_ENV
from governor.argtypes import absolute_path
from governor.cli.doctor_checks import (
    CHECKS,
    FAIL,
    OK,
    WARN,
    Check,
    Context,
    l4t_release,
    parse_nvpmodel,
    socket_access,
)
from governor.client import Connection, DaemonUnavailable, SocketPermissionError, socket_path
from governor.errors import ConfigError, FtgovError
from governor.simpaths import (
    PRINT_ENV,
    SOCKET_NAME,
    env_tree,
    simulate_runtime_dir,
    tree_socket,
    tree_state_dir,
)
from governor.sysfs import trusted_root
from governor.text import printable

__all__ = ["Check", "Context", "l4t_release", "parse_nvpmodel", "refuse_while_daemon_runs", "run_checks",
           "socket_access"]


# ---- running it -------------------------------------------------------------------------------------------------

def contact(ctx: Context) -> None:
    try:
        with Connection(ctx.socket, timeout_s=10.0) as conn:
            ctx.status = conn.call("status")
    except FtgovError as e:  # absent, refused (permission), or broken: check_daemon and check_socket say which
        ctx.daemon_error = str(e)
        ctx.daemon_denied = isinstance(e, SocketPermissionError)


def run_checks(ctx: Context) -> list[Check]:
    contact(ctx)
    results: list[Check] = []
    for check in CHECKS:
        try:
            results += check(ctx)
        except (FtgovError, OSError) as e:  # e.g. a file this user may not read: say so, run the other checks
            results.append(Check(check.__name__.removeprefix("check_"), FAIL, f"check failed: {e}"))
    return results


def refuse_while_daemon_runs(what: str, socket: str | None = None) -> None:
    """One writer at a time: a command that writes devfreq itself refuses while ftgovd serves, since a job
    registering meanwhile would pin the GPU under it. Active = something accepts on the socket (it answers a ping;
    one that accepts and does not answer is refused too). With socket activation the socket unit must stop too, or
    the next connection starts the daemon again."""
    path = socket_path(socket)
    try:
        conn = Connection(path, timeout_s=5.0)
    except SocketPermissionError as e:
        # The socket is there and refuses this user: whether a daemon listens behind it cannot be told, and taking
        # it for "none" let a sweep run under a serving ftgovd.
        raise FtgovError(f"{what}: cannot tell whether ftgovd is active on {path}: {e}. Run this as root, or stop "
                         "ftgovd for the run: sudo systemctl stop ftgovd.socket ftgovd") from e
    except DaemonUnavailable:
        return
    try:
        conn.call("ping")
        state = "answers a ping"
    except FtgovError as e:
        state = f"accepts connections but did not answer a ping ({e})"
    finally:
        conn.close()
    raise FtgovError(f"{what}: ftgovd is active on {path} (it {state}); a job registering during the sweep would "
                     "pin the GPU under it. Stop it for the run: sudo systemctl stop ftgovd.socket ftgovd "
                     "(and sudo systemctl start ftgovd.socket afterwards)")


def make_context(args: argparse.Namespace) -> tuple[Context, list[Check]]:
    from governor.config import Config, load_config

    # The simulated Orin that `eval "$(ftgovd --simulate --print-env)"` names, unless a root is given.
    sysfs_root = args.sysfs_root or env_tree()
    simulated_state = tree_state_dir(sysfs_root)
    overrides = {"sysfs_root": sysfs_root, "state_dir": args.state_dir or simulated_state}
    config_path = args.config or DEFAULT_CONFIG_PATH
    early: list[Check] = []
    try:
        config = load_config(config_path, overrides, must_exist=args.config is not None)
        exists = Path(config_path).exists()
        if exists or simulated_state is None:
            early.append(Check("config", OK if exists else WARN, f"{config_path}" if exists else
                               f"no {config_path}: ftgovd runs on its defaults",
                               "" if exists else "make install puts it"))
        else:  # ftgovd --simulate runs on its defaults unless given --config: nothing is missing
            early.append(Check("config", OK, f"no {config_path}: ftgovd --simulate without --config runs on its "
                               "defaults"))
    except ConfigError as e:
        config = Config.model_validate({k: v for k, v in overrides.items() if v is not None})
        fix = ("fix the file: ftgovd refuses to start with it" if Path(config_path).exists() else
               "give the config file ftgovd runs with (given one that does not exist, it refuses to start), or no "
               "--config for the defaults")
        early.append(Check("config", FAIL, f"{e} (the checks below use the defaults)", fix))
    # The daemon of the tree checked: --socket, else the one beside a simulated tree named on the command line (a
    # shell's $FTGOV_SOCKET may be another simulated daemon's, which governs another tree), else $FTGOV_SOCKET.
    beside = tree_socket(sysfs_root)
    socket = (args.socket or (beside if args.sysfs_root else None) or os.environ.get(SOCKET_ENV) or beside
              or config.socket.path)
    # As root, a tree someone else can write decides what root reads (and prints) and writes: $FTGOV_SIM_TREE may
    # come from a member's shell (sudo -E, su without -). The daemon and restore refuse such a root too.
    try:
        root = trusted_root(config.sysfs_root)
    except ConfigError as e:
        raise ConfigError(f"{e}; nor does ftgov doctor as root (run it as the tree's owner, or point it at a "
                          "tree of root's own)") from e
    ctx = Context(root, config, config_path, socket, os.geteuid(), {os.getegid(), *os.getgroups()},
                  simulated=simulated_state is not None)
    return ctx, early


def format_checks(checks: list[Check]) -> str:
    """The checks as text; escaped as `ftgov status` is (governor/text.py): a detail may quote whatever answered on
    the socket, which need not be root's daemon (--socket, $FTGOV_SOCKET under sudo -E)."""
    lines = []
    for c in checks:
        lines.append(f"{c.status:<5} {c.name:<11} {c.detail}")
        if c.fix and c.status != OK:
            lines.append(f"{'':<17} fix: {c.fix}")
    return "\n".join(printable(line) for line in lines)


def run(args: argparse.Namespace) -> int:
    ctx, checks = make_context(args)
    checks += run_checks(ctx)
    ok = not any(c.status == FAIL for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "sysfs_root": str(ctx.root.root), "socket": ctx.socket, "uid": ctx.uid,
                          "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(f"ftgov doctor: sysfs root {ctx.root.root}, socket {ctx.socket}, uid {ctx.uid}")
        print(format_checks(checks))
        fails = sum(c.status == FAIL for c in checks)
        warns = sum(c.status == WARN for c in checks)
        print(f"{fails} FAIL, {warns} WARN" if fails or warns else "all checks OK")
        if fails and (hint := _simulated_elsewhere(args)) is not None:
            print(hint)
    return 0 if ok else 1


def _simulated_elsewhere(args: argparse.Namespace) -> str | None:
    """Where doctor checked this machine's board (nothing named a simulated one) while ftgovd --simulate listens here:
    a new shell that was never pointed at it, whose checks fail on a machine with no Jetson. How to check that one."""
    if args.sysfs_root or args.socket or env_tree() or os.environ.get(SOCKET_ENV):
        return None
    sock = simulate_runtime_dir() / SOCKET_NAME
    if not sock.is_socket():
        return None
    return (f"(ftgovd --simulate listens on {sock}: to check its simulated board instead, run {PRINT_ENV} in this "
            "shell, then ftgov doctor)")


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check this board for what ftgovd needs, with the fix for each problem",
                       description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help=f"daemon config (default {DEFAULT_CONFIG_PATH})")
    p.add_argument("--sysfs-root", type=absolute_path,
                   help="sysfs root (default: $FTGOV_SIM_TREE, the simulated Orin that ftgovd --simulate --print-env "
                        "names, else from the config: /)")
    p.add_argument("--socket", help="ftgovd's socket (default: $FTGOV_SOCKET, else the config's socket.path)")
    p.add_argument("--state-dir", type=absolute_path,
                   help="state dir (default: beside a tree that ftgovd --simulate built, else from the config: "
                        "/run/ftgov)")
    p.add_argument("--json", action="store_true", help="the checks as JSON, for scripts")
    p.set_defaults(func=run)
