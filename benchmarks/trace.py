"""Where a step's time goes: a few steady steps of a variant under ``torch.profiler`` (CPU and CUDA).

``python -m benchmarks ... --trace-steps N`` traces N whole step cycles (one batch start to the N-th
next one, Lightning's work between steps included) of every variant, the plain loop's too, just before
the measured window, and writes ``<workload>-<variant>-trace.md``: wall time against GPU busy time per
step (the difference is time the GPU waited for the host), the CUDA runtime calls that make the host
wait, and the top kernels and host ops. The traced steps are not measured steps: profiling slows the host.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from compile_callback import torch_internals

# CUDA runtime calls that make the host wait for the device, and the ones that launch work.
WAITING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync")


def _device_us(event: Any) -> float:
    return float(getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0) or 0.0)


def _is_annotation(event: Any) -> bool:
    return bool(getattr(event, "is_user_annotation", False)) or "#" in event.name or event.name.startswith(
        ("ProfilerStep", "compile_callback::")
    )


def summarize_trace(events: list[Any], steps: int, wall_s: float, title: str) -> str:
    """The trace as Markdown: per-step wall and GPU busy time, waits, launches, top kernels and host ops."""
    kernels: collections.Counter[str] = collections.Counter()
    kernel_calls: collections.Counter[str] = collections.Counter()
    host: collections.Counter[str] = collections.Counter()
    runtime: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.device_type == DeviceType.CUDA:
            if _is_annotation(event):
                continue  # a host range drawn on the GPU timeline (Optimizer.step#...), not GPU work
            kernels[event.name] += _device_us(event)
            kernel_calls[event.name] += 1
            continue
        if event.name in WAITING_CALLS or event.name in LAUNCH_CALLS:
            runtime[event.name] += 1
        host[event.name] += float(event.self_cpu_time_total)
    busy_ms = sum(kernels.values()) / 1e3 / steps
    wall_ms = wall_s * 1e3 / steps
    lines = [
        f"### {title}",
        "",
        f"{steps} step cycles under torch.profiler (CPU + CUDA; the profiler slows the host).",
        "",
        "| per step | value |",
        "|---|---|",
        f"| wall time (batch start to next batch start) | {wall_ms:.3f} ms |",
    ]
    if kernels:
        idle_ms = max(0.0, wall_ms - busy_ms)
        lines += [
            f"| GPU busy (kernels, copies, memsets; summed over streams) | {busy_ms:.3f} ms |",
            f"| GPU idle (waiting for the host) | {idle_ms:.3f} ms ({idle_ms / wall_ms:.1%}) |",
        ]
    else:
        lines.append("| GPU | none traced (a CPU run) |")
    for name in (*WAITING_CALLS, *LAUNCH_CALLS):
        if runtime.get(name):
            lines.append(f"| `{name}` calls | {runtime[name] / steps:.1f} |")
    if kernels:
        lines += ["", "| top GPU kernels | ms per step | calls per step |", "|---|---|---|"]
        for name, us in kernels.most_common(15):
            lines.append(f"| `{name[:90]}` | {us / 1e3 / steps:.3f} | {kernel_calls[name] / steps:.1f} |")
    lines += ["", "| top host ops and calls (self time) | ms per step |", "|---|---|"]
    for name, us in host.most_common(15):
        lines.append(f"| `{name[:90]}` | {us / 1e3 / steps:.3f} |")
    return "\n".join(lines) + "\n"


class StepProfile:
    """Profiles ``steps`` whole step cycles starting at batch ``first`` (0-based, counted here) and writes
    the summary to ``path``; :meth:`batch_start` is called at the start of every batch, by the plain loop
    directly and by :class:`StepTrace` in a Lightning fit.
    """

    def __init__(self, first: int, steps: int, path: str, title: str) -> None:
        self.first, self.steps, self.path, self.title = first, steps, path, title
        self._batches = 0
        self._profiler: torch.profiler.profile | None = None
        self._started = 0.0

    def batch_start(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        if self._batches == self.first and torch_internals.profiler_running():
            self.first += 1  # another profiler (a CompileCallback sample) still runs: start one batch later
        if self._batches == self.first:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            if cuda:
                torch.cuda.synchronize(device)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()
            self._started = time.perf_counter()
        elif self._profiler is not None and self._batches == self.first + self.steps:
            if cuda:
                torch.cuda.synchronize(device)
            wall_s = time.perf_counter() - self._started
            profiler, self._profiler = self._profiler, None
            profiler.stop()
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "w", encoding="utf-8") as handle:
                handle.write(summarize_trace(list(profiler.events()), self.steps, wall_s, self.title))
        self._batches += 1

    def close(self) -> None:
        """Stops a profile the run ended inside: nothing is written."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None


class StepTrace(Callback):
    """:class:`StepProfile` in a Lightning fit. Goes first in the Trainer's callback list, so a cycle runs
    from one batch's first hook to the next batch's first hook."""

    def __init__(self, profile: StepProfile) -> None:
        self.profile = profile

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.profile.batch_start(pl_module.device)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.profile.close()
