"""``scaledl bench algorithms``: every training method with the same budget on a real data set,
one run after another; a rich table, ``--json`` and two PNG plots.  Runs with the same number
of ranks share a pool of rank processes kept between runs (:mod:`scaledl.bench.methods_pool`);
``--no-pool`` runs each as its own ``scaledl train`` process.

The methods, their options and the budget are defined in :mod:`scaledl.bench.methods`, the
numbers read back from each run in :mod:`scaledl.bench.methods_result`, the workloads and the
validation split in :mod:`scaledl.bench.methods_data`, and ``--tune-lr`` / ``--seeds`` (each
method at its own tuned rate, mean and spread over seeds) in :mod:`scaledl.bench.methods_tune`.
``--quick`` is the CI-sized run: :data:`QUICK_METHODS` on digits with 2 workers and 3 epochs
(DiLoCo's H = 20 steps twice), tuned on two rates with one seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaledl.bench.methods import (
    METHODS, BenchSpec, available_methods, check_loads, check_model, default_target,
    resolve_dataset, select_methods,
)
from scaledl.bench.methods_report import COLUMNS, table_row
from scaledl.bench.methods_result import MethodResult
from scaledl.cli.console import report_console
from scaledl.cli.outputs import check_output_dir, check_output_file

if TYPE_CHECKING:
    from scaledl.bench.methods_run import Runs
    from scaledl.bench.methods_tune import Runner

__all__ = ["add_parser", "run", "build_spec", "render_table"]

DEFAULT_OUT = Path("runs/bench-algorithms")
QUICK_METHODS = ("allreduce", "diloco")
"""``--quick``'s methods when ``--methods`` is not given: the baseline and one periodic method,
6 runs (45-48 s in all on the shared 2 cores at load 10, most of it starting the command and
its pools of ranks)."""
QUICK_GRID = "0.05,0.2"
"""``--quick``'s grid when ``--tune-lr`` is not given."""


def add_parser(kinds: Any) -> None:
    """Register the ``algorithms`` benchmark under ``scaledl bench``."""
    p = kinds.add_parser(
        "algorithms", help="every training method (EASGD family, async, sync) with one budget",
        description="Train the same model with every training method (same epochs, batch, lr, "
                    "seed), one run after another, and compare time to a target accuracy, "
                    "final accuracy, communication share and updates per second.",
    )
    p.add_argument("--methods", default=None,
                   help=f"comma list (default: every implemented one); choices: "
                        f"{', '.join(METHODS)}")
    p.add_argument("--workers", type=int, default=4,
                   help="training workers (default 4; parameter-server methods add 1 server)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of every run (default 3)")
    p.add_argument("--dataset", default="auto",
                   help="auto (fashion-mnist when installed, else digits), digits, "
                        "fashion-mnist, ...")
    p.add_argument("--data-dir", default=None,
                   help="where the data set's files are (mnist, fashion-mnist, cifar10, npz)")
    p.add_argument("--model", default="mlp", help="model name (default mlp)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="momentum of Async MSGD and Async MEASGD (the others use none)")
    p.add_argument("--seed", type=int, default=0, help="seed of every run")
    p.add_argument("--eval-every", type=int, default=50,
                   help="steps between test evaluations (default 50)")
    p.add_argument("--target", type=float, default=None,
                   help="target test accuracy (default 0.85 on fashion-mnist, 0.9 on digits)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds one run may take before it is stopped (default 600)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per method; the table shows medians (default 1)")
    p.add_argument("--tune-lr", dest="tune_lr", default=None, metavar="GRID",
                   help="tune each method's lr on a held-out validation split over GRID "
                        "(A..B doubling, e.g. 0.0125..0.4, or a comma list), then report each "
                        "method at its own lr over --seeds seeds")
    p.add_argument("--tune-jobs", dest="tune_jobs", type=int, default=None,
                   help="tuning runs at a time (default 1, 2 with --quick); they are judged by "
                        "epochs to target only, the report runs always go one at a time")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds per method, the table showing mean and spread (default 3 with "
                        "--tune-lr; without it, one run per method as --repeats sets)")
    p.add_argument("--workload", default="mlp",
                   help="mlp (--model on --dataset, default) or cnn (LeNet-5 on CIFAR-shaped "
                        "digits, 3x32x32: computation not negligible)")
    p.add_argument("--quick", action="store_true",
                   help=f"CI-sized: {', '.join(QUICK_METHODS)} on digits, 2 workers, 3 epochs, "
                        f"tuned over {QUICK_GRID} (or --tune-lr), 1 seed")
    p.add_argument("--no-pool", dest="pool", action="store_false", default=True,
                   help="run each run as its own scaledl train process (default: runs with "
                        "the same number of ranks share a pool of rank processes kept between "
                        "runs, which saves the start-up of each)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"folder of the run directories (default {DEFAULT_OUT})")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--plot-dir", type=Path, default=None,
                   help="write accuracy_vs_time.png, accuracy_vs_epoch.png and table.md "
                        "here (default: --out)")
    p.set_defaults(handler=run)


def _apply_quick(args: argparse.Namespace) -> None:
    """``--quick``: the CI-sized budget (module docstring) where the options leave it open."""
    if not getattr(args, "quick", False):
        return
    args.workers, args.epochs, args.eval_every = 2, 3, 5  # 3 epochs: DiLoCo's H=20 twice
    if args.dataset == "auto":
        args.dataset = "digits"
    if args.methods is None:
        args.methods = ",".join(name for name in QUICK_METHODS if name in available_methods())
    args.tune_lr = args.tune_lr or QUICK_GRID
    args.seeds = args.seeds or 1
    if args.tune_jobs is None:  # a tuning run is judged by epochs only: two share the cores
        args.tune_jobs = 2


def _tune_jobs(args: argparse.Namespace) -> int:
    jobs = getattr(args, "tune_jobs", None)
    return 1 if jobs is None else int(jobs)


def build_spec(args: argparse.Namespace) -> BenchSpec:
    """Validate the options into the budget of every run (``ValueError`` on bad input)."""
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats} must be at least 1")
    jobs = _tune_jobs(args)
    if jobs < 1:
        raise ValueError(f"--tune-jobs {jobs} must be at least 1")
    seeds = getattr(args, "seeds", None)
    if seeds is not None and seeds < 1:
        raise ValueError(f"--seeds {seeds} must be at least 1")
    if seeds is not None and args.repeats > 1:
        raise ValueError(f"--repeats {args.repeats} and --seeds {seeds} were both given; "
                         "give --seeds (a run per seed) or --repeats (one seed, timing)")
    model = check_model(args.model)
    dataset = resolve_dataset(args.dataset, args.data_dir)
    target = default_target(dataset) if args.target is None else args.target
    spec = BenchSpec(
        workers=args.workers, epochs=args.epochs, dataset=dataset, model=model,
        batch_size=args.batch_size, lr=args.lr, momentum=args.momentum, seed=args.seed,
        eval_every=args.eval_every, target=target, timeout_s=args.timeout,
        data_dir=args.data_dir,
    )
    check_loads(spec)
    return spec


def _check_outputs(args: argparse.Namespace) -> None:
    """The run folder, the JSON and the plot folder can be written, checked before any run."""
    check_output_dir(args.out, "--out")
    if args.json is not None:
        check_output_file(args.json, "--json")
    if args.plot_dir is not None:
        check_output_dir(args.plot_dir, "--plot-dir")


def run(args: argparse.Namespace) -> int:
    """Validate everything, run every method, then show and write the results.  SIGTERM and
    SIGHUP raise ``KeyboardInterrupt`` as Ctrl-C does, and on any of them (or any failure) the
    runs in progress are stopped, their whole process groups, before this returns."""
    from scaledl.bench.methods_run import Runs
    from scaledl.processes import signals_raise

    runs = Runs(pool=getattr(args, "pool", True))
    with signals_raise(KeyboardInterrupt):
        try:
            return _run(args, runs)
        except BaseException:
            runs.stop()
            raise
        finally:
            runs.close()  # the pools' ranks leave (nothing left to close after stop())


def _run(args: argparse.Namespace, runs: Runs) -> int:
    from scaledl.bench import methods_report as report
    from scaledl.bench.methods_result import median_result
    from scaledl.bench.methods_run import run_all

    from scaledl.bench.methods_data import workload_spec
    from scaledl.bench.methods_tune import parse_grid

    _apply_quick(args)
    available = available_methods()
    methods = select_methods(args.methods, available)
    grid = parse_grid(args.tune_lr) if args.tune_lr is not None else None
    workload = getattr(args, "workload", "mlp")
    if workload != "mlp" and (args.model != "mlp" or args.dataset not in ("auto", "digits")
                              or args.data_dir is not None):
        raise ValueError(f"--workload {workload} sets the model and data set; drop --model, "
                         "--dataset and --data-dir")
    spec = build_spec(args)
    _check_outputs(args)
    spec = workload_spec(spec, workload, args.out)
    if not methods:
        raise ValueError("no method of the comparison is implemented in this build; "
                         "add a strategy module to scaledl.strategies (see its catalogue)")
    skipped = [name for name in METHODS if name not in available]
    console = report_console(170)
    env = report.environment()
    say = console.print
    if skipped and args.methods is None:
        say(f"not implemented in this build, skipped: {', '.join(skipped)}", markup=False)
    if grid is not None or args.seeds is not None:
        return run_tuned(args, methods, spec, grid, console, env, runs.run)
    per_method = run_all(methods, spec, args.out, args.repeats,
                         lambda line: say(line, markup=False, highlight=False), runs)
    results = [median_result(method_runs) for method_runs in per_method]
    render_table(results, spec, console)
    data = report.to_json(results, spec, env, ["scaledl", *getattr(args, "argv", [])],
                          skipped if args.methods is None else [])
    if args.json is not None:
        report.write_json(data, args.json)
        say(f"wrote {args.json}", markup=False, highlight=False)
    plot_dir = args.plot_dir or args.out
    for path in report.write_plots(results, spec, plot_dir):
        say(f"wrote {path}", markup=False, highlight=False)
    (plot_dir / "table.md").write_text(report.markdown_table(results))
    return 0 if any(r.status == "ok" for r in results) else 1


def render_table(results: list[MethodResult], spec: BenchSpec, console: Any) -> None:
    """Print one row per method on a rich ``console``."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{spec.model} on {spec.dataset}, {spec.workers} workers (+1 server "
                        f"rank for the parameter-server methods), {spec.epochs} epochs, batch "
                        f"{spec.batch_size}/worker, lr {spec.lr:g}; target accuracy "
                        f"{spec.target:g}")
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in ("method", "note") else "right")
    for result in results:
        table.add_row(*(Text(cell) for cell in table_row(result)))  # no markup in reasons
    console.print(table)


def run_tuned(args: argparse.Namespace, methods: list[Any], spec: BenchSpec,
              grid: tuple[float, ...] | None, console: Any, env: dict[str, Any],
              runner: Runner | None = None) -> int:
    """``--tune-lr`` / ``--seeds`` (:mod:`scaledl.bench.methods_tune`): tune on the validation
    split, run each method at its rate over the seeds, show and write the results.
    ``runner`` runs one method (default :func:`scaledl.bench.methods_run.run_method`)."""
    from dataclasses import replace

    from scaledl.bench import methods_report as report
    from scaledl.bench.methods_data import write_validation_split
    from scaledl.bench.methods_run import run_method
    from scaledl.bench.methods_tune import run_seeds, seed_summary, tune

    run_one = runner or run_method
    began = time.perf_counter()

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    tunings = []
    if grid is not None:
        validation = write_validation_split(spec, args.out / "data" / "validation")
        tunings = tune(methods, validation, grid, args.out / "tune", run_one, say,
                       _tune_jobs(args))
        header, rows = report.tuning_rows(tunings)
        _print_table(console, "epochs to the target validation accuracy per lr (* picked; "
                              "- (best): not reached)", header, rows)
    rates = [(m, t.lr) for m, t in zip(methods, tunings)] if tunings else \
        [(m, spec.lr) for m in methods]
    seeds = args.seeds or 3
    runs = run_seeds(rates, spec, seeds, args.out / "report", run_one, say)
    summaries = [seed_summary(m, lr, results) for (m, lr), results in zip(rates, runs)]
    _print_table(console, f"{spec.model} on {spec.dataset}, {spec.workers} workers, "
                          f"{spec.epochs} epochs, batch {spec.batch_size}/worker, each method "
                          f"at its lr, {seeds} seeds (mean ± sd); target accuracy "
                          f"{spec.target:g}",
                 report.SEED_COLUMNS, [report.seed_row(s) for s in summaries])
    work = report.work_summary(
        {"tune": [r for t in tunings for _, r in t.trials],
         "report": [r for results in runs for r in results]},
        spec, time.perf_counter() - began)
    say(report.work_line(work))
    data = report.tuned_json(spec, env, ["scaledl", *getattr(args, "argv", [])], grid, tunings,
                             summaries, runs, getattr(args, "workload", "mlp"))
    data["work"] = work
    if args.json is not None:
        report.write_json(data, args.json)
        say(f"wrote {args.json}")
    plot_dir = args.plot_dir or args.out
    first = [replace(results[0], label=f"{results[0].label}, lr {lr:g}")
             for (_, lr), results in zip(rates, runs)]
    for path in report.write_plots(first, spec, plot_dir):
        say(f"wrote {path}")
    text = report.markdown(report.SEED_COLUMNS, [report.seed_row(s) for s in summaries])
    if tunings:
        text += "\n" + report.markdown(*report.tuning_rows(tunings))
    (plot_dir / "table.md").write_text(text)
    return 0 if any(s.ok for s in summaries) else 1


def _print_table(console: Any, title: str, header: list[str] | tuple[str, ...],
                 rows: list[list[str]]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for name in header:
        table.add_column(name, justify="left" if name in ("method", "note") else "right")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
