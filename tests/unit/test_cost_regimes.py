"""The shared-memory regimes of the cost model (in the cache or beyond it, a core per rank or
cores time-shared, the direct call path or the planned one), their fit, and ``auto``'s choice in
each regime."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scaledl.calibration import fit
from scaledl.calibration.bench_file import Measurement
from scaledl.calibration.fit import calibrate
from scaledl.collectives.auto import Fabric, choose
from scaledl.collectives.cost import (
    CostModel, LinkCost, host_cores, memory_factor, shm_call_time, shm_terms, stage_time,
)
from scaledl.collectives.registry import plan_numel
from scaledl.collectives.schedule import Collective, Path as StagePath, Stage
from scaledl.topology import Topology

MIB = 1 << 20
TRUTH = CostModel(
    links=(LinkCost(60e-6, 1 / 1.2e9),), overhead=40e-6, shm=LinkCost(3e-6, 1 / 12e9),
    shm_memory_beta=1 / 4e9, cache_bytes=32 * MIB, shm_timeshared_alpha=400e-6,
    call_overhead=60e-6, direct_call_overhead=6e-6, timeshared_call_overhead=2e-3,
)
"""A machine to recover: copies 3x slower beyond a 32 MiB cache, waits 130x dearer when
ranks share cores, the planned call ten times the direct one."""
SIZES = (4096, 65536, MIB, 4 * MIB, 16 * MIB, 64 * MIB)


def _stage(collective: Collective, members: int, nbytes: int) -> Stage:
    return Stage(collective, tuple(range(members)), 0, nbytes // 4, StagePath.SHM)


def test_bytes_beyond_the_cache_move_at_memory_speed() -> None:
    inside = shm_terms(_stage(Collective.BROADCAST, 2, 16 * MIB), 4, TRUTH)
    assert inside.memory_bytes == 0 and inside.cached_bytes == 16 * MIB
    beyond = shm_terms(_stage(Collective.BROADCAST, 2, 64 * MIB), 4, TRUTH)
    assert beyond.cached_bytes == pytest.approx(64 * MIB / 4)  # 32 MiB of 128 fit
    assert beyond.memory_bytes == pytest.approx(64 * MIB * 3 / 4)
    pieces = 16
    want = pieces * 3e-6 + 16 * MIB / 12e9 + 48 * MIB / 4e9
    assert stage_time(_stage(Collective.BROADCAST, 2, 64 * MIB), 4, TRUTH) == pytest.approx(want)


def test_a_streamed_allreduce_prices_its_small_last_piece_as_summed_whole() -> None:
    """Two 2 MiB pieces split into parts, then a last 1 MiB summed whole by every rank (two
    waits, one copy, every peer's bytes added), as shm_ops runs them; a last piece larger than
    half a piece is split like the others."""
    members, gamma = 4, TRUTH.gamma
    small_tail = shm_terms(_stage(Collective.ALLREDUCE, members, 5 * MIB), 4, TRUTH)
    assert small_tail.waits == 3 * 2 + 2
    assert small_tail.cached_bytes + small_tail.memory_bytes == pytest.approx(2 * 4 * MIB + MIB)
    assert small_tail.adds == pytest.approx((3 / 4 * 4 * MIB + 3 * MIB) * gamma)
    large_tail = shm_terms(_stage(Collective.ALLREDUCE, members, 5 * MIB + MIB // 2), 4, TRUTH)
    assert large_tail.waits == 3 * 3
    assert large_tail.cached_bytes + large_tail.memory_bytes == pytest.approx(2 * 5.5 * MIB)


def test_ranks_beyond_the_cores_pay_the_timeshared_wait_and_stretch_their_work() -> None:
    model = replace(TRUTH, host_cores=2)
    own = shm_terms(_stage(Collective.ALLREDUCE, 2, 4096), 4, model)
    shared = shm_terms(_stage(Collective.ALLREDUCE, 4, 4096), 4, model)
    assert not own.timeshared and own.contention == 1
    assert shared.timeshared and shared.contention == 2
    work = 4096 / 12e9 + 3 * 4096 * model.gamma  # one copy in, three peers added
    assert shared.seconds(model) == pytest.approx(2 * 400e-6 + 2 * work)
    assert own.seconds(model) == pytest.approx(2 * 3e-6 + 4096 / 12e9 + 4096 * model.gamma)
    # unknown cores (the simulator's hosts): never time-shared
    assert not shm_terms(_stage(Collective.ALLREDUCE, 64, 4096), 4, TRUTH).timeshared


def test_an_allreduce_call_takes_the_direct_path_and_the_others_the_planned_one() -> None:
    assert shm_call_time(Collective.ALLREDUCE, 2, TRUTH) == 6e-6
    for collective in (Collective.BROADCAST, Collective.REDUCE_SCATTER, Collective.ALLGATHER):
        assert shm_call_time(collective, 2, TRUTH) == 60e-6
    # four ranks on two cores: stretched twice, and the planned call's time-shared extra
    assert shm_call_time(Collective.BROADCAST, 4, replace(TRUTH, host_cores=2)) == \
        pytest.approx(120e-6 + 2e-3)
    assert shm_call_time(Collective.ALLREDUCE, 4, replace(TRUTH, host_cores=2)) == 12e-6


def test_load_takes_this_machines_cores_and_old_files_keep_the_new_defaults(
        tmp_path: Path) -> None:
    old = json.loads(CostModel().to_json())
    for name in ("shm_memory_beta", "cache_bytes", "shm_timeshared_alpha",
                 "call_overhead", "direct_call_overhead"):
        del old[name]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(old))
    model = CostModel.load(path)
    assert model.host_cores == host_cores() >= 1
    assert replace(model, host_cores=0) == CostModel()


def _shm_times(model: CostModel, world_size: int) -> list[Measurement]:
    """Whole-group shm calls as ``model`` prices them (what ``choose`` predicts)."""
    out = []
    topology = Topology.flat(world_size)
    fabric = Fabric((0,) * world_size)
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
        for nbytes in SIZES:
            numel = plan_numel(collective, nbytes, world_size, 4)
            seconds = choose(Collective(collective), topology, numel, 4, model,
                             include_native=False, fabric=fabric).predictions["shm"]
            out.append(Measurement(collective, "shm", nbytes, world_size, (seconds,)))
    return out


def _ring_times(model: CostModel, world_size: int) -> list[Measurement]:
    topology = Topology.flat(world_size)
    out = []
    for nbytes in (4096, MIB):
        seconds = choose(Collective.ALLREDUCE, topology, nbytes // 4, 4, model,
                         include_native=False).predictions["ring"]
        out.append(Measurement("allreduce", "ring", nbytes, world_size, (seconds,)))
    return out


def test_the_fit_recovers_every_regime_of_a_core_per_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit, "last_level_cache", lambda: 32 * MIB)
    truth = replace(TRUTH, host_cores=2)
    measured = _ring_times(truth, 2) + _shm_times(truth, 2)
    prior = replace(CostModel(overhead=40e-6), host_cores=2, cache_bytes=8 * MIB)
    model, summary = calibrate(measured, Topology.flat(2), 4, prior, MIB)
    assert model.cache_bytes == 32 * MIB  # read from the machine
    for field, want in (("direct_call_overhead", 6e-6), ("call_overhead", 60e-6),
                        ("shm_memory_beta", 1 / 4e9)):
        assert getattr(model, field) == pytest.approx(want, rel=1e-3), field
    assert model.shm.alpha == pytest.approx(3e-6, rel=1e-3)
    assert model.shm.beta == pytest.approx(1 / 12e9, rel=1e-3)
    shm = summary["shm"]
    assert isinstance(shm, dict) and shm["rms_relative_error"] < 1e-6
    assert shm["kept_from_prior"] == []


def test_a_fit_without_sizes_beyond_the_cache_keeps_the_memory_speed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit, "last_level_cache", lambda: 32 * MIB)
    truth = replace(TRUTH, host_cores=2)
    small = [m for m in _shm_times(truth, 2) if m.nbytes <= 4 * MIB]
    prior = replace(CostModel(overhead=40e-6), host_cores=2, shm_memory_beta=1e-9)
    model, summary = calibrate(_ring_times(truth, 2) + small, Topology.flat(2), 4, prior, MIB)
    assert model.shm_memory_beta == 1e-9
    assert summary["shm"]["kept_from_prior"] == ["shm_memory_beta"]  # type: ignore[index]
    assert model.shm.beta == pytest.approx(1 / 12e9, rel=1e-3)


def test_a_run_on_shared_cores_fits_the_timeshared_wait_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fit, "last_level_cache", lambda: 32 * MIB)
    truth = replace(TRUTH, host_cores=2)
    prior = replace(truth, shm_timeshared_alpha=1e-6, timeshared_call_overhead=0.0)
    measured = _ring_times(replace(truth, links=(LinkCost(1e-3, 1e-9),)), 4) + _shm_times(truth, 4)
    model, summary = calibrate(measured, Topology.flat(4), 4, prior, MIB)
    assert model.shm_timeshared_alpha == pytest.approx(400e-6, rel=1e-6)
    assert model.timeshared_call_overhead == pytest.approx(2e-3, rel=1e-6)
    assert model.shm == truth.shm and model.call_overhead == truth.call_overhead
    assert model.links == truth.links and model.native_overhead == truth.native_overhead
    assert summary["shm"]["ranks_per_core"] == 2  # type: ignore[index]
    assert "kept from the earlier calibration" in fit.describe(summary)


def _choice(model: CostModel, collective: Collective, world_size: int, nbytes: int) -> str:
    numel = plan_numel(collective.value, nbytes, world_size, 4)
    return choose(collective, Topology.flat(world_size), numel, 4, model,
                  fabric=Fabric((0,) * world_size, native_stages=True)).algorithm


@pytest.mark.parametrize("collective", [Collective.ALLREDUCE, Collective.REDUCE_SCATTER,
                                        Collective.ALLGATHER, Collective.BROADCAST])
def test_auto_takes_shared_memory_at_every_size_while_ranks_have_a_core(
        collective: Collective) -> None:
    model = replace(TRUTH, host_cores=2)
    for nbytes in (4096, MIB, 64 * MIB):
        assert _choice(model, collective, 2, nbytes) == "shm", nbytes


def test_point_to_point_rounds_stretch_by_ranks_per_core() -> None:
    """Over loopback a round is CPU work: four ranks on two cores take twice as long."""
    topology = Topology.flat(4)
    own = choose(Collective.ALLREDUCE, topology, 1 << 18, 4, replace(TRUTH, host_cores=4),
                 fabric=Fabric((0,) * 4)).predictions
    shared = choose(Collective.ALLREDUCE, topology, 1 << 18, 4, replace(TRUTH, host_cores=2),
                    fabric=Fabric((0,) * 4)).predictions
    for name in ("ring", "halving_doubling", "tree", "native"):
        assert shared[name] == pytest.approx(2 * own[name], rel=1e-9), name
    hosts = Fabric((0, 0, 1, 1))  # two ranks on each of two hosts with two cores: no sharing
    assert choose(Collective.ALLREDUCE, topology, 1 << 18, 4, replace(TRUTH, host_cores=2),
                  fabric=hosts).predictions["ring"] == pytest.approx(own["ring"], rel=1e-9)


def test_auto_leaves_shared_memory_for_small_messages_when_cores_are_timeshared() -> None:
    """Four ranks on two cores: a wait that must first get a core costs more than Gloo's
    rounds for a small message, not for a large one."""
    model = replace(TRUTH, host_cores=2, shm_timeshared_alpha=2e-3)
    small = _choice(model, Collective.BROADCAST, 4, 4096)
    assert small != "shm" and small in ("tree", "chain", "native")
    assert _choice(model, Collective.BROADCAST, 4, 64 * MIB) == "shm"
    assert _choice(replace(model, host_cores=4), Collective.BROADCAST, 4, 4096) == "shm"


def test_the_planned_calls_fixed_cost_weighs_on_small_messages_only_off_the_direct_path() -> None:
    model = replace(TRUTH, host_cores=2, call_overhead=5e-3)
    assert _choice(model, Collective.ALLREDUCE, 2, 4096) == "shm"  # the direct path
    assert _choice(model, Collective.BROADCAST, 2, 4096) != "shm"
    assert _choice(model, Collective.BROADCAST, 2, 64 * MIB) == "shm"



def test_every_field_travels_in_the_vector_a_communicator_shares() -> None:
    """Ranks agree on rank 0's model through :meth:`CostModel.to_vector`; a field left out of
    it (or read back into the wrong field) would make ranks price shared memory differently."""
    model = replace(TRUTH, host_cores=3, links=(LinkCost(1e-6, 2e-9), LinkCost(3e-6, 4e-9)),
                    native_reduce_scatter_allreduce=False, shm_window=1 << 16)
    assert CostModel.from_vector(model.to_vector() + [0.0] * 7) == model


def test_loopback_bytes_beyond_the_cache_slow_as_shared_memorys_do() -> None:
    """A 64 MiB ring on two ranks of one host: 128 MiB on the host, a quarter of it in the
    32 MiB cache, the rest at memory's speed (3x slower in TRUTH); unknown hosts: no change."""
    known = replace(TRUTH, host_cores=2)
    assert memory_factor(known, 128 * MIB) == pytest.approx(0.25 + 0.75 * 3)
    assert memory_factor(known, 32 * MIB) == 1.0 and memory_factor(TRUTH, 128 * MIB) == 1.0
    known = replace(known, gamma=0.0)  # no reduction hidden under the wire: time is linear
    free_bytes = replace(known, links=(LinkCost(60e-6, 0.0),))
    fabric = Fabric((0, 0))

    def ring(model: CostModel) -> float:
        return choose(Collective.ALLREDUCE, Topology.flat(2), 16 * MIB, 4, model,
                      fabric=fabric).predictions["ring"]

    slowed = ring(known) - ring(free_bytes)
    plain = ring(replace(known, cache_bytes=1 << 40)) - ring(free_bytes)
    assert slowed == pytest.approx(plain * memory_factor(known, 128 * MIB), rel=1e-6)


def test_a_calibration_file_never_carries_the_writers_cores() -> None:
    written = replace(TRUTH, host_cores=64).to_json()
    assert "host_cores" not in written
    assert CostModel.from_json(written).host_cores == 0
