"""The repository's places, for a test in any folder of tests/: no test counts ``parent`` hops
from its own file, so moving a test between folders never changes what it reads."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
CORPUS = TESTS / "corpus"
DAMAGED = CORPUS / "damaged"
FORMATS = ROOT / "formats"
GOLDEN = FORMATS / "golden"
DOCS = ROOT / "docs"
