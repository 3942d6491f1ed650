"""PowerSGD: low-rank gradient compression with error feedback (Vogels, Karimireddy and Jaggi,
"PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019,
arXiv:1905.13727, Algorithms 1 and 2).

Each gradient of two or more dimensions is viewed as a matrix ``M`` of ``n`` rows (its first
dimension) and ``m`` columns (the rest) and averaged as a rank-``r`` approximation.  Per bucket
and step, on ``p`` ranks:

1. error feedback: add to every compressed matrix what the previous step's approximation of it
   left out on this rank (``e``; zero at the first step): ``M <- M + e``;
2. ``P = M Q`` (``n x r``), with ``Q`` (``m x r``) the previous step's averaged ``Q`` (warm
   start: one power iteration per step keeps refining the same subspace), or at the first step
   (or every step without warm start) a standard-normal matrix drawn from a generator seeded
   alike on every rank, orthogonalised;
3. one allreduce (sum) carries every ``P`` of the bucket and, beside them, the gradients that
   are not compressed: 1-D tensors (biases, norms), matrices too small to gain (see below), and
   DataParallel's per-parameter flags; those are divided by ``p``;
4. orthogonalise each summed ``P`` (Gram-Schmidt over its ``r`` columns; a zero column stays
   zero, where torch's hook needs an epsilon), so ``P`` spans the dominant column space of
   the summed gradient;
5. ``Q = M^T P`` (``m x r``); a second allreduce sums every ``Q``, divided by ``p``;
6. the averaged approximation is ``P Q^T`` on every rank, written over ``M``;
   ``e = M_in - P Q^T`` is kept for step 1 of the next step (``M_in`` the input of step 2).

A matrix is compressed only when ``(n + m) * r * min_compression_rate < n * m``, with ``r``
lowered to ``min(r, n, m)``: it must send at least ``min_compression_rate`` times fewer
elements.  The error of step 6 is taken against the averaged approximation, as the authors'
code and torch's ``powerSGD_hook`` do (summed over the ranks it equals the paper's local error,
so the averaged update is the same).  Uncompressed tensors get no error term: they are averaged
exactly.

Cost per bucket: two allreduces of ``sum (n + m) r`` elements (plus the uncompressed ones)
instead of one of ``sum n m``; compute ``4 n m r`` flops per matrix for ``P`` and ``Q``,
``2 n m r`` for the approximation, and ``O(n r^2)`` for Gram-Schmidt.

``start_iter`` steps of each bucket are first averaged uncompressed (torch's
``start_powerSGD_iter``; 0 by default here: a DataParallel bucket keeps its layout from the
first step, while DDP rebuilds its buckets after the first step, which resets this state per
bucket when the layout changes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scaledl.sync.wire import BucketLayout, GradientCompression, Job, Wire

__all__ = ["PowerSGD", "orthogonalize"]


@dataclass(frozen=True)
class _Matrix:
    """A compressed gradient: where it is, its matrix shape, its rank and where its ``P`` and
    ``Q`` live in the wire buffers."""

    offset: int
    rows: int
    cols: int
    rank: int
    p_offset: int
    q_offset: int


@dataclass
class _BucketState:
    """PowerSGD's memory of one bucket."""

    layout: BucketLayout
    matrices: list[_Matrix]
    plain: list[tuple[int, int]]
    """``(offset, numel)`` of each gradient averaged uncompressed."""
    plain_numel: int
    p_numel: int
    q: torch.Tensor
    """Every matrix's ``Q`` (stored transposed), flat: the second allreduce's buffer, kept for
    the warm start."""
    error: torch.Tensor | None = None
    """Per compressed element, what the last approximation left out on this rank."""
    steps: int = 0
    wire: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    """The first allreduce's buffer: uncompressed gradients, the tail, every ``P``."""


class PowerSGD(GradientCompression):
    """Rank-``rank`` PowerSGD with error feedback and warm start (see the module docstring)."""

    def __init__(self, rank: int = 4, start_iter: int = 0, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, warm_start: bool = True, seed: int = 0) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank={rank!r} must be a positive integer (1, 2, 4 are "
                             "usual)")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"PowerSGD start_iter={start_iter!r} must be an integer >= 0")
        if not isinstance(min_compression_rate, (int, float)) or not (
                min_compression_rate > 0 and math.isfinite(min_compression_rate)):
            raise ValueError(f"PowerSGD min_compression_rate={min_compression_rate!r} must be a "
                             "positive number (torch's default is 2)")
        self.rank = rank
        """Columns of ``P`` and ``Q`` (lowered per matrix to ``min(rank, n, m)``)."""
        self.start_iter = start_iter
        """Steps of each bucket averaged uncompressed before compressing."""
        self.min_compression_rate = float(min_compression_rate)
        """A matrix is compressed only if it then sends this many times fewer elements."""
        self.error_feedback = error_feedback
        """Carry what an approximation left out into the next step (Algorithm 2)."""
        self.warm_start = warm_start
        """Start each step's power iteration from the previous step's ``Q``."""
        self.seed = seed
        """Seeds the initial ``Q`` (identical on every rank)."""
        self._states: dict[int, _BucketState] = {}

    def spec(self) -> str:
        """``"powersgd:RANK"``, plus any non-default setting."""
        extras = [f"{name}={value}" for name, value, default in (
            ("start_iter", self.start_iter, 0),
            ("min_compression_rate", self.min_compression_rate, 2.0),
            ("error_feedback", self.error_feedback, True),
            ("warm_start", self.warm_start, True), ("seed", self.seed, 0),
        ) if value != default]
        return f"powersgd:{self.rank}" + (f"({', '.join(extras)})" if extras else "")

    def wire_numel(self, layout: BucketLayout) -> int:
        """Elements one compressed step of a bucket laid out as ``layout`` sends in its two
        allreduces (against ``layout.numel + layout.tail`` uncompressed)."""
        state = self._plan(0, layout, torch.float32, torch.device("cpu"))
        return state.plain_numel + layout.tail + state.p_numel + state.q.numel()

    def initial_q(self, key: int, layout: BucketLayout) -> list[torch.Tensor]:
        """The ``Q`` every rank starts bucket ``key`` from: one ``m x r`` matrix per compressed
        gradient, in buffer order (for checking the algorithm against another implementation)."""
        state = self._plan(key, layout, torch.float32, torch.device("cpu"))
        return [qt.t().clone() for qt in self._views(state, state.wire)[1]]

    # -- the algorithm ----------------------------------------------------------------------
    def prepare(self, key: int, buffer: torch.Tensor, layout: BucketLayout) -> Job:
        """Steps 1-2 of the module docstring now (error feedback, ``P = M Q``, the first
        wire buffer packed); steps 3-5 (two allreduces) in the job; step 6 after it."""
        if not buffer.is_floating_point():
            raise TypeError(f"PowerSGD needs floating-point gradients, got a {buffer.dtype} "
                            "bucket; use compression='none'")
        state = self._states.get(key)
        if state is None or state.layout != layout or state.q.device != buffer.device:
            state = self._plan(key, layout, buffer.dtype, buffer.device)
            self._states[key] = state
        state.steps += 1
        if state.steps <= self.start_iter or not state.matrices:
            def plain(wire: Wire) -> None:
                wire.allreduce(buffer, "avg")
            return plain
        count = layout.numel
        gradients, tail = buffer[:count], buffer[count:]
        outputs = [gradients[m.offset:m.offset + m.rows * m.cols].view(m.rows, m.cols)
                   for m in state.matrices]
        matrices = outputs
        if self.error_feedback:
            # the input M + e is built in the error memory (one pass fewer than in the
            # gradients); the approximation is written to the gradients and subtracted below
            matrices = self._errors(state)
            for error, gradient in zip(matrices, outputs):
                error.add_(gradient)
        if not self.warm_start and state.steps > self.start_iter + 1:
            self._fresh_q(state, key, state.steps)
        sent = state.wire
        position = 0
        for offset, numel in state.plain:
            sent[position:position + numel].copy_(gradients[offset:offset + numel])
            position += numel
        sent[position:position + layout.tail].copy_(tail)
        ps, qts = self._views(state, sent)
        for matrix, p_view, qt in zip(matrices, ps, qts):
            torch.mm(matrix, qt.t(), out=p_view)

        def job(wire: Wire) -> Callable[[], None]:
            wire.allreduce(sent, "sum")
            for matrix, p_view, qt in zip(matrices, ps, qts):
                orthogonalize(p_view)
                torch.mm(p_view.t(), matrix, out=qt)  # Q^T = P^T M
            wire.allreduce(state.q, "sum")
            return lambda: self._finish(state, wire.world_size, gradients, tail, sent,
                                        matrices, outputs, ps, qts)
        return job

    def _finish(self, state: _BucketState, p: int, gradients: torch.Tensor,
                tail: torch.Tensor, sent: torch.Tensor, matrices: list[torch.Tensor],
                outputs: list[torch.Tensor], ps: list[torch.Tensor],
                qts: list[torch.Tensor]) -> None:
        """Step 6 and the uncompressed gradients' average, once both allreduces are done."""
        position = 0
        for offset, numel in state.plain:
            gradients[offset:offset + numel].copy_(sent[position:position + numel]).div_(p)
            position += numel
        tail.copy_(sent[position:position + state.layout.tail]).div_(p)
        state.q.div_(p)
        for output, p_view, qt in zip(outputs, ps, qts):
            torch.mm(p_view, qt, out=output)  # P Q^T
        if self.error_feedback:
            for error, output in zip(matrices, outputs):
                error.sub_(output)

    def _views(self, state: _BucketState, sent: torch.Tensor
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each matrix's ``P`` (``n x r``, in the first wire buffer) and ``Q`` transposed
        (``r x m``, in the flat ``Q``): every product then reads ``M`` row by row, which on
        a CPU is 3-10x faster than ``M @ Q`` with ``Q`` stored ``m x r``."""
        base = state.plain_numel + state.layout.tail
        ps = [sent[base + m.p_offset:base + m.p_offset + m.rows * m.rank].view(m.rows, m.rank)
              for m in state.matrices]
        qs = [state.q[m.q_offset:m.q_offset + m.cols * m.rank].view(m.rank, m.cols)
              for m in state.matrices]
        return ps, qs

    def _errors(self, state: _BucketState) -> list[torch.Tensor]:
        """Each compressed matrix's error-feedback memory (zeros at first), as a view."""
        if state.error is None:
            state.error = torch.zeros(sum(m.rows * m.cols for m in state.matrices),
                                      dtype=state.q.dtype, device=state.q.device)
        views, position = [], 0
        for m in state.matrices:
            views.append(state.error[position:position + m.rows * m.cols].view(m.rows, m.cols))
            position += m.rows * m.cols
        return views

    # -- planning -----------------------------------------------------------------------------
    def _plan(self, key: int, layout: BucketLayout, dtype: torch.dtype,
              device: torch.device) -> _BucketState:
        """Which gradients of the bucket are compressed, with what rank, where their ``P`` and
        ``Q`` go; the initial ``Q``."""
        matrices: list[_Matrix] = []
        plain: list[tuple[int, int]] = []
        p_numel = q_numel = 0
        for shape, offset in zip(layout.shapes, layout.offsets):
            numel = math.prod(shape)
            if len(shape) < 2 or numel == 0:
                plain.append((offset, numel))
                continue
            rows, cols = shape[0], numel // shape[0]
            rank = min(self.rank, rows, cols)
            if (rows + cols) * rank * self.min_compression_rate >= rows * cols:
                plain.append((offset, numel))
                continue
            matrices.append(_Matrix(offset, rows, cols, rank, p_numel, q_numel))
            p_numel += rows * rank
            q_numel += cols * rank
        plain_numel = sum(numel for _, numel in plain)
        state = _BucketState(
            layout, matrices, plain, plain_numel, p_numel,
            torch.empty(q_numel, dtype=dtype, device=device),
            wire=torch.empty(plain_numel + layout.tail + p_numel, dtype=dtype, device=device),
        )
        self._fresh_q(state, key, 0)
        return state

    def _fresh_q(self, state: _BucketState, key: int, step: int) -> None:
        """Standard-normal ``Q``s, orthogonalised, from a generator seeded by (seed, bucket,
        step): identical on every rank without communicating."""
        generator = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + key * 7_919 + step) % (2 ** 63))
        values = torch.randn(state.q.numel(), generator=generator, dtype=torch.float32)
        state.q.copy_(values)
        for qt in self._views(state, state.wire)[1]:
            orthogonalize(qt.t())


def orthogonalize(matrix: torch.Tensor) -> None:
    """Make the columns of ``matrix`` orthonormal in place (modified Gram-Schmidt, column by
    column); a zero column (a gradient of lower rank than ``r``) stays zero instead of turning
    to NaN."""
    tiny = torch.finfo(matrix.dtype).tiny
    for index in range(matrix.shape[1]):
        column = matrix[:, index]
        column.div_(torch.linalg.vector_norm(column).clamp_min(tiny))
        if index + 1 < matrix.shape[1]:
            rest = matrix[:, index + 1:]
            rest.sub_(torch.outer(column, column @ rest))
