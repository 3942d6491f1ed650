"""GPT-2 (Radford et al., "Language Models are Unsupervised Multitask Learners", 2019).

A decoder-only Transformer over token ids: word and learned position embeddings (up to 1024
positions for GPT-2), ``layers`` pre-norm blocks (layer norm, causal multi-head self-attention,
residual add; layer norm, a GELU feed-forward of ``4 x hidden``, residual add), a final layer
norm and a language-model head over the 50,257-token byte-pair vocabulary whose weights are the
word embeddings' (tied: no gradient of its own).  The four published sizes:

| name | layers | hidden | heads | parameters |
|---|---:|---:|---:|---:|
| ``gpt2`` | 12 | 768 | 12 | 124.4M |
| ``gpt2_medium`` | 24 | 1024 | 16 | 354.8M |
| ``gpt2_large`` | 36 | 1280 | 20 | 774.0M |
| ``gpt2_xl`` | 48 | 1600 | 25 | 1557.6M |

(the counts Hugging Face's ``GPT2LMHeadModel`` has).  Megatron-LM trains the same decoder with its
vocabulary padded to a multiple of 128 (50,304 tokens, ``--make-vocab-size-divisible-by``) and,
in the configurations DLPerf measured, a 2048-token context: ``megatron_gpt_1536x16`` is DLPerf's
data-parallel case (16 layers of 1536, 16 heads; 533.7M parameters), named as DLPerf names it
(hidden width x layers).

The output is ``(batch, sequence, classes)``, next-token logits at every position
(``token_outputs``): with ``num_classes`` the vocabulary the head is the tied one; with any other
number, a per-token classifier of its own.
``input_shape`` is ``(sequence,)``; dropout is left out, as in :mod:`scaledl.models.transformer`.
The head's products are counted by :meth:`TiedHead.forward_flops`, since the head owns no
parameter that the embedding does not own first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from scaledl.models.transformer import SelfAttention, check_sequence, init_normal

__all__ = ["Gpt2", "Gpt2Config", "GPT2_SIZES", "GPT_SIZES", "MEGATRON_VOCAB", "TiedHead",
           "GPT2_VOCAB", "GPT2_POSITIONS"]

GPT2_VOCAB = 50_257
"""GPT-2's byte-pair vocabulary."""
GPT2_POSITIONS = 1024
"""Longest sequence GPT-2's learned position embeddings cover."""


MEGATRON_VOCAB = 50_304
"""GPT-2's vocabulary padded to a multiple of 128, as Megatron-LM pads it on one GPU per model."""


class Gpt2Config(NamedTuple):
    """The size of a GPT-2 decoder."""

    layers: int
    hidden: int
    heads: int
    vocab: int = GPT2_VOCAB
    """Rows of the word embeddings (and logits of the tied head)."""
    positions: int = GPT2_POSITIONS
    """Longest sequence the learned position embeddings cover."""


GPT2_SIZES = {
    "gpt2": Gpt2Config(12, 768, 12),
    "gpt2_medium": Gpt2Config(24, 1024, 16),
    "gpt2_large": Gpt2Config(36, 1280, 20),
    "gpt2_xl": Gpt2Config(48, 1600, 25),
}
"""Layers, hidden width and heads of the published sizes."""

GPT_SIZES = {
    **GPT2_SIZES,
    "megatron_gpt_1536x16": Gpt2Config(16, 1536, 16, vocab=MEGATRON_VOCAB, positions=2048),
}
"""Every GPT decoder the registry builds: GPT-2's sizes and the Megatron-LM configuration DLPerf
measured (Oneflow-Inc/DLPerf ``Megatron-LM/README.md``)."""


class TiedHead(nn.Module):
    """Logits from the word embeddings' own weights (``x @ E^T``)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.weight = embedding.weight  # the same Parameter: counted, and reduced, once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)

    def forward_flops(self, output: torch.Tensor) -> int:
        """``2 x hidden`` FLOPs per logit."""
        return 2 * int(self.weight.shape[1]) * output.numel()


class _Block(nn.Module):
    """Pre-norm causal attention and feed-forward, each added back to its input."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden)
        self.attention = SelfAttention(hidden, heads, causal=True)
        self.feed_norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        out: torch.Tensor = x + self.down(nn.functional.gelu(self.up(self.feed_norm(x))))
        return out


class Gpt2(nn.Module):
    """A GPT-2 decoder with a next-token head (see the module docstring)."""

    input_dtype = torch.long
    token_outputs = True

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 config: Gpt2Config = GPT2_SIZES["gpt2"], name: str = "gpt2") -> None:
        super().__init__()
        check_sequence(name, input_shape, config.positions, example=config.positions)
        hidden = config.hidden
        self.vocab_size = config.vocab
        self.words = nn.Embedding(config.vocab, hidden)
        self.positions = nn.Embedding(config.positions, hidden)
        self.blocks = nn.Sequential(*[_Block(hidden, config.heads) for _ in range(config.layers)])
        self.final_norm = nn.LayerNorm(hidden)
        self.head: nn.Module = (TiedHead(self.words) if num_classes == config.vocab
                                else nn.Linear(hidden, num_classes))
        init_normal(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.long()
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.blocks(self.words(ids) + self.positions(positions))
        logits: torch.Tensor = self.head(self.final_norm(x))
        return logits
