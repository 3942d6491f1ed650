"""The trainer with gradient accumulation, max steps, a schedule and clipping on 2 real ranks: an
update of ``grad_accum`` micro-batches equals one of the whole batch, and ``load_model`` gives
back exactly the weights the run ended with."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scaledl.topology import Topology
from scaledl.train.config import build_config
from scaledl.train.trainer import Trainer
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


def _train(rank: int, world_size: int, runs: list[tuple[str, dict[str, object]]]
           ) -> list[dict[str, np.ndarray]]:
    """Train each ``(out, overrides)`` in turn; the final weights of each (as arrays: tensors
    would travel to the parent as shared memory of a process that has ended)."""
    states = []
    for out, overrides in runs:
        config = build_config({}, {"out": out, "epochs": 1, "progress": False,
                                   "checkpoint_seconds": 0.0, **overrides})
        trainer = Trainer(config, Topology.flat(world_size, rank))
        trainer.run()
        states.append({key: value.numpy().copy() for key, value in
                       trainer.parts.strategy.module.state_dict().items()})
    return states


@pytest.mark.timeout(180)
def test_accumulated_micro_batches_equal_the_whole_batch_and_load_model_gives_the_weights(
        tmp_path: Path) -> None:
    import scaledl

    plain = {"momentum": 0.0, "max_steps": 5, "lr_schedule": "cosine", "warmup_epochs": 0.05,
             "clip_grad_norm": 5.0}
    accumulated, whole = str(tmp_path / "accum"), str(tmp_path / "whole")
    runs = [(accumulated, {**plain, "batch_size": 8, "grad_accum": 2}),
            (whole, {**plain, "batch_size": 16})]
    (accum_state, whole_state) = (
        {key: torch.from_numpy(value) for key, value in state.items()}
        for state in run_ranks(2, _train, runs, timeout=150)[0])
    for key, value in whole_state.items():  # the same samples and the same mean gradient
        assert torch.allclose(accum_state[key], value, atol=1e-6), key
    loaded = scaledl.load_model(accumulated).state_dict()
    assert loaded.keys() == accum_state.keys()
    assert all(torch.equal(loaded[key], accum_state[key]) for key in accum_state)
    records = [json.loads(line) for line in (Path(accumulated) / "metrics.jsonl").open()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]  # max_steps, inside the first epoch
    assert records[-2]["kind"] == "eval" and records[-2]["step"] == 5
    # 45 updates an epoch, so 2 of warm-up, then half a cosine over the other 3 of the 5
    assert [r["lr"] for r in steps] == pytest.approx([0.025, 0.0375, 0.05, 0.0375, 0.0125])
