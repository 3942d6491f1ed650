"""DLPerf's Megatron-LM GPT runs as ``scaledl simulate reproduce`` predicts them: the decoder
Megatron builds, one float16 allreduce of every gradient after backward, the efficiency read from
the README's times per iteration (docs/simulation.md, "Reproducing published results")."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from scaledl.models import build_model, layer_profile
from scaledl.models.gpt import GPT_SIZES, MEGATRON_VOCAB
from scaledl.sim.scenario import job_profile, resolve
from scaledl.sim.job import Job
from scaledl.sim.profile import TOKEN_MODELS, default_input
from scaledl.sim.reproduce import idealised, published_cases, published_families

MEGATRON_CASES = dict(published_families())["DLPerf: Megatron-LM's GPT on V100 servers (20.12)"]
MODEL = "megatron_gpt_1536x16"
SEQUENCE = 2048
BATCH = 2
ONE_GPU_MS = 464.12
"""``DP_1x1x1_2_1536x16``: milliseconds per iteration on one GPU (4.31 sequences/s)."""
MEGATRON_RUNS = ((8, 480.96), (16, 664.46), (32, 683.51))
"""GPUs and milliseconds per iteration of DLPerf's data-parallel cases (its README)."""


def megatron_job(gpus: int) -> Job:
    """The case's job on ``gpus`` GPUs."""
    job = next(case.job for case in MEGATRON_CASES if case.job and case.job.gpus == gpus)
    assert job is not None
    return job


def _megatron_parameters(layers: int, hidden: int, vocab: int, positions: int) -> int:
    """Word and position embeddings, per block two layer norms, the fused query-key-value
    projection, the attention's output and the two feed-forward layers (``12 h^2 + 13 h``), and
    the final layer norm; the output layer is the word embeddings (tied)."""
    h = hidden
    return (vocab + positions) * h + layers * (12 * h * h + 13 * h) + 2 * h


def test_the_decoder_has_megatrons_parameters_with_its_head_tied() -> None:
    size = GPT_SIZES[MODEL]
    assert (size.layers, size.hidden, size.heads, size.positions) == (16, 1536, 16, 2048)
    assert size.vocab == MEGATRON_VOCAB == 50_304 and MEGATRON_VOCAB % 128 == 0  # padded 50,257
    with torch.device("meta"):
        model = build_model(MODEL, (SEQUENCE,), MEGATRON_VOCAB)
    count = sum(p.numel() for p in model.parameters())
    assert count == _megatron_parameters(16, 1536, 50_304, 2048) == 533_720_064
    head = {layer.name: layer for layer in layer_profile(model, (SEQUENCE,))}["head"]
    assert head.parameter_bytes == 0 and head.forward_flops == 2 * 1536 * 50_304 * SEQUENCE
    assert model.vocab_size == 50_304  # the profilers draw token ids below it


def test_the_simulator_reads_its_context_and_vocabulary_as_the_default_input() -> None:
    assert default_input(MODEL) == ((2048,), 50_304) and MODEL in TOKEN_MODELS
    assert default_input("gpt2") == ((1024,), 50_257)
    with pytest.raises(ValueError, match="1..2048 tokens"):
        build_model(MODEL, (2049,), MEGATRON_VOCAB)


def test_the_cases_are_the_data_parallel_rows_against_one_gpu() -> None:
    assert [gpus for gpus, _ in MEGATRON_RUNS] == [8, 16, 32] and len(MEGATRON_CASES) == 3
    for case, (gpus, milliseconds) in zip(MEGATRON_CASES, MEGATRON_RUNS):
        assert case.metric == "efficiency" and case.published == pytest.approx(
            ONE_GPU_MS / milliseconds)
        assert case.rates == (ONE_GPU_MS, milliseconds) and case.job is not None
        assert case.job.gpus == gpus and case.base is not None and case.base.gpus == 1
        # the report's sequences/s: 2 per GPU over each time per iteration
        assert BATCH * gpus / milliseconds * 1e3 == pytest.approx(
            {8: 33.27, 16: 48.16, 32: 93.63}[gpus], abs=0.005)
    assert BATCH / ONE_GPU_MS * 1e3 == pytest.approx(4.31, abs=0.005)
    names = {case.name for case in published_cases()}
    assert all(case.name in names for case in MEGATRON_CASES)


@pytest.mark.parametrize("gpus", [gpus for gpus, _ in MEGATRON_RUNS])
def test_every_gradient_is_reduced_once_in_float16_after_backward(gpus: int) -> None:
    job = megatron_job(gpus)
    assert job.topology_value().spec == ("8" if gpus == 8 else f"8x{gpus // 8}")
    assert job.network == "ib-edr" and job.intra == "nvlink2" and job.device == "v100"
    assert job.allreduce_bytes == 2 and job.mixed_precision and job.accumulation == 1
    profile = job_profile(job)
    assert profile.parameter_bytes == 533_720_064 * 4  # the tied head reduces nothing of its own
    assert job.bucket_mb * (1 << 20) > profile.parameter_bytes and len(profile.buckets) == 1
    assert job.compute_time == pytest.approx(0.46412) and job.batch == BATCH
    assert job.model == MODEL and job.input_shape == (SEQUENCE,)


def test_one_server_adds_one_ring_allreduce_of_the_float16_gradients_to_the_step() -> None:
    """Nothing overlaps the one bucket, so with the ideal model 8 GPUs take one GPU's step plus
    a ring allreduce of 2 x 533.7M bytes at nvlink2's 50 GB/s a hop: ``2 (7/8) B / 50 GB/s``,
    37.4 ms (the rounds' latencies add 0.1 ms)."""
    eight = idealised(megatron_job(8), True)
    one = replace(eight, gpus=1, topology="1")
    ring = 2 * 7 / 8 * 533_720_064 * 2 / 50e9
    assert resolve(eight).run().iteration_s - resolve(one).run().iteration_s \
        == pytest.approx(ring, rel=0.02)
