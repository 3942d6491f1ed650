"""BERT (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers", NAACL 2019).

A post-norm Transformer encoder over token ids: word, position (up to 512) and segment
embeddings with layer norm, then ``layers`` blocks of multi-head self-attention and a GELU
feed-forward of ``4 x hidden``, each closed by a residual add and layer norm, then BERT's pooler
(a tanh dense layer on the first token) and a classifier of ``num_classes`` outputs (sequence
classification, as GLUE fine-tuning).  ``bert_base`` is 12 layers of 768 (12 heads), 109.5M
parameters with two classes; ``bert_large`` 24 of 1024 (16 heads), 335.1M, over BERT's 30,522
word-piece vocabulary.

Pre-training replaces the classifier by the masked-LM head, whose decoder is tied to the word
embeddings (no gradient of its own) and whose dense layer adds about ``hidden^2`` parameters;
fine-tuning for SQuAD puts a two-output dense layer on every token.  Either changes the gradient
bytes by under 0.5%, so the simulator uses this one architecture for both.  Dropout is left
out: it owns no parameter and no FLOP, and a measured profile of this model does not time it.

The input is a batch of token ids, shape ``(batch, sequence)``: ``input_shape`` is
``(sequence,)``.  ``input_dtype`` and ``vocab_size`` tell callers that make inputs (the
profilers) to draw integers in ``[0, vocab_size)``.  :class:`SelfAttention` is one leaf module
that owns its four projections and counts its own FLOPs (:meth:`SelfAttention.forward_flops`),
the two ``sequence x sequence`` products included, which no parameter-owning layer would see;
a leaf, so that a measured profile (hooks on leaf modules) times it as the layer it is.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

__all__ = ["Bert", "BertConfig", "BERT_BASE", "BERT_LARGE", "SelfAttention", "VOCAB_SIZE",
           "MAX_POSITIONS", "check_sequence", "init_normal"]

VOCAB_SIZE = 30_522
"""BERT's uncased English word-piece vocabulary."""
MAX_POSITIONS = 512
"""Longest sequence BERT's learned position embeddings cover."""


def check_sequence(name: str, input_shape: tuple[int, ...], positions: int, example: int
                   ) -> None:
    """``ValueError`` unless ``input_shape`` is one sequence of 1..``positions`` token ids."""
    if len(input_shape) != 1 or not 1 <= int(input_shape[0]) <= positions:
        raise ValueError(
            f"{name} takes token ids of one sequence of 1..{positions} tokens as its input "
            f"shape (e.g. {example}), got {tuple(input_shape)}; it has no image or vector data "
            "set in scaledl train: use it with scaledl simulate"
        )


def init_normal(model: nn.Module) -> None:
    """N(0, 0.02) for every linear and embedding weight, as BERT and GPT-2 initialise them."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)


class BertConfig(NamedTuple):
    """The size of a BERT encoder."""

    layers: int
    hidden: int
    heads: int


BERT_BASE = BertConfig(layers=12, hidden=768, heads=12)
BERT_LARGE = BertConfig(layers=24, hidden=1024, heads=16)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention: fused query/key/value projection, scores,
    softmax, context and output projection, in one module without children; ``causal`` masks
    every token's view of the tokens after it (GPT)."""

    def __init__(self, hidden: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv_weight = nn.Parameter(torch.empty(3 * hidden, hidden))
        self.qkv_bias = nn.Parameter(torch.zeros(3 * hidden))
        self.out_weight = nn.Parameter(torch.empty(hidden, hidden))
        self.out_bias = nn.Parameter(torch.zeros(hidden))
        nn.init.normal_(self.qkv_weight, 0.0, 0.02)
        nn.init.normal_(self.out_weight, 0.0, 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, sequence, hidden = x.shape
        qkv = nn.functional.linear(x, self.qkv_weight, self.qkv_bias)
        qkv = qkv.view(batch, sequence, 3, self.heads, hidden // self.heads)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        scores = query @ key.transpose(-1, -2) / math.sqrt(hidden // self.heads)
        if self.causal:  # a token attends to itself and the tokens before it
            future = torch.ones(sequence, sequence, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        context = scores.softmax(dim=-1) @ value
        merged = context.transpose(1, 2).reshape(batch, sequence, hidden)
        return nn.functional.linear(merged, self.out_weight, self.out_bias)

    def forward_flops(self, output: torch.Tensor) -> int:
        """FLOPs of one sample's call, from its output ``(1, sequence, hidden)``: the query,
        key, value and output projections ``2 x 4 hidden^2`` per token and the score and context
        products ``2 x 2 sequence^2 hidden``."""
        sequence, hidden = int(output.shape[-2]), int(output.shape[-1])
        return 8 * hidden * hidden * sequence + 4 * sequence * sequence * hidden


class _Block(nn.Module):
    """Attention and feed-forward, each with a residual add and post layer norm."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x))
        feed = self.down(nn.functional.gelu(self.up(x)))
        out: torch.Tensor = self.output_norm(x + feed)
        return out


class Bert(nn.Module):
    """A BERT encoder with pooler and sequence classifier over token ids (see the module)."""

    input_dtype = torch.long
    vocab_size = VOCAB_SIZE

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 config: BertConfig = BERT_BASE, name: str = "bert_base") -> None:
        super().__init__()
        check_sequence(name, input_shape, MAX_POSITIONS, example=128)
        hidden = config.hidden
        self.words = nn.Embedding(VOCAB_SIZE, hidden)
        self.positions = nn.Embedding(MAX_POSITIONS, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.blocks = nn.Sequential(*[_Block(hidden, config.heads) for _ in range(config.layers)])
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)
        init_normal(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.long()
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.words(ids) + self.positions(positions) + self.segments(torch.zeros_like(ids))
        x = self.blocks(self.embedding_norm(x))
        pooled = torch.tanh(self.pooler(x[:, 0]))
        logits: torch.Tensor = self.classifier(pooled)
        return logits
