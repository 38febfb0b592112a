"""`ftgov restore`: put back the baseline recorded in the state file (systemd's ExecStopPost, or by hand).

A SIGKILLed daemon runs no handler; this command runs after it, from the file the daemon wrote before its first pin.
It keeps the file's job list, so a daemon restarted afterwards can re-adopt jobs whose processes still live.
"""

from __future__ import annotations

import argparse
import sys

from governor import DEFAULT_CONFIG_PATH
from governor.backends.nvmlcalls import NvmlNotAnswering
from governor.errors import ConfigError, FtgovError, NodeNotFound, StateError
from governor.simpaths import SIM_TREE_ENV, env_tree, tree_state_dir
from governor.store.state import StateFile, absent, baseline_problem, boot_id, renumbered
from governor.sysfs import Root, trusted_root


def add_parser(sub) -> None:
    p = sub.add_parser("restore", help="restore the GPU limits saved before ftgovd pinned them",
                       description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help=f"daemon config (default {DEFAULT_CONFIG_PATH})")
    p.add_argument("--state-dir", help="state dir (default: beside a simulated tree, else from the config: "
                   "/run/ftgov)")
    p.add_argument("--sysfs-root", help=f"sysfs root (default: ${SIM_TREE_ENV}, the simulated tree, when set and no "
                   "--config, --state-dir or --sysfs-root is given; else from the config: /)")
    p.add_argument("--on-stop", action="store_true",
                   help="called as the service stops: do nothing when the config says restore_on_stop: false")
    p.set_defaults(func=run)


KEPT = ("is not here or does not answer now (see above): its baseline stays in the state file, restored once it is "
        "back (by this command or ftgovd's next start)")


def restore(state_dir: str, root: Root, config) -> int:
    from governor.backends import probe_gpus

    state_file = StateFile(state_dir)
    try:
        # Not set aside: a file this command cannot read may still hold the baseline of a pin in place (one a newer
        # ftgov wrote, read after a downgrade), for the operator to see, or the daemon to set aside at its start.
        state = state_file.read(boot_id(root), set_aside=False)
    except StateError as e:
        raise StateError(f"{e}: nothing restored, and the GPU may still be pinned (`ftgov doctor` shows it)") from e
    if state is None:
        print(f"ftgov restore: nothing to restore (no state of this boot in {state_dir})")
        return 0
    if not state.gpus:
        print(f"ftgov restore: nothing to restore (no GPU left pinned in {state_file.path})")
        return 0
    try:
        found = probe_gpus(config.backend, root, read_only=False, nvml_init_timeout_s=config.nvml_init_timeout_s)
    except (NodeNotFound, NvmlNotAnswering) as e:
        # No GPU at all: on a node of one GPU, the one off the bus or not answering; or NVML's init did not return (a
        # wedged driver). GPUs saved with a UUID (NVML's) are kept as a GPU not here is among others; one without
        # (devfreq) fails as before.
        if not all(isinstance(gs.describe.get("uuid"), str) for gs in state.gpus.values()):
            raise
        print(f"ftgov restore: {e}", file=sys.stderr)
        found = []
    gpus = {g.id: g for g in found}
    uuids = {gid: g.uuid for gid, g in gpus.items()}
    state = renumbered(state, uuids)  # NVML numbers what it finds now
    # A GPU off the bus or being reset: nothing can be written to it now, and its baseline must outlive this run.
    kept = absent(state, uuids)
    failed = 0
    for gid, gs in state.gpus.items():
        gpu = gpus.get(gid)
        if gpu is None and gs.describe.get("uuid") in kept:
            # Not a failure of this command (ExecStopPost would fail every stop while the GPU is away): nothing can
            # be written to a GPU that is not there or does not answer (a reset clears its lock), and its baseline
            # is kept for when it is back. Named by its UUID: it has no number now.
            print(f"ftgov restore: GPU {gs.describe['uuid']} {KEPT}", file=sys.stderr)
            continue
        if gpu is None:
            print(f"ftgov restore: GPU {gid} from the state file is not present or could not be opened (see above): "
                  "not restored; the state file keeps its baseline for the next start", file=sys.stderr)
            failed += 1
            continue
        problem = baseline_problem(gs.baseline, gpu.levels_hz)
        if problem is not None:
            print(f"ftgov restore: GPU {gid}: not restoring: {problem}", file=sys.stderr)
            failed += 1
            continue
        try:
            gpu.restore(gs.baseline)
        except NvmlNotAnswering as e:
            # It answered the probe but not the restore: kept, as one that does not answer the probe is.
            print(f"ftgov restore: GPU {gid}: {e}", file=sys.stderr)
            uuid = gs.describe.get("uuid")
            if not isinstance(uuid, str):
                failed += 1
                continue
            kept[uuid] = gs
            print(f"ftgov restore: GPU {gid} {KEPT}", file=sys.stderr)
            continue
        except FtgovError as e:
            print(f"ftgov restore: GPU {gid}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"ftgov restore: GPU {gid} restored to {gs.baseline.min_hz}..{gs.baseline.max_hz} Hz")
    if not failed:
        # Keep the jobs (a restarted daemon re-adopts the live ones) and the job counter; forget the baselines
        # restored, keep those of the GPUs not here (by UUID, as ftgovd keeps them).
        state.gpus = kept
        state_file.write(state)
    return 1 if failed else 0


def paths(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(sysfs root, state dir) overriding the config's: the ones given; with none given, the simulated tree the shell
    was pointed at (a daemon killed under `ftgovd --simulate` left its state beside that tree, not in /run/ftgov)."""
    sysfs_root, state_dir = args.sysfs_root, args.state_dir
    if args.config is None and sysfs_root is None and state_dir is None:
        sysfs_root = env_tree()
        if sysfs_root is not None:
            print(f"ftgov restore: the simulated tree {sysfs_root} (from ${SIM_TREE_ENV})")
    return sysfs_root, state_dir or tree_state_dir(sysfs_root)


def run(args: argparse.Namespace) -> int:
    from governor.config import Config, load_config  # pydantic: not for every `ftgov` start

    sysfs_root, state_dir = paths(args)
    overrides = {"state_dir": state_dir, "sysfs_root": sysfs_root}
    try:
        try:
            config = load_config(args.config or DEFAULT_CONFIG_PATH, overrides, must_exist=args.config is not None)
        except ConfigError as e:
            # A config broken while the daemon ran (a reload refused it) must not keep a crashed daemon's pins in
            # place: after the daemon (--on-stop, the unit's ExecStopPost) restore anyway, the one safe choice
            # whatever restore_on_stop said. By hand, the error: the operator fixes the file or names the paths.
            if not args.on_stop:
                raise
            config = Config.model_validate({k: v for k, v in overrides.items() if v is not None})
            print(f"ftgov restore: warning: {e}; restoring with the defaults for the rest (backend "
                  f"{config.backend}, sysfs root {config.sysfs_root}, state dir {config.state_dir})", file=sys.stderr)
        if args.on_stop and not config.restore_on_stop:
            print("ftgov restore: restore_on_stop is false in the config: leaving the pin in place")
            return 0
        # Asked of the state dir's lock, not the socket: with socket activation a connection starts the daemon.
        if StateFile(config.state_dir).held_elsewhere():
            # A simulated daemon (a tree from the environment or --sysfs-root) is a process in a shell, not the unit.
            stop = ("sudo systemctl stop ftgovd" if sysfs_root is None
                    else f"end the ftgovd that runs on {sysfs_root} (`ftgovd --simulate`: Ctrl-C in its shell, "
                         "or `kill %1` there where it runs in the background)")
            raise FtgovError(f"ftgovd is running on {config.state_dir}: while it runs the GPU's clocks are its own "
                             "(it pins them for its jobs and puts the baseline back when the last one ends); "
                             f"restored under it, they would be pinned again (nothing was written). Stop it first: "
                             f"{stop}")
        return restore(config.state_dir, trusted_root(config.sysfs_root), config)
    except FtgovError as e:
        print(f"ftgov restore: error: {e}", file=sys.stderr)
        return 1
