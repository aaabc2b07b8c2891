"""deploy/meterchat.service: a unit systemd accepts (``systemd-analyze verify``), hardened."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

UNIT = REPO / "deploy" / "meterchat.service"


def test_deploy_unit_is_verified_by_systemd(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    # verify checks that ExecStart's program exists: point it at this environment's meterchat
    meterchat = Path(sys.executable).parent / "meterchat"
    unit = tmp_path / "meterchat.service"
    unit.write_text(UNIT.read_text().replace("/opt/meterchat/venv/bin/meterchat", str(meterchat)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "meterchat.service" not in result.stderr  # no warning about this unit's lines


def test_deploy_unit_is_hardened():
    lines = set(UNIT.read_text().splitlines())
    assert {"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
            "DynamicUser=yes", "StateDirectory=meterchat", "CapabilityBoundingSet=",
            "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "SystemCallFilter=@system-service",
            "KillSignal=SIGTERM"} <= lines
