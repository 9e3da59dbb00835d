"""tests/ keeps the layout tests/README.md describes: every test file in a folder its table
lists, the table listing exactly the folders there are, and no basename twice (the folders are
not packages, so pytest imports each test module by its basename)."""

from __future__ import annotations

import re
from collections import Counter

from repo_paths import ROOT, TESTS

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


#: The one folder split further: one subfolder per stage of ``bucketstore/engine``.
STAGED = "engine"


def _engine_stages() -> set[str]:
    engine = ROOT / "bucketstore" / STAGED
    return {p.parent.name for p in engine.glob("*/__init__.py")}


def test_every_test_file_sits_in_a_test_folder() -> None:
    def placed(parts: tuple[str, ...]) -> bool:
        if parts[0] == STAGED:
            return len(parts) == 3 and parts[1] in _engine_stages()
        return len(parts) == 2 and parts[0] not in NO_TESTS

    misplaced = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                       if not placed(p.relative_to(TESTS).parts))
    assert not misplaced, f"move these into a folder of tests/README.md (its rules say which): {misplaced}"


def test_engine_tests_mirror_the_engine_stages() -> None:
    folders = {p.name for p in (TESTS / STAGED).iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= _engine_stages(), f"tests/engine/ folders that are not stages of bucketstore/engine: " \
                                        f"{sorted(folders - _engine_stages())}"


def test_no_basename_twice() -> None:
    twice = [name for name, n in Counter(p.name for p in TESTS.rglob("test_*.py")).items() if n > 1]
    assert not twice, f"test files sharing a basename (pytest imports them by it): {twice}"
