"""Diagnostic for next GPU session (off-protocol): what a `callback_pad` fit leaves in the process.

In the two variable-length runs with `callback_pad` (session 5 `pad-auto8`, session 6 `whole-first`),
every variant after it ran its host-bound steps ~23 ms slower (eager at 128 tokens: 32.2 against
8.9 ms), while a run without it (`a/`: eager, whole, eager_end) showed no such drift. This runs the
given variants in one process (default: eager callback_pad eager_end) and after each one records the
process state and a host-overhead probe: 2,000 tiny CUDA ops timed on the host, with the garbage
collector on and off. A state field that changes after `callback_pad`, together with a probe that
slows, names the cause; a probe that slows only with gc on points at the heap.

Run on the H200 from the repo root (PYTHONPATH=.):
    DOUT=$OUT/after python benchmarks/diagnostics/after_effect_v1.py eager callback_pad eager_end
"""

import gc
import json
import os
import sys
import threading
import time

import torch

from benchmarks.__main__ import parse_args, resolve_settings
from benchmarks.runner import run_workload
from benchmarks.workloads import make_workload

smoke = not torch.cuda.is_available()
out = os.environ.get("DOUT", "/tmp/after-effect")
args = parse_args(["--workload", "gpt2_varlen", "--epochs", "2", "--out", out] + (["--smoke"] if smoke else []))
device = torch.device("cuda" if not smoke else "cpu")
settings = resolve_settings(args, "gpt2_varlen", device, args.out)
workload = make_workload("gpt2_varlen", device=device, smoke=smoke)
order = sys.argv[1:] or ["eager", "callback_pad", "eager_end"]


def host_probe_ms(ops: int = 2000) -> float:
    """Host milliseconds for ``ops`` tiny out-of-place adds (the launch path of an eager op)."""
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
    return elapsed


def state() -> dict:
    from torch._inductor import cudagraph_trees
    from torch.overrides import _get_current_function_mode_stack

    cuda = device.type == "cuda"
    stats = torch.cuda.memory_stats() if cuda else {}
    try:
        containers = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers") if torch._C._is_key_in_tls("tree_manager_containers") else {}
        managers = sum(1 for c in containers.values() if getattr(c, "tree_manager", None) is not None)
    except Exception as error:  # noqa: BLE001 - a diagnostic: say what failed
        managers = repr(error)
    gc.collect()
    return {
        "probe_ms_gc_on": host_probe_ms(),
        "probe_ms_gc_off": (gc.disable(), host_probe_ms(), gc.enable())[1],
        "gc_objects": len(gc.get_objects()),
        "gc_counts": gc.get_count(),
        "tree_managers": managers,
        "fn_modes": [type(m).__name__ for m in _get_current_function_mode_stack()],
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "profiler_on": bool(torch.autograd.profiler._is_profiler_enabled),
        "kineto_on": torch._C._autograd._profiler_enabled(),
        "sys_profile": repr(sys.getprofile()),
        "sys_trace": repr(sys.gettrace()),
        "threads": sorted(t.name for t in threading.enumerate()),
        "grad": torch.is_grad_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
        "global_module_hooks": [len(getattr(torch.nn.modules.module, name)) for name in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks")],
        "alloc_retries": stats.get("num_alloc_retries"),
        "segments": stats.get("segment.all.current"),
        "active_blocks": stats.get("active.all.current"),
        "reserved_gb": torch.cuda.memory_reserved() / 2**30 if cuda else 0,
        "allocated_gb": torch.cuda.memory_allocated() / 2**30 if cuda else 0,
    }


print("[after-effect] before any variant", json.dumps(state()), file=sys.stderr, flush=True)


def on_record(records):
    record = records[-1]
    info = {"variant": record["variant"], "median_ms": record.get("median_ms"), "tokens_per_s": record.get("tokens_per_s"), **state()}
    print("[after-effect]", json.dumps(info), file=sys.stderr, flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "after_effect.jsonl"), "a") as handle:
        handle.write(json.dumps({**info, "step_ms_all": record.get("step_ms_all")}) + "\n")


run_workload(workload, order, settings, on_record=on_record)
