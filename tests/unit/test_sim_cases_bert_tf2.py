"""NVIDIA's TensorFlow 2 BERT tables as ``scaledl simulate reproduce`` predicts them: every row
of the four tables is a case, built as the recipe reduces its gradients (docs/simulation.md,
"Reproducing published results")."""

from __future__ import annotations

import pytest

from scaledl.sim.cases import CASES
from scaledl.sim.cases_bert import MACHINES
from scaledl.sim.cases_bert_tf2 import BERT_TF2_CASES, TF2_NODES, TF2_SINGLE_NODE, tf2_job


def test_every_multi_gpu_row_of_the_four_tables_is_a_case_in_reproduce() -> None:
    rows = sum(len(rows) - 1 for table in (TF2_SINGLE_NODE, TF2_NODES) for *_, rows in table)
    assert len(BERT_TF2_CASES) == rows == 40
    names = {case.name for case in CASES}
    assert all(case.name in names for case in BERT_TF2_CASES)


def test_published_efficiency_is_per_gpu_throughput_over_the_smallest_rows() -> None:
    by_name = {case.name: case for case in BERT_TF2_CASES}
    for machine, precision, sequence, rows in TF2_SINGLE_NODE:
        for gpus in (g for g in rows if g > 1):
            name = (f"NVIDIA BERT-large pre-training in TensorFlow 2, {gpus} GPUs of a "
                    f"{machine}, {precision}, sequence {sequence}")
            assert by_name[name].published == pytest.approx(rows[gpus][2] / (gpus * rows[1][2]))
    for machine, precision, sequence, rows in TF2_NODES:
        for nodes in (n for n in rows if n > 1):
            name = (f"NVIDIA BERT-large pre-training in TensorFlow 2, {nodes} {machine}, "
                    f"{precision}, sequence {sequence}")
            assert by_name[name].published == pytest.approx(rows[nodes][2] / (nodes * rows[1][2]))


def test_the_dgx2h_mixed_precision_rows_keep_their_stated_global_batch() -> None:
    """The README's 4- and 16-node rows at sequence 512 list accumulations that contradict the
    global batch they state (30720); the cases take configurations.yml's, which keep it."""
    for machine, precision, sequence, rows in TF2_NODES:
        if machine == "DGX-2H" and precision == "mixed precision":
            per_node = MACHINES[machine][3]
            assert {batch * steps * per_node * nodes for nodes, (batch, steps, _) in rows.items()
                    } == {61440 if sequence == 128 else 30720}


@pytest.mark.parametrize("precision, wire", [("mixed precision", 2), ("FP32", 4), ("TF32", 4)])
def test_a_job_reduces_once_after_accumulating_in_horovods_fused_buffers(
        precision: str, wire: int) -> None:
    """Horovod (0.21's default cycle and fusion), float16 compression only at mixed precision, the
    micro-batches accumulated locally and the reduction overlapping no compute."""
    machine = "DGX-2H" if precision == "FP32" else "DGX A100"
    per_node = MACHINES[machine][3]
    job = tf2_job(machine, precision, 128, 32, 4, per_node * 4, 200.0)
    assert job.stack == "horovod-0.21" and not job.overlap and job.accumulation == 4
    cycle = job.cycle()
    assert cycle is not None and cycle.cycle_s == pytest.approx(1e-3)  # Horovod 0.21's defaults
    assert cycle.fusion_bytes == 128 << 20
    assert job.allreduce_bytes == wire and job.mixed_precision == (precision == "mixed precision")
    assert job.topology_value().spec == f"{per_node}x4"
    assert tf2_job("DGX-2", precision, 128, 32, 4, 8, 200.0).topology_value().spec == "8"
    # one micro-batch per step: DistributedGradientTape reduces during backward
    assert tf2_job(machine, precision, 128, 32, 1, per_node * 4, 200.0).overlap
    result = job.run()
    assert result.communication_s > 0
    assert result.exposed_s >= result.communication_s  # nothing hides the reduction
    assert result.compute_s == pytest.approx(4 * 32 / 200.0, rel=1e-6)


def test_the_one_gpu_rows_are_single_gpu_rate_checks_that_set_nothing() -> None:
    from scaledl.sim.device_checks import RATE_CHECKS

    checks = {(check.device, check.input_shape, check.batch, check.mixed_precision):
              check for check in RATE_CHECKS if "TensorFlow2/LanguageModeling" in check.source}
    assert len(checks) == len(TF2_SINGLE_NODE)
    for machine, precision, sequence, rows in TF2_SINGLE_NODE:
        batch, _, rate = rows[1]
        check = checks[MACHINES[machine][0], (sequence,), batch, precision == "mixed precision"]
        assert check.published == rate and check.model == "bert_large" and not check.used
