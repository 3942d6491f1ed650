"""Models for data-parallel training: MLP, LeNet-5, ResNet, VGG-16, GoogLeNet, AlexNet,
Inception v3 and BERT (the last for the simulator and profiler: it reads token ids).

:func:`build_model` makes one by name; :func:`layer_profile` lists its layers' parameter bytes
and forward FLOPs for the simulator.
"""

from __future__ import annotations

from scaledl.models.profile import LayerProfile, layer_profile, total_flops
from scaledl.models.registry import available_models, build_model

__all__ = ["LayerProfile", "available_models", "build_model", "layer_profile", "total_flops"]
