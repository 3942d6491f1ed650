"""The machine a folder of run.sh's measurements was taken on, as analyze.py replays it.

The cpu device's host constants (sim/presets.py ``CPU_TCP_BETA`` and ``CPU_TCP_LINK_BETA``,
sim/losses.py ``STACKS["scaledl"]``, the executor's per-round overhead and the emulated links'
latencies) describe the 2-core VM where raw/ was measured, and ``raw/`` is replayed with them on
2 cores.  A folder measured on another machine holds a ``host.json`` beside its files, written
by ``fit_host.py --write``: the machine's cores, the calibration files its constants were fitted
to (every other file is held out), and the constants that differ from the presets:

    {"cores": 16, "machine": "...", "calibration": ["allreduce-2x2-10gbit-run1.json", ...],
     "constants": {"cpu_beta": 6.2e-11, "call": 0.0, ...}}

``CONSTANTS`` names what may be given: ``cpu_beta`` and ``cpu_beta_link`` (host CPU seconds per
byte), ``call`` (the stack's cost per collective call), ``overhead`` (the executor's cost per
round), ``inter_alpha`` and ``intra_alpha`` (the emulated link's and loopback's latency).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scaledl.sim.scenario import job_network
from scaledl.sim.job import Job
from scaledl.sim.losses import STACKS
from scaledl.sim.network import Network

CONSTANTS = ("cpu_beta", "cpu_beta_link", "call", "overhead", "inter_alpha", "intra_alpha")
RATES = ("100mbit", "1gbit", "10gbit")
VM_CALIBRATION_RUN = 6
"""The run the VM's host constants were fitted to: the first with 40 timed iterations per point
(12 at 100 Mbit/s) at every rate, all in one hour."""


@dataclass(frozen=True)
class Host:
    """Where a folder's files were measured: cores, calibration files and constants."""

    cores: int = 2
    calibration: frozenset[str] = frozenset(
        f"allreduce-2x2-{rate}-run{VM_CALIBRATION_RUN}.json" for rate in RATES)
    constants: dict[str, float] = field(default_factory=dict)
    machine: str = "the 2-core VM of raw/ (the cpu device's presets)"

    def network(self, rate: str) -> Network:
        """The network `scaledl simulate --device cpu --network RATE --intra loopback` replays
        on, with this machine's constants in place of the presets'."""
        net = job_network(Job(device="cpu", network=rate, intra="loopback"))
        return with_constants(net, self.constants)

    @property
    def call(self) -> float:
        """The scaledl stack's cost per collective call on this machine."""
        return self.constants.get("call", STACKS["scaledl"].call_overhead_s)


def with_constants(net: Network, constants: dict[str, float]) -> Network:
    """``net`` with the host ``constants`` it names replaced (``call`` is not the network's)."""
    c = constants
    return replace(
        net, cpu_beta=c.get("cpu_beta", net.cpu_beta),
        cpu_beta_link=c.get("cpu_beta_link", net.cpu_beta_link),
        overhead=c.get("overhead", net.overhead),
        inter=replace(net.inter, alpha=c.get("inter_alpha", net.inter.alpha)),
        intra=replace(net.intra, alpha=c.get("intra_alpha", net.intra.alpha)))


def defaults(host: Host, rate: str = "10gbit") -> dict[str, float]:
    """Every constant's value on ``host`` (the presets' where it gives none)."""
    net = host.network(rate)
    return {"cpu_beta": net.cpu_beta, "cpu_beta_link": net.cpu_beta_link, "call": host.call,
            "overhead": net.overhead, "inter_alpha": net.inter.alpha,
            "intra_alpha": net.intra.alpha}


def load_host(raw: Path) -> Host:
    """``raw/host.json``'s machine, or the VM's presets where the folder has none."""
    path = raw / "host.json"
    if not path.is_file():
        return Host()
    data: dict[str, Any] = json.loads(path.read_text())
    unknown = set(data["constants"]) - set(CONSTANTS)
    if unknown:
        raise SystemExit(f"{path}: unknown constants {sorted(unknown)}; known: {CONSTANTS}")
    return Host(cores=int(data["cores"]), calibration=frozenset(data["calibration"]),
                constants={k: float(v) for k, v in data["constants"].items()},
                machine=str(data.get("machine", "")))


def save_host(raw: Path, host: Host) -> None:
    """Write ``host`` to ``raw/host.json``."""
    (raw / "host.json").write_text(json.dumps(
        {"cores": host.cores, "machine": host.machine, "calibration": sorted(host.calibration),
         "constants": host.constants}, indent=1) + "\n")
