"""``--cycle-ms`` and ``--fusion-mb``: Horovod's negotiation cycle and fusion buffer as its user
set them (``HOROVOD_CYCLE_TIME``, ``HOROVOD_FUSION_THRESHOLD``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.sim.scenario import job_losses, resolve
from scaledl.sim.job import Job
from scaledl.sim.losses import stack


def _horovod(cycle_ms: float | None, fusion_mb: float | None = None) -> Job:
    return Job(model="resnet50", gpus=8, topology="4x2", device="v100", network="25gbe-roce",
               intra="nvlink2", stack="horovod", cycle_ms=cycle_ms, fusion_mb=fusion_mb)


def test_the_cycle_replaces_the_stacks_and_keeps_its_fusion_buffer() -> None:
    preset = stack("horovod").cycle
    assert preset is not None
    cycle = job_losses(_horovod(0.1)).cycle
    assert cycle is not None
    assert cycle.cycle_s == pytest.approx(1e-4) and cycle.fusion_bytes == preset.fusion_bytes
    assert job_losses(_horovod(None)).cycle == preset
    assert _horovod(0.1).stack_name() == "horovod"
    assert Job(device="cpu").stack_name() == "scaledl" and Job().stack_name() == "nccl"


def test_a_longer_cycle_never_makes_a_step_faster() -> None:
    steps = [resolve(_horovod(ms)).run().iteration_s for ms in (0.0, 0.1, 5.0, 50.0)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_a_stack_without_a_cycle_refuses_one() -> None:
    with pytest.raises(ValueError, match="stack 'nccl' has none"):
        Job(cycle_ms=1.0).check()


def test_the_fusion_buffer_replaces_the_stacks_and_keeps_its_cycle() -> None:
    preset = stack("horovod").cycle
    assert preset is not None
    cycle = job_losses(_horovod(None, 8.0)).cycle
    assert cycle is not None
    assert cycle.fusion_bytes == 8 << 20 and cycle.cycle_s == preset.cycle_s
    both = job_losses(_horovod(1.0, 0.5)).cycle
    assert both is not None and (both.cycle_s, both.fusion_bytes) == (1e-3, 1 << 19)


def test_smaller_fusion_buffers_make_more_calls() -> None:
    """ResNet-50's 98 MiB of gradients: buffers of 1 MiB need many more fused allreduces, each
    paying its call and its latency, than 64 MiB ones, so the ring is busy longer."""
    small, large = resolve(_horovod(None, 1.0)).run(), resolve(_horovod(None, 64.0)).run()
    assert small.communication_s > large.communication_s


def test_horovod_from_0_21_is_the_older_stack_at_its_new_defaults() -> None:
    """Horovod 0.21 lowered the default cycle to 1 ms and raised the fusion buffer to 128 MiB
    (horovod/horovod#2468); nothing else about its stack changed."""
    newer = replace(_horovod(None), stack="horovod-0.21")
    assert resolve(newer).run() == resolve(_horovod(1.0, 128.0)).run()
    assert resolve(newer).run() != resolve(_horovod(None)).run()
    old, new = stack("horovod"), stack("horovod-0.21")
    assert (old.call_overhead_s, old.tensor_overhead_s) == (new.call_overhead_s,
                                                            new.tensor_overhead_s)
