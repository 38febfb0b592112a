"""Client strings cannot drive an operator's terminal: refused at the protocol boundary, escaped on every display."""

from __future__ import annotations

import pytest

from governor.cli.escape import printable
from governor.cli.metrics import families
from governor.cli.ops import format_status
from tests.support.daemon import FEATURES
from tests.support.security import ftgov, job_record, write_state

HOSTILE = {
    "OSC title": "\x1b]0;root@board: all good\x07",
    "clear screen": "\x1b[2J\x1b[H",
    "forged line": "bert\rftgovd: policy mlg, 0 job(s)",
    "NUL": "a\x00b",
    "right-to-left override": "job\u202egnp.exe",
    "line separator": "a\u2028b",
}
TERMINAL_ACTORS = ("\x1b", "\r", "\x00", "\x07", "\u202e", "\u2028")


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_name_with_control_characters_is_refused_naming_the_field(orin, start_daemon, kind):
    d = start_daemon()
    c = d.client()
    err = c.request("register", name=HOSTILE[kind], **FEATURES)["error"]
    assert err["code"] == -32602 and err["data"]["field"] == "name", err
    assert "control or format characters" in err["message"]
    assert c.call("status")["jobs"] == []
    assert c.call("register", name="bert-base (fine-tune) ü", **FEATURES)["freq_hz"] == 714000000


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_status_text_escapes_names_that_already_exist(kind):
    status = {"policy": "mlg", "gpus": [], "jobs": [{"job_id": 1, "name": HOSTILE[kind], "pid": 10, "gpu": "0",
                                                     "freq_hz": 714000000, "reason": HOSTILE[kind]}]}
    text = format_status(status)
    assert not any(ch in text for ch in TERMINAL_ACTORS), repr(text)
    assert printable(HOSTILE[kind]) in text


def test_printable_cannot_be_forged_with_backslashes():
    assert printable("a\\x1b") == "a\\\\x1b" != printable("a\x1b")
    assert printable("plain name-1.0") == "plain name-1.0"


def test_metric_labels_are_escaped():
    status = {"jobs": [{"job_id": 1, "name": HOSTILE["OSC title"], "gpu": "0", "freq_hz": 1, "policy": "mlg\x1b"}]}
    for fam in families(status, job_names=True):
        for labels, _ in fam.samples:
            assert not any(ch in v for v in labels.values() for ch in TERMINAL_ACTORS), labels


def test_ftgov_status_escapes_a_name_readopted_from_the_state_file(orin, start_daemon, root_sleep):
    # A name from before the check (an older daemon's state file) is re-adopted as it is: the display escapes it.
    d = start_daemon(launch=False)
    write_state(d, orin, jobs=[job_record(root_sleep.pid, name=HOSTILE["OSC title"] + HOSTILE["forged line"])])
    d.start()
    assert len(d.client().call("status")["jobs"]) == 1
    out = ftgov("status", "--socket", d.socket)
    assert out.returncode == 0, out
    assert "\\x1b]0;root@board" in out.stdout
    assert not any(ch in out.stdout for ch in TERMINAL_ACTORS), repr(out.stdout)
    js = ftgov("status", "--json", "--socket", d.socket)
    assert not any(ch in js.stdout for ch in TERMINAL_ACTORS), repr(js.stdout)
