"""Diagnostic run of session 5 (off-protocol): eager, then CompileCallback(), then eager again in one process,
with 12 traced steps each and the process state after each variant (profiler, modes, allocator). Ran on the
H200 from the repo root as `DOUT=/tmp/d python benchmarks/diagnostics/revert.py eager callback eager`
(PYTHONPATH=.); its output is this folder. Kept for the record, not part of the benchmark command."""
import json, os, sys, statistics, torch
from benchmarks.__main__ import parse_args, resolve_settings
from benchmarks.runner import run_workload
from benchmarks.workloads import make_workload

smoke = not torch.cuda.is_available()
args = parse_args(["--workload", "gpt2_varlen", "--epochs", "2", "--trace-steps", "12" if not smoke else "0", "--out", os.environ["DOUT"]] + (["--smoke"] if smoke else []))
device = torch.device("cuda" if not smoke else "cpu")
settings = resolve_settings(args, "gpt2_varlen", device, args.out)
workload = make_workload("gpt2_varlen", device=device, smoke=smoke)
order = sys.argv[1:] or ["eager", "callback", "eager"]

def on_record(records):
    r = records[-1]
    cuda = torch.cuda.is_available()
    stats = torch.cuda.memory_stats() if cuda else {}
    from torch._inductor import cudagraph_trees
    info = {
        "variant": r["variant"], "median_ms": r.get("median_ms"), "status": r.get("status"),
        "alloc_retries": stats.get("num_alloc_retries"), "reserved_gb": torch.cuda.memory_reserved() / 2**30 if cuda else 0,
        "allocated_gb": torch.cuda.memory_allocated() / 2**30 if cuda else 0,
        "profiler_on": bool(torch.autograd.profiler._is_profiler_enabled),
        "fn_modes": len(torch.overrides._get_current_function_mode_stack()),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "grad_mode": torch.is_grad_enabled(), "anomaly": torch.is_anomaly_enabled(),
        "tree_managers": len(getattr(cudagraph_trees.local, "tree_manager_containers", {}) or {}) if hasattr(cudagraph_trees, "local") else None,
        "threads": __import__("threading").active_count(),
    }
    print("[diag]", json.dumps(info), file=sys.stderr, flush=True)
    with open(os.path.join(args.out, "diag.jsonl"), "a") as f:
        f.write(json.dumps({**info, "step_ms_all": r.get("step_ms_all")}) + "\n")

run_workload(workload, order, settings, on_record=on_record)
