"""A CPU profile prices its host's sockets: ``scaledl simulate --profile`` takes the host CPU's
cost per byte of TCP from the profile's own loopback stream (``tcp_beta``) where Gloo moves the
bytes, so a plan made on one machine prices that machine's TCP stack, not the 2-core VM's
preset (docs/simulation.md, "Measured profiles").  A CUDA profile, a profile without a stream,
``--socket-bandwidth`` and ``--ideal`` keep what they had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaledl.sim.scenario import job_network, resolve
from scaledl.sim.job import Job
from scaledl.sim.presets import CPU_TCP_BETA, CPU_TCP_LINK_BETA, DEVICES

RAW = Path(__file__).resolve().parents[2] / "benchmarks" / "sim_validation" / "raw"


def _profile(tmp_path: Path, tcp_beta: float, kind: str = "cpu") -> Path:
    """The VM's MLP profile with its stream cost and device type replaced."""
    data = json.loads((RAW / "profile-mlp.json").read_text())
    data["tcp_beta"], data["device"]["type"] = tcp_beta, kind
    path = tmp_path / f"mlp-{kind}-{tcp_beta}.json"
    path.write_text(json.dumps(data))
    return path


def _job(profile: Path, **options: object) -> Job:
    base: dict[str, object] = dict(model="mlp", device="cpu", gpus=4, topology="2x2",
                                   network="10gbit", batch=64, profile_path=profile)
    return Job(**{**base, **options})  # type: ignore[arg-type]


def test_a_cpu_profiles_stream_prices_gloos_sockets(tmp_path: Path) -> None:
    beta = 3 * CPU_TCP_BETA
    network = job_network(_job(_profile(tmp_path, beta)))
    assert network.cpu_beta == beta
    assert network.cpu_beta_link == CPU_TCP_LINK_BETA  # a link beyond the host: the preset's


def test_a_costlier_stack_predicts_a_longer_step(tmp_path: Path) -> None:
    """Everything else equal, a host whose TCP costs more per byte waits longer for the
    allreduce, and one whose TCP costs less waits less; the compute is the profile's either
    way."""
    cheap, dear = (resolve(_job(_profile(tmp_path, b))).run() for b in (0.05e-9, 2e-9))
    assert cheap.single_gpu_s == dear.single_gpu_s
    assert cheap.iteration_s < dear.iteration_s


@pytest.mark.parametrize("tcp_beta, kind", [(0.0, "cpu"), (1e-9, "cuda")])
def test_no_stream_or_a_cuda_profile_keeps_the_preset(tmp_path: Path, tcp_beta: float,
                                                      kind: str) -> None:
    assert job_network(_job(_profile(tmp_path, tcp_beta, kind))).cpu_beta == CPU_TCP_BETA


def test_socket_bandwidth_and_gpu_hosts_are_not_the_profiles(tmp_path: Path) -> None:
    path = _profile(tmp_path, 1e-9)
    assert job_network(_job(path, socket_gbps=4.0)).cpu_beta == pytest.approx(0.25e-9)
    assert job_network(_job(path, lossless=True)).cpu_beta == 0.0
    gpu = _job(_profile(tmp_path, 1e-9, "cuda"), device="v100", gpus=16, topology="8x2",
               network="10gbe")
    assert job_network(gpu).cpu_beta == DEVICES["v100"].tcp_beta
