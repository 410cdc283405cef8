"""What a callback variant is held to against the harness's own measurements (issues 19 and 20).

- **Telemetry error**: the callback's reported ``compile/speedup`` (its report's ``summary["speedup"]``)
  against the harness's A/B, the ``eager`` variant's steady median over the callback variant's, both
  timed by the harness's :class:`~benchmarks.measure.StepMeter`, never by the callback. Within
  :data:`TELEMETRY_TOLERANCE` passes. Where the callback variant ran an in-fit A/B (eager and compiled
  blocks in turn inside its fit, :class:`~benchmarks.measure.InFitAB`), the error against that too: it
  is the one the host's drift between variants does not bias.
- **Best whole-model anchor**: the callback's step against the fastest of eager, whole-model compile
  and whole-model ``reduce-overhead`` in the same run; at least ``1 -`` :data:`ANCHOR_MARGIN` of its
  speed passes.
- **Plain-loop ceiling** (issue 23): the callback's step against the faster of ``bare_whole`` and
  ``bare_whole_ro`` (the model compiled, trained by a plain PyTorch loop) in the same run; at most
  :data:`CEILING_LIMIT` times its step time passes.
- **Memory**: the callback variant's peak (``torch.cuda.max_memory_allocated`` over its whole fit,
  trials included) against :data:`MEMORY_FACTOR` x max(eager's peak, the kept plan's peak). The plan's
  peak is the callback's own ``memory_plan_peak_gb`` where its report has one; else the peak of the
  variant that runs the same plan (``whole`` or ``whole_ro``), a proxy the result says it used.

Variable-length workloads compare real tokens/s instead of median step times. Each check returns a
plain dict for the record (None where the variant is no callback variant); the runner stores it, the
table renders it.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.measure import speedup as ratio
from benchmarks.variants import VARIANTS
from compile_callback import regions as callback_regions
from compile_callback import reprice
from compile_callback.timing import median_interval

TELEMETRY_TOLERANCE = 0.05  # issue 20: the reported speedup within ±5% of the harness's A/B
ANCHOR_MARGIN = 0.02  # issue 20: the callback at least as fast as the best anchor, minus 2%
MEMORY_FACTOR = 1.05  # issue 19: peak ≤ 1.05 x max(eager, kept plan)
ANCHORS = ("eager", "whole", "whole_ro")
CEILING_LIMIT = 1.02  # issue 23: the callback's step at most 2% slower than the plain loop's best compile
CEILINGS = ("bare_whole", "bare_whole_ro")
# A callback variant run another way than plain `callback` is compared with the variants run that way.
EAGER_OF = {"callback_pbar": "eager_pbar"}
ANCHORS_OF = {"callback_pbar": ("eager_pbar", "whole_pbar")}
# The root region's name in the callback's decisions (``compile_callback.regions.MODEL``).
WHOLE_MODEL = getattr(callback_regions, "MODEL", "model")


def is_callback_variant(name: str) -> bool:
    variant = VARIANTS.get(name)
    return variant is not None and variant.callback is not None


def _ok(records: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    record = records.get(name)
    return record if record is not None and record.get("status") == "ok" else None


def reported_figures(record: dict[str, Any]) -> dict[str, Any]:
    """The callback's reported figures: its report's summary, with the figures as they stood when the
    steady window ended where the variant ran an in-fit A/B after it (whose eager steps went through
    the callback's hooks)."""
    callback = record.get("callback") or {}
    return {**(callback.get("summary") or {}), **(callback.get("at_window_end") or {})}


def in_fit_speedup(record: dict[str, Any]) -> float | None:
    """The speedup of the variant's in-fit A/B (:class:`benchmarks.measure.InFitAB`), None without one."""
    return (record.get("in_fit_ab") or {}).get("speedup")


def in_fit_spread(record: dict[str, Any]) -> tuple[float, float] | None:
    """Where the in-fit A/B's ABBA cycle speedups put their median (:func:`compile_callback.timing.median_interval`):
    their lowest and highest up to 7 cycles (which hold it 50% of the time with 2, 87.5% with 4, at least
    90% from 5), the outer ones dropped from 8 on, at least 90%; None with fewer than two."""
    cycles = (record.get("in_fit_ab") or {}).get("cycle_speedups") or []
    return median_interval(cycles) if len(cycles) >= 2 else None


def same_batches_speedup(record: dict[str, Any]) -> tuple[float, int, int] | None:
    """The harness's own speedup over the batches of the callback's last re-pricing round (its step times,
    CUDA events, over the round's eager and compiled blocks as :mod:`compile_callback.reprice` lays them
    out, the first step of each block not counted): the same moment the reported figure was priced at,
    timed by another clock. ``(speedup, first batch, last batch)``; None where the figure was not
    re-measured or the steps are missing."""
    figures = reported_figures(record)
    last, steps = figures.get("speedup_priced_at_batch"), record.get("step_ms_all") or []
    cycles = figures.get("speedup_priced_cycles") or reprice.MIN_CYCLES  # rounds before 2026-12-04 ran two
    length = 4 * cycles * reprice.BLOCK
    if figures.get("speedup_priced") != "re-measured" or not isinstance(last, int) or not length <= last + 1 <= len(steps):
        return None
    first = last + 1 - length
    eager, compiled = [], []
    for block in range(4 * cycles):
        start = first + block * reprice.BLOCK
        (eager if block % 4 in (0, 3) else compiled).extend(steps[start + 1:start + reprice.BLOCK])
    return ratio(statistics.median(eager), statistics.median(compiled)), first, last


def harness_speedup(record: dict[str, Any], baseline: dict[str, Any], *, by_throughput: bool) -> float | None:
    """How much faster ``record`` ran than ``baseline`` by the harness's clocks: median step times, or
    real tokens/s where shapes vary."""
    if by_throughput:
        return ratio(record.get("tokens_per_s"), baseline.get("tokens_per_s"))
    return ratio(baseline.get("median_ms"), record.get("median_ms"))


def telemetry_error(
    record: dict[str, Any], records: dict[str, dict[str, Any]], *, by_throughput: bool
) -> dict[str, Any] | None:
    """The callback's reported speedup against the harness's A/B, as a relative error.

    Returns:
        ``reported``, ``priced`` (how the callback priced it), ``harness``, ``error`` (reported / harness - 1), ``baseline`` (the eager variant
        used), ``basis``, ``tolerance`` and ``passed`` (None where a number is missing); where the variant
        ran an in-fit A/B, the same against it: ``in_fit``, ``in_fit_error``, ``in_fit_passed`` (None
        without one) and ``in_fit_cycles`` (:func:`in_fit_spread`); None for a variant
        without a callback.
    """
    if not is_callback_variant(record["variant"]) or record.get("status") != "ok":
        return None
    baseline_name = EAGER_OF.get(record["variant"], "eager")
    baseline = _ok(records, baseline_name)
    figures = reported_figures(record)
    reported = figures.get("speedup")
    harness = harness_speedup(record, baseline, by_throughput=by_throughput) if baseline else None
    error = reported / harness - 1.0 if isinstance(reported, (int, float)) and harness else None
    in_fit = in_fit_speedup(record)
    in_fit_error = reported / in_fit - 1.0 if isinstance(reported, (int, float)) and in_fit else None
    same = same_batches_speedup(record)
    return {
        "reported": reported,
        "priced": figures.get("speedup_priced"),  # "trials", "re-measured", ...: how the callback priced it
        "harness": harness,
        "error": error,
        "baseline": baseline_name,
        "basis": "real tokens/s" if by_throughput else "median step time",
        "tolerance": TELEMETRY_TOLERANCE,
        "passed": None if error is None else abs(error) <= TELEMETRY_TOLERANCE,
        "in_fit": in_fit,
        "in_fit_error": in_fit_error,
        "in_fit_passed": None if in_fit_error is None else abs(in_fit_error) <= TELEMETRY_TOLERANCE,
        "in_fit_cycles": in_fit_spread(record),
        # Information, no verdict: the reported figure against the harness's clock at the same moment.
        "same_batches": None if same is None else same[0],
        "same_batches_range": None if same is None else [same[1], same[2]],
        "same_batches_error": reported / same[0] - 1.0 if same and same[0] and isinstance(reported, (int, float)) else None,
    }


def versus_best_anchor(
    record: dict[str, Any], records: dict[str, dict[str, Any]], *, by_throughput: bool
) -> dict[str, Any] | None:
    """The callback's speed as a share of the fastest anchor's (1.0: as fast; above: faster).

    Returns:
        ``best`` (the anchor's name), ``ratio``, ``anchors`` (those that ran), ``missing`` (those that
        did not), ``margin`` and ``passed`` (ratio ≥ 1 - margin; None without an anchor); None for a
        variant without a callback.
    """
    if not is_callback_variant(record["variant"]) or record.get("status") != "ok":
        return None
    names = ANCHORS_OF.get(record["variant"], ANCHORS)
    speeds = {}
    for name in names:
        anchor = _ok(records, name)
        if anchor is not None:
            value = harness_speedup(record, anchor, by_throughput=by_throughput)
            if value is not None:
                speeds[name] = value
    missing = [name for name in names if name not in speeds]
    if not speeds:
        return {"best": None, "ratio": None, "anchors": [], "missing": missing, "margin": ANCHOR_MARGIN, "passed": None}
    best = min(speeds, key=speeds.__getitem__)  # the anchor the callback is least ahead of
    return {
        "best": best,
        "ratio": speeds[best],
        "anchors": sorted(speeds, key=names.index),
        "missing": missing,  # not run (older results, --variants): the best may be among them
        "margin": ANCHOR_MARGIN,
        "passed": speeds[best] >= 1.0 - ANCHOR_MARGIN,
    }


def versus_ceiling(
    record: dict[str, Any], records: dict[str, dict[str, Any]], *, by_throughput: bool
) -> dict[str, Any] | None:
    """The callback's step time over the plain loop's best compiled step (1.0: as fast; above: slower).

    Returns:
        ``best`` (the ceiling variant), ``step_ratio``, ``ceilings`` (those that ran), ``missing``,
        ``limit`` and ``passed`` (step_ratio ≤ limit; None where no ceiling ran); None for a variant
        without a callback.
    """
    if not is_callback_variant(record["variant"]) or record.get("status") != "ok":
        return None
    speeds = {}  # how much faster the callback ran than each ceiling (below 1: slower)
    for name in CEILINGS:
        ceiling = _ok(records, name)
        value = harness_speedup(record, ceiling, by_throughput=by_throughput) if ceiling else None
        if value:
            speeds[name] = value
    missing = [name for name in CEILINGS if name not in speeds]
    if not speeds:
        return {"best": None, "step_ratio": None, "ceilings": [], "missing": missing, "limit": CEILING_LIMIT,
                "passed": None}
    best = min(speeds, key=speeds.__getitem__)
    step_ratio = 1.0 / speeds[best]
    return {
        "best": best,
        "step_ratio": step_ratio,
        "ceilings": sorted(speeds, key=CEILINGS.index),
        "missing": missing,
        "limit": CEILING_LIMIT,
        "passed": step_ratio <= CEILING_LIMIT,
    }


def kept_plan(record: dict[str, Any]) -> tuple[str, str]:
    """What the callback ended with, from its decisions: ``("eager", ...)``, ``("whole", mode)`` or
    ``("partial", the kept regions)``."""
    kept = [d for d in (record.get("callback") or {}).get("decisions") or [] if d.get("kept")]
    if not kept:
        return "eager", "nothing kept"
    whole = [d for d in kept if WHOLE_MODEL in str(d.get("region", "")).split("+")]
    if whole:
        modes = {d.get("mode") or "default" for d in whole}
        return "whole", "reduce-overhead" if "reduce-overhead" in modes else "default"
    return "partial", ", ".join(f"{d.get('region')} ({d.get('mode')})" for d in kept)


def memory_check(record: dict[str, Any], records: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The callback variant's peak against ``MEMORY_FACTOR`` x max(eager's, the kept plan's).

    Returns:
        ``peak_gb`` (the harness's), ``eager_peak_gb``, ``plan``, ``plan_peak_gb``, ``plan_peak_source``,
        ``limit_gb``, ``passed`` (None where a peak is missing: no CUDA, or over eager's limit with the
        plan's peak unknown), what the callback reported of
        its own (``reported_*``, None where its summary has no memory keys) and the peak of the variant
        that runs the same whole-model plan (``proxy_variant``, ``proxy_plan_peak_gb``; None for an
        eager or partial plan); None for a variant without a callback.
    """
    if not is_callback_variant(record["variant"]) or record.get("status") != "ok":
        return None
    summary = reported_figures(record)
    eager = _ok(records, EAGER_OF.get(record["variant"], "eager")) or {}
    eager_peak = eager.get("peak_memory_gb")
    kind, detail = kept_plan(record)
    # The variant that runs the same plan without the callback: its peak is the plan's by the harness's
    # clock, kept beside the callback's own figure as a check of that figure.
    proxy = ("whole_ro" if detail == "reduce-overhead" else "whole") if kind == "whole" else None
    proxy_peak = (_ok(records, proxy) or {}).get("peak_memory_gb") if proxy else None
    plan_peak, source = summary.get("memory_plan_peak_gb"), "the callback's report (compile/memory/plan_peak_gb)"
    if plan_peak is None:
        if kind == "eager":
            plan_peak, source = eager_peak, "the plan is eager: eager's peak"
        elif proxy is not None:
            plan_peak = proxy_peak
            source = f"proxy: the `{proxy}` variant's peak (the same plan, compiled by model.compile())"
            if proxy_peak is None:
                source = f"proxy: the `{proxy}` variant's peak, which this run lacks (add it to --variants)"
        else:
            source = f"no proxy for a partial plan ({detail}): eager's peak alone"
    known = [value for value in (eager_peak, plan_peak) if isinstance(value, (int, float))]
    limit = MEMORY_FACTOR * max(known) if known else None
    peak = record.get("peak_memory_gb")
    passed = None if peak is None or limit is None else peak <= limit
    if passed is False and plan_peak is None:
        passed = None  # over eager's share, but the plan's peak, which may allow it, is not known
    return {
        "peak_gb": peak,
        "eager_peak_gb": eager_peak,
        "plan": f"{kind} ({detail})" if kind != "eager" else "eager",
        "plan_peak_gb": plan_peak,
        "plan_peak_source": source,
        "limit_gb": limit,
        "factor": MEMORY_FACTOR,
        "passed": passed,
        "reported_peak_gb": summary.get("memory_peak_gb"),
        "reported_eager_peak_gb": summary.get("memory_eager_peak_gb"),
        "reported_plan_peak_gb": summary.get("memory_plan_peak_gb"),
        "proxy_variant": proxy,
        "proxy_plan_peak_gb": proxy_peak,
    }


def add_checks(records: list[dict[str, Any]], *, by_throughput: bool) -> None:
    """Fills ``telemetry_error``, ``versus_best_anchor``, ``versus_ceiling`` and ``memory_check`` into every callback
    variant's record, from the records so far (run again after each variant)."""
    by_name = {record["variant"]: record for record in records}
    for record in records:
        if not is_callback_variant(record["variant"]) or record.get("status") != "ok":
            continue
        record["telemetry_error"] = telemetry_error(record, by_name, by_throughput=by_throughput)
        record["versus_best_anchor"] = versus_best_anchor(record, by_name, by_throughput=by_throughput)
        record["versus_ceiling"] = versus_ceiling(record, by_name, by_throughput=by_throughput)
        record["memory_check"] = memory_check(record, by_name)
