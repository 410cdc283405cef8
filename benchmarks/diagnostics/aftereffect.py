"""Diagnostic (off-protocol, issue 19): which part of a CompileCallback fit leaves eager steps slower.

Runs a sequence of steps on one workload in one process, an eager window between treatments, and
prints one JSON line per step with its wall-clock span, so a host clock running beside it
(:mod:`benchmarks.diagnostics.hostclock`) tells a slower process from a slower host. A step is:

- ``eager``: the Lightning eager variant, ``--eager-steps`` steps, the last 60% timed (the window);
- a variant of :mod:`benchmarks.variants` (``whole_ro``, ``callback``, ``callback_no_anatomy``, ...), run as
  the benchmark runs it;
- ``cb:<json>``: a CompileCallback variant with these options (``cb:{"regions":"model","mode":"reduce-overhead",
  "verify":false,"anatomy":false}``: a fixed plan, no trials, no profiler, no verification);
- ``@profile``: 30 CPU-only ``torch.profiler`` sessions as the callback's anatomy starts them, events read;
- ``@pinned``: 2 GiB of pinned host memory filled from the GPU and given back, as verification's copies are;
- ``@reset``: ``torch._dynamo.reset()`` and ``gc.collect()``;
- ``@gcfreeze``: ``gc.collect()`` then ``gc.freeze()``: the objects alive now are never scanned again by
  the garbage collector (tells gc work on a heap that compiling grew from other causes);
- ``@workers``: Inductor's compile worker processes shut down (they outlive a compile);
- ``@graphs``: the CUDA-graph trees dropped (``torch._inductor.cudagraph_trees.reset_cudagraph_trees()``);
- ``@empty``: ``torch.cuda.empty_cache()``;
- ``@fresh``: the same eager window in a fresh process started now (this process waits): a control at
  the same moment, so a parent's eager slower after a fit than the fresh process's points at state the
  fit left, and both slower at a slower host (the line's ``fresh_median_ms``).

Every line also has ``gc_objects`` (the objects the garbage collector tracks after the step), the
process's ``threads``, ``children`` with their CPU seconds so far (whether anything left running
beside the training loop keeps working) and, on CUDA, the caching ``allocator``'s state (GB reserved and
allocated, free device memory, cumulative cudaMalloc/cudaFree calls and allocation retries) and the
process-wide backend ``flags`` (SDPA backends, TF32, cuDNN, threads).

    python -m benchmarks.diagnostics.hostclock run --out clock.jsonl &
    python -m benchmarks.diagnostics.aftereffect resnet18_cifar eager,whole_ro,eager,callback,eager > steps.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

from benchmarks import runner
from benchmarks.diagnostics import prepare
from benchmarks.variants import VARIANTS, Variant


def _profile_sessions(device: torch.device) -> None:
    from compile_callback.anatomy import _start_cpu_profiler

    x = torch.ones(8, device=device)
    for _ in range(30):
        profiler = _start_cpu_profiler()
        for _ in range(200):
            x = x + 1
        if profiler is not None:
            profiler.stop()
            sum(1 for _ in profiler.events())


def _pinned(device: torch.device) -> None:
    from compile_callback.verify import release_host_memory

    if device.type != "cuda":
        return
    chunks = []
    for _ in range(8):
        source = torch.empty(2**28 // 4, device=device)  # 256 MiB
        host = torch.empty(source.shape, pin_memory=True)
        host.copy_(source, non_blocking=True)
        chunks.append(host)
    torch.cuda.synchronize()
    del chunks
    gc.collect()
    release_host_memory()


def _children() -> dict[str, float]:
    """This process's live child processes and the CPU seconds they have used (Linux /proc; empty elsewhere)."""
    pids: list[str] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as handle:
                pids += handle.read().split()
    except OSError:
        return {}
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return {"count": len(pids), "cpu_s": ticks / os.sysconf("SC_CLK_TCK")}


def _allocator(device: torch.device) -> dict[str, float] | None:
    """The CUDA caching allocator's state so far: what it holds and has handed out (GB), and its cumulative
    cudaMalloc / cudaFree calls and retries (a retry frees cached blocks and synchronizes the device:
    an allocator squeezed by memory something else still holds slows host-bound steps this way)."""
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "reserved_gb": stats.get("reserved_bytes.all.current", 0) / 1e9,
        "allocated_gb": stats.get("allocated_bytes.all.current", 0) / 1e9,
        "device_free_gb": free / 1e9,
        "retries": stats.get("num_alloc_retries", 0),
        "cuda_mallocs": stats.get("num_device_alloc", 0),
        "cuda_frees": stats.get("num_device_free", 0),
        "segments": stats.get("segment.all.current", 0),
    }


def _flags() -> dict[str, object]:
    """Process-wide backend flags a compile could leave changed (SDPA backends, TF32, cuDNN, matmul
    precision, threads); eager steps after a fit run with whatever these are."""
    cuda = torch.backends.cuda
    return {
        "sdpa": [cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
                 cuda.cudnn_sdp_enabled()],
        "tf32": [cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                 cuda.matmul.allow_bf16_reduced_precision_reduction, cuda.matmul.allow_fp16_reduced_precision_reduction],
        "cudnn": [torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic],
        "matmul_precision": torch.get_float32_matmul_precision(),
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "grad": torch.is_grad_enabled(),
    }


def _shutdown_workers(device: torch.device) -> None:
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()


def _drop_graphs(device: torch.device) -> None:
    if device.type == "cuda":
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()


TREATMENTS = {
    "@profile": _profile_sessions,
    "@pinned": _pinned,
    "@reset": lambda device: (torch._dynamo.reset(), gc.collect()),
    "@gcfreeze": lambda device: (gc.collect(), gc.freeze()),
    "@workers": _shutdown_workers,
    "@graphs": _drop_graphs,
    "@empty": lambda device: torch.cuda.empty_cache() if device.type == "cuda" else None,
}


def _fresh(workload: str, eager_steps: int) -> dict[str, Any]:
    """An eager window of ``workload`` in a fresh interpreter (this module, step ``eager``), waited for."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.diagnostics.aftereffect", workload, "eager", "--eager-steps", str(eager_steps)],
        capture_output=True, text=True, check=False,
    )
    lines = [json.loads(text) for text in done.stdout.splitlines() if text.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"fresh_error": (done.stderr or done.stdout)[-500:]}
    return {"fresh_median_ms": lines[-1].get("median_ms"), "fresh_p90_ms": lines[-1].get("p90_ms"),
            "fresh_window_started_at": lines[-1].get("window_started_at")}


def _variant(step: str) -> Variant:
    if step.startswith("cb:"):
        return Variant(f"cb{len(step)}", f"CompileCallback({step[3:]})", callback=json.loads(step[3:]))
    return VARIANTS[step]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.aftereffect")
    parser.add_argument("workload")
    parser.add_argument("steps", help="comma-separated: eager, a variant, cb:<json options>, @fresh, " + ", ".join(TREATMENTS))
    parser.add_argument("--eager-steps", type=int, default=100)
    args = parser.parse_args(argv)
    prepared = prepare(args.workload, "/tmp/aftereffect")
    settings, workload, state, device = prepared.settings, prepared.workload, prepared.state, prepared.device
    eager_settings = dataclasses.replace(
        settings, total_steps=args.eager_steps, measured_steps=max(1, int(0.6 * args.eager_steps)),
        longest_steps=args.eager_steps,
    )
    # Steps separated by ';' in the JSON of cb: options would be awkward; commas inside braces stay.
    steps, depth, current = [], 0, ""
    for char in args.steps:
        depth += char == "{"
        depth -= char == "}"
        if char == "," and depth == 0:
            steps.append(current)
            current = ""
        else:
            current += char
    steps.append(current)
    for index, step in enumerate(steps):
        started = time.time()
        line: dict[str, Any] = {"index": index, "step": step}
        if step == "@fresh":
            line.update(_fresh(args.workload, args.eager_steps))
        elif step in TREATMENTS:
            TREATMENTS[step](device)
        else:
            variant = _variant(step)
            record = runner.run_variant(workload, variant, eager_settings if step == "eager" else settings, state)
            line.update(status=record.get("status"), median_ms=record.get("median_ms"), p90_ms=record.get("p90_ms"),
                        error=record.get("error"),
                        decisions=[(d.get("region"), d.get("mode"), d.get("kept"))
                                   for d in (record.get("callback") or {}).get("decisions", [])])
            window = record.get("step_ms_all") or []
            line["window_started_at"] = record.get("ended_at", time.time()) - (
                sum(window[-record.get("steps_measured", 0):]) / 1e3 if window else 0)
        line.update(started_at=started, ended_at=time.time(), gc_objects=len(gc.get_objects()),
                    threads=len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None,
                    children=_children(), allocator=_allocator(device), flags=_flags())
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.exit(main())
