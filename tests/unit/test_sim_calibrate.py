"""``scaledl simulate calibrate``: what it writes into ``auto``'s calibration file."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.collectives.auto import CostModel, choose
from scaledl.collectives.schedule import Collective
from scaledl.sim.calibrate import fit_network, load_points
from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.presets import device
from scaledl.topology import Topology

TRUE = Network("truth", LinkClass("loopback", 30e-6, 1 / 2.5e9),
               LinkClass("veth", 150e-6, 1 / 0.118e9), rack_latency=0.0)
SIZES = (4096, 65536, 1 << 20, 4 << 20)
NATIVE_SLOWER = 1.2
"""The synthetic backend takes this much longer than scaledl's ring."""


def _bench_file(path: Path, spec: str) -> Path:
    """A bench JSON whose medians are what the true network predicts (native: a slower ring)."""
    topo = Topology.parse(spec)
    sim = CollectiveSimulator(topo, TRUE)
    results = []
    for algorithm in ("ring", "halving_doubling", "tree", "hierarchical", "native"):
        for nbytes in SIZES:
            seconds = sim.time("ring" if algorithm == "native" else algorithm,
                               Collective.ALLREDUCE, nbytes // 4)
            seconds *= NATIVE_SLOWER if algorithm == "native" else 1.0
            results.append({"collective": "allreduce", "algorithm": algorithm, "nbytes": nbytes,
                            "world_size": topo.world_size, "median_us": seconds * 1e6})
    path.write_text(json.dumps({"schema": "scaledl.bench.collectives/1",
                                "config": {"topology": spec, "dtype": "float32"},
                                "environment": {"topology": spec}, "results": results}))
    return path


PRIOR = Network("prior", LinkClass("a", 5e-6, 1 / 10e9), LinkClass("b", 7e-6, 1 / 9e9),
                rack_latency=2e-6, overhead=40e-6)


def test_an_unmeasured_uplink_follows_the_fitted_inter_host_link(tmp_path: Path) -> None:
    result = fit_network(load_points([_bench_file(tmp_path / "a.json", "2x2")]), PRIOR)
    intra, inter, uplink = result.network.classes
    assert result.fitted == (True, True, False)
    assert uplink.alpha == pytest.approx(inter.alpha + PRIOR.rack_latency, rel=1e-12)
    assert uplink.beta == pytest.approx(inter.beta, rel=1e-12)
    assert inter.alpha == pytest.approx(150e-6, rel=0.02)
    assert result.network.overhead == 0.0
    assert 1 <= result.iterations < 12  # the fixpoint converged; not the cap


def test_unmeasured_classes_keep_the_prior_per_round_overhead(tmp_path: Path) -> None:
    result = fit_network(load_points([_bench_file(tmp_path / "a.json", "4")]), PRIOR)
    _, inter, uplink = result.network.classes
    assert result.fitted == (True, False, False)
    assert inter.alpha == pytest.approx(PRIOR.inter.alpha + PRIOR.overhead, rel=1e-12)
    assert inter.beta == pytest.approx(PRIOR.inter.beta, rel=1e-12)
    assert uplink.alpha == pytest.approx(PRIOR.classes[2].alpha + PRIOR.overhead, rel=1e-12)



def test_a_prior_whose_paths_are_all_cpu_work_is_a_one_line_error(tmp_path: Path) -> None:
    """When every replayed critical path is host CPU work at every start, no link class is
    constrained: a clear error naming the network (scipy's nnls once aborted the process on
    the empty system)."""
    cpu_bound = replace(PRIOR, cpu_beta=1e-6)  # 1 us per byte: far above any link's time
    with pytest.raises(ValueError, match="constrain no link of network 'prior'.*--network"):
        fit_network(load_points([_bench_file(tmp_path / "a.json", "2x2")]), cpu_bound)


def test_calibrate_on_cpu_files_with_a_gpu_network_prior_fits_or_fails_cleanly(
        tmp_path: Path) -> None:
    """The emulated cluster's files under ``--device cpu`` and the default ib-edr prior: the
    prior's own start has no link on any critical path (this aborted with a double free), a
    slower start fits; run in a process of its own so that an abort cannot take pytest down."""
    bench = Path(__file__).parents[2] / "benchmarks/cluster/allreduce-2h2r-1gbit-block-run3.json"
    out = tmp_path / "cal.json"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from scaledl.cli.main import main; sys.exit(main())",
         "simulate", "--device", "cpu", "calibrate",
         str(bench), "-o", str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "inter-host" in done.stdout and out.exists()


def test_calibrate_output_that_is_a_directory_fails_before_fitting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_file(tmp_path / "bench.json", "2x2")
    assert main(["simulate", "calibrate", str(bench), "-o", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "is a directory" in err and len(err.strip().splitlines()) == 1

def _calibrate(tmp_path: Path, *options: str) -> tuple[CostModel, str]:
    bench = _bench_file(tmp_path / "bench.json", "2x2")
    out = tmp_path / "cal.json"
    assert main(["simulate", *options, "calibrate", str(bench), "-o", str(out)]) == 0
    return CostModel.from_json(out.read_text()), str(bench)


def test_gamma_comes_from_the_cpu_device_or_autos_calibration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = _calibrate(tmp_path, "--device", "cpu", "--network", "1gbit")
    assert model.gamma == pytest.approx(device("cpu").gamma)
    assert "warning" not in capsys.readouterr().err
    auto = tmp_path / "auto.json"
    auto.write_text(CostModel(gamma=2.5e-10).to_json())
    monkeypatch.setenv("SCALEDL_CALIBRATION", str(auto))
    model, _ = _calibrate(tmp_path)
    assert model.gamma == pytest.approx(2.5e-10)  # not the p100's 4.1e-12
    err = capsys.readouterr().err
    assert "warning: --device and --network not given" in err and "p100" in err


def test_native_is_fitted_against_the_calibrated_links(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = _calibrate(tmp_path, "--device", "cpu", "--network", "1gbit")
    assert (model.native_overhead, model.native_beta_factor) != (10e-6, 1.3)
    assert "native: overhead" in capsys.readouterr().out
    topo = Topology.parse("2x2")
    for nbytes in SIZES[2:]:
        predictions = choose(Collective.ALLREDUCE, topo, nbytes // 4, 4, model).predictions
        assert predictions["native"] == pytest.approx(NATIVE_SLOWER * predictions["ring"],
                                                      rel=0.25)


def _one_row_file(path: Path, row: dict[str, object]) -> Path:
    base = {"collective": "allreduce", "algorithm": "hierarchical", "nbytes": 4 << 20,
            "world_size": 4, "median_us": 1000.0}
    path.write_text(json.dumps({"schema": "scaledl.bench.collectives/1",
                                "config": {"topology": "2x2", "dtype": "float32"},
                                "environment": {"topology": "2x2"},
                                "results": [{**base, **row}]}))
    return path


def test_points_compile_the_algorithm_as_it_ran(tmp_path: Path) -> None:
    """A file that records `resolved` (hierarchical ran with shared memory inside each host) is
    replayed as that schedule; an older file without it, as the asked name."""
    from scaledl.collectives.registry import plan
    from scaledl.sim.calibrate import predict

    ran = load_points([_one_row_file(tmp_path / "new.json",
                                     {"resolved": "hierarchical[shm,ring]"})])[0]
    old = load_points([_one_row_file(tmp_path / "old.json", {})])[0]
    assert (ran.algorithm, ran.ran) == ("hierarchical", "hierarchical[shm,ring]")
    assert (old.algorithm, old.ran) == ("hierarchical", "hierarchical")
    assert ran.compiled.stages and not old.compiled.stages
    topo = Topology.parse("2x2")
    shm_stages = [r.stage for r in plan("hierarchical[shm,ring]", Collective.ALLREDUCE, topo, 0,
                                        1 << 20).rounds if r.stage is not None]
    assert shm_stages and all(s.path == "shm" for s in shm_stages)
    slow_intra = Network("slow loopback", LinkClass("loopback", 300e-6, 1 / 0.2e9),
                         TRUE.inter, rack_latency=0.0)
    # the intra-host TCP link no longer matters once that level runs on shared memory
    assert predict(ran, slow_intra) < predict(old, slow_intra)
    assert predict(ran, slow_intra) == pytest.approx(predict(ran, TRUE), rel=1e-9)


def test_a_bandwidth_the_measurements_do_not_constrain_is_named_not_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The emulated cluster's 2x2 files at 1 Gbit/s leave the intra-host bytes off the critical
    paths: the fit drives their seconds per byte to about zero (1e13 GB/s), which the summary
    calls unconstrained rather than printing as a rate."""
    bench = Path(__file__).parents[2] / "benchmarks/sim_validation/raw" / \
        "allreduce-2x2-1gbit-run1.json"
    assert main(["simulate", "--device", "cpu", "--network", "emulated-1gbit", "calibrate",
                 str(bench), "-o", str(tmp_path / "cal.json")]) == 0
    intra = capsys.readouterr().out.splitlines()[0]
    assert intra.startswith("intra-host") and ">10000 GB/s" in intra
    assert "bandwidth unconstrained" in intra


def test_an_unconstrained_link_on_a_faster_host_points_at_the_host_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the 16-core host's 10 Gbit/s files (messages up to 32 MiB) the cpu device's TCP
    costs, a 2-core VM's, outweigh the link on every critical path: the summary says so
    instead of only asking for larger messages, and the uplink that follows the unconstrained
    inter-host link is not printed as a rate either."""
    bench = Path(__file__).parents[2] / "benchmarks/sim_validation/raw-h100" / \
        "allreduce-2x2-10gbit-run1.json"
    assert main(["simulate", "--device", "cpu", "--network", "10gbit", "--intra", "loopback",
                 "calibrate", str(bench), "-o", str(tmp_path / "cal.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    inter = next(line for line in lines if line.startswith("inter-host"))
    uplink = next(line for line in lines if line.startswith("rack uplink"))
    assert "bandwidth unconstrained" in inter and "host TCP cost per byte" in inter
    assert ">10000 GB/s" in uplink and "inter-host + rack latency" in uplink


def test_a_link_without_host_tcp_costs_only_asks_for_larger_messages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a GPU prior (NCCL inside the host: no socket cost there) an unconstrained intra-host
    class is not blamed on host TCP costs it does not pay."""
    bench = Path(__file__).parents[2] / "benchmarks/sim_validation/raw-h100" / \
        "allreduce-2x2-10gbit-run1.json"
    assert main(["simulate", "--device", "v100", "--network", "10gbe", "calibrate", str(bench),
                 "-o", str(tmp_path / "cal.json")]) == 0
    intra = capsys.readouterr().out.splitlines()[0]
    assert intra.startswith("intra-host") and "bandwidth unconstrained" in intra
    assert intra.endswith("measure larger messages to fit it)")
