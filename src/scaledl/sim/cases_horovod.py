"""Horovod's published scaling points for ``scaledl simulate reproduce`` (docs/simulation.md):
the tables of its first README (2017: 16 GPUs on 25 GbE with TCP and with RDMA, 64 GPUs on 40
GbE), its charts at 128 and 512 GPUs and Uber's announcement.  Every job runs the ``horovod``
stack (its negotiation cycle and fusion buffer) on 4 Pascal GPUs per server over PCIe, at the
single-GPU rate its source measured.
"""

from __future__ import annotations

from collections.abc import Callable

from scaledl.sim.job import Job
from scaledl.sim.presets import TCP_LINKS
from scaledl.sim.reproduce import Case, against_one_gpu, weak_scaling

__all__ = ["HOROVOD_CASES"]

HVD_2017 = ("uber/horovod README.md (2017, the first release's two benchmark tables), "
            "'allreduce on GPU with NCCL' rows")


def _horovod(model: str, images_per_s: float, gpus: int, network: str
             ) -> Callable[[bool], tuple[Job, Job]]:
    job = Job(model=model, gpus=gpus, topology=f"4x{gpus // 4}", algorithm="ring",
              device="p100", network=network, intra="pcie3", batch=64, stack="horovod",
              compute_time=64 / images_per_s)
    return against_one_gpu(job)


HVD_SINGLE = {"inception_v3": 134.4, "resnet101": 119.4, "vgg16": 130.9}
"""One GPU at batch 64 on the 25 GbE servers (the first README's baseline row), images/s."""


HVD_2017_CLUSTERS = {
    "25gbe-roce": "4 servers x 4 Pascal GPUs (4x4), 25 Gbit/s RoCE used with RDMA, PCIe inside",
    "25gbe": "the same 4 servers and network through TCP (NCCL's socket transport)",
    "40gbe": "16 servers x 4 Pascal GPUs (4x16), plain 40 Gbit/s network (TCP), PCIe inside",
}
HVD_2017_RUNS = (  # model, its name, GPUs, network, transport, one GPU and all GPUs (images/s)
    ("inception_v3", "Inception V3", 16, "25gbe-roce", "RDMA", HVD_SINGLE["inception_v3"],
     2022.6),
    ("resnet101", "ResNet-101", 16, "25gbe-roce", "RDMA", HVD_SINGLE["resnet101"], 1746.2),
    ("vgg16", "VGG-16", 16, "25gbe-roce", "RDMA", HVD_SINGLE["vgg16"], 1787.4),
    ("inception_v3", "Inception V3", 16, "25gbe", "TCP", HVD_SINGLE["inception_v3"], 1990.7),
    ("resnet101", "ResNet-101", 16, "25gbe", "TCP", HVD_SINGLE["resnet101"], 1685.1),
    ("vgg16", "VGG-16", 16, "25gbe", "TCP", HVD_SINGLE["vgg16"], 1308.7),
    ("inception_v3", "Inception V3", 64, "40gbe", "40 GbE TCP", 148.8, 7932.1),
    ("resnet101", "ResNet-101", 64, "40gbe", "40 GbE TCP", 136.0, 7741.6),
    ("vgg16", "VGG-16", 64, "40gbe", "40 GbE TCP", 149.6, 6084.2),
)
"""The 'allreduce on GPU with NCCL' rows of Horovod's first README (HVD_2017)."""


def _hvd_2017(model: str, label: str, gpus: int, network: str, transport: str,
              single: float, measured: float) -> Case:
    """One row of Horovod's 2017 tables: efficiency as throughput over GPUs x one GPU's."""
    return Case(
        f"Horovod, {label}, {gpus} GPUs, {transport}", "efficiency", measured / (gpus * single),
        f"{HVD_2017_CLUSTERS[network]}, ring, 64 images/GPU, one GPU at {single} images/s; "
        "Horovod (5 ms cycle, 64 MiB fusion)",
        f"{HVD_2017}: {transport.split()[-1]} Horovod, {measured:,.1f} images/s "
        f"({measured / single:.1f}x)",
        weak_scaling(_horovod(model, single, gpus, network)))


HVD_CHARTS = {
    "blog": ("Uber Engineering, 'Meet Horovod' (eng.uber.com/horovod, October 2017): 88% "
             "efficiency for Inception V3 and ResNet-101 from 1 to 128 GPUs, and above 90% "
             "on both with RDMA"),
    "chart 128": ("uber/horovod README.md (late 2017, the 128-GPU chart: 32 servers, "
                  "RoCE-capable 25 GbE): 90% Inception V3 and ResNet-101, 79% VGG-16"),
    "chart 512": ("horovod/horovod README and docs/benchmarks.rst (2018, the 512-GPU chart: "
                  "128 servers, RoCE-capable 25 GbE): 90% Inception V3 and ResNet-101, 68% "
                  "VGG-16"),
}
HVD_CHART_RUNS = (  # model, its name, GPUs, network, efficiency, source
    ("inception_v3", "Inception V3", 128, "25gbe", 0.88, "blog"),
    ("resnet101", "ResNet-101", 128, "25gbe", 0.88, "blog"),
    ("inception_v3", "Inception V3", 128, "25gbe-roce", 0.90, "chart 128"),
    ("resnet101", "ResNet-101", 128, "25gbe-roce", 0.90, "chart 128"),
    ("vgg16", "VGG-16", 128, "25gbe-roce", 0.79, "chart 128"),
    ("inception_v3", "Inception V3", 512, "25gbe-roce", 0.90, "chart 512"),
    ("resnet101", "ResNet-101", 512, "25gbe-roce", 0.90, "chart 512"),
    ("vgg16", "VGG-16", 512, "25gbe-roce", 0.68, "chart 512"),
)
"""Horovod's charts at 128 and 512 GPUs and its blog's TCP figure.  The charts name a
"RoCE-capable" network without the transport; the blog measured 88% over TCP at 128 GPUs and
past 90% with RDMA, so the charts' 90% are RDMA runs, and so are their VGG-16 points."""


def _hvd_chart(model: str, label: str, gpus: int, network: str, published: float,
               source: str) -> Case:
    """One point of Horovod's scaling charts (efficiency against one GPU, batch 64)."""
    transport = "TCP" if network in TCP_LINKS else "RDMA"
    return Case(
        f"Horovod, {label}, {gpus} GPUs, {transport}", "efficiency", published,
        f"{gpus // 4} servers x 4 Pascal GPUs (4x{gpus // 4}), 25 Gbit/s Ethernet used with "
        f"{transport}, PCIe inside, ring, 64 images/GPU, one GPU at {HVD_SINGLE[model]} "
        "images/s; Horovod (5 ms cycle, 64 MiB fusion)",
        HVD_CHARTS[source], weak_scaling(_horovod(model, HVD_SINGLE[model], gpus, network)))


HOROVOD_CASES = (
    *(_hvd_chart(*run) for run in HVD_CHART_RUNS),
    *(_hvd_2017(*run) for run in HVD_2017_RUNS),
)
"""Horovod's points in the order the reproduction table prints them."""
