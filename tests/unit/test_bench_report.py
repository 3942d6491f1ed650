"""Benchmark arithmetic and output: busbw factors, sizes, the calibration fit, table/JSON/plot."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from scaledl.bench.collectives import select_algorithms
from scaledl.bench.report import format_bytes, write_plot
from scaledl.calibration.bench_file import (
    BenchReport,
    Measurement,
    P2PResult,
    busbw_factor,
    native_ratios,
    report_from_dict,
    write_json,
)
from scaledl.calibration.fit import calibrate, fit_two, schedule_features
from scaledl.cli.bench_collectives import message_sizes, parse_bytes, render_table
from scaledl.collectives.cost import CostModel, LinkCost, schedule_time
from scaledl.collectives.registry import plan
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology


@pytest.mark.parametrize(("collective", "p", "factor"), [
    ("allreduce", 2, 1.0), ("allreduce", 4, 1.5), ("allreduce", 8, 1.75),
    ("reduce_scatter", 4, 0.75), ("allgather", 2, 0.5), ("broadcast", 8, 1.0), ("reduce", 3, 1.0),
])
def test_busbw_factor_matches_nccl_tests(collective: str, p: int, factor: float) -> None:
    assert busbw_factor(collective, p) == pytest.approx(factor)


def test_measurement_bandwidths() -> None:
    m = Measurement("allreduce", "ring", 1 << 20, 4, (1e-3, 2e-3, 3e-3))
    assert m.avg_us == pytest.approx(2000.0)
    assert (m.min_us, m.max_us, m.median_us) == pytest.approx((1000.0, 3000.0, 2000.0))
    assert m.algbw_gbps == pytest.approx((1 << 20) / 2e-3 / 1e9)
    assert m.busbw_gbps == pytest.approx(m.algbw_gbps * 1.5)


@pytest.mark.parametrize(("text", "nbytes"), [
    ("4K", 4096), ("256M", 256 << 20), ("1G", 1 << 30), ("4096", 4096), ("64KiB", 65536),
    ("2mb", 2 << 20), (" 8k ", 8192),
])
def test_parse_bytes(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["", "4Q", "-4K", "1.5M", "K"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a byte count"):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (4096, 64 << 20, 1 << 30, 4092)] == [
        "4 KiB", "64 MiB", "1 GiB", "4092 B"]


def test_message_sizes() -> None:
    assert message_sizes(4096, 65536, 4) == [4096, 16384, 65536]
    assert message_sizes(1 << 20, 64 << 20, 4) == [1 << 20, 4 << 20, 16 << 20, 64 << 20]
    assert message_sizes(4096, 32768, 4) == [4096, 16384, 32768]
    assert message_sizes(4096, 4096) == [4096]
    with pytest.raises(ValueError, match="smaller than"):
        message_sizes(8192, 4096)
    with pytest.raises(ValueError, match="step-factor"):
        message_sizes(4096, 8192, 1)


def test_select_algorithms() -> None:
    chosen = select_algorithms(["allreduce", "broadcast"], None)
    assert chosen[Collective.ALLREDUCE] == (
        "ring", "multiring", "halving_doubling", "shm", "auto", "native", "torch")
    assert chosen[Collective.BROADCAST] == ("tree", "chain", "shm", "auto", "native", "torch")
    every = select_algorithms(["reduce_scatter"], "all")[Collective.REDUCE_SCATTER]
    assert "auto" not in every and "native" in every and "multiring" not in every
    assert "torch" in every and "shm" in every
    assert select_algorithms(["allreduce"], "hierarchical[shm,ring],torch")[
        Collective.ALLREDUCE] == ("hierarchical[shm,ring]", "torch")
    with pytest.raises(ValueError, match="unknown algorithm 'bogus'; choose from: ring"):
        select_algorithms(["allreduce"], "ring,bogus")
    with pytest.raises(ValueError, match="implements none"):
        select_algorithms(["broadcast"], "multiring")
    with pytest.raises(ValueError, match="unknown collective"):
        select_algorithms(["alltoall"], None)


def test_fit_two_recovers_exact_coefficients() -> None:
    x1 = [2.0, 2.0, 6.0, 14.0]
    x2 = [1e3, 1e6, 3e6, 7e5]
    y = [50e-6 * a + 0.8e-9 * b for a, b in zip(x1, x2, strict=True)]
    fit = fit_two(x1, x2, y)
    assert fit.first == pytest.approx(50e-6, rel=1e-9)
    assert fit.second == pytest.approx(0.8e-9, rel=1e-9)
    assert fit.rms_relative_error < 1e-9


def test_fit_two_keeps_coefficients_non_negative() -> None:
    fit = fit_two([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    assert fit.first >= 0 and fit.second >= 0


def _synthetic(model: CostModel, topology: Topology, itemsize: int) -> list[Measurement]:
    """Times that auto's own cost model predicts (slowest rank) for three algorithms."""
    out = []
    for name in ("ring", "halving_doubling", "tree"):
        for nbytes in (4096, 65536, 1 << 20, 16 << 20):
            worst = max(
                schedule_time(plan(name, Collective.ALLREDUCE, topology, rank, nbytes // itemsize),
                              topology, itemsize, model)
                for rank in range(topology.world_size)
            )
            out.append(Measurement("allreduce", name, nbytes, topology.world_size, (worst,)))
    for nbytes in (4096, 65536, 1 << 20, 16 << 20):
        native = min(
            max(schedule_time(plan(proxy, Collective.ALLREDUCE, topology, rank, nbytes // itemsize),
                              topology, itemsize, model, model.native_overhead,
                              model.native_beta_factor)
                for rank in range(topology.world_size))
            for proxy in ("ring", "halving_doubling")
        )
        out.append(Measurement("allreduce", "native", nbytes, topology.world_size, (native,)))
    return out


def test_schedule_features_of_a_ring() -> None:
    schedule = plan("ring", Collective.ALLREDUCE, Topology.flat(4), 0, 4000)
    rounds, critical, known = schedule_features(schedule, 4, CostModel())
    assert rounds == 6 and critical == 6 * 1000 * 4
    assert known == pytest.approx(3 * 4000 * CostModel().gamma)


def test_calibrate_recovers_known_alpha_beta() -> None:
    truth = CostModel(links=(LinkCost(30e-6, 1 / 2.5e9),), overhead=20e-6,
                      native_overhead=5e-6, native_beta_factor=1.7)
    topology = Topology.flat(4)
    measured = _synthetic(truth, topology, 4)
    model, summary = calibrate(measured, topology, 4, CostModel(overhead=20e-6), 1 << 20)
    assert model.link(0).alpha == pytest.approx(30e-6, rel=1e-3)
    assert model.link(0).beta == pytest.approx(1 / 2.5e9, rel=1e-3)
    assert model.overhead == pytest.approx(20e-6)
    assert model.native_overhead == pytest.approx(5e-6, rel=1e-2)
    assert model.native_beta_factor == pytest.approx(1.7, rel=1e-3)
    assert summary["link"]["rms_relative_error"] < 1e-3  # type: ignore[index]


def test_calibrate_fits_an_nccl_style_native_reduce_scatter_as_its_own() -> None:
    """Where the backend has a reduce_scatter of its own (the prior says so), its native rows are
    fitted as that, not as Gloo's whole allreduce."""
    truth = CostModel(links=(LinkCost(30e-6, 1 / 2.5e9),), overhead=20e-6,
                      native_overhead=5e-6, native_beta_factor=1.7,
                      native_reduce_scatter_allreduce=False)
    topology = Topology.flat(4)
    measured = [m for m in _synthetic(truth, topology, 4) if m.algorithm != "native"]
    for nbytes in (4096, 65536, 1 << 20, 16 << 20):
        shard = nbytes // 4 // topology.world_size
        native = min(
            max(schedule_time(plan(proxy, Collective.REDUCE_SCATTER, topology, rank, shard),
                              topology, 4, truth, truth.native_overhead,
                              truth.native_beta_factor)
                for rank in range(topology.world_size))
            for proxy in ("ring", "halving_doubling")
        )
        measured.append(Measurement("reduce_scatter", "native", nbytes, 4, (native,)))
    prior = CostModel(overhead=20e-6).for_backend("nccl")
    model, _ = calibrate(measured, topology, 4, prior, 1 << 20)
    assert model.native_overhead == pytest.approx(5e-6, rel=1e-2)
    assert model.native_beta_factor == pytest.approx(1.7, rel=1e-3)


def test_calibrate_needs_two_sizes() -> None:
    one = [Measurement("allreduce", "ring", 4096, 2, (1e-4,))]
    with pytest.raises(ValueError, match="two or more message sizes"):
        calibrate(one, Topology.flat(2), 4, CostModel(), 1 << 20)


def _report() -> BenchReport:
    env = {"cpu": "Test CPU", "cores": 2, "host": "h", "os": "Linux", "python": "3.11",
           "torch": "2.x", "scaledl": "0.1.0", "backend": "gloo", "world_size": 2,
           "topology": "2", "omp_num_threads": "1", "torch_threads": 1}
    config = {"dtype": "float32", "chunk_bytes": 1 << 20}
    measurements = [
        Measurement(c, a, n, 2, (t * n / 4096, t * n / 4096 * 1.1))
        for c in ("allreduce", "allgather")
        for n in (4096, 65536)
        for a, t in (("ring", 1e-5), ("native", 2e-5))
    ]
    return BenchReport(env, config, measurements, P2PResult(1 << 26, (0.05, 0.04, 0.06)))


def test_native_ratios_at_largest_size() -> None:
    ratios = native_ratios(_report().measurements)
    assert [(r["collective"], r["algorithm"], r["nbytes"]) for r in ratios] == [
        ("allreduce", "ring", 65536), ("allgather", "ring", 65536)]
    assert ratios[0]["busbw_ratio"] == pytest.approx(2.0)


def test_table_names_hardware_and_ratios() -> None:
    buffer = io.StringIO()
    render_table(_report(), Console(file=buffer, width=160))
    text = buffer.getvalue()
    assert "Test CPU (2 cores)" in text and "torch 2.x" in text and "backend gloo" in text
    assert "ring / native busbw = 2.00x" in text
    assert "64 KiB" in text and "busbw/p2p" in text


def test_json_round_trip_and_plot(tmp_path: Path) -> None:
    report = _report()
    write_json(report, tmp_path / "out" / "bench.json")
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["environment"]["cpu"] == "Test CPU"
    assert data["p2p"]["gbps"] == pytest.approx((1 << 26) / 0.05 / 1e9)
    first = data["results"][0]
    assert first["times_us"] == pytest.approx([10.0, 11.0])
    assert first["busbw_over_p2p"] == pytest.approx(first["busbw_gbps"] / data["p2p"]["gbps"])
    again = report_from_dict(data)
    assert again.measurements[3].busbw_gbps == pytest.approx(report.measurements[3].busbw_gbps)
    write_plot(again, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
