"""NVIDIA's 2019 BERT-large SQuAD tables as ``scaledl simulate reproduce`` predicts them: every
fine-tuning row but the one whose rates repeat another table's, run as ``run_squad.py`` then ran
(apex DDP's buckets behind every backward pass, float16 gradients under amp O2), the efficiency
read from the tables' rates (docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

import pytest

from scaledl.sim.cases import CASES, FAMILIES
from scaledl.sim.cases_bert import APEX_BUCKET_MB
from scaledl.sim.cases_bert2019 import BERT_2019_CASES, DOUBTFUL_2019, SQUAD_2019
from scaledl.sim.reproduce import Case

SQUAD = [case for case in BERT_2019_CASES if "SQuAD" in case.name]

WEAK_SCALING = (3.46, 7.20, 3.34, 6.35, 3.62, 7.24, 7.44, 6.41, 3.57, 7.08, 3.58, 7.19, 14.25,
                3.20, 6.32, 12.11, 3.49, 6.87, 13.67)
"""The tables' own weak-scaling column for each kept row, in the rows' order."""


def test_every_fine_tuning_row_but_the_copied_one_is_a_case_in_reproduce() -> None:
    rows = [(m, b, g) for m, _, b, rates in SQUAD_2019 for g in rates if g > 1]
    assert len(rows) == 21 and len(SQUAD) == 19 == len(rows) - 2  # FP32 and AMP of one row
    assert DOUBTFUL_2019 == {("DGX-1 32 GB", 8, 4)}
    assert all(case in dict(FAMILIES)["NVIDIA's BERT-large in PyTorch (19.07)"] for case in SQUAD)
    names = {case.name for case in CASES}
    assert all(case.name in names for case in SQUAD)


def test_the_left_out_row_has_the_pre_training_rows_rates() -> None:
    """The README's DGX-1 32 GB pre-training row at sequence 512 on 4 GPUs reads 31.52 and
    116.80 sequences/s; its SQuAD row on 4 GPUs reads the same two numbers."""
    fp32, mixed = (rates[4] for m, _, b, rates in SQUAD_2019 if (m, b) == ("DGX-1 32 GB", 8))
    assert (fp32, mixed) == (31.52, 116.80)


@pytest.mark.parametrize("case, scaling", list(zip(SQUAD, WEAK_SCALING, strict=True)),
                         ids=[case.name for case in SQUAD])
def test_published_efficiency_agrees_with_the_tables_weak_scaling(case: Case,
                                                                  scaling: float) -> None:
    gpus = int(case.name.split(" GPUs")[0].rsplit(" ", 1)[1])
    assert case.published * gpus == pytest.approx(scaling, abs=0.015)


@pytest.mark.parametrize("case", SQUAD, ids=[case.name for case in SQUAD])
def test_each_row_runs_apex_ddp_with_the_recipes_gradients(case: Case) -> None:
    job = case.predict(False).job
    assert job is not None and f"{job.gpus} GPUs" in case.name
    mixed = "mixed precision" in case.name
    assert job.input_shape == (384,) and job.accumulation == 1 and job.batch in (4, 8, 10)
    assert job.bucket_mb == pytest.approx(APEX_BUCKET_MB) and job.stack == "nccl"
    assert job.allreduce_bytes == (2 if mixed else 4) and job.mixed_precision == mixed
    assert job.topology_value().spec == str(job.gpus)  # one host
