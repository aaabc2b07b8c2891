"""How ``meterchat`` serves, seen from outside: the real server process, started as a user starts it."""

from __future__ import annotations

from tests.support import run_server


def test_a_started_server_has_settled_its_heap(tmp_path):
    # serving.settle_heap: start-up's objects frozen, the young generation collected less often
    # (docs/performance.md, "Per-chunk work"); it says so before uvicorn says it listens.
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n')
    with run_server(config) as running:
        settled = [line for line in running.output if "heap settled" in line]
    assert len(settled) == 1 and "young generation collected every 10000 allocations" in settled[0]
    frozen = int(settled[0].split("heap settled: ")[1].split()[0])
    assert frozen > 10_000  # modules, settings and the app: tens of thousands of objects
