"""tests/ keeps the layout tests/README.md describes: every test file in a folder its table
lists, the table listing exactly the folders there are, and no basename twice (the folders are
not packages, so pytest imports each test module by its basename)."""

from __future__ import annotations

import re
from collections import Counter

from repo_paths import TESTS

#: Folders that hold support code or data, never tests.
NO_TESTS = {"support", "corpus"}


def _listed_folders() -> set[str]:
    return set(re.findall(r"^\| `(\w+)/` \|", (TESTS / "README.md").read_text(), re.M))


def _folders() -> set[str]:
    return {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}


def test_the_readme_lists_every_folder_and_only_those() -> None:
    listed, present = _listed_folders(), _folders()
    assert listed == present, f"in tests/README.md but absent: {sorted(listed - present)}; " \
                              f"present but not described there: {sorted(present - listed)}"


def test_every_test_file_sits_in_a_test_folder() -> None:
    misplaced = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                       if len(p.relative_to(TESTS).parts) != 2 or p.parent.name in NO_TESTS)
    assert not misplaced, f"move these into a folder of tests/README.md (its rules say which): {misplaced}"


def test_no_basename_twice() -> None:
    twice = [name for name, n in Counter(p.name for p in TESTS.rglob("test_*.py")).items() if n > 1]
    assert not twice, f"test files sharing a basename (pytest imports them by it): {twice}"
