"""Device and network presets for ``scaledl simulate``; sources are listed in docs/simulation.md.

A :class:`Device` gives effective training throughput: the vendor's peak FLOP/s at the
precision named, times an assumed fraction achieved by convolutional-network training (cuDNN
kernels, memory-bound layers, framework overhead).  Link presets give one-way bandwidth (the
signalling rate less line encoding) and a per-message latency typical of MPI/NCCL over that link
(TCP for Ethernet).  Every number is an assumption to be replaced by a calibration
(``scaledl simulate calibrate``) where a measurement exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaledl.sim.network import LinkClass, Network

__all__ = ["Device", "DEVICES", "LINKS", "device", "link", "build_network", "DEFAULT_INTRA"]


@dataclass(frozen=True)
class Device:
    """One accelerator as the simulator sees it."""

    name: str
    peak_tflops: float
    """Vendor peak at the precision used for training, TFLOP/s."""
    efficiency: float
    """Assumed fraction of the peak that training sustains."""
    memory_gbps: float
    """Memory bandwidth, GB/s: a reduction reads two operands and writes one."""
    intra: str
    """Default intra-host link preset."""
    source: str

    def __post_init__(self) -> None:
        if self.peak_tflops <= 0 or not 0 < self.efficiency <= 1 or self.memory_gbps <= 0:
            raise ValueError(
                f"device {self.name!r} needs peak > 0, efficiency in (0, 1] and memory bandwidth "
                f"> 0; got {self.peak_tflops}, {self.efficiency}, {self.memory_gbps}"
            )

    @property
    def flops(self) -> float:
        """Effective training FLOP/s."""
        return self.peak_tflops * 1e12 * self.efficiency

    @property
    def gamma(self) -> float:
        """Seconds per byte of a sum reduction (three memory passes)."""
        return 3.0 / (self.memory_gbps * 1e9)


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("k80", 4.37, 0.30, 240.0, "pcie3",
           "NVIDIA Tesla K80 datasheet: 8.73 TFLOP/s FP32 with boost per board of two GK210 GPUs, "
           "480 GB/s per board; one GPU = half a board"),
    Device("p100", 10.6, 0.45, 732.0, "nvlink1",
           "NVIDIA Tesla P100 SXM2 (NVLink) datasheet: 10.6 TFLOP/s FP32, 732 GB/s HBM2"),
    Device("v100", 15.7, 0.50, 900.0, "nvlink2",
           "NVIDIA Tesla V100 SXM2 datasheet: 15.7 TFLOP/s FP32, 900 GB/s HBM2"),
    Device("a100", 156.0, 0.20, 1555.0, "nvlink3",
           "NVIDIA A100 40GB SXM datasheet: 156 TFLOP/s TF32 tensor (dense), 1555 GB/s HBM2"),
    Device("h100", 989.0, 0.25, 3350.0, "nvlink4",
           "NVIDIA H100 SXM5 datasheet: 989 TFLOP/s BF16 tensor (dense), 3.35 TB/s HBM3"),
    Device("knl", 6.09, 0.30, 400.0, "loopback",
           "Intel Xeon Phi 7250: 68 cores x 1.4 GHz x 2 AVX-512 units x 16 FP32 lanes x 2 (FMA) "
           "= 6.09 TFLOP/s; MCDRAM about 400 GB/s"),
    Device("cpu", 0.1, 0.5, 43.0, "loopback",
           "this project's 2-core VM: FLOP/s an order of magnitude (use --compute-time with a "
           "measured iteration time instead); memory 43 GB/s measured (torch.add of 64 MiB "
           "float32 tensors in 4.70 ms counting two reads and a write)"),
)}

LINKS: dict[str, LinkClass] = {
    "ib-fdr": LinkClass.from_bandwidth("ib-fdr", 1.0e-6, 54.5 / 8),
    "ib-edr": LinkClass.from_bandwidth("ib-edr", 1.0e-6, 100.0 / 8),
    "ib-hdr": LinkClass.from_bandwidth("ib-hdr", 1.0e-6, 200.0 / 8),
    "10gbe": LinkClass.from_bandwidth("10gbe", 10e-6, 10.0 / 8),
    "25gbe": LinkClass.from_bandwidth("25gbe", 10e-6, 25.0 / 8),
    "100gbe": LinkClass.from_bandwidth("100gbe", 10e-6, 100.0 / 8),
    "pcie3": LinkClass.from_bandwidth("pcie3", 5e-6, 15.75),
    "nvlink1": LinkClass.from_bandwidth("nvlink1", 3e-6, 40.0),
    "nvlink2": LinkClass.from_bandwidth("nvlink2", 3e-6, 50.0),
    "nvlink3": LinkClass.from_bandwidth("nvlink3", 3e-6, 300.0),
    "nvlink4": LinkClass.from_bandwidth("nvlink4", 3e-6, 450.0),
    "loopback": LinkClass.from_bandwidth("loopback", 40e-6, 3.0),
    "emulated-1gbit": LinkClass.from_bandwidth("emulated-1gbit", 60e-6, 1.0 / 8),
    "emulated-10gbit": LinkClass.from_bandwidth("emulated-10gbit", 60e-6, 10.0 / 8),
}
"""Link presets (latency s, one-way GB/s).  ``nvlink`` is also accepted for ``nvlink1``."""

ALIASES = {"nvlink": "nvlink1", "1gbit": "emulated-1gbit", "10gbit": "emulated-10gbit"}

DEFAULT_INTRA = "nvlink1"

EXECUTOR_OVERHEAD = {"emulated-1gbit": 40e-6, "emulated-10gbit": 40e-6, "loopback": 40e-6}
"""Per-round software cost on the emulated cluster (scaledl's executor over Gloo on this VM;
``auto``'s default); GPU presets assume 5 us (an MPI/NCCL step)."""


def device(name: str) -> Device:
    """The device preset ``name``."""
    found = DEVICES.get(name.lower())
    if found is None:
        raise ValueError(f"unknown device {name!r}; choose one of: {', '.join(DEVICES)}")
    return found


def link(name: str) -> LinkClass:
    """The link preset ``name`` (aliases: nvlink, 1gbit, 10gbit)."""
    key = ALIASES.get(name.lower(), name.lower())
    found = LINKS.get(key)
    if found is None:
        names = ", ".join([*LINKS, *ALIASES])
        raise ValueError(f"unknown network {name!r}; choose one of: {names}")
    return found


def build_network(
    inter: str, intra: str, gamma: float, oversubscription: float = 1.0,
    uplink: str | None = None,
) -> Network:
    """A network of preset links: ``inter`` between hosts, ``intra`` inside one."""
    inter_link, intra_link = link(inter), link(intra)
    overhead = EXECUTOR_OVERHEAD.get(inter_link.name, 5e-6)
    return Network(
        name=f"{inter_link.name} + {intra_link.name}", intra=intra_link, inter=inter_link,
        uplink=link(uplink) if uplink else None, oversubscription=oversubscription,
        overhead=overhead, gamma=gamma,
    )
