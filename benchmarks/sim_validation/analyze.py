"""Compare `scaledl simulate` with the emulated-cluster measurements of run.sh.

    python benchmarks/sim_validation/analyze.py [RAW_DIR] > benchmarks/sim_validation/results.md

Everything is predicted from presets (link rates, the cpu device's executor costs, the scaledl
stack's per-call cost) and ranks / cores contention; nothing here is fitted.  The cpu device's
two host CPU constants and the per-call cost were derived once from the 2x2 run 6 files
(fit_host.py; presets.py CPU_TCP_BETA, losses.py STACKS["scaledl"]); every other file is held
out.  A folder measured on another machine (raw-h100/) carries a ``host.json`` (host.py): its
cores, its calibration files and the constants fitted there, which replace the VM's.  Writes
results.json (results-NAME.json for raw-NAME/) beside the folder and prints markdown tables:

1. collectives: predicted vs measured per file, messages >= 1 MiB, within 15%, held-out share
   per link rate and per run, and how often two runs of a point agree within 15% (every pair of
   runs: the noise floor);
2. training: `scaledl train` median step time (steps after the first 5) against the prediction
   from the measured profile for the same model, workers, topology, algorithm and batch, per
   repeat of run.sh's train phase (TRAIN_RUN), and each configuration's median error;
3. profiles: the measured iteration at a batch the profile did not contain against the
   profile's prediction.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from host import RATES, Host, load_host
from scaledl.profiling.profile_file import load_profile
from scaledl.sim.calibrate import Point, load_points, on_host, predict
from scaledl.sim.compute import measured_compute
from scaledl.sim.scenario import job_profile, resolve
from scaledl.sim.job import Job
from scaledl.sim.losses import STACKS
from scaledl.sim.network import Network
from scaledl.sim.overlap import call_software

MIN_BYTES, TOLERANCE = 1 << 20, 0.15
VM = Host()
"""The VM of raw/: the cpu device's presets, 2 cores, the 2x2 run 6 files as calibration."""
CORES, CALL = VM.cores, VM.call
TRAIN = (  # tag, model, algorithm, layout, rate, batch (as run.sh)
    ("mlp-ring-2x2-1gbit", "mlp", "ring", "2x2", "1gbit", 64),
    ("mlp-hierarchical-3x2-100mbit", "mlp", "hierarchical", "3x2", "100mbit", 64),
    ("resnet20-torus-2x2-10gbit", "resnet20", "torus", "2x2", "10gbit", 32),
)


def _network(rate: str) -> Network:
    """The network `scaledl simulate --device cpu --network RATE --intra loopback` replays on."""
    return VM.network(rate)


def predicted_s(point: Point, network: Network, call: float = CALL, cores: int = CORES) -> float:
    """What `scaledl simulate` predicts for ``point`` on ``network`` with its ranks sharing
    ``cores`` cores: the replayed schedule and the stack's per-call software."""
    stack = replace(STACKS["scaledl"], call_overhead_s=call)
    return (predict(point, network, cores=cores)
            + call_software(point.compiled, stack, on_host(network, point, cores)))


def collectives(raw: Path, host: Host = VM) -> list[dict[str, Any]]:
    """Every collective point >= 1 MiB of ``raw`` against its prediction on ``host``."""
    rows = []
    for path in sorted(raw.glob("allreduce-*-run*.json")):
        _, layout, rate, run = path.stem.split("-")
        for point in load_points([path]):
            if point.nbytes < MIN_BYTES:
                continue
            predicted = predicted_s(point, host.network(rate), host.call, host.cores)
            rows.append({"file": path.name, "layout": layout, "rate": rate, "run": run,
                         "algorithm": point.algorithm, "ran": point.ran,
                         "nbytes": point.nbytes,
                         "measured_ms": point.measured_s * 1e3, "predicted_ms": predicted * 1e3,
                         "error": predicted / point.measured_s - 1,
                         "held_out": path.name not in host.calibration})
    return rows


def noise_floor(rows: list[dict[str, Any]], rate: str,
                between: tuple[str, str] | None = None) -> tuple[int, int]:
    """Pairs of runs (every two runs, or the two named in ``between``) of the same layout,
    algorithm and size within 15% of each other."""
    runs: dict[tuple[str, str, int], list[float]] = {}
    for row in rows:
        if row["rate"] == rate and (between is None or row["run"] in between):
            runs.setdefault((row["layout"], row["algorithm"], row["nbytes"]), []).append(
                row["measured_ms"])
    pairs = [(a, b) for v in runs.values() for i, a in enumerate(v) for b in v[i + 1:]]
    return sum(abs(b / a - 1) <= TOLERANCE for a, b in pairs), len(pairs)


def training(raw: Path) -> list[dict[str, Any]]:
    """One row per configuration and repeat (run.sh's TRAIN_RUN): the repeat's median step
    against the prediction with that repeat's single-worker step as the update time, on the
    VM's cpu device and cores (only raw/ has training files; a host.json is not applied)."""
    rows = []
    for tag, model, algorithm, layout, rate, batch in TRAIN:
        for metrics in sorted(raw.glob(f"train-{tag}-run*.metrics.jsonl")):
            repeat = metrics.name.removesuffix(".metrics.jsonl").rsplit("-run", 1)[1]
            times = _step_times(metrics)
            per_host, hosts = (int(v) for v in layout.split("x"))
            profile = raw / f"profile-{model}.json"
            single = raw / f"train-single-{model}-run{repeat}.metrics.jsonl"
            job = Job(model=model, device="cpu", network=rate, intra="loopback",
                      gpus=per_host * hosts, topology=layout, algorithm=algorithm, batch=batch,
                      profile_path=profile, cores=CORES,
                      update_time=_beyond_compute(single, model, batch, profile))
            result = resolve(job).run()
            measured = statistics.median(times)
            rows.append({"run": tag, "repeat": int(repeat), "steps": len(times),
                         "measured_ms": measured * 1e3,
                         "measured_p25_ms": statistics.quantiles(times, n=4)[0] * 1e3,
                         "measured_p75_ms": statistics.quantiles(times, n=4)[2] * 1e3,
                         "predicted_ms": result.iteration_s * 1e3,
                         "error": result.iteration_s / measured - 1,
                         "predicted_compute_ms": result.compute_s * 1e3,
                         "predicted_comm_busy_ms": result.communication_s * 1e3})
    return rows


def _step_times(metrics: Path) -> list[float]:
    """A training run's step times, without the first 5 (warm-up)."""
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["step_s"] for r in steps if r.get("kind") == "step"][5:]


def _beyond_compute(single: Path, model: str, batch: int, profile: Path) -> float | None:
    """What one worker's training step costs beyond the profile's forward and backward (the
    update and the trainer's own bookkeeping), measured by run.sh's single-worker run."""
    if not single.is_file():
        return None
    step = statistics.median(_step_times(single))
    measured = load_profile(profile)
    fwd_bwd = measured_compute(measured, job_profile(Job(model=model, profile_path=profile)))
    times = fwd_bwd.layer_times(job_profile(Job(model=model, profile_path=profile)), batch)
    return max(step - sum(times[0]) - sum(times[1]), 0.0)


def profiles(raw: Path) -> list[dict[str, Any]]:
    rows = []
    for held in sorted(raw.glob("profile-*-b*.json")):
        model, batch = held.stem.split("-")[1], int(held.stem.rsplit("-b", 1)[1])
        measured = load_profile(held)
        job = Job(model=model, device="cpu", gpus=1, batch=batch,
                  profile_path=raw / f"profile-{model}.json")
        predicted = resolve(job).run().iteration_s
        actual = measured.forward_backward_s[0] + measured.update_seconds
        rows.append({"model": model, "batch": batch, "measured_ms": actual * 1e3,
                     "predicted_ms": predicted * 1e3, "error": predicted / actual - 1})
    return rows


def _print(coll: list[dict[str, Any]], train: list[dict[str, Any]],
           prof: list[dict[str, Any]]) -> None:
    print("## Collectives (messages >= 1 MiB), held out unless marked\n")
    print("| rate | held-out points within 15% | all files | pairs of runs within 15% |")
    print("|---|---:|---:|---:|")
    for rate in RATES:
        held = [r for r in coll if r["rate"] == rate and r["held_out"]]
        every = [r for r in coll if r["rate"] == rate]
        ok, pairs = noise_floor(coll, rate)
        within = sum(abs(r["error"]) <= TOLERANCE for r in held)
        print(f"| {rate} | {within}/{len(held)} ({within / max(len(held), 1):.0%}) | "
              f"{sum(abs(r['error']) <= TOLERANCE for r in every)}/{len(every)} | "
              f"{ok}/{pairs} |")
    runs = sorted({r["run"] for r in coll}, key=lambda run: int(run.removeprefix("run")))
    print("\nHeld-out points within 15%, by run:\n")
    print("| rate | " + " | ".join(runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for rate in RATES:
        cells = []
        for run in runs:
            held = [r for r in coll if r["rate"] == rate and r["run"] == run and r["held_out"]]
            cells.append(f"{sum(abs(r['error']) <= TOLERANCE for r in held)}/{len(held)}")
        print(f"| {rate} | " + " | ".join(cells) + " |")
    print("\nPairs of runs within 15% of each other, by pair of runs:\n")
    print("| pair | " + " | ".join(RATES) + " |")
    print("|---|" + "---:|" * len(RATES))
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            cells = [noise_floor(coll, rate, (a, b)) for rate in RATES]
            if any(total for _, total in cells):
                print(f"| {a}-{b} | " + " | ".join(
                    f"{ok}/{total}" if total else "-" for ok, total in cells) + " |")
    print("\n| file | algorithm (as it ran) | MiB | measured ms | predicted ms | error |")
    print("|---|---|---:|---:|---:|---:|")
    for r in coll:
        mark = "" if r["held_out"] else " (fit)"
        ran = r["algorithm"] if r["ran"] == r["algorithm"] else f"{r['algorithm']} ({r['ran']})"
        print(f"| {r['file']}{mark} | {ran} | {r['nbytes'] >> 20} | "
              f"{r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | {r['error']:+.1%} |")
    print("\n## Training steps\n")
    print("| run | repeat | steps | measured median ms (p25-p75) | predicted ms | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in train:
        print(f"| {r['run']} | {r['repeat']} | {r['steps']} | {r['measured_ms']:.1f} "
              f"({r['measured_p25_ms']:.1f}-{r['measured_p75_ms']:.1f}) | "
              f"{r['predicted_ms']:.1f} | {r['error']:+.1%} |")
    print("\n| run | repeats | median error | errors |")
    print("|---|---:|---:|---|")
    for tag, *_ in TRAIN:
        errors = [r["error"] for r in train if r["run"] == tag]
        if errors:
            print(f"| {tag} | {len(errors)} | {statistics.median(errors):+.1%} | "
                  + ", ".join(f"{e:+.1%}" for e in errors) + " |")
    print("\n## Profiles: a batch the profile did not measure\n")
    print("| model | batch | measured ms | predicted ms | error |")
    print("|---|---:|---:|---:|---:|")
    for r in prof:
        print(f"| {r['model']} | {r['batch']} | {r['measured_ms']:.2f} | "
              f"{r['predicted_ms']:.2f} | {r['error']:+.1%} |")


def main() -> None:
    raw = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("benchmarks/sim_validation/raw")
    if not raw.is_dir():
        sys.exit(f"usage: analyze.py [RAW_DIR]; {raw} is not a directory of run.sh's files")
    host = load_host(raw)
    coll, train, prof = collectives(raw, host), training(raw), profiles(raw)
    suffix = "" if raw.name == "raw" else "-" + raw.name.removeprefix("raw-")
    (raw.parent / f"results{suffix}.json").write_text(json.dumps(
        {"collectives": coll, "training": train, "profiles": prof}, indent=1) + "\n")
    print(f"Measured on {host.machine}, replayed on {host.cores} cores"
          + (f" with its own constants ({raw.name}/host.json)\n" if host.constants else "\n"))
    _print(coll, train, prof)


if __name__ == "__main__":
    main()
