"""Device and network presets for ``scaledl simulate``: data (``presets.toml`` beside this module,
every number with its source in its comments), read once into :class:`Device` and
:class:`LinkClass` values.

A :class:`Device` gives effective training throughput: the vendor's peak FLOP/s at the
precision named, times an assumed fraction achieved by convolutional-network training (cuDNN
kernels, memory-bound layers, framework overhead).  Link presets give one-way bandwidth (the
signalling rate less line encoding) and a per-message latency typical of MPI/NCCL over that link
(TCP for Ethernet).  Every number is an assumption to be replaced by a calibration
(``scaledl simulate calibrate``) where a measurement exists.
"""

from __future__ import annotations

import tomllib
from dataclasses import fields
from importlib import resources
from typing import Any

from scaledl.json_fields import refuse_unknown
from scaledl.profiling.profile_file import MeasuredProfile
from scaledl.sim.device_model import Device
from scaledl.sim.network import LinkClass, Network

__all__ = ["Device", "DEVICES", "devices_named", "measured_presets", "LINKS", "TCP_LINKS",
           "device", "link", "build_network", "burst_bytes", "DEFAULT_INTRA", "INSIDE_HOST_LINKS",
           "load_presets"]

PRESETS_FILE = "presets.toml"
"""The presets, package data of :mod:`scaledl.sim`."""

TCP_PAYLOAD = 1448 / 1514
"""Payload per Ethernet frame through TCP at MTU 1500 (1448 bytes of data after the IP, TCP and
timestamp headers, in a 1514-byte frame): ``tc`` shapes whole frames."""

GPU_EXECUTOR_OVERHEAD = 5e-6
"""Per-round software cost on a link that names none (an MPI/NCCL step)."""

_DEVICE_FIELDS = {field.name for field in fields(Device)}
_LINK_FIELDS = {"name", "latency_s", "gbits", "gbps", "tcp", "tcp_frames", "inside_host",
                "executor_overhead_s"}


def load_presets(text: str, name: str = PRESETS_FILE) -> tuple[dict[str, Device],
                                                                dict[str, dict[str, Any]]]:
    """The ``[[device]]`` and ``[[link]]`` records of a TOML ``text``: devices by name, and each
    link's record by name; a ValueError names the file, the record and the field."""
    data = tomllib.loads(text)
    devices = {}
    for index, record in enumerate(data.get("device", []), 1):
        refuse_unknown(record, _DEVICE_FIELDS, f"{name}, device {index}")
        values: dict[str, Any] = {
            key: tuple(map(tuple, value)) if key == "tcp_timeshare" else
            tuple(value) if isinstance(value, list) else value for key, value in record.items()}
        try:
            devices[record["name"]] = Device(**values)
        except TypeError as error:
            raise ValueError(f"{name}, device {index}: {error}") from None
    links = {}
    for index, record in enumerate(data.get("link", []), 1):
        where = f"{name}, link {index}"
        refuse_unknown(record, _LINK_FIELDS, where)
        if "name" not in record or "latency_s" not in record or (
                ("gbits" in record) == ("gbps" in record)):
            raise ValueError(f"{where}: needs name, latency_s and one of gbits or gbps")
        links[record["name"]] = record
    return devices, links


def _link(record: dict[str, Any]) -> LinkClass:
    """A link record's class: its rate in GB/s, a framed link's TCP payload of it."""
    gbps = record["gbps"] if "gbps" in record else record["gbits"] / 8
    if record.get("tcp_frames"):
        gbps = record["gbits"] / 8 * TCP_PAYLOAD
    return LinkClass.from_bandwidth(record["name"], record["latency_s"], gbps)


def _burst(record: dict[str, Any]) -> float:
    """Payload bytes a framed link passes at once after idling: ``scaledl cluster``'s tbf bucket
    holds one millisecond at the link rate, at least 32 KiB (``ClusterSpec.burst_bytes``), of
    whole frames."""
    gbits: float = record["gbits"]
    return max(32 * 1024, gbits * 1e9 / 8 / 1000) * TCP_PAYLOAD


DEVICES, _LINK_RECORDS = load_presets(
    (resources.files("scaledl.sim") / PRESETS_FILE).read_text(encoding="utf-8"))
LINKS: dict[str, LinkClass] = {name: _link(record) for name, record in _LINK_RECORDS.items()}
"""Link presets (latency s, one-way GB/s).  ``nvlink`` is also accepted for ``nvlink1``."""
TCP_LINKS = frozenset(name for name, record in _LINK_RECORDS.items() if record.get("tcp"))
"""Ethernet presets used through TCP sockets (``25gbe-roce`` is the RDMA one): on GPU hosts the
bytes that cross hosts on them cost ``Device.tcp_beta`` of host CPU at each end.  On the cpu
device every link is a socket (Gloo)."""
INSIDE_HOST_LINKS = frozenset(name for name, record in _LINK_RECORDS.items()
                              if record.get("inside_host"))
"""Link presets that join GPUs of one host only: a job whose ``--network`` is one of them (as
the P100 DGX-1's staged hops) runs on one host whatever its topology's axes."""
EMULATED_BURST = {name: _burst(record) for name, record in _LINK_RECORDS.items()
                  if record.get("tcp_frames")}
"""Payload bytes an emulated link passes at once after idling (its tbf bucket)."""
EXECUTOR_OVERHEAD = {name: record["executor_overhead_s"] for name, record in _LINK_RECORDS.items()
                     if "executor_overhead_s" in record}
"""Per-round software cost on the emulated cluster (scaledl's executor over Gloo on this VM;
``auto``'s default); the others assume :data:`GPU_EXECUTOR_OVERHEAD`."""

GPU_HOST_TCP_BETA = DEVICES["v100"].tcp_beta
"""Host CPU seconds per byte at each end of a socket on a GPU host (every GPU preset's)."""
CPU_TCP_BETA, CPU_TCP_LINK_BETA = DEVICES["cpu"].tcp_beta, DEVICES["cpu"].tcp_link_beta
"""The cpu preset's TCP costs at each end and at the sender across an emulated link."""
CPU_TCP_TIMESHARE = DEVICES["cpu"].tcp_timeshare
"""The cpu preset's TCP cost with ranks sharing cores (ranks per core, multiplier)."""

ALIASES = {"nvlink": "nvlink1", "1gbit": "emulated-1gbit", "10gbit": "emulated-10gbit",
           "100mbit": "emulated-100mbit"}

DEFAULT_INTRA = "nvlink1"


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


def measured_presets(measured: MeasuredProfile) -> tuple[str, ...]:
    """The device presets of the device ``measured`` was measured on: ``cpu`` for a CPU, the GPU
    presets whose GPU CUDA named (most specific first), none for a GPU no preset is."""
    if measured.on_cpu:
        return ("cpu",)
    return devices_named(str(measured.device.get("name", "")))


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
    overhead = EXECUTOR_OVERHEAD.get(inter_link.name, GPU_EXECUTOR_OVERHEAD)
    return Network(
        name=f"{inter_link.name} + {intra_link.name}", intra=intra_link, inter=inter_link,
        uplink=link(uplink) if uplink else None, oversubscription=oversubscription,
        overhead=overhead, gamma=gamma, burst_bytes=burst_bytes(inter),
    )
