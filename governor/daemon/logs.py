"""Logging: journald with structured fields under systemd, plain human lines on stderr otherwise.

Log calls pass journald fields as ``extra={"JOB_ID": 3, "FREQ_HZ": ...}``; systemd-python's JournalHandler turns
upper-case record attributes into fields, so ``journalctl -u ftgovd JOB_ID=3`` finds a job's whole story. On stderr
the same records read as one line each.

While the event loop runs, records are written once the loop turn that made them is over (AfterTurn): a decision's
line comes a moment after its reply, not before it, so a burst of registrations is answered first. Order is kept,
and the daemon writes what is pending before each sd_notify message (flush()), so a STATUS= never overtakes the lines
that led to it.

Without systemd-python (installed with ``EXTRAS=``) under systemd, stderr is the journal's stream: each line then
starts with its syslog priority, ``<3>`` for an error (sd-daemon(3)), so ``journalctl -p warning`` still finds
errors. That stream carries no fields, so a warning's or error's code location is written into its message
(``[controller.py:212]``); info lines, the daemon's running story, go without it.
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
                assert target.lock is not None  # Handler.__init__ creates it
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


def stderr_is_journal() -> bool:
    """True when stderr is the stream systemd connected to the journal: JOURNAL_STREAM holds that stream's
    device:inode, and a child whose stderr was redirected elsewhere inherits the variable, so compare with fstat."""
    dev, sep, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):  # no stderr, not a real file, a malformed variable
        return False


# syslog priorities (syslog(3)) of the logging levels; anything between two levels takes the lower one's.
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))
_DEBUG_PRIORITY = 7


def syslog_priority(levelno: int) -> int:
    return next((prio for level, prio in _PRIORITIES if levelno >= level), _DEBUG_PRIORITY)


class PriorityFormatter(logging.Formatter):
    """Lines for journald's stdout/stderr stream: every line of a record (a traceback's too, which journald would
    otherwise store at info) starts with ``<N>``, its syslog priority; warnings and errors end with where they were
    logged, since the stream cannot carry CODE_FILE/CODE_LINE fields."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING and record.lineno:
            first, nl, rest = text.partition("\n")
            text = f"{first} [{record.filename}:{record.lineno}]{nl}{rest}"
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.split("\n"))


_SRCFILE = logging._srcfile  # the logging module's own value: where its stack walk for the caller stops


def lean_records(*, keep_location: bool = False) -> None:
    """Skip what a record would otherwise collect and we never print: the caller's file and line (a walk up the
    stack on every call), thread and process names (one thread, one process; journald adds _PID itself). These are
    the logging module's documented switches for this; they halve the cost of a decision line on the request path.
    keep_location: the journal stores the file and line (CODE_FILE, CODE_LINE), worth the walk there."""
    logging._srcfile = _SRCFILE if keep_location else None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if sys.version_info >= (3, 12):
        logging.logAsyncioTasks = False


def setup(level: str = "info", *, journal: bool | None = None) -> logging.Logger:
    """Configure the "ftgovd" logger; returns it. journal=None decides from the environment."""
    log = logging.getLogger("ftgovd")
    log.handlers.clear()
    log.propagate = False
    log.setLevel(level.upper())
    handler: logging.Handler | None = None
    if journal is None:
        journal = under_systemd()
    prefixed = journal and stderr_is_journal()
    missing_journal_module = False
    if journal:
        try:
            from systemd.journal import JournalHandler  # systemd-python: an optional extra
        except ImportError:
            missing_journal_module = True
        else:
            handler = JournalHandler(SYSLOG_IDENTIFIER="ftgovd")
            handler.setFormatter(logging.Formatter("%(message)s"))
    lean_records(keep_location=handler is not None or prefixed)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        if prefixed:
            handler.setFormatter(PriorityFormatter("%(levelname)s %(message)s"))
        else:
            # Under systemd without the journal module, journald adds its own timestamp: don't print one twice.
            fmt = "%(levelname)s %(message)s" if under_systemd() else "%(asctime)s ftgovd %(levelname)s %(message)s"
            handler.setFormatter(logging.Formatter(fmt))
    after_turn = AfterTurn(handler)
    ratelimit.install(after_turn)  # lines a client causes are bounded per uid, other loggers' per logger
    log.addHandler(after_turn)
    if missing_journal_module:  # through the handler: on the journal's stream it needs its <N> prefix as any line
        how = "with <N> priority prefixes" if prefixed else "as plain lines"
        log.info("systemd-python is not installed: logging to stderr %s, without journal fields", how)
    return log


def stderr_line(text: str, priority: int = 3) -> str:
    """A line the daemon prints on stderr itself (before logging is set up): with its ``<N>`` prefix when stderr is
    the journal's stream, as every logged line there has."""
    return f"<{priority}>{text}" if under_systemd() and stderr_is_journal() else text
