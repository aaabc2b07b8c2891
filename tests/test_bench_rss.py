"""The load bench's RSS lines (bench/loadkit/rss.py): a series every 2 s and the stated bound,
checked in print; and a real quick run of bench/load.py prints them for meterchat."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from bench.loadkit import rss
from server.config.settings import ServerSettings
from server.sessions.channel import FRAME_LOG_BYTES

MIB = 1 << 20
LOAD = Path(__file__).resolve().parent.parent / "bench" / "load.py"


def test_bench_rss_series_keeps_one_sample_per_step_and_the_last():
    samples = [n * MIB for n in range(10)]  # 0.25 s apart: 2.25 s
    assert rss.series(samples, every=1.0, sampled=0.25) == [0, 4, 8, 9]
    assert rss.series(samples[:9], every=1.0, sampled=0.25) == [0, 4, 8]
    assert rss.series([]) == []


def test_bench_rss_bound_is_base_plus_logs_and_outboxes_from_the_settings():
    b = rss.bound(50 * MIB, sessions=4, connections=3)
    expected = 50 * MIB + 4 * FRAME_LOG_BYTES + 3 * ServerSettings().max_outbox_bytes
    assert b["mib"] == round(expected / MIB)


@pytest.mark.parametrize(("peak", "verdict"), [(60, "within"), (10_000, "OVER")])
def test_bench_rss_describe_prints_the_series_and_the_check(peak, verdict):
    r = {"rss_mib": [50, peak, 55], "rss_series": [50, 58, 55], "rss_bound": rss.bound(50 * MIB, 2, 1)}
    lines = rss.describe("meterchat", r)
    assert lines[1] == "  meterchat RSS every 2 s, MiB: 50 58 55"
    assert f"peak {peak} MiB is {verdict} it" in lines[2]


def test_bench_load_quick_run_prints_rss_over_time_its_bound_and_the_abusers_close_reasons(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [str(LOAD), "--quick", "--paths", "meterchat", "--abuse"])
    runpy.run_path(str(LOAD), run_name="__main__")
    printed = capsys.readouterr().out
    assert "meterchat RSS every 2 s, MiB: " in printed
    assert "is within it" in printed, printed
    assert "abuse flood: {" in printed and "'closed': 'open at the end'" in printed, printed
    assert "'closed': '1009 frame with" in printed, printed
