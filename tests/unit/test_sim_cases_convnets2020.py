"""NVIDIA's 2020 PyTorch image recipe as ``scaledl simulate reproduce`` predicts it: every row of
the three tables, run as the recipe then ran (apex DDP's buckets, float32 gradients under apex amp
O1, NHWC only for the ResNeXt models under AMP), the efficiency read from the tables' rates
(docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

import pytest

from scaledl.sim.reproduce import Case, published_cases, published_families

CONVNETS_2020_CASES = dict(published_families())["NVIDIA's image recipes in PyTorch (20.06)"]
BY_NAME = {case.name: case for case in CONVNETS_2020_CASES}
APEX_BUCKET_MB = 10_000_000 * 4 / (1 << 20)
MACHINES = ("DGX A100 40 GB", "DGX-1 16 GB", "DGX-1 32 GB")


def _machine(case: Case) -> str:
    return next(machine for machine in MACHINES if f", {machine}, " in case.name)


def test_every_row_of_the_three_tables_is_a_case_in_reproduce() -> None:
    assert len(CONVNETS_2020_CASES) == 18 == len(BY_NAME)
    assert {(case.job.model, _machine(case)) for case in CONVNETS_2020_CASES
            if case.job is not None} == {
        (m, machine) for m in ("resnet50", "resnext101_32x4d", "nvidia_se_resnext101_32x4d")
        for machine in MACHINES}
    names = {case.name for case in published_cases()}
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


@pytest.mark.parametrize("case", CONVNETS_2020_CASES, ids=lambda case: case.name)
def test_each_row_runs_apex_ddp_buckets_of_float32_gradients_on_nchw(case: Case) -> None:
    job, machine, precision = case.job, _machine(case), case.name.split(", ")[-1]
    assert job is not None and case.rates is not None and case.base is not None
    model, batch, single = job.model, job.batch, case.rates[0]
    assert case.base.gpus == 1 and case.base.batch == batch
    assert job.gpus == 8 and job.topology_value().spec == "8"
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
