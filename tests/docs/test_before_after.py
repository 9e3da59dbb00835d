"""tools/bench/before_after.py, behind figures.py's maintenance-before-after section: the baseline comes out
of git into a directory that goes away, both trees run every workload round by round, and what the old
tree cannot run is said, not fatal. Without git or the commit, figures.py stops in one line before
measuring anything.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from repo_paths import ROOT

sys.path.insert(0, str(ROOT / "tools" / "bench"))

import before_after  # noqa: E402

FIGURES = str(ROOT / "tools" / "bench" / "figures.py")


def _figures(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # (a timeout: were the check gone, the comparison itself would start)
    return subprocess.run([sys.executable, FIGURES, "--only", "maintenance-before-after", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_figures_stops_in_one_line_without_the_baseline_commit() -> None:
    done = _figures("--baseline", "0" * 40)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "maintenance-before-after" in done.stderr and "0" * 40 in done.stderr and "--baseline" in done.stderr


def test_figures_stops_in_one_line_without_git(tmp_path) -> None:
    done = _figures(env={**os.environ, "PATH": str(tmp_path)})  # (no git on this PATH)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "git is not installed" in done.stderr


def test_checkout_holds_the_commits_tree_and_goes_away_even_on_failure() -> None:
    head = before_after.resolve("HEAD")
    with pytest.raises(RuntimeError, match="inside"):
        with before_after.checkout(head) as tree:
            assert os.path.isfile(os.path.join(tree, "bucketstore", "__init__.py"))
            assert os.path.isfile(os.path.join(tree, "tools", "bench", "stalls_by_tree.py"))
            raise RuntimeError("inside")
    assert not os.path.exists(tree)


def test_both_trees_run_round_by_round_and_what_the_old_one_cannot_run_is_said() -> None:
    """e4041a5's bench_stalls seals at the ledger size only: a seal threshold above it is not measurable
    there, while this tree runs it; the seal and the merge run on both packages."""
    try:
        baseline = before_after.resolve(before_after.BASELINE)
    except before_after.Unavailable:
        pytest.skip(f"{before_after.BASELINE} is not in this clone's history")
    steps: list[str] = []
    c = before_after.compare(baseline, 2, steps.append, before_after.Sizes(per_bucket=20_000, seal_at=40_000,
                                                                             total=140_000))
    assert set(c.unavailable) == {"stalls, sealed", "stalls, journal"}
    assert all(why.startswith(f"{baseline[:7]}'s bench_stalls") for why in c.unavailable.values())
    for job in ("seal", "merge"):
        assert [v["tree"] for v in c.values[(job, "before")]] == ["before", "before"]
        assert [v["tree"] for v in c.values[(job, "after")]] == ["after", "after"]
    assert len(c.values[("stalls, sealed", "after")]) == 2
    # The first tree alternates: round 1 starts with the baseline, round 2 with this tree.
    assert steps[0] == "round 1/2: stalls, sealed, before" and steps[2] == "round 1/2: stalls, journal, before"
    assert "round 2/2: seal, after" in steps and steps.index("round 2/2: seal, after") < steps.index(
        "round 2/2: seal, before")
    rows = {r[0]: r for r in before_after.rows(c)}
    assert rows["sealed: second thread's add max, ms"][1] == "not measurable on the old tree"
    seal = rows["one seal of 20,000 random-delay indexes, M indexes/s"]
    assert seal[1][0].isdigit() and seal[2][0].isdigit() and seal[3].endswith(")")  # median (range) of 2 rounds
    assert seal[4].startswith("≥ 10: ")
    assert "not measurable → " in before_after.headline(c)
