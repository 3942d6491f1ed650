"""scaledl.horovod: the ``horovod.torch`` API on scaledl, so a Horovod script moves by changing
one import::

    import scaledl.horovod as hvd      # was: import horovod.torch as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Launch with ``scaledl run -np 4 python train.py`` (or torchrun, mpirun, srun).  Collectives run
on scaledl's algorithms (``hvd.init(algorithm="ring")`` or ``SCALEDL_HOROVOD_ALGORITHM``; ``auto``
by default); the DistributedOptimizer uses the gradient reducer of :class:`scaledl.DataParallel`.
docs/horovod.md maps every call and lists what is not supported (Adasum, elastic, timelines,
grouped optimizer buckets), each of which raises :class:`UnsupportedError` naming it.
"""

from scaledl.horovod.allgather import allgather_async, grouped_allgather_async
from scaledl.horovod.allreduce import (
    allreduce_, allreduce_async, allreduce_async_, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_,
)
from scaledl.horovod.alltoall import alltoall_async
from scaledl.horovod.basics import (
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
)
from scaledl.horovod.broadcast import broadcast_, broadcast_async, broadcast_async_
from scaledl.horovod.compression import Compression
from scaledl.horovod.differentiable import (
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, reducescatter,
)
from scaledl.horovod.errors import HorovodInternalError, MismatchError, UnsupportedError
from scaledl.horovod.handles import poll, synchronize
from scaledl.horovod.join import barrier, join
from scaledl.horovod.objects import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from scaledl.horovod.optimizer import DistributedOptimizer
from scaledl.horovod.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
from scaledl.horovod.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from scaledl.horovod.reducescatter import grouped_reducescatter_async, reducescatter_async
from scaledl.horovod.runtime import ALGORITHM_ENV
from scaledl.horovod.sync_batch_norm import SyncBatchNorm
from scaledl.horovod.sparse import sparse_allreduce_async
from scaledl.horovod.unsupported import elastic, start_timeline, stop_timeline

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "barrier", "join", "poll", "synchronize",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "Compression",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "HorovodInternalError", "MismatchError", "UnsupportedError", "ALGORITHM_ENV",
    "SyncBatchNorm", "elastic", "sparse_allreduce_async", "start_timeline", "stop_timeline",
]
