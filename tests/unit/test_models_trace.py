"""The operation trace: closed forms on a one-layer model, FLOPs that agree with the layer
profile on real models, views that move nothing, and the per-operation roofline."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaledl.models import build_model, layer_profile
from scaledl.models.trace import OpCost, TraceError, operation_costs
from scaledl.sim.compute import RooflineCompute
from scaledl.sim.presets import DEVICES
from scaledl.sim.profile import Layer, ModelProfile


def _owners(model: nn.Module, shape: tuple[int, ...]) -> list[nn.Module]:
    modules = dict(model.named_modules())
    return [modules[p.name] for p in layer_profile(model, shape)]


def test_a_linear_layer_and_its_relu_in_closed_form() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    (ops,) = operation_costs(model, _owners(model, (4,)), (4,))
    addmm, relu = ops  # the transposed weight is a view: not an operation
    assert addmm.name.startswith("aten.addmm") and relu.name.startswith("aten.relu")
    assert addmm.flops == 2 * 4 * 3 and relu.flops == 0
    # per sample: read 4 inputs, write 3 outputs; once: the 3x4 weight and 3 biases (float32)
    assert addmm.bytes_per_sample == 4 * (4 + 3) and addmm.fixed_bytes == 4 * (12 + 3)
    assert relu.bytes_per_sample == 4 * (3 + 3) and relu.fixed_bytes == 0
    assert addmm.output_elements == 3 and relu.output_elements == 3


@pytest.mark.parametrize("name,shape", [("resnet50", (3, 224, 224)), ("bert_base", (128,)),
                                        ("inception_v3", (3, 299, 299))])
def test_traced_flops_are_the_layer_profiles(name: str, shape: tuple[int, ...]) -> None:
    with torch.device("meta"):
        model = build_model(name, shape, 10)
    profile = layer_profile(model, shape)
    costs = operation_costs(model, _owners(model, shape), shape)
    traced = sum(op.flops for ops in costs for op in ops)
    assert traced == pytest.approx(sum(p.forward_flops for p in profile), rel=0.01)
    weights = sum(op.fixed_bytes for ops in costs for op in ops)
    assert weights >= sum(p.parameter_bytes for p in profile)  # every weight is read


def test_operations_without_parameters_belong_to_the_layer_before_them() -> None:
    with torch.device("meta"):
        model = build_model("bert_base", (32,), 2)
    modules = dict(model.named_modules())
    owners = _owners(model, (32,))
    costs = dict(zip((n for n, m in modules.items() if m in owners), operation_costs(
        model, owners, (32,))))
    assert any("softmax" in op.name for op in costs["blocks.0.attention"])
    assert any("gelu" in op.name for op in costs["blocks.0.up"])


def test_three_by_three_stride_one_convolutions_are_winograds() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, stride=2),
                          nn.Conv2d(8, 8, 1))
    costs = operation_costs(model, list(model), (3, 16, 16))
    convolutions = [next(op for op in ops if "convolution" in op.name) for ops in costs]
    assert [op.winograd for op in convolutions] == [True, False, False]


class _BatchDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.fc(x)
        return y * 2 if x.shape[0] > 2 else y


def test_a_model_whose_operations_depend_on_the_batch_cannot_be_traced() -> None:
    model = _BatchDependent()
    with pytest.raises(TraceError, match="--profile"):
        operation_costs(model, [model.fc], (4,))


def test_each_operation_is_the_slower_of_its_flops_and_its_bytes() -> None:
    device = DEVICES["v100"]
    rate = device.peak_tflops * 1e12 * device.compute_efficiency
    bandwidth = device.memory_gbps * 1e9
    gemm = OpCost("aten.mm", 1e9, 1e3, 1e6, 1e7)  # compute-bound, full occupancy
    stream = OpCost("aten.relu", 0.0, 1e6, 0.0, 1e7)  # memory-bound
    profile = ModelProfile("toy", (Layer("a", 1_000_000, 1e9, 1e7, ops=(gemm, stream)),),
                           ((250_000, (0,)),))
    (forward,), (backward,) = RooflineCompute(device).layer_times(profile, 8)
    expected = 8 * 1e9 / rate + 8 * 1e6 / bandwidth + device.launch_s
    assert forward == pytest.approx(expected) and backward == pytest.approx(2 * forward)
    per_sample = [sum(RooflineCompute(device).layer_times(profile, b)[0]) / b
                  for b in (1, 2, 4, 64, 1024)]
    assert all(a >= b for a, b in zip(per_sample, per_sample[1:]))
