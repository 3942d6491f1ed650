"""GPT-2 (Radford et al., "Language Models are Unsupervised Multitask Learners", 2019).

A decoder-only Transformer over token ids: word and learned position embeddings (up to 1024
positions), ``layers`` pre-norm blocks (layer norm, causal multi-head self-attention, residual
add; layer norm, a GELU feed-forward of ``4 x hidden``, residual add), a final layer norm and a
language-model head over the 50,257-token byte-pair vocabulary whose weights are the word
embeddings' (tied: no gradient of its own).  The four published sizes:

| name | layers | hidden | heads | parameters |
|---|---:|---:|---:|---:|
| ``gpt2`` | 12 | 768 | 12 | 124.4M |
| ``gpt2_medium`` | 24 | 1024 | 16 | 354.8M |
| ``gpt2_large`` | 36 | 1280 | 20 | 774.0M |
| ``gpt2_xl`` | 48 | 1600 | 25 | 1557.6M |

(the counts Hugging Face's ``GPT2LMHeadModel`` has).  The output is ``(batch, sequence,
classes)``, next-token logits at every position (``token_outputs``): with ``num_classes`` the
vocabulary the head is the tied one; with any other number, a per-token classifier of its own.
``input_shape`` is ``(sequence,)``; dropout is left out, as in :mod:`scaledl.models.transformer`.
The head's products are counted by :meth:`TiedHead.forward_flops`, since the head owns no
parameter that the embedding does not own first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from scaledl.models.transformer import SelfAttention, check_sequence, init_normal

__all__ = ["Gpt2", "Gpt2Config", "GPT2_SIZES", "TiedHead", "GPT2_VOCAB", "GPT2_POSITIONS"]

GPT2_VOCAB = 50_257
"""GPT-2's byte-pair vocabulary."""
GPT2_POSITIONS = 1024
"""Longest sequence GPT-2's learned position embeddings cover."""


class Gpt2Config(NamedTuple):
    """The size of a GPT-2 decoder."""

    layers: int
    hidden: int
    heads: int


GPT2_SIZES = {
    "gpt2": Gpt2Config(12, 768, 12),
    "gpt2_medium": Gpt2Config(24, 1024, 16),
    "gpt2_large": Gpt2Config(36, 1280, 20),
    "gpt2_xl": Gpt2Config(48, 1600, 25),
}
"""Layers, hidden width and heads of the published sizes."""


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
    vocab_size = GPT2_VOCAB
    token_outputs = True

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 config: Gpt2Config = GPT2_SIZES["gpt2"], name: str = "gpt2") -> None:
        super().__init__()
        check_sequence(name, input_shape, GPT2_POSITIONS, example=1024)
        hidden = config.hidden
        self.words = nn.Embedding(GPT2_VOCAB, hidden)
        self.positions = nn.Embedding(GPT2_POSITIONS, hidden)
        self.blocks = nn.Sequential(*[_Block(hidden, config.heads) for _ in range(config.layers)])
        self.final_norm = nn.LayerNorm(hidden)
        self.head: nn.Module = (TiedHead(self.words) if num_classes == GPT2_VOCAB
                                else nn.Linear(hidden, num_classes))
        init_normal(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.long()
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.blocks(self.words(ids) + self.positions(positions))
        logits: torch.Tensor = self.head(self.final_norm(x))
        return logits
