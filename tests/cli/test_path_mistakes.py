"""Mistyped paths are usage errors (exit 2, one line) that say what is wrong.

An empty path (an unset shell variable: ``bucketstore stats "$STORE"``) says so, and is never
taken for the working directory: ``os.path.abspath("")`` is the working directory, and a
checkpoint's destination there would fill it. A picture asked into a directory that does not
exist is the command line's mistake, not damage (it exited 1).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import bucketstore
from bucketstore.cli import main


@pytest.mark.parametrize("argv", [["stats", ""], ["verify", ""], ["catalog", ""], ["dump", ""], ["upgrade", ""]])
def test_an_empty_path_is_named_as_empty(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1 and "path is empty" in out.err, out.err


def test_an_empty_checkpoint_destination_is_refused_not_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    with bucketstore.open(src, durability="sealed") as store:
        store.tracker("t").close()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # empty: the old check found nothing wrong with it
    assert main(["checkpoint", str(src), ""]) == 2
    assert "destination is empty" in capsys.readouterr().err
    with bucketstore.open(src, read_only=True) as looking:
        with pytest.raises(ValueError, match="destination is empty"):
            looking.checkpoint("")
    assert os.listdir(cwd) == []


def test_a_plot_into_a_missing_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        store.tracker("t").close()
    assert main(["stats", str(tmp_path / "s"), "--plot", str(tmp_path / "no" / "such" / "due.png")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is not a directory" in err, err
