"""The published-points table of ``scaledl simulate reproduce``: its scoring, and every case
predicted with the same presets (docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scaledl.cli.simulate_report import family_table, reproduction_table
from scaledl.sim.scenario import bucket_bytes, job_losses, job_profile, resolve
from scaledl.sim.job import Job
from scaledl.sim.losses import stack
from scaledl.sim.reproduce import (
    Case,
    Prediction,
    Row,
    error,
    evaluate,
    idealised,
    mean_absolute_error,
    published_cases,
    published_families,
    within_target,
)
from scaledl.sim.trust import load_errors, published_errors, trait_table
from tests.unit import sim_golden

# The fixtures predict every case twice, ~70-90 s of CPU; one xdist worker runs the whole file
# (pyproject's --dist loadfile), so the other never repeats that work.
pytestmark = pytest.mark.timeout(600)

CASES = published_cases()
FAMILIES = published_families()
BY_NAME = {case.name: case for case in CASES}
APEX_BUCKET_MB = 10_000_000 * 4 / (1 << 20)
"""apex DDP's default message size, 10 million elements, as MiB of float32 gradients."""
DLE_LABELS = {"resnet50": "ResNet-50 v1.5", "resnext101_32x4d": "ResNeXt-101 32x4d",
              "nvidia_se_resnext101_32x4d": "SE-ResNeXt-101 32x4d",
              "efficientnet_b0": "EfficientNet-B0", "efficientnet_b4": "EfficientNet-B4"}
"""The names NVIDIA's image recipes give the models."""


def jobs(name: str) -> tuple[Job, Job]:
    """The case's base and job, as the full model prices them."""
    case = BY_NAME[name]
    assert case.base is not None and case.job is not None, name
    return case.base, case.job


LINEAR_SPEEDUP = {"S-Caffe, GoogLeNet, 32 -> 160 K80": 160 / 32}
"""The largest speedup each speedup case can have (GPUs after / before)."""


def test_error_is_points_for_fractions_and_relative_for_speedups() -> None:
    assert error("efficiency", 0.90, 0.93) == pytest.approx(3.0)
    assert error("share", 0.50, 0.45) == pytest.approx(-5.0)
    assert error("speedup", 2.5, 3.0) == pytest.approx(0.2)


def test_target_is_five_points_or_fifteen_percent_and_none_for_shares() -> None:
    assert within_target("efficiency", 5.0) and not within_target("efficiency", -5.01)
    assert within_target("speedup", -0.15) and not within_target("speedup", 0.151)
    assert within_target("share", 40.0) is None


def test_a_case_with_an_unknown_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="metric 'throughput'"):
        Case("x", "throughput", 1.0, "setup", "source", lambda ideal: Prediction(1.0, ""))


def test_every_case_names_its_setup_and_source_once() -> None:
    names = [case.name for case in CASES]
    assert len(set(names)) == len(names)
    for case in CASES:
        assert case.setup and case.source
        assert 0 < case.published <= (LINEAR_SPEEDUP.get(case.name, 1.0))


@pytest.fixture(scope="module")
def both_rows() -> tuple[list[Row], list[Row]]:
    """Every case predicted once with the full model and once with the ideal one, case by case,
    so that the second prediction finds the collectives the first one planned still in the
    simulator's shared plan cache."""
    full: list[Row] = []
    ideal: list[Row] = []
    for case in CASES:
        full.extend(evaluate((case,)))
        ideal.extend(evaluate((case,), ideal=True))
    return full, ideal


@pytest.fixture(scope="module")
def rows(both_rows: tuple[list[Row], list[Row]]) -> list[Row]:
    """Every case predicted with the full model, for the tests that read the whole table or one
    case's full prediction."""
    return both_rows[0]


@pytest.fixture(scope="module")
def ideal_rows(both_rows: tuple[list[Row], list[Row]]) -> list[Row]:
    """Every case predicted with the ideal model."""
    return both_rows[1]


def test_every_prediction_is_the_golden_records(rows: list[Row], ideal_rows: list[Row]) -> None:
    """Each case's published value, setup, source, full and ideal prediction (value, detail,
    job) and the tables printed are what tests/unit/sim_golden.json recorded: refactoring the
    simulator or moving the cases to data changes no prediction."""
    diffs = sim_golden.differences(sim_golden.load()["reproduction"],
                                   sim_golden.reproduction(rows, ideal_rows))
    assert not diffs, diffs[:5]


def full_prediction(rows: list[Row], case: Case) -> Prediction:
    """``case``'s prediction as ``rows`` have it (each case is predicted once per model)."""
    found = [row.prediction for row in rows if row.case is case]
    assert len(found) == 1, case.name
    return found[0]


@pytest.mark.parametrize("case", [c for c in CASES if c.metric != "share"],
                         ids=lambda case: case.name)
def test_no_case_is_predicted_above_linear_and_losses_never_help(
        rows: list[Row], ideal_rows: list[Row], case: Case) -> None:
    full, ideal = full_prediction(rows, case), full_prediction(ideal_rows, case)
    limit = LINEAR_SPEEDUP.get(case.name, 1.0)
    assert 0 < full.value <= limit + 1e-9
    assert 0 < ideal.value <= limit + 1e-9
    assert full.value <= ideal.value + 1e-9, "a loss term made the prediction better"
    assert full.detail


def test_the_table_prints_every_row_and_the_count_within_target() -> None:
    made_up = (
        Case("near", "efficiency", 0.90, "s1", "src1", lambda ideal: Prediction(0.93, "d1")),
        Case("far", "speedup", 2.0, "s2", "src2", lambda ideal: Prediction(3.0, "d2")),
        Case("share", "share", 0.5, "s3", "src3", lambda ideal: Prediction(0.2, "d3")),
    )
    table = reproduction_table(evaluate(made_up))
    assert "| near | 90.0% | 93.0% | +3.0 pt | yes | d1 | s1 | src1 |" in table
    assert "| far | 2.00x | 3.00x | +50% | **no** |" in table
    assert "| n/a (share) |" in table
    assert table.endswith("1 of 2 points within 5 points of efficiency (15% of a speedup); "
                          "mean absolute error 3.0 points over 1 efficiency point")


def test_the_mean_absolute_error_counts_efficiencies_only() -> None:
    cases = (
        Case("a", "efficiency", 0.90, "s", "src", lambda ideal: Prediction(0.93, "d")),
        Case("b", "efficiency", 0.80, "s", "src", lambda ideal: Prediction(0.75, "d")),
        Case("c", "speedup", 2.0, "s", "src", lambda ideal: Prediction(3.0, "d")),
        Case("d", "share", 0.5, "s", "src", lambda ideal: Prediction(0.1, "d")),
    )
    mae = mean_absolute_error(evaluate(cases))
    assert mae is not None
    assert mae[0] == pytest.approx(4.0) and mae[1] == 2
    assert mean_absolute_error(evaluate(cases[2:])) is None
    assert "mean absolute error" not in reproduction_table(evaluate(cases[2:]))


def test_each_source_is_summarised_by_its_scored_points() -> None:
    """Per family: points with a target, how many meet it, and the signed and absolute mean
    error of its efficiencies; a family of speedups has no mean, one of shares no row."""
    cases = (
        Case("a", "efficiency", 0.90, "s", "src", lambda ideal: Prediction(0.93, "d")),
        Case("b", "efficiency", 0.80, "s", "src", lambda ideal: Prediction(0.70, "d")),
        Case("c", "speedup", 2.0, "s", "src", lambda ideal: Prediction(2.2, "d")),
        Case("d", "share", 0.5, "s", "src", lambda ideal: Prediction(0.1, "d")),
    )
    table = family_table(evaluate(cases), (("two", cases[:2]), ("speedup", cases[2:3]),
                                           ("share", cases[3:])))
    assert table.splitlines()[2:] == ["| two | 2 | 1 | -3.5 pt | 6.5 pt |",
                                      "| speedup | 1 | 1 | - | - |"]


def test_the_families_hold_every_case_once_in_the_tables_order() -> None:
    assert tuple(case for _, cases in FAMILIES for case in cases) == CASES
    assert len({id(case) for case in CASES}) == len(CASES)
    assert len({family for family, _ in FAMILIES}) == len(FAMILIES)


def test_horovods_charts_run_with_rdma_and_its_tcp_point_is_below_them(rows: list[Row]) -> None:
    """Uber's announcement measured ResNet-101 and Inception V3 at 128 GPUs at 88% over TCP and
    above 90% with RDMA, so the charts' 90% points are RDMA runs; the model keeps that order."""
    by_name = {case.name: case for case in CASES}
    charts = [name for name in by_name if name.startswith("Horovod") and
              (" 128 GPUs" in name or " 512 GPUs" in name)]
    assert sorted(charts) == sorted([
        "Horovod, ResNet-101, 128 GPUs, TCP", "Horovod, ResNet-101, 128 GPUs, RDMA",
        "Horovod, VGG-16, 128 GPUs, RDMA", "Horovod, ResNet-101, 512 GPUs, RDMA",
        "Horovod, VGG-16, 512 GPUs, RDMA", "Horovod, Inception V3, 128 GPUs, TCP",
        "Horovod, Inception V3, 128 GPUs, RDMA", "Horovod, Inception V3, 512 GPUs, RDMA"])
    for model in ("ResNet-101", "Inception V3"):
        tcp = by_name[f"Horovod, {model}, 128 GPUs, TCP"]
        rdma = by_name[f"Horovod, {model}, 128 GPUs, RDMA"]
        assert tcp.published < rdma.published
        assert full_prediction(rows, tcp).value < full_prediction(rows, rdma).value


def test_the_dgx1_ring_of_nccl_1_crosses_host_memory_only_on_8_gpus() -> None:
    """NCCL 1.x rings the GPUs in device order; on a P100 DGX-1 the hops 3 -> 4 and 7 -> 0 have
    no NVLink, so the 8-GPU case is two NVLink groups joined by copies staged through host
    memory and costs more than a ring of NVLink alone, while 4 GPUs stay on NVLink."""
    _, eight = jobs("TensorFlow, VGG16, 8 P100 (DGX-1), batch 64")
    _, four = jobs("TensorFlow, VGG16, 4 P100 (DGX-1), batch 64")
    assert (eight.topology, eight.network, eight.intra) == ("4x2", "dgx1-p100-staged",
                                                            "nvlink1-dgx1")
    assert four.topology == "4"
    nvlink_only = replace(eight, topology="8")
    assert resolve(eight).run().communication_s > resolve(nvlink_only).run().communication_s


def test_ideal_horovod_jobs_bucket_at_the_stacks_fusion_size() -> None:
    """``--ideal`` has no negotiation cycle, so a Horovod job's buckets stand for its fusion
    buffer (64 MiB, or the job's ``fusion_mb``), which the ideal column of docs/simulation.md
    was computed with; DDP jobs keep their buckets."""
    cycle = stack("horovod").cycle
    assert cycle is not None
    for name in ("Horovod, VGG-16, 512 GPUs, RDMA",
                 "NVIDIA ResNet-50 v1.5 in TensorFlow, DGX-2, mixed precision"):
        job = idealised(jobs(name)[1], True)
        assert bucket_bytes(job) == cycle.fusion_bytes
        assert bucket_bytes(replace(job, fusion_mb=8.0)) == 8 << 20
    ddp = idealised(jobs("NVIDIA ResNet-50 v1.5, DGX A100, TF32")[1], True)
    assert bucket_bytes(ddp) == 25 << 20


def test_the_mxnet_recipe_runs_horovod_with_its_own_cycle() -> None:
    """The MXNet recipe's runner sets HOROVOD_CYCLE_TIME to 0.1 ms; the TensorFlow recipe keeps
    Horovod's default, the stack preset's."""
    _, mxnet = jobs("NVIDIA ResNet-50 v1.5 in MXNet, DGX-1 V100 16 GB, mixed precision")
    _, tensorflow = jobs("NVIDIA ResNet-50 v1.5 in TensorFlow, DGX-1 V100 16 GB, mixed precision")
    mx_cycle, tf_cycle = job_losses(mxnet).cycle, job_losses(tensorflow).cycle
    assert mx_cycle is not None and tf_cycle is not None
    assert mx_cycle.cycle_s == pytest.approx(1e-4) and tf_cycle == stack("horovod").cycle
    names = [case.name for case in CASES if " in MXNet, " in case.name]
    assert len(names) == 6


def test_the_pytorch_recipes_run_their_own_model_precision_and_layout() -> None:
    """Each PyTorch row of NVIDIA's ConvNets tables simulates its own model (the ResNeXts are
    not ResNet-50 under another name), NHWC with mixed precision at AMP only, at its batch, on
    DGX A100 nodes of 8 beyond 8 GPUs."""
    recipe = dict(FAMILIES)["NVIDIA's image recipes in PyTorch (21.03)"]
    assert len(recipe) == 28
    for case in recipe:
        one, many = jobs(case.name)
        gpus, mixed = many.gpus, "mixed precision" in case.name
        machine = "DGX A100" if "DGX A100" in case.name else "DGX-1 V100 16 GB"
        nodes = f"{gpus // 8} {machine}" if gpus > 8 else machine
        precision = "mixed precision" if mixed else ("TF32" if machine == "DGX A100" else "FP32")
        assert case.name == f"NVIDIA {DLE_LABELS[many.model]}, {nodes}, {precision}"
        assert case.rates is not None
        assert case.published == pytest.approx(case.rates[1] / (gpus * case.rates[0]))
        assert one.model == many.model and one.gpus == 1
        assert f"{many.batch} images/GPU" in case.setup
        assert many.compute_time == pytest.approx(many.batch / case.rates[0])
        assert many.mixed_precision == many.channels_last == mixed
        assert many.topology_value().spec == (str(gpus) if gpus <= 8 else f"8x{gpus // 8}")
    gradient_bytes = {model: job_profile(Job(model=model, device="v100", intra="nvlink2",
                                             batch=64)).parameter_bytes
                      for model in (*DLE_LABELS, "se_resnext101_32x4d")}
    assert gradient_bytes["efficientnet_b0"] < gradient_bytes["efficientnet_b4"] \
        < gradient_bytes["resnet50"] < gradient_bytes["resnext101_32x4d"] \
        < gradient_bytes["nvidia_se_resnext101_32x4d"] < gradient_bytes["se_resnext101_32x4d"]


def test_the_dgx2_is_one_host_of_16_not_two_nodes() -> None:
    _, dgx2 = jobs("NVIDIA ResNet-50 v1.5 in TensorFlow, DGX-2, FP32")
    assert dgx2.topology_value().spec == "16"


def test_dlperfs_rows_run_the_recipes_buckets_and_gradient_types() -> None:
    """DLPerf's ResNet-50 rows reduce float32 gradients (apex amp O1) in apex DDP's 10M-element
    buckets, NCHW at both precisions; its BERT-base rows one bucket larger than the model, in
    float16 at mixed precision (amp O2); one EDR port per server of 8, the efficiency read
    from the tables' throughputs."""
    labels = {"resnet50": "ResNet-50 v1.5", "bert_base": "BERT-base pre-training, sequence 128"}
    dlperf = dict(FAMILIES)["DLPerf: NVIDIA's PyTorch recipes on V100 servers (20.03)"]
    assert len(dlperf) == 18
    for case in dlperf:
        _, job = jobs(case.name)
        mixed = ", mixed precision, " in case.name
        gpus, precision = job.gpus, "mixed precision" if mixed else "FP32"
        assert case.name == (f"DLPerf, NVIDIA {labels[job.model]}, {gpus} V100, {precision}, "
                             f"batch {job.batch}")
        assert case.rates is not None
        assert case.published == pytest.approx(case.rates[1] / (gpus * case.rates[0]))
        assert job.compute_time == pytest.approx(job.batch / case.rates[0])
        assert job.network == "ib-edr"
        assert job.topology_value().spec == ("8" if gpus == 8 else f"8x{gpus // 8}")
        assert job.mixed_precision == mixed and not job.channels_last
        if job.model == "bert_base":
            assert job.allreduce_bytes == (2 if mixed else 4)
            assert job.bucket_mb * (1 << 20) > job_profile(job).parameter_bytes  # one bucket
        else:
            assert job.allreduce_bytes == 4 and job.bucket_mb == pytest.approx(APEX_BUCKET_MB)


def test_the_docs_table_is_the_one_the_cases_print(rows: list[Row]) -> None:
    """docs/validation.md reports every point as ``scaledl simulate reproduce`` prints it: a
    case added, or a prediction changed, without the docs fails here."""
    docs = (Path(__file__).parents[2] / "docs" / "validation.md").read_text().splitlines()
    printed = [*reproduction_table(rows).splitlines(), *family_table(rows, FAMILIES).splitlines(),
               *trait_table(published_errors(rows)).splitlines()]
    stale = [line for line in printed if line and line not in docs]
    assert not stale, f"{len(stale)} line(s) of the reproduction table differ from the docs: " \
                      f"{stale[0][:120]}"


def test_the_shipped_errors_are_the_tables(rows: list[Row]) -> None:
    """``scaledl simulate`` says how the model did on published points like a prediction from
    the errors the package ships: every efficiency point, with its error as the table prints
    it now (a prediction changed without ``scaledl simulate reproduce --write-errors`` fails
    here)."""
    efficiency = [row for row in rows if row.case.metric == "efficiency"]
    jobs = [row.prediction.job for row in efficiency]
    assert all(job is not None for job in jobs)
    # the check says "theirs was each run's measured one-GPU rate" beside a preset's estimate
    preset = [job for job in jobs if job is not None and job.compute_time is None]
    assert len(preset) <= 0.02 * len(jobs)
    assert load_errors() == published_errors(rows)
    assert len(load_errors()) == len(efficiency)


def test_the_2019_bert_rows_accumulate_as_their_configurations_say() -> None:
    """NVIDIA's 2019 BERT tables keep the global batch: the micro-batches per step fall as nodes
    are added (configurations.yml), one float16 allreduce after them, 16 GPUs per DGX-2H on
    eight EDR ports and 8 per DGX-1 on four."""
    pretraining = [case for case in dict(FAMILIES)["NVIDIA's BERT-large in PyTorch (19.07)"]
                   if "pre-training" in case.name]
    assert len(pretraining) == 10
    for case in pretraining:
        one, many = jobs(case.name)
        machine = "DGX-2H" if "DGX-2H" in case.name else "DGX-1 16 GB"
        per_node = 16 if machine == "DGX-2H" else 8
        nodes = many.gpus // per_node
        assert one.gpus == per_node and nodes > 1 and many.gpus == per_node * nodes
        assert case.name == (f"NVIDIA BERT-large pre-training (2019), {nodes} {machine}, "
                             f"mixed precision, sequence {many.input_shape[0]}")
        global_batch = {job.accumulation * job.batch * job.gpus for job in (one, many)}
        assert global_batch == {65536 if many.input_shape == (128,) else 32768}
        assert case.rates is not None
        assert case.published == pytest.approx(case.rates[1] / (nodes * case.rates[0]))
        assert one.accumulation > many.accumulation and one.batch == many.batch
        assert many.allreduce_bytes == 2 and many.mixed_precision
        assert many.network == ("ib-edr-x8" if machine == "DGX-2H" else "ib-edr-x4")
