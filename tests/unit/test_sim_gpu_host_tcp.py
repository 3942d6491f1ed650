"""A GPU host's socket cost: where NCCL (or Horovod, or Gloo) runs over plain Ethernet, a host
CPU thread moves every byte that crosses hosts through the kernel at each end
(``presets.GPU_HOST_TCP_BETA``); bytes inside the host (PCIe, NVLink) and bytes over RDMA cost no
CPU.  Closed forms on tiny cases, and which jobs carry the term."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.cli.main import main
from scaledl.collectives.cost import stage_time
from scaledl.collectives.schedule import Collective, Path, Stage
from scaledl.sim.collective import compile_collective
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.hostcpu import stage_seconds
from scaledl.sim.scenario import job_network, resolve
from scaledl.sim.job import Job
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.presets import DEVICES, GPU_HOST_TCP_BETA, TCP_LINKS
from scaledl.topology import Topology

FREE = Network("free", LinkClass("a", 0, 0), LinkClass("b", 0, 0), rack_latency=0)
TWO_BY_TWO = Topology.parse("2x2")


@pytest.mark.parametrize("inside, per_round", [(True, 2), (False, 1)])
def test_only_bytes_that_leave_a_gpu_host_cost_its_cpu(inside: bool, per_round: int) -> None:
    """Ring allreduce of n bytes on 2x2 (block layout), six rounds of n/4 per rank.  With every
    link a socket (Gloo) each rank sends and receives n/4 through one: 2 x n/4 x beta a round.
    On GPU hosts only the host's off-host sender (ranks 1, 3) and off-host receiver (0, 2)
    move socket bytes, n/4 x beta a round each: a ring's two ends of a host are two threads."""
    n, beta = 1 << 20, 1e-9
    network = replace(FREE, cpu_beta=beta, tcp_inside=inside)
    compiled = compile_collective("ring", Collective.ALLREDUCE, TWO_BY_TWO, n // 4)
    want = 6 * per_round * n / 4 * beta
    assert makespan(compiled, cost(compiled, TWO_BY_TWO, network)) == pytest.approx(want, 1e-12)


def test_a_gpu_hosts_socket_caps_a_stream_below_a_faster_link() -> None:
    """Two hosts of one GPU each on 100 GbE: a ring round moves n/2 each way and each rank's
    thread both sends and receives it (n x beta), slower than the link (n/2 x link beta)."""
    n = 64 << 20
    job = Job(model="mlp", device="v100", gpus=2, topology="1x2", network="100gbe")
    network = replace(job_network(job), overhead=0.0, gamma=0.0)
    topology = job.topology_value()
    compiled = compile_collective("ring", Collective.ALLREDUCE, topology, n // 4)
    link = network.inter
    assert n * GPU_HOST_TCP_BETA > link.alpha + n / 2 * link.beta
    want = 2 * n * GPU_HOST_TCP_BETA
    assert makespan(compiled, cost(compiled, topology, network)) == pytest.approx(want, 1e-9)


def test_a_native_stage_inside_a_gpu_host_is_no_cpu_work() -> None:
    n, beta = 8 << 20, 1e-9
    network = replace(FREE, cpu_beta=beta, tcp_inside=False)
    model = network.to_cost_model()
    across = Stage(Collective.ALLREDUCE, (0, 2), 0, n // 4, Path.NATIVE, level=1)
    inside = replace(across, level=0)
    assert stage_seconds(across, 4, model, network, 1) == pytest.approx(n * 2 * beta, 1e-12)
    assert stage_seconds(inside, 4, model, network, 1) == stage_time(inside, 4, model, 1)


@pytest.mark.parametrize("device", ["k80", "p100", "v100", "a100", "h100"])
def test_gpu_jobs_pay_sockets_on_ethernet_and_nothing_on_rdma(device: str) -> None:
    assert DEVICES[device].tcp_beta == GPU_HOST_TCP_BETA
    for network in ("10gbe", "25gbe", "40gbe", "50gbe", "100gbe"):
        assert network in TCP_LINKS
        net = job_network(Job(device=device, gpus=8, topology="4x2", network=network))
        assert (net.cpu_beta, net.tcp_inside) == (GPU_HOST_TCP_BETA, False)
    for network in ("25gbe-roce", "100gbe-roce", "400gbe-roce", "ib-fdr", "ib-edr", "ib-hdr",
                    "ib-hdr-x8", "ib-ndr", "ib-ndr-x8"):
        assert network not in TCP_LINKS
        net = job_network(Job(device=device, gpus=8, topology="4x2", network=network))
        assert net.cpu_beta == 0.0
    ideal = Job(device=device, gpus=8, topology="4x2", network="25gbe", lossless=True)
    assert job_network(ideal).cpu_beta == 0.0


def test_the_cpu_device_keeps_every_link_a_socket() -> None:
    for network in ("1gbit", "ib-edr"):
        net = job_network(Job(device="cpu", gpus=4, topology="2x2", network=network))
        assert net.cpu_beta == DEVICES["cpu"].tcp_beta and net.tcp_inside


def test_horovods_tcp_runs_are_slower_than_its_rdma_runs_by_the_socket_cost() -> None:
    """Horovod's first README measured VGG-16 on the same 16 GPUs with RDMA (85%) and TCP
    (62.5%): the model now tells them apart, and the TCP run with its host cost is slower than
    the same run on the RDMA preset's latency alone."""
    tcp = Job(model="vgg16", gpus=16, topology="4x4", algorithm="ring", device="p100",
              network="25gbe", intra="pcie3", batch=64, stack="horovod",
              compute_time=64 / 130.9)
    rdma = replace(tcp, network="25gbe-roce")
    scenario = resolve(tcp)
    no_cpu = replace(scenario, network=replace(scenario.network, cpu_beta=0.0)).run()
    assert resolve(tcp).run().iteration_s > 1.15 * resolve(rdma).run().iteration_s
    assert resolve(tcp).run().iteration_s > 1.15 * no_cpu.iteration_s


def test_a_measured_socket_rate_replaces_the_preset() -> None:
    """Four socket threads per connection (a tuned modern NCCL) move four times the bytes: the
    user gives the measured rate and only socket bytes change price."""
    job = Job(model="vgg16", gpus=16, topology="4x4", device="v100", network="100gbe", batch=64)
    tuned = replace(job, socket_gbps=4 * 2.06)
    assert job_network(tuned).cpu_beta == pytest.approx(GPU_HOST_TCP_BETA / 4, rel=1e-12)
    assert resolve(tuned).run().iteration_s < resolve(job).run().iteration_s
    rdma = replace(job, network="ib-edr", socket_gbps=4 * 2.06)
    assert job_network(rdma).cpu_beta == 0.0
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="^socket_gbps "):  # the field; the CLI says the flag
            resolve(replace(job, socket_gbps=bad)).run()


def test_the_report_says_when_sockets_carry_the_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--model", "mlp", "--gpus", "8", "--topology", "4x2", "--device", "v100"]
    assert main([*base, "--network", "25gbe"]) == 0
    assert "network 25gbe + nvlink2 (TCP sockets 2.06 GB/s per thread)," in capsys.readouterr().out
    assert main([*base, "--network", "25gbe", "--socket-bandwidth", "8"]) == 0
    assert "(TCP sockets 8.00 GB/s per thread)" in capsys.readouterr().out
    assert main([*base, "--network", "25gbe-roce"]) == 0
    assert "TCP sockets" not in capsys.readouterr().out
