"""NVIDIA's 2020 PyTorch image recipe as ``scaledl simulate reproduce`` predicts it: every row of
the three tables, run as the recipe then ran (apex DDP's buckets, float32 gradients under apex amp
O1, NHWC only for the ResNeXt models under AMP), the efficiency read from the tables' rates
(docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

import pytest

from scaledl.sim.cases import CASES, FAMILIES
from scaledl.sim.cases_bert import APEX_BUCKET_MB
from scaledl.sim.cases_convnets2020 import (
    CONVNETS_2020_CASES,
    CONVNETS_2020_RUNS,
    convnets_2020_job,
)
from scaledl.sim.reproduce import Case

BY_NAME = {case.name: case for case in CONVNETS_2020_CASES}


def test_every_row_of_the_three_tables_is_a_case_in_reproduce() -> None:
    assert len(CONVNETS_2020_RUNS) == 18 == len(BY_NAME)
    assert {(m, machine) for m, machine, *_ in CONVNETS_2020_RUNS} == {
        (m, machine) for m in ("resnet50", "resnext101_32x4d", "nvidia_se_resnext101_32x4d")
        for machine in ("DGX A100 40 GB", "DGX-1 16 GB", "DGX-1 32 GB")}
    assert dict(FAMILIES)["NVIDIA's image recipes in PyTorch (20.06)"] == CONVNETS_2020_CASES
    names = {case.name for case in CASES}
    assert all(case.name in names for case in CONVNETS_2020_CASES)


SCALING = (7.74, 7.91, 7.75, 7.77, 7.78, 7.82, 7.58, 7.92, 7.48, 7.67, 7.48, 7.66, 7.42, 7.88,
           7.03, 7.63, 6.97, 7.78)
"""The tables' own strong-scaling column for each row, in the rows' order."""


@pytest.mark.parametrize("case, scaling", list(zip(CONVNETS_2020_CASES, SCALING, strict=True)),
                         ids=[case.name for case in CONVNETS_2020_CASES])
def test_published_efficiency_is_eight_gpus_over_eight_times_one(case: Case,
                                                                 scaling: float) -> None:
    """The rates as transcribed give each row the speedup its table prints beside them."""
    assert case.published * 8 == pytest.approx(scaling, abs=0.006)


def test_one_row_read_by_hand() -> None:
    case = BY_NAME["NVIDIA ResNet-50 v1.5 (2020), DGX-1 16 GB, mixed precision"]
    assert case.published == pytest.approx(6635.90 / (8 * 856.52))


@pytest.mark.parametrize("run", CONVNETS_2020_RUNS, ids=lambda run: f"{run[0]}-{run[1]}-{run[2]}")
def test_each_row_runs_apex_ddp_buckets_of_float32_gradients_on_nchw(
        run: tuple[str, str, str, int, float, float]) -> None:
    model, machine, precision, batch, single, _ = run
    job = convnets_2020_job(model, machine, precision, batch, single)
    assert job.model == model and job.gpus == 8 and job.topology_value().spec == "8"
    assert job.bucket_mb == pytest.approx(APEX_BUCKET_MB) and job.allreduce_bytes == 4
    mixed = precision == "mixed precision"
    assert job.mixed_precision == mixed
    assert job.channels_last == (mixed and model != "resnet50")  # the ResNeXt READMEs' NHWC
    assert job.device == ("a100" if machine == "DGX A100 40 GB" else "v100")
    assert job.intra == ("nvlink3" if machine == "DGX A100 40 GB" else "nvlink2")
    # the READMEs' benchmark batches: ResNeXt half of ResNet-50's, FP32 on a DGX-1 half again
    full = 256 if model == "resnet50" else 128
    assert batch == (full // 2 if precision == "FP32" else full)
    assert job.compute_time == pytest.approx(batch / single)
