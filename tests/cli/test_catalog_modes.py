"""``bucketstore catalog`` names each tracker's durability: what an operator needs when a
sealed open is refused with ``DurabilityMismatchError``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bucketstore
from bucketstore.cli import main


def test_catalog_names_each_trackers_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with bucketstore.open(tmp_path, durability="journal") as store:
        store.tracker("j", clock=lambda: 1_000).add_message(1, 0, 60_000)
    with bucketstore.open(tmp_path, durability="sealed") as store:
        store.tracker("s").close()
        with pytest.raises(bucketstore.DurabilityMismatchError):
            store.tracker("j")
    assert main(["catalog", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("tracker 'j': journal mode, ") for line in lines), lines
    assert any(line.startswith("tracker 's': sealed mode, ") for line in lines), lines
    assert main(["catalog", "--json", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {name: t["durability"] for name, t in doc["trackers"].items()} == {"j": "journal", "s": "sealed"}
