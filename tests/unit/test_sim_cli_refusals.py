"""What ``scaledl simulate`` refuses, and how it writes: every option it would ignore or could
not honour is one ``scaledl: error:`` line with exit code 2 and nothing on stdout, and its
output files are written whole or not at all (``scaledl.files.write_files``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.files import write_files
from tests.helpers_cli import one_error


MLP_PROFILE = str(Path(__file__).resolve().parents[2] / "benchmarks" / "sim_validation" / "raw"
                  / "profile-mlp.json")
"""A CPU profile this project measured (the MLP on the 2-core VM)."""


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return one_error(capsys)


@pytest.mark.parametrize("options,message", [
    (["--bucket-mb", "inf"], "--bucket-mb inf must be a finite number of MiB"),
    (["--bucket-mb", "nan"], "--bucket-mb nan must be"),
    (["--bucket-mb", "1e-300"], "at least one byte"),
    (["--inter-latency", "inf"], "--inter-latency inf must be a finite number of microseconds"),
    (["--intra-latency", "-1"], "--intra-latency -1.0 must be"),
    (["--gpus", "8192", "--topology", "8x1024"], "--gpus 8192 is beyond what the replay"),
    (["--ideal", "--input-rate", "10"], "--input-rate 10.0 does not apply to --ideal"),
    (["--ideal", "--stack", "horovod", "--cycle-ms", "500"], "--cycle-ms 500.0 does not apply"),
    (["--tau", "5"], "--tau 5 applies to the EASGD strategies"),
    (["--topology", ""], "topology '' is not a list of positive integers"),
    (["--topology", "", "--gpus", "4"], "topology '' is not a list of positive integers"),
    (["--ideal", "--device", "cpu", "--cores", "2"], "--cores 2 does not apply to --ideal"),
    (["--ideal", "--socket-bandwidth", "2"], "--socket-bandwidth 2.0 does not apply to --ideal"),
    (["--device", "p100", "--gpus", "16", "--cores", "2"],
     "--cores 2 prices ranks that share one machine's CPU cores"),
    (["--calibration", "c.json", "--intra", "nvlink2"],
     "--intra nvlink2 names a preset link, and --calibration c.json replaces the links"),
    (["--calibration", "c.json", "--uplink", "10gbe", "--topology", "2x2x2", "--gpus", "8"],
     "--uplink 10gbe names a preset link"),
    (["--strategy", "easgd", "--stack", "horovod", "--cycle-ms", "50"],
     "--cycle-ms 50.0 shapes allreduce's gradient reductions, and easgd has none of them"),
    (["--strategy", "reduce-broadcast", "--bucket-mb", "1"], "--bucket-mb 1.0 shapes"),
    (["--strategy", "sync-easgd", "--stack", "horovod", "--fusion-mb", "8"], "--fusion-mb 8.0"),
    (["--stack", "horovod", "--bucket-mb", "1"],
     "--bucket-mb 1.0: stack 'horovod' fuses gradients in its fusion buffer instead of buckets"),
    (["--profile", MLP_PROFILE, "--ideal"],
     "--ideal prices FLOPs at a constant rate and would not read the profile"),
    (["--profile", MLP_PROFILE, "--device", "knl"],
     "--device knl but the profile"),
])
def test_options_the_model_would_ignore_or_cannot_take_are_refused(
        options: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in _refused(["simulate", *options], capsys)


def test_reduce_broadcast_defaults_to_a_rooted_algorithm(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A ring reduces to no root: without --algorithm, reduce-broadcast runs on a tree."""
    assert main(["simulate", "--strategy", "reduce-broadcast", "--gpus", "8"]) == 0
    assert "reduce-broadcast/tree" in capsys.readouterr().out


@pytest.mark.parametrize("argv,option", [
    (["simulate", "--json", "x.json", "--model", "nosuch", "reproduce"], "--model"),
    (["simulate", "--gpus", "64", "profile", "--model", "mlp"], "--gpus"),
    (["simulate", "--mixed-precision", "profile", "--model", "mlp"], "--mixed-precision"),
    (["simulate", "--sweep", "--device", "cpu", "calibrate", "b.json"], "--sweep"),
    (["simulate", "--gpus", "64", "validate", "b.json"], "--gpus"),
])
def test_actions_refuse_prediction_options_they_would_ignore(
        argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(argv, capsys)
    assert f"{option} does not apply to `simulate" in err and "drop it" in err


def test_one_path_for_the_sweeps_json_and_plot_is_refused_before_it_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = tmp_path / "s.json"
    assert "both name" in _refused(["simulate", "--sweep", "--gpus", "16", "--json", str(same),
                                    "--plot", str(same)], capsys)
    png = tmp_path / "s.png"  # the plot's default is the JSON's name with .png
    assert "both name" in _refused(["simulate", "--sweep", "--gpus", "16", "--json", str(png)],
                                   capsys)
    assert list(tmp_path.iterdir()) == []


def test_an_output_under_a_regular_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    assert "which is a file" in _refused(["simulate", "--json", str(tmp_path / "f" / "x.json")],
                                         capsys)


@pytest.mark.skipif(not os.access("/dev/full", os.W_OK), reason="needs /dev/full")
def test_a_failed_write_keeps_the_older_output_and_leaves_nothing_behind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plot cannot be written (a full device): the sweep's JSON is not left half-done, an
    older JSON at its path survives, and no temporary file stays beside it."""
    old = tmp_path / "keep.json"
    old.write_text("old\n")
    err = _refused(["simulate", "--sweep", "--gpus", "16", "--json", str(old), "--plot",
                    "/dev/full"], capsys)
    assert "cannot write /dev/full" in err
    assert old.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["keep.json"]
    assert "cannot write /dev/full" in _refused(["simulate", "--json", "/dev/full"], capsys)


def test_write_files_writes_all_or_none(tmp_path: Path) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "sub" / "b.txt"

    def broken(path: Path) -> None:
        path.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(ValueError, match=r"cannot write .*b.txt: No space left on device"):
        write_files([(first, lambda p: p.write_text("a")), (second, broken)])
    assert not first.exists() and list((tmp_path / "sub").iterdir()) == []
    write_files([(first, lambda p: p.write_text("a")), (second, lambda p: p.write_text("b"))])
    assert first.read_text() == "a" and second.read_text() == "b"
    plain = tmp_path / "plain"
    plain.write_text("")  # the mode a file created there gets
    assert first.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_reproduce_refuses_an_unwritable_errors_file_before_it_predicts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    err = _refused(["simulate", "reproduce", "--write-errors", str(tmp_path / "f" / "e.json")],
                   capsys)
    assert "--write-errors" in err and "which is a file" in err


@pytest.mark.skipif(not os.access("/dev/full", os.W_OK), reason="needs /dev/full")
def test_calibrate_reports_a_failed_write_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = Path(__file__).parents[2] / "benchmarks/cluster/allreduce-2h2r-1gbit-block-run1.json"
    assert main(["simulate", "--device", "cpu", "--network", "1gbit", "calibrate", str(bench),
                 "-o", "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "scaledl: error: cannot write /dev/full: No space left on device; " \
                          "nothing was written: free space there or choose another path"


@pytest.mark.parametrize("options,message", [
    (["--gpus", "12", "--topology", "4x3", "--algorithm", "shm"],
     "spans 3 hosts; use ring, tree, ..., or shm inside a level"),
    (["--gpus", "64", "--topology", "4x16", "--uplink", "100mbit"], "has no two racks"),
    (["--gpus", "64", "--topology", "4x16", "--oversubscription", "4"], "has no two racks"),
    (["--gpus", "4", "--topology", "4x1x1", "--uplink", "10gbe", "--oversubscription", "8"],
     "topology 4x1x1 has no two racks"),
    (["--gpus", "4", "--network", "10gbe", "--inter-bandwidth", "0.001"],
     "--inter-bandwidth 0.001 prices the links between hosts, and topology 4 is one host"),
    (["--gpus", "8", "--topology", "8x1", "--inter-latency", "100000"], "is one host"),
    (["--gpus", "16", "--network", "ib-edr", "--socket-bandwidth", "0.01"],
     "--socket-bandwidth 0.01 prices bytes through TCP sockets, and p100 GPUs on ib-edr"),
    (["--gpus", "16", "--compute-time", "0.1", "--device-efficiency", "0.1"],
     "--device-efficiency 0.1 prices compute from FLOPs, and --compute-time gives it"),
])
def test_options_the_topology_cannot_honour_are_refused(
        options: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Shared memory between hosts priced like one host's, and rack options on a cluster
    without racks, used to give the same answer on every network."""
    assert message in _refused(["simulate", *options], capsys)


@pytest.mark.parametrize("options,message", [
    (["--strategy", "reduce-broadcast", "--no-overlap"], "--no-overlap does not apply to reduce"),
    (["--strategy", "easgd", "--no-overlap"], "--no-overlap does not apply to easgd"),
    (["--strategy", "sync-easgd", "--allreduce-dtype", "float16"], "exchanges weights"),
])
def test_options_a_strategy_has_no_use_for_are_refused(
        options: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in _refused(["simulate", *options], capsys)


def test_a_cpu_preset_runs_ranks_not_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--device", "knl", "--gpus", "8", "--topology", "4x2"]) == 0
    assert "resnet50 x 8 knl ranks," in capsys.readouterr().out


def test_the_published_check_is_allreduces_only(capsys: pytest.CaptureFixture[str]) -> None:
    """Every published efficiency point is an allreduce job: a prediction of another strategy
    has none to be checked against, and says so rather than borrow allreduce's."""
    args = ["simulate", "--gpus", "16", "--device", "v100", "--compute-time", "0.1"]
    assert main([*args, "--strategy", "easgd"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "published check      none for easgd: every published efficiency point is an allreduce "
        "job (docs/simulation.md)")
    assert main(args) == 0
    assert "published points like this one" in capsys.readouterr().out


def test_one_ranks_update_is_not_stretched_by_shared_cores(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The one-rank baseline has a core of its own, and so does the update it includes."""
    args = ["simulate", "--profile", MLP_PROFILE, "--gpus", "2", "--batch", "64", "--network",
            "1gbit"]
    assert main(args) == 0
    alone = capsys.readouterr().out.splitlines()[2]
    assert main([*args, "--cores", "1"]) == 0
    shared = capsys.readouterr().out.splitlines()[2]
    assert alone.split("(one rank: ")[1] == shared.split("(one rank: ")[1]


@pytest.mark.parametrize("argv,flag", [
    (["simulate", "--model", "mlp", "profile", "--model", "lenet"], "--model"),
    (["simulate", "--input-shape", "1x28x28", "profile", "--model", "lenet", "--input-shape",
      "1x32x32"], "--input-shape"),
])
def test_profile_refuses_two_different_values_of_one_option(
        argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the one after `profile` won and the other was silently ignored."""
    err = _refused([*argv, "-o", str(tmp_path / "p.json")], capsys)
    assert f"give {flag} once" in err
    assert list(tmp_path.iterdir()) == []
