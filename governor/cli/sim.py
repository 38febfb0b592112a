"""`ftgov sim-tree DIR`: write a simulated Orin sysfs tree (for tests, the systemd CI and trying things out).

The tree alone is static files; ``python -m governor.sim.board --tree DIR`` makes it behave as a board (clamped
devfreq writes, load, clock and rails following the pin and the simulated jobs).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from governor.errors import FtgovError
from governor.safefile import OutDir


def add_parser(sub) -> None:
    from governor.sim.tree import LAYOUTS

    p = sub.add_parser("sim-tree", help="create a simulated Jetson Orin sysfs tree under DIR",
                       description="Write a simulated Jetson Orin sysfs tree (GPU devfreq node, INA3221 rails, "
                                   "board identity) under DIR, for ftgovd --sysfs-root DIR and ftgov doctor "
                                   "--sysfs-root DIR. The tree is static files; python -m governor.sim.board --tree "
                                   "DIR makes it follow the pins.")
    p.add_argument("dir", help="directory to write the tree in (created if missing)")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="jp6",
                   help="; ".join(f"{name}: {spec.description}" for name, spec in LAYOUTS.items()) + " (default jp6)")
    p.add_argument("--max-hz", type=int, help="baseline max_freq, as a power mode caps it (default: the table's top)")
    p.add_argument("--power-mode", type=int, help="AGX Orin nvpmodel mode (0 MAXN, 1 15W, 2 30W, 3 50W): writes "
                                                  "nvpmodel's conf and status and caps the baseline max")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from governor.sim import tree

    # The tree is written by path below DIR: DIR must be one nobody else can plant links in (governor/safefile.py),
    # and the paths start at the directory that was checked (its descriptor's /proc/self/fd link), not at DIR again:
    # a DIR under a member's directory could be swapped for a link once checked.
    try:
        with OutDir(args.dir) as out:
            checked = f"/proc/self/fd/{out.fd}"
            spec = tree.layout_of(tree.build(checked, args.layout, max_hz=args.max_hz, power_mode=args.power_mode))
    except ValueError as e:
        raise FtgovError(str(e)) from e
    except OSError as e:  # DIR is a file, or lies under one, or is not writable
        raise FtgovError(f"cannot write a tree at {args.dir}: {e.strerror or e}") from e
    # This interpreter, by its path: installed, ftgov's venv is not the `python` on PATH (JetPack has none).
    board = shlex.join([sys.executable, "-m", "governor.sim.board", "--tree", args.dir])
    print(f"simulated {spec.description} at {args.dir}: ftgovd --sysfs-root {args.dir}; "
          f"{board} makes it follow the pins")
    return 0
