"""`ftgov sim-tree DIR`: write a static simulated Orin sysfs tree (for tests, the systemd CI and trying things out)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("sim-tree", help="create a simulated Jetson AGX Orin sysfs tree under DIR")
    p.add_argument("dir")
    p.add_argument("--layout", choices=["jp6", "jp5"], default="jp6", help="JetPack 6 (default) or JetPack 5 layout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from governor.sim import tree

    tree.build(args.dir, args.layout)
    print(f"simulated Orin ({args.layout}) at {args.dir}: ftgovd --sysfs-root {args.dir}")
    return 0
