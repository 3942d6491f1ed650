"""What ``scaledl simulate`` prints: predictions, sweeps, calibration, validation, the
reproduction table and measured profiles (the console side of :mod:`scaledl.sim`)."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from scaledl.cli.outputs import check_output_file
from scaledl.collectives.auto import CostModel
from scaledl.files import write_files
from scaledl.sim.iteration import IterationResult
from scaledl.sim.job import Job
from scaledl.sim.scenario import job_network
from scaledl.sim.network import Network
from scaledl.sim.presets import device
from scaledl.profiling.profile_file import MeasuredProfile
from scaledl.sim.reproduce import TARGET_POINTS, Case, Row, mean_absolute_error
from scaledl.sim.trust import TRAITS, Band, band, count_within

__all__ = [
    "format_result", "published_check", "format_band", "format_sweep", "calibration_prior",
    "run_calibrate", "run_validate", "validation_table", "run_reproduce", "reproduction_table",
    "format_profile", "units_of", "counted",
]


def units_of(job: Job) -> str:
    """What ``job``'s ranks run on, in the plural: GPUs, or ranks of a CPU preset (cpu, knl)."""
    return "GPUs" if device(job.device).is_gpu else "ranks"


def counted(count: int, units: str, what: str = "") -> str:
    """``count`` of ``units`` (a plural ending in s), singular for one: "1 GPU", "8 cpu ranks"."""
    noun = units if count != 1 else units[:-1]
    return f"{count} {what + ' ' if what else ''}{noun}"


def format_result(r: IterationResult, units: str = "GPUs") -> str:
    """The lines ``scaledl simulate`` prints for one prediction; ``units`` names what the ranks
    run on (GPUs, or ranks of a CPU preset)."""
    one = units[:-1]
    lines = [
        f"iteration time       {r.iteration_s * 1e3:10.2f} ms   ({r.samples_per_s:,.0f} "
        f"samples/s on {counted(r.world_size, units)})",
        f"  compute            {r.compute_s * 1e3:10.2f} ms   (one {one}: "
        f"{r.single_gpu_s * 1e3:.2f} ms incl. update {r.update_s * 1e3:.2f} ms)",
        f"  communication      {r.communication_s * 1e3:10.2f} ms busy, "
        f"{r.exposed_s * 1e3:.2f} ms beyond one {one}",
    ]
    for label, seconds in (("stragglers", r.straggler_s), ("per-tensor software", r.software_s),
                           ("interference", r.interference_s), ("input pipeline", r.input_s),
                           ("shared cores", r.timeshare_s)):
        if seconds > 0:
            lines.append(f"    {label:<19}{seconds * 1e3:9.2f} ms of it")
    lines += [f"communication share  {r.communication_share:10.1%}",
              f"scaling efficiency   {r.efficiency:10.1%}"]
    return "\n".join(lines)


def published_check(job: Job, efficiency: float, like: str = "this one"
                    ) -> tuple[str, dict[str, object] | None]:
    """What a prediction of ``efficiency`` for ``job`` prints of its published check, and what
    its JSON holds (nothing with the ideal model: the errors are the full model's)."""
    if job.lossless:
        return "", None
    if job.topology_value().world_size == 1:
        return (f"published check      none: on one {units_of(job)[:-1]}, scaling efficiency "
                "is 100% by definition", None)
    if job.strategy != "allreduce":
        return (f"published check      none for {job.strategy}: every published efficiency "
                "point is an allreduce job (docs/simulation.md)", None)
    found = band(job)
    measured = job.compute_time is not None or job.profile_path is not None
    return (format_band(found, efficiency, job.device, like, measured),
            found.to_dict() if found is not None else None)


def format_band(found: Band | None, efficiency: float, device: str, like: str = "this one",
                measured: bool = True) -> str:
    """The lines that say how the model did on the published points like a prediction of
    ``efficiency`` on ``device`` (:func:`scaledl.sim.trust.band`); ``like`` names the job, and
    ``measured`` is False when its compute is the device preset's estimate (the points' was
    nearly always their run's measured one-GPU rate, so their errors leave that one out)."""
    if found is None:
        where = (': see docs/simulation.md, "Validation here" (the emulated cluster)'
                 if device == "cpu" else "")
        return f"published check      none on {device} (every published point is on GPUs){where}"
    n = len(found.errors)
    lines = [f"published check      {n} published points like {like} "
             f"({found.traits.describe(found.kept)})",
             f"  error              {_spread(found.errors)}; docs/simulation.md"]
    if found.exact:
        lines.append(f"  exact matches      {found.traits.describe(TRAITS)}: "
                     f"{_spread(found.exact)}")
    if not measured:
        lines.append(f"  compute            theirs was each run's measured one-GPU rate, this "
                     f"one the {device} preset's estimate (--compute-time, --profile)")
    if not found.covers(efficiency):
        low, high = found.published
        lines.append(f"  beyond them        they were published at {low:.1%}-{high:.1%} of linear, "
                     f"so they say little of {efficiency:.1%}")
    return "\n".join(lines)


def _spread(errors: tuple[float, ...]) -> str:
    """Median, range and count within target of sorted errors (points)."""
    return (f"median {statistics.median(errors):+.1f} pt ({errors[0]:+.1f} to {errors[-1]:+.1f}),"
            f" {count_within(errors)} of {len(errors)} within {TARGET_POINTS:g} pt")


def format_sweep(results: list[IterationResult], specs: list[str], units: str = "GPUs") -> str:
    """One line per size of a sweep (``units``: GPUs, or ranks of a CPU preset)."""
    lines = [f"{units:>6} {'topology':>10} {'iter ms':>10} {'comm share':>11} {'efficiency':>11}"]
    for r, spec in zip(results, specs):
        lines.append(f"{r.world_size:6d} {spec:>10} {r.iteration_s * 1e3:10.2f} "
                     f"{r.communication_share:11.1%} {r.efficiency:11.1%}")
    return "\n".join(lines)


def _warn_on_default_priors(args: argparse.Namespace) -> None:
    """Say so when the link priors are the GPU defaults (p100/ib-edr) the options did not pick."""
    if getattr(args, "calibration", None) is not None:
        return
    missing = [flag for flag, value in (("--device", args.device), ("--network", args.network))
               if value is None]
    if missing:
        print(f"scaledl: warning: {' and '.join(missing)} not given, so the priors are the "
              "p100 / ib-edr presets (NVLink inside a host); for files measured on CPUs pass "
              "--device cpu --network 1gbit (or 10gbit)", file=sys.stderr)


def calibration_prior(args: argparse.Namespace, job: Job) -> Network:
    """The network the fit starts from; ``gamma`` from ``--device`` when given, else from
    ``auto``'s calibration (measured on this machine), never from the p100 default."""
    prior = job_network(job)
    if args.device is None:
        prior = replace(prior, gamma=CostModel.load().gamma)
    return prior


def run_calibrate(args: argparse.Namespace, job: Job) -> int:
    """Fit the link classes, then ``native`` on them; write the calibration in ``auto``'s
    format."""
    from scaledl.calibration.fit import fit_native, load_natives
    from scaledl.sim.calibrate import fit_network, load_points

    check_output_file(args.output, "calibrate -o")
    _warn_on_default_priors(args)
    points = load_points(args.bench, args.bench_topology, args.placement)
    result = fit_network(points, calibration_prior(args, job), cores=job.cores)
    model, native = fit_native(load_natives(args.bench, args.bench_topology),
                               result.network.to_cost_model())
    write_files([(args.output, lambda path: path.write_text(model.to_json() + "\n"))])
    print(result.describe())
    print(f"{native}; gamma {model.gamma:.3g} s/B")
    print(f"wrote {args.output}")
    return 0


def validation_table(rows: list[dict[str, object]], markdown: bool) -> str:
    """Predicted against measured, one line per measurement."""
    lines = []
    if markdown:
        lines += ["| collective | algorithm | bytes | topology | measured ms | predicted ms | "
                  "error |", "|---|---|---:|---|---:|---:|---:|"]
    for row in rows:
        cells = (row["collective"], row["algorithm"], row["nbytes"], row["topology"],
                 f"{row['measured_ms']:.2f}", f"{row['predicted_ms']:.2f}",
                 f"{row['error']:+.1%}")
        if markdown:
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        else:
            lines.append("{:15s} {:17s} {:>10} {:>8} {:>12} {:>12} {:>8}".format(*cells))
    return "\n".join(lines)


def run_validate(args: argparse.Namespace, job: Job, min_bytes: int) -> int:
    """Print predicted vs measured for messages of at least ``min_bytes``."""
    from scaledl.sim.calibrate import load_points, validate

    _check_tolerance(args.tolerance)
    _warn_on_default_priors(args)
    points = load_points(args.bench, args.bench_topology, args.placement)
    rows = validate(points, job_network(job), min_bytes, cores=job.cores)
    print(validation_table(rows, args.markdown))
    if rows:
        worst = max(abs(float(str(r["error"]))) for r in rows)
        within = sum(abs(float(str(r["error"]))) <= args.tolerance for r in rows)
        print(f"{within}/{len(rows)} within {args.tolerance:.0%}; worst {worst:.1%}")
    return 0


def _check_tolerance(tolerance: float) -> None:
    """``validate --tolerance`` is a relative error: finite and above zero."""
    if not math.isfinite(tolerance) or tolerance <= 0:
        raise ValueError(f"--tolerance {tolerance} must be a finite number > 0, the relative "
                         "error counted as a match (e.g. 0.15 for 15%)")


def reproduction_table(rows: list[Row]) -> str:
    """The published points, the prediction and its error, as a markdown table."""
    lines = ["| result | published | scaledl predicts | error | target met | how predicted | "
             "setup | source |", "|---|---:|---:|---:|---|---|---|---|"]
    for row in rows:
        case = row.case
        if case.metric == "speedup":
            published, predicted = f"{case.published:.2f}x", f"{row.prediction.value:.2f}x"
            err = f"{row.error:+.0%}"
        else:
            published, predicted = f"{case.published:.1%}", f"{row.prediction.value:.1%}"
            err = f"{row.error:+.1f} pt"
        met = "n/a (share)" if row.within is None else ("yes" if row.within else "**no**")
        lines.append(f"| {case.name} | {published} | {predicted} | {err} | {met} | "
                     f"{row.prediction.detail} | {case.setup} | {case.source} |")
    scored = [row for row in rows if row.within is not None]
    lines.append("")
    summary = (f"{sum(bool(row.within) for row in scored)} of {len(scored)} points within "
               "5 points of efficiency (15% of a speedup)")
    mae = mean_absolute_error(rows)
    if mae is not None:
        plural = "s" if mae[1] != 1 else ""
        summary += (f"; mean absolute error {mae[0]:.1f} points over {mae[1]} efficiency "
                    f"point{plural}")
    lines.append(summary)
    return "\n".join(lines)


def family_table(rows: list[Row], families: tuple[tuple[str, tuple[Case, ...]], ...]) -> str:
    """Each source's points with a target: how many, how many within it, and the mean and mean
    absolute error of its efficiency points (a speedup's error is relative, so not averaged)."""
    lines = ["| source | points | within target | mean error | mean absolute error |",
             "|---|---:|---:|---:|---:|"]
    by_case = {id(row.case): row for row in rows}
    for family, cases in families:
        scored = [by_case[id(case)] for case in cases if by_case[id(case)].within is not None]
        if not scored:
            continue
        points = [row.error for row in scored if row.case.metric == "efficiency"]
        mean = f"{sum(points) / len(points):+.1f} pt" if points else "-"
        absolute = f"{sum(map(abs, points)) / len(points):.1f} pt" if points else "-"
        lines.append(f"| {family} | {len(scored)} | {sum(bool(row.within) for row in scored)} | "
                     f"{mean} | {absolute} |")
    return "\n".join(lines)


def run_reproduce(ideal: bool, write_errors: Path | None = None) -> int:
    """Print every published point beside its prediction (and, to ``write_errors``, the errors
    a prediction's published check reads: :func:`scaledl.sim.trust.write_errors`)."""
    from scaledl.sim import reproduce
    from scaledl.sim.trust import published_errors, trait_table
    from scaledl.sim.trust import write_errors as write

    if ideal and write_errors is not None:
        raise ValueError("--write-errors records the full model's errors; drop --ideal")
    if write_errors is not None:
        check_output_file(write_errors, "--write-errors")
    if ideal:
        print("(the ideal model: constant device efficiency, no losses)")
    families = reproduce.published_families()
    rows = reproduce.evaluate(tuple(case for _, cases in families for case in cases), ideal)
    if write_errors is not None:
        errors = published_errors(rows)
        write_files([(write_errors, lambda path: write(errors, path))])
        print(f"wrote {write_errors}", file=sys.stderr)
    print(reproduction_table(rows))
    print("\nBy source:")
    print(family_table(rows, families))
    if not ideal:  # the ideal model drops precision, and a prediction's check is the full model's
        print("\nBy kind of job (what a prediction's published check draws from):")
        print(trait_table(published_errors(rows)))
        from scaledl.sim.device_checks import rate_table

        print("\nSingle-GPU rates from the device presets alone (no measured rate or profile):")
        print(rate_table())
    return 0


def format_profile(profile: MeasuredProfile, path: Path) -> str:
    """A summary of a measured profile."""
    lines = [f"{profile.model} {'x'.join(map(str, profile.input_shape))} on "
             f"{profile.device.get('name', profile.device.get('type'))} "
             f"({profile.device.get('threads')} threads), {profile.repeats} repeats"
             + (", channels last" if profile.device.get("memory_format") == "channels_last"
                else "")
             + (f", autocast {profile.device['precision']}"
                if profile.device.get("precision", "float32") != "float32" else ""),
             f"{'batch':>6} {'fwd+bwd ms':>11} {'hooked ms':>10} {'coverage':>9} "
             f"{'update ms':>10} {'activations MiB':>16}"]
    for k, batch in enumerate(profile.batches):
        lines.append(f"{batch:6d} {profile.forward_backward_s[k] * 1e3:11.2f} "
                     f"{profile.hooked_s[k] * 1e3:10.2f} {profile.coverage[k]:9.1%} "
                     f"{profile.update_s[k] * 1e3:10.2f} "
                     f"{profile.activation_bytes[k] / 2**20:16.1f}")
    bound = " (an upper bound: simulate uses the device's)" \
        if profile.device.get("type") == "cuda" else ""
    lines.append(f"jitter cv {profile.jitter_cv:.1%}, interference {profile.interference:.1%}"
                 f"{bound}, "
                 f"TCP {profile.tcp_beta * 1e9:.2f} ns/B per end; "
                 f"parameters {profile.parameter_bytes / 2**20:.1f} MiB")
    low = [b for b, c in zip(profile.batches, profile.coverage) if not 0.85 <= c <= 1.15]
    if low:
        lines.append(f"note: the modules' times add up to a whole iteration only within 15% at "
                     f"batch(es) {low}: the loss and autograd's own work (large in a small "
                     "model) or a busy machine; scaledl spreads the difference over the layers")
    lines.append(f"wrote {path}")
    return "\n".join(lines)
