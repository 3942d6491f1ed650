"""One call signature: what the ranks must agree on before a call, in one encoding and one exchange.

Every place where ranks check that they are making the same call uses :class:`Signature`:
joining the job (:mod:`scaledl.bootstrap`: the requested layout), opening a communicator (the
group's default layout), a collective in debug mode (:mod:`scaledl.collectives.call`), a
shared-memory stage (:mod:`scaledl.collectives.shm_calls`: the packed :meth:`Signature.word`),
wrapping a model (:mod:`scaledl.sync.consistency`), Horovod's negotiation and its process sets.

The protocol (:func:`agree`):

1. every rank encodes its signature as one fixed-length row of int64 (:meth:`Signature.encode`):
   the packed word (kind, dtype, op, root, element count), the full element count, root and
   shape, two integers of per-rank data that are shared but not compared (``data``), and a
   63-bit digest and the byte length of each text field (algorithm, layout, name, detail and
   the rank's own *problem*);
2. one allgather of the rows: every rank holds every row and so reaches the same verdict;
3. only when the verdict is a failure, a second allgather carries the text fields themselves
   (their lengths are in the rows, so every rank knows the padded size), so the one error,
   raised on every rank, names both sides in words: ``rank 0 called allreduce of 1000 float32
   (sum) but rank 1 called allreduce of 998 float32 (sum)``.

Both rounds complete on every rank before anyone raises, so a mismatch fails that call alone and
the group stays usable for the next one.  A rank's *problem* (an argument only it can judge, such
as a root outside the group) travels the same way, so every rank raises the same sentence
instead of one raising and the others waiting.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scaledl.backend_errors import attempt, raise_in_words

__all__ = ["Kind", "DTYPES", "OPS", "Signature", "Row", "Exchange", "CallMismatch", "agree",
           "settle", "over_group", "dtype_text", "digest", "ALLGATHER"]


class Kind(str, enum.Enum):
    """What a rank is about to do.  The first five are scaledl's collectives (the values of
    :class:`scaledl.collectives.schedule.Collective`)."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"
    GROUPED_ALLREDUCE = "grouped_allreduce"
    BARRIER = "barrier"
    JOIN = "join"
    OPTIMIZER_SETUP = "DistributedOptimizer construction"
    OPTIMIZER_STEP = "DistributedOptimizer gradient reduction"
    INIT = "scaledl.init"
    OPEN_GROUP = "opening a communicator"
    WRAP_MODEL = "wrapping a model"
    ADD_PROCESS_SET = "hvd.add_process_set"
    REMOVE_PROCESS_SET = "hvd.remove_process_set"


_KINDS = tuple(Kind)

_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8", "int16",
    "bool", "complex64", "complex128", "complex32", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32", "uint64",
)
DTYPES: tuple[torch.dtype, ...] = tuple(
    getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None),
                                                                 torch.dtype))
"""The one table of dtypes scaledl names in exchanged metadata (code = position + 1; 0 is no
dtype, 31 one outside the table).  The first twelve are the dtypes Horovod's API accepts."""
_NO_DTYPE, _OTHER_DTYPE = 0, 31

OPS = ("sum", "avg", "min", "max", "product", "adasum", "band", "bor", "bxor")
"""Reduction ops by name (code = position + 1; 0 is none)."""

_TEXTS = ("algorithm", "layout", "name", "detail", "problem")
MAX_DIMS = 6
"""Dimensions carried exactly; beyond, the sixth carries a digest of the rest."""
DATA_SLOTS = 2
_HEAD = 4 + DATA_SLOTS + 1 + MAX_DIMS  # word, numel, root, dtype code, data, ndim, dims
ROW_LENGTH = _HEAD + 2 * len(_TEXTS)
"""Integers per rank in the exchanged row."""

# The packed word: root + 1 (10 bits), dtype (5), op (4), kind (5), then the element count.
_ROOT_BITS, _DTYPE_BITS, _OP_BITS, _KIND_BITS = 10, 5, 4, 5
_NUMEL_SHIFT = _ROOT_BITS + _DTYPE_BITS + _OP_BITS + _KIND_BITS
_NUMEL_MAX = (1 << (63 - _NUMEL_SHIFT)) - 1


@functools.lru_cache(maxsize=1024)
def digest(text: str | None) -> int:
    """63 bits of BLAKE2b of ``text`` (0 for None): stable across processes, unlike ``hash``.

    Cached: the same text (a DistributedOptimizer's bucket plan, negotiated every step) is
    hashed once, not once per call."""
    if text is None:
        return 0
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _dtype_code(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return _NO_DTYPE
    return DTYPES.index(dtype) + 1 if dtype in DTYPES else _OTHER_DTYPE


def dtype_text(dtype: torch.dtype | None) -> str:
    """``float32`` for ``torch.float32``."""
    return "no dtype" if dtype is None else str(dtype).removeprefix("torch.")


def _dtype_of(code: int) -> torch.dtype | None:
    return DTYPES[code - 1] if 1 <= code <= len(DTYPES) else None


def _fold(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``MAX_DIMS`` integers: the dimensions, padded; beyond, the last a digest of the rest."""
    if len(shape) <= MAX_DIMS:
        return shape + (0,) * (MAX_DIMS - len(shape))
    return shape[:MAX_DIMS - 1] + (digest(repr(shape[MAX_DIMS - 1:])),)


@dataclass(frozen=True)
class Signature:
    """One rank's call: every field but ``data`` must be equal on every rank (for allgather and
    alltoall given a ``shape``, every dimension but the first)."""

    kind: Kind
    numel: int = -1
    """Elements the call moves (-1: the product of ``shape``, or 0 without one)."""
    dtype: torch.dtype | None = None
    op: str | None = None
    """Reduction op, one of :data:`OPS`."""
    root: int = -1
    """Root rank of a rooted call, else -1."""
    algorithm: str | None = None
    layout: str | None = None
    """The topology in words (:attr:`scaledl.topology.Topology.layout`)."""
    name: str | None = None
    """The call's name (Horovod matches calls by name)."""
    shape: tuple[int, ...] | None = None
    detail: str | None = None
    """Anything else that must match, one fact per line (a model's parameters, settings)."""
    problem: str | None = None
    """What is wrong with this rank's own arguments: a phrase that follows "rank N" in the
    error every rank raises (``"passed a root rank outside the group"``)."""
    data: tuple[int, ...] = ()
    """Up to two integers every rank receives and nobody compares (a pid, an allgather's rows)."""
    dtype_code: int = field(default=-1, repr=False, compare=False)
    """The dtype's code as received (it may name a dtype this process does not know)."""

    def __post_init__(self) -> None:
        if self.op is not None and self.op not in OPS:
            raise ValueError(f"reduction op {self.op!r} is none of {OPS}")
        if len(self.data) > DATA_SLOTS:
            raise ValueError(f"a signature carries at most {DATA_SLOTS} data integers")
        if self.numel < 0:
            object.__setattr__(self, "numel", 0 if self.shape is None else math.prod(self.shape))
        if self.dtype_code == -1:
            object.__setattr__(self, "dtype_code", _dtype_code(self.dtype))

    # -- encodings ----------------------------------------------------------------------------
    def word(self) -> int:
        """Kind, dtype, op, root (below 1023, else 1023) and element count (below 2**39, else
        2**39 - 1) packed in one non-negative int64: what a shared-memory stage announces."""
        code = _KINDS.index(self.kind)
        code = code << _OP_BITS | (OPS.index(self.op) + 1 if self.op else 0)
        code = code << _DTYPE_BITS | self.dtype_code
        code = code << _ROOT_BITS | min(self.root + 1, (1 << _ROOT_BITS) - 1)
        return min(self.numel, _NUMEL_MAX) << _NUMEL_SHIFT | code

    @classmethod
    def from_word(cls, word: int) -> Signature:
        """The signature a packed :meth:`word` describes."""
        root = (word & ((1 << _ROOT_BITS) - 1)) - 1
        word >>= _ROOT_BITS
        dtype_code = word & ((1 << _DTYPE_BITS) - 1)
        word >>= _DTYPE_BITS
        op_code = word & ((1 << _OP_BITS) - 1)
        word >>= _OP_BITS
        kind = _KINDS[word & ((1 << _KIND_BITS) - 1)]
        numel = word >> _KIND_BITS
        return cls(kind, numel, _dtype_of(dtype_code), OPS[op_code - 1] if op_code else None,
                   root, dtype_code=dtype_code)

    def texts(self) -> tuple[str | None, ...]:
        """The text fields, in row order."""
        return tuple(getattr(self, name) for name in _TEXTS)

    def encode(self) -> list[int]:
        """The :data:`ROW_LENGTH` integers every rank receives."""
        shape = () if self.shape is None else tuple(self.shape)
        ndim = -1 if self.shape is None else len(shape)
        row = [self.word(), self.numel, self.root, self.dtype_code]
        row += list(self.data) + [0] * (DATA_SLOTS - len(self.data))
        row += [ndim, *_fold(shape)]
        for text in self.texts():
            row += [digest(text), -1 if text is None else len(text.encode())]
        return row

    # -- in words -----------------------------------------------------------------------------
    def describe(self) -> str:
        """``allreduce 'grad' of 1000 float32 (sum, algorithm ring, layout 2x2)``."""
        text = self.kind.value
        if self.name is not None:
            text += f" {self.name!r}"
        if self.shape is not None:
            text += f" of shape {list(self.shape)}"
        elif self.numel or self.dtype is not None:
            text += f" of {self.numel}"
        if self.shape is not None or self.numel or self.dtype is not None:
            if self.dtype_code == _OTHER_DTYPE:
                text += " elements of a dtype outside scaledl's table"
            elif self.dtype is not None:
                text += " " + dtype_text(self.dtype)
        notes = [self.op] if self.op else []
        notes += [f"root {self.root}"] if self.root >= 0 else []
        notes += [f"algorithm {self.algorithm}"] if self.algorithm else []
        notes += [f"layout {self.layout}"] if self.layout else []
        return text + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class Row:
    """One rank's decoded row: the signature's numbers, its texts as digests and lengths."""

    values: tuple[int, ...]

    @property
    def word(self) -> int:
        return self.values[0]

    @property
    def numel(self) -> int:
        return self.values[1]

    @property
    def root(self) -> int:
        return self.values[2]

    @property
    def data(self) -> tuple[int, ...]:
        """The integers shared, not compared."""
        return self.values[4:4 + DATA_SLOTS]

    @property
    def ndim(self) -> int:
        """Dimensions of the shape (-1: none given)."""
        return self.values[4 + DATA_SLOTS]

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape as sent (beyond six dimensions, the sixth is a digest of the rest)."""
        start = 5 + DATA_SLOTS
        return self.values[start:start + min(max(self.ndim, 0), MAX_DIMS)]

    @property
    def kind(self) -> Kind:
        return Signature.from_word(self.word).kind

    def digest(self, text: str) -> int:
        return self.values[_HEAD + 2 * _TEXTS.index(text)]

    def length(self, text: str) -> int:
        """Byte length of a text field (-1: none)."""
        return self.values[_HEAD + 2 * _TEXTS.index(text) + 1]

    @property
    def has_problem(self) -> bool:
        return self.length("problem") >= 0

    def signature(self, texts: Sequence[str | None]) -> Signature:
        """The whole signature, given its text fields (from the second round)."""
        head = Signature.from_word(self.word)
        shape = None if self.ndim < 0 else self.dims
        if self.ndim > MAX_DIMS:  # the dimensions beyond the fifth travelled as a digest
            shape = self.dims[:MAX_DIMS - 1] + (-1,) * (self.ndim - MAX_DIMS + 1)
        algorithm, layout, name, detail, problem = texts
        return Signature(head.kind, self.numel, head.dtype, head.op, self.root, algorithm,
                         layout, name, shape, detail, problem, self.data, self.values[3])


_SHAPED = (Kind.ALLGATHER, Kind.ALLTOALL)
"""Calls whose ranks may differ in the first dimension of the shape."""


def _difference(ref: Row, other: Row) -> str | None:
    """The first field in which ``other`` differs from ``ref`` (None: the calls match)."""
    if ref.kind is not other.kind:
        return "kind"
    if ref.values[3] != other.values[3]:
        return "dtype"
    ref_word, other_word = Signature.from_word(ref.word), Signature.from_word(other.word)
    if ref_word.op != other_word.op:
        return "op"
    if ref.root != other.root:
        return "root"
    if ref.kind in _SHAPED and ref.ndim >= 0:
        if ref.ndim != other.ndim or ref.dims[1:] != other.dims[1:]:
            return "shape"
    elif ref.numel != other.numel or (ref.ndim, ref.dims) != (other.ndim, other.dims):
        return "shape" if ref.ndim >= 0 else "numel"
    for text in _TEXTS[:-1]:
        if ref.digest(text) != other.digest(text):
            return text
    return None


_WHAT = {"kind": "the call", "dtype": "the dtype", "op": "the reduction op", "root": "the root",
         "shape": "the shape", "numel": "the element count", "algorithm": "the algorithm",
         "layout": "the layout", "name": "the name", "detail": "the details"}


class CallMismatch(ValueError):
    """The ranks did not make the same call (raised on every rank, the same message)."""


Exchange = Callable[[Sequence[int]], list[list[int]]]
"""Every rank's integers, by position, from each rank's list of the same length."""


ALLGATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""torch renamed all_gather_into_tensor (which now warns) to all_gather_single."""


def over_group(group: dist.ProcessGroup | None = None,
               device: torch.device | None = None) -> Exchange:
    """An :data:`Exchange` by one allgather on ``group`` (the default group when None), its
    integers on ``device`` (default: the current GPU for an NCCL group, else the CPU)."""
    def exchange(values: Sequence[int]) -> list[list[int]]:
        size = dist.get_world_size(group)
        nonlocal device
        if device is None:
            nccl = dist.get_backend(group) == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl \
                else torch.device("cpu")
        mine = torch.tensor(list(values), dtype=torch.int64, device=device)
        everyone = torch.empty(size * len(values), dtype=torch.int64, device=device)
        ALLGATHER(everyone, mine, group=group)
        return [[int(v) for v in row] for row in everyone.cpu().view(size, len(values)).tolist()]
    return exchange


def _texts(mine: Signature, rows: Sequence[Row], exchange: Exchange) -> list[list[str | None]]:
    """Second round: every rank's text fields, as sent (lengths known from the rows)."""
    lengths = [[row.length(t) for t in _TEXTS] for row in rows]
    width = max(sum(max(n, 0) for n in row) for row in lengths)
    blob = b"".join((t or "").encode() for t in mine.texts())
    words = -(-width // 8)
    padded = blob + bytes(words * 8 - len(blob))
    values = torch.frombuffer(bytearray(padded), dtype=torch.int64).tolist() if words else []
    everyone = exchange(values) if words else [[] for _ in rows]
    result = []
    for row_lengths, ints in zip(lengths, everyone):
        raw = torch.tensor(ints, dtype=torch.int64).numpy().tobytes()
        texts: list[str | None] = []
        offset = 0
        for n in row_lengths:
            texts.append(None if n < 0 else raw[offset:offset + n].decode(errors="replace"))
            offset += max(n, 0)
        result.append(texts)
    return result


def _detail_difference(a: str | None, b: str | None) -> tuple[str, str, int]:
    """The first line where two details differ, and its index."""
    left, right = (a or "").splitlines(), (b or "").splitlines()
    for index in range(max(len(left), len(right))):
        ours = left[index] if index < len(left) else "nothing"
        theirs = right[index] if index < len(right) else "nothing"
        if ours != theirs:
            return ours, theirs, index
    return "", "", 0


def settle(
    mine: Signature, values: Sequence[Sequence[int]], exchange: Exchange, *,
    ranks: Sequence[int] | None = None, compare: Sequence[int] | None = None,
    fix: str = "every rank must make the same calls, in the same order, with the same "
               "arguments",
    error: type[Exception] = CallMismatch,
) -> list[Row]:
    """Judge every rank's row (``values``, from one exchange of :meth:`Signature.encode`): return
    the rows when the calls match, else run the text round and raise ``error`` naming both
    sides, on every rank.  ``ranks`` names the positions in messages (default: the positions);
    ``compare`` limits the comparison to some positions (default: all)."""
    rows = [Row(tuple(v)) for v in values]
    names = list(ranks) if ranks is not None else list(range(len(rows)))
    active = list(compare) if compare is not None else list(range(len(rows)))
    flawed = [i for i in active if rows[i].has_problem]
    field_name = None
    other = None
    if not flawed:
        for i in active[1:]:
            field_name = _difference(rows[active[0]], rows[i])
            if field_name is not None:
                other = i
                break
        if other is None:
            return rows
    texts = _texts(mine, rows, exchange)  # every rank reaches this line, or none does
    if flawed:
        i = flawed[0]
        sig = rows[i].signature(texts[i])
        raise error(f"{sig.kind.value}: rank {names[i]} {sig.problem}")
    assert other is not None and field_name is not None
    ref = active[0]
    a, b = rows[ref].signature(texts[ref]), rows[other].signature(texts[other])
    if field_name == "detail":
        ours, theirs, index = _detail_difference(a.detail, b.detail)
        raise error(
            f"ranks disagree on {_WHAT[field_name]} of {a.kind.value}: entry {index} is "
            f"'{ours}' on rank {names[ref]} but '{theirs}' on rank {names[other]}; {fix}")
    if field_name == "name":
        sides = f"rank {names[ref]} named it {a.name!r} but rank {names[other]} {b.name!r}"
    else:
        sides = (f"rank {names[ref]} called {a.describe()} but rank {names[other]} called "
                 f"{b.describe()}")
    raise error(f"ranks disagree on {_WHAT[field_name]} of {a.kind.value}: {sides}; {fix}")


def agree(
    mine: Signature, exchange: Exchange, *, ranks: Sequence[int] | None = None,
    fix: str = "every rank must make the same calls, in the same order, with the same "
               "arguments",
    error: type[Exception] = CallMismatch,
) -> list[Row]:
    """Exchange ``mine`` with every rank; return every rank's row, or raise ``error`` on every
    rank naming both sides of the first difference (see :func:`settle`).  A rank whose peers
    never make the call (they exited, or are busy elsewhere past the group's timeout) gets
    ``error`` saying so, not the backend's transport error."""
    values = attempt(lambda: exchange(mine.encode()))  # judged outside any except block
    if isinstance(values, RuntimeError):  # Gloo's and NCCL's errors are RuntimeErrors
        # in words only when the peers are at fault: gone, or not there in time
        raise_in_words(values, lambda failure: None if failure.reason is None else error(
            f"{mine.kind.value}: the other ranks of the group did not make this call "
            f"({failure.reason}); {fix}"))
    return settle(mine, values, exchange, ranks=ranks, fix=fix, error=error)
