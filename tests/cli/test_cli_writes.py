"""Root runs `ftgov report`, `ftgov model retrain`, `ftgov metrics --textfile` and the pipeline's stages into
directories that others may control. Each attack here plants a link where root will write and checks that root
neither follows it nor writes into that directory at all (governor/safefile.py)."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from governor import safefile
from governor.cli import main
from governor.pipeline import retrain
from governor.policy.tree import DecisionTree
from governor.sim import learning
from governor.store.measurements import Store
from tests.support.security import needs_root

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SECRET = b"root's own file\n"
# Every name a report writes: the attack plants a link at each.
REPORT_FILES = ("summary.md", "summary.csv", "curves.png", "savings.png")
# learning.stream's jobs are uid 1000's: trusted, so that the store has something to teach.
RETRAIN = ("--current", str(REPO / "model" / "mlg-tree.json"),
           "--data", str(REPO / "model" / "data" / "characterization.csv"), "--uid", "1000", "--force")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "measurements.sqlite"
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    records = list(learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 12, seed=3))
    # The member's job name: what it would put into /etc/ld.so.preload.
    records[0] = dataclasses.replace(records[0], name="/tmp/evil.so")
    s = Store(path)
    for r in records:
        s.add(r)
    s.close()
    return path


@pytest.fixture
def victim(tmp_path):
    """A root-only file (what /etc/ld.so.preload is on a board)."""
    p = tmp_path / "victim"
    p.write_bytes(SECRET)
    p.chmod(0o600)
    return p


def plant(d: Path, names, target: Path, *, mode: int = 0o777, owner: int | None = None) -> None:
    """``d`` as another user would leave it: links to ``target`` at each of ``names``."""
    d.mkdir(exist_ok=True)
    for n in names:
        (d / n).symlink_to(target)
    d.chmod(mode)
    if owner is not None:
        for n in names:
            os.lchown(d / n, owner, owner)
        os.chown(d, owner, owner)


def refused(capsys, rc: int, where: Path) -> None:
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(where) in err and "Traceback" not in err, err


def test_report_into_a_world_writable_dir_with_planted_links_is_refused(store, victim, tmp_path, capsys):
    out = tmp_path / "ftgov-report"
    plant(out, REPORT_FILES, victim)
    refused(capsys, main(["report", "--store", str(store), "--out", str(out)]), out)
    assert victim.read_bytes() == SECRET and stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_report_into_a_members_dir_is_refused(store, victim, tmp_path, capsys):
    """The issue's attack: a member's directory (not sticky, so fs.protected_symlinks does not apply), mode 0755."""
    needs_root()
    out = tmp_path / "ftgov-report"
    plant(out, REPORT_FILES, victim, mode=0o755, owner=NOBODY)
    refused(capsys, main(["report", "--store", str(store), "--out", str(out)]), out)
    assert victim.read_bytes() == SECRET


def test_report_does_not_pass_through_a_link_others_could_have_planted(store, victim, tmp_path, capsys):
    """A link in the middle of the path, in a directory others can write, could send root's files anywhere."""
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "reports").symlink_to(elsewhere)
    shared.chmod(0o777)
    out = shared / "reports" / "cron.d"
    refused(capsys, main(["report", "--store", str(store), "--out", str(out)]), out)
    assert list(elsewhere.iterdir()) == []


def test_report_replaces_links_in_its_own_dir_instead_of_following_them(store, victim, tmp_path):
    out = tmp_path / "mine"
    plant(out, REPORT_FILES, victim, mode=0o755)
    assert main(["report", "--store", str(store), "--out", str(out)]) == 0
    assert victim.read_bytes() == SECRET
    for n in REPORT_FILES:
        st = os.lstat(out / n)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644, n
    assert "/tmp/evil.so" in (out / "summary.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file left


def test_report_creates_a_new_dir_and_follows_the_owners_own_links(store, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)  # in a directory only we can write: ours to follow
    old = os.umask(0o077)
    try:
        assert main(["report", "--store", str(store), "--out", str(tmp_path / "link" / "new" / "dir")]) == 0
    finally:
        os.umask(old)
    made = real / "new" / "dir"
    assert sorted(p.name for p in made.iterdir()) == sorted(REPORT_FILES)
    assert stat.S_IMODE((made / "summary.md").stat().st_mode) == 0o644  # readable, whatever the umask


def test_report_onto_a_file_is_one_line(store, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    refused(capsys, main(["report", "--store", str(store), "--out", str(f)]), f)


def test_report_that_cannot_write_its_files_is_one_line(store, tmp_path, capsys):
    """The directory opens, and then a write fails: here a directory where a figure goes, as root can meet it; a
    member meets the same error in a directory of root's (Permission denied: the README's /tmp/ftgov-report after
    root tried it). It was a traceback."""
    out = tmp_path / "ftgov-report"
    (out / "curves.png").mkdir(parents=True)
    refused(capsys, main(["report", "--store", str(store), "--out", str(out)]), out)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.parametrize("stage", ["ffg", "dataset"])
def test_a_stage_given_a_directory_for_out_is_one_line(stage, tmp_path, capsys):
    """`--out DIR` for a stage that writes one file: the write fails once the file is made (a traceback before)."""
    d = tmp_path / "model"
    d.mkdir()
    rc = main(["model", stage, "--data", str(REPO / "governor" / "data" / "characterization.csv"), "--out", str(d)])
    refused(capsys, rc, d)
    assert list(d.iterdir()) == [] and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_link_in_a_sticky_dir_is_followed_only_when_root_or_the_caller_owns_it(tmp_path):
    """The kernel's fs.protected_symlinks rule, applied whatever the sysctl says."""
    needs_root()
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "ours").symlink_to(target)
    (sticky / "theirs").symlink_to(target)
    os.lchown(sticky / "theirs", NOBODY, NOBODY)
    os.close(safefile.open_dir(sticky / "ours"))
    with pytest.raises(safefile.UnsafeDirectory, match="theirs is a symlink"):
        safefile.open_dir(sticky / "theirs")


def test_retrain_sets_the_trees_mode_on_its_descriptor_not_by_path(store, tmp_path, monkeypatch):
    """Item 3: chmod(tmp) after the fsync followed a link the directory's owner swapped in. Nothing may chmod by
    path, and the tree is 0644 (the daemon reads it) whatever the umask."""
    def no_chmod(*a, **k):
        raise AssertionError(f"chmod by path: {a}")
    monkeypatch.setattr(os, "chmod", no_chmod)
    out = tmp_path / "trees" / "mlg-tree.json"
    old = os.umask(0o077)
    try:
        rc = main(["model", "retrain", "--store", str(store), "--out", str(out), *RETRAIN])
    finally:
        os.umask(old)
    assert rc == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    DecisionTree.load(out)


def test_retrain_refuses_a_dir_others_can_write(store, victim, tmp_path, capsys):
    out = tmp_path / "shared"
    plant(out, ("mlg-tree.json",), victim)
    rc = main(["model", "retrain", "--store", str(store), "--out", str(out / "mlg-tree.json"), *RETRAIN])
    refused(capsys, rc, out)
    assert victim.read_bytes() == SECRET


def test_metrics_textfile_refuses_a_dir_others_can_write(victim, tmp_path, capsys):
    """prometheus_client wrote PATH.<pid>.<thread> by path; the name repeats every interval, so whoever can write
    the directory plants a link at it once and root follows it at the next write."""
    pytest.importorskip("prometheus_client")
    d = tmp_path / "textfile"
    plant(d, (f"ftgov.prom.{os.getpid()}.{__import__('threading').get_ident()}",), victim)
    rc = main(["metrics", "--textfile", str(d / "ftgov.prom"), "--once", "--socket", str(tmp_path / "none.sock")])
    refused(capsys, rc, d)
    assert victim.read_bytes() == SECRET


def test_metrics_textfile_is_written_atomically_and_readable(tmp_path):
    pytest.importorskip("prometheus_client")
    d = tmp_path / "textfile"
    d.mkdir()
    rc = main(["metrics", "--textfile", str(d / "ftgov.prom"), "--once", "--socket", str(tmp_path / "none.sock")])
    assert rc == 0
    text = (d / "ftgov.prom").read_text()
    assert "ftgov_up 0.0" in text
    assert stat.S_IMODE((d / "ftgov.prom").stat().st_mode) == 0o644
    assert [p.name for p in d.iterdir()] == ["ftgov.prom"]


def test_characterize_appends_only_in_a_safe_dir(victim, tmp_path, capsys):
    from governor.pipeline.characterize import COLUMNS

    victim.write_text(",".join(COLUMNS) + "\n")  # a file the stage would append to
    before = victim.read_bytes()
    d = tmp_path / "data"
    plant(d, ("sweep.csv",), victim)
    rc = main(["characterize", "--simulate", "--workload", "bert-base/sst2", "--steps", "2", "--warmup", "0",
               "--quiet", "--out", str(d / "sweep.csv")])
    refused(capsys, rc, d)
    assert victim.read_bytes() == before


def test_evaluate_plots_only_in_a_safe_dir(victim, tmp_path, capsys):
    d = tmp_path / "plots"
    plant(d, ("savings.png",), victim)
    rc = main(["evaluate", "--data", str(REPO / "model" / "data" / "held-out.csv"), "--out", str(d), "--no-tune"])
    refused(capsys, rc, d)
    assert victim.read_bytes() == SECRET


def test_sim_tree_refuses_a_dir_others_can_write(victim, tmp_path, capsys):
    d = tmp_path / "tree"
    plant(d, ("sys",), victim)
    refused(capsys, main(["sim-tree", str(d)]), d)
    assert victim.read_bytes() == SECRET


def test_sim_tree_writes_into_the_dir_it_checked_not_one_swapped_in_after(tmp_path, monkeypatch):
    """A tree under a member's home: the member renames the directory root checked and leaves a link in its place
    before root writes (inotify tells when it is made); written by path, the tree went where the link led."""
    needs_root()
    from governor.sim import tree

    home = tmp_path / "member"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    d, etc = home / "tree", tmp_path / "etc"
    etc.mkdir()
    build = tree.build

    def swapped_then_built(directory, *args, **kwargs):
        os.rename(d, home / "checked")
        d.symlink_to(etc)
        os.lchown(d, NOBODY, NOBODY)
        return build(directory, *args, **kwargs)

    monkeypatch.setattr(tree, "build", swapped_then_built)
    assert main(["sim-tree", str(d)]) == 0
    assert list(etc.iterdir()) == []
    assert (home / "checked" / "ftgov-sim" / "layout").read_text() == "jp6\n"
