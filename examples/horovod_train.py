"""A Horovod training script moved to scaledl by changing its import (``scaledl.horovod``).

The shape of Horovod's own PyTorch examples: ``hvd.init()``, a learning rate scaled by
``hvd.size()``, rank 0's parameters and optimizer state broadcast, a ``DistributedOptimizer``,
a ``DistributedSampler`` for this rank's shard, and metrics averaged with ``hvd.allreduce``::

    scaledl run -np 2 python examples/horovod_train.py --epochs 3   # like horovodrun -np 2
    torchrun --nproc-per-node 2 examples/horovod_train.py
    mpirun -np 2 python examples/horovod_train.py

It trains a small convolutional network on scikit-learn's handwritten digits (8x8 images) and
exits non-zero when the averaged test accuracy ends under ``--min-accuracy``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import scaledl.horovod as hvd  # was: import horovod.torch as hvd
from scaledl.data import load_dataset


class Net(nn.Module):
    """Two 3x3 convolutions and a linear classifier for 1x8x8 images."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training set")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
    parser.add_argument("--seed", type=int, default=42, help="seed of the model and data order")
    parser.add_argument("--min-accuracy", type=float, default=0.8,
                        help="fail when the test accuracy ends below this")
    return parser.parse_args()


def shard(split: str, batch_size: int, seed: int,
          shuffle: bool) -> tuple[DataLoader, DistributedSampler]:
    data = load_dataset("digits", split=split)
    dataset = TensorDataset(data.features, data.labels)
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=shuffle, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    train_loader, train_sampler = shard("train", args.batch_size, args.seed, shuffle=True)
    test_loader, _ = shard("test", args.batch_size, args.seed, shuffle=False)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()                      # waits for the averaged gradients
        average = hvd.allreduce(loss.detach(), name="loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: last batch's loss {average.item():.3f} (average of "
                  f"{hvd.size()} ranks)")

    model.eval()
    correct = torch.zeros(())
    count = torch.zeros(())
    with torch.no_grad():
        for data, target in test_loader:
            correct += (model(data).argmax(1) == target).sum()
            count += len(target)
    accuracy = (hvd.allreduce(correct, op=hvd.Sum, name="correct")
                / hvd.allreduce(count, op=hvd.Sum, name="count")).item()
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.3f}")
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"test accuracy {accuracy:.3f} is below --min-accuracy "
                         f"{args.min_accuracy}: the model did not learn")


if __name__ == "__main__":
    main()
