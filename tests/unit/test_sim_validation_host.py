"""The other machine's emulated-cluster files (benchmarks/sim_validation/raw-h100): its host
description round-trips, replaces exactly the constants it names, and replays to the numbers
docs/simulation.md ("With a core per rank") quotes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scaledl.sim.job import Job

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_validation"
sys.path.insert(0, str(HERE))
from analyze import TOLERANCE, collectives  # noqa: E402  (a folder of scripts, not a package)
from host import Host, load_host, save_host, with_constants  # noqa: E402


def test_host_file_round_trips(tmp_path: Path) -> None:
    host = Host(16, frozenset({"allreduce-2x2-10gbit-run1.json"}), {"cpu_beta": 1e-10}, "m")
    save_host(tmp_path, host)
    assert load_host(tmp_path) == host
    assert load_host(tmp_path / "missing") == Host()  # no host.json: the VM's presets


def test_unknown_constant_is_refused(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(
        '{"cores": 2, "calibration": [], "constants": {"cpu_bta": 1e-10}}')
    with pytest.raises(SystemExit, match="cpu_bta"):
        load_host(tmp_path)


def test_constants_replace_only_what_they_name() -> None:
    net = Job(device="cpu", network="10gbit", intra="loopback").network_value()
    changed = with_constants(net, {"inter_alpha": 1e-6, "cpu_beta": 2e-11})
    assert changed.inter.alpha == 1e-6 and changed.cpu_beta == 2e-11
    assert changed.intra == net.intra and changed.overhead == net.overhead
    assert changed.cpu_beta_link == net.cpu_beta_link and changed.inter.beta == net.inter.beta
    assert Host(constants={"call": 0.0}).call == 0.0


def test_the_core_per_rank_files_replay_to_the_documented_score() -> None:
    raw = HERE / "raw-h100"
    host = load_host(raw)
    assert host.cores == 16 and len(host.calibration) == 3
    rows = collectives(raw, host)
    score = {}
    for rate in ("100mbit", "1gbit", "10gbit"):
        held = [r for r in rows if r["rate"] == rate and r["held_out"]]
        score[rate] = (sum(abs(r["error"]) <= TOLERANCE for r in held), len(held))
    assert score == {"100mbit": (21, 24), "1gbit": (54, 54), "10gbit": (105, 126)}
