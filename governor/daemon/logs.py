"""Logging: journald with structured fields under systemd, plain human lines on stderr otherwise.

Log calls pass journald fields as ``extra={"JOB_ID": 3, "FREQ_HZ": ...}``; systemd-python's JournalHandler turns
upper-case record attributes into fields, so ``journalctl -u ftgovd JOB_ID=3`` finds a job's whole story. On stderr
the same records read as one line each.

While the event loop runs, records are written once the loop turn that made them is over (AfterTurn): a decision's
line comes a moment after its reply, not before it, so a burst of registrations is answered first. Order is kept,
and the daemon writes what is pending before each sd_notify message (flush()), so a STATUS= never overtakes the lines
that led to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from governor.daemon import ratelimit


class AfterTurn(logging.Handler):
    """Hands records to the real handler after the current event-loop turn (at once when no loop runs)."""

    def __init__(self, target: logging.Handler):
        super().__init__()
        self.target = target
        self.pending: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not self.pending:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: start-up, shutdown
                self.target.handle(record)
                return
        self.pending.append(record)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if not pending:
            return
        if type(self.target) is logging.StreamHandler:  # one write for the turn's lines, not one each
            target = self.target
            try:
                text = "".join(target.format(r) + target.terminator for r in pending if target.filter(r))
                with target.lock:
                    target.stream.write(text)
                    target.stream.flush()
            except Exception:
                target.handleError(pending[-1])  # as emit() would: say so on stderr, never raise into the daemon
            return
        for record in pending:
            self.target.handle(record)

    def close(self) -> None:
        self.flush()
        self.target.close()
        super().close()


def flush() -> None:
    """Write the daemon's pending log lines now."""
    for handler in logging.getLogger("ftgovd").handlers:
        handler.flush()


def under_systemd() -> bool:
    # JOURNAL_STREAM: our stderr goes to the journal; INVOCATION_ID: started by systemd as a unit.
    return bool(os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"))


def lean_records() -> None:
    """Skip what a record would otherwise collect and we never print: the caller's file and line (a walk up the
    stack on every call), thread and process names (one thread, one process; journald adds _PID itself). These are
    the logging module's documented switches for this; they halve the cost of a decision line on the request path."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.logAsyncioTasks = False  # Python 3.12+; harmless before


def setup(level: str = "info", *, journal: bool | None = None) -> logging.Logger:
    """Configure the "ftgovd" logger; returns it. journal=None decides from the environment."""
    lean_records()
    log = logging.getLogger("ftgovd")
    log.handlers.clear()
    log.propagate = False
    log.setLevel(level.upper())
    handler: logging.Handler | None = None
    if journal is None:
        journal = under_systemd()
    if journal:
        try:
            from systemd.journal import JournalHandler  # systemd-python: an optional extra
        except ImportError:
            handler = None
            print("ftgovd: systemd-python is not installed: logging to stderr without journal fields", file=sys.stderr)
        else:
            handler = JournalHandler(SYSLOG_IDENTIFIER="ftgovd")
            handler.setFormatter(logging.Formatter("%(message)s"))
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        # Under systemd without the journal module, journald adds its own timestamp: don't print one twice.
        fmt = "%(levelname)s %(message)s" if under_systemd() else "%(asctime)s ftgovd %(levelname)s %(message)s"
        handler.setFormatter(logging.Formatter(fmt))
    log.addHandler(AfterTurn(handler))
    ratelimit.install(log)  # lines a client causes are bounded per uid
    return log
