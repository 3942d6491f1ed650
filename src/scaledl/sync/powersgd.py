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

**Placement.** On ``N > 1`` hosts of ``L > 1`` ranks each (the group's topology),
``placement="hosts"`` compresses only what crosses hosts, as BlueConnect and PowerAI DDL split
an allreduce by level (:mod:`scaledl.sync.host_shares`): the bucket is first reduce-scattered
exactly inside each host into ``L`` contiguous shares balanced by their PowerSGD work, one
owned by each local rank; each owner runs steps 1-5 on its share only, with the owners of the
same share on the other hosts (its ``P`` and ``Q`` allreduces cross hosts, among ``N``
ranks); then the owners' ``P``, ``Q`` and uncompressed elements are gathered inside the host
and every rank does step 6 for every share.  Each rank does ``1/L`` of the products and of
the error feedback, which lives with a matrix's owner, for its host's sum:
``e = M_host - L * P Q^T`` (so the errors still sum, over the hosts, to what the flat
algorithm's errors sum to over the ranks).  Since ``P = sum_h M_h Q = sum_i M_i Q`` and
likewise ``Q``, the result is the flat algorithm's, up to float rounding; the initial ``Q`` of
a matrix is the same draw as in the flat algorithm.  With one host nothing crosses hosts and
the average is exact.  ``placement="flat"`` runs the whole algorithm on every rank.  The
reduce-scatter moves the whole bucket inside the host, which costs about what the split saves
with two ranks per host: ``"auto"`` (the default) takes the host placement only on several
hosts where :func:`memory_passes` says it moves clearly less memory per rank
(:data:`HOST_SPLIT_MARGIN`; from ``L = 3`` with error feedback), else the flat one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scaledl.sync.host_shares import HostShares, share_bounds
from scaledl.sync.wire import BucketLayout, GradientCompression, Job, Wire

__all__ = ["PowerSGD", "orthogonalize", "PLACEMENTS", "memory_passes", "HOST_SPLIT_MARGIN"]

log = logging.getLogger(__name__)

PLACEMENTS = ("auto", "flat", "hosts")
"""Where PowerSGD's arithmetic runs: ``hosts`` (exact inside each host, compressed across,
each rank on its share), ``flat`` (every rank on the whole bucket), ``auto`` (``hosts`` on
more than one host of more than one rank where :func:`memory_passes` says the split moves
clearly less memory per rank, so from 3 ranks per host with error feedback; else ``flat``)."""

COMPRESSED_PASSES = 8.0
"""Passes over a compressed matrix's elements its owner makes per step under the host placement
(the error in, 3; the products for ``P`` and ``Q``, 1 each; the error out, 3): the cost
:func:`share_bounds` balances."""
PLAIN_PASSES = 3.0
"""The same for an uncompressed gradient (into the wire buffer, 2; out of it, 1)."""

Reduce = Callable[[torch.Tensor], None]
"""Sums a flat tensor over the ranks that compress together, in place."""
Run = Callable[[Reduce, int], Callable[[], None]]
"""Steps 3-5 given the sum and the number of ranks averaged over; returns step 6."""


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
    draw_offset: int
    """Where its initial ``Q`` lies in the whole bucket's draw (the flat plan's ``q_offset``)."""


@dataclass
class _BucketState:
    """PowerSGD's memory of one bucket (or of this rank's share of it)."""

    source: tuple[BucketLayout, tuple[int, int] | None]
    """The bucket's layout and the share ``[lo, hi)`` this state covers (None: all of it)."""
    layout: BucketLayout
    """The layout of what this state covers, offsets from its start."""
    matrices: list[_Matrix]
    plain: list[tuple[int, int]]
    """``(offset, numel)`` of each gradient averaged uncompressed."""
    plain_numel: int
    p_numel: int
    q: torch.Tensor
    """Every matrix's ``Q`` (stored transposed), flat: the second allreduce's buffer, kept for
    the warm start."""
    draw_numel: int
    """Elements of the whole bucket's ``Q`` draw."""
    error: torch.Tensor | None = None
    """Per compressed element, what the last approximation left out on this rank."""
    steps: int = 0
    wire: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    """The first allreduce's buffer: uncompressed gradients, the tail, every ``P``."""


@dataclass
class _HostState:
    """The host placement's memory of one bucket: its shares and every share's plan."""

    layout: BucketLayout
    bounds: tuple[tuple[int, int], ...]
    """Each local rank's share of the bucket buffer."""
    states: list[_BucketState]
    """Each share's plan; this rank's own share also keeps the error memory and warm start."""
    exchange: torch.Tensor
    """Every share's wire buffer and ``Q``, in share order: gathered inside the host."""
    segments: tuple[tuple[int, int], ...]
    """Each share's part of :attr:`exchange`."""
    compressing: bool
    """Some share holds a compressed matrix."""
    steps: int = 0


class PowerSGD(GradientCompression):
    """Rank-``rank`` PowerSGD with error feedback and warm start (see the module docstring)."""

    def __init__(self, rank: int = 4, start_iter: int = 0, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, warm_start: bool = True, seed: int = 0,
                 placement: str = "auto") -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank={rank!r} must be a positive integer (1, 2, 4 are "
                             "usual)")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"PowerSGD start_iter={start_iter!r} must be an integer >= 0")
        if not isinstance(min_compression_rate, (int, float)) or not (
                min_compression_rate > 0 and math.isfinite(min_compression_rate)):
            raise ValueError(f"PowerSGD min_compression_rate={min_compression_rate!r} must be a "
                             "positive number (torch's default is 2)")
        if placement not in PLACEMENTS:
            raise ValueError(f"PowerSGD placement={placement!r} is not one of {PLACEMENTS}; "
                             "use 'auto' (compress across hosts only, when there are several "
                             "hosts of several ranks), 'hosts' or 'flat'")
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
        self.placement = placement
        """Asked placement (:data:`PLACEMENTS`); :attr:`placed` says what runs."""
        self.placed: str | None = None
        """What runs, once the first bucket has been started: ``"flat"`` (followed, when
        ``"auto"`` declined the host placement on several hosts, by why), or ``"hosts: "``
        followed by the layout and paths (:meth:`HostShares.describe`)."""
        self._states: dict[int, _BucketState] = {}
        self._shares: tuple[Wire, HostShares | None] | None = None
        self._bounds: dict[int, tuple[BucketLayout, tuple[tuple[int, int], ...]]] = {}
        self._host_states: dict[int, _HostState] = {}

    def spec(self) -> str:
        """``"powersgd:RANK"``, plus any non-default setting."""
        extras = [f"{name}={value}" for name, value, default in (
            ("start_iter", self.start_iter, 0),
            ("min_compression_rate", self.min_compression_rate, 2.0),
            ("error_feedback", self.error_feedback, True),
            ("warm_start", self.warm_start, True), ("seed", self.seed, 0),
            ("placement", self.placement, "auto"),
        ) if value != default]
        return f"powersgd:{self.rank}" + (f"({', '.join(extras)})" if extras else "")

    def wire_numel(self, layout: BucketLayout) -> int:
        """Elements one compressed step of a bucket laid out as ``layout`` sends in its two
        allreduces under the flat placement (against ``layout.numel + layout.tail``
        uncompressed)."""
        state = self._plan(0, layout, torch.float32, torch.device("cpu"))
        return state.plain_numel + layout.tail + state.p_numel + state.q.numel()

    def initial_q(self, key: int, layout: BucketLayout) -> list[torch.Tensor]:
        """The ``Q`` every rank starts bucket ``key`` from: one ``m x r`` matrix per compressed
        gradient, in buffer order (for checking the algorithm against another implementation)."""
        state = self._plan(key, layout, torch.float32, torch.device("cpu"))
        return [qt.t().clone() for qt in self._views(state, state.wire)[1]]

    # -- placement ------------------------------------------------------------------------
    def prepare_on(self, wire: Wire, key: int, buffer: torch.Tensor,
                   layout: BucketLayout) -> Job:
        """:meth:`prepare` under the flat placement; under the host placement, nothing now
        (no arithmetic can start before the host's sum), the whole of it in the job."""
        shares = self._host_shares(wire)
        if shares is None:
            return self.prepare(key, buffer, layout)
        _check_floating(buffer)
        return lambda on: self._hosts_job(shares, on, key, buffer, layout)

    def _host_shares(self, wire: Wire) -> HostShares | None:
        """The host shares of ``wire``'s group under the host placement, else None; decided
        once per wire, logged."""
        if self._shares is not None and self._shares[0] is wire:
            return self._shares[1]
        topology = getattr(wire, "topology", None)
        comm = getattr(wire, "comm", None)
        shares, why = None, ""
        if self.placement != "flat" and topology is not None and comm is not None:
            per_host = topology.ranks_per_node
            several = topology.num_nodes > 1 and per_host > 1
            split, flat = memory_passes(per_host, self.error_feedback)
            pays = split <= HOST_SPLIT_MARGIN * flat
            if self.placement == "hosts" or (several and pays):
                shares = HostShares(comm, topology)
            elif several:
                why = (f" (auto: {per_host} ranks per host; the host split's modelled memory "
                       f"passes, {split:.2f} per element, are more than "
                       f"{HOST_SPLIT_MARGIN:g} of the flat algorithm's {flat:.2f})")
        self._shares = (wire, shares)
        self.placed = "flat" + why if shares is None else "hosts: " + shares.describe()
        log.info("%s placement %s (asked %s)", self.spec(), self.placed, self.placement)
        return shares

    def _hosts_job(self, shares: HostShares, wire: Wire, key: int, buffer: torch.Tensor,
                   layout: BucketLayout) -> Callable[[], None] | None:
        """The host placement's job for one bucket (module docstring, "Placement"); returns
        the rebuilding of every share from the gathered ``P`` and ``Q``, which runs on the
        thread that waits for the bucket (as the flat placement's step 6), so the communicator
        goes on with the next bucket meanwhile."""
        host = self._host_state(key, layout, shares, buffer)
        host.steps += 1
        p, owner = wire.world_size, shares.local_rank
        shares.reduce_to_owners(buffer, host.bounds)
        wire.sent += buffer.numel() * buffer.element_size()
        lo, hi = host.bounds[owner]
        share = buffer[lo:hi]

        def across(tensor: torch.Tensor) -> None:
            shares.allreduce_across(tensor)
            wire.sent += tensor.numel() * tensor.element_size()
        if host.steps <= self.start_iter or not host.compressing or shares.hosts == 1:
            # exact (with one host nothing crosses hosts: the host's sum is the whole sum)
            if shares.hosts > 1:
                across(share)
            share.div_(p)
            shares.gather_from_owners(buffer, host.bounds)
            return None
        state = host.states[owner]
        state.steps = host.steps  # a fresh Q each step without warm start, as the flat one's
        gradients, tail, matrices, outputs, ps, qts = self._local(state, key, share)
        across(state.wire)
        for matrix, p_view, qt in zip(matrices, ps, qts):
            orthogonalize(p_view)
            torch.mm(p_view.t(), matrix, out=qt)  # Q^T = P^T M
        across(state.q)
        state.q.div_(p)
        # every rank rebuilds every share from its owner's P, Q and uncompressed elements
        shares.gather_from_owners(host.exchange, host.segments)

        def rebuild() -> None:
            for index, (covered, (start, end)) in enumerate(zip(host.states, host.bounds)):
                mine = index == owner
                region = buffer[start:end]
                count = covered.layout.numel
                self._decompress(covered, p, region[:count],
                                 region[count:count + covered.layout.tail],
                                 matrices if mine and self.error_feedback else None,
                                 shares.ranks_per_host)
        return rebuild

    def _host_state(self, key: int, layout: BucketLayout, shares: HostShares,
                    buffer: torch.Tensor) -> _HostState:
        """Bucket ``key``'s shares and the plan of each (this rank's with its ``Q`` drawn);
        every share's wire buffer and ``Q`` live in one exchange buffer, in share order."""
        host = self._host_states.get(key)
        if host is not None and host.layout == layout and \
                host.exchange.device == buffer.device and host.exchange.dtype == buffer.dtype:
            return host
        bounds = self._share_bounds(key, layout, shares.ranks_per_host)
        states = [self._plan(key, layout, buffer.dtype, buffer.device, share,
                             draw=index == shares.local_rank)
                  for index, share in enumerate(bounds)]
        exchange = torch.empty(sum(s.wire.numel() + s.q.numel() for s in states),
                               dtype=buffer.dtype, device=buffer.device)
        segments, position = [], 0
        for state in states:
            wire_numel, q_numel = state.wire.numel(), state.q.numel()
            q_view = exchange[position + wire_numel:position + wire_numel + q_numel]
            q_view.copy_(state.q)
            state.wire, state.q = exchange[position:position + wire_numel], q_view
            segments.append((position, position + wire_numel + q_numel))
            position += wire_numel + q_numel
        host = _HostState(layout, bounds, states, exchange, tuple(segments),
                          any(s.matrices for s in states))
        self._host_states[key] = host
        return host

    def _share_bounds(self, key: int, layout: BucketLayout, parts: int
                      ) -> tuple[tuple[int, int], ...]:
        """The shares of bucket ``key``, balanced by :data:`COMPRESSED_PASSES` and
        :data:`PLAIN_PASSES` (cached per layout)."""
        cached = self._bounds.get(key)
        if cached is not None and cached[0] == layout:
            return cached[1]
        compressed = {m.offset for m in self._plan(key, layout, torch.float32,
                                                   torch.device("cpu"), draw=False).matrices}
        order = sorted(range(len(layout.offsets)), key=lambda i: layout.offsets[i])
        starts = [layout.offsets[i] for i in order]
        if starts:
            starts[0] = 0  # anything before the first gradient goes with it
        costs = [math.prod(layout.shapes[i]) * (
            COMPRESSED_PASSES if layout.offsets[i] in compressed else PLAIN_PASSES)
            for i in order]
        bounds = share_bounds(starts, costs, layout.numel + layout.tail, parts)
        self._bounds[key] = (layout, bounds)
        return bounds

    # -- the algorithm ----------------------------------------------------------------------
    def prepare(self, key: int, buffer: torch.Tensor, layout: BucketLayout) -> Job:
        """Steps 1-2 of the module docstring now (error feedback, ``P = M Q``, the first
        wire buffer packed); steps 3-5 (two allreduces) in the job; step 6 after it."""
        _check_floating(buffer)
        run = self._begin(key, buffer, layout, None, 1)

        def job(wire: Wire) -> Callable[[], None]:
            return run(lambda tensor: wire.allreduce(tensor, "sum"), wire.world_size)
        return job

    def _begin(self, key: int, buffer: torch.Tensor, layout: BucketLayout,
               share: tuple[int, int] | None, error_scale: int) -> Run:
        """Steps 1-2 on ``buffer`` (the bucket, or the share ``[lo, hi)`` of it); the rest
        as a :data:`Run`.  ``error_scale`` is how many ranks' gradients ``buffer`` sums."""
        state = self._states.get(key)
        if state is None or state.source != (layout, share) or state.q.device != buffer.device:
            state = self._plan(key, layout, buffer.dtype, buffer.device, share)
            self._states[key] = state
        state.steps += 1
        if state.steps <= self.start_iter or not state.matrices:
            def plain(reduce: Reduce, p: int) -> Callable[[], None]:
                reduce(buffer)

                def average() -> None:
                    buffer.div_(p)
                return average
            return plain
        gradients, tail, matrices, outputs, ps, qts = self._local(state, key, buffer)

        def run(reduce: Reduce, p: int) -> Callable[[], None]:
            reduce(state.wire)
            for matrix, p_view, qt in zip(matrices, ps, qts):
                orthogonalize(p_view)
                torch.mm(p_view.t(), matrix, out=qt)  # Q^T = P^T M
            reduce(state.q)

            def finish() -> None:
                state.q.div_(p)
                self._decompress(state, p, gradients, tail,
                                 matrices if self.error_feedback else None, error_scale)
            return finish
        return run

    def _local(self, state: _BucketState, key: int, buffer: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor],
                          list[torch.Tensor], list[torch.Tensor]]:
        """Steps 1-2 on what ``state`` covers of ``buffer``: the input ``M`` (with the error
        added), ``P = M Q`` and the uncompressed elements in the wire buffer.  Returns the
        gradients, the tail, the inputs, the gradients as matrices, the ``P`` and ``Q^T``."""
        count = state.layout.numel
        gradients, tail = buffer[:count], buffer[count:count + state.layout.tail]
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
        sent[position:position + state.layout.tail].copy_(tail)
        ps, qts = self._views(state, sent)
        for matrix, p_view, qt in zip(matrices, ps, qts):
            torch.mm(matrix, qt.t(), out=p_view)
        return gradients, tail, matrices, outputs, ps, qts

    def _decompress(self, state: _BucketState, p: int, gradients: torch.Tensor,
                    tail: torch.Tensor, errors: list[torch.Tensor] | None,
                    error_scale: int) -> None:
        """Step 6 from ``state``'s summed wire buffer and averaged ``Q``: the uncompressed
        gradients and the tail averaged, each matrix's ``P Q^T`` written over it and, given
        the ``errors`` (holding the inputs), ``e = M_in - error_scale * P Q^T`` in place."""
        sent = state.wire
        position = 0
        for offset, numel in state.plain:
            gradients[offset:offset + numel].copy_(sent[position:position + numel]).div_(p)
            position += numel
        tail.copy_(sent[position:position + state.layout.tail]).div_(p)
        ps, qts = self._views(state, sent)
        outputs = []
        for m, p_view, qt in zip(state.matrices, ps, qts):
            output = gradients[m.offset:m.offset + m.rows * m.cols].view(m.rows, m.cols)
            torch.mm(p_view, qt, out=output)  # P Q^T
            outputs.append(output)
        if errors is not None:
            # subtracting the written output beats recomputing P Q^T into the error with
            # addmm_ (measured 1.34x slower for ResNet-50's matrices, one thread)
            for error, output in zip(errors, outputs):
                error.sub_(output, alpha=error_scale)

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
              device: torch.device, share: tuple[int, int] | None = None,
              draw: bool = True) -> _BucketState:
        """Which gradients of the bucket (or of its share ``[lo, hi)``) are compressed, with
        what rank, where their ``P`` and ``Q`` go; the initial ``Q`` (unless not ``draw``)."""
        lo, hi = share if share is not None else (0, layout.numel + layout.tail)
        matrices: list[_Matrix] = []
        plain: list[tuple[int, int]] = []
        shapes: list[tuple[int, ...]] = []
        offsets: list[int] = []
        p_numel = q_numel = draw_numel = 0
        for shape, offset in zip(layout.shapes, layout.offsets):
            numel = math.prod(shape)
            rows = shape[0] if len(shape) >= 2 and numel else 0
            cols = numel // rows if rows else 0
            rank = min(self.rank, rows, cols)
            compressed = rows > 0 and (rows + cols) * rank * self.min_compression_rate \
                < rows * cols
            mine = lo <= offset < hi
            if mine:
                shapes.append(shape)
                offsets.append(offset - lo)
            if compressed and mine:
                matrices.append(_Matrix(offset - lo, rows, cols, rank, p_numel, q_numel,
                                        draw_numel))
                p_numel += rows * rank
                q_numel += cols * rank
            elif mine:
                plain.append((offset - lo, numel))
            if compressed:  # the whole bucket's draw, so a matrix starts alike in any share
                draw_numel += cols * rank
        tail = max(0, hi - max(lo, layout.numel))
        covered = BucketLayout(tuple(shapes), tuple(offsets), tail) if share is not None \
            else layout
        plain_numel = sum(numel for _, numel in plain)
        state = _BucketState(
            (layout, share), covered, matrices, plain, plain_numel, p_numel,
            torch.empty(q_numel, dtype=dtype, device=device), draw_numel,
            wire=torch.empty(plain_numel + tail + p_numel, dtype=dtype, device=device),
        )
        if draw:
            self._fresh_q(state, key, 0)
        return state

    def _fresh_q(self, state: _BucketState, key: int, step: int) -> None:
        """Standard-normal ``Q``s, orthogonalised, from a generator seeded by (seed, bucket,
        step): identical on every rank without communicating.  The whole bucket's ``Q`` is
        drawn, and each matrix covered takes its part of the draw."""
        generator = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + key * 7_919 + step) % (2 ** 63))
        values = torch.randn(state.draw_numel, generator=generator, dtype=torch.float32)
        for m in state.matrices:
            numel = m.cols * m.rank
            state.q[m.q_offset:m.q_offset + numel].copy_(
                values[m.draw_offset:m.draw_offset + numel])
        for qt in self._views(state, state.wire)[1]:
            orthogonalize(qt.t())


HOST_SPLIT_MARGIN = 0.85
"""``placement="auto"`` splits by host only when the split's modelled memory passes are at
most this fraction of the flat algorithm's: with 2 ranks per host they are 0.94 of them, and
the split measured 1.13-1.48x slower on the emulated 2x2 cluster (docs/benchmarks.md), the
reduce-scatter's waits among ranks that share cores being outside the count."""


def memory_passes(ranks_per_host: int, error_feedback: bool = True) -> tuple[float, float]:
    """Memory passes per gradient element and rank of one PowerSGD step, under the host
    placement and under the flat one, for ``ranks_per_host`` (``L``) ranks sharing a host's
    memory: what ``placement="auto"`` compares (a rank-``r`` step is memory-bound on a CPU).

    Flat: ``P`` and ``Q`` read ``M`` once each, the output is written once, and error feedback
    adds 3 passes in (``e += g``) and 3 out (``e -= P Q^T``): 9.  Host placement: the
    shared-memory reduce-scatter copies the bucket into a window (2) and sums its share from
    ``L`` copies (``(L + 1) / L``), the owner's products and error feedback (8) run on ``1/L``
    of the elements, every rank writes every output (1): ``4 + 9 / L`` with error feedback
    (8.5 at ``L = 2``, 7 at ``L = 3``), always more than the flat 3 without.
    """
    feedback = 6.0 if error_feedback else 0.0
    flat = 3.0 + feedback
    split = 2.0 + (ranks_per_host + 1) / ranks_per_host + (2.0 + feedback) / ranks_per_host + 1.0
    return split, flat


def _check_floating(buffer: torch.Tensor) -> None:
    if not buffer.is_floating_point():
        raise TypeError(f"PowerSGD needs floating-point gradients, got a {buffer.dtype} "
                        "bucket; use compression='none'")


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
