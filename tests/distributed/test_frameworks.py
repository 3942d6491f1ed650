"""PyTorch Lightning and Hugging Face Accelerate on 2 processes, with scaledl averaging gradients.

Each framework runs under torchrun (as ``accelerate launch`` and Lightning's own launcher do)
in ``frameworks_lightning.py`` / ``frameworks_accelerate.py``: the same model, initial weights
and data trained with the framework's plain DDP and with scaledl's algorithms (ring, auto).
After several SGD-with-momentum steps every rank's parameters must equal plain DDP's, and
scaledl's allreduce must have run (so a hook the framework ignored would fail here: Lightning's
own ``DDPStrategy`` drops a comm hook on CPU).  Skipped, saying why, without the framework
(``pip install torch==2.13.0 -e '.[test]'`` installs both).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.launcher_helpers import clean_env, run_job

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(200)]

HERE = Path(__file__).parent


def _run(script: str, tmp_path: Path) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(HERE / script), str(tmp_path)]
    job = run_job(command, clean_env(), tmp_path, timeout=180)
    missing = [r for r in range(2) if not (tmp_path / f"rank{r}.json").exists()]
    assert job.returncode == 0 and not missing, job.output[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def _check_equal_to_ddp(ranks: list[dict[str, Any]]) -> None:
    reference = ranks[0]["ddp"]["parameters"]
    for runs in ranks:
        assert runs["ddp"]["scaledl_allreduces"] == 0
        for name, run in runs.items():
            assert run["parameters"] == pytest.approx(reference, abs=1e-6), name
            if name != "ddp":
                assert run["scaledl_allreduces"] > 0, f"{name}: scaledl's hook never ran"


def _require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install torch==2.13.0 -e '.[{extra}]')")


def test_lightning_fit_matches_ddp(tmp_path: Path) -> None:
    _require("lightning", "lightning")
    ranks = _run("frameworks_lightning.py", tmp_path)
    _check_equal_to_ddp(ranks)
    assert {run["steps"] for runs in ranks for run in runs.values()} == {6}


def test_accelerate_loop_matches_ddp(tmp_path: Path) -> None:
    _require("accelerate", "accelerate")
    ranks = _run("frameworks_accelerate.py", tmp_path)
    _check_equal_to_ddp(ranks)
    for runs in ranks:
        for run in runs.values():
            assert run["distributed_type"].endswith("MULTI_CPU") and run["num_processes"] == 2
        # 8 batches accumulated 2 by 2: DDP reduces (and the hook runs) on every second batch
        assert runs["scaledl-ring"]["scaledl_allreduces"] == 4
