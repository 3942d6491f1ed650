"""One rank of the Accelerate test: ``torchrun --nproc-per-node 2 frameworks_accelerate.py OUT``.

Trains the same small model from the same initial weights on the same data in an Accelerate
loop (``accelerator.prepare``, ``accelerator.backward``, gradient accumulation over 2 batches),
once with DDP's own allreduce and once per scaledl algorithm through
``scaledl.integrations.accelerate.register_comm_hook``; writes every run's final parameters and
the number of scaledl allreduces it ran to ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import scaledl.collectives
from scaledl.integrations.accelerate import register_comm_hook

STEPS = 8
CALLS = [0]


def _counting(allreduce: Any) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        CALLS[0] += 1
        return allreduce(*args, **kwargs)
    return counted


def _train(algorithm: str | None) -> dict[str, Any]:
    CALLS[0] = 0
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=generator),
                         torch.randint(0, 3, (96,), generator=generator))
    loader = DataLoader(data, batch_size=6, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if algorithm is not None:
        model = register_comm_hook(model, algorithm=algorithm)
    for step, (x, y) in enumerate(loader):
        if step == STEPS:
            break
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    parameters = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model)
                            .parameters()])
    return {"parameters": parameters.tolist(), "scaledl_allreduces": CALLS[0],
            "distributed_type": str(accelerator.distributed_type),
            "num_processes": accelerator.num_processes}


def main(out: Path) -> None:
    scaledl.collectives.allreduce = _counting(scaledl.collectives.allreduce)
    runs = {"ddp": _train(None), "scaledl-ring": _train("ring"), "scaledl-auto": _train("auto")}
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
