"""Per-level paths across emulated hosts: shared memory inside each network namespace "host"
(SCALEDL_HOSTNAME), point-to-point rounds across its shaped link, results equal to torch's.

Needs root and iproute2 (scaledl cluster); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaledl.launchers import RANK_VARIABLES
from scaledl.cluster.state import STATE_ENV

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(os.geteuid() != 0, reason="scaledl cluster needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="scaledl cluster needs iproute2 (ip and tc)"),
]

TIMEOUT_S = 240
PROBE = Path(__file__).with_name("paths_probe.py")


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("hosts,per_host", [(2, 2), (2, 3)])
def test_shared_memory_inside_each_host_and_every_path_exact(
    tmp_path: Path, hosts: int, per_host: int
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env.pop("SCALEDL_TOPOLOGY", None)
    env[STATE_ENV] = str(tmp_path / "clusters")
    env["SCALEDL_CALIBRATION"] = str(tmp_path / "calibration.json")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROBE.parents[2] / "src"),
                                                      env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "scaledl.cli.main", "cluster", "run", "--hosts", str(hosts),
         "--rate", "1gbit", "--ranks-per-host", str(per_host), "--timeout", "200", "--",
         sys.executable, str(PROBE)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = _reports(result.stdout)
    assert len(reports) == hosts * per_host
    for report in reports:
        assert report["failures"] == [], report
        assert report["topology"] == f"{per_host}x{hosts}"
        host = report["rank"] // per_host  # block placement
        assert report["joined"] == list(range(host * per_host, (host + 1) * per_host))


def _reports(stdout: str) -> list[dict[str, object]]:
    """Every rank's JSON report; the ranks share one output stream, so two reports may land on
    one line (no newline between them) and a line may carry a rank prefix."""
    decoder, reports, at = json.JSONDecoder(), [], stdout.find("{")
    while at >= 0:
        try:
            report, end = decoder.raw_decode(stdout, at)
        except json.JSONDecodeError:  # a brace in other output
            report, end = None, at + 1
        if isinstance(report, dict) and "joined" in report:
            reports.append(report)
        at = stdout.find("{", end)
    return reports


def test_reports_on_one_line_are_all_read() -> None:
    text = ('[rank 1] {"rank": 4, "joined": [3]}{"rank": 1, "joined": [0]}\n'
            'a log line {not json}\n{"rank": 0, "joined": [0]}\n')
    assert [r["rank"] for r in _reports(text)] == [4, 1, 0]
