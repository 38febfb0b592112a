"""Bounds on what one client can make the daemon do per second: re-decisions per job, log lines per uid.

Re-decisions: each moves the pin (a sysfs write) and saves the state file (an fsync). ``Coalescer`` runs at most one
per job per interval_s: the first change in a window is decided at once; later ones within the window are answered
with the decision in force, and the latest of them is decided when the window ends (nothing a client said is lost,
it takes effect up to interval_s later).

Log lines: a client's requests cause log lines (decisions, refusals, failures). ``LogLimit`` is a logging filter with
a token bucket per non-root uid for the lines logged while serving that uid (``caused_by``), and one per logger for the
lines of loggers other than the daemon's own ("asyncio": a failed accept is logged with its traceback, once per
connection a client makes); the lines it drops are counted, and the count is logged once the bucket has tokens again.
It sits on the daemon's handler, which every logger writes through (governor.daemon.main.route_loggers).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Hashable

REDECIDE_INTERVAL_S = 1.0
LOG_LINES_PER_S = 10.0
LOG_BURST = 50


class Coalescer:
    """At most one run per key per interval_s; see the module docstring."""

    def __init__(self, defer: Callable[[Callable[[], None], float], None], interval_s: float = REDECIDE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.defer, self.interval_s, self.clock = defer, interval_s, clock
        self.last_s: dict[Hashable, float] = {}
        self.pending: dict[Hashable, Callable[[], object]] = {}

    def request(self, key: Hashable, fn: Callable[[], object], later: Callable[[], object] | None = None) -> float:
        """Run fn now (returns 0.0; its exceptions reach the caller) or, at the window's end, ``later`` (fn when
        None; returns the seconds until then; replaces an earlier pending one of this key)."""
        now = self.clock()
        last = self.last_s.get(key)
        if last is None or now - last >= self.interval_s:
            self.last_s[key] = now
            fn()
            return 0.0
        delay_s = last + self.interval_s - now
        if key not in self.pending:
            self.defer(lambda: self._run_pending(key), delay_s)
        self.pending[key] = later or fn
        return delay_s

    def forget(self, key: Hashable) -> None:
        """The key's object is gone (the job ended): drop what waits for it."""
        self.last_s.pop(key, None)
        self.pending.pop(key, None)

    def _run_pending(self, key: Hashable) -> None:
        fn = self.pending.pop(key, None)
        if fn is None:
            return
        self.last_s[key] = self.clock()
        try:
            fn()
        except Exception as e:  # deferred: there is no client waiting to be told
            logging.getLogger("ftgovd").error("deferred re-decision failed: %s", e)


_CLIENT_UID: contextvars.ContextVar[int | None] = contextvars.ContextVar("ftgov_client_uid", default=None)


def caused_by(uid: int | None) -> contextvars.Token:
    """Lines logged from now until ``done(token)`` (and in tasks started meanwhile) count against uid's bucket."""
    return _CLIENT_UID.set(uid)


def done(token: contextvars.Token) -> None:
    _CLIENT_UID.reset(token)


class TokenBuckets:
    """A token bucket per key: ``rate_per_s`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate_per_s, self.burst, self.clock = rate_per_s, burst, clock
        self.buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, when counted)

    def take(self, key: Hashable) -> float:
        """Take a token: 0.0; or, with none left, the seconds until there is one (nothing taken)."""
        now = self.clock()
        tokens, then = self.buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate_per_s)
        if tokens < 1:
            self.buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate_per_s
        self.buckets[key] = (tokens - 1, now)
        return 0.0


DAEMON_LOGGER = "ftgovd"


class LogLimit(logging.Filter):
    """A token bucket per uid over the lines logged on its behalf, and per logger over other loggers' lines; the
    daemon's own lines for no client, or for root, always pass."""

    def __init__(self, rate_per_s: float = LOG_LINES_PER_S, burst: int = LOG_BURST,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.rate_per_s = rate_per_s
        self.tokens = TokenBuckets(rate_per_s, burst, clock)
        self.dropped: dict[int | str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_ftgov_summary", False):
            return True
        uid = _CLIENT_UID.get()
        if uid:
            key: int | str = uid
        elif record.name != DAEMON_LOGGER:
            key = record.name
        else:
            return True  # the daemon's own line, or root's: the operator's
        if self.tokens.take(key):
            self.dropped[key] = self.dropped.get(key, 0) + 1
            return False
        dropped = self.dropped.pop(key, 0)
        if dropped:
            msg, args = (("%d log line(s) caused by uid %d suppressed (more than %g a second)", (dropped, uid,
                                                                                                 self.rate_per_s))
                         if uid else ("%d log line(s) from %s suppressed (more than %g a second)",
                                      (dropped, key, self.rate_per_s)))
            summary = logging.LogRecord(record.name, logging.WARNING, "", 0, msg, args, None)
            summary._ftgov_summary = True
            # Through the logger that logged the line, so through the same handlers ("root" is the root logger's name).
            logging.getLogger(None if record.name == "root" else record.name).handle(summary)
        return True


def install(logger: logging.Filterer, limit: LogLimit | None = None) -> LogLimit:
    """Put one LogLimit on the logger or handler (replacing an earlier one)."""
    for f in [f for f in logger.filters if isinstance(f, LogLimit)]:
        logger.removeFilter(f)
    limit = limit or LogLimit()
    logger.addFilter(limit)
    return limit
