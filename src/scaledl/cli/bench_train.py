"""``scaledl bench train``: scaledl DataParallel vs torch DDP samples/s, scaling efficiency and
overlap, on local workers (or under a launcher); a rich table, ``--json`` and ``--plot``."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

from scaledl.bench.train import TrainBenchConfig, default_input_shape
from scaledl.launch.local import run_distributed
from scaledl.cli.console import report_console
from scaledl.cli.outputs import check_output_file, check_plot_file

__all__ = ["add_parser", "run"]


def add_parser(kinds: Any) -> None:
    """Register the ``train`` benchmark under ``scaledl bench``."""
    p = kinds.add_parser(
        "train", help="samples/s of scaledl DataParallel vs torch DDP on the same job",
        description="Train the same model on synthetic batches with scaledl DataParallel and "
                    "with torch DDP (Gloo), alternating, and compare throughput.",
    )
    p.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    p.add_argument("--model", default="resnet50", help="model name (default resnet50)")
    p.add_argument("--input-shape", default=None, help="sample shape, e.g. 3x32x32")
    p.add_argument("--batch-size", type=int, default=16, help="samples per worker per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per round")
    p.add_argument("--repeats", type=int, default=3, help="rounds per wrapper")
    p.add_argument("--algorithm", default="auto", help="scaledl allreduce algorithm")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="bucket size of both")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a bar chart (PNG) here")
    p.set_defaults(handler=run)


def _config(args: argparse.Namespace) -> TrainBenchConfig:
    """The benchmark's job, every part checked before a worker starts: the model builds for the
    sample shape (on the meta device: no memory, no arithmetic) and reads what the benchmark
    feeds it, random float samples."""
    import torch

    from scaledl import collectives
    from scaledl.cli.simulate_checks import input_shape
    from scaledl.models import available_models, build_model
    from scaledl.sim.profile import TOKEN_MODELS

    if args.model not in available_models():
        raise ValueError(f"unknown model {args.model!r}; use one of: "
                         f"{', '.join(available_models())}")
    if args.model in TOKEN_MODELS:
        raise ValueError(f"--model {args.model} reads token ids, and bench train feeds random "
                         "float samples; benchmark an image or vector model, or predict "
                         f"{args.model} with `scaledl simulate --model {args.model}`")
    if args.algorithm != "auto":
        collectives.lookup(args.algorithm, "allreduce")
    shape = input_shape(args.input_shape) if args.input_shape else \
        default_input_shape(args.model)
    with torch.device("meta"):
        build_model(args.model, shape, 10)  # the model's own one-line error for the shape
    return TrainBenchConfig(args.model, shape, 10, args.batch_size, args.steps, args.warmup,
                            args.repeats, args.algorithm, args.bucket_mb)


def run(args: argparse.Namespace) -> int:
    """Validate, then launch the workers (or be one)."""
    if args.workers < 1:
        raise ValueError(f"--workers {args.workers} must be at least 1")
    config = _config(args)
    if args.json is not None:
        check_output_file(args.json, "--json")
    if args.plot is not None:
        check_plot_file(args.plot, "--plot")
    return run_distributed(args.workers, args.argv, lambda: _worker(args, config))


def _worker(args: argparse.Namespace, config: TrainBenchConfig) -> int:
    import torch

    import scaledl
    from scaledl import bootstrap
    from scaledl.bench.train import run_train_benchmark

    topology = bootstrap.init(backend=bootstrap.HOST_BACKEND)
    try:
        result = run_train_benchmark(config)
    finally:
        scaledl.shutdown()
    if topology.rank != 0:
        return 0
    result["environment"] = {
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "python": platform.python_version(), "threads_per_worker": torch.get_num_threads(),
    }
    _print(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    if args.plot is not None:
        _plot(result, args.plot)
    return 0


def _print(result: dict[str, Any]) -> None:
    from rich.table import Table

    config = result["config"]
    table = Table(title=f"{config['model']} ({result['parameters'] / 1e6:.2f} M parameters), "
                  f"batch {config['batch_size']}/worker, {result['world_size']} workers; "
                  f"medians of {config['repeats']} rounds of {config['steps']} steps")
    for column in ("wrapper", "samples/s", "step ms", "scaling eff.", "comm share", "hidden"):
        table.add_column(column, justify="right")
    for mode in ("ddp", "scaledl"):
        row = result["median"][mode]
        table.add_row(
            "torch DDP (gloo)" if mode == "ddp" else f"scaledl ({config['algorithm']})",
            f"{row['samples_per_s']:,.1f}", f"{1e3 * row['step_s']:.1f}",
            f"{100 * row['scaling_efficiency']:.0f} %",
            f"{100 * row['comm_share']:.0f} %" if "comm_share" in row else "-",
            f"{100 * row['hidden_fraction']:.0f} %" if "hidden_fraction" in row else "-",
        )
    console = report_console(120)
    console.print(table)
    console.print(f"single worker: {result['single_worker_samples_per_s']:,.1f} samples/s; "
                  f"scaledl / DDP = {result['scaledl_over_ddp']:.2f}x")


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ("ddp", "scaledl")
    values = [result["median"][m]["samples_per_s"] for m in modes]
    ideal = result["single_worker_samples_per_s"] * result["world_size"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(["torch DDP", "scaledl"], values, color=["tab:gray", "tab:blue"])
    ax.axhline(ideal, linestyle="--", color="black", label="linear scaling")
    ax.set_ylabel("samples/s")
    ax.set_title(f"{result['config']['model']}, {result['world_size']} workers")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
