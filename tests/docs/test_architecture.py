"""The package's layout is its architecture: these tests read every module's imports (with ``ast``,
nothing is imported) and hold the dependency rules the subpackages' ``__init__`` docstrings state.

* no import cycle between modules, and no function-level import of the package's own modules
  (the usual way to hide one); ``if TYPE_CHECKING:`` imports count as edges too;
* the layers point one way: ``format`` <- ``memory`` <- ``engine`` <- api, ``checking`` <- ``cli``,
  with the root leaves (config, errors, cutoff, waiting, tracker_protocol) under all of them, the api modules (``aio``,
  ``metrics``: root modules an embedder imports, built on the engine) above it, ``checking`` (offline
  checks as a library: a peer of the api, so that the cli and the testing kit share it without the
  kit importing the cli), and ``spark`` and ``testing`` on top (``testing`` never imports ``cli``);
  nothing in the product imports ``bucketstore.testing``;
* third-party imports: the core needs only the core dependencies; PySpark and pyarrow only in
  ``bucketstore.spark``; hypothesis only in ``bucketstore.testing.state_machine``; tqdm only in
  ``bucketstore.cli`` (the library never prints); matplotlib only in ``bucketstore.cli.plot``;
* at most 10 modules directly in ``bucketstore/``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import bucketstore

PACKAGE = Path(bucketstore.__file__).parent
ROOT_LEAVES = {"bucketstore.config", "bucketstore.errors", "bucketstore.cutoff", "bucketstore.waiting",
               "bucketstore.tracker_protocol"}
FACADE = {"bucketstore", "bucketstore.__main__"}
#: Root modules built on the engine for embedders (asyncio, metrics): above the engine, below the cli.
API = {"bucketstore.aio", "bucketstore.metrics"}
CORE_DEPENDENCIES = {"pyroaring", "msgpack", "lmdb", "crc32c", "sortedcontainers", "numpy", "zstandard"}

# layer -> the layers its modules may import (besides their own).
ALLOWED = {
    "leaf": {"leaf"},
    "format": {"leaf"},
    "memory": {"leaf", "format"},
    "engine": {"leaf", "format", "memory"},
    "api": {"leaf", "format", "memory", "engine"},
    # Offline checking reads what the engine writes; the cli prints its reports, the testing kit
    # asserts on them. It must not reach the cli (the kit would depend on the command line again).
    "checking": {"leaf", "format", "memory", "engine"},
    "facade": {"leaf", "format", "memory", "engine", "api", "checking", "cli", "facade"},
    "cli": {"leaf", "format", "memory", "engine", "api", "checking", "facade"},
    "spark": {"leaf", "format", "memory", "engine", "api", "checking", "cli", "facade"},
    # The kit checks files through ``checking``, never through the command line.
    "testing": {"leaf", "format", "memory", "engine", "api", "checking", "facade"},
}


@dataclass(frozen=True)
class Import:
    target: str  # an absolute module name
    line: int
    nested: bool  # inside a function or class body


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    if module in FACADE:
        return "facade"
    if module in ROOT_LEAVES:
        return "leaf"
    if module in API:
        return "api"
    return module.split(".")[1]


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import in ``path``, made absolute; ``from pkg import sub`` names ``pkg.sub`` when it is a module."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import(alias.name, child.lineno, nested) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    out.append(Import(sub if sub in known else target, child.lineno, nested))
            visit(child, inner)

    visit(tree, False)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def own(imports: list[Import]) -> list[Import]:
    return [i for i in imports if i.target == "bucketstore" or i.target.startswith("bucketstore.")]


def test_no_import_cycle(graph: dict[str, list[Import]]) -> None:
    edges = {m: sorted({i.target for i in own(imps) if i.target in graph and i.target != m})
             for m, imps in graph.items()}
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def walk(m: str) -> None:
        stack.append(m)
        on_stack.add(m)
        for n in edges[m]:
            if n in on_stack:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in done:
                walk(n)
        stack.pop()
        on_stack.discard(m)
        done.add(m)

    for m in sorted(edges):
        if m not in done:
            walk(m)


def test_no_function_level_import_of_the_package(graph: dict[str, list[Import]]) -> None:
    hidden = [f"{m}:{i.line} imports {i.target}" for m, imps in graph.items() for i in own(imps) if i.nested]
    assert not hidden, "function-level imports of the package (hoist them; a cycle must be broken):\n" + \
        "\n".join(hidden)


def test_layers_point_one_way(graph: dict[str, list[Import]]) -> None:
    wrong = []
    for m, imps in graph.items():
        mine = layer(m)
        for i in own(imps):
            theirs = layer(i.target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{m}:{i.line} ({mine}) imports {i.target} ({theirs})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_nothing_in_the_product_imports_testing(graph: dict[str, list[Import]]) -> None:
    users = [f"{m}:{i.line}" for m, imps in graph.items() if layer(m) != "testing"
             for i in own(imps) if i.target.startswith("bucketstore.testing")]
    assert not users


def test_third_party_imports(graph: dict[str, list[Import]]) -> None:
    """The core runs on the core dependencies; PySpark only in spark; hypothesis only in the state machine."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    wrong = []
    for m, imps in graph.items():
        allowed = set(CORE_DEPENDENCIES)
        if layer(m) == "spark":
            allowed |= {"pyspark", "pyarrow", "py4j"}
        if layer(m) == "cli":
            allowed |= {"tqdm"}  # progress bars: the command line only, never the library
        if m == "bucketstore.cli.plot":
            allowed |= {"matplotlib"}  # the `plot` extra, imported only when a plot is asked for
        if m == "bucketstore.testing.state_machine":
            allowed |= {"hypothesis"}
        for i in imps:
            top = i.target.split(".")[0]
            if top not in stdlib and top != "bucketstore" and top not in allowed:
                wrong.append(f"{m}:{i.line} imports {i.target}")
    assert not wrong, "\n".join(wrong)


def test_the_kit_imports_without_hypothesis_or_spark() -> None:
    """``import bucketstore.testing`` needs only the core dependencies."""
    code = ("import sys\n"
            "for name in ('hypothesis', 'pyspark', 'pyarrow', 'pytest'):\n"
            "    sys.modules[name] = None  # any import of them now fails\n"
            "import bucketstore.testing, bucketstore.testing.faults, bucketstore.testing.oracle\n"
            "import bucketstore.testing.crash_points, bucketstore.cli\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr


def test_at_most_ten_modules_at_the_root() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 10, flat


#: ``bucketstore/engine/`` by stage of the data flow, lowest first (its ``__init__`` lists them).
ENGINE_STAGES = ("threads", "directory", "catalog", "queue", "durability", "buckets", "mutable",
                 "maintenance", "tracker", "topics", "store")


def engine_stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "engine" else None


def test_engine_stages_point_down_the_data_flow(graph: dict[str, list[Import]]) -> None:
    """A stage of the engine imports only the stages below it: the store builds on trackers and
    topics, a tracker on jobs, buckets and the queue, never the other way."""
    flat = sorted(p.name for p in (PACKAGE / "engine").glob("*.py") if p.name != "__init__.py")
    assert not flat, f"engine modules outside a stage: {flat}"
    stages = sorted(p.name for p in (PACKAGE / "engine").iterdir() if (p / "__init__.py").exists())
    assert stages == sorted(ENGINE_STAGES)
    wrong = []
    for m, imps in graph.items():
        mine = engine_stage(m)
        if mine is None:
            continue
        for i in own(imps):
            theirs = engine_stage(i.target)
            if theirs is not None and ENGINE_STAGES.index(theirs) > ENGINE_STAGES.index(mine):
                wrong.append(f"{m}:{i.line} ({mine}) imports {i.target} ({theirs})")
    assert not wrong, "engine imports that run up the stages:\n" + "\n".join(wrong)


def test_each_subpackage_says_what_it_owns_and_may_import() -> None:
    for init in sorted(PACKAGE.glob("*/__init__.py")) + sorted(PACKAGE.glob("engine/*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc or "may import" in doc, f"{init} does not say what it may import"


JOB_MODULES = ("bucket_job", "seal_pipeline", "merge_pipeline")


def test_jobs_see_the_tracker_only_through_its_job_interface() -> None:
    """A seal or merge reads no private attribute of its tracker and types it as ``JobHost``:
    what the jobs may touch is the Protocol's list, which the tracker implements."""
    found = []
    for name in JOB_MODULES:
        path = PACKAGE / "engine" / "maintenance" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                owner = node.value
                if (isinstance(owner, ast.Name) and owner.id == "tracker") or \
                        (isinstance(owner, ast.Attribute) and owner.attr == "tracker"):
                    found.append(f"{path.name}:{node.lineno}: tracker.{node.attr}")
            if isinstance(node, ast.arg) and node.arg == "tracker":
                typed = ast.unparse(node.annotation) if node.annotation is not None else None
                if typed != "JobHost":
                    found.append(f"{path.name}:{node.lineno}: tracker typed {typed}, not JobHost")
    assert not found, found


MAX_MODULE_LINES = 700


def test_no_module_is_too_long_to_read() -> None:
    """A module a reader can hold in mind: split by job one that grows past this."""
    long = {str(p.relative_to(PACKAGE.parent)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long
