"""Diagnostic (off-protocol, issue 19): what is alive on the GPU at a variant's memory peak, and who allocated it.

Runs ``eager`` (the process's warm-up, as the harness does) and then one variant of a workload for
``--total-steps`` steps with the CUDA caching allocator's history recorded (every allocation and free,
with the Python stack of each allocation), replays that history to find the moment the allocated bytes
peaked, and prints the blocks alive then, grouped by where they were allocated, biggest first (one JSON
line each), after a line saying when the peak came (the stack of the allocation that made it).

    python -m benchmarks.diagnostics.peakstack hf_bert_mlm callback --total-steps 80 > peak.jsonl

Bytes alive before the recording began (the model's parameters, the data) count in the replayed
total as one "before recording" group, so the replayed peak is comparable with
``torch.cuda.max_memory_allocated``, which the first line also gives. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch

from benchmarks import runner
from benchmarks.diagnostics import prepare
from benchmarks.variants import VARIANTS

GB = 2**30
OURS = ("compile_callback", "benchmarks", "transformers", "timm", "lightning")


def _where(frames: list[dict[str, Any]], depth: int = 6) -> list[str]:
    """The allocation's stack, innermost first, as ``file:line name``: the innermost frame, then the
    frames of this project and of the model's and Lightning's code (torch's own frames are many)."""
    def text(frame: dict[str, Any]) -> str:
        path = frame.get("filename", "?")
        for package in (*OURS, "torch"):
            at = path.rfind(f"/{package}/")
            if at >= 0:
                path = path[at + 1:]
                break
        return f"{path}:{frame.get('line')} {frame.get('name')}"

    if not frames:
        return ["(no stack)"]
    shown = [text(frames[0])]
    shown += [text(f) for f in frames[1:] if any(f"/{p}/" in f.get("filename", "") for p in OURS)]
    return shown[:depth]


def peak_of(trace: Iterable[dict[str, Any]], before: int = 0) -> dict[str, Any]:
    """Replays an allocator trace (``torch.cuda.memory._snapshot()['device_traces'][i]``): the peak of
    allocated bytes (``before`` counted as alive throughout), the entry that made it, and the blocks alive
    then, grouped by their allocation stack (:func:`_where`), biggest group first."""
    entries = list(trace)
    alive: dict[int, tuple[int, int]] = {}  # address -> (size, index of its alloc entry)
    total = peak = before
    peak_at = -1
    for index, entry in enumerate(entries):
        action = entry.get("action")
        if action == "alloc":
            alive[entry["addr"]] = (entry["size"], index)
            total += entry["size"]
            if total > peak:
                peak, peak_at = total, index
        elif action == "free_completed" and entry["addr"] in alive:
            total -= alive.pop(entry["addr"])[0]
    # Second pass: the blocks alive at the peak.
    alive.clear()
    for index, entry in enumerate(entries[:peak_at + 1]):
        if entry.get("action") == "alloc":
            alive[entry["addr"]] = (entry["size"], index)
        elif entry.get("action") == "free_completed":
            alive.pop(entry["addr"], None)
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for size, index in alive.values():
        key = tuple(_where(entries[index].get("frames", [])))
        group = groups.setdefault(key, {"bytes": 0, "blocks": 0, "stack": list(key)})
        group["bytes"] += size
        group["blocks"] += 1
    if before:
        groups[("before recording",)] = {"bytes": before, "blocks": None, "stack": ["before recording"]}
    made = entries[peak_at] if peak_at >= 0 else {}
    return {
        "peak_bytes": peak,
        "entries": len(entries),
        "peak_entry": peak_at,
        "made_by": _where(made.get("frames", []), depth=12) if made else None,
        "groups": sorted(groups.values(), key=lambda g: -g["bytes"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.peakstack")
    parser.add_argument("workload")
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--total-steps", type=int, default=80, help="steps of the variant (its peak must come before)")
    parser.add_argument("--top", type=int, default=15, help="groups printed, biggest first")
    parser.add_argument("--entries", type=int, default=6_000_000, help="the allocator history's length (a ring: "
                        "older entries are dropped, which the replay would misread; the first line says if it filled)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs CUDA: the allocator history is the CUDA caching allocator's")
    prepared = prepare(args.workload, os.environ.get("DOUT", "/tmp/peakstack"), "--total-steps", str(args.total_steps))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=args.entries, context="alloc", stacks="python")
    record = runner.run_variant(prepared.workload, VARIANTS[args.variant], prepared.settings, prepared.state)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    found = peak_of(trace, before=before)
    callback = record.get("callback") or {}
    print(json.dumps({
        "workload": args.workload, "variant": args.variant, "status": record.get("status"),
        "max_memory_allocated_gb": torch.cuda.max_memory_allocated() / GB, "replayed_peak_gb": found["peak_bytes"] / GB,
        "history_full": found["entries"] >= args.entries, "entries": found["entries"], "peak_entry": found["peak_entry"],
        "made_by": found["made_by"],
        "decisions": [{k: d.get(k) for k in ("region", "mode", "kept", "step", "peak_gb", "reason")}
                      for d in callback.get("decisions", [])],
    }), flush=True)
    for group in found["groups"][:args.top]:
        print(json.dumps({"gb": round(group["bytes"] / GB, 3), "blocks": group["blocks"], "stack": group["stack"]}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
