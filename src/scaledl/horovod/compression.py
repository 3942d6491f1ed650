"""Gradient compression: what ``hvd.Compression.fp16`` and ``hvd.Compression.none`` do.

A compressor turns a tensor into the one sent (and a context) and back.  ``fp16`` sends floating
tensors as float16 (half the bytes, about three significant digits) and returns them in their own
dtype; other tensors pass unchanged.  The DistributedOptimizer compresses whole gradient buckets.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


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


class FP16Compressor(Compressor):
    """Send floating tensors as float16."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Floating tensors cast to float16; the context is the original dtype."""
        if tensor.is_floating_point():
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, context: Any) -> torch.Tensor:
        """Cast back to the dtype recorded by ``compress``."""
        return tensor.to(context) if context is not None and tensor.dtype != context else tensor


class Compression:
    """The compressors by name, as scripts write them: ``hvd.Compression.fp16``."""

    none = NoneCompressor
    """No compression (the default)."""
    fp16 = FP16Compressor
    """Floating tensors travel as float16."""
