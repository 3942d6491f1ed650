"""The models users wrap in ``scaledl.DataParallel``, as cases: model, data, loss, reference.

Each :class:`Case` builds one model (its weights from the global generator: the caller seeds
it), draws the global batch of a step, computes the loss of a slice of it, and says which
reference training must equal:

- ``"single"``: one process training on the whole global batch.  Every rank's slice is the same
  size and the loss is a mean, so the average of the ranks' gradients is the gradient of the
  global batch, and parameters and buffers after a few steps must match to fp tolerance.
- ``"ddp"``: torch's own ``DistributedDataParallel`` on Gloo, for models with batch norm.  There
  the two are not the same computation: each rank normalises with the statistics of its own
  slice (no rank sees the global batch's), and, as DDP does, DataParallel takes rank 0's running
  statistics at every forward.  Single-process training on the global batch would normalise
  with the global statistics, so it is not what data parallelism computes; DDP is, rank by
  rank, and is what users switch from.

The zoo cases cover every entry of :data:`scaledl.models.registry.MODELS`.  Where the published
size is too large to train a few steps on two shared cores many times over, the same class is
built at a small configuration (named in ``Case.note``); the full sizes are run by
``benchmarks/dp_user_models/zoo_full_size.py``.  Dropout is switched off (p=0): it owns no
parameter, and its masks come from each process's generator, so no reference could match them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scaledl.models import build_model
from scaledl.models.efficientnet import EfficientNet
from scaledl.models.gpt import Gpt2, Gpt2Config
from scaledl.models.resnet import BlockShape, ImageNetResNet
from scaledl.models.transformer import Bert, BertConfig
from scaledl.models.vgg import VGG

PER_RANK = 2
"""Samples per rank per step."""


@dataclass(frozen=True)
class Case:
    """One model users train, with its data."""

    name: str
    build: Callable[[], nn.Module]
    """A fresh model, weights from the global generator."""
    batch: Callable[[int, int], tuple[torch.Tensor, ...]]
    """``(global_samples, step) -> (inputs..., target)``, the same on every rank."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default=lambda out, target: nn.functional.cross_entropy(out, target))
    reference: str = "single"
    """``"single"`` (one process, global batch) or ``"ddp"`` (torch DDP on Gloo)."""
    covers: tuple[str, ...] = ()
    """Registry names whose architecture this case trains."""
    atol: float = 1e-6
    """Absolute tolerance of the comparison (relative: 1e-5)."""
    heavy: bool = False
    """Convolutions over images: seconds, not tenths, per configuration when two or three
    ranks each run torch's default threads on two cores; trained with one thread only."""
    note: str = ""


def _images(shape: tuple[int, ...], classes: int) -> Callable[[int, int], tuple[torch.Tensor, ...]]:
    def batch(samples: int, step: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(1000 + step)
        return (torch.randn(samples, *shape, generator=gen),
                torch.randint(0, classes, (samples,), generator=gen))
    return batch


def _tokens(sequence: int, vocab: int, classes: int, per_token: bool
            ) -> Callable[[int, int], tuple[torch.Tensor, ...]]:
    def batch(samples: int, step: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(2000 + step)
        tokens = torch.randint(0, vocab, (samples, sequence), generator=gen)
        shape = (samples, sequence) if per_token else (samples,)
        return tokens, torch.randint(0, classes, shape, generator=gen)
    return batch


def _token_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def _no_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def _has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _zoo_case(covers: tuple[str, ...], build: Callable[[], nn.Module],
              shape: tuple[int, ...], note: str = "", heavy: bool = False) -> Case:
    reference = "ddp" if _has_batch_norm(build()) else "single"
    # Deep batch-norm networks against DDP: DDP divides each gradient by the world size before
    # summing, scaledl averages after, an ulp apart, which normalising by the statistics of two
    # samples per rank amplifies to a few 1e-6 after three steps.
    return Case(f"zoo:{'+'.join(covers)}", lambda: _no_dropout(build()), _images(shape, 10),
                reference=reference, covers=covers, heavy=heavy or reference == "ddp",
                atol=1e-5 if reference == "ddp" else 1e-6, note=note)


def _registry(name: str, shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    return lambda: build_model(name, shape, 10)


def _tiny_resnet(blocks: tuple[int, int, int, int], shape: BlockShape) -> Callable[[], nn.Module]:
    return lambda: ImageNetResNet(RESNET_INPUT, 10, blocks, shape)


TINY = "its class at a small configuration"
RESNET_INPUT = (3, 64, 64)
"""2x2 after the 32x downsampling: batch norm over 1x1 maps of two samples is chaotic in fp32."""
TINY_GPT = Gpt2Config(layers=2, hidden=16, heads=2, vocab=50, positions=12)
TINY_BERT = BertConfig(layers=2, hidden=8, heads=2)


FULL_SIZE_ONLY = {"alexnet": (3, 64, 64), "googlenet": (3, 64, 64), "inception_v3": (3, 139, 139)}
"""Registry models with no small configuration (fixed widths, millions of parameters even at
their smallest input): trained only at full size, by the benchmark script.  The inputs leave
maps of 2x2 or more at the last batch norms: over 1x1 maps of two samples per rank, float32
training is chaotic (float32 against float64 of the same computation differ by 1e3 after three
steps on 3 ranks), and no reference can be matched."""


def full_size_case(name: str, shape: tuple[int, ...]) -> Case:
    """Registry model ``name`` as published, on inputs of ``shape``."""
    return _zoo_case((name,), _registry(name, shape), shape)


def zoo_cases() -> list[Case]:
    """Every registry model: registry-built where small, else its class at a small size."""
    se_resnext = BlockShape(widths=(8, 8, 8, 8), expansion=2, groups=4, squeeze_ratio=4)
    return [
        _zoo_case(("mlp",), _registry("mlp", (1, 8, 8)), (1, 8, 8)),
        _zoo_case(("lenet",), _registry("lenet", (1, 28, 28)), (1, 28, 28)),
        _zoo_case(("resnet20", "resnet56"), _registry("resnet20", (3, 16, 16)), (3, 16, 16),
                  note="ResNet-56 is the same class with 9 blocks a stage instead of 3"),
        _zoo_case(("resnet50", "resnet101"),
                  _tiny_resnet((1, 1, 2, 1), BlockShape(widths=(4, 4, 8, 8), expansion=2)),
                  RESNET_INPUT, note=TINY),
        _zoo_case(("resnext101_32x4d", "se_resnext101_32x4d"),
                  _tiny_resnet((1, 1, 1, 1), se_resnext), RESNET_INPUT, note=TINY),
        _zoo_case(("nvidia_se_resnext101_32x4d",),
                  _tiny_resnet((1, 1, 1, 1), replace(se_resnext, squeeze=4, squeeze_ratio=0)),
                  RESNET_INPUT, note=TINY),
        _zoo_case(("vgg16",), lambda: VGG((3, 32, 32), 10, config=(8, "pool", 8, 8, "pool"),
                                          classifier_width=16), (3, 32, 32), note=TINY),
        _zoo_case(("efficientnet_b0", "efficientnet_b4"),
                  lambda: EfficientNet((3, 64, 64), 10, 0.25, 0.5, 0.4), (3, 64, 64), note=TINY,
                  heavy=True),
        Case("zoo:bert_base+bert_large", lambda: Bert((6,), 3, config=TINY_BERT),
             _tokens(6, 30_522, 3, per_token=False), covers=("bert_base", "bert_large"),
             note=TINY),
        Case("zoo:gpt", lambda: Gpt2((8,), TINY_GPT.vocab, config=TINY_GPT),
             _tokens(8, TINY_GPT.vocab, TINY_GPT.vocab, per_token=True), loss=_token_loss,
             covers=("gpt2", "gpt2_medium", "gpt2_large", "gpt2_xl", "megatron_gpt_1536x16"),
             note=TINY + ", the head tied to the word embeddings as published"),
        Case("zoo:gpt_classifier", lambda: Gpt2((8,), 5, config=TINY_GPT),
             _tokens(8, TINY_GPT.vocab, 5, per_token=True), loss=_token_loss,
             note=TINY + ", a head of its own (classes != vocabulary)"),
    ]


# -- the models users write ---------------------------------------------------------------------
class NoBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class PositionalEncoder(nn.Module):
    """A transformer block over a sinusoidal positional encoding: its only buffers are float."""

    def __init__(self, vocab: int = 20, hidden: int = 8, sequence: int = 5) -> None:
        super().__init__()
        position = torch.arange(sequence, dtype=torch.float32)[:, None]
        frequency = torch.exp(torch.arange(0, hidden, 2) * (-math.log(10_000.0) / hidden))
        encoding = torch.zeros(sequence, hidden)
        encoding[:, 0::2] = torch.sin(position * frequency)
        encoding[:, 1::2] = torch.cos(position * frequency)
        self.register_buffer("encoding", encoding)
        self.register_buffer("scale", torch.tensor(math.sqrt(hidden)), persistent=False)
        self.embed = nn.Embedding(vocab, hidden)
        self.block = nn.TransformerEncoderLayer(hidden, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(hidden, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * self.scale + self.encoding[: tokens.shape[1]]
        out: torch.Tensor = self.head(self.block(x).mean(dim=1))
        return out


class IntegerBuffers(nn.Module):
    """A feature permutation and a step counter: integer buffers only."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("order", torch.randperm(6))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.fc1 = nn.Linear(6, 10)
        self.fc2 = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(x[:, self.order])))
        return out


class BatchNormNet(nn.Module):
    """Batch norm over images and over sequences (the latter a cumulative average, which counts
    its batches in an integer buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.sequence_norm = nn.BatchNorm1d(4, momentum=None)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.norm(self.conv(x))).flatten(2)
        out: torch.Tensor = self.fc(self.sequence_norm(hidden).mean(dim=2))
        return out


class TiedAutoencoder(nn.Module):
    """Decoder and encoder share one weight (registered twice), plus a tied output head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 6)
        self.decoder = nn.Linear(6, 6)
        self.decoder.weight = self.encoder.weight
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.tanh(self.decoder(torch.tanh(self.encoder(x)))))
        return out


class UnusedBranches(nn.Module):
    """A branch run only for flagged samples, and one never run (DDP's find_unused_parameters
    cases): per step, the flagged branch is used by some ranks, by all, or by none."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)
        self.flagged = nn.Linear(8, 3)
        self.never = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x[:, 1:]))
        out = self.fc2(hidden)
        flags = x[:, 0] > 0
        if bool(flags.any()):
            out = out + self.flagged(hidden) * flags[:, None]
        return out


def _flagged_batch(samples: int, step: int) -> tuple[torch.Tensor, ...]:
    """Flags: step 0 only the first sample (one rank); step 1 none; step 2 every sample."""
    x, target = _images((7,), 3)(samples, step)
    x[:, 0] = -1.0
    if step % 3 == 0:
        x[0, 0] = 1.0
    elif step % 3 == 2:
        x[:, 0] = 1.0
    return x, target


class FrozenParts(nn.Module):
    """A frozen embedding and first layer (requires_grad=False before wrapping)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)
        self.embed.requires_grad_(False)
        self.fc1.weight.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(self.embed(tokens).mean(dim=1))))
        return out


class SparseEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 6, sparse=True)
        self.bag = nn.EmbeddingBag(30, 6, mode="sum", sparse=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.embed(tokens).mean(dim=1) + self.bag(tokens))
        return out


class MixedDtypes(nn.Module):
    """A float64 layer between float32 ones (buckets of two dtypes), and an empty parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.wide = nn.Linear(8, 8).double()
        self.fc2 = nn.Linear(8, 3)
        self.empty = nn.Parameter(torch.zeros(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.wide(torch.tanh(self.fc1(x)).double())).float()
        out: torch.Tensor = self.fc2(hidden) + self.empty.sum()
        return out


class Checkpointed(nn.Module):
    """Activation checkpointing, both of torch's kinds: the reentrant one runs its block's
    backward as a backward of its own, inside the outer one."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.second = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = checkpoint(self.first, x, use_reentrant=False)
        hidden = checkpoint(self.second, hidden, use_reentrant=True)
        out: torch.Tensor = self.head(hidden)
        return out


def user_cases() -> list[Case]:
    """Buffers of every kind, batch norm, tied weights, unused, frozen and sparse parameters."""
    return [
        Case("no_buffers", NoBuffers, _images((6,), 3)),
        Case("float_buffers", PositionalEncoder, _tokens(5, 20, 3, per_token=False)),
        Case("integer_buffers", IntegerBuffers, _images((6,), 3)),
        Case("batch_norm", BatchNormNet, _images((2, 4, 4), 3), reference="ddp"),
        Case("tied_weights", TiedAutoencoder, _images((6,), 3)),
        Case("unused_parameters", UnusedBranches, _flagged_batch),
        Case("frozen_before_wrapping", FrozenParts, _tokens(4, 20, 3, per_token=False)),
        Case("sparse_gradients", SparseEmbedding, _tokens(4, 30, 3, per_token=False)),
        Case("mixed_dtypes", MixedDtypes, _images((6,), 3)),
        Case("activation_checkpointing", Checkpointed, _images((6,), 3)),
    ]
