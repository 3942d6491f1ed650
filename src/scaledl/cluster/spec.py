"""What an emulated cluster is: its name, hosts, link rate, addresses and the names of its parts.

Everything here is pure: no command runs.  A cluster named ``c1a2b3`` with 2 hosts is

- network namespaces ``scaledl-c1a2b3-h0``, ``scaledl-c1a2b3-h1`` (the hosts) and
  ``scaledl-c1a2b3-sw`` (the switch, holding bridge ``br0``);
- one veth pair per host, created directly inside the namespaces (nothing lands in the root
  namespace, so two clusters never collide on interface names): ``eth0`` in the host, ``p<i>`` on
  the switch;
- host ``i`` at ``10.231.<subnet>.<i+1>/24``; each cluster gets its own ``/24``;
- the link shaped in both directions with ``tc``: on ``eth0`` (host to switch) and on ``p<i>``
  (switch to host), so every host has one full-duplex NIC of the given rate.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

__all__ = [
    "ClusterSpec", "parse_rate", "format_rate", "new_name", "check_name", "NAMESPACE_PREFIX",
    "HOST_IFNAME", "BRIDGE", "SHAPERS", "MAX_HOSTS", "SUBNET_BASE", "MAX_SUBNETS", "check_rate",
    "MIN_RATE", "MAX_RATE",
]

NAMESPACE_PREFIX = "scaledl-"
"""Every namespace of every cluster starts with this (used to find leftovers)."""
HOST_IFNAME = "eth0"
"""The host's link to the switch, inside its namespace (``GLOO_SOCKET_IFNAME``)."""
BRIDGE = "br0"
"""The bridge inside the switch namespace."""
SHAPERS = ("tbf", "htb")
"""Queueing disciplines that can shape a link on this kernel (netem is not built in)."""
SWITCH_QUEUE_MS = 5
"""Queueing delay a switch port's ``tbf`` holds at the link rate."""
HOST_TXQUEUE_FRAMES, FRAME_BYTES = 1000, 1514
"""Linux's default transmit queue length of an Ethernet interface (``txqueuelen``), in frames of
1514 bytes at MTU 1500."""
MAX_HOSTS = 64
"""Most hosts one cluster may have."""
SUBNET_BASE = "10.231"
"""Clusters take ``/24`` subnets ``10.231.0.0/24 .. 10.231.255.0/24``."""
MAX_SUBNETS = 256
"""How many clusters can exist at once (one ``/24`` each)."""

_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_UNLIMITED = ("none", "unlimited")
MIN_RATE = 8 * 10**3
"""Slowest link (8kbit): below it tc silently shortens the 32 KiB token bucket (its depth in
time, about 270 s at most, would overflow)."""
MAX_RATE = 5 * 10**12
"""Fastest link (5tbit): tc takes a byte count of at most 2**32 - 1, and a host's queue
(:attr:`ClusterSpec.host_queue_bytes`) holds 6 ms at the rate, 3.75 GB at 5 Tbit/s (34tbit, the
limit of the 1 ms burst alone, failed there while the cluster was being built)."""


def parse_rate(text: str) -> int | None:
    """``"1gbit"`` -> ``1_000_000_000`` bits/s (SI units, as tc reads them); ``"none"`` -> None."""
    if str(text).strip().lower() in _UNLIMITED:
        return None
    match = _RATE.match(str(text))
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"link rate {text!r} is not a rate; write a number with bit, kbit, mbit, gbit or tbit "
            "(SI units, e.g. 1gbit or 100mbit), or 'none' for an unshaped link"
        )
    return check_rate(int(float(match.group(1)) * _RATE_UNITS[match.group(2).lower()]), text)


def check_rate(bits_per_s: int | None, text: str | None = None) -> int | None:
    """Return ``bits_per_s`` if tc can shape a link to it (or it is None), else ``ValueError``."""
    if bits_per_s is not None and not MIN_RATE <= bits_per_s <= MAX_RATE:
        shown = text if text is not None else format_rate(bits_per_s)
        raise ValueError(
            f"link rate {shown!r} is out of range; tc shapes links from {format_rate(MIN_RATE)} "
            f"to {format_rate(MAX_RATE)}, or use 'none' for an unshaped link"
        )
    return bits_per_s


def format_rate(bits_per_s: int | None) -> str:
    """``1_000_000_000`` -> ``"1gbit"``; ``None`` -> ``"none"`` (inverse of :func:`parse_rate`)."""
    if bits_per_s is None:
        return "none"
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits_per_s % _RATE_UNITS[unit] == 0:
            return f"{bits_per_s // _RATE_UNITS[unit]}{unit}"
    return f"{bits_per_s}bit"


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid cluster name, else raise ``ValueError``."""
    if not _NAME.match(name):
        raise ValueError(
            f"cluster name {name!r} is invalid; use 1-10 lower-case letters or digits starting "
            "with a letter, e.g. 'lab1'"
        )
    return name


def new_name() -> str:
    """A fresh random name ``c`` + 6 hex digits (the caller checks it is not taken)."""
    return "c" + secrets.token_hex(3)


@dataclass(frozen=True)
class ClusterSpec:
    """One emulated cluster: ``hosts`` namespaces joined through a switch by shaped links."""

    name: str
    """Cluster name (:func:`check_name`); part of every namespace name."""
    hosts: int
    """Number of emulated hosts."""
    rate: int | None
    """Link rate in bits/s per direction, or ``None`` for an unshaped veth."""
    subnet: int
    """Third octet of the cluster's ``10.231.<subnet>.0/24``."""
    shaper: str = "tbf"
    """``tbf`` or ``htb``."""

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.hosts, bool) or not 1 <= int(self.hosts) <= MAX_HOSTS:
            raise ValueError(f"--hosts {self.hosts} must be between 1 and {MAX_HOSTS}")
        if not 0 <= self.subnet < MAX_SUBNETS:
            raise ValueError(f"subnet {self.subnet} must be in 0..{MAX_SUBNETS - 1}")
        if self.shaper not in SHAPERS:
            known = ", ".join(SHAPERS)
            raise ValueError(f"--shaper {self.shaper!r} is unknown; use one of {known}")
        check_rate(self.rate)

    # -- names ----------------------------------------------------------------------------------
    def host_namespace(self, host: int) -> str:
        """Namespace of host ``host``."""
        self._check_host(host)
        return f"{NAMESPACE_PREFIX}{self.name}-h{host}"

    @property
    def switch_namespace(self) -> str:
        """Namespace of the switch (the bridge)."""
        return f"{NAMESPACE_PREFIX}{self.name}-sw"

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the cluster: the switch first, then the hosts."""
        return [self.switch_namespace] + [self.host_namespace(h) for h in range(self.hosts)]

    @staticmethod
    def switch_port(host: int) -> str:
        """The switch end of host ``host``'s link."""
        return f"p{host}"

    def address(self, host: int) -> str:
        """IPv4 address of host ``host``."""
        self._check_host(host)
        return f"{SUBNET_BASE}.{self.subnet}.{host + 1}"

    @property
    def rate_text(self) -> str:
        """The rate as tc writes it (``1gbit``) or ``none``."""
        return format_rate(self.rate)

    @property
    def links_text(self) -> str:
        """The links in words: ``1gbit (tbf)``, or ``unshaped`` (no qdisc is added)."""
        return "unshaped" if self.rate is None else f"{self.rate_text} ({self.shaper})"

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.hosts:
            raise ValueError(f"host {host} does not exist in cluster {self.name!r} of {self.hosts}")

    # -- commands -------------------------------------------------------------------------------
    def create_commands(self) -> list[list[str]]:
        """The ``ip``/``tc`` commands that build the cluster, in order."""
        sw = self.switch_namespace
        commands = [
            ["ip", "netns", "add", sw],
            ["ip", "-n", sw, "link", "set", "lo", "up"],
            ["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "-n", sw, "link", "set", BRIDGE, "up"],
        ]
        for host in range(self.hosts):
            commands += self._host_commands(host)
        return commands

    def _host_commands(self, host: int) -> list[list[str]]:
        ns, sw, port = self.host_namespace(host), self.switch_namespace, self.switch_port(host)
        commands = [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", HOST_IFNAME, "netns", ns, "type", "veth",
             "peer", "name", port, "netns", sw],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", HOST_IFNAME],
            ["ip", "-n", ns, "link", "set", HOST_IFNAME, "up"],
            ["ip", "-n", sw, "link", "set", port, "master", BRIDGE],
            ["ip", "-n", sw, "link", "set", port, "up"],
        ]
        commands += self.shape_commands(ns, HOST_IFNAME, host_side=True)
        commands += self.shape_commands(sw, port)
        return commands

    def shape_commands(self, namespace: str, device: str, host_side: bool = False
                       ) -> list[list[str]]:
        """``tc`` commands limiting ``device``'s egress to :attr:`rate` (none when unshaped).

        A switch port (``tbf``) queues 5 ms at the rate, a switch's shallow buffer.  A host's own
        interface queues at least :attr:`host_queue_bytes`: a real NIC's transmit queue holds
        1000 frames and stops the sending sockets when full instead of dropping their packets,
        where a 5 ms queue at 100 Mbit/s (95 kB) dropped a quarter of the packets of three
        flows leaving one host and stalled them in retransmissions (docs/cluster.md)."""
        if self.rate is None:
            return []
        tc = ["tc", "-n", namespace]
        if self.shaper == "htb":
            return [
                tc + ["qdisc", "add", "dev", device, "root", "handle", "1:", "htb",
                      "default", "10"],
                tc + ["class", "add", "dev", device, "parent", "1:", "classid", "1:10", "htb",
                      "rate", f"{self.rate}bit", "burst", f"{self.burst_bytes}b",
                      "cburst", f"{self.burst_bytes}b"],
            ]
        queue = (["limit", f"{self.host_queue_bytes}b"] if host_side
                 else ["latency", f"{SWITCH_QUEUE_MS}ms"])
        return [tc + ["qdisc", "add", "dev", device, "root", "tbf", "rate", f"{self.rate}bit",
                      "burst", f"{self.burst_bytes}b", *queue]]

    @property
    def host_queue_bytes(self) -> int:
        """Bytes a host's shaped interface queues: a NIC's default transmit queue of 1000
        full frames, or the switch's 5 ms at the rate plus the burst where that is more (at
        10 Gbit/s), so that no link drops what it did before."""
        rate = self.rate or 0
        switch = rate // 8 * SWITCH_QUEUE_MS // 1000 + self.burst_bytes
        return max(HOST_TXQUEUE_FRAMES * FRAME_BYTES, switch)

    @property
    def burst_bytes(self) -> int:
        """Token-bucket depth: one millisecond at the link rate, at least 32 KiB.

        1 ms at 1 Gbit/s is 125 kB and at 10 Gbit/s 1.25 MB, the depths measured to give the
        exact rate on this kind of VM (env-facts section 3: 128kb at 1gbit, 1mb at 10gbit).
        """
        rate = self.rate or 0
        return max(32 * 1024, rate // 8 // 1000)
