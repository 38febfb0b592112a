"""No two test files share a basename: the test folders are not packages, and pytest refuses to collect a second
module of a name it has imported (a clean clone's CI stopped on tests/policy/test_saving.py beside
tests/daemon/test_saving.py)."""

from __future__ import annotations

from collections import defaultdict

from tests.support import REPO


def test_every_test_file_has_a_basename_of_its_own():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in (REPO / "tests").rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
