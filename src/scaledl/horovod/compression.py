"""Gradient compression: what ``hvd.Compression.fp16`` and ``hvd.Compression.none`` do, and
``hvd.Compression.bf16`` beside them.

A compressor turns a tensor into the one sent (and a context) and back.  ``fp16`` sends floating
tensors as float16 (half the bytes, about three significant digits) and returns them in their own
dtype; other tensors pass unchanged.  As in Horovod the cast is plain (unscaled): a value beyond
float16's 65504, or a sum beyond it, arrives as ``inf``; ``scaledl.DataParallel(...,
compression="fp16")`` scales to avoid that (:mod:`scaledl.sync.compression`).  ``bf16`` (not in
Horovod, which has ``none`` and ``fp16``) sends bfloat16: the same bytes as float16 with
float32's range, so nothing overflows that float32 would not, at about two to three significant
digits.  The DistributedOptimizer compresses whole gradient buckets.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BF16Compressor", "CastCompressor", "Compression", "Compressor", "FP16Compressor",
           "NoneCompressor"]


class Compressor:
    """Interface: ``compress(tensor) -> (sent, context)``, ``decompress(sent, context)``; this
    base sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and what ``decompress`` needs (here ``(tensor, None)``)."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, context: Any) -> torch.Tensor:
        """The received tensor restored (here ``tensor``)."""
        return tensor


class NoneCompressor(Compressor):
    """Send tensors as they are (Horovod's ``Compression.none``)."""


class CastCompressor(Compressor):
    """Send floating tensors cast to ``wire`` (a subclass names it); others pass unchanged."""

    wire: torch.dtype = torch.float32

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Floating tensors cast to the wire dtype; the context is the original dtype."""
        if tensor.is_floating_point():
            return tensor.to(cls.wire), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, context: Any) -> torch.Tensor:
        """Cast back to the dtype recorded by ``compress``."""
        return tensor.to(context) if context is not None and tensor.dtype != context else tensor


class FP16Compressor(CastCompressor):
    """Send floating tensors as float16."""

    wire = torch.float16


class BF16Compressor(CastCompressor):
    """Send floating tensors as bfloat16."""

    wire = torch.bfloat16


class Compression:
    """The compressors by name, as scripts write them: ``hvd.Compression.fp16``."""

    none = NoneCompressor
    """No compression (the default)."""
    fp16 = FP16Compressor
    """Floating tensors travel as float16."""
    bf16 = BF16Compressor
    """Floating tensors travel as bfloat16 (a scaledl addition)."""
