"""NVIDIA's 2019 BERT-large SQuAD tables as ``scaledl simulate reproduce`` predicts them: every
fine-tuning row whose rates agree with its table, run as ``run_squad.py`` then ran (apex DDP's
buckets behind every backward pass, float16 gradients under amp O2), the efficiency read from the
tables' rates (docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

import pytest

from scaledl.sim.reproduce import Case, published_cases, published_families

FAMILY = dict(published_families())["NVIDIA's BERT-large in PyTorch (19.07)"]
SQUAD = [case for case in FAMILY if "SQuAD" in case.name]
APEX_BUCKET_MB = 10_000_000 * 4 / (1 << 20)
INTRA = {"DGX-1 16 GB": "nvlink2", "DGX-1 32 GB": "nvlink2", "DGX-2": "nvswitch-v100"}
"""How each machine's GPUs are joined (the link presets)."""
DOUBTFUL_2019 = (  # machine, precision, batch per GPU, {GPUs: sequences/s}
    ("DGX-1 32 GB", "FP32", 8, {1: 8.64, 4: 31.52, 8: 64.32}),
    ("DGX-1 32 GB", "mixed precision", 8, {1: 36.04, 4: 116.80, 8: 231.04}),
)
"""The fine-tuning rows the cases leave out (the README at commit 78e97e3): their rates
contradict their table's batch."""

WEAK_SCALING = (3.46, 7.20, 3.34, 6.35, 3.62, 7.24, 3.57, 7.08, 3.58, 7.19, 14.25, 3.20, 6.32,
                12.11, 3.49, 6.87, 13.67)
"""The tables' own weak-scaling column for each kept row, in the rows' order."""


def _gpus(case: Case) -> int:
    return int(case.name.split(" GPUs")[0].rsplit(" ", 1)[1])


def _on_the_step_grid(rate: float, gpus: int, batch: int) -> bool:
    """``run_squad.sh`` prints the progress bar's steps per second (two decimals) times the GPUs
    times the batch per GPU: a rate it printed is on that grid."""
    steps = rate / (gpus * batch)
    return abs(steps - round(steps, 2)) < 1e-3


def test_every_row_that_agrees_with_its_table_is_a_case_in_reproduce() -> None:
    assert len(SQUAD) == 17
    assert not any(f"a {machine}, {precision}, batch {batch}" in case.name
                   for machine, precision, batch, _ in DOUBTFUL_2019 for case in SQUAD)
    names = {case.name for case in published_cases()}
    assert all(case.name in names for case in SQUAD)


def test_the_left_out_rows_rates_cannot_be_what_the_script_printed_at_their_batch() -> None:
    """Every kept rate is a step rate times GPUs times the printed batch; the DGX-1 32 GB rows
    at batch 8 are not (36.04 on one GPU, 31.52 and 64.32 at FP32), though at a batch of 4 all
    are, and their 4-GPU rates are also the pre-training table's (31.52 and 116.80)."""
    for _, _, batch, rates in DOUBTFUL_2019:
        assert not all(_on_the_step_grid(rate, gpus, batch) for gpus, rate in rates.items())
        assert all(_on_the_step_grid(rate, gpus, 4) for gpus, rate in rates.items())
    for case in SQUAD:
        assert case.rates is not None and case.job is not None
        single, every = case.rates
        assert _on_the_step_grid(single, 1, case.job.batch), case.name
        assert _on_the_step_grid(every, case.job.gpus, case.job.batch), case.name


@pytest.mark.parametrize("case, scaling", list(zip(SQUAD, WEAK_SCALING, strict=True)),
                         ids=[case.name for case in SQUAD])
def test_published_efficiency_agrees_with_the_tables_weak_scaling(case: Case,
                                                                  scaling: float) -> None:
    assert case.published * _gpus(case) == pytest.approx(scaling, abs=0.015)


@pytest.mark.parametrize("case", SQUAD, ids=[case.name for case in SQUAD])
def test_each_row_runs_apex_ddp_with_the_recipes_gradients(case: Case) -> None:
    job = case.predict(False).job
    assert job is not None and job.gpus == _gpus(case)
    machine = next(m for m in INTRA if f"GPUs of a {m}, " in case.name)
    mixed = "mixed precision" in case.name
    assert job.input_shape == (384,) and job.accumulation == 1
    assert f"batch {job.batch}" in case.name and job.intra == INTRA[machine]
    assert job.bucket_mb == pytest.approx(APEX_BUCKET_MB) and job.stack == "nccl"
    assert job.allreduce_bytes == (2 if mixed else 4) and job.mixed_precision == mixed
    assert job.topology_value().spec == str(job.gpus)  # one host
    assert case.rates is not None and case.base is not None and case.base.gpus == 1
    assert job.compute_time == pytest.approx(job.batch / case.rates[0])
