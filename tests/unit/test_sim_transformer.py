"""BERT in the simulator: the architecture's closed forms, gradient accumulation and a float16
allreduce against hand computations on tiny cases, the CLI's errors, the published points."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from scaledl.cli.main import main
from scaledl.models import build_model, layer_profile
from scaledl.models.profile import example_input, input_dtype
from scaledl.models.gpt import GPT2_VOCAB
from scaledl.models.transformer import BERT_BASE, BERT_LARGE, VOCAB_SIZE, BertConfig
from scaledl.sim.iteration import IterationResult, accumulated
from scaledl.sim.scenario import resolve
from scaledl.sim.job import Job
from scaledl.sim.reproduce import evaluate, published_families


def _bert_parameters(config: BertConfig, classes: int) -> int:
    """BERT's parameter count from its definition (Devlin et al., table of sizes)."""
    h = config.hidden
    embeddings = (VOCAB_SIZE + 512 + 2) * h + 2 * h
    block = (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h) \
        + 2 * h
    return embeddings + config.layers * block + (h * h + h) + (h * classes + classes)


@pytest.mark.parametrize("name,config", [("bert_base", BERT_BASE), ("bert_large", BERT_LARGE)])
def test_bert_has_the_papers_parameters(name: str, config: BertConfig) -> None:
    with torch.device("meta"):
        model = build_model(name, (128,), 2)
    count = sum(p.numel() for p in model.parameters())
    assert count == _bert_parameters(config, 2)
    # 110M and 340M in the paper (rounded, with its pre-training heads)
    assert count == (109_483_778 if name == "bert_base" else 335_143_938)


@pytest.mark.parametrize("name,published", [("gpt2", 124_439_808), ("gpt2_medium", 354_823_168),
                                            ("gpt2_large", 774_030_080),
                                            ("gpt2_xl", 1_557_611_200)])
def test_gpt2_has_the_published_parameters_with_its_head_tied(name: str, published: int) -> None:
    with torch.device("meta"):
        tied = build_model(name, (1024,), GPT2_VOCAB)
        untied = build_model(name, (1024,), 5)
    assert sum(p.numel() for p in tied.parameters()) == published
    hidden = tied.words.weight.shape[1]
    assert sum(p.numel() for p in untied.parameters()) == published + hidden * 5 + 5
    layers = {p.name: p for p in layer_profile(tied, (1024,))}
    # the tied head reduces nothing of its own, and costs 2 x hidden FLOPs per logit
    assert layers["head"].parameter_bytes == 0
    assert layers["head"].forward_flops == 2 * hidden * GPT2_VOCAB * 1024


def test_gpt2_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = build_model("gpt2", (6,), 11).eval()
    tokens = torch.randint(0, GPT2_VOCAB, (1, 6))
    changed = tokens.clone()
    changed[0, 4] = (changed[0, 4] + 1) % GPT2_VOCAB
    before, after = model(tokens), model(changed)
    assert torch.equal(before[0, :4], after[0, :4])  # earlier tokens do not see token 4
    assert not torch.equal(before[0, 4:], after[0, 4:])


def test_attention_counts_its_own_products() -> None:
    sequence, h = 64, 768
    with torch.device("meta"):
        model = build_model("bert_base", (sequence,), 2)
    layers = {p.name: p for p in layer_profile(model, (sequence,))}
    attention = layers["blocks.0.attention"]
    assert attention.forward_flops == 8 * h * h * sequence + 4 * sequence * sequence * h
    assert layers["blocks.0.up"].forward_flops == 2 * h * 4 * h * sequence
    assert attention.output_shape == (sequence, h)


def test_token_models_take_integer_ids_and_refuse_images() -> None:
    model = build_model("bert_base", (8,), 3)
    assert input_dtype(model) == torch.long
    ids = example_input(model, 4, (8,), torch.Generator().manual_seed(1))
    assert ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < VOCAB_SIZE
    with pytest.raises(ValueError, match=r"bert_base takes token ids .* got \(1, 28, 28\)"):
        build_model("bert_base", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="1..512 tokens"):
        build_model("bert_large", (513,), 2)


def _result(**fields: float) -> IterationResult:
    base = dict(strategy="allreduce", algorithm="ring", world_size=4, batch_per_gpu=8,
                iteration_s=1.3, compute_s=1.0, update_s=0.1, communication_s=0.5,
                exposed_s=0.2, single_gpu_s=1.1, straggler_s=0.04)
    base.update(fields)
    return IterationResult(**base)  # type: ignore[arg-type]


def test_accumulation_adds_local_micro_batches_and_a_sqrt_straggler() -> None:
    one = _result()
    four = accumulated(one, 4)
    assert four.batch_per_gpu == 32 and four.compute_s == pytest.approx(4.0)
    # 3 more micro-batches of 1 s, the straggler wait of a sum of 4: 2 x 0.04
    assert four.iteration_s == pytest.approx(1.3 + 3.0 + 0.04)
    assert four.single_gpu_s == pytest.approx(1.1 + 3.0)
    assert four.straggler_s == pytest.approx(0.08)
    assert four.exposed_s == pytest.approx(four.iteration_s - four.single_gpu_s)
    assert one.efficiency < four.efficiency <= 1.0
    assert accumulated(one, 1) is one
    with pytest.raises(ValueError, match=">= 1"):
        accumulated(one, 0)


def test_accumulation_in_a_job_amortizes_the_allreduce() -> None:
    job = Job(model="bert_base", input_shape=(32,), gpus=8, topology="4x2", device="v100",
              network="25gbe-roce", batch=8, compute_time=0.05)
    one, many = resolve(job).run(), resolve(replace(job, accumulation=8)).run()
    assert many.batch_per_gpu == 64
    assert many.communication_s == pytest.approx(one.communication_s)
    assert one.efficiency < many.efficiency <= 1.0


def test_a_float16_allreduce_moves_half_the_bytes_and_keeps_compute() -> None:
    job = Job(model="bert_base", input_shape=(32,), gpus=8, topology="4x2", device="v100",
              network="25gbe-roce", batch=8, bucket_mb=8192, lossless=True)
    full, half = resolve(job).run(), resolve(replace(job, allreduce_bytes=2)).run()
    assert half.compute_s == full.compute_s and half.update_s == full.update_s
    # one bucket, bandwidth-bound ring: the collective's time roughly halves
    assert half.communication_s == pytest.approx(full.communication_s / 2, rel=0.1)


@pytest.mark.parametrize("argv,message", [
    (["--accumulation", "0"], "--accumulation 0 must be >= 1"),
    (["--strategy", "sync-easgd", "--accumulation", "2"], "steps locally already"),
    (["--input-shape", "3x32x32"], "bert_base takes token ids"),
])
def test_cli_errors_for_accumulation_and_token_shapes(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--model", "bert_base", "--gpus", "8", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


def test_cli_prints_a_bert_step_with_accumulation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "bert_large", "--gpus", "16", "--topology", "8x2",
                 "--device", "a100", "--network", "ib-hdr-x8", "--input-shape", "128",
                 "--batch", "32", "--accumulation", "4", "--allreduce-dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "batch 32/GPU x 4 micro-batches per step" in out and "scaling efficiency" in out


def test_the_recipes_points_are_predicted_from_the_presets_and_never_above_linear() -> None:
    rows = evaluate(dict(published_families())["NVIDIA's BERT-large in PyTorch (21.11)"])
    assert len(rows) == 16
    assert all(0 < row.prediction.value <= 1 for row in rows)
    # mixed precision at sequence 128 on 32 nodes: no accumulation left, the allreduce shows
    point = next(row for row in rows if row.case.name.startswith(
        "NVIDIA BERT-large pre-training, 32 DGX A100, mixed precision, sequence 128"))
    assert math.isclose(point.case.published, 138294 / (32 * 4553))
    assert point.within
