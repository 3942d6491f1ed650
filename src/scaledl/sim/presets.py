"""Device and network presets for ``scaledl simulate``; sources are listed in docs/simulation.md.

A :class:`Device` gives effective training throughput: the vendor's peak FLOP/s at the
precision named, times an assumed fraction achieved by convolutional-network training (cuDNN
kernels, memory-bound layers, framework overhead).  Link presets give one-way bandwidth (the
signalling rate less line encoding) and a per-message latency typical of MPI/NCCL over that link
(TCP for Ethernet).  Every number is an assumption to be replaced by a calibration
(``scaledl simulate calibrate``) where a measurement exists.
"""

from __future__ import annotations

from scaledl.sim.device_model import Device
from scaledl.sim.network import LinkClass, Network

__all__ = ["Device", "DEVICES", "devices_named", "LINKS", "TCP_LINKS", "device", "link",
           "build_network", "burst_bytes", "DEFAULT_INTRA", "INSIDE_HOST_LINKS"]

CPU_INTERFERENCE, CPU_JITTER = 0.173, 0.123
"""Measured by `scaledl simulate profile` for ResNet-20 on one thread of this VM
(benchmarks/sim_validation/raw/profile-resnet20.json, load average 2.5-2.7 from other users:
the jitter is this shared machine's, not an idle one's)."""
CPU_TCP_BETA, CPU_TCP_LINK_BETA = 0.243e-9, 0.408e-9
"""Host CPU seconds per byte of a transfer by scaledl's executor over Gloo on this VM: at each
end (loopback's copies), and extra at the sender per flow leaving its host in the same round
across an emulated link (veth, bridge, tbf in the sending context).  The first is measured:
scaledl's ring between two ranks of one host, a core each (benchmarks/sim_validation/
tcp_timeshare.py; a raw TCP stream on loopback costs 0.16-0.23 ns/B, tcp_stream.py).  The
second was fitted once, with the scaledl stack's per-call cost, to the 2x2 run 6 files of
benchmarks/sim_validation/raw (all three link rates within one hour at 40 timed iterations per
point, 12 at 100 Mbit/s; messages >= 1 MiB, with the link presets, the ranks sharing 2 cores
and ``CPU_TCP_TIMESHARE``; least squares on relative errors, fit_host.py --keep-loopback);
every other file validates them.  One flow across the emulated link costs (0.24 + 0.41) x 1.03
= 0.67 ns/B at its sender on 2x2 (a raw stream across an unshaped veth: 0.40-0.64).  The first
fit (run 1, 10 iterations per point, a day earlier, all three free) gave 0.237 and 0.737: this
VM's CPU cost per byte drifts by more than 15% between sessions (docs/simulation.md,
"Validation here")."""
CPU_TCP_TIMESHARE = ((1.5, 1.0), (2.0, 1.033), (2.5, 1.069), (3.0, 1.277))
"""TCP's CPU cost per byte with ranks sharing cores, over its cost with a core per rank, at 1.5,
2, 2.5 and 3 ranks per core.  Measured on this VM by benchmarks/sim_validation/tcp_timeshare.py
(scaledl's ring allreduce among 2-6 ranks of one host, 1-32 MiB, every byte through loopback,
three repeats; the loopback cost whose replay matches each rank count: 0.243, 0.216, 0.251,
0.259 and 0.310 ns/B; raw/tcp-timeshare-*.json), none of it from the emulated cluster.  Three
ranks measured 0.89 of two: the replay overprices an odd ring on two cores, and a time-sharing
cost is never below 1, so that point is 1."""
CPU_TIMESHARE = 0.17
"""Compute lost to time-sharing when ranks outnumber cores: a step takes its fair share
``ranks / cores`` times ``1 + CPU_TIMESHARE * (1 - cores / ranks)``.  Measured on this VM by
benchmarks/sim_validation/timeshare.py (ResNet-20 training steps, one thread per process, 4 and
6 processes on 2 cores against one alone; twelve measurements in two quiet sessions: ratios
0.96-1.24 of the fair share, the constant's estimates -0.08 to 0.35, median 0.17: 0.13 at 4
processes, 0.22 at 6; raw/timeshare.jsonl)."""


GPU_INTERFERENCE = 0.189
"""Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
Deep Learning", arXiv 2507.03114 (2025): overlapped collectives slow compute by 18.9% on
average (A100, H100, MI250, MI210); assumed for every GPU preset."""

GPU_JITTER = 0.005
"""PyTorch's DDP benchmark (pytorch/pytorch benchmarks/distributed/ddp/README.md, 8 DGX-1 V100
machines): ResNet-50 p50 iteration 0.103 s at 2 GPUs and 0.104 s at 8 and 16; a per-rank
spread of 1% would add 1.2 ms from 2 to 16 GPUs (1 + cv e_N), so cv is about 0.5%."""

TF_BENCHMARKS = "tensorflow/docs_src/performance/benchmarks.md (May 2017, synthetic data)"

P100_LAUNCH, P100_EFFICIENCY = 109.18e-6, 0.6078
"""The roofline's fixed cost per layer and pass and its compute efficiency, both fixed by
TensorFlow's two published ResNet-50 rates on one P100: 195 images/s at batch 32 and 219 at
batch 64 (TF_BENCHMARKS, DGX-1 table), with every traced operation priced by its own roofline
and the update's 5 memory passes (before operations were traced: 109.05 us and 0.5058)."""

K80_LAUNCH, K80_EFFICIENCY = 179.60e-6, 0.2909
"""The same from ResNet-50 on one K80 (GK210): 49.5 images/s at batch 32 and 51.9 at 64
(TF_BENCHMARKS, Google Compute Engine table)."""

V100_LAUNCH, V100_EFFICIENCY = 20e-6, 0.6150
"""PyTorch 1.4 on one V100: 329 images/s for ResNet-50 at batch 32 without DDP (pytorch/pytorch
benchmarks/distributed/ddp/README.md); one rate fixes one parameter, so the launch cost is
assumed (an eager framework's 2-3 kernel launches per layer) and the efficiency follows."""

MODERN_LAUNCH = 20e-6
"""Assumed for the A100 and H100 presets (as for the V100)."""

A100_EFFICIENCY = 0.2899
"""NVIDIA's ResNet-50 v1.5 recipe in PyTorch on one A100 80 GB at TF32: 938 images/s at batch
256 (NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md,
pytorch-21.03), priced on the part it ran on (``a100-80gb``, 2039 GB/s) and in its layout: the
recipe's TF32 configuration sets no ``memory_format`` (``configs.yml``), so the model is NCHW
and every convolution pays its NHWC transposes (``Device.nhwc_convolutions``).  One rate fixes
one parameter, the launch cost is ``MODERN_LAUNCH``; both A100 presets share it (the same
SMs and tensor cores).  BERT-large on the same GPU is then predicted 17% slow
(``scaledl.sim.device_checks``)."""
V100_TENSOR_EFFICIENCY = 0.3842
"""The V100's ``e`` on tensor cores (``--mixed-precision``): NVIDIA's ResNet-50 v1.5 recipe in
PyTorch with AMP on one V100 16 GB, NHWC (``configs.yml``: ``memory_format: nhwc``), 1200
images/s at batch 256 (pytorch-21.03; the DLE cases' source)."""

GPU_HOST_TCP_BETA = 1 / 2.06e9
"""Host CPU seconds per byte at each end of a socket on a GPU host (NCCL's socket transport,
Horovod or Gloo over plain Ethernet): one thread per connection moves its bytes through the
kernel, so one stream carries at most 2.06 GB/s however fast the link.  NVIDIA/nccl#209
(2019): NCCL 2.3.7 with one ring over a 32 Gbit/s TCP network reached 2.06 GB/s of bus
bandwidth (more rings, more threads: 3.75 GB/s at eight), "no more than 60% of wire speed";
the ring's sending and receiving GPUs of a host are different processes, so each end's thread
moves the stream's bytes once.  Bytes inside a GPU host (PCIe, NVLink) cost no CPU."""

TCP_LINKS = frozenset({"10gbe", "25gbe", "40gbe", "50gbe", "100gbe", "emulated-100mbit",
                       "emulated-1gbit", "emulated-10gbit"})
"""Ethernet presets used through TCP sockets (``25gbe-roce`` is the RDMA one): on GPU hosts the
bytes that cross hosts on them cost ``Device.tcp_beta`` of host CPU at each end.  On the cpu
device every link is a socket (Gloo)."""


THREADS_PER_SM = 2048
"""Resident threads per streaming multiprocessor of every GPU preset (Kepler to Hopper)."""


def _gpu(name: str, peak_tflops: float, efficiency: float, memory_gbps: float, intra: str,
         source: str, *, sms: int, compute_efficiency: float, launch_s: float,
         tensor_cores: bool = False, mixed: tuple[float, float] = (0.0, 0.0),
         cuda_names: tuple[str, ...] = ()) -> Device:
    """A GPU preset: ``sms`` full multiprocessors fill it; every GPU shares the measured
    compute-communication interference and jitter; ``tensor_cores``: its peak is tensor-core
    math (``Device.nhwc_convolutions``); ``mixed``: its FP16/BF16 tensor-core peak and ``e``;
    ``cuda_names``: the words CUDA names it by (default: the preset's name, upper case)."""
    return Device(name, peak_tflops, efficiency, memory_gbps, intra, source,
                  cuda_names=cuda_names or (name.upper(),),
                  compute_efficiency=compute_efficiency, fill_threads=sms * THREADS_PER_SM,
                  launch_s=launch_s, interference=GPU_INTERFERENCE, jitter_cv=GPU_JITTER,
                  tcp_beta=GPU_HOST_TCP_BETA, nhwc_convolutions=tensor_cores,
                  mixed_tflops=mixed[0], tensor_efficiency=mixed[1])


def _a100(name: str, memory_gbps: float, part: str, memory: str) -> Device:
    """An A100 SXM preset: the two parts differ in memory only."""
    return _gpu(name, 156.0, 0.20, memory_gbps, "nvlink3",
                f"NVIDIA A100 {part} SXM datasheet: 156 TFLOP/s TF32 and 312 FP16/BF16 tensor "
                f"(dense), {memory_gbps:g} GB/s {memory}; 108 SMs x 2048",
                sms=108, compute_efficiency=A100_EFFICIENCY, launch_s=MODERN_LAUNCH,
                tensor_cores=True, mixed=(312.0, A100_EFFICIENCY),
                cuda_names=("A100", part) if part == "80GB" else ("A100",))


def _hopper(name: str, memory_gbps: float, datasheet: str, memory: str) -> Device:
    """A Hopper SXM preset: the H100 and H200 share the GH100's compute and differ in memory;
    ``e`` is the A100's, carried over (checked by rates measured on an H100:
    ``scaledl.sim.device_checks``)."""
    return _gpu(name, 494.5, 0.25, memory_gbps, "nvlink4",
                f"{datasheet}: 989 TFLOP/s TF32 and 1979 BF16 tensor with sparsity, so 494.5 "
                f"and 989.5 dense, {memory}; 132 SMs x 2048; e the A100's, carried over",
                sms=132, compute_efficiency=A100_EFFICIENCY, launch_s=MODERN_LAUNCH,
                tensor_cores=True, mixed=(989.5, A100_EFFICIENCY))


DEVICES: dict[str, Device] = {d.name: d for d in (
    _gpu("k80", 4.37, 0.30, 240.0, "pcie3",
         "NVIDIA Tesla K80 datasheet: 8.73 TFLOP/s FP32 with boost per board of two GK210 GPUs, "
         "480 GB/s per board; one GPU = half a board; 13 SMX x 2048 threads",
         sms=13, compute_efficiency=K80_EFFICIENCY, launch_s=K80_LAUNCH),
    _gpu("p100", 10.6, 0.45, 732.0, "nvlink1",
         "NVIDIA Tesla P100 SXM2 (NVLink) datasheet: 10.6 TFLOP/s FP32, 732 GB/s HBM2; "
         "56 SMs x 2048 threads",
         sms=56, compute_efficiency=P100_EFFICIENCY, launch_s=P100_LAUNCH),
    _gpu("v100", 15.7, 0.50, 900.0, "nvlink2",
         "NVIDIA Tesla V100 SXM2 datasheet: 15.7 TFLOP/s FP32, 125 FP16 tensor, 900 GB/s HBM2; "
         "80 SMs x 2048",
         sms=80, compute_efficiency=V100_EFFICIENCY, launch_s=V100_LAUNCH,
         mixed=(125.0, V100_TENSOR_EFFICIENCY)),
    _a100("a100", 1555.0, "40GB", "HBM2"),
    _a100("a100-80gb", 2039.0, "80GB", "HBM2e"),
    _hopper("h100", 3350.0, "NVIDIA H100 SXM5 datasheet", "3.35 TB/s HBM3"),
    _hopper("h200", 4800.0, "NVIDIA H200 SXM datasheet (the H100's GH100 compute)",
            "4.8 TB/s HBM3e"),
    Device("knl", 6.09, 0.30, 400.0, "loopback",
           "Intel Xeon Phi 7250: 68 cores x 1.4 GHz x 2 AVX-512 units x 16 FP32 lanes x 2 (FMA) "
           "= 6.09 TFLOP/s; MCDRAM about 400 GB/s; 68 cores x 4 threads x 16 lanes",
           compute_efficiency=0.30, fill_threads=68 * 4 * 16, launch_s=MODERN_LAUNCH,
           jitter_cv=GPU_JITTER, backend="mpi"),
    Device("cpu", 0.1, 0.5, 43.0, "loopback",
           "this project's 2-core VM: FLOP/s an order of magnitude (use --profile or "
           "--compute-time with a measured iteration instead); memory 43 GB/s measured "
           "(torch.add of 64 MiB float32 tensors in 4.70 ms counting two reads and a write); "
           "interference, jitter and TCP cost measured by `scaledl simulate profile`",
           compute_efficiency=0.5, fill_threads=2 * 8, launch_s=10e-6,
           interference=CPU_INTERFERENCE, jitter_cv=CPU_JITTER, tcp_beta=CPU_TCP_BETA,
           tcp_link_beta=CPU_TCP_LINK_BETA, tcp_timeshare=CPU_TCP_TIMESHARE,
           timeshare=CPU_TIMESHARE, backend="gloo"),
)}

TCP_PAYLOAD = 1448 / 1514
"""Payload per Ethernet frame through TCP at MTU 1500 (1448 bytes of data after the IP, TCP and
timestamp headers, in a 1514-byte frame): ``tc`` shapes whole frames."""

LINKS: dict[str, LinkClass] = {
    "ib-fdr": LinkClass.from_bandwidth("ib-fdr", 1.0e-6, 54.5 / 8),
    "ib-edr": LinkClass.from_bandwidth("ib-edr", 1.0e-6, 100.0 / 8),
    "ib-edr-x4": LinkClass.from_bandwidth("ib-edr-x4", 1.0e-6, 4 * 100.0 / 8),
    "ib-edr-x8": LinkClass.from_bandwidth("ib-edr-x8", 1.0e-6, 8 * 100.0 / 8),
    "ib-hdr": LinkClass.from_bandwidth("ib-hdr", 1.0e-6, 200.0 / 8),
    "ib-hdr-x8": LinkClass.from_bandwidth("ib-hdr-x8", 1.0e-6, 8 * 200.0 / 8),
    "ib-ndr": LinkClass.from_bandwidth("ib-ndr", 1.0e-6, 400.0 / 8),
    "ib-ndr-x8": LinkClass.from_bandwidth("ib-ndr-x8", 1.0e-6, 8 * 400.0 / 8),
    "10gbe": LinkClass.from_bandwidth("10gbe", 10e-6, 10.0 / 8),
    "25gbe": LinkClass.from_bandwidth("25gbe", 10e-6, 25.0 / 8),
    "50gbe": LinkClass.from_bandwidth("50gbe", 10e-6, 50.0 / 8),
    "100gbe": LinkClass.from_bandwidth("100gbe", 10e-6, 100.0 / 8),
    "40gbe": LinkClass.from_bandwidth("40gbe", 10e-6, 40.0 / 8),
    "25gbe-roce": LinkClass.from_bandwidth("25gbe-roce", 1.0e-6, 25.0 / 8),
    "100gbe-roce": LinkClass.from_bandwidth("100gbe-roce", 1.0e-6, 100.0 / 8),
    "200gbe-roce": LinkClass.from_bandwidth("200gbe-roce", 1.0e-6, 200.0 / 8),
    "400gbe-roce": LinkClass.from_bandwidth("400gbe-roce", 1.0e-6, 400.0 / 8),
    "pcie3": LinkClass.from_bandwidth("pcie3", 5e-6, 15.75),
    "nvlink1": LinkClass.from_bandwidth("nvlink1", 3e-6, 40.0),
    "nvlink1-dgx1": LinkClass.from_bandwidth("nvlink1-dgx1", 3e-6, 20.0),
    # a P100 DGX-1's GPU pairs without NVLink or peer access: copies staged through host memory
    "dgx1-p100-staged": LinkClass.from_bandwidth("dgx1-p100-staged", 19.5e-6, 10.1),
    "nvlink2": LinkClass.from_bandwidth("nvlink2", 3e-6, 50.0),
    "nvswitch-v100": LinkClass.from_bandwidth("nvswitch-v100", 3e-6, 150.0),
    "nvlink3": LinkClass.from_bandwidth("nvlink3", 3e-6, 300.0),
    "nvlink4": LinkClass.from_bandwidth("nvlink4", 3e-6, 450.0),
    "loopback": LinkClass.from_bandwidth("loopback", 40e-6, 3.0),
    "emulated-1gbit": LinkClass.from_bandwidth("emulated-1gbit", 60e-6, 1.0 / 8 * TCP_PAYLOAD),
    "emulated-10gbit": LinkClass.from_bandwidth("emulated-10gbit", 60e-6,
                                                10.0 / 8 * TCP_PAYLOAD),
    "emulated-100mbit": LinkClass.from_bandwidth("emulated-100mbit", 60e-6,
                                                 0.1 / 8 * TCP_PAYLOAD),
}
"""Link presets (latency s, one-way GB/s).  ``nvlink`` is also accepted for ``nvlink1``."""

INSIDE_HOST_LINKS = frozenset({"pcie3", "nvlink1", "nvlink1-dgx1", "dgx1-p100-staged", "nvlink2",
                               "nvswitch-v100", "nvlink3", "nvlink4", "loopback"})
"""Link presets that join GPUs of one host only: a job whose ``--network`` is one of them (as
the P100 DGX-1's staged hops) runs on one host whatever its topology's axes."""

ALIASES = {"nvlink": "nvlink1", "1gbit": "emulated-1gbit", "10gbit": "emulated-10gbit",
           "100mbit": "emulated-100mbit"}

DEFAULT_INTRA = "nvlink1"

EMULATED_BURST = {
    name: max(32 * 1024, bits_per_s / 8 / 1000) * TCP_PAYLOAD
    for name, bits_per_s in (("emulated-100mbit", 1e8), ("emulated-1gbit", 1e9),
                             ("emulated-10gbit", 1e10))
}
"""Payload bytes an emulated link passes at once after idling: ``scaledl cluster``'s tbf bucket
holds one millisecond at the link rate, at least 32 KiB (``ClusterSpec.burst_bytes``), of whole
frames."""

EXECUTOR_OVERHEAD = {"emulated-1gbit": 40e-6, "emulated-10gbit": 40e-6,
                     "emulated-100mbit": 40e-6, "loopback": 40e-6}
"""Per-round software cost on the emulated cluster (scaledl's executor over Gloo on this VM;
``auto``'s default); GPU presets assume 5 us (an MPI/NCCL step)."""


def device(name: str) -> Device:
    """The device preset ``name``."""
    found = DEVICES.get(name.lower())
    if found is None:
        raise ValueError(f"unknown device {name!r}; choose one of: {', '.join(DEVICES)}")
    return found


def devices_named(gpu_name: str) -> tuple[str, ...]:
    """The GPU presets whose GPU CUDA calls ``gpu_name``, the most specific first
    (``"NVIDIA A100-SXM4-80GB"``: ``a100-80gb``, then ``a100``); empty when none is."""
    found = [d for d in DEVICES.values() if d.names(gpu_name)]
    return tuple(d.name for d in sorted(found, key=lambda d: -len(d.cuda_names)))


def link(name: str) -> LinkClass:
    """The link preset ``name`` (aliases: nvlink, 1gbit, 10gbit)."""
    key = ALIASES.get(name.lower(), name.lower())
    found = LINKS.get(key)
    if found is None:
        names = ", ".join([*LINKS, *ALIASES])
        raise ValueError(f"unknown network {name!r}; choose one of: {names}")
    return found


def burst_bytes(inter: str) -> float:
    """Payload bytes the inter-host link preset ``inter`` passes at once after idling (its tbf
    bucket on the emulated cluster); 0 for every real fabric."""
    return EMULATED_BURST.get(link(inter).name, 0.0)


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
        overhead=overhead, gamma=gamma, burst_bytes=burst_bytes(inter),
    )
