"""Issue 26's workloads on two trees in one run: a baseline commit (before) and this tree (after).

figures.py's ``maintenance-before-after`` section is this comparison. The baseline's package and
benchmarks are taken out of git with ``git archive`` into a temporary directory (removed afterwards,
whatever happens; unlike ``git worktree add`` it registers nothing in the repository, which other
checkouts share). Then, round by round, with the tree that goes first alternating between rounds,
every workload runs on both trees back to back, each run in a fresh process:

* the stalls workload, ``bench_maintenance.py --cases stalls --per-bucket 1e6 --seal-at 5e5
  --total 7e6`` (background maintenance; a writer adds batches of 10,000 while a second thread adds
  one index per millisecond), in sealed and in journal durability, each tree running its own
  bench_maintenance through stalls_by_tree.py;
* one seal of 1 M random-delay indexes and one merge of four sealed 1 M buckets, this tree's
  bench code (public API only) on each tree's package through jobs_by_tree.py.

A workload the baseline cannot run is reported as not measurable there (with the reason) rather
than failing the comparison; the current tree must run them all.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

#: main when the session that began issue 26 started (its first commit, 73056b5, is a child of it).
BASELINE = "e4041a5"


@dataclass(frozen=True)
class Sizes:
    """The workloads' sizes: the issue's by default (ledgers of 1 M, seals from 500,000, 7 M indexes;
    jobs on buckets of 1 M, so merges of 4 M); tests run small ones."""

    per_bucket: int = 1_000_000
    seal_at: int = 500_000
    total: int = 7_000_000


ISSUE = Sizes()
#: One child run: a loaded machine stretches a 7 M stalls run to a few minutes at worst.
CHILD_TIMEOUT_S = 1800


class Unavailable(RuntimeError):
    """git, or the baseline commit, is not there (a copy of the tree without its history, say)."""


class ChildFailed(RuntimeError):
    """A workload's process exited non-zero; the message is the last line of its stderr."""


@dataclass(frozen=True)
class Metric:
    """One figure of a workload's JSON line, as a row of the table."""

    key: str
    label: str
    digits: int
    #: The issue's target for the figure: ("<=", 5.0) or (">=", 10.0); None if it sets none.
    target: tuple[str, float] | None = None

    def meets(self, value: float) -> bool:
        assert self.target is not None
        op, bound = self.target
        return value <= bound if op == "<=" else value >= bound


@dataclass(frozen=True)
class Workload:
    name: str
    #: (tree directory, label) -> the command line of one run, which prints one JSON line last.
    argv: Callable[[str, str], list[str]]
    metrics: tuple[Metric, ...]


def _stalls(sizes: Sizes, durability: str) -> Workload:
    def argv(tree: str, label: str) -> list[str]:
        return [sys.executable, os.path.join(HERE, "stalls_by_tree.py"), tree, label, "--durability", durability,
                "--per-bucket", str(sizes.per_bucket), "--seal-at", str(sizes.seal_at), "--total", str(sizes.total)]

    return Workload(f"stalls, {durability}", argv, (
        Metric("other_p50_ms", f"{durability}: second thread's add p50, ms", 3),
        Metric("other_p99_ms", f"{durability}: second thread's add p99, ms", 2, ("<=", 5.0)),
        Metric("other_max_ms", f"{durability}: second thread's add max, ms", 1, ("<=", 50.0)),
        Metric("caller_M_per_s", f"{durability}: writer at the caller, M indexes/s", 2, (">=", 10.0)),
        Metric("all_sealed_M_per_s", f"{durability}: writer until all is installed, M indexes/s", 2, (">=", 10.0)),
    ))


def _job(sizes: Sizes, job: str, label: str) -> Workload:
    def argv(tree: str, tree_label: str) -> list[str]:
        return [sys.executable, os.path.join(HERE, "jobs_by_tree.py"), tree, tree_label, job,
                "--indexes", str(sizes.per_bucket)]

    return Workload(job, argv, (Metric("M_per_s", label, 2, (">=", 10.0)),))


def workloads(sizes: Sizes = ISSUE) -> tuple[Workload, ...]:
    """The stalls workload in both durabilities, then one seal and one merge."""
    return (_stalls(sizes, "sealed"), _stalls(sizes, "journal"),
            _job(sizes, "seal", f"one seal of {count(sizes.per_bucket)} random-delay indexes, M indexes/s"),
            _job(sizes, "merge", f"one merge of 4 × {count(sizes.per_bucket)}, M indexes/s"))


def count(x: int) -> str:
    """An index count as the text says it: 1 M, 4 M, 20,000."""
    return f"{x // 10**6} M" if x % 10**6 == 0 else f"{x:,}"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise Unavailable("git is not installed: the before/after comparison takes the baseline from git") from None


def resolve(commit: str) -> str:
    """The full hash of ``commit`` in this tree's repository; :class:`Unavailable` if there is none."""
    done = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if done.returncode != 0:
        raise Unavailable(f"commit {commit} is not in the git history of {ROOT} (a copy without history?): "
                          "pass --baseline COMMIT, or leave the section out of --only")
    return done.stdout.strip()


def describe_this_tree() -> str:
    """This tree as the table names it: its commit, and whether the code it runs (the package and
    the benchmarks, not the documents figures.py is rewriting) differs from it."""
    head = _git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown commit"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "bucketstore", "tools").stdout.strip()
    return head + (" with uncommitted changes" if dirty else "")


@contextmanager
def checkout(commit: str) -> Iterator[str]:
    """A directory holding ``commit``'s package and tools/bench, removed when the block ends."""
    with tempfile.TemporaryDirectory(prefix="before-after-") as tmp:
        archive, tree = os.path.join(tmp, "tree.tar"), os.path.join(tmp, "tree")
        done = _git("archive", "--format=tar", f"--output={archive}", commit, "bucketstore", "tools/bench")
        if done.returncode != 0:
            raise Unavailable(f"git archive {commit} failed: {done.stderr.strip().splitlines()[-1:]}")
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        os.remove(archive)
        yield tree


def run_child(argv: list[str]) -> dict:
    """Run one workload's process; return the JSON value it printed last."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tree given decides the package
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exited {done.returncode}"]
        raise ChildFailed(lines[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Comparison:
    """What one run measured: each workload's JSON lines per tree, one per round."""

    baseline: str
    after: str
    rounds: int
    load_start: tuple[float, float, float]
    sizes: Sizes = ISSUE
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    values: dict[tuple[str, str], list[dict]] = field(default_factory=dict)
    #: Workloads the baseline could not run, with the reason.
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def workloads(self) -> tuple[Workload, ...]:
        return workloads(self.sizes)


def compare(baseline: str = BASELINE, rounds: int = 3, progress: Callable[[str], None] = lambda _: None,
            sizes: Sizes = ISSUE) -> Comparison:
    """Run every workload on the baseline and on this tree, ``rounds`` times, alternating which goes first."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    full = resolve(baseline)
    result = Comparison(full, describe_this_tree(), rounds, os.getloadavg(), sizes)
    with checkout(full) as old:
        trees = {"before": old, "after": ROOT}
        for r in range(rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for w in result.workloads:
                for label in order:
                    if label == "before" and w.name in result.unavailable:
                        continue
                    progress(f"round {r + 1}/{rounds}: {w.name}, {label}")
                    try:
                        values = run_child(w.argv(trees[label], label))
                    except ChildFailed as e:
                        if label == "after":
                            raise RuntimeError(f"{w.name} failed on this tree: {e}") from None
                        result.unavailable[w.name] = str(e).replace(old, full[:7])
                        continue
                    result.values.setdefault((w.name, label), []).append(values)
    result.load_end = os.getloadavg()
    return result


def _number(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}"


def _spread(values: list[float], digits: int, suffix: str = "") -> str:
    """``median (min–max)`` of the rounds, or the one value."""
    med = _number(statistics.median(values), digits) + suffix
    if len(values) == 1:
        return med
    return f"{med} ({_number(min(values), digits)}–{_number(max(values), digits)}{suffix})"


def _ratio(x: float) -> str:
    """Two significant digits, kept when they are zeros (0.80, 2.0, 0.065, 12)."""
    return f"{x:.0f}" if x >= 9.95 else f"{x:#.2g}"


HEADER = ["", "before", "after", "after / before", "target (after)"]


def rows(c: Comparison) -> list[list[str]]:
    """The table: per figure, each tree's median (range) over the rounds, the median (range) of the
    rounds' own after/before ratios, and the issue's target with whether the after median meets it."""
    out = []
    for w in c.workloads:
        before, after = c.values.get((w.name, "before"), []), c.values.get((w.name, "after"), [])
        for m in w.metrics:
            a = [float(v[m.key]) for v in after]
            b = [float(v[m.key]) for v in before]
            target = ""
            if m.target is not None:
                target = f"{'≤' if m.target[0] == '<=' else '≥'} {m.target[1]:g}: " \
                         + ("met" if m.meets(statistics.median(a)) else "missed")
            if w.name in c.unavailable or not b:
                out.append([m.label, "not measurable on the old tree", _spread(a, m.digits), "-", target])
                continue
            ratios = [x / y for x, y in zip(a, b) if y > 0]  # the same round's pair
            ratio = "-" if not ratios else (
                _ratio(statistics.median(ratios)) + "×" if len(ratios) == 1 else
                f"{_ratio(statistics.median(ratios))}× ({_ratio(min(ratios))}–{_ratio(max(ratios))})")
            out.append([m.label, _spread(b, m.digits), _spread(a, m.digits), ratio, target])
    return out


def reasons(c: Comparison) -> list[str]:
    """Why each workload the baseline could not run failed there (its last line of stderr)."""
    return [f"{name}: {why}" for name, why in c.unavailable.items()]


def median_of(c: Comparison, workload: str, tree: str, key: str) -> float | None:
    values = [float(v[key]) for v in c.values.get((workload, tree), [])]
    return statistics.median(values) if values else None


def headline(c: Comparison) -> str:
    """One sentence for the README: the issue's figures, before → after (medians)."""
    def pair(workload: str, key: str, digits: int, unit: str) -> str:
        b, a = median_of(c, workload, "before", key), median_of(c, workload, "after", key)
        old = "not measurable" if b is None else _number(b, digits)
        return f"{old} → {_number(a or 0.0, digits)}{unit}"

    size = c.sizes.per_bucket
    return (f"Issue 26's workload ({count(c.sizes.total)} indexes in batches beside a thread adding one a "
            f"millisecond) before ({c.baseline[:7]}) and after ({c.after}), one run, medians of {c.rounds} "
            f"alternating rounds: the second thread's worst add {pair('stalls, sealed', 'other_max_ms', 0, ' ms')} "
            f"sealed and {pair('stalls, journal', 'other_max_ms', 0, ' ms')} journal, its p99 "
            f"{pair('stalls, sealed', 'other_p99_ms', 1, ' ms')}; the writer "
            f"{pair('stalls, sealed', 'caller_M_per_s', 1, ' M/s')} at the caller and "
            f"{pair('stalls, sealed', 'all_sealed_M_per_s', 1, ' M/s')} until all is installed; a {count(size)} "
            f"seal {pair('seal', 'M_per_s', 1, ' M/s')}, a {count(4 * size)} merge "
            f"{pair('merge', 'M_per_s', 1, ' M/s')}; load average {c.load_start[0]:.1f} at the start, "
            f"{c.load_end[0]:.1f} at the end.")
