"""tools/bench/bench_merge.py measures what it says: figures.py's merge table comes from it.

With background maintenance the default, a benchmark that reads a tracker's stats right after the
roll that starts a merge saw no merge at all (0 merges in 0 ms); and its simulate step wrapped a
hook the simulator no longer has. Both ran only by hand, so nothing caught them.
"""

from __future__ import annotations

import sys

from pathlib import Path

from repo_paths import ROOT

sys.path.insert(0, str(ROOT / "tools" / "bench"))

import bench_merge  # noqa: E402


def test_merge_once_times_a_merge_that_happened(tmp_path: Path) -> None:
    r = bench_merge.merge_once(str(tmp_path / "s"), 0)
    assert r["merges"] == 1
    assert r["buckets_after"] == 2  # the merged four and the fifth seal
    assert r["merge_ms"] > 0


def test_simulate_level_samples_memory_while_publishing() -> None:
    level = bench_merge.simulate_level(20_000)
    assert level["violations"] == 0
    assert level["messages"] == 20_000
    assert 0 < level["rss_first_mb"] <= level["rss_peak_mb"]
