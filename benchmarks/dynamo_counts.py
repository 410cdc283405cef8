"""Dynamo's own accounting, read for the benchmark: graphs, recompiles, graph breaks, compile seconds.

Every private torch API the benchmarks touch is here. Checked on torch 2.14.1 (CPU CI) and 2.11
(the H200 machine). What is read, and why it is the right source:
- ``torch._dynamo.utils.get_compilation_metrics()``: one record per compile (forward frame or lazily
  compiled backward) with its start/end time and, for a recompile, the guard that failed
  (``recompile_reason``). It is a bounded deque (64 records by default), so the harness raises its
  limit with ``set_compilation_metrics_limit`` once per process and clears it before each variant;
  a library may not do that, a benchmark that owns the process may.
- ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: dynamo's own count of compiled graphs.
  ``torch.compiler.reset()`` does not clear it, so it is read as a difference.
- ``torch._dynamo.utils.graph_break_reasons``: one entry per graph break, cleared by ``reset()``.
- ``torch._inductor.config.force_disable_caches``: only where the public
  ``torch.compiler.config.force_disable_caches`` is missing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch
import torch._dynamo.utils as dynamo_utils

# Enough for every compile of the longest workload (varlen: a few hundred records at most).
METRICS_LIMIT = 10_000


def keep_all_compile_records() -> None:
    """Raises the limit of dynamo's compile-record deque so no record is dropped during a run."""
    if hasattr(dynamo_utils, "set_compilation_metrics_limit"):
        dynamo_utils.set_compilation_metrics_limit(METRICS_LIMIT)


def disable_compile_caches() -> None:
    """Every compile from scratch: no FX-graph, AOTAutograd or autotuning cache, in memory or on disk.

    Without it a variant that compiles the graph an earlier variant (or an earlier run) compiled pays
    a fraction of the cost, and compile seconds and first-steps wall times would not compare. What a
    warm cache saves is a separate question (SPEC: second run <= 25% of the first's compile time).
    """
    public = getattr(torch.compiler, "config", None)
    if public is not None and hasattr(public, "force_disable_caches"):
        public.force_disable_caches = True
    else:
        import torch._inductor.config as inductor_config

        inductor_config.force_disable_caches = True


def start_variant() -> DynamoSnapshot:
    """Forgets all compiled code and compile records, and returns the counters to diff against."""
    torch.compiler.reset()
    dynamo_utils.clear_compilation_metrics()
    return snapshot()


@dataclasses.dataclass(frozen=True)
class DynamoSnapshot:
    unique_graphs: int
    graph_breaks: int


def snapshot() -> DynamoSnapshot:
    return DynamoSnapshot(
        unique_graphs=int(dynamo_utils.counters["stats"]["unique_graphs"]),
        graph_breaks=len(dynamo_utils.graph_break_reasons),
    )


def _seconds(record: Any) -> float:
    if record.start_time_us is not None and record.end_time_us is not None:
        return (record.end_time_us - record.start_time_us) / 1e6
    return float(record.entire_frame_compile_time_s or 0.0)


def _first_line(text: str | None) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""


def recompile_count() -> int:
    """Compile records since :func:`start_variant` that were recompiles (a guard failed)."""
    return sum(1 for record in dynamo_utils.get_compilation_metrics() if record.recompile_reason)


def counts_since(start: DynamoSnapshot, *, top: int = 5) -> dict[str, Any]:
    """What dynamo did since ``start``: graphs, recompiles, graph breaks, compile seconds, and reasons."""
    records = list(dynamo_utils.get_compilation_metrics())
    now = snapshot()
    recompile_reasons = Counter(_first_line(r.recompile_reason) for r in records if r.recompile_reason)
    failures = Counter(_first_line(r.fail_reason) for r in records if r.fail_type)
    break_reasons = Counter(
        _first_line(reason.reason) for reason in dynamo_utils.graph_break_reasons[start.graph_breaks :]
    )
    return {
        "compile_s": sum(_seconds(r) for r in records),
        "compile_records": len(records),
        "graphs": now.unique_graphs - start.unique_graphs,
        "recompiles": sum(recompile_reasons.values()),
        "graph_breaks": max(0, now.graph_breaks - start.graph_breaks),
        "recompile_reasons": [{"reason": r, "count": c} for r, c in recompile_reasons.most_common(top)],
        "graph_break_reasons": [{"reason": r, "count": c} for r, c in break_reasons.most_common(top)],
        "compile_failures": [{"reason": r, "count": c} for r, c in failures.most_common(top)],
    }
