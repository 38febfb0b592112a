"""Log lines reach journald at their own priority with and without systemd-python, and keep their code location."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from governor.daemon import logs

REPO = Path(__file__).resolve().parents[2]

# Run in a child so that its stderr is a file whose device:inode we know, as systemd's journal stream would be.
# systemd-python is made unimportable there (the `make install EXTRAS=` case), whether or not it is installed.
CHILD = """
import sys
sys.modules["systemd"] = None
from governor.daemon import logs
log = logs.setup("debug")
log.debug("a debug line")
log.info("an info line")
log.warning("a warning line")
log.error("an error line")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("a traceback")
logs.flush()
"""


def run_child(tmp_path: Path, journal_stream) -> list[str]:
    err = tmp_path / "stderr"
    err.touch()
    st = err.stat()
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "INVOCATION_ID")}
    env["PYTHONPATH"] = str(REPO)
    env["INVOCATION_ID"] = "0123456789abcdef0123456789abcdef"
    env["JOURNAL_STREAM"] = journal_stream(st)
    with open(err, "ab") as f:
        subprocess.run([sys.executable, "-c", CHILD], stderr=f, env=env, check=True, timeout=60)
    return err.read_text().splitlines()


def test_priorities_prefixed_when_stderr_is_the_journal(tmp_path):
    lines = run_child(tmp_path, lambda st: f"{st.st_dev}:{st.st_ino}")
    by_text = {line.split(" ", 1)[1].split(" [")[0]: line for line in lines if line.startswith("<")}
    assert by_text["a debug line"].startswith("<7>DEBUG ")
    assert by_text["an info line"] == "<6>INFO an info line"  # no location on info lines
    assert by_text["a warning line"].startswith("<4>WARNING a warning line [<string>:")
    assert by_text["an error line"].startswith("<3>ERROR an error line [<string>:")
    # Every line of a traceback carries the error priority, or journald would store its lines at info.
    start = next(i for i, line in enumerate(lines) if "a traceback" in line)
    traceback = lines[start:start + 4]
    assert all(line.startswith("<3>") for line in traceback), traceback
    assert any("ZeroDivisionError" in line for line in lines[start:])
    assert all(line.startswith("<3>") for line in lines[start:] if line)
    assert any("priority prefixes" in line for line in lines)  # says which mode it logs in
    assert all(line.startswith("<") for line in lines if line), lines  # that notice too: every line has its <N>


def test_config_error_before_logging_is_prefixed_on_the_journal(tmp_path):
    err = tmp_path / "stderr"
    err.touch()
    st = err.stat()
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "INVOCATION_ID")}
    env.update(PYTHONPATH=str(REPO), INVOCATION_ID="0123456789abcdef0123456789abcdef",
               JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
    with open(err, "ab") as f:
        proc = subprocess.run([sys.executable, "-m", "governor.daemon", "--config", str(tmp_path / "absent.yaml")],
                              stderr=f, env=env, timeout=60)
    assert proc.returncode == 2
    assert err.read_text().splitlines() == [f"<3>ftgovd: error: config file {tmp_path / 'absent.yaml'} does not exist"]


def test_no_prefixes_when_stderr_is_not_the_journal(tmp_path):
    # A child of a unit whose stderr was redirected inherits JOURNAL_STREAM: it names some other stream.
    lines = run_child(tmp_path, lambda st: f"{st.st_dev}:{st.st_ino + 1}")
    assert "INFO an info line" in lines
    assert not any(line.startswith("<") for line in lines)


@pytest.mark.parametrize("value", ["", "garbage", "1:x", ":"])
def test_malformed_journal_stream_is_not_the_journal(monkeypatch, value):
    monkeypatch.setenv("JOURNAL_STREAM", value)
    assert logs.stderr_is_journal() is False


class FakeJournalHandler(logging.Handler):
    """Stands in for systemd-python's JournalHandler, which sends CODE_FILE/CODE_LINE from the record."""

    records: list[logging.LogRecord] = []

    def __init__(self, **fields):
        super().__init__()

    def emit(self, record):
        FakeJournalHandler.records.append(record)


def test_journal_handler_gets_code_locations(monkeypatch):
    journal = types.ModuleType("systemd.journal")
    journal.JournalHandler = FakeJournalHandler
    package = types.ModuleType("systemd")
    package.journal = journal
    monkeypatch.setitem(sys.modules, "systemd", package)
    monkeypatch.setitem(sys.modules, "systemd.journal", journal)
    FakeJournalHandler.records = []
    log = logs.setup("info", journal=True)
    try:
        log.warning("where am I")
        logs.flush()
    finally:
        logs.setup("info", journal=False)
    (record,) = FakeJournalHandler.records
    assert record.pathname == __file__
    assert record.lineno > 0 and record.funcName == "test_journal_handler_gets_code_locations"


def test_plain_stderr_stays_lean():
    logs.setup("info", journal=False)
    assert logging._srcfile is None
