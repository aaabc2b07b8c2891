"""The benchmarks stay runnable: each imports cleanly (they are run by hand and print figures)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

BENCH = sorted((Path(__file__).resolve().parent.parent / "bench").glob("*.py"))


@pytest.mark.parametrize("path", BENCH, ids=[p.stem for p in BENCH])
def test_bench_module_imports(path: Path) -> None:
    namespace = runpy.run_path(str(path), run_name="bench_import_check")
    assert callable(namespace["main"])
