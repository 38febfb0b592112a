"""benchmarks/figures.py's write_section: each benchmark rewrites only its own section of docs/benchmarks.md."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from benchmarks.figures import PREAMBLE, write_section


def test_a_missing_file_is_created_with_the_preamble_and_the_section(tmp_path):
    path = tmp_path / "docs" / "benchmarks.md"
    write_section("daemon", "## Daemon\n\n| a |\n", path)
    text = path.read_text()
    assert text.startswith(PREAMBLE)
    assert text.endswith("<!-- begin daemon -->\n## Daemon\n\n| a |\n<!-- end daemon -->\n")


def test_a_section_is_replaced_and_the_others_kept_byte_for_byte(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Figures\n\nhand-written text\n\n<!-- begin daemon -->\nold daemon\n<!-- end daemon -->\n\n"
                    "between\n\n<!-- begin stress -->\nstress figures\n<!-- end stress -->\n")
    write_section("daemon", "new daemon\n", path)
    assert path.read_text() == ("# Figures\n\nhand-written text\n\n<!-- begin daemon -->\nnew daemon\n"
                                "<!-- end daemon -->\n\nbetween\n\n<!-- begin stress -->\nstress figures\n"
                                "<!-- end stress -->\n")


def test_a_new_section_goes_at_the_end_and_a_rerun_does_not_duplicate_it(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Figures\n\n<!-- begin stress -->\ns\n<!-- end stress -->\n")
    write_section("client", "c1", path)
    write_section("client", "c2 with a backslash \\1 and $0", path)
    text = path.read_text()
    assert text == ("# Figures\n\n<!-- begin stress -->\ns\n<!-- end stress -->\n\n"
                    "<!-- begin client -->\nc2 with a backslash \\1 and $0\n<!-- end client -->\n")


def test_a_section_named_like_a_prefix_of_another_leaves_it_alone(tmp_path):
    path = tmp_path / "benchmarks.md"
    write_section("tuner-bound", "bound", path)
    write_section("tuner", "tuner", path)
    write_section("tuner", "tuner again", path)
    text = path.read_text()
    assert "<!-- begin tuner-bound -->\nbound\n<!-- end tuner-bound -->" in text
    assert text.count("<!-- begin tuner -->") == 1 and "tuner again" in text


def test_no_temporary_file_is_left_beside_it(tmp_path):
    write_section("daemon", "x", tmp_path / "benchmarks.md")
    assert [p.name for p in tmp_path.iterdir()] == ["benchmarks.md"]


def test_a_name_that_would_not_make_a_marker_is_refused(tmp_path):
    with pytest.raises(ValueError):
        write_section("two words -->", "x", tmp_path / "benchmarks.md")


def _write_many(path: str, worker: int, count: int) -> None:
    for i in range(count):
        write_section(f"w{worker}-{i}", f"## worker {worker}, section {i}", Path(path))


def test_benchmarks_writing_side_by_side_keep_every_section(tmp_path):
    """make -j bench: each writer reads the file, adds its section and renames; without the lock one writer's
    rename drops the section another wrote between its read and its rename."""
    path = tmp_path / "benchmarks.md"
    workers, count = 4, 20
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.starmap(_write_many, [(str(path), w, count) for w in range(workers)])
    text = path.read_text()
    missing = [(w, i) for w in range(workers) for i in range(count) if f"<!-- end w{w}-{i} -->" not in text]
    assert not missing
