"""The examples of README.md and docs/*.md run, so they cannot rot.

Every fenced block is one of:

* ```python: runs. A block that defines ``test_`` functions or a ``Test`` class is run by pytest
  as a test file of its own (as the embedder would); any other block runs as a script.
* ```console: each ``$ bucketstore ...`` line runs (as ``python -m bucketstore``, through the
  shell) in a directory holding ``demo-store``, a store ``bucketstore simulate`` left at a small
  size; every output line the block shows must appear in the real output, numbers aside (they
  depend on the size and vary from run to run: ``tools/bench/figures.py`` writes the real ones).
* ```text: output or a diagram, not code.
* anything else (```sh, an untagged fence): only with a visible marker on the line before the
  fence, ``<!-- examples: skip (the reason) -->``; a block without one fails here.

A python or console block can carry the marker too, when it cannot run here (e.g. it needs Spark).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from repo_paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*(?:readme-)?examples:\s*skip\b(.*?)-->")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$", re.S | re.M)
NUMBER = re.compile(r"\d[\d,.]*")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = SKIP.search(before)
            out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group("lang"), m.group("code"),
                             skip.group(1).strip() if skip else None))
    return out


BLOCKS = blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]
CONSOLE = [b for b in BLOCKS if b.lang == "console"]


def test_every_block_runs_or_says_why_not() -> None:
    unmarked = [b.id + (f" ({b.lang})" if b.lang else " (untagged)") for b in BLOCKS
                if b.lang not in ("python", "console", "text") and b.skip is None]
    assert not unmarked, f"code blocks that neither run nor carry a skip marker with a reason: {unmarked}"
    assert all(b.skip for b in BLOCKS if b.skip is not None), "a skip marker gives its reason"


def test_the_kit_examples_are_there() -> None:
    runnable = [b.code for b in PYTHON if b.skip is None]
    assert any("crash_each_point" in code for code in runnable)
    assert any("JournalCrashMachine" in code for code in runnable)
    for b in PYTHON:
        if "crash_each_point" in b.code or "JournalCrashMachine" in b.code:
            assert len(b.code.splitlines()) <= 40, "the kit's examples stay within 40 lines"


def test_ci_runs_the_readme_commands() -> None:
    """CI runs the test command the README gives, exactly; the README's main job is simulate's default."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    setup = next(b for b in BLOCKS if b.page.name == "README.md" and b.lang == "sh")
    commands = [line for line in setup.code.splitlines() if line and not line.startswith("#")]
    assert commands[-1] in ci, f"README's test command {commands[-1]!r} is not what .ci/run runs"
    assert commands[0] == "pip install -e . && bucketstore simulate"  # STORE defaults to ./demo-store


def test_the_command_table_lists_every_command() -> None:
    from bucketstore.cli.commands import build_parser

    parser = build_parser()
    names = {name for action in parser._subparsers._group_actions for name in action.choices}  # type: ignore[union-attr]
    readme, cli_doc = (ROOT / "README.md").read_text(), (ROOT / "docs" / "cli.md").read_text()
    for name in names:
        assert f"`bucketstore {name} " in readme, f"README's command table lacks {name}"
        assert f"bucketstore {name} " in cli_doc, f"docs/cli.md lacks {name}"


REGION = re.compile(r"<!-- figures: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /figures -->", re.S)
STAMP = re.compile(r"^\*Measured .+, size `\w+`, on .+\. Command: `python tools/bench/figures\.py .+`\.\*$", re.M)


def test_generated_figures_come_from_the_script() -> None:
    """Every figures region of README and docs/ is one tools/bench/figures.py writes, and is filled;
    every table of docs/benchmarks.md says when, where, at which size and with which command."""
    script = (ROOT / "tools" / "bench" / "figures.py").read_text()
    written = set(re.findall(r'regions\["([\w-]+)"\]', script))
    assert "readme-figures" in written and "readme-image" in written
    found = {m.group("name"): (page, m.group("body")) for page in PAGES for m in REGION.finditer(page.read_text())}
    assert set(found) == written, f"regions without a writer or writers without a region: {set(found) ^ written}"
    assert all(body.strip() for _, body in found.values()), "run tools/bench/figures.py to fill every region"
    sections = re.split(r"^<!-- section: [\w-]+ -->$", (ROOT / "docs" / "benchmarks.md").read_text(), flags=re.M)[1:]
    assert sections, "docs/benchmarks.md is written by tools/bench/figures.py"
    for section in sections:
        assert STAMP.search(section), f"a table of docs/benchmarks.md without its stamp:\n{section[:300]}"


def test_a_table_of_figures_in_a_doc_says_where_it_came_from() -> None:
    """A generated table in README or docs/ (beside docs/benchmarks.md's own) carries the stamp of the run
    that measured it: when, the machine, the size and the command, as the benchmarks page does."""
    unstamped = [f"{page.relative_to(ROOT)}: {m.group('name')}" for page in PAGES
                 for m in REGION.finditer(page.read_text())
                 if re.search(r"^\|---", m.group("body"), re.M) and not STAMP.search(m.group("body"))]
    assert not unstamped, f"generated tables without the stamp of their run: {unstamped}"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_lead_somewhere() -> None:
    broken = []
    for page in PAGES:
        for m in LINK.finditer(page.read_text()):
            target = m.group("target")
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, f"links to nothing: {broken}"


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"marked in {block.id}: {block.skip}")
    is_test = re.search(r"^(def test_|class Test|Test\w+ = )", block.code, re.M) is not None
    script = tmp_path / (f"test_example_{block.line}.py" if is_test else f"example_{block.line}.py")
    script.write_text(block.code)
    command = ([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)] if is_test
               else [sys.executable, str(script)])
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=_env())
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bucketstore simulate ./demo-store`` at a small size: the console examples' store."""
    where = tmp_path_factory.mktemp("demo")
    done = subprocess.run([sys.executable, "-m", "bucketstore", "simulate", "./demo-store", "--messages", "20000",
                           "--no-progress"], cwd=where, capture_output=True, text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return where / "demo-store"


@pytest.mark.parametrize("block", CONSOLE, ids=[b.id for b in CONSOLE])
def test_console_example_runs(block: Block, demo_store: Path, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"marked in {block.id}: {block.skip}")
    shutil.copytree(demo_store, tmp_path / "demo-store")
    steps = re.split(r"^\$ ", block.code, flags=re.M)
    assert not steps[0].strip() and len(steps) > 1, f"{block.id}: a console block starts with `$ command`"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "bucketstore"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m bucketstore \"$@\"\n")
    launcher.chmod(0o755)
    env = {**_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for step in steps[1:]:
        command, _, shown = step.partition("\n")
        assert command.startswith("bucketstore "), f"{block.id}: only bucketstore commands run here: {command}"
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=env)
        assert done.returncode == 0, f"{block.id}: `{command}` exited {done.returncode}:\n{done.stderr}"
        got = {NUMBER.sub("#", line.rstrip()) for line in done.stdout.splitlines()}
        missing = [line for line in shown.splitlines() if line.strip() and NUMBER.sub("#", line.rstrip()) not in got]
        assert not missing, f"{block.id}: `{command}` printed no line like {missing}:\n{done.stdout}"


def _env() -> dict[str, str]:
    """This checkout first on the path, whatever is installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
