"""Diagnostic (off-protocol): where a CompileCallback fit's memory peak happens, and what it leaves behind.

Runs a list of steps per workload in one process and writes one JSON line per step to
``$DOUT/phases.jsonl``. A step is a variant name of ``benchmarks.variants`` or a remedy applied to the
process between variants:

- ``@gc``: ``gc.collect()`` and ``torch.cuda.empty_cache()``;
- ``@profile``: 30 CPU-only ``torch.profiler`` sessions as the callback's anatomy starts them, their
  events read (does a profiler session alone leave the process slower?);
- ``@reset``: ``torch._dynamo.reset()`` (compiled code, guards and CUDA-graph trees dropped);
- ``%<variant>``: the variant run under cProfile, its top functions by own time written to
  ``$DOUT/profile-<n>-<variant>.txt`` (where an eager run's host time goes);
- ``^<variant>``: the variant with ``torch.profiler`` over 24 of its late batches, the per-op table
  (self CPU and device time) written to ``$DOUT/torchprof-<n>-<variant>.txt`` and the window's host and
  device totals to the step's line (whether a slow step waits on the host or on the GPU).

``callback_pad_inductor`` is ``callback_pad`` with Inductor even in a CPU smoke run (whose callback
variants otherwise use the "eager" backend).

After every step it records the process state (function/dispatch modes, profiler, module hooks,
threads, load average, allocator counters, CUDA-graph tree managers) and a host-overhead probe (2,000
tiny CUDA ops timed on the host), also taken in turn with a fresh process's. During a variant it records the peak memory of every batch with the
CompileCallback's phase label, so the batch (and phase) that sets the fit's peak is named.

    DOUT=$OUT/diag python -m benchmarks.diagnostics.phases resnet18_cifar:eager,callback,eager_end,@gc,eager_end,@reset,eager_end
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import torch

from benchmarks import runner
from benchmarks.__main__ import parse_args, resolve_settings
from benchmarks.measure import StepEnd
from benchmarks.variants import VARIANTS, Variant
from benchmarks.workloads import make_workload

smoke = not torch.cuda.is_available()
device = torch.device("cpu" if smoke else "cuda")
out = os.environ.get("DOUT", "/tmp/phases")
os.makedirs(out, exist_ok=True)
batches: list[dict[str, Any]] = []


PROFILE_FROM, PROFILE_BATCHES = (2, 2) if smoke else (400, 24)  # gpt2_varlen runs 576 batches
torch_profile: dict[str, Any] = {}  # "on": profile this variant; "profiler": the live one


class PeakStepEnd(StepEnd):
    """StepEnd that also records each batch's peak memory and the callback's phase label."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        torch_profile["seen"] = torch_profile.get("seen", -1) + 1  # batch_idx restarts every epoch
        if torch_profile.get("on") and torch_profile["seen"] == torch_profile["from"]:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch_profile["profiler"] = torch.profiler.profile(activities=activities)
            torch_profile["profiler"].__enter__()
            torch_profile["wall"] = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if torch_profile.get("profiler") is not None and torch_profile["seen"] == torch_profile["from"] + PROFILE_BATCHES - 1:
            if device.type == "cuda":
                torch.cuda.synchronize()
            torch_profile["wall"] = time.perf_counter() - torch_profile["wall"]
            torch_profile["profiler"].__exit__(None, None, None)
        label = None
        for callback in trainer.callbacks:
            planner = getattr(getattr(callback, "run", None), "planner", None)
            if planner is not None:
                label = getattr(planner, "_label", None)
        if device.type == "cuda":
            stats = torch.cuda.memory_stats()
            batches.append({
                "batch": batch_idx, "label": label,
                "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                "allocated_gb": round(torch.cuda.memory_allocated() / 2**30, 3),
                # cudaMalloc/cudaFree (a free synchronizes the device) and pinned host allocations so far
                "device_allocs": stats.get("num_device_alloc"), "device_frees": stats.get("num_device_free"),
                "alloc_retries": stats.get("num_alloc_retries"),
                "host_allocs": getattr(torch.cuda, "host_memory_stats", dict)().get("num_host_alloc"),
            })
            torch.cuda.reset_peak_memory_stats()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


runner.StepEnd = PeakStepEnd
VARIANTS["callback_pad_inductor"] = Variant(
    "callback_pad_inductor", "CompileCallback(pad='auto', backend='inductor')", callback={"pad": "auto", "backend": "inductor"}
)


def host_probe_ms(ops: int = 2000) -> float:
    x = torch.ones(8, device=device)
    for _ in range(100):
        x = x + 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ops):
        x = x + 1
    elapsed = (time.perf_counter() - start) * 1e3
    if device.type == "cuda":
        torch.cuda.synchronize()
    return round(elapsed, 2)


def cpu_probe_ms() -> float:
    """Pure host work, no CUDA: a Python loop and small CPU tensor ops (is the CPU itself slower?)."""
    a = torch.ones(8)
    start = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i
    for _ in range(2000):
        a = a + 1
    return round((time.perf_counter() - start) * 1e3, 2)


def gpu_probe_ms() -> float | None:
    """Device time of 20 bf16 4096x4096 matmuls by CUDA events (is the GPU itself slower?)."""
    if device.type != "cuda":
        return None
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    a @ a
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(20):
        a @ a
    end.record()
    torch.cuda.synchronize()
    return round(begin.elapsed_time(end), 2)


FRESH_PROBE = (
    "import sys, time, torch; x = torch.ones(8, device='cuda')\n"
    "for _ in range(100): x = x + 1\n"
    "torch.cuda.synchronize(); print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    s = time.perf_counter()\n"
    "    for _ in range(2000): x = x + 1\n"
    "    print(round((time.perf_counter() - s) * 1e3, 2), flush=True)\n"
)


def paired_probe(rounds: int = 7) -> dict[str, Any] | None:
    """The host probe here and in a new process, taken in turn (``rounds`` pairs a few milliseconds
    apart): the machine's noise moves both, a state of this process only the first. The median of the
    pairs' ratios (this process / the fresh one) is ~1.0 for a process that carries nothing."""
    if device.type != "cuda":
        return None
    child = subprocess.Popen([sys.executable, "-c", FRESH_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        if child.stdout.readline().strip() != "ready":
            return {"error": "the fresh process did not start"}
        here, fresh = [], []
        for _ in range(rounds):
            here.append(host_probe_ms())
            child.stdin.write("go\n")
            child.stdin.flush()
            fresh.append(float(child.stdout.readline()))
        ratios = sorted(h / f for h, f in zip(here, fresh))
        return {"here_ms": here, "fresh_ms": fresh, "ratio_median": round(ratios[len(ratios) // 2], 3)}
    finally:
        child.kill()
        child.wait()


def nvidia_smi() -> str | None:
    if device.type != "cuda" or shutil.which("nvidia-smi") is None:
        return None
    query = "clocks.sm,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active"
    done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60)
    return (done.stdout or done.stderr).strip()[:300]


def scheduler() -> dict[str, float]:
    """This process's CPU seconds (all threads, and the main thread's), seconds it waited on a run queue (Linux ``/proc/self/schedstat``, all
    the main thread) and involuntary context switches: a variant whose wall time rises while its
    CPU seconds do not either waited for a CPU (run-queue seconds rise: the host's other tenants) or for
    the GPU (they do not)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/self/schedstat") as handle:
            on_cpu_ns, waiting_ns, _ = (int(v) for v in handle.read().split())
    except (OSError, ValueError):
        on_cpu_ns = waiting_ns = 0
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "main_thread_cpu_s": on_cpu_ns / 1e9, "runqueue_s": waiting_ns / 1e9,
            "involuntary_switches": float(usage.ru_nivcsw), "wall_s": time.perf_counter()}


def state() -> dict[str, Any]:
    from torch.overrides import _get_current_function_mode_stack

    stats = torch.cuda.memory_stats() if device.type == "cuda" else {}
    try:
        from torch._inductor import cudagraph_trees

        containers = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers") \
            if torch._C._is_key_in_tls("tree_manager_containers") else {}
        managers = sum(1 for c in containers.values() if getattr(c, "tree_manager", None) is not None)
    except Exception as error:  # noqa: BLE001 - a diagnostic: say what failed
        managers = repr(error)[:200]
    times = os.times()
    return {
        "probe_ms": host_probe_ms(),
        "cpu_probe_ms": cpu_probe_ms(),
        "gpu_probe_ms": gpu_probe_ms(),
        "paired_probe": paired_probe(),
        "nvidia_smi": nvidia_smi(),
        "history_recording": torch._C._cuda_isHistoryEnabled() if device.type == "cuda" else None,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "threads_torch": torch.get_num_threads(),
        "affinity": len(os.sched_getaffinity(0)),
        "probe_ms_gc_off": (gc.disable(), host_probe_ms(), gc.enable())[1],
        "gc_objects": len(gc.get_objects()),
        "tree_managers": managers,
        "fn_modes": [type(m).__name__ for m in _get_current_function_mode_stack()],
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "profiler_on": bool(torch.autograd.profiler._is_profiler_enabled),
        "kineto_on": torch._C._autograd._profiler_enabled(),
        "sys_profile": repr(sys.getprofile()), "sys_trace": repr(sys.gettrace()),
        "threads": sorted(t.name for t in threading.enumerate()),
        "loadavg": os.getloadavg(),
        "children_cpu_s": round(times.children_user + times.children_system, 1),
        "self_cpu_s": round(times.user + times.system, 1),
        "grad": torch.is_grad_enabled(), "anomaly": torch.is_anomaly_enabled(),
        "cudnn": [torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic],
        "matmul_precision": torch.get_float32_matmul_precision(),
        "global_module_hooks": [len(getattr(torch.nn.modules.module, n)) for n in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks")],
        "saved_tensor_hooks_top": repr(torch._C._autograd._top_saved_tensors_default_hooks(False)),
        "device_allocs": stats.get("num_device_alloc"), "device_frees": stats.get("num_device_free"),
        "alloc_retries": stats.get("num_alloc_retries"),
        "segments": stats.get("segment.all.current"),
        "reserved_gb": round(torch.cuda.memory_reserved() / 2**30, 3) if device.type == "cuda" else 0,
        "allocated_gb": round(torch.cuda.memory_allocated() / 2**30, 3) if device.type == "cuda" else 0,
    }


def write(line: dict[str, Any]) -> None:
    print("[phases]", json.dumps({k: v for k, v in line.items() if k not in ("batches", "step_ms_all")}),
          file=sys.stderr, flush=True)
    with open(os.path.join(out, "phases.jsonl"), "a") as handle:
        handle.write(json.dumps(line) + "\n")


def run(spec: str) -> None:
    name, steps = spec.split(":")
    args = parse_args(["--workload", name, "--out", out] + (["--smoke"] if smoke else []))
    settings = resolve_settings(args, name, device, args.out)
    workload = make_workload(name, device=device, smoke=smoke)
    initial = runner.initial_state(workload, settings.device, seed=settings.seed)
    runner.warm_up_process(workload, settings, initial)
    write({"workload": name, "step": "start", **state()})
    for step in steps.split(","):
        batches.clear()
        if step == "@gc":
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            write({"workload": name, "step": step, **state()})
            continue
        if step == "@profile":  # what the callback's anatomy does to a process, without a fit
            from compile_callback.anatomy import _start_cpu_profiler

            x = torch.ones(8, device=device)
            for _ in range(30):
                profiler = _start_cpu_profiler()
                for _ in range(200):
                    x = x + 1
                profiler.stop()
                sum(1 for _ in profiler.events())
            write({"workload": name, "step": step, **state()})
            continue
        if step == "@reset":
            torch._dynamo.reset()
            gc.collect()
            write({"workload": name, "step": step, **state()})
            continue
        profiled = step.startswith("%")
        torch_profile.clear()
        torch_profile["on"] = step.startswith("^")
        step = step.lstrip("%^")
        profiler = cProfile.Profile() if profiled else None
        if profiler is not None:
            profiler.enable()
        if torch_profile["on"]:  # the 24 profiled batches end 10 before the run does
            torch_profile["from"] = max(0, min(PROFILE_FROM, settings.total_steps - PROFILE_BATCHES - 10))
        before = scheduler()
        record = runner.run_variant(workload, VARIANTS[step], settings, initial)
        after = scheduler()
        spent = {f"variant_{k}": round(after[k] - before[k], 3) for k in before}
        if profiler is not None:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
            path = os.path.join(out, f"profile-{len(os.listdir(out))}-{step}.txt")
            with open(path, "w") as handle:
                handle.write(text.getvalue())
        window = None
        if torch_profile.get("profiler") is not None:
            averages = torch_profile["profiler"].key_averages()
            table = averages.table(sort_by="self_cpu_time_total", row_limit=40)
            table += "\n\n" + averages.table(sort_by="self_device_time_total", row_limit=25)
            with open(os.path.join(out, f"torchprof-{len(os.listdir(out))}-{step}.txt"), "w") as handle:
                handle.write(table)
            window = {
                "batches": PROFILE_BATCHES, "wall_ms": round(torch_profile["wall"] * 1e3, 1),
                "self_cpu_ms": round(sum(e.self_cpu_time_total for e in averages) / 1e3, 1),
                "self_device_ms": round(sum(getattr(e, "self_device_time_total", 0) for e in averages) / 1e3, 1),
                "launch_calls": sum(e.count for e in averages if "LaunchKernel" in e.key),
                "launch_cpu_ms": round(sum(e.self_cpu_time_total for e in averages if "LaunchKernel" in e.key) / 1e3, 1),
            }
        peak = max(batches, key=lambda b: b["peak_gb"]) if batches else None
        by_label: dict[str, float] = {}
        for b in batches:
            by_label[str(b["label"])] = max(by_label.get(str(b["label"]), 0.0), b["peak_gb"])
        callback = record.get("callback") or {}
        write({
            "workload": name, "step": step, "status": record.get("status"), "error": record.get("error"),
            "median_ms": record.get("median_ms"), "torch_profile_window": window, "peak_batch": peak, "peak_by_label": by_label,
            "decisions": [{k: d.get(k) for k in ("region", "mode", "kept", "speedup", "reason", "max_rel_error")}
                          for d in callback.get("decisions", [])],
            "memory": {k: v for k, v in callback.get("summary", {}).items() if "memory" in k or "peak" in k},
            **spent,
            **state(), "batches": list(batches), "step_ms_all": record.get("step_ms_all"),
        })


for spec in sys.argv[1:]:
    run(spec)
