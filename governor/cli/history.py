"""`ftgov history`: the jobs in the board's measurement store, with their frequency, duration, energy and saving.

Reads the store file directly (read-only; it is root's, as the daemon's state is: run as root, or on a copy). Job
names are the clients' strings: control characters are shown escaped (governor.text), so a name cannot rewrite
the terminal.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from datetime import datetime, timedelta

from governor.errors import FtgovError
from governor.simpaths import missing_store_hint, simulated_store
from governor.text import cut, isolated, padded, printable
from governor.units import energy, figure

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DAYS_BACK = {"today": 0, "yesterday": 1}
SINCE_HELP = ("only jobs that ended since then: 7d, 12h, 30m, today, yesterday, an ISO date/date-time, or "
              "@epoch-seconds")


def parse_since(text: str, now: float | None = None) -> float:
    """Unix time from '7d', '12h', '30m', '90s', '2w' (ago), 'today' or 'yesterday' (local midnight, as journalctl
    takes them), an ISO date or date-time (local time), or epoch seconds after an '@' (as journalctl and date -d
    take them). A bare number is refused: '7' means 7 days more often than 7 s after 1970 (which lists every job)."""
    now = time.time() if now is None else now
    days_back = _DAYS_BACK.get(text.strip().lower())
    if days_back is not None:
        midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight - timedelta(days=days_back)).timestamp()
    m = _RELATIVE.match(text.strip())
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        if text.startswith("@"):
            epoch_s = float(text[1:])
            if math.isfinite(epoch_s):
                return epoch_s
        else:
            return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        pass
    raise FtgovError(f"--since {text!r}: give 7d, 12h, 30m, today, yesterday, an ISO date (2026-12-01) or date-time, "
                     "or @epoch-seconds")


def store_path(args: argparse.Namespace) -> str:
    """--store; else, without --config, the store of the daemon that answers on the socket (a simulated daemon keeps
    its own beside its socket), or where none answers, of the simulated daemon the socket or the environment names
    (governor.simpaths); else store.path of the config."""
    if args.store:
        return args.store
    if args.config is None:
        running = _daemon_store(args.socket) or simulated_store(args.socket)
        if running:
            return running
    from governor import DEFAULT_CONFIG_PATH
    from governor.config import installed_store_path, load_config

    return installed_store_path(load_config(args.config or DEFAULT_CONFIG_PATH, must_exist=args.config is not None))


def _daemon_store(socket: str | None) -> str | None:
    from governor.client import Connection

    try:
        with Connection(socket, timeout_s=2.0) as conn:
            store = conn.call("status").get("store") or {}
    except (FtgovError, OSError):
        return None  # no daemon there (or an old one): the config says where the store is
    path = store.get("path")
    return path if isinstance(path, str) and path else None


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="the measurement store (default: the one of the daemon on --socket when one "
                   "answers, else the one beside $FTGOV_SIM_TREE or a simulated daemon's socket, else store.path of "
                   "the config, /var/lib/ftgov/measurements.sqlite)")
    p.add_argument("--config", help="ftgovd's config (default /etc/ftgov/ftgov.yaml); given, the daemon is not asked")
    p.add_argument("--socket", help="the daemon asked where its store is (default: $FTGOV_SOCKET, else "
                   "/run/ftgov/ftgov.sock)")


def load(args: argparse.Namespace, since: float | None = None, command: str = "history", windows: bool = True):
    """The store's jobs and totals (``windows`` False: the jobs' windows left unread, for what shows none). A job whose
    row ftgovd could not have written is left out, each with a line on stderr that names it, and the rest are
    shown."""
    from governor.store import measurements as store

    path = store_path(args)
    try:
        conn = store.open_read_only(path)
    except store.StoreMissing as e:
        if args.store:
            raise
        offer_simulated = args.config is None and simulated_store(args.socket) is None
        raise store.StoreMissing(f"{e} ({missing_store_hint(offer_simulated)})") from e
    skipped: list[store.BadRow] = []
    try:
        jobs, totals = store.read_jobs(conn, since, skipped, windows), store.read_totals(conn)
    except store.BadRow as e:  # the totals row: one of its kind, nothing to show without it
        raise store.BadRow(f"{path}: {e}") from None
    finally:
        conn.close()
    for e in skipped:
        print(f"ftgov {command}: {path}: left out {e}", file=sys.stderr)
    if skipped:
        print(f"ftgov {command}: {len(skipped)} job(s) left out: their rows hold what ftgovd does not write (a damaged "
              "store, or one made elsewhere)", file=sys.stderr)
    return jobs, totals


def add_parser(sub) -> None:
    p = sub.add_parser("history", help="the jobs the daemon governed: frequency, duration, energy, saving",
                       description="List the jobs in the board's measurement store, oldest first.")
    add_store_arguments(p)
    p.add_argument("--since", help=SINCE_HELP)
    p.add_argument("--json", action="store_true", help="every field of every job, windows included, as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from governor.store.measurements import record_dict

    try:
        since = parse_since(args.since) if args.since else None
        jobs, totals = load(args, since, windows=args.json)  # the table shows no window
    except FtgovError as e:
        print(f"ftgov history: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"jobs": [record_dict(j) for j in jobs], "totals": totals}, indent=2))
        return 0
    print(format_table(jobs, totals))
    return 0


def _num(value, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def format_table(jobs, totals: dict) -> str:
    head = f"{'ended':19}  {'job':24}  {'policy':8}  {'MHz':>7}  {'time s':>8}  {'steps':>6}  {'energy J':>9}  saved"
    lines = [head]
    for j in jobs:
        name = cut(printable(j.name), 24) if j.name else "-"
        err = "" if j.saved_pct_err is None else f" ± {j.saved_pct_err:.1f}"
        saved = ("-" if j.saved_rel is None
                 else f"{figure(100 * j.saved_rel, '.1f')}%{err} vs {printable(j.saved_basis or '-')}")
        ended = datetime.fromtimestamp(j.ended_at).strftime('%Y-%m-%d %H:%M:%S')
        lines.append(f"{ended}  {isolated(padded(name, 24))}  "
                     f"{printable(j.policy or '-'):8}  {_num(j.freq_hz and j.freq_hz / 1e6, 'g'):>7}  "
                     f"{_num(j.duration_s, '.1f'):>8}  {_num(j.steps, 'd'):>6}  {_num(j.energy_j, '.1f'):>9}  {saved}")
    lines.append(f"{len(jobs)} job(s) listed; in all {totals['jobs']} recorded, {energy(totals['energy_j'])}; "
                 f"{saved_totals(totals)}")
    return "\n".join(lines)


def saved_totals(totals: dict) -> str:
    """The store's measured saving in words, by basis: against the default governor is ftgov's saving; against the
    tuner's start it is what tuning added on top of the tree's pick, the default governor's cost unmeasured."""
    parts = [f"{energy(totals['saved_default_j'])} against the default governor"]
    if totals["saved_start_j"]:  # only jobs whose saving was measured against the tuner's start have one
        parts.append(f"{energy(totals['saved_start_j'])} against the tuner's start")
    if totals["saved_unsplit_j"]:
        parts.append(f"{energy(totals['saved_unsplit_j'])} recorded before the store kept the two apart")
    return "measured saved: " + ", ".join(parts)
