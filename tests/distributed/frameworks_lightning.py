"""One rank of the Lightning test: ``torchrun --nproc-per-node 2 frameworks_lightning.py OUT``.

Fits the same small model from the same initial weights on the same data with Lightning's
``DDPStrategy`` and with scaledl's ``ScaledlStrategy`` (ring, auto), and writes every fit's
final parameters and the number of scaledl allreduces it ran to ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, Strategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import scaledl.collectives
from scaledl.integrations.lightning import ScaledlStrategy

STEPS = 6
CALLS = [0]


def _counting(allreduce: Any) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        CALLS[0] += 1
        return allreduce(*args, **kwargs)
    return counted


class Classifier(pl.LightningModule):
    """A small MLP trained with SGD and momentum."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _data() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(96, 8, generator=generator)
    y = torch.randint(0, 3, (96,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


def _fit(strategy: Strategy) -> dict[str, Any]:
    CALLS[0] = 0
    model = Classifier()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=STEPS,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, _data())
    parameters = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"parameters": parameters.tolist(), "scaledl_allreduces": CALLS[0],
            "steps": trainer.global_step}


def main(out: Path) -> None:
    scaledl.collectives.allreduce = _counting(scaledl.collectives.allreduce)
    fits = {
        "ddp": _fit(DDPStrategy()),
        "scaledl-ring": _fit(ScaledlStrategy(algorithm="ring")),
        "scaledl-auto": _fit(ScaledlStrategy()),
    }
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(fits))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
