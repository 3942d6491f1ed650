"""Emulated cluster without root: rates, names, subnets, the ip/tc commands, records, errors."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from scaledl.bootstrap import HOSTNAME_ENV, host_name
from scaledl.cluster import netns, state
from scaledl.cluster.spec import MAX_RATE, SHAPERS, ClusterSpec, format_rate, parse_rate


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "clusters"
    monkeypatch.setenv(state.STATE_ENV, str(directory))
    monkeypatch.setattr(state, "DIRECTORIES_FILE", str(tmp_path / "record-dirs"))
    return directory


@pytest.mark.parametrize(("text", "bits"), [
    ("1gbit", 10**9), ("10Gbit", 10**10), ("100mbit", 10**8), ("2.5gbit", 25 * 10**8),
    ("500kbit", 5 * 10**5), ("none", None), ("8kbit", 8000), ("5tbit", 5 * 10**12),
])
def test_parse_rate(text: str, bits: int | None) -> None:
    assert parse_rate(text) == bits
    if bits is not None:
        assert parse_rate(format_rate(bits)) == bits


@pytest.mark.parametrize("text", ["1g", "fast", "-1gbit", "1 gbps", "", "0", "0gbit"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a rate.*'none' for an unshaped link"):
        parse_rate(text)


@pytest.mark.parametrize("text", ["100tbit", "34tbit", "6tbit", "7kbit", "1bit"])
def test_parse_rate_rejects_rates_tc_cannot_shape(text: str) -> None:
    with pytest.raises(ValueError, match=f"link rate '{text}' is out of range; tc shapes links "
                                         "from 8kbit to 5tbit"):
        parse_rate(text)
    with pytest.raises(ValueError, match="out of range"):
        ClusterSpec("a", 2, 100 * 10**12, 0)


@pytest.mark.parametrize("shaper", SHAPERS)
def test_every_tc_byte_count_at_the_fastest_rate_fits_tc(shaper: str) -> None:
    """tc refuses a limit or burst beyond 2**32 - 1 bytes (34tbit failed mid-build)."""
    spec = ClusterSpec("a", 2, MAX_RATE, 0, shaper)
    for host_side in (False, True):
        words = [w for c in spec.shape_commands("ns", "eth0", host_side) for w in c]
        counts = [int(w[:-1]) for w in words if w.endswith("b") and w[:-1].isdigit()]
        assert counts and max(counts) <= 2**32 - 1, words


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="cluster name"):
        ClusterSpec("Bad_Name", 2, 10**9, 0)
    with pytest.raises(ValueError, match="--hosts 0"):
        ClusterSpec("a", 0, 10**9, 0)
    with pytest.raises(ValueError, match="--hosts 65"):
        ClusterSpec("a", 65, 10**9, 0)
    with pytest.raises(ValueError, match="--shaper 'netem'"):
        ClusterSpec("a", 2, 10**9, 0, shaper="netem")


def test_names_and_addresses() -> None:
    spec = ClusterSpec("lab1", 3, 10**9, 7)
    assert spec.namespaces == ["scaledl-lab1-sw", "scaledl-lab1-h0", "scaledl-lab1-h1",
                               "scaledl-lab1-h2"]
    assert [spec.address(h) for h in range(3)] == ["10.231.7.1", "10.231.7.2", "10.231.7.3"]
    with pytest.raises(ValueError, match="host 3 does not exist"):
        spec.address(3)


def test_create_commands_shape_both_directions_and_stay_out_of_the_root_namespace() -> None:
    spec = ClusterSpec("lab1", 2, 10**9, 0)
    commands = spec.create_commands()
    assert commands[0] == ["ip", "netns", "add", "scaledl-lab1-sw"]
    veths = [c for c in commands if "veth" in c]
    assert veths == [
        ["ip", "link", "add", "eth0", "netns", f"scaledl-lab1-h{h}", "type", "veth", "peer",
         "name", f"p{h}", "netns", "scaledl-lab1-sw"] for h in range(2)]
    shaped = {(c[2], c[6]) for c in commands if c[0] == "tc"}
    assert shaped == {("scaledl-lab1-h0", "eth0"), ("scaledl-lab1-h1", "eth0"),
                      ("scaledl-lab1-sw", "p0"), ("scaledl-lab1-sw", "p1")}
    tbf = next(c for c in commands if c[0] == "tc")
    assert tbf[tbf.index("rate") + 1] == "1000000000bit"
    assert tbf[tbf.index("burst") + 1] == "125000b"  # 1 ms at 1 Gbit/s
    assert ["ip", "-n", "scaledl-lab1-h1", "link", "set", "lo", "up"] in commands
    every_link_command_names_a_namespace = all(
        "-n" in c or c[:3] == ["ip", "netns", "add"] or "netns" in c for c in commands)
    assert every_link_command_names_a_namespace


def test_htb_and_unshaped_commands() -> None:
    htb = ClusterSpec("a", 1, 10**10, 0, shaper="htb").create_commands()
    classes = [c for c in htb if c[:2] == ["tc", "-n"] and "class" in c]
    assert len(classes) == 2 and classes[0][classes[0].index("rate") + 1] == "10000000000bit"
    assert ClusterSpec("a", 1, 10**10, 0).burst_bytes == 1_250_000
    assert not [c for c in ClusterSpec("a", 2, None, 0).create_commands() if c[0] == "tc"]


def test_allocate_unique_names_and_subnets() -> None:
    first = state.allocate(2, 10**9, "tbf", None, ephemeral=False)
    second = state.allocate(2, 10**9, "tbf", None, ephemeral=True)
    assert first.spec.name != second.spec.name
    assert {first.spec.subnet, second.spec.subnet} == {0, 1}
    assert [r.spec.name for r in state.load_all()] == [first.spec.name, second.spec.name]
    named = state.allocate(3, None, "htb", "lab1", ephemeral=False)
    assert state.load("lab1") == named
    with pytest.raises(ValueError, match="'lab1' is taken"):
        state.allocate(2, None, "tbf", "lab1", ephemeral=False)
    with pytest.raises(ValueError, match="'lab2' is taken"):
        state.allocate(2, None, "tbf", "lab2", False, taken_namespaces={"scaledl-lab2-h0"})
    state.remove(first.spec.name)
    assert state.allocate(2, None, "tbf", None, False).spec.subnet == 0  # freed subnet reused
    with pytest.raises(ValueError, match="no cluster named 'nope'"):
        state.load("nope")


def test_stale_records() -> None:
    record = state.allocate(2, None, "tbf", "eph", ephemeral=True)
    assert not record.stale  # this process owns it
    dead = subprocess.Popen(["true"])
    dead.wait()
    record.owner_pid = dead.pid
    assert record.stale
    record.ephemeral, record.status = False, "up"
    assert not record.stale  # a kept cluster outlives its creator


def test_preflight_errors() -> None:
    with pytest.raises(ValueError, match=r"needs root .*effective uid is 1000"):
        netns.preflight(euid=1000)
    with pytest.raises(ValueError, match="needs iproute2, but tc is not on PATH"):
        netns.preflight(euid=0, which=lambda tool: None if tool == "tc" else "/sbin/" + tool)
    netns.preflight(euid=0, which=lambda tool: "/sbin/" + tool)


class FakeIp:
    """Records commands; tracks namespaces; fails the command containing ``fail_on``."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.commands: list[list[str]] = []
        self.namespaces: set[str] = set()
        self.fail_on = fail_on

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = list(command)
        self.commands.append(command)
        if self.fail_on is not None and self.fail_on in command:
            return subprocess.CompletedProcess(command, 2, "", "RTNETLINK answers: boom")
        if command[:3] == ["ip", "netns", "add"]:
            self.namespaces.add(command[3])
        elif command[:3] == ["ip", "netns", "del"]:
            self.namespaces.discard(command[3])
        stdout = "\n".join(sorted(self.namespaces)) if command == ["ip", "netns", "list"] else ""
        return subprocess.CompletedProcess(command, 0, stdout, "")


def test_create_and_destroy_with_fake_ip() -> None:
    ip = FakeIp()
    record = netns.create(2, 10**9, "tbf", "lab1", runner=ip)
    assert record.status == "up" and state.load("lab1").status == "up"
    assert ip.namespaces == set(record.spec.namespaces)
    assert netns.destroy(record.spec, runner=ip) == list(reversed(record.spec.namespaces))
    assert not ip.namespaces and not state.load_all()
    assert netns.destroy(record.spec, runner=ip) == []  # idempotent


def test_failed_create_tears_down_and_says_what_failed() -> None:
    ip = FakeIp(fail_on="tbf")
    with pytest.raises(netns.CommandError, match="tbf .* failed .*RTNETLINK answers: boom"):
        netns.create(2, 10**9, "tbf", "lab1", runner=ip)
    assert not ip.namespaces and not state.load_all()


def test_command_error_is_one_line_value_error() -> None:
    def ip(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(command), 1, "", "Error: bad\nUsage: tc ...\n")

    with pytest.raises(ValueError) as error:
        netns.existing_namespaces(ip)
    assert isinstance(error.value, netns.CommandError)
    assert str(error.value) == "'ip netns list' failed (1): Error: bad; Usage: tc ..."


def test_orphans_exclude_namespaces_recorded_in_other_directories(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ip = FakeIp()
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path / "other"))
    netns.create(1, None, "tbf", "theirs", runner=ip)
    monkeypatch.setenv(state.STATE_ENV, str(tmp_path / "mine"))
    ip.namespaces.add("scaledl-stray-h0")
    assert netns.orphan_namespaces(ip) == ["scaledl-stray-h0"]
    assert state.load_all() == []  # 'down --all' here touches no record of the other directory


def test_link_counters_parse_ip_json() -> None:
    spec = ClusterSpec("a", 1, None, 0)

    def ip(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        link = '{"ifname":"%s","stats64":{"rx":{"bytes":%d},"tx":{"bytes":%d}}}'
        out = "[" + link % ("lo", 5, 6) + "," + link % ("eth0", 7, 8) + "]"
        return subprocess.CompletedProcess(list(command), 0, out, "")

    assert netns.link_counters(spec, ip) == {
        "h0": {"lo_rx": 5, "lo_tx": 6, "eth0_rx": 7, "eth0_tx": 8}}


def test_hostname_override(monkeypatch: pytest.MonkeyPatch) -> None:
    assert host_name({HOSTNAME_ENV: "lab1-h3"}) == "lab1-h3"
    assert host_name({}) == os.uname().nodename


@pytest.mark.parametrize("rate, host_limit", [
    (10**8, 1_514_000), (10**9, 1_514_000), (10**10, 6_250_000 + 1_250_000)])
def test_a_hosts_interface_queues_like_a_nic_and_a_switch_port_5_ms(rate: int,
                                                                    host_limit: int) -> None:
    """A 5 ms host queue at 100 Mbit/s (95 kB) dropped a quarter of the packets of three flows
    leaving one host (tc -s qdisc: 17,302 of 68k) and stalled them in retransmissions; a NIC's
    1000-frame queue pushes back on the sockets instead.  The switch ports keep 5 ms, and no
    host queue is shallower than before (10 Gbit/s: 5 ms plus the burst, as tbf computes it)."""
    commands = ClusterSpec("lab1", 2, rate, 0).create_commands()
    tbfs = {c[2]: c for c in commands if c[0] == "tc" and c[6] in ("eth0", "p0")}
    host, port = tbfs["scaledl-lab1-h0"], tbfs["scaledl-lab1-sw"]
    assert host[host.index("limit") + 1] == f"{host_limit}b" and "latency" not in host
    assert port[port.index("latency") + 1] == "5ms" and "limit" not in port
