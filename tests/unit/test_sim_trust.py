"""How ``scaledl simulate`` says how far to trust a prediction: the model's errors on the
published points most like it (:mod:`scaledl.sim.trust`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scaledl.cli.main import main
from scaledl.cli.simulate_report import format_band
from scaledl.sim.reproduce import published_cases
from scaledl.sim.job import Job
from scaledl.sim.trust import (
    MINIMUM,
    Band,
    PublishedError,
    Traits,
    band,
    load_errors,
    trait_table,
    traits,
    write_errors,
)

V100_BERT = Traits("v100", "transformer", "mixed", "several hosts")


def _points(n: int, like: Traits, error: float = 1.0, published: float = 0.9
            ) -> list[PublishedError]:
    return [PublishedError(f"{like} {i}", published, error + i, like) for i in range(n)]


def test_traits_read_the_gpu_generation_model_precision_and_hosts() -> None:
    job = Job(model="bert_large", device="a100-80gb", gpus=16, topology="8x2",
              network="ib-hdr-x8", mixed_precision=True)
    assert traits(job) == Traits("a100", "transformer", "mixed", "several hosts")
    one = Job(model="resnet50", device="v100", gpus=8, topology="8", network="ib-edr")
    assert traits(one) == Traits("v100", "convolutional", "full", "one host")


def test_a_network_that_joins_gpus_of_one_host_keeps_the_job_on_one_host() -> None:
    """The P100 DGX-1's staged hops are a second axis of one machine, not a second host."""
    job = Job(model="vgg16", device="p100", gpus=8, topology="4x2",
              network="dgx1-p100-staged", intra="nvlink1-dgx1")
    assert traits(job).reach == "one host"


def test_all_four_traits_are_kept_when_enough_points_share_them() -> None:
    job = Job(model="bert_large", device="v100", gpus=32, topology="16x2", mixed_precision=True)
    points = _points(MINIMUM, V100_BERT) + _points(20, replace(V100_BERT, gpu="a100"),
                                                   error=50.0)
    found = band(job, points)
    assert found is not None and found.kept == ("gpu", "kind", "precision", "reach")
    assert found.errors == tuple(1.0 + i for i in range(MINIMUM))
    assert found.median == pytest.approx(1.0 + (MINIMUM - 1) / 2)


def test_the_gpu_then_the_reach_then_the_precision_are_dropped_until_enough_points_match(
        ) -> None:
    job = Job(model="bert_large", device="h100", gpus=32, topology="16x2", mixed_precision=True)
    a100 = Traits("a100", "transformer", "mixed", "several hosts")
    one_host = replace(a100, reach="one host")
    full = replace(a100, precision="full")
    found = band(job, _points(MINIMUM - 1, a100) + _points(1, one_host, error=9.0))
    assert found is not None and found.kept == ("kind", "precision")
    assert len(found.errors) == MINIMUM and found.exact == ()  # no h100 point at all
    assert found.traits.describe(found.kept) == "transformer, mixed precision"
    wider = band(job, _points(MINIMUM - 1, a100) + _points(1, full, error=9.0))
    assert wider is not None and wider.kept == ("kind",)
    only_gpu = band(job, _points(MINIMUM, a100))
    assert only_gpu is not None and only_gpu.kept == ("kind", "precision", "reach")


def test_a_widened_band_keeps_the_few_exact_matches_beside_it() -> None:
    """Four points share every trait and all missed: the band widens to enough points but must
    not hide them (and the CLI prints them on their own line)."""
    job = Job(model="resnet50", device="a100", gpus=32, topology="8x4", network="ib-hdr-x8",
              mixed_precision=True)
    exact = _points(4, Traits("a100", "convolutional", "mixed", "several hosts"), error=6.0)
    other = _points(MINIMUM, Traits("p100", "convolutional", "mixed", "several hosts"),
                    error=0.0)
    found = band(job, exact + other)
    assert found is not None and found.kept == ("kind", "precision", "reach")
    assert found.exact == (6.0, 7.0, 8.0, 9.0) and len(found.errors) == MINIMUM + 4
    lines = format_band(found, 0.9, "a100").splitlines()
    assert lines[2].split(":")[0].split() == ["exact", "matches", "a100,", "convolutional,",
                                              "several", "hosts,", "mixed", "precision"]
    assert lines[2].endswith("0 of 4 within 5 pt")
    assert found.to_dict()["exact_match_errors_points"] == [6.0, 7.0, 8.0, 9.0]


def test_with_too_few_points_of_any_kind_the_band_rests_on_them_all() -> None:
    job = Job(model="resnet50", device="v100", gpus=8, topology="8")
    points = _points(3, V100_BERT)
    found = band(job, points)
    assert found is not None and found.kept == () and len(found.errors) == 3
    assert found.traits.describe(()) == "any GPU"
    with pytest.raises(ValueError, match="no published errors"):
        band(job, [])


def test_a_multilayer_perceptron_is_its_own_kind() -> None:
    """No published point is an MLP: its band rests on every point, not on the CNNs'."""
    job = Job(model="mlp", device="v100", gpus=8, topology="8")
    assert traits(job).kind == "multilayer perceptron"
    conv = _points(MINIMUM, Traits("v100", "convolutional", "full", "one host"))
    found = band(job, conv)
    assert found is not None and found.kept == ()


def test_jobs_off_gpus_have_no_published_band() -> None:
    job = Job(model="resnet20", device="cpu", gpus=4, topology="2x2", network="1gbit")
    assert band(job, _points(MINIMUM, V100_BERT)) is None
    assert band(replace(job, device="knl"), _points(MINIMUM, V100_BERT)) is None
    assert "none on cpu (every published point is on GPUs): see" in format_band(None, 0.5, "cpu")
    assert format_band(None, 0.5, "knl").endswith("none on knl (every published point is on GPUs)")


def test_within_counts_the_points_inside_the_target_and_covers_the_published_range() -> None:
    found = Band(("gpu",), V100_BERT, (-6.0, -5.0, 0.0, 4.9, 5.1), (0.70, 0.95))
    assert found.within == 3
    assert found.covers(0.66) and found.covers(0.99) and not found.covers(0.60)
    lines = format_band(found, 0.60, "v100").splitlines()
    assert lines[1].split() == ["error", "median", "+0.0", "pt", "(-6.0", "to", "+5.1),", "3",
                                "of", "5", "within", "5", "pt;", "docs/simulation.md"]
    assert "70.0%-95.0% of linear, so they say little of 60.0%" in lines[2]
    assert len(format_band(found, 0.80, "v100").splitlines()) == 2


def test_the_errors_round_trip_through_their_file(tmp_path: Path) -> None:
    points = _points(3, V100_BERT, error=-2.5, published=0.875)
    write_errors(points, tmp_path / "errors.json")
    assert load_errors(tmp_path / "errors.json") == points


def test_the_shipped_errors_load_and_every_trait_is_one_the_matcher_knows() -> None:
    shipped = load_errors()
    assert len(shipped) == sum(case.metric == "efficiency" for case in published_cases())
    assert {e.traits.kind for e in shipped} == {"transformer", "convolutional"}
    assert {e.traits.precision for e in shipped} == {"mixed", "full"}
    assert {e.traits.reach for e in shipped} == {"one host", "several hosts"}
    assert {e.traits.gpu for e in shipped} <= {"k80", "p100", "v100", "a100"}
    assert all(0 < e.published <= 1 for e in shipped)


def test_simulate_prints_the_band_and_writes_it_to_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    assert main(["simulate", "--model", "resnet50", "--device", "v100", "--gpus", "16",
                 "--topology", "8x2", "--network", "ib-edr-x4", "--intra", "nvlink2",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "published points like this one (" in printed
    assert "convolutional, several hosts, full precision)" in printed
    assert "this one the v100 preset's estimate (--compute-time, --profile)" in printed
    check = json.loads(out.read_text())["published_check"]
    expected = band(Job(model="resnet50", device="v100", gpus=16, topology="8x2",
                        network="ib-edr-x4", intra="nvlink2"))
    assert expected is not None and check == json.loads(json.dumps(expected.to_dict()))
    assert check["points"] >= MINIMUM
    assert main(["simulate", "--model", "resnet50", "--device", "v100", "--compute-time",
                 "0.1"]) == 0
    printed = capsys.readouterr().out
    assert "published check" in printed and "preset's estimate" not in printed
    assert main(["simulate", "--model", "resnet50", "--ideal"]) == 0
    assert "published check" not in capsys.readouterr().out


def test_the_trait_table_groups_by_all_four_traits_oldest_gpu_first() -> None:
    a100 = replace(V100_BERT, gpu="a100")
    points = _points(2, a100, error=-1.0, published=0.8) + _points(3, V100_BERT, error=4.0)
    lines = trait_table(points).splitlines()
    assert len(lines) == 4
    assert lines[2] == ("| v100 | transformer | several hosts | mixed | 3 | 2 | +5.0 pt | "
                        "+4.0 to +6.0 pt | 90.0%-90.0% |")
    assert lines[3].startswith("| a100 | transformer | several hosts | mixed | 2 | 2 | -0.5 pt")
