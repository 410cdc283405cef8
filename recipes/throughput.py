"""Throughput and MFU of a recipe's steady steps, counted with Lightning's own utilities.

Lightning's ``ThroughputMonitor`` callback calls ``torch.cuda.synchronize()`` after every batch to read
its wall clock (``lightning/pytorch/callbacks/throughput_monitor.py``): a host sync per step, which
leaves the GPU idle while the host prepares the next one (BENCHMARKS.md measured what the progress
bar's sync cost GPT-2). So the recipes feed the plain counter it wraps, fabric's
:class:`~lightning.fabric.utilities.throughput.Throughput`, with step times that CUDA events measured
(``recipes.train.StepTimes``), and count a step's FLOPs with fabric's
:func:`~lightning.fabric.utilities.throughput.measure_flops` on a meta-device copy of the model (the
model's own operations, forward and backward; no memory, no device time).

The peak the MFU divides by is assumed from the device's name (:data:`DENSE_PEAK_FLOPS`) and said
beside every MFU figure: fabric's ``get_available_flops`` lists the H100/H200 with-sparsity figure
(2.0e15 for bf16) and does not recognise the name "NVIDIA H200".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.fabric.utilities.throughput import Throughput, measure_flops
from torch import nn

# Dense 16-bit tensor-core peak FLOP/s by a substring of the CUDA device's name (the figure SPEC.md's
# MFU target uses for the H200: 989 TFLOP/s, as nanoGPT and torchtitan count it).
DENSE_PEAK_FLOPS = {"h200": 989e12, "h100": 989e12, "a100": 312e12}
SIXTEEN_BIT = ("bf16", "16-mixed", "16-true")


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """The peak FLOP/s assumed for MFU, and what it is (or why there is none)."""
    if device.type != "cuda":
        return None, f"no peak FLOP/s assumed on {device.type}"
    name = torch.cuda.get_device_name(device)
    if not any(kind in str(precision) for kind in SIXTEEN_BIT):
        return None, f"no peak assumed for precision {precision!r} (known: the 16-bit tensor-core peak)"
    for key, value in DENSE_PEAK_FLOPS.items():
        if key in name.lower():
            return value, f"{value / 1e12:.0f} TFLOP/s assumed: the dense 16-bit tensor-core peak of an {key.upper()}"
    return None, f"no peak FLOP/s known for {name!r}"


def step_flops(build: Callable[[], nn.Module], loss: Callable[[nn.Module, Any], torch.Tensor], batch: Mapping[str, Any]) -> int:
    """FLOPs of one training step (forward and backward) on ``batch``'s shapes, by ``measure_flops`` on
    a model built on the meta device."""
    with torch.device("meta"):
        model = build()
    meta = {key: torch.empty_like(value, device="meta") if isinstance(value, torch.Tensor) else value
            for key, value in batch.items()}
    return int(measure_flops(model, lambda: loss(model, meta), lambda value: value))


def rates(
    step_ms: list[float], samples: list[int], items: list[int] | None, flops: list[float] | None, peak: float | None
) -> dict[str, float]:
    """``samples_per_sec``, ``items_per_sec`` (tokens), ``flops_per_sec`` and ``mfu`` of the given steps
    (each step's time, samples, items and FLOPs, in any order), from fabric's ``Throughput`` over
    them as one window. Empty with fewer than two steps (a window's rates are differences)."""
    if len(step_ms) < 2:
        return {}
    throughput = Throughput(available_flops=peak, window_size=len(step_ms))
    elapsed = done = items_done = 0.0
    for index, ms in enumerate(step_ms):
        elapsed += ms / 1e3
        done += samples[index]
        items_done += items[index] if items else 0
        throughput.update(time=elapsed, batches=index + 1, samples=int(done),
                          lengths=int(items_done) if items else None, flops=flops[index] if flops else None)
    computed = throughput.compute()
    names = {"device/samples_per_sec": "samples_per_sec", "device/items_per_sec": "items_per_sec",
             "device/flops_per_sec": "flops_per_sec", "device/mfu": "mfu"}
    return {ours: float(computed[theirs]) for theirs, ours in names.items() if theirs in computed}
