"""README's Python examples run, so they cannot rot.

Every fenced ```python block of README.md runs: a block that defines ``test_`` functions or a
``Test`` class is run by pytest as a test file of its own (as the embedder would); any other block
runs as a script. A block that cannot run here is skipped only by a visible marker on the line
before its fence: ``<!-- readme-examples: skip (the reason) -->``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SKIP = re.compile(r"<!--\s*readme-examples:\s*skip\b(.*?)-->")
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples() -> list[tuple[int, str, str | None]]:
    """(line number, code, skip reason or None) of every ```python block."""
    text = README.read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), skip.group(1).strip() if skip else None))
    return out


EXAMPLES = examples()


def test_the_readme_has_the_kit_examples() -> None:
    runnable = [code for _, code, skip in EXAMPLES if skip is None]
    assert any("crash_each_point" in code for code in runnable)
    assert any("JournalCrashMachine" in code for code in runnable)
    for _, code, _ in EXAMPLES:
        if "crash_each_point" in code or "JournalCrashMachine" in code:
            assert len(code.splitlines()) <= 40, "the kit's README examples stay within 40 lines"


@pytest.mark.parametrize("line,code,skip", EXAMPLES, ids=[f"README.md:{line}" for line, _, _ in EXAMPLES])
def test_readme_example_runs(line: int, code: str, skip: str | None, tmp_path: Path) -> None:
    if skip is not None:
        pytest.skip(f"marked in README.md: {skip}")
    is_test = re.search(r"^(def test_|class Test|Test\w+ = )", code, re.M) is not None
    script = tmp_path / (f"test_readme_{line}.py" if is_test else f"readme_{line}.py")
    script.write_text(code)
    command = ([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)] if is_test
               else [sys.executable, str(script)])
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README.md:{line} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
