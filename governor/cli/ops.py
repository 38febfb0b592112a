"""Operator commands: `ftgov status` (what runs, at what frequency, drawing what) and `ftgov predict` (what the policy
would pick for a workload, and why). `ftgov restore` lives in governor.cli.restore.

Both register their own subparser (see governor.cli); `add_parser` adds them together.
"""

from __future__ import annotations

import argparse
import json
import sys

from governor.cli.features import add_feature_arguments, features_from_args
from governor.client import Connection
from governor.errors import ConfigError, FtgovError
from governor.text import cells, isolated, padded, printable
from governor.units import energy, mhz


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="jobs, pinned frequency, GPU load and power",
                       description="Show ftgovd's jobs, the pinned and current GPU frequency, GPU load, rail power and "
                                   "each job's energy so far.")
    p.add_argument("--json", action="store_true", help="the daemon's status as JSON, for scripts")
    p.add_argument("--socket", help="ftgovd's socket (default: $FTGOV_SOCKET, else /run/ftgov/ftgov.sock)")
    p.set_defaults(func=run_status)

    p = sub.add_parser("predict", help="what the policy would pick for a workload, and why",
                       description="Ask ftgovd which frequency its policy picks for these features, and the decision "
                                   "path that led there. Nothing is pinned.")
    add_feature_arguments(p)
    p.add_argument("--json", action="store_true", help="the answer as JSON")
    p.add_argument("--socket", help="ftgovd's socket (default: $FTGOV_SOCKET, else /run/ftgov/ftgov.sock)")
    p.set_defaults(func=run_predict)


def run_status(args: argparse.Namespace) -> int:
    try:
        with Connection(args.socket) as conn:
            status = conn.call("status")
    except FtgovError as e:
        print(f"ftgov status: {e}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else format_status(status))
    return 0


def run_predict(args: argparse.Namespace) -> int:
    try:
        features = features_from_args(args)
    except ConfigError as e:
        print(f"ftgov predict: {e}", file=sys.stderr)
        return 2
    try:
        with Connection(args.socket) as conn:
            answer = conn.call("predict", **features)
    except FtgovError as e:
        print(f"ftgov predict: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    else:
        print("\n".join(printable(line) for line in (f"policy:    {answer.get('policy')}",
                                                      f"frequency: {mhz(answer.get('freq_hz'))}",
                                                      f"path:      {answer.get('reason')}")))
    return 0


def format_status(status: dict) -> str:
    """The daemon's status as text: one block per GPU, the rails, then a table of jobs. Each line is escaped
    (governor.text): job names come from clients. Others' jobs come redacted (no name, pid): shown as "-"."""
    jobs = status.get("jobs") or []
    lines = [f"ftgovd: policy {status.get('policy')}, {len(jobs)} job(s)"]
    for gpu in status.get("gpus") or []:
        lines.append(_gpu_line(gpu))
        if gpu.get("cannot_pin"):  # refused a lock as it refuses every lock: its jobs observe
            lines.append(f"  GPU {gpu.get('id')}: cannot be pinned, so its jobs run as observe (measured, never "
                         f"pinned) until ftgovd restarts: {gpu['cannot_pin']}")
        if gpu.get("cannot_cap"):  # refused every power limit, or this cap as outside its range: pinned without it
            lines.append(f"  GPU {gpu.get('id')}: power_cap_w is not applied (its clocks are pinned without it): "
                         f"{gpu['cannot_cap']}")
        if gpu.get("read_error"):  # the tick's check of a pin could not read it (NVML's read() answers no clock then)
            lines.append(f"  GPU {gpu.get('id')}: cannot be read, so its pin is not checked (the daemon tries again "
                         f"every tick): {gpu['read_error']}")
        if gpu.get("write_error"):  # a restore (or pin) that failed: the daemon retries it on every tick
            lines.append(f"  GPU {gpu.get('id')}: its last write failed and is being retried: {gpu['write_error']}")
    if status.get("gpu_missing"):
        lines.append(f"  no GPU governed: {status['gpu_missing']} (the daemon probes again)")
    power = status.get("power_mw")
    if power:
        counted = status.get("energy_rails") or []
        rails = ", ".join(f"{rail} {mw:.0f} mW" for rail, mw in sorted(power.items()))
        lines.append(f"  power: {rails}" + (f" (job energy counts {'+'.join(counted)})" if counted else ""))
    for hold in status.get("holds") or []:  # a Slurm job's GPUs held from its prolog to its epilog (docs/slurm.md)
        gpus = ", ".join(f"{gid} {mhz(g.get('freq_hz'), none='no pin')}" + (" (joined)" if g.get("joined") else "")
                         for gid, g in (hold.get("gpus") or {}).items())
        whose = ("another user's Slurm job" if hold.get("redacted") else
                 f"Slurm job {hold.get('slurm_job_id')} (uid {hold.get('uid')})")
        lines.append(f"  {whose}: {hold.get('policy')} on GPU {gpus}, held {_duration(hold.get('duration_s'))}")
    if jobs:
        rows = [("JOB", "NAME", "PID", "GPU", "POLICY", "FREQ", "STEPS", "PHASE", "TIME", "ENERGY")]
        for j in jobs:
            rows.append(tuple(printable(cell) for cell in (
                str(j.get("job_id")), str(j.get("name") or "-"), _or_dash(j.get("pid")), str(j.get("gpu")),
                str(j.get("policy") or "-"), mhz(j.get("freq_hz")), str(j.get("steps", 0)),
                str(j.get("phase") or "-"), _duration(j.get("duration_s")), energy(j.get("energy_j")))))
        widths = [max(cells(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [printable(line) for line in lines] + [""]
        # A right-to-left name is isolated (governor/text.py) so that it cannot reorder the cells beside it.
        lines += ["  ".join(isolated(padded(cell, w)) if i == 1 else padded(cell, w)
                            for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in rows]
        lines += [printable(f"  job {j.get('job_id')}: {j['reason']}") for j in jobs if j.get("reason")]
        lines += [printable(line) for line in _group_lines(status.get("groups") or [])]
        return "\n".join(lines)
    return "\n".join(printable(line) for line in lines)


def _group_lines(groups: list[dict]) -> list[str]:
    """One line per job group (docs/distributed.md): its key (another user's: hidden), ranks here, level, status."""
    lines = []
    for g in groups:
        ranks = ", ".join(f"rank {r.get('rank', '?')} job {r.get('job_id')} GPU {r.get('gpu')}"
                          for r in g.get("ranks") or [])
        world = g.get("world_size")
        key = "(another user's)" if g.get("redacted") else repr(g.get("key"))
        status = f", {g['status']}" if g.get("status") else ""
        lines.append(f"  group {key}: {len(g.get('ranks') or [])} of {world if world else '?'} rank(s) here "
                     f"({ranks}), level {mhz(g.get('level_hz'))}{status}")
    return lines


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _gpu_line(gpu: dict) -> str:
    if "error" in gpu:
        return f"GPU {gpu.get('id')}: cannot read it: {gpu['error']}"
    name = gpu.get("name") or gpu.get("devfreq") or ""
    pinned = gpu.get("pinned_hz")
    state = f"pinned to {mhz(pinned)}" if pinned else "not pinned"
    if gpu.get("stood_down"):
        state = "stood down (another tool changed the limits)"
    baseline = ""
    if gpu.get("baseline_min_hz") is not None:
        baseline = f", baseline {mhz(gpu['baseline_min_hz'])}..{mhz(gpu['baseline_max_hz'])}"
    load = gpu.get("load_pct")
    return (f"GPU {gpu.get('id')} {name}: {state}{baseline}; now {mhz(gpu.get('cur_hz'))}, limits "
            f"{mhz(gpu.get('min_hz'))}..{mhz(gpu.get('max_hz'))}, load {'?' if load is None else f'{load:.0f}%'}")


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}"
