"""SyncBatchNorm: batch normalization with statistics over the whole global batch.

In training, each rank computes the per-channel sum, sum of squares and element count of its
batch; one differentiable allreduce (Sum) of the three gives every rank the global mean and
(biased) variance, which normalize the local batch.  Autograd does the rest: the allreduce's
gradient is the allreduce of the gradients, so backward needs no hand-written rule.  The
running statistics are updated with the unbiased global variance, as ``torch.nn.BatchNorm``
does on one process; in evaluation the running statistics are used, without communication.
It works on CPU and GPU and with batches of different sizes on different ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from scaledl.horovod.differentiable import allreduce
from scaledl.horovod.process_sets import ProcessSet, global_process_set
from scaledl.horovod.reduce_ops import Sum

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm1d/2d/3d`` whose training statistics span all ranks."""

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
        affine: bool = True, track_running_stats: bool = True,
        process_set: ProcessSet = global_process_set,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects a tensor with a channel dimension (N, C, "
                             f"...), got {input.dim()}-d input")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize with global batch statistics in training, running ones in evaluation."""
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                self.eps)
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        wide = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.tensor([input.numel() / channels], dtype=wide.dtype, device=input.device)
        local = torch.cat([wide.sum(dims), (wide * wide).sum(dims), count])
        total = allreduce(local, op=Sum, name="SyncBatchNorm", process_set=self.process_set)
        n = total[-1]
        mean = total[:channels] / n
        var = (total[channels:2 * channels] / n - mean * mean).clamp_min(0.0)
        self._update_running_stats(mean.detach(), var.detach(), float(n.item()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        scale = torch.rsqrt(var.view(shape) + self.eps).to(input.dtype)
        output = (input - mean.view(shape).to(input.dtype)) * scale
        if self.affine:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        return output

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        if not (self.training and self.track_running_stats):
            return
        assert self.num_batches_tracked is not None
        assert self.running_mean is not None and self.running_var is not None
        self.num_batches_tracked.add_(1)
        factor = (1.0 / float(self.num_batches_tracked)) if self.momentum is None \
            else self.momentum
        unbiased = var * (n / max(n - 1.0, 1.0))
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
