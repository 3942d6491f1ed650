"""PyTorch Lightning: ``ScaledlStrategy``, DDP whose gradient buckets a scaledl algorithm averages.

    from scaledl.integrations.lightning import ScaledlStrategy
    trainer = Trainer(accelerator="cpu", devices=4, strategy=ScaledlStrategy(algorithm="ring"))

A Lightning user changes gradient communication through the ``strategy`` argument, and DDP's own
extension point for it is a communication hook, which ``DDPStrategy(ddp_comm_hook=...)`` takes.
``ScaledlStrategy`` is that ``DDPStrategy`` with :func:`scaledl.ddp_hook` and two differences:

1. once Lightning has made the process group, :func:`scaledl.init` agrees on the job's layout
   (every rank's host), so ``auto``, ``hierarchical`` and ``torus`` see the real hosts and
   ranks of one host may use shared memory;
2. the hook is registered on every device.  Lightning's ``DDPStrategy`` registers a comm hook
   only when the root device is CUDA (a limit of PyTorch 1.8 that later versions lifted), so on
   CPU ``DDPStrategy(ddp_comm_hook=...)`` is silently ignored and Gloo's allreduce runs instead.

Every other ``DDPStrategy`` argument (``find_unused_parameters``, ``static_graph``,
``gradient_as_bucket_view``, ``timeout``, ``process_group_backend``, ``ddp_comm_wrapper`` such
as ``fp16_compress_wrapper``...) passes through.  DDP keeps its bucketing, overlap and
unused-parameter handling, so ``Trainer(accumulate_grad_batches=...)`` works as with DDP.
"""

from __future__ import annotations

from typing import Any

from torch.nn.parallel import DistributedDataParallel

from scaledl.bootstrap import init
from scaledl.collectives import lookup
from scaledl.sync import ddp_hook
from scaledl.topology import Topology

try:
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"scaledl.integrations.lightning needs PyTorch Lightning ({error}); install it with "
        "pip install lightning (in a scaledl clone: pip install -e '.[lightning]')"
    ) from None

__all__ = ["ScaledlStrategy"]


class ScaledlStrategy(DDPStrategy):
    """Lightning's DDP with each gradient bucket averaged by scaledl's ``algorithm``."""

    strategy_name = "scaledl"

    def __init__(
        self, algorithm: str = "auto", topology: Topology | str | None = None, **kwargs: Any
    ) -> None:
        """``algorithm``: any of ``scaledl.collectives.available("allreduce")``; ``topology``:
        the layout (a :class:`~scaledl.Topology` or a spec like ``"4x2"``) instead of the one
        found from the hosts; ``kwargs``: ``DDPStrategy``'s other arguments."""
        if "ddp_comm_hook" in kwargs:
            raise TypeError(
                "ScaledlStrategy sets ddp_comm_hook itself; pass algorithm= (and topology=), or "
                "use DDPStrategy(ddp_comm_hook=...) for another hook"
            )
        unused = sorted({"ddp_comm_state", "model_averaging_period"} & kwargs.keys())
        if unused:
            raise TypeError(
                f"ScaledlStrategy averages the gradients of every step and does not take "
                f"{' or '.join(unused)} (post-local SGD); leave them out, or train with "
                "scaledl's local-sgd strategy (scaledl train --strategy local-sgd)"
            )
        if algorithm != "auto":
            lookup(algorithm, "allreduce")
        if isinstance(topology, str):
            Topology.parse(topology)  # a malformed spec fails here, not on every rank at setup
        elif topology is not None and not isinstance(topology, Topology):
            raise TypeError(f"topology must be a spec such as '4x2' or a scaledl.Topology, got "
                            f"{type(topology).__name__} {topology!r}")
        self.algorithm = algorithm
        self._layout = topology
        super().__init__(**kwargs)

    def setup_distributed(self) -> None:
        """Make the process group (Lightning), then agree on the layout (scaledl) and check
        the algorithm against it (on every rank, before training starts)."""
        super().setup_distributed()
        layout = init(topology=self._layout)
        fixed = layout if self._layout is not None else None
        self._ddp_comm_hook = ddp_hook(algorithm=self.algorithm, topology=fixed)

    def _register_ddp_hooks(self) -> None:
        """Register the hook on the DDP model whatever the device (see the module docstring)."""
        hook = self._ddp_comm_hook
        assert hook is not None, "setup_distributed() runs before the model is wrapped"
        if self._ddp_comm_wrapper is not None:
            hook = self._ddp_comm_wrapper(hook)
        assert isinstance(self.model, DistributedDataParallel)
        self.model.register_comm_hook(state=self._ddp_comm_state, hook=hook)
