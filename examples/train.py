"""A plain training script on scaledl: an MLP on scikit-learn's handwritten digits, data-parallel.

The same file runs as one process and under every launcher ``scaledl.init()`` reads::

    python examples/train.py --epochs 3
    torchrun --nproc-per-node 2 examples/train.py
    scaledl run -np 2 python examples/train.py
    mpirun -np 2 python examples/train.py
    srun --ntasks 2 python examples/train.py

Each rank reads its own shard of every epoch (``scaledl.data.ShardedLoader``), and
``scaledl.DataParallel`` averages the gradients during backward, so every rank takes the same
optimizer step.  Rank 0 prints the loss of each epoch and the test accuracy; the script exits
non-zero when the model did not learn (accuracy under ``--min-accuracy``).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import scaledl
from scaledl.data import ShardedLoader, ShardedSampler, load_dataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training set")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--algorithm", default="auto", help="allreduce algorithm (ring, ...)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and data order")
    parser.add_argument("--min-accuracy", type=float, default=0.8,
                        help="fail when the test accuracy ends below this")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    topology = scaledl.init()                # torchrun / mpirun / srun / scaledl run / 1 process
    torch.manual_seed(args.seed)             # DataParallel broadcasts rank 0's weights anyway
    train = load_dataset("digits", split="train")
    test = load_dataset("digits", split="test")
    sampler = ShardedSampler(len(train), topology.rank, topology.world_size, seed=args.seed)
    loader = ShardedLoader(train, args.batch_size, sampler)

    net = nn.Sequential(nn.Flatten(), nn.Linear(train.features[0].numel(), 128), nn.ReLU(),
                        nn.Linear(128, train.num_classes))
    model = scaledl.DataParallel(net, algorithm=args.algorithm)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        total, steps = 0.0, 0
        for x, y in loader:                  # this rank's shard of the epoch, in a new order
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()                  # gradients averaged over the ranks here
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        if topology.rank == 0:
            print(f"epoch {epoch}: loss {total / steps:.3f} "
                  f"({steps} steps on each of {topology.world_size} ranks)")

    with torch.no_grad():                    # every rank holds the same weights
        accuracy = (net(test.features).argmax(1) == test.labels).float().mean().item()
    if topology.rank == 0:
        print(f"test accuracy {accuracy:.3f}")
    scaledl.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"test accuracy {accuracy:.3f} is below --min-accuracy "
                         f"{args.min_accuracy}: the model did not learn")


if __name__ == "__main__":
    main()
