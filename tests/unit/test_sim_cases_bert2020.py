"""NVIDIA's mid-2020 PyTorch BERT tables as ``scaledl simulate reproduce`` predicts them: every
multi-GPU row whose rounded rates pin its efficiency within 2 points is a case, built as the
recipe reduces its gradients (docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

import pytest

from scaledl.sim.cases import CASES
from scaledl.sim.cases_bert import APEX_BUCKET_MB, MACHINES, PRETRAIN_BUCKET_MB
from scaledl.sim.cases_bert2020 import (
    BERT_2020_CASES,
    DOUBTFUL,
    PRETRAIN_2020,
    ROUNDING_POINTS,
    SQUAD_2020,
    rounding_points,
)

BY_NAME = {case.name: case for case in BERT_2020_CASES}


def test_rounding_bounds_the_efficiency_the_rounded_rates_allow() -> None:
    """37 sequences/s on 4 GPUs against 10 on one: anything from 36.5/(4 x 10.5) to 37.5/(4 x
    9.5), 86.9% to 98.7%, so 5.9 points either way; 1618 against 415 pins it within 0.1."""
    assert rounding_points(10, 37, 4) == pytest.approx((37.5 / 38 - 36.5 / 42) / 2 * 100)
    assert rounding_points(10, 37, 4) == pytest.approx(5.9, abs=0.05)
    assert rounding_points(415, 1618, 4) < 0.2


def test_the_cases_are_the_rows_that_rounding_leaves_determined_and_all_are_in_reproduce() -> None:
    kept = [(m, p, s, g) for m, p, s, _, rows in PRETRAIN_2020 for g, (_, every) in rows.items()
            if g > 1 and rounding_points(rows[1][1], every, g) <= ROUNDING_POINTS
            and (m, p, s, g) not in DOUBTFUL]
    squad = [(m, p, g) for m, p, _, rates in SQUAD_2020 for g, every in rates.items()
             if g > 1 and rounding_points(rates[1], every, g) <= ROUNDING_POINTS]
    assert len(kept) == 28 and len(squad) == 11 and len(BERT_2020_CASES) == 39
    assert "NVIDIA BERT-large pre-training (2020), 4 GPUs of a DGX-1 32 GB, mixed precision, " \
           "sequence 128" not in BY_NAME  # its columns contradict its rates
    left_out = {(m, p, s) for m, p, s, _, rows in PRETRAIN_2020} - {k[:3] for k in kept}
    assert left_out == {(m, "FP32", 512) for m in ("DGX-1 16 GB", "DGX-1 32 GB", "DGX-2")}
    assert {p for _, p, _ in squad} == {"TF32", "mixed precision"}  # every FP32 row is out
    names = {case.name for case in CASES}
    assert all(case.name in names for case in BERT_2020_CASES)


def test_published_efficiency_is_the_rates_of_n_gpus_over_n_times_one() -> None:
    case = BY_NAME["NVIDIA BERT-large pre-training (2020), 16 GPUs of a DGX-2, mixed precision, "
                   "sequence 128"]
    assert case.published == pytest.approx(2557 / (16 * 173))
    squad = BY_NAME["NVIDIA BERT-large SQuAD fine-tuning (2020), 8 GPUs of a DGX A100 40 GB, "
                    "mixed precision"]
    assert squad.published == pytest.approx(861 / (8 * 116))  # its table's column says 7.36


def test_every_pre_training_row_keeps_its_tables_global_batch() -> None:
    for _, _, _, batch, rows in PRETRAIN_2020:
        assert len({gpus * steps * batch for gpus, (steps, _) in rows.items()}) == 1


KEPT_LARGEST = [(m, p, s, b, rows) for m, p, s, b, rows in PRETRAIN_2020
                if f"NVIDIA BERT-large pre-training (2020), {max(rows)} GPUs of a {m}, {p}, "
                   f"sequence {s}" in BY_NAME]


@pytest.mark.parametrize("machine, precision, sequence, batch, rows", KEPT_LARGEST,
                         ids=lambda value: str(value) if not isinstance(value, dict) else "")
def test_pre_training_accumulates_then_reduces_once(
        machine: str, precision: str, sequence: int, batch: int,
        rows: dict[int, tuple[int, int]]) -> None:
    name = (f"NVIDIA BERT-large pre-training (2020), {max(rows)} GPUs of a {machine}, "
            f"{precision}, sequence {sequence}")
    job = BY_NAME[name].predict(False).job
    assert job is not None and job.gpus == max(rows) and job.topology_value().spec == str(job.gpus)
    assert job.accumulation == rows[max(rows)][0] and job.batch == batch
    assert job.bucket_mb == PRETRAIN_BUCKET_MB and job.device == MACHINES[machine][0]
    assert job.allreduce_bytes == (2 if precision == "mixed precision" else 4)
    assert job.compute_time == pytest.approx(batch / rows[1][1])


def test_squad_overlaps_apex_buckets_on_the_40_gb_a100() -> None:
    job = BY_NAME["NVIDIA BERT-large SQuAD fine-tuning (2020), 8 GPUs of a DGX A100 40 GB, "
                  "TF32"].predict(False).job
    assert job is not None and job.device == "a100" and job.overlap
    assert job.bucket_mb == APEX_BUCKET_MB and job.allreduce_bytes == 4 and job.batch == 16
    assert job.input_shape == (384,) and job.accumulation == 1
