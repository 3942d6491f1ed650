"""``scaledl train``: data-parallel training on local workers, or as one worker of a launcher.

Started by hand, it checks the whole configuration first (names, topology against the worker
count, that the data set loads and that a checkpoint to resume from is readable), then runs
itself as ``--workers`` processes under torch's elastic launcher.  Under torchrun, mpirun or
srun it is one worker.  Rank 0 shows a progress bar and ends with a summary table; the run
directory receives metrics.jsonl, timeline.json, loss/accuracy plots, checkpoints and
summary.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich import filesize
from rich.table import Table

from scaledl.backend_errors import first_line
from scaledl.bootstrap import DEFAULT_TIMEOUT_S
from scaledl.launch.local import run_distributed, under_launcher
from scaledl.launch.policy import SHARED_STORE_ENV, FaultPolicy, die_with_launcher
from scaledl.cli.console import report_console, sized_terminal
from scaledl.cli.outputs import check_output_dir
from scaledl.faults import FAULT_ENV, check_fault_spec
from scaledl.topology import TOPOLOGY_ENV
from scaledl.strategies.catalogue import option_fields, strategies, strategy_class
from scaledl.train.config import TrainConfig, build_config, load_toml

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)

Flag = tuple[str, type, str]
"""A flag: its key (``--`` plus the key with dashes), its type and its help."""

_RUN_FLAGS: tuple[Flag, ...] = (
    ("workers", int, "worker processes (default: one per core)"),
    ("algorithm", str, "collective algorithm (auto, ring, torus, ...; tree/chain for "
                       "reduce-broadcast)"),
    ("topology", str, "network layout innermost first, e.g. 2x2"),
    ("model", str, "mlp, lenet, resnet20, resnet56, ..., or package.module:factory (a "
                   "callable returning an nn.Module)"),
    ("dataset", str, "digits (default), mnist, fashion-mnist, cifar10, npz, synthetic, "
                     "imagefolder, or package.module:factory (a Dataset or a (train, test) "
                     "pair)"),
    ("data_dir", str, "where the data set's files are"),
    ("image_size", int, "imagefolder: resize every image to N x N pixels"),
    ("epochs", int, "passes over the training set"),
    ("max_steps", int, "stop after this many updates in all (default: every epoch)"),
    ("batch_size", int, "samples per micro-batch on each worker"),
    ("grad_accum", int, "micro-batches whose gradients add up to one update (default 1)"),
    ("optimizer", str, "sgd (default) or adamw"),
    ("lr", float, "learning rate (with --lr-scaling linear: for --lr-reference-batch)"),
    ("lr_schedule", str, "constant (default), step or cosine"),
    ("warmup_epochs", float, "epochs of linear warm-up of the learning rate (default 0)"),
    ("lr_scaling", str, "none (default) or linear: lr x global batch / --lr-reference-batch "
                        "(Goyal et al. 2017)"),
    ("lr_reference_batch", int, "the global batch --lr is for under --lr-scaling linear "
                                "(default 256)"),
    ("lr_decay", float, "step schedule: factor at each decay (default 0.1)"),
    ("lr_decay_every", int, "step schedule: epochs between decays (default: a third of "
                            "--epochs)"),
    ("momentum", float, "SGD momentum in [0, 1)"),
    ("weight_decay", float, "L2 penalty (AdamW: decoupled weight decay)"),
    ("clip_grad_norm", float, "clip the gradients' global L2 norm to this before each update"),
    ("device", str, "cpu (default; Gloo) or cuda (NCCL, GPU LOCAL_RANK per rank)"),
    ("precision", str, "fp32 (default), bf16 or fp16 (autocast; fp16 with a gradient scaler, "
                       "CUDA only)"),
    ("seed", int, "seed of initialisation and data order"),
    ("bucket_mb", float, "gradient bucket size in MiB (allreduce strategy)"),
    ("compression", str, "gradient buckets on the wire (allreduce strategy): none (default), "
                         "bf16, fp16, powersgd or powersgd:RANK"),
    ("out", str, "run directory"),
    ("resume", str, "checkpoint to resume from, or 'auto' for the latest in --out"),
    ("checkpoint_every", int, "steps between checkpoints (default: every epoch)"),
    ("checkpoint_seconds", float, "seconds between checkpoints as well (default 300; 0: off)"),
    ("max_restarts", int, "restart every worker from the last good checkpoint after a "
                          "failure, up to this many times (default 0)"),
    ("min_workers", int, "go on with fewer workers, down to this many, when one does not "
                         "come back (elastic; default: all are needed)"),
    ("eval_every", int, "steps between test evaluations (default: every epoch)"),
    ("log_every", int, "steps between log lines of loss and accuracy when there is no "
                       "progress bar (--no-progress; default 10)"),
    ("timeout_s", float, "seconds any blocking distributed call may take before a dead or "
                         f"hung peer is reported (default {DEFAULT_TIMEOUT_S:g}, as in scaledl "
                         "bench and scaledl.init(); --timeout-s is the same flag)"),
    ("synthetic_size", int, "samples of the synthetic data set"),
)
"""The flags of the run; ``--strategy`` and the strategies' options come from the catalogue."""

_FLAG_NAMES: dict[str, tuple[str, ...]] = {"timeout_s": ("--timeout", "--timeout-s")}
"""Flags spelled otherwise than ``--`` plus the key with dashes: ``--timeout``, the name every
other command gives its timeout, and ``--timeout-s``, the name it had first (kept)."""


def flags() -> tuple[Flag, ...]:
    """Every flag of ``scaledl train``: the run's, ``--strategy`` with the catalogue's names,
    and each strategy option (its type and help declared by its options dataclass)."""
    strategy: Flag = ("strategy", str, "one of: " + ", ".join(strategies()))
    options = tuple((name, field.metadata["type"], field.metadata["help"])
                    for name, field in option_fields().items())
    split = [name for name, _, _ in _RUN_FLAGS].index("out")
    return (_RUN_FLAGS[0], strategy, *_RUN_FLAGS[1:split], *options, *_RUN_FLAGS[split:])


def add_parser(subparsers: Any) -> None:
    """Register ``scaledl train``."""
    parser = subparsers.add_parser(
        "train", help="train a model data-parallel on local workers",
        description="Data-parallel training with overlapped gradient aggregation.",
    )
    for name, kind, text in flags():
        names = _FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),))
        parser.add_argument(*names, dest=name, type=kind, default=None, help=text)
    parser.add_argument("--config", default=None, help="TOML file with [data], [model], "
                        "[optim], [parallel], [run] tables; flags override it")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress bar")
    parser.add_argument("--no-plots", dest="plots", action="store_false", default=None,
                        help="no loss.png and accuracy.png at the end")
    parser.add_argument("--log-samples", dest="log_samples", action="store_true", default=None,
                        help="write every step's sample indices to samples/rank-NNNNN.jsonl")
    parser.add_argument("--inject-fault", dest="inject_fault", default=None, metavar="SPEC",
                        help=f"rehearse a failure, e.g. rank:1,step:5,kind:crash (sets "
                             f"{FAULT_ENV}; see docs/reliability.md)")
    parser.set_defaults(handler=run)


def _config(args: argparse.Namespace) -> TrainConfig:
    file_values = load_toml(args.config) if args.config else {}
    overrides = {name: getattr(args, name) for name, _, _ in flags()}
    overrides["progress"] = args.progress
    overrides["plots"] = args.plots
    overrides["log_samples"] = args.log_samples
    return build_config(file_values, overrides)


def _preflight(config: TrainConfig, workers: int, fault: str | None,
               fault_source: str = FAULT_ENV) -> None:
    """Fail before launching for anything a user can get wrong."""
    from scaledl.data import ArrayDataset, declared_shape
    from scaledl.data.datasets import is_dataset_name
    from scaledl.train.device import check_device
    from scaledl.train.setup import load_split, validate_config

    data = config.data

    def load(split: str) -> ArrayDataset:
        return load_split(data, split, config.run.seed)

    train, sample = None, None
    if declared_shape(data.dataset) is None and is_dataset_name(data.dataset):
        # only the files tell the sample shape (npz): read them first, so that the model is
        # checked against it here rather than on every worker after launch
        train = load("train")
        sample = (train.input_shape, train.num_classes)
    validate_config(config, workers, sample)
    check_device(config, workers)
    _check_layout(config)
    _check_faults(config, workers)
    if fault is not None:
        check_fault_spec(fault, workers, source=fault_source)
    check_output_dir(config.run.out, "--out")
    train = train if train is not None else load("train")
    load("test")
    if fault is not None:  # a step past the run's last one, or a server's, never comes
        trainers = workers - _server_ranks(config)
        check_fault_spec(fault, workers, steps=_most_steps(config, trainers, len(train)),
                         training_ranks=trainers, source=fault_source)
    _check_resume(config)


def _server_ranks(config: TrainConfig) -> int:
    """Dedicated parameter-server ranks: the last ``--servers`` ranks of a server strategy."""
    return config.parallel.servers if strategy_class(config.parallel.strategy).server else 0


def _most_steps(config: TrainConfig, trainers: int, num_samples: int) -> int:
    """The training steps of the run (steps are numbered across epochs and restarts), at the
    most: an elastic job that goes on with ``--min-workers`` takes more steps per epoch."""
    from scaledl.data import batches_per_epoch
    from scaledl.train.optim import total_updates

    fewest = min(trainers, config.run.min_workers or trainers)
    data = config.data
    return total_updates(config.optim, batches_per_epoch(num_samples, fewest, data.batch_size,
                                                         data.drop_last))


def _check_resume(config: TrainConfig) -> None:
    """The checkpoint ``--resume`` names loads and was trained with this model, data set and
    strategy (else every worker would fail the same way after launch)."""
    from scaledl.train.checkpoint import load_checkpoint, load_latest
    from scaledl.train.resume import check_same_training

    resume = config.run.resume
    if resume and resume != "auto":
        check_same_training(config, load_checkpoint(resume), Path(resume))
    elif resume == "auto":
        latest = load_latest(config.run.out)
        if latest is None:
            log.info("no checkpoint in %s yet; starting from scratch", config.run.out)
        else:
            check_same_training(config, latest[1], latest[0])


def _check_layout(config: TrainConfig) -> None:
    """An algorithm that needs the network layout (torus, hierarchical) gets one: local workers
    all share one host, so the layout found by exchanging host names would be flat."""
    from scaledl.collectives.registry import ALGORITHMS

    algorithm = ALGORITHMS.get(config.parallel.algorithm)
    needs = algorithm is not None and algorithm.needs_topology
    if needs and not config.parallel.topology and not os.environ.get(TOPOLOGY_ENV, "").strip():
        raise ValueError(
            f"algorithm {config.parallel.algorithm!r} needs the network layout: pass --topology "
            "RxH (R workers per host, H hosts, R*H = --workers), e.g. --topology 2x2 for 4 "
            f"workers, or set {TOPOLOGY_ENV}"
        )


def _check_faults(config: TrainConfig, workers: int) -> None:
    """The fault-tolerance options fit the job, and a fault plan parses."""
    run = config.run
    if run.min_workers is not None and run.min_workers > workers:
        raise ValueError(f"min_workers {run.min_workers} exceeds the {workers} workers; give "
                         f"--min-workers {workers} or less")
    if run.min_workers is not None and run.min_workers < workers and not run.max_restarts:
        raise ValueError(f"min_workers {run.min_workers} needs --max-restarts 1 or more: the "
                         "remaining workers go on by restarting from the last checkpoint")
    if run.min_workers is not None and run.min_workers < workers and config.parallel.topology:
        raise ValueError(f"min_workers {run.min_workers} with --topology "
                         f"{config.parallel.topology}: the layout would not fit fewer workers; "
                         "drop --topology or --min-workers")
    if run.min_workers is not None and strategy_class(config.parallel.strategy).server:
        raise ValueError(f"min_workers does not apply to {config.parallel.strategy!r}: an "
                         "asynchronous strategy drops a dead worker and the others go on; drop "
                         "--min-workers")


def _policy(config: TrainConfig, workers: int) -> FaultPolicy:
    """Asynchronous strategies drop a dead worker; rank 0 (where the summary is written and,
    with ``--servers 0``, the server runs) and dedicated servers are essential."""
    servers = config.parallel.servers
    return FaultPolicy(max_restarts=config.run.max_restarts,
                       min_workers=config.run.min_workers,
                       drop_dead_workers=strategy_class(config.parallel.strategy).server,
                       essential_ranks=(0, *range(workers - servers, workers)) if servers
                       else (0,))


def run(args: argparse.Namespace) -> int:
    """Check everything, then launch the workers (or be one)."""
    config = _config(args)
    workers = config.parallel.workers or len(os.sched_getaffinity(0)) or 1  # the cores we may use
    fault = args.inject_fault if args.inject_fault is not None else \
        os.environ.get(FAULT_ENV, "").strip() or None
    if under_launcher():
        world_size = _check_launched_workers(config.parallel.workers, config.run.min_workers)
        if args.inject_fault is not None:
            check_fault_spec(args.inject_fault, world_size, source="--inject-fault")
            os.environ[FAULT_ENV] = args.inject_fault  # this worker reads its plan from it
    else:
        _preflight(config, workers, fault,
                   FAULT_ENV if args.inject_fault is None else "--inject-fault")
        log.info("config: %s", json.dumps(config.with_workers(workers).to_dict(),
                                          sort_keys=True))
    code = run_distributed(workers, args.argv, lambda: _worker(config),
                           env={FAULT_ENV: fault} if fault else None,
                           policy=_policy(config, workers))
    if not under_launcher():
        from scaledl.train.resume import tidy_run_dir

        tidy_run_dir(Path(config.run.out))
    if code not in (0, 2) and not under_launcher():
        _report_failure(code, config)
    return code


def _report_failure(code: int, config: TrainConfig) -> None:
    """The launcher's last line for a failed run: whether a checkpoint survives to resume."""
    from scaledl.train.checkpoint import list_checkpoints

    restarts = config.run.max_restarts
    after = f" after {restarts} restart(s)" if restarts else ""
    if list_checkpoints(Path(config.run.out)):
        log.error("training failed (exit code %d)%s; the run directory keeps the last good "
                  "checkpoint (--resume auto continues from it)", code, after)
    else:
        log.error("training failed (exit code %d)%s before its first checkpoint; there is "
                  "nothing to resume: run it again from the start", code, after)


def _check_launched_workers(workers: int | None, min_workers: int | None) -> int:
    """Under a launcher the job has the launcher's world size, which this returns; a different
    ``--workers`` is an error (else the run would train at one size while its summary records
    another), unless the job is elastic and the size is within ``--min-workers``..``--workers``.
    """
    from scaledl.bootstrap import read_launch_env

    launch = read_launch_env()
    if workers is not None and min_workers is not None and \
            min_workers <= launch.world_size <= workers:
        return launch.world_size
    if workers is not None and workers != launch.world_size:
        raise ValueError(
            f"--workers {workers} but {launch.launcher} started {launch.world_size} rank(s); "
            f"drop --workers under a launcher or start {workers} ranks"
        )
    return launch.world_size


def _check_restartable(env: Mapping[str, str]) -> None:
    """Under ``torchrun --max-restarts``, torch 2.x hands every attempt one shared store, where a
    restarted worker finds the dead attempt's addresses and cannot connect (a long Gloo timeout);
    say so at once, with the fix, instead."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restarts.isdigit() and int(restarts) > 0:
        raise ValueError(f"this worker was restarted by torchrun, whose shared store still holds "
                         f"the failed attempt's addresses; run torchrun with "
                         f"{SHARED_STORE_ENV}=1 to give each attempt a fresh store")
    if env.get("TORCHELASTIC_MAX_RESTARTS", "0") not in ("", "0"):
        log.warning("torchrun --max-restarts: a restart will not connect unless torchrun runs with "
                    "%s=1 (torch shares one store between attempts)", SHARED_STORE_ENV)


def _worker(config: TrainConfig) -> int:
    import scaledl
    from scaledl import bootstrap
    from scaledl.train.device import BACKENDS
    from scaledl.train.in_group import check_rank_config, train_in_group
    from scaledl.cli.progress import RichProgress

    die_with_launcher()
    _check_restartable(os.environ)
    # under torchrun, mpirun or srun no preflight ran: every rank checks, before joining
    check_rank_config(config)
    device = _rank_device(config.run.device)
    topology = bootstrap.init(backend=BACKENDS[config.run.device],
                              timeout=config.parallel.timeout_s, topology=config.parallel.topology)
    try:
        # the one path of every run, the bench's pooled ones too: rank 0 writes summary.json
        # a bar on a terminal that shows it; log lines in a file, a pipe or mpiexec's sizeless
        # pseudo-terminal, where a bar's redraws would fill the log with control codes
        bar = RichProgress() if sized_terminal() else None
        result = train_in_group(config, topology, device, bar)
    except (ValueError, TypeError):
        raise
    except RuntimeError as error:
        log.error("training stopped on rank %d: %s", topology.rank, first_line(error))
        return 1
    finally:
        scaledl.shutdown()
    if topology.rank == 0:
        _report(result, config)
    return 0


def _rank_device(device: str) -> Any:
    """This rank's device: the CPU, or GPU ``LOCAL_RANK`` (as ``bootstrap.init`` makes it the
    current one for NCCL)."""
    import torch

    from scaledl.bootstrap import read_launch_env
    from scaledl.train.device import rank_device

    if device == "cpu":
        return torch.device("cpu")
    return rank_device(device, read_launch_env().local_rank, torch.cuda.device_count())


def _report(result: dict[str, Any], config: TrainConfig) -> None:
    """Rank 0's summary table (``summary.json`` holds the same numbers, written by
    :func:`~scaledl.train.in_group.train_in_group`)."""
    out = Path(result["out"])
    servers = result["world_size"] - result["workers"]
    ranks = f"{result['workers']} workers" + (
        f" + {servers} server{'s' if servers > 1 else ''}" if servers else "")
    table = Table(title=f"scaledl train: {config.model.name} on {config.data.dataset}, "
                  f"{ranks}, {config.parallel.strategy} ({config.parallel.algorithm})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    hidden = result.get("hidden_fraction")
    rows = [
        ("test accuracy", f"{result['test_accuracy']:.4f}"),
        ("training time (after start-up)", f"{result['wall_s']:.1f} s"),
        ("steps", str(result["steps"])),
        ("samples/s", f"{result['samples_per_s']:,.0f}"),
        ("time in communication", f"{100 * result['comm_share']:.1f} %"),
        ("sent per step by rank 0",
         filesize.decimal(round(result.get("bytes_sent", 0) / max(1, result["steps"])))),
        ("communication hidden behind compute",
         "n/a" if hidden is None else f"{100 * hidden:.1f} %"),
    ]
    if result.get("overlap_note"):  # a 0 % that is measured right: say why, not only that
        rows.append(("why none is hidden", str(result["overlap_note"])))
    rows += _staleness_rows(result)
    rows += _fault_rows(result)
    rows.append(("run directory", str(out)))
    for name, value in rows:
        table.add_row(name, value)
    report_console(80).print(table)


def _staleness_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary rows on staleness, for runs with a parameter server."""
    per_worker = result.get("staleness_per_worker")
    if not per_worker:
        return []
    shown = ", ".join("-" if value is None else f"{value:.1f}" for value in per_worker)
    return [
        ("updates sent to the server (rank 0)", f"{result['pushes']:,}"),
        ("staleness, max (rank 0)", str(result["max_staleness"])),
        ("mean staleness per rank", shown),
    ]


def _fault_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary rows on restarts and dropped workers, when there were any."""
    rows = []
    if result.get("restarts"):
        sizes = result.get("world_sizes") or []
        shrunk = f" (workers {' -> '.join(map(str, sizes))})" if len(set(sizes)) > 1 else ""
        rows += [("restarts", f"{result['restarts']}{shrunk}"),
                 ("steps redone", str(result["steps_redone"])),
                 ("time lost to failures", f"{result['time_lost_s']:.1f} s")]
    if result.get("dropped_workers"):
        rows.append(("workers dropped (died)", ", ".join(map(str, result["dropped_workers"]))))
    return rows
