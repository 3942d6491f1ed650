"""The peers of ``scaledl bench collectives --peers``: names, skipped peers' messages, the table."""

from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from scaledl.bench import peers
from scaledl.calibration.bench_file import (
    BenchReport, CopyBound, Measurement, peer_rows, report_from_dict)
from scaledl.cli.bench_collectives import render_peers


def test_parse_peers_keeps_order_and_names_an_unknown_one() -> None:
    assert peers.parse_peers("gloo, mpi,gloo") == ("gloo", "mpi")
    assert peers.parse_peers(None) == ()
    with pytest.raises(ValueError, match="unknown peer 'nccl' in --peers; choose from: mpi"):
        peers.parse_peers("gloo,nccl")


def _without(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == missing else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(("name", "words"), [
    ("mpi", "mpi4py is not installed (pip install torch==2.13.0 -e '.[peers]'"),
    ("deepspeed", "deepspeed is not installed (pip install torch==2.13.0 -e '.[peers]'"),
])
def test_a_missing_peer_is_one_line_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, name: str, words: str
) -> None:
    _without(monkeypatch, {"mpi": "mpi4py", "deepspeed": "deepspeed"}[name])
    opened, skipped = peers.open_peers((name,), one_host=True)
    assert opened == []
    assert len(skipped) == 1 and "\n" not in skipped[0]
    assert skipped[0].startswith(f"peer {name} skipped: ") and words in skipped[0]


def test_mpi_outside_mpiexec_and_deepspeed_across_hosts_say_why(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    real = importlib.util.find_spec
    installed = ModuleType("installed")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: installed if name in ("mpi4py", "deepspeed")
                        else real(name, package))
    opened, skipped = peers.open_peers(("mpi", "deepspeed"), one_host=False)
    assert opened == []
    assert "not launched by mpirun/mpiexec; run e.g. mpiexec -n 2" in skipped[0]
    assert "needs every rank on one host" in skipped[1]


def test_deepspeed_segment_is_the_file_deepspeeds_op_creates(tmp_path: Path) -> None:
    """DeepSpeed's CPU op names its shared memory ``deepspeed_allreduce_buffer`` + ``_<uid>_
    <MASTER_ADDR>_<MASTER_PORT>`` + ``_<rank>`` and never unlinks it; the bench removes its
    own rank's file by that name.  Where DeepSpeed is installed its source is read, so a
    release that renames the file fails here, not silently in /dev/shm."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"}
    segment = peers.deepspeed_segment(1, env, tmp_path)
    assert segment == tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29512_1"
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return
    source = Path(spec.origin).parent / "ops" / "csrc" / "cpu" / "comm" / "shm.cpp"
    text = " ".join(source.read_text().split())
    assert '#define SHM_BUFFER_NAME "deepspeed_allreduce_buffer"' in text
    assert '"%s_%d_%s_%s", SHM_BUFFER_NAME, getuid(), addr_string, port_string);' in text
    assert 'snprintf(shm_name, NAME_BUF_SIZE, "%s_%d", shm_name_prefix, rank);' in text
    interface = " ".join((source.parent / "shm_interface.cpp").read_text().split())
    assert 'auto addr_string = std::getenv("MASTER_ADDR");' in interface
    assert 'auto port_string = std::getenv("MASTER_PORT");' in interface


def _report() -> BenchReport:
    def m(name: str, us: float, nbytes: int = 1 << 20, peer: bool = False) -> Measurement:
        return Measurement("allreduce", name, nbytes, 2, (us * 1e-6,) * 3,
                           "shm" if name == "auto" else name, peer)

    measurements = [m("shm", 100.0), m("auto", 80.0), m("mpi", 120.0, peer=True),
                    m("gloo", 400.0, peer=True), m("shm", 10.0, 4096)]
    copy = CopyBound(1 << 20, 2, 50e-6, 100e-6)
    return BenchReport({}, {}, measurements, copies=[copy], peers={"mpi": "Open MPI v5"})


def test_peer_rows_ratio_and_bound() -> None:
    report = _report()
    rows = peer_rows(report.measurements, report.copies)
    assert [(r["algorithm"], r["nbytes"]) for r in rows] == [("shm", 1 << 20), ("auto", 1 << 20)]
    shm = rows[0]
    assert shm["vs"] == pytest.approx({"mpi": 1.2, "gloo": 4.0})
    # the bound: two copies of 1 MiB on every rank at once, 100 us each -> 200 us
    assert report.copies[0].allreduce_busbw_gbps == pytest.approx((1 << 20) / 200e-6 / 1e9)
    assert shm["bound_fraction"] == pytest.approx(2.0)  # 100 us against a bound of 200 us
    assert report.copies[0].all_ranks_gbps == pytest.approx(2 * (1 << 20) / 100e-6 / 1e9)
    again = report_from_dict(report.to_dict())
    reread = peer_rows(again.measurements, again.copies)  # the JSON keeps peers and copies
    assert [r["algorithm"] for r in reread] == ["shm", "auto"]
    assert reread[0]["vs"] == pytest.approx(shm["vs"])
    assert reread[0]["bound_fraction"] == pytest.approx(2.0)


def test_peer_rows_on_one_rank_have_no_bound() -> None:
    """One rank moves nothing, so busbw and its bound are 0: the fraction is left out rather
    than dividing by zero after the whole run was measured."""
    measurements = [Measurement("allreduce", name, 4096, 1, (2e-6,) * 3, name, name == "gloo")
                    for name in ("shm", "gloo")]
    rows = peer_rows(measurements, [CopyBound(4096, 1, 1e-6, 1e-6)])
    assert rows[0]["bound_fraction"] is None and rows[0]["vs"] == pytest.approx({"gloo": 1.0})


def test_render_peers_prints_the_ratio_columns() -> None:
    out = io.StringIO()
    render_peers(_report(), Console(file=out, width=220))
    text = out.getvalue()
    assert "peer mpi: Open MPI v5" in text
    assert "120.0 (1.20x)" in text and "400.0 (5.00x)" in text  # auto: 80 us
    assert "of bound" in text and "200%" in text


def test_render_peers_names_only_the_peers_that_were_timed() -> None:
    """A peer that timed nothing (DeepSpeed asked for int32, MPI for bfloat16) is not listed
    as if it had run."""
    report = _report()
    report.peers["deepspeed"] = "DeepSpeed 0.19.8 shm op"  # opened, but no row of its own
    out = io.StringIO()
    render_peers(report, Console(file=out, width=220))
    assert "peer mpi: Open MPI v5" in out.getvalue() and "deepspeed" not in out.getvalue()
