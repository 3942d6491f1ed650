"""Measuring a model on the local device for ``scaledl simulate profile``.

For each batch size, on real weights and random inputs with SGD (momentum 0.9):

1. warm-up iterations, then ``repeats`` iterations with hooks on every leaf module (forward
   pre/post hooks, full backward pre/post hooks) giving each module's forward and backward
   seconds, alternated with ``repeats`` iterations without hooks giving the whole forward+backward
   and the optimizer step: the hooks' own cost never enters the reference;
2. medians over the repeats; the spread of the whole iterations (interquartile range / 1.349 over
   the median, robust to one slow outlier) is the jitter;
3. on the largest batch, forward+backward again while a background thread does what a
   collective does on this device (a loopback TCP stream and a reduction on the CPU; a reduction
   kernel on another stream on CUDA): the slowdown is the interference ``kappa``.

A loopback TCP stream between two threads gives the CPU's cost per byte moved (``tcp_beta``).
On CUDA, times come from CUDA events.  In-place activations are switched off while profiling
(backward hooks cannot wrap them); that changes memory, not arithmetic.  With ``channels_last``
the weights and images are NHWC (4-D tensors only), with ``mixed_precision`` the forward pass
and the loss run under autocast; the device record's ``memory_format`` and ``precision`` say
what was measured.
"""

from __future__ import annotations

import platform
import re
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import torch
from torch import nn

from scaledl.models.profile import example_input
from scaledl.models.registry import build_model
from scaledl.profiling.measure_host import busy_work, tcp_cost
from scaledl.profiling.profile_file import MeasuredProfile, ModuleTimes

__all__ = ["measure_profile", "measurable_device", "tcp_cost", "robust_cv"]


class _Clock:
    """Wall time on the CPU; CUDA events (read after a synchronize) on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: object, end: object) -> float:
        if self.cuda:
            return float(start.elapsed_time(end)) / 1e3  # type: ignore[attr-defined]
        return float(end) - float(start)  # type: ignore[arg-type]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if not any(m.children()) and name]


Marks = dict[str, list[list[object]]]
"""Per leaf: ``[forward starts, forward ends, backward starts, backward ends]`` (a module called
several times per pass, like a shared ReLU, has one pair per call)."""


@contextmanager
def _hooks(model: nn.Module, clock: _Clock, marks: Marks) -> Iterator[None]:
    """Record forward and backward start and end marks of every leaf module."""
    handles = []

    def hook(name: str, slot: int) -> Callable[..., None]:
        def record(*_: object) -> None:
            marks[name][slot].append(clock.mark())
        return record

    for name, module in _leaves(model):
        marks[name] = [[], [], [], []]
        handles += [module.register_forward_pre_hook(hook(name, 0)),
                    module.register_forward_hook(hook(name, 1)),
                    module.register_full_backward_pre_hook(hook(name, 2)),
                    module.register_full_backward_hook(hook(name, 3))]
    try:
        with warnings.catch_warnings():  # the first module's inputs need no gradient: fine
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            yield
    finally:
        for handle in handles:
            handle.remove()


def _spans(clock: _Clock, starts: list[object], ends: list[object]) -> float:
    return sum(clock.seconds(a, b) for a, b in zip(starts, ends))


def robust_cv(values: list[float]) -> float:
    """Interquartile range / 1.349 over the median (a normal's cv, robust to outliers)."""
    if len(values) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    middle = statistics.median(values)
    return (q3 - q1) / 1.349 / middle if middle > 0 else 0.0


class _Step:
    """One model, batch and optimizer; times one training step."""

    def __init__(self, model: nn.Module, shape: tuple[int, ...], classes: int, batch: int,
                 device: torch.device, layout: torch.memory_format = torch.contiguous_format,
                 autocast: torch.dtype | None = None) -> None:
        self.model, self.clock, self.autocast = model, _Clock(device), autocast
        generator = torch.Generator().manual_seed(batch)
        x = example_input(model, batch, shape, generator).to(device)
        self.x = x.contiguous(memory_format=layout) if x.dim() == 4 else x
        targets = (batch, *shape) if getattr(model, "token_outputs", False) else (batch,)
        self.y = torch.randint(0, classes, targets, generator=generator).to(device)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def run(self) -> tuple[float, float]:
        """(forward + loss + backward seconds, optimizer step seconds)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.clock.sync()
        start = self.clock.mark()
        with torch.autocast(self.x.device.type, self.autocast or torch.bfloat16,
                            enabled=self.autocast is not None):
            logits = self.model(self.x)  # (batch, classes), or (batch, tokens, classes)
            loss = nn.functional.cross_entropy(logits.flatten(0, -2), self.y.flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        middle = self.clock.mark()
        self.optimizer.step()
        end = self.clock.mark()
        self.clock.sync()
        return self.clock.seconds(start, middle), self.clock.seconds(middle, end)


def _measure_batch(step: _Step, repeats: int, warmup: int
                   ) -> tuple[dict[str, tuple[float, float]], list[float], list[float], int]:
    """Per-leaf median (forward, backward), whole times, update times, activation bytes."""
    for _ in range(warmup):
        step.run()
    per_module: dict[str, list[tuple[float, float]]] = {}
    whole, update = [], []
    outputs: dict[str, int] = {}
    sizes = [m.register_forward_hook(_size_hook(name, outputs))
             for name, m in _leaves(step.model)]
    step.run()
    for handle in sizes:
        handle.remove()
    for _ in range(repeats):
        marks: Marks = {}
        with _hooks(step.model, step.clock, marks):
            step.run()
        for name, (f0, f1, b0, b1) in marks.items():
            if f1:  # called in this forward pass
                per_module.setdefault(name, []).append(
                    (_spans(step.clock, f0, f1), _spans(step.clock, b0, b1)))
        fb, up = step.run()
        whole.append(fb)
        update.append(up)
    medians = {name: (statistics.median(f for f, _ in rows), statistics.median(b for _, b in rows))
               for name, rows in per_module.items()}
    return medians, whole, update, sum(outputs.values())


def _size_hook(name: str, outputs: dict[str, int]) -> Callable[..., None]:
    def record(module: nn.Module, inputs: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            outputs[name] = outputs.get(name, 0) + output.numel() * output.element_size()
    return record


def _interference(step: _Step, repeats: int) -> float:
    alone = statistics.median(step.run()[0] for _ in range(repeats))
    stop = threading.Event()
    worker = threading.Thread(target=busy_work, args=(step.x.device, stop), daemon=True)
    worker.start()
    try:
        busy = statistics.median(step.run()[0] for _ in range(repeats))
    finally:
        stop.set()
        worker.join()
    return max(busy / alone - 1.0, 0.0) if alone > 0 else 0.0


def measure_profile(
    model_name: str, input_shape: tuple[int, ...], num_classes: int, batches: list[int],
    repeats: int = 5, warmup: int = 2, device: str = "cpu", channels_last: bool = False,
    mixed_precision: bool = False,
) -> MeasuredProfile:
    """Measure ``model_name`` at each of ``batches`` (see the module docstring), its weights
    and images NHWC with ``channels_last`` (recorded as the device's ``memory_format``), its
    forward pass under autocast with ``mixed_precision`` (float16 on CUDA, bfloat16 on a CPU;
    recorded as the device's ``precision``)."""
    if not batches or min(batches) < 1 or repeats < 3 or warmup < 0:
        raise ValueError(f"batches {batches} must be >= 1, repeats {repeats} >= 3 and warmup "
                         f"{warmup} >= 0")
    target = measurable_device(device)
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    half = (torch.float16 if target.type == "cuda" else torch.bfloat16) if mixed_precision \
        else None
    model = build_model(model_name, input_shape, num_classes).to(target)
    if channels_last:  # 4-D weights become NHWC (nn.Module.to's memory_format)
        model = model.to(memory_format=layout)  # type: ignore[call-overload]
    for module in model.modules():
        if getattr(module, "inplace", False):
            module.inplace = False  # type: ignore[assignment]
    model.train()
    batches = sorted(set(batches))
    rows: dict[str, list[tuple[float, float]]] = {}
    whole, update, activations, jitter = [], [], [], []
    step = None
    for batch in batches:
        step = _Step(model, input_shape, num_classes, batch, target, layout, half)
        medians, fb, up, act = _measure_batch(step, repeats, warmup)
        for name, times in medians.items():
            rows.setdefault(name, []).append(times)
        whole.append(statistics.median(fb))
        update.append(statistics.median(up))
        activations.append(act)
        jitter.append(robust_cv(fb))
    assert step is not None
    kinds = dict((name, type(m).__name__) for name, m in _leaves(model))
    owned = {name: sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
             for name, m in _leaves(model)}
    modules = tuple(
        ModuleTimes(name, kinds[name], owned[name], tuple(f for f, _ in times),
                    tuple(b for _, b in times))
        for name, times in rows.items() if len(times) == len(batches))
    return MeasuredProfile(
        model_name.lower(), tuple(input_shape), num_classes,
        {**_device_info(target), "memory_format": str(layout).removeprefix("torch."),
         "precision": str(half or torch.float32).removeprefix("torch.")},
        tuple(batches),
        modules, tuple(whole), tuple(update),
        sum(p.numel() * p.element_size() for p in model.parameters()), tuple(activations),
        repeats, statistics.median(jitter), _interference(step, repeats),
        tcp_cost() if target.type == "cpu" else 0.0,
        datetime.now(timezone.utc).isoformat(timespec="seconds"))


def measurable_device(text: str | None, option: str = "device") -> torch.device:
    """``text`` (``cpu``, ``cuda`` or ``cuda:N`` of a GPU here, in any case) as the device to
    measure; None: ``cuda`` when there is a GPU, else ``cpu``.  Else ``ValueError`` naming
    ``option`` (how the caller calls the device, e.g. ``--on``) and ``text``."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    match = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", text.strip().lower())
    use = f"{option} " if option.startswith("--") else ""  # the flag, or plain device names
    if match is None or (match[1] == "cpu" and match[2] not in (None, "0")):
        raise ValueError(f"{option} {text!r} is not a device this can measure; use {use}cpu, "
                         "cuda or cuda:N")
    if match[1] == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"{option} {text}: no CUDA device here; use {use}cpu")
    if match[2] is not None and int(match[2]) >= count:
        raise ValueError(f"{option} {text}: this machine has {count} CUDA device(s), cuda:0 "
                         f"to cuda:{count - 1}; pick one of them")
    return torch.device(match[0])


def _device_info(device: torch.device) -> dict[str, object]:
    info: dict[str, object] = {"type": device.type, "torch": torch.__version__,
                               "threads": torch.get_num_threads(),
                               "cpu": platform.processor() or platform.machine()}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
        info["max_memory_allocated"] = int(torch.cuda.max_memory_allocated(device))
    else:
        import os

        info["cores"] = os.cpu_count() or 1
    return info
