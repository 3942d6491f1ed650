"""NVIDIA's TensorFlow 2 BERT tables as ``scaledl simulate reproduce`` predicts them: every row
of the four tables is a case, built as the recipe reduces its gradients (docs/validation.md,
"Reproducing published results")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.sim.scenario import job_cycle, resolve
from scaledl.sim.reproduce import Case, published_cases, published_families

FAMILY = dict(published_families())["NVIDIA's BERT-large in TensorFlow 2 (21.02)"]
BY_NAME = {case.name: case for case in FAMILY}
PER_NODE = {"DGX-2": 16, "DGX-2H": 16, "DGX A100": 8}
NAME = "NVIDIA BERT-large pre-training in TensorFlow 2, "


def _machine(case: Case) -> str:
    return next(m for m in ("DGX-2H", "DGX-2", "DGX A100") if f" {m}, " in case.name)


def test_every_multi_gpu_row_of_the_four_tables_is_a_case_in_reproduce() -> None:
    single = [case for case in FAMILY if case.base is not None and case.base.gpus == 1]
    # DGX-2: 4 tables of 4, 8, 16 GPUs; DGX A100: 4 of 8; multi-node: 8 tables of 3 node counts
    assert len(single) == 4 * 3 + 4 and len(FAMILY) - len(single) == 8 * 3
    assert len(FAMILY) == 40
    names = {case.name for case in published_cases()}
    assert all(case.name in names for case in FAMILY)


def test_published_efficiency_is_per_gpu_throughput_over_the_smallest_rows() -> None:
    for case in FAMILY:
        assert case.base is not None and case.job is not None and case.rates is not None
        units = case.job.gpus // case.base.gpus
        machine, sequence = _machine(case), case.job.input_shape[0]
        precision = case.name.split(", ")[-2]
        where = (f"{units} GPUs of a {machine}" if case.base.gpus == 1 else f"{units} {machine}")
        assert case.name == f"{NAME}{where}, {precision}, sequence {sequence}"
        assert case.base.gpus in (1, PER_NODE[machine])
        assert case.published == pytest.approx(case.rates[1] / (units * case.rates[0]))


def test_the_dgx2h_mixed_precision_rows_keep_their_stated_global_batch() -> None:
    """The README's 4- and 16-node rows at sequence 512 list accumulations that contradict the
    global batch they state (30720); the cases take configurations.yml's, which keep it."""
    rows = [case for case in FAMILY if " DGX-2H, mixed precision" in case.name]
    assert len(rows) == 6
    for case in rows:
        assert case.base is not None and case.job is not None
        assert {job.batch * job.accumulation * job.gpus for job in (case.base, case.job)} == {
            61440 if case.job.input_shape == (128,) else 30720}


@pytest.mark.parametrize("precision, wire, machine, nodes",
                         [("mixed precision", 2, "DGX A100", 8), ("FP32", 4, "DGX-2H", 4),
                          ("TF32", 4, "DGX A100", 8)])
def test_a_job_reduces_once_after_accumulating_in_horovods_fused_buffers(
        precision: str, wire: int, machine: str, nodes: int) -> None:
    """Horovod (0.21's default cycle and fusion), float16 compression only at mixed precision, the
    micro-batches accumulated locally and the reduction overlapping no compute."""
    per_node = PER_NODE[machine]
    case = BY_NAME[f"{NAME}{nodes} {machine}, {precision}, sequence 128"]
    assert case.job is not None
    job = replace(case.job, batch=32, accumulation=4, compute_time=32 / 200.0)
    assert job.stack == "horovod-0.21" and not job.overlap
    cycle = job_cycle(job)
    assert cycle is not None and cycle.cycle_s == pytest.approx(1e-3)  # Horovod 0.21's defaults
    assert cycle.fusion_bytes == 128 << 20
    assert job.allreduce_bytes == wire and job.mixed_precision == (precision == "mixed precision")
    assert job.topology_value().spec == f"{per_node}x{nodes}"
    one_host = BY_NAME[f"{NAME}8 GPUs of a {'DGX A100' if precision == 'TF32' else 'DGX-2'}, "
                       f"{precision}, sequence 128"].job
    assert one_host is not None and one_host.topology_value().spec == "8"
    # one micro-batch per step: DistributedGradientTape reduces during backward, and only then
    assert [c.name for c in FAMILY if c.job is not None and c.job.overlap] == [
        f"{NAME}32 DGX A100, mixed precision, sequence 128"]
    assert all(c.job is not None and c.job.overlap == (c.job.accumulation == 1) for c in FAMILY)
    result = resolve(job).run()
    assert result.communication_s > 0
    assert result.exposed_s >= result.communication_s  # nothing hides the reduction
    assert result.compute_s == pytest.approx(4 * 32 / 200.0, rel=1e-6)


def test_the_one_gpu_rows_are_single_gpu_rate_checks_that_set_nothing() -> None:
    from scaledl.sim.device_checks import RATE_CHECKS

    checks = {(check.device, check.input_shape, check.batch, check.mixed_precision):
              check for check in RATE_CHECKS if "TensorFlow2/LanguageModeling" in check.source}
    single = {}
    for case in FAMILY:
        if case.base is not None and case.base.gpus == 1 and case.job is not None:
            assert case.rates is not None
            key = (case.job.device, case.job.input_shape, case.base.batch,
                   case.job.mixed_precision)
            single[key] = case.rates[0]
    assert len(checks) == len(single) == 8
    for key, rate in single.items():
        check = checks[key]
        assert check.published == rate and check.model == "bert_large" and not check.used
