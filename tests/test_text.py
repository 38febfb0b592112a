"""Client strings cannot drive an operator's terminal: refused at the protocol boundary, escaped on every display."""

from __future__ import annotations

import pytest

from governor.cli.metrics import families
from governor.cli.ops import format_status
from governor.text import cells, cut, isolated, padded, printable, unprintable_at
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


BLANK_OR_STACKED = {
    "Hangul fillers": "\u3164\u3164\u3164",
    "a leading combining mark": "\u0301bert",
    "stacked marks": "b" + "\u0336" * 12 + "ert",
    "private use": "bert\ue000",
}
READABLE = ("bert-base/sst2 ü", "Tiếng Việt", "דגם-bert", "نموذج-gpt2", "名前/ファインチューニング")


def test_blank_and_stacked_names_are_refused_and_readable_scripts_are_not(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    for kind, name in BLANK_OR_STACKED.items():
        err = c.request("register", name=name, **FEATURES)["error"]
        assert err["code"] == -32602 and err["data"]["field"] == "name", (kind, err)
    for name in READABLE:
        job = c.call("register", name=name, **FEATURES)
        c.call("unregister", job_id=job["job_id"])


def test_displays_escape_what_the_protocol_refuses():
    for name in BLANK_OR_STACKED.values():
        shown = printable(name)
        assert shown != name and unprintable_at(shown) is None, (name, shown)
    for name in READABLE:
        assert printable(name) == name


def test_a_right_to_left_name_is_isolated_in_the_status_table_and_history():
    """Without isolates, a Hebrew or Arabic name pulls the PID and GPU cells beside it into its own order in a
    bidi-aware terminal: the row reads wrong."""
    rtl = "דגם-bert"
    status = {"policy": "mlg", "gpus": [], "jobs": [
        {"job_id": 1, "name": rtl, "pid": 10, "gpu": "0", "freq_hz": 714000000},
        {"job_id": 2, "name": "plain", "pid": 11, "gpu": "0", "freq_hz": 714000000}]}
    rows = format_status(status).splitlines()[-2:]
    assert "\u2068" + rtl in rows[0] and rows[0].index("\u2069") < rows[0].index(" 10 ")
    assert "\u2068" not in rows[1]
    # The cells after the name still line up: the isolates take no column.
    assert rows[0].replace("\u2068", "").replace("\u2069", "").index(" 10 ") == rows[1].index(" 11 ")
    assert isolated("plain") == "plain" and isolated(rtl) == f"\u2068{rtl}\u2069"


def test_wide_names_keep_the_columns_after_them_in_line():
    """A name of wide characters (CJK, emoji: two terminal cells each) was padded by characters, so the cells after
    it began further right than on the other rows; a long one was cut by characters too, past the column."""
    names = ["\N{GRINNING FACE}" * 3 + "-run", "\u6a21\u578b-bert", "plain", "e\u0301te"]  # emoji, CJK, ASCII, a mark
    status = {"policy": "mlg", "gpus": [], "jobs": [
        {"job_id": i, "name": name, "pid": 10 + i, "gpu": "0", "freq_hz": 714000000} for i, name in enumerate(names)]}
    rows = format_status(status).splitlines()[-len(names):]
    assert len({cells(row[:row.index(f" {10 + i} ")]) for i, row in enumerate(rows)}) == 1, rows
    assert cells("\N{GRINNING FACE}") == 2 and cells("e\u0301") == 1 and cells("abc") == 3
    long = "\u6a21" * 30
    assert cells(cut(long, 24)) <= 24 and cut(long, 24).endswith("~") and cut("short", 24) == "short"
    assert padded("\u6a21", 4) == "\u6a21  "


def test_history_lines_up_after_a_wide_name():
    from governor.cli.history import format_table
    from governor.store.measurements import JobRecord

    fields = {f: None for f in JobRecord.__dataclass_fields__}
    jobs = [JobRecord(**{**fields, "name": name, "ended_at": 1.7e9, "policy": "mlg", "freq_hz": 714000000,
                         "duration_s": 10.0, "steps": 5, "energy_j": 12.5})
            for name in ("\N{GRINNING FACE}" * 20, "plain")]
    totals = {"jobs": 2, "energy_j": 25.0, "saved_default_j": 0.0, "saved_start_j": 0.0, "saved_unsplit_j": 0.0}
    rows = format_table(jobs, totals).splitlines()[1:3]
    assert cells(rows[0][:rows[0].index("mlg")]) == cells(rows[1][:rows[1].index("mlg")]), rows
