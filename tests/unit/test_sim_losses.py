"""Each loss term of the simulator against a closed form on a tiny case (one or two layers, two
ranks), the host CPU term of the replay, and the device roofline's monotone efficiency."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import CollectiveSimulator, compile_collective
from scaledl.sim.compute import FlopsCompute, RooflineCompute, efficiency
from scaledl.sim.fastreplay import cost, makespan
from scaledl.sim.iteration import simulate_iteration
from scaledl.sim.scenario import resolve
from scaledl.sim.job import Job
from scaledl.sim.losses import Cycle, Losses, Stack, advance, expected_max_normal
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.presets import DEVICES
from scaledl.sim.profile import Layer, ModelProfile, profile_model
from scaledl.topology import Topology

NET = Network("two", LinkClass.from_bandwidth("in", 1e-5, 1.0),
              LinkClass.from_bandwidth("out", 1e-5, 1.0), overhead=2e-6)
TWO = Topology((2,), explicit=True)
FREE = Network("free", LinkClass("a", 0, 0), LinkClass("b", 0, 0), rack_latency=0)


def _layers(*numels: int) -> ModelProfile:
    """Layers of ``numels`` parameters, one bucket per layer (launched last layer first)."""
    layers = tuple(Layer(f"l{i}", 4 * n, 1e6, 100, tensors=2) for i, n in enumerate(numels))
    buckets = tuple((n, (i,)) for i, n in reversed(list(enumerate(numels))))
    return ModelProfile("tiny", layers, buckets)


def _stack(call: float = 0.0, tensor: float = 0.0, cycle: Cycle | None = None) -> Stack:
    return Stack("test", call, tensor, cycle)


def test_expected_maximum_of_normals_matches_closed_forms() -> None:
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    values = [expected_max_normal(n) for n in (2, 4, 16, 256, 1024)]
    assert values == sorted(values) and values[-1] < math.sqrt(2 * math.log(1024))


def test_stragglers_one_layer_two_ranks() -> None:
    profile, cv = _layers(1000), 0.1
    sim = CollectiveSimulator(TWO, FREE)
    times = ([0.01], [0.02])
    result = simulate_iteration(profile, sim, 8, times=times, update_s=0.001,
                                losses=Losses(jitter_cv=cv))
    assert result.iteration_s == pytest.approx(0.03 * (1 + cv / math.sqrt(math.pi)) + 0.001)
    assert result.straggler_s == pytest.approx(0.03 * cv / math.sqrt(math.pi))
    one = CollectiveSimulator(Topology((1,), explicit=True), FREE)
    single = simulate_iteration(profile, one, 8, times=times, update_s=0.001,
                                losses=Losses(jitter_cv=cv))
    assert single.efficiency == 1.0  # one rank waits for nobody


def test_call_and_tensor_overheads_one_layer_two_ranks() -> None:
    profile = _layers(50_000)
    sim = CollectiveSimulator(TWO, NET)
    collective = sim.time("ring", Collective.ALLREDUCE, 50_000)
    losses = Losses(stack=_stack(call=7e-5, tensor=3e-6))
    result = simulate_iteration(profile, sim, 8, times=([0.01], [0.02]), losses=losses)
    # backward + 2 tensors' software, then the one bucket's allreduce + the call's overhead
    assert result.iteration_s == pytest.approx(0.03 + 2 * 3e-6 + collective + 7e-5, rel=1e-12)
    assert result.software_s == pytest.approx(6e-6)


def test_interference_two_layers_two_ranks() -> None:
    profile, kappa = _layers(10, 200_000), 0.5
    sim = CollectiveSimulator(TWO, NET)
    comm = sim.time("ring", Collective.ALLREDUCE, 200_000)  # layer 1's bucket, ~1.6 ms
    last = sim.time("ring", Collective.ALLREDUCE, 10)
    forward, backward = [0.001, 0.001], [0.002, 0.001]  # layer 1's backward runs first
    got = simulate_iteration(profile, sim, 8, times=(forward, backward),
                             losses=Losses(interference=kappa))
    start = 0.002 + 0.001  # forward, then layer 1's backward: its allreduce starts
    # layer 0's backward (2 ms of work) runs at 1/(1+kappa) while the allreduce runs
    done_slow = comm / (1 + kappa)
    compute_end = start + comm + (0.002 - done_slow) if done_slow < 0.002 else \
        start + 0.002 * (1 + kappa)
    assert got.iteration_s == pytest.approx(max(compute_end, start + comm) + last, rel=1e-12)
    assert got.interference_s == pytest.approx(compute_end - 0.005, rel=1e-9)


def test_advance_integrates_slow_intervals() -> None:
    assert advance(0.0, 1.0, [(0.5, 1.0)], 1.0) == pytest.approx(1.25)
    assert advance(0.0, 1.0, [], 1.0) == 1.0
    assert advance(2.0, 1.0, [(0.0, 1.0)], 3.0) == 3.0  # an interval in the past: no effect
    assert advance(0.0, 0.2, [(0.0, 1.0)], 1.0) == pytest.approx(0.4)


def test_horovod_cycle_one_layer_two_ranks() -> None:
    profile, cycle = _layers(1000), Cycle(5e-3, 64 << 20)
    sim = CollectiveSimulator(TWO, NET)
    result = simulate_iteration(profile, sim, 8, times=([0.0031], [0.0062]),
                                losses=Losses(stack=_stack(cycle=cycle)))
    tick = 0.010  # backward ends at 9.3 ms: the next wake-up of a 5 ms loop
    negotiation = 2 * 1 * (NET.inter.alpha + NET.overhead)  # ceil(log2 2) = 1 round each way
    expected = tick + negotiation + sim.time("ring", Collective.ALLREDUCE, 1000)
    assert result.iteration_s == pytest.approx(expected, rel=1e-12)


def test_host_cpu_cost_of_a_two_rank_ring() -> None:
    n = 1 << 20
    cpu = replace(FREE, cpu_beta=1e-9, cpu_contention=2.0)
    compiled = compile_collective("ring", Collective.ALLREDUCE, TWO, n // 4)
    got = makespan(compiled, cost(compiled, TWO, cpu))
    # two rounds, each sending and receiving n/2 bytes on every rank, twice as slow when shared
    assert got == pytest.approx(2 * (n / 2 + n / 2) * 1e-9 * 2.0, rel=1e-12)
    assert makespan(compiled, cost(compiled, TWO, FREE)) == 0.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**7), st.floats(1e3, 1e10), st.integers(1, 10**6),
                          st.booleans(), st.booleans()), min_size=1, max_size=5),
       st.sampled_from(list(DEVICES)), st.floats(0.05, 1.0), st.booleans(), st.booleans())
def test_roofline_efficiency_never_above_one_and_never_falls_with_batch(
        spec: list[tuple[int, float, int, bool, bool]], name: str, peak_fraction: float,
        channels_last: bool, mixed: bool) -> None:
    layers = tuple(Layer(f"l{i}", w, f, o, winograd=wino, convolution=conv)
                   for i, (w, f, o, wino, conv) in enumerate(spec))
    profile = ModelProfile("random", layers, ((1, (0,)),))
    device = replace(DEVICES[name], compute_efficiency=peak_fraction)
    mixed = mixed and device.mixed_tflops > 0
    if mixed:
        device = replace(device, tensor_efficiency=peak_fraction)
    model = RooflineCompute(device, channels_last, mixed)
    values = [efficiency(model, profile, b, device) for b in (1, 2, 7, 32, 256, 4096)]
    assert all(0 < v <= peak_fraction * 2.25 + 1e-12 for v in values)  # Winograd saves 2.25x
    assert all(a <= b * (1 + 1e-12) for a, b in zip(values, values[1:]))


def test_ideal_rule_keeps_a_constant_efficiency() -> None:
    profile = profile_model("lenet")
    device = DEVICES["p100"]
    model = FlopsCompute(device.flops)
    assert efficiency(model, profile, 1, device) == pytest.approx(device.efficiency)
    assert efficiency(model, profile, 512, device) == pytest.approx(device.efficiency)


@pytest.mark.parametrize("name,model,rates", [
    ("p100", "resnet50", {32: 195.0, 64: 219.0}),  # TensorFlow benchmarks, DGX-1
    ("k80", "resnet50", {32: 49.5, 64: 51.9}),  # TensorFlow benchmarks, GCE
    ("v100", "resnet50", {32: 329.0}),  # PyTorch DDP benchmark, no DDP
])
def test_device_presets_reproduce_their_published_single_gpu_rates(
        name: str, model: str, rates: dict[int, float]) -> None:
    device, profile = DEVICES[name], profile_model(model)
    update = 5 * profile.parameter_bytes / (device.memory_gbps * 1e9)
    for batch, published in rates.items():
        forward, backward = RooflineCompute(device).layer_times(profile, batch)
        assert batch / (sum(forward) + sum(backward) + update) == pytest.approx(published,
                                                                              rel=0.01)


def test_an_input_pipeline_slower_than_the_gpus_sets_the_iteration() -> None:
    job = Job(model="resnet50", device="a100", intra="nvlink3", gpus=8, topology="8",
              batch=256, compute_time=0.1)
    free = resolve(job).run()
    rate = 8 * 256 / (2 * free.iteration_s)  # the host feeds 8 GPUs in twice an iteration
    fed = resolve(replace(job, input_rate=rate)).run()
    assert fed.iteration_s == pytest.approx(2 * free.iteration_s)
    assert fed.input_s == pytest.approx(free.iteration_s)
    assert fed.single_gpu_s == pytest.approx(free.single_gpu_s)  # one GPU needs 1/8 of it
    assert fed.efficiency == pytest.approx(free.efficiency / 2)
    waiting = free.communication_share * free.iteration_s
    assert fed.communication_share * fed.iteration_s == pytest.approx(waiting)
    one = resolve(replace(job, gpus=1, topology="1", input_rate=256 / 0.2)).run()
    assert one.iteration_s == pytest.approx(0.2) and one.efficiency == pytest.approx(1.0)


def test_a_fast_input_pipeline_or_the_ideal_model_changes_nothing() -> None:
    job = Job(model="resnet50", gpus=8, topology="4x2", batch=32)
    free = resolve(job).run()
    assert resolve(replace(job, input_rate=1e9)).run() == free
    with pytest.raises(ValueError, match="^input_rate 1.0 does not apply to lossless:"):
        # the ideal model has no pipeline
        resolve(replace(job, lossless=True, input_rate=1.0)).run()
    with pytest.raises(ValueError, match="^input_rate -3.0 "):
        resolve(replace(job, input_rate=-3.0)).run()
