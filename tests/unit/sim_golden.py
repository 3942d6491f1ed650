"""What the simulator predicts today, as plain JSON data: the golden record that refactoring
``scaledl.sim`` must leave unchanged (tests/unit/test_sim_golden.py, and the reproduction table
in tests/unit/test_sim_reproduce.py, which already predicts every case).

``python tests/unit/sim_golden.py`` writes ``sim_golden.json`` beside this file from the code as
it is (about two minutes: it predicts every published case twice); run it only when a change
of a prediction is intended, and say so in the commit.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).with_name("sim_golden.json")
"""The committed record."""

RELATIVE = 1e-9
"""Largest relative difference of two floats counted as equal.  Another Python, NumPy or libm
(torch 2.11's image on the H200 host) rounds the last bits differently: 1.1e-12 relative was
seen there, where a changed model moves predictions by far more than 1e-9."""

ABSOLUTE = 1e-12
"""Largest absolute difference counted as equal: times that are differences of near-equal sums
(exposed and interference seconds) end as 0.0 on one machine and 1e-16 on another."""

SWEEPS = (  # device, network, model, topology, extra Job fields
    ("k80", "ib-fdr", "resnet50", "16x2", {"strategy": "reduce-broadcast",
                                             "algorithm": "hierarchical", "stack": "mpi"}),
    ("p100", "ib-edr", "resnet50", "4x8x2", {"algorithm": "torus", "stack": "mpi"}),
    ("p100", "25gbe", "vgg16", "4x8", {"stack": "horovod", "batch": 64}),
    ("p100", "25gbe-roce", "resnet50", "4x8", {"stack": "horovod", "batch": 64}),
    ("v100", "ib-edr-x4", "resnet50", "8x4", {"intra": "nvlink2"}),
    ("v100", "ib-edr-x8", "bert_large", "16x4",
     {"input_shape": (128,), "intra": "nvswitch-v100", "mixed_precision": True,
      "allreduce_bytes": 2, "accumulation": 4, "bucket_mb": 8192.0}),
    ("a100", "ib-hdr-x8", "resnet50", "8x4",
     {"intra": "nvlink3", "mixed_precision": True, "channels_last": True, "batch": 256}),
    ("a100-80gb", "ib-hdr-x8", "vgg16", "8x2", {"intra": "nvlink3", "batch": 256}),
    ("h100", "ib-ndr-x8", "resnet50", "8x4", {"intra": "nvlink4", "stack": "horovod-0.21"}),
    ("h200", "400gbe-roce", "resnet50", "8x2", {"intra": "nvlink4"}),
    ("knl", "100gbe", "resnet50", "1x8", {}),
    ("cpu", "emulated-1gbit", "resnet20", "2x2", {"input_shape": (3, 32, 32), "cores": 2}),
    ("cpu", "10gbe", "lenet", "2x2", {"algorithm": "halving_doubling", "cores": 4}),
    ("v100", "dgx1-p100-staged", "vgg16", "4x2",
     {"intra": "nvlink1-dgx1", "stack": "tf-replicated", "bucket_mb": 1e-6}),
    ("p100", "50gbe", "resnet50", "8x4", {"algorithm": "hierarchical", "intra": "nvlink1"}),
    ("k80", "ib-edr", "alexnet", "8", {"strategy": "sync-easgd", "algorithm": "tree",
                                       "input_shape": (3, 64, 64), "intra": "pcie3"}),
    ("p100", "10gbe", "resnet50", "4x4x2", {"oversubscription": 4.0, "uplink": "25gbe",
                                            "algorithm": "ring", "lossless": True}),
)
"""Sweeps over the device, link and stack presets, the strategies and the losses."""

CLI = (
    ["simulate", "--model", "lenet", "--device", "v100", "--network", "10gbe", "--gpus", "8",
     "--topology", "2x2x2", "--algorithm", "torus"],
    ["simulate", "--model", "lenet", "--device", "v100", "--network", "10gbe", "--gpus", "8",
     "--topology", "4x2", "--algorithm", "hierarchical[shm,ring]"],
    ["simulate", "--gpus", "8"],
    ["simulate", "--gpus", "64", "--topology", "8x8", "--device", "a100", "--network",
     "ib-hdr-x8", "--model", "bert_large", "--mixed-precision", "--accumulation", "4"],
    ["simulate", "--gpus", "16", "--stack", "horovod", "--network", "25gbe", "--model", "vgg16",
     "--batch", "64"],
    ["simulate", "--ideal", "--gpus", "32", "--topology", "4x8"],
    ["simulate", "--device", "cpu", "--model", "resnet20", "--input-shape", "3x32x32",
     "--gpus", "4", "--topology", "2x2", "--network", "emulated-1gbit", "--cores", "2"],
    ["simulate", "--model", "resnet50", "--gpus", "256", "--topology", "4x16x4", "--algorithm",
     "torus", "--device", "p100", "--network", "ib-edr", "--sweep"],
    ["simulate", "--model", "lenet", "--device", "v100", "--network", "10gbe", "--gpus", "16",
     "--topology", "4x4", "--sweep"],
    ["simulate", "--gpus", "12", "--topology", "4x2"],
    ["simulate", "--tau", "4"],
    ["simulate", "--algorithm", "auto"],
    ["simulate", "--inter-bandwidth", "-5"],
    ["simulate", "--device", "tpu9"],
    ["simulate", "--cycle-ms", "2"],
    ["simulate", "--gpus", "6"],
)
"""Command lines whose printed lines (and JSON, where they write one) are recorded."""


def _plain(value: Any) -> Any:
    """``value`` as JSON data: tuples as lists, non-finite floats as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def sweeps() -> list[dict[str, Any]]:
    """Every sweep of :data:`SWEEPS`, each job's result as ``IterationResult.to_dict``."""
    from scaledl.sim.job import Job
    from scaledl.sim.scenario import resolve
    from scaledl.sim.sweep import run_sweep

    records = []
    for device, network, model, topology, extra in SWEEPS:
        job = Job(model=model, device=device, network=network, topology=topology,
                  gpus=math.prod(int(axis) for axis in topology.split("x")), **extra)
        scenario = resolve(job)
        results = run_sweep(scenario.topology, scenario.run)
        records.append({"job": repr(job), "results": _plain([r.to_dict() for r in results])})
    return records


def cli() -> list[dict[str, Any]]:
    """Each command of :data:`CLI`: exit code, stdout, stderr (its file names made relative)
    and the JSON it wrote."""
    from scaledl.cli.main import main

    records = []
    for argv in CLI:
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "out.json"
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main([*argv, "--json", str(target)])
                except SystemExit as exit_:
                    code = exit_.code if isinstance(exit_.code, int) else 1
            written = json.loads(target.read_text()) if target.exists() else None
            records.append({"argv": argv, "code": code, "stdout": out.getvalue(),
                            "stderr": err.getvalue().replace(tmp, "TMP"),
                            "json": _plain(written)})
    return records


def reproduction(rows: list[Any], ideal_rows: list[Any]) -> dict[str, Any]:
    """Every published case with its full and ideal prediction, and the tables printed."""
    from scaledl.cli.simulate_report import family_table, reproduction_table
    from scaledl.sim.trust import published_errors, trait_table

    def prediction(row: Any) -> dict[str, Any]:
        return {"value": row.prediction.value, "detail": row.prediction.detail,
                "job": repr(row.prediction.job), "error": row.error, "within": row.within}

    cases = [{"name": full.case.name, "metric": full.case.metric,
              "published": full.case.published, "setup": full.case.setup,
              "source": full.case.source, "full": prediction(full), "ideal": prediction(ideal)}
             for full, ideal in zip(rows, ideal_rows, strict=True)]
    families = _families()
    return {"cases": cases,
            "tables": {"full": reproduction_table(rows), "ideal": reproduction_table(ideal_rows),
                       "families": family_table(rows, families),
                       "traits": trait_table(published_errors(rows))},
            "families": [[name, [case.name for case in cases]] for name, cases in families]}


def _families() -> Any:
    """The reproduction table's families (wherever the code keeps them)."""
    from scaledl.sim.reproduce import published_families

    return published_families()


def rates() -> str:
    """The single-GPU rate table ``scaledl simulate reproduce`` prints last."""
    from scaledl.sim.device_checks import rate_table

    return rate_table()


def differences(expected: Any, actual: Any, where: str = "") -> list[str]:
    """Where ``actual`` differs from ``expected`` (floats within :data:`RELATIVE` or
    :data:`ABSOLUTE`)."""
    if isinstance(expected, float) and isinstance(actual, (int, float)) \
            and not isinstance(actual, bool):
        if math.isclose(expected, actual, rel_tol=RELATIVE, abs_tol=ABSOLUTE) or expected == actual:
            return []
        return [f"{where}: {expected!r} != {actual!r}"]
    if isinstance(expected, dict) and isinstance(actual, dict):
        if expected.keys() != actual.keys():
            return [f"{where}: keys {sorted(expected)} != {sorted(actual)}"]
        return [d for key in expected for d in differences(expected[key], actual[key],
                                                           f"{where}.{key}")]
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items != {len(actual)}"]
        return [d for k, (e, a) in enumerate(zip(expected, actual))
                for d in differences(e, a, f"{where}[{k}]")]
    if expected != actual or type(expected) is not type(actual):
        return [f"{where}: {expected!r} != {actual!r}"]
    return []


def load() -> dict[str, Any]:
    """The committed record."""
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def main() -> None:
    """Write the record from the code as it is."""
    from scaledl.sim.reproduce import evaluate, published_cases

    cases = published_cases()
    data = {"sweeps": sweeps(), "cli": cli(), "rates": rates(),
            "reproduction": reproduction(evaluate(cases), evaluate(cases, ideal=True))}
    GOLDEN.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
