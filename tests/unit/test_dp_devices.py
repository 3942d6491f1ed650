"""DataParallel's ``device_ids`` and ``output_device``, DDP's rule checked at wrap time.

CI has no GPU, so the rule is given the devices a model's tensors would be on (it looks at
nothing else); the CUDA run is ``benchmarks/device/cuda_smoke.py``.
"""

from __future__ import annotations

import pytest
import torch

from scaledl.sync.data_parallel import _moved, _placement

GPU0, GPU1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")


def test_a_model_on_the_named_gpu_gets_its_inputs_and_output_placed() -> None:
    assert _placement({GPU0}, [0], None) == (GPU0, GPU0)
    assert _placement({GPU1}, ["cuda:1"], 0) == (GPU1, GPU0)
    assert _placement({GPU0}, [GPU0], "cuda:0") == (GPU0, GPU0)
    assert _placement({CPU}, None, None) == (None, None)  # a CPU model, as DDP
    assert _placement({GPU0}, [], None) == (None, None)  # [] means None, as in DDP


@pytest.mark.parametrize(("devices", "ids", "output", "message"), [
    ({CPU}, [0], None, "device_ids=[0] is for a model on one accelerator, but this model is on "
                       "the CPU; leave device_ids out"),
    ({GPU0, GPU1}, [0], None, "but this model is on several devices"),
    ({GPU0}, [1], None, "device_ids=[1] names cuda:1 but the model is on cuda:0; move it with "
                        "model.to('cuda:1') or pass device_ids=['cuda:0']"),
    ({GPU0}, [0, 1], None, "names 2 devices, but each process drives one device"),
    ({GPU0}, 0, None, "device_ids=0 must be a list, as DDP takes it: device_ids=[0]"),
    ({GPU0}, None, 1, "output_device=1 needs device_ids"),
    ({GPU0}, ["cpu"], None, "device 'cpu' must be a cuda device with an index"),
    ({GPU0}, ["bogus"], None, "'bogus' is not a device; pass an index such as 0"),
    ({GPU0}, [True], None, "a device is an index, a name such as 'cuda:0' or a torch.device, "
                           "got bool True"),
    ({CPU, GPU0}, None, None, "the model's tensors are on cpu, cuda:0; DataParallel averages a "
                              "model on one kind of device"),
    ({torch.device("meta")}, None, None, "the model has tensors on the meta device (shapes "
                                         "without values)"),
    ({CPU, torch.device("meta")}, None, None, "model.to_empty(device='cpu')"),
])
def test_what_ddp_leaves_to_the_first_forward_is_refused(
    devices: set[torch.device], ids: object, output: object, message: str,
) -> None:
    with pytest.raises((ValueError, TypeError)) as error:
        _placement(devices, ids, output)  # type: ignore[arg-type]
    assert message in str(error.value)


def test_inputs_nested_in_containers_are_moved() -> None:
    meta = torch.device("meta")
    moved = _moved(((torch.ones(1), [torch.ones(2), 3]), {"mask": torch.ones(3)}), meta)
    (first, (second, plain)), kwargs = moved
    assert first.device == second.device == kwargs["mask"].device == meta and plain == 3
