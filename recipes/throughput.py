"""Throughput and MFU of a recipe's steady steps, counted with Lightning's own utilities.

Lightning's ``ThroughputMonitor`` callback calls ``torch.cuda.synchronize()`` after every batch to read
its wall clock (``lightning/pytorch/callbacks/throughput_monitor.py``): a host sync per step, which
leaves the GPU idle while the host prepares the next one (BENCHMARKS.md measured what the progress
bar's sync cost GPT-2). So the recipes feed the plain counter it wraps, fabric's
:class:`~lightning.fabric.utilities.throughput.Throughput`, with step times that CUDA events measured
(``recipes.train.StepTimes``), and count a step's FLOPs with fabric's
:func:`~lightning.fabric.utilities.throughput.measure_flops` on a meta-device copy of the model (the
model's own operations, forward and backward; no memory, no device time).

``Throughput`` divides a window's samples by its summed time: the rate of the window's *mean* step.
One stalled step drags that mean for as long as it stays in the window (on the H200 one 0.54 s step of
GPT-2's 34.4 ms ones read 411k tokens/s for the last 100 steps, 13.7% under the median step's 477k).
So the recipes' figures price each step of the window at the median time of its shape's steps
(:func:`at_median`) -- the same steps, and the same statistic, as the median step time the run prints
-- and give the summed rate beside it (:func:`rates` of the steps as timed), which falls below when
some steps stalled (a host pause inside a step counts there, not in the median).

The peak the MFU divides by is assumed from the device's name (:data:`DENSE_PEAK_FLOPS`) and said
beside every MFU figure: fabric's ``get_available_flops`` lists the H100/H200 with-sparsity figure
(2.0e15 for bf16) and does not recognise the name "NVIDIA H200".
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping
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


def at_median(steps_by_key: Mapping[Hashable, list[float]]) -> dict[Hashable, list[float]]:
    """Each step's time (ms) replaced by the median of its key's (its batch shape's) steps: a window of
    one shape then sums to steps x the median step. A shape timed once keeps its own time."""
    return {key: [statistics.median(steps)] * len(steps) for key, steps in steps_by_key.items() if steps}


def rates(
    step_ms: list[float], samples: list[int], items: list[int] | None, flops: list[float] | None, peak: float | None
) -> dict[str, float]:
    """``samples_per_sec``, ``items_per_sec`` (tokens), ``flops_per_sec`` and ``mfu`` of the given steps
    (each step's time, samples, items and FLOPs, in any order), from fabric's ``Throughput`` over them
    as one window: their summed samples, items and FLOPs over their summed time. Every step counts (a
    window's rates are differences, so an update at zero opens it). Empty without steps."""
    if not step_ms:
        return {}
    throughput = Throughput(available_flops=peak, window_size=len(step_ms) + 1)
    throughput.update(time=0.0, batches=0, samples=0, lengths=0 if items else None, flops=0 if flops else None)
    elapsed = done = items_done = 0.0
    for index, ms in enumerate(step_ms):
        elapsed += max(ms, 1e-6) / 1e3  # the window's clock must rise with every update
        done += samples[index]
        items_done += items[index] if items else 0
        throughput.update(time=elapsed, batches=index + 1, samples=int(done),
                          lengths=int(items_done) if items else None, flops=flops[index] if flops else None)
    computed = throughput.compute()
    names = {"device/samples_per_sec": "samples_per_sec", "device/items_per_sec": "items_per_sec",
             "device/flops_per_sec": "flops_per_sec", "device/mfu": "mfu"}
    return {ours: float(computed[theirs]) for theirs, ours in names.items() if theirs in computed}
