"""Models: every registry entry builds and runs, parameters match the papers, profiles add up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from scaledl.models import available_models, build_model, layer_profile, total_flops
from scaledl.models.profile import example_input
from scaledl.models.resnet import resnext101

SMALL_INPUTS: dict[str, tuple[int, ...]] = {
    "mlp": (1, 8, 8),
    "lenet": (1, 28, 28),
    "resnet20": (3, 32, 32),
    "resnet56": (1, 8, 8),
    "resnet50": (3, 32, 32),
    "resnet101": (3, 32, 32),
    "resnext101_32x4d": (3, 32, 32),
    "se_resnext101_32x4d": (3, 32, 32),
    "nvidia_se_resnext101_32x4d": (3, 32, 32),
    "vgg16": (3, 32, 32),
    "googlenet": (3, 32, 32),
    "alexnet": (3, 64, 64),
    "inception_v3": (3, 75, 75),
    "efficientnet_b0": (3, 32, 32),
    "efficientnet_b4": (3, 32, 32),
    "bert_base": (16,),
    "bert_large": (8,),
    "gpt2": (16,),
    "gpt2_medium": (8,),
    "gpt2_large": (8,),
    "gpt2_xl": (8,),
    "megatron_gpt_1536x16": (8,),
}
"""The smallest input each model is run on (ImageNet models at reduced resolution)."""

PUBLISHED_PARAMETERS: dict[str, tuple[tuple[int, ...], int, float]] = {
    "resnet20": ((3, 32, 32), 10, 0.27e6),
    "resnet56": ((3, 32, 32), 10, 0.85e6),
    "resnet50": ((3, 224, 224), 1000, 25.6e6),
    "resnet101": ((3, 224, 224), 1000, 44.5e6),
    "resnext101_32x4d": ((3, 224, 224), 1000, 44.2e6),
    "vgg16": ((3, 224, 224), 1000, 138e6),
    "alexnet": ((3, 224, 224), 1000, 61e6),
    "googlenet": ((3, 224, 224), 1000, 7.0e6),
    "inception_v3": ((3, 299, 299), 1000, 23.8e6),
    "efficientnet_b0": ((3, 224, 224), 1000, 5.3e6),
    "efficientnet_b4": ((3, 380, 380), 1000, 19e6),
}
"""Input, classes and parameter count as the papers give them.  GoogLeNet: the paper's table 1
sums to about 6.8M; with batch norm and true 5x5 convolutions it is 7.0M (torchvision's 6.6M
uses 3x3 where the paper has 5x5).  Inception v3: 23.8M without the auxiliary classifier.
ResNeXt-101 32x4d: Xie et al., CVPR 2017 (44.2M, ResNet-101's count within 1%).  EfficientNet:
Tan and Le, ICML 2019, table 2 (B0 5.3M, B4 19M)."""


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registry_names() -> None:
    assert available_models() == list(SMALL_INPUTS)
    with pytest.raises(ValueError, match="unknown model 'resnet18'; available: mlp, lenet"):
        build_model("resnet18", (3, 32, 32), 10)


SHAPES_ONLY = frozenset({"gpt2_medium", "gpt2_large", "gpt2_xl", "megatron_gpt_1536x16"})
"""Too large to run on this machine's CPU in a unit test: run on the meta device (shapes)."""


@pytest.mark.parametrize("name", list(SMALL_INPUTS))
def test_builds_runs_forward_and_backward(name: str) -> None:
    shape = SMALL_INPUTS[name]
    torch.manual_seed(0)
    device = torch.device("meta" if name in SHAPES_ONLY else "cpu")
    with device:
        model = build_model(name, shape, 7)
    batch = example_input(model, 2, shape, torch.Generator().manual_seed(0)).to(device)
    output = model(batch)
    per_token = getattr(model, "token_outputs", False)
    assert output.shape == ((2, *shape, 7) if per_token else (2, 7))
    if device.type == "cpu":
        assert torch.isfinite(output).all()
    output.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8), (3, 32, 32)])
def test_lenet_adapts_to_the_input(shape: tuple[int, ...]) -> None:
    model = build_model("lenet", shape, 10)
    assert model(torch.randn(3, *shape)).shape == (3, 10)


def test_lenet_is_the_classic_network_at_28_and_32() -> None:
    # 61,706 parameters for MNIST (1x28x28 padded like 32x32); 16x5x5 into the first FC layer.
    assert _count(build_model("lenet", (1, 28, 28), 10)) == 61_706
    assert _count(build_model("lenet", (1, 32, 32), 10)) == 61_706


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMETERS))
def test_parameter_counts_match_the_papers(name: str) -> None:
    shape, classes, published = PUBLISHED_PARAMETERS[name]
    with torch.device("meta"):
        model = build_model(name, shape, classes)
    assert abs(_count(model) - published) / published < 0.02, _count(model)


def test_exact_counts_of_well_known_models() -> None:
    expected = {"resnet50": 25_557_032, "vgg16": 138_357_544, "alexnet": 60_965_224,
                "resnext101_32x4d": 44_177_704, "efficientnet_b0": 5_288_548}
    for name, count in expected.items():
        with torch.device("meta"):
            assert _count(build_model(name, (3, 224, 224), 1000)) == count
    assert _count(build_model("resnet20", (3, 32, 32), 10)) == 269_722
    with torch.device("meta"):  # torchvision's 27,161,264 less its auxiliary head's 3,326,696
        assert _count(build_model("inception_v3", (3, 299, 299), 1000)) == 23_834_568
    assert _count(build_model("mlp", (1, 28, 28), 10)) == 784 * 256 + 256 + 256 * 10 + 10


def test_initialisation_is_deterministic_given_the_seed() -> None:
    states = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        states.append(build_model("resnet20", (3, 32, 32), 10).state_dict())
    assert all(torch.equal(states[0][key], states[1][key]) for key in states[0])
    assert not all(torch.equal(states[0][key], states[2][key]) for key in states[0])


@pytest.mark.parametrize("name", list(SMALL_INPUTS))
def test_layer_profile_sums_to_the_parameter_count(name: str) -> None:
    shape = SMALL_INPUTS[name]
    with torch.device("meta"):
        model = build_model(name, shape, 10)
    profiles = layer_profile(model, shape)
    assert sum(p.parameters for p in profiles) == _count(model)
    assert sum(p.parameter_bytes for p in profiles) == 4 * _count(model)
    assert all(p.forward_flops > 0 and p.output_shape for p in profiles)


def test_layer_profile_flops_follow_the_formulas() -> None:
    model = nn.Sequential(
        nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.BatchNorm2d(6), nn.Flatten(),
        nn.Linear(6 * 5 * 5, 3),
    )
    model.train()
    weights = [p.clone() for p in model.parameters()]
    profiles = layer_profile(model, (4, 5, 5))
    assert [p.kind for p in profiles] == ["Conv2d", "BatchNorm2d", "Linear"]
    assert [p.name for p in profiles] == ["0", "1", "3"]
    assert profiles[0].forward_flops == 2 * 4 * 6 * 3 * 3 * 5 * 5 // 2
    assert profiles[1].forward_flops == 2 * 6 * 5 * 5
    assert profiles[2].forward_flops == 2 * 150 * 3
    assert profiles[0].output_shape == (6, 5, 5)
    assert model.training and all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_profile_flops_of_resnet50_match_the_published_4_1_gmacs() -> None:
    with torch.device("meta"):
        model = build_model("resnet50", (3, 224, 224), 1000)
    assert total_flops(layer_profile(model, (3, 224, 224))) == pytest.approx(2 * 4.1e9, rel=0.02)


def test_inception_v3_at_299_matches_its_published_5_7_gmacs_and_8x8_grid() -> None:
    with torch.device("meta"):
        model = build_model("inception_v3", (3, 299, 299), 1000)
    assert total_flops(layer_profile(model, (3, 299, 299))) == pytest.approx(2 * 5.7e9, rel=0.02)
    features = model.features(torch.empty(1, 3, 299, 299, device="meta"))
    assert tuple(features.shape) == (1, 2048, 8, 8)


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("lenet", (64,), "lenet needs an image input"),
        ("alexnet", (3, 32, 32), "alexnet needs images of at least 64x64, got 32x32"),
        ("vgg16", (3, 16, 16), "at least 32x32"),
        ("inception_v3", (3, 64, 64), "inception_v3 needs images of at least 75x75, got 64x64"),
    ],
)
def test_bad_input_shapes(name: str, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(name, shape, 10)
    with pytest.raises(ValueError, match="num_classes 0"):
        build_model("mlp", (4,), 0)


@pytest.mark.parametrize(("name", "width"), [("se_resnext101_32x4d", lambda c: c // 16),
                                           ("nvidia_se_resnext101_32x4d", lambda c: 16)])
def test_se_resnext_adds_a_gate_to_every_block(name: str, width: Callable[[int], int]) -> None:
    # Each block's C output channels squeezed to w and back, with biases: 2 C w + w + C
    # parameters per block, over ResNet-101's 3, 4, 23, 3 blocks of 256, 512, 1024 and 2048
    # channels; w = C / 16 in the paper (and NVIDIA's TensorFlow recipe), 16 in NVIDIA's PyTorch
    # recipe.
    blocks = {256: 3, 512: 4, 1024: 23, 2048: 3}
    gates = sum(n * (2 * c * width(c) + width(c) + c) for c, n in blocks.items())
    with torch.device("meta"):
        plain = _count(build_model("resnext101_32x4d", (3, 224, 224), 1000))
        gated = _count(build_model(name, (3, 224, 224), 1000))
    assert gated - plain == gates


def test_se_resnext_gates_are_one_kind_or_none() -> None:
    with pytest.raises(ValueError, match="at most one of them set"):
        resnext101((3, 224, 224), 1000, squeeze=16, squeeze_ratio=16)
    with pytest.raises(ValueError, match="squeeze -1"):
        resnext101((3, 224, 224), 1000, squeeze=-1)


def test_resnext_splits_the_3x3_convolution_into_32_groups() -> None:
    with torch.device("meta"):
        model = build_model("resnext101_32x4d", (3, 224, 224), 1000)
    grouped = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert len(grouped) == 33
    assert {m.groups for m in grouped} == {32}
    assert [m.in_channels for m in grouped[:1] + grouped[-1:]] == [128, 1024]


@pytest.mark.parametrize(("name", "side", "blocks", "exact"), [
    ("efficientnet_b0", 224, 16, 5_288_548), ("efficientnet_b4", 380, 32, 19_341_616)])
def test_efficientnet_has_one_depthwise_convolution_per_block(
        name: str, side: int, blocks: int, exact: int) -> None:
    # B0's stages have 1, 2, 2, 3, 3, 4, 1 blocks; B4 multiplies each by 1.8, rounded up (2, 4,
    # 4, 6, 6, 8, 2), and its widths by 1.4 to a multiple of 8.
    with torch.device("meta"):
        model = build_model(name, (3, side, side), 1000)
    depthwise = [m for m in model.modules()
                 if isinstance(m, nn.Conv2d) and m.groups == m.in_channels > 1]
    assert len(depthwise) == blocks
    assert _count(model) == exact


def test_efficientnet_refuses_a_variant_it_does_not_have() -> None:
    from scaledl.models.efficientnet import efficientnet

    with pytest.raises(ValueError, match="variant 'b7' must be one of"):
        efficientnet("b7", (3, 224, 224), 1000)
