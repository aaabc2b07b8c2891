"""The benchmarks stay runnable: each runs for about a second in its ``--quick`` mode and prints its
figures (they are run by hand for the real numbers; nothing here judges the figures)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCH = sorted((Path(__file__).resolve().parent.parent / "bench").glob("*.py"))


@pytest.mark.parametrize("path", BENCH, ids=[p.stem for p in BENCH])
def test_bench_runs_in_quick_mode(path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    # A bench without a quick mode would run for minutes here: say so at once instead.
    assert "--quick" in path.read_text(), f"{path.name}: give the bench a --quick mode (about a second)"
    monkeypatch.setattr(sys, "argv", [str(path), "--quick"])
    runpy.run_path(str(path), run_name="__main__")
    printed = capsys.readouterr().out
    assert len(printed.splitlines()) >= 3 and any(ch.isdigit() for ch in printed)


def test_bench_load_measures_instances_behind_nginx(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--instances 2``: two meterchat processes behind deploy/nginx.conf on a private Redis."""
    load = next(path for path in BENCH if path.stem == "load")
    monkeypatch.setattr(sys, "argv", [str(load), "--quick", "--paths", "", "--instances", "2"])
    runpy.run_path(str(load), run_name="__main__")
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    row = next(r for r in rows if r and r[0] == "nginx/2")
    assert row[1].endswith("/20") and float(row[-1]) > 0  # a row of 20 sessions; Redis was used
