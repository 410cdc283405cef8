"""Markdown from the benchmark's JSON: one table per workload, and the SPEC's targets with verdicts.

    python -m benchmarks.table benchmarks/results/*.json                 # prints BENCHMARKS.md
    python -m benchmarks.table benchmarks/results/*.json --output BENCHMARKS.md

Every file gets its own section (its command, table and notes). For the targets, each workload's
newest run that measured a target answers it; a variable-length run may take its baselines (eager,
no-padding and pad-to-max compile) from another run of the same workload, which the verdict names.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import checks
from benchmarks.measure import abba_ratios, block_walls
from benchmarks.measure import speedup as ratio

MET, NOT_MET, NOT_MEASURED, NOT_APPLICABLE = "met", "**not met**", "not measured", "n/a"
SPEC_WALL_STEPS = 1000
SPEC_WALL_RATIO = 1.02  # the SPEC: the first SPEC_WALL_STEPS steps' wall time at most this times eager's ...
SPEC_WALL_BELOW_EAGER = ("gpt2",)  # ... and below eager's on these workloads
ANCHORS = ("eager", "whole", "whole_ro", "per_block")  # what "the best anchor" is chosen from
DRIFT_WARNING = 0.05  # eager's speed changed more than this between the run's start and end
WANDER_WINDOW = 100  # steps per window of eager_wander
WANDER_WARNING = 0.10  # eager's own windows spread more than this: its median is not one speed


# -- numbers ---------------------------------------------------------------------------------------
def _number(value: Any, spec: str, suffix: str = "") -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _percent(value: Any) -> str:
    return _number(value * 100 if isinstance(value, (int, float)) else None, ".1f", "%")


def records_by_variant(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {record["variant"]: record for record in result.get("records", [])}


def _by_throughput(result: dict[str, Any]) -> bool:
    return result["workload"].endswith("varlen")


def record_checks(result: dict[str, Any], record: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """A callback variant's telemetry error, best-anchor and memory checks, worked out from the run's
    records as the runner does (so results written before a check existed get it too)."""
    records = records_by_variant(result)
    by_throughput = _by_throughput(result)
    return {
        "telemetry_error": checks.telemetry_error(record, records, by_throughput=by_throughput),
        "versus_best_anchor": checks.versus_best_anchor(record, records, by_throughput=by_throughput),
        "versus_ceiling": checks.versus_ceiling(record, records, by_throughput=by_throughput),
        "memory_check": checks.memory_check(record, records),
    }


def _passed(value: bool | None) -> str:
    return "" if value is None else f" ({MET})" if value else f" ({NOT_MET})"


def telemetry_cell(check: dict[str, Any] | None) -> str:
    if not check or (check.get("error") is None and check.get("in_fit_error") is None):
        return "–"
    between = f"{check['error'] * 100:+.1f}%{_passed(check.get('passed'))}" if check.get("error") is not None else "–"
    if check.get("in_fit_error") is None:
        return between
    return f"{between}; in-fit A/B {check['in_fit_error'] * 100:+.1f}%{_passed(check.get('in_fit_passed'))}"


def anchor_cell(check: dict[str, Any] | None) -> str:
    if not check or check.get("ratio") is None:
        return "–"
    missing = f", {' / '.join(check['missing'])} not run" if check.get("missing") else ""
    return f"{check['ratio']:.3f}× {check['best']}{missing}{_passed(check.get('passed'))}"


def ceiling_cell(check: dict[str, Any] | None) -> str:
    if not check or check.get("step_ratio") is None:
        return "–"
    return f"{check['step_ratio']:.3f}× {check['best']}{_passed(check.get('passed'))}"


# -- one workload ------------------------------------------------------------------------------------
def render_table(result: dict[str, Any]) -> str:
    """The workload's table: one row per variant."""
    varlen = result["workload"].endswith("varlen")
    language = any("tokens_per_s" in record for record in result.get("records", []))
    total = result.get("settings", {}).get("total_steps")
    throughput = "real tokens/s" if varlen else "tokens/s" if language else "images/s"
    columns = [
        "variant", "median ms", "p90 ms", "speedup vs eager", f"first {total} steps wall s", "compile s",
        "graphs", "recompiles", "graph breaks", throughput, "MFU", "peak GB", "reported speedup",
        f"telemetry error (±{checks.TELEMETRY_TOLERANCE:.0%})",
        f"vs best of {' / '.join(checks.ANCHORS)} (≥ −{checks.ANCHOR_MARGIN:.0%})",
        f"step vs plain-loop ceiling (≤ {checks.CEILING_LIMIT}×)",
    ]
    if varlen:
        columns += ["recompiles after epoch 1", "padding waste"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for record in result.get("records", []):
        if record.get("status") != "ok":
            cells = [record["variant"], f"{record.get('status')}: {record.get('reason') or record.get('error', '')}"]
            cells += [""] * (len(columns) - len(cells))
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
            continue
        rate = record.get("tokens_per_s") if language else record.get("samples_per_s")
        checked = record_checks(result, record)
        reported = checks.reported_figures(record).get("speedup")
        cells = [
            record["variant"],
            _number(record.get("median_ms"), ".2f"),
            _number(record.get("p90_ms"), ".2f"),
            _number(record.get("speedup_vs_eager"), ".3f", "×"),
            _number(record.get("wall_first_steps_s"), ".1f"),
            _number(record.get("compile_s"), ".1f"),
            _number(record.get("graphs"), "d"),
            _number(record.get("recompiles"), "d"),
            _number(record.get("graph_breaks"), "d"),
            _number(rate, ",.0f"),
            _percent(record.get("mfu")),
            _number(record.get("peak_memory_gb"), ".2f"),
            _number(reported, ".3f", "×"),
            telemetry_cell(checked["telemetry_error"]),
            anchor_cell(checked["versus_best_anchor"]),
            ceiling_cell(checked["versus_ceiling"]),
        ]
        if varlen:
            cells += [_number(record.get("recompiles_after_first_epoch"), "d"), _percent(record.get("padding_waste"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:300]


def host_drift(records: dict[str, dict[str, Any]], *, by_throughput: bool) -> float | None:
    """How much faster eager ran at the end of the run (``eager_end``) than at its start (``eager``):
    1.0 is a steady host; 0.8 means the host ran eager 20% slower by the end. Host-bound comparisons
    between variants that ran far apart are only as good as this."""
    start, end = _ok(records, "eager"), _ok(records, "eager_end")
    if start is None or end is None:
        return None
    if by_throughput:
        return ratio(end.get("tokens_per_s"), start.get("tokens_per_s"))
    return ratio(start.get("median_ms"), end.get("median_ms"))


def eager_wander(records: dict[str, dict[str, Any]]) -> tuple[float, float] | None:
    """The slowest and fastest median of eager's own :data:`WANDER_WINDOW`-step windows (``eager`` and
    ``eager_end``, each one's first window left out: compiles, warm-up), or None with fewer than two.
    The drift compares two points; on a host-bound step eager also wanders between them (ResNet-18
    CIFAR on the H200: 7.0-10.5 ms windows in one 2000-step variant whose start and end agreed within 1.4%)."""
    medians = []
    for name in ("eager", "eager_end"):
        steps = (_ok(records, name) or {}).get("step_ms_all") or []
        medians += [statistics.median(steps[i:i + WANDER_WINDOW])
                    for i in range(WANDER_WINDOW, len(steps) - WANDER_WINDOW + 1, WANDER_WINDOW)]
    return (min(medians), max(medians)) if len(medians) >= 2 else None


def wander_verdict(wander: tuple[float, float] | None) -> str | None:
    """Inconclusive where eager's own windows spread more than :data:`WANDER_WARNING`, else None."""
    if wander is None or wander[1] <= wander[0] * (1 + WANDER_WARNING):
        return None
    return (f"inconclusive (eager's own {WANDER_WINDOW}-step medians ranged {wander[0]:.2f}-{wander[1]:.2f} ms "
            f"within the run)")


def render_drift(result: dict[str, Any]) -> str | None:
    records = records_by_variant(result)
    drift = host_drift(records, by_throughput=result["workload"].endswith("varlen"))
    if drift is None:
        return None
    line = f"- host drift: eager's speed changed by {drift - 1:+.1%} from the run's start to its end (`eager_end`)"
    if abs(drift - 1) > DRIFT_WARNING:
        line += "; the host's speed changed during the run, so host-bound differences of that size between variants are noise"
    return line


def render_notes(result: dict[str, Any]) -> str:
    """What the callback decided, and the reasons dynamo gave for recompiles and graph breaks."""
    notes = [line for line in (render_drift(result),) if line]
    for record in result.get("records", []):
        callback = record.get("callback")
        if callback:
            notes += render_checks(result, record)
            notes.append(f"- `{record['variant']}` decisions:")
            for decision in callback.get("decisions", []):
                kept = "kept" if decision.get("kept") else "reverted"
                notes.append(
                    f"  - {decision.get('region')} ({decision.get('mode')}): {kept}, {decision.get('reason')}"
                )
            if not callback.get("decisions"):
                notes.append("  - none")
            plan = callback.get("plan") or {}
            if plan.get("frozen") is False:
                notes.append("  - the plan was still changing at the end: the steady window may hold trial steps")
            for note in plan.get("notes", []):
                notes.append(f"  - note: {note}")
            anatomy = callback.get("anatomy") or {}
            if anatomy.get("graph_coverage") is not None:
                notes.append(f"  - anatomy: {render_anatomy(anatomy)}")
        for key, label in (("recompile_reasons", "recompiles"), ("graph_break_reasons", "graph breaks")):
            for item in record.get(key) or []:
                notes.append(f"- `{record['variant']}` {label}: {item['count']} × {_cell(item['reason'])}")
    return "\n".join(notes)


def render_checks(result: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """A callback variant's telemetry error, best anchor, memory and steady window, one line each."""
    name = record["variant"]
    checked = record_checks(result, record)
    lines = []
    telemetry = checked["telemetry_error"]
    if telemetry:
        lines.append(
            f"- `{name}` telemetry: reported `compile/speedup` {_number(telemetry.get('reported'), '.3f', '×')} against "
            f"the harness's {_number(telemetry.get('harness'), '.3f', '×')} (`{telemetry.get('baseline')}` over "
            f"`{name}`, {telemetry.get('basis')}): error {telemetry_cell({**telemetry, 'in_fit_error': None})}, tolerance "
            f"±{telemetry.get('tolerance', checks.TELEMETRY_TOLERANCE):.0%}"
        )
        ab = record.get("in_fit_ab") or {}
        if ab.get("speedup") is not None:
            cycles = ab.get("cycle_speedups") or []
            spread = f", its ABBA cycles {min(cycles):.3f}-{max(cycles):.3f}×" if cycles else ""
            lines.append(
                f"- `{name}` in-fit A/B ({ab.get('blocks')} blocks of {ab.get('block_steps')} steps after the steady "
                f"window, eager by `torch.compiler.set_stance('force_eager')`, ABBA): eager {_number(ab.get('eager_ms'), '.2f')} ms, "
                f"compiled {_number(ab.get('compiled_ms'), '.2f')} ms, {_number(ab.get('speedup'), '.3f', '×')}{spread}; "
                f"reported against it: {_number(telemetry.get('in_fit_error'), '+.1%')}{_passed(telemetry.get('in_fit_passed'))}"
            )
        if telemetry.get("same_batches") is not None:
            first, last = telemetry["same_batches_range"]
            lines.append(
                f"- `{name}` the same batches as its last re-pricing round ({first}-{last}, the harness's step times over "
                f"its eager and compiled blocks): {_number(telemetry.get('same_batches'), '.3f', '×')}; reported "
                f"against it: {_number(telemetry.get('same_batches_error'), '+.1%')} (the same moment by another clock; "
                "no verdict)"
            )
    anchor = checked["versus_best_anchor"]
    if anchor:
        lines.append(
            f"- `{name}` against the best of {', '.join(anchor.get('anchors') or []) or 'no anchor that ran'}: "
            f"{anchor_cell(anchor)} (at least {1 - anchor.get('margin', checks.ANCHOR_MARGIN):.2f}× passes)"
        )
    ceiling = checked["versus_ceiling"]
    if ceiling and ceiling.get("step_ratio") is not None:
        lines.append(
            f"- `{name}` against the plain-loop ceiling ({', '.join(ceiling['ceilings'])}): step {ceiling_cell(ceiling)} "
            f"(at most {ceiling.get('limit', checks.CEILING_LIMIT)}× passes)"
        )
    memory = checked["memory_check"]
    if memory:
        if memory.get("peak_gb") is None:
            lines.append(f"- `{name}` memory: not measured (no CUDA memory statistics on this device)")
        else:
            lines.append(
                f"- `{name}` memory: peak {_number(memory.get('peak_gb'), '.2f', ' GB')} against "
                f"{memory.get('factor', checks.MEMORY_FACTOR)} × max(eager {_number(memory.get('eager_peak_gb'), '.2f', ' GB')}, "
                f"kept plan {_number(memory.get('plan_peak_gb'), '.2f', ' GB')}) = {_number(memory.get('limit_gb'), '.2f', ' GB')}"
                f"{_passed(memory.get('passed'))}; plan {memory.get('plan')}, its peak from {memory.get('plan_peak_source')}"
            )
        reported = [(label, memory.get(key)) for label, key in (
            ("peak", "reported_peak_gb"), ("eager peak", "reported_eager_peak_gb"), ("plan peak", "reported_plan_peak_gb"))]
        if any(value is not None for _, value in reported):
            harness = (f"; the harness's: peak {_number(memory.get('peak_gb'), '.2f', ' GB')}, eager "
                       f"{_number(memory.get('eager_peak_gb'), '.2f', ' GB')}")
            if memory.get("proxy_variant"):
                harness += f", `{memory['proxy_variant']}` (the same plan) {_number(memory.get('proxy_plan_peak_gb'), '.2f', ' GB')}"
            lines.append("  - the callback's own memory figures: "
                         + ", ".join(f"{label} {_number(value, '.2f', ' GB')}" for label, value in reported) + harness)
    if record.get("window_after_plan_frozen") is False:
        lines.append(
            f"- `{name}`: **the steady window holds steps before the plan froze** (frozen at step "
            f"{record.get('plan_frozen_at_step')} of {record.get('steps_run')}): run with a larger --total-steps"
        )
    elif record.get("plan_frozen_at_step") is not None:
        lines.append(
            f"- `{name}`: plan frozen at step {record['plan_frozen_at_step']}; the steady window is steps "
            f"{record['steps_run'] - record['steps_measured'] + 1}–{record['steps_run']} of {record['steps_run']}"
        )
    return lines


def render_anatomy(anatomy: dict[str, Any]) -> str:
    """One line: graph and backend coverage, fallback kernels, guard cost, compile split, break-even."""
    fallbacks = ", ".join(f"`{name}` ×{n}" for name, n in (anatomy.get("fallback_kernels") or {}).items()) or "none"
    return (
        f"graph coverage {_percent(anatomy.get('graph_coverage'))} "
        f"({_number(anatomy.get('eager_ops'), '.0f')} of {_number(anatomy.get('step_ops'), '.0f')} ops eager), "
        f"backend coverage {_percent(anatomy.get('backend_coverage'))}, fallback kernels per step: {fallbacks}; "
        f"guards {_number(anatomy.get('guard_checks'), '.0f')} checks × {_number(anatomy.get('guard_us_per_call'), '.1f')} µs "
        f"({_percent(anatomy.get('guard_share'))} of the step; torch's own figure at compile "
        f"{_number(anatomy.get('guard_latency_us_at_compile'), '.1f')} µs); compile split dynamo "
        f"{_number(anatomy.get('dynamo_s'), '.1f')} s / AOTAutograd {_number(anatomy.get('aot_autograd_s'), '.1f')} s / "
        f"Inductor {_number(anatomy.get('inductor_s'), '.1f')} s, cache hit rate {_percent(anatomy.get('cache_hit_rate'))}; "
        f"break-even after {_number(anatomy.get('break_even_steps'), '.0f')} steps"
    )


def render_result(result: dict[str, Any]) -> str:
    """The Markdown written next to a result's JSON: how it was made, the table, and the notes."""
    settings = result.get("settings", {})
    lines = [
        f"### {result['workload']}{' (smoke)' if result.get('smoke') else ''}"
        f"{'' if result.get('complete', True) else ' (incomplete: the run stopped before its last variant)'}"
        f"{f' (experiment: {experiment(result)}; answers no target)' if is_experiment(result) else ''}",
        "",
        f"`{result.get('command', 'python -m benchmarks')}`",
        "",
        f"{result.get('description', '')}. {result.get('device')}, torch {result.get('torch')}, "
        f"lightning {result.get('lightning')}, {settings.get('precision')}, {result.get('date')}. "
        f"Every variant ran {settings.get('total_steps')} steps{render_longer_runs(result)}; median and p90 over the last "
        f"{settings.get('measured_steps')}; the Trainer planned for {settings.get('planned_steps')} steps."
        f"{render_memory_cap(settings)}{render_caches(settings)}",
        "",
        render_table(result),
    ]
    pairs = render_pairs(result)
    if pairs:
        lines += ["", pairs]
    notes = render_notes(result)
    if notes:
        lines += ["", notes]
    return "\n".join(lines) + "\n"


def render_pairs(result: dict[str, Any]) -> str:
    """A ``--pairs`` run's pairs: each paired run's wall time over the run's steps against the eager runs either
    side (the paired variant is the one that alternates with eager: ``callback``, or an experiment's)."""
    settings = result.get("settings") or {}
    if not settings.get("pairs"):
        return ""
    name = paired_variant(result)
    steps = settings.get("total_steps")
    lines = [f"Pairs (`--pairs`: eager and `{name}` in turn, each `{name}` run's first {steps} steps against the "
             "eager runs either side of it):"]
    left = [f"{r['variant']} run {index + 1}" for index, r in enumerate(result.get("records", []))
            if r.get("compile_processes_left")]
    if left:  # a compile of the run before still going: that run's pair is flattered
        lines[0] += f" **compile processes of an earlier run still running at the start of {', '.join(left)}**"
    for number, pair in enumerate(paired_walls(result, steps, name), 1):
        lines.append(f"- pair {number}: {pair['wall_s']:.2f} s against eager {pair['eager_before_s']:.2f} s before and "
                     f"{pair['eager_after_s']:.2f} s after: {pair['ratio']:.3f}× (eager moved {pair['eager_move']:+.1%}; "
                     f"the eager run after it waited {pair['waited_after_s']:.1f} s for its compile processes to end"
                     f"{_thread_line(pair['thread']) if 'thread' in pair else ''})")
    windows = paired_windows(result, name)
    if windows:
        lines.append(f"- `{name}` against the eager runs either side, {PAIR_WINDOW} steps at a time from the start "
                     f"(median over the pairs): {', '.join(f'{w:.3f}×' for w in windows)}")
    threads = paired_thread_windows(result, name)
    if threads:
        lines.append(f"- `{name}`'s training thread CPU against the eager runs' either side, {PAIR_WINDOW} steps at a "
                     f"time (median over the pairs): {', '.join(f'{w:.3f}×' for w in threads)}")
    stages = paired_child_stages(result, name)
    if stages:
        lines.append(f"- `{name}` against the eager runs either side, by what its background child was doing (median "
                     "over the pairs; steps of the first pair): " + ", ".join(
                         f"{s['stage']} {s['ratio']:.3f}× (steps {s['steps'][0]}-{s['steps'][1]}, {s['pairs']} pairs)"
                         for s in stages))
    pauses = paired_child_pauses(result, name)
    if pauses:
        lines.append(
            f"- `{name}`'s child stopped and continued inside each run (ABBA blocks of {pauses['block_steps']} steps from "
            f"step {pauses['first']}; the running blocks' wall against the stopped ones'): by run "
            f"{', '.join(_number(r, '.3f') + '×' for r in pauses['per_run'])}; over all {pauses['cycles']} cycles "
            f"{_number(pauses['ratio'], '.3f')}× ({pauses['without_a_process']} cycles left out: nothing to stop); "
            f"the eager runs' same blocks, nothing stopped: {_number(pauses['eager_ratio'], '.3f')}× over "
            f"{pauses['eager_cycles']} cycles")
    return "\n".join(lines)


def paired_variant(result: dict[str, Any]) -> str:
    """The variant a ``--pairs`` run alternates with eager: the first record's that is not eager's (``callback``
    where the run has none)."""
    return next((r["variant"] for r in result.get("records", []) if r.get("variant") != "eager"), "callback")


def render_longer_runs(result: dict[str, Any]) -> str:
    """Which callback variants ran past ``total_steps`` so that their steady window followed the plan's freeze."""
    total = result.get("settings", {}).get("total_steps")
    longer = [f"`{r['variant']}` {r['steps_run']}" for r in result.get("records", [])
              if isinstance(total, int) and isinstance(r.get("steps_run"), int) and r["steps_run"] > total]
    if not longer:
        return ""
    return f" ({', '.join(longer)}: run on until the steady window held only steps after the plan froze)"


def render_caches(settings: dict[str, Any]) -> str:
    """The compile caches' setting where it is not the default (off, every variant cold in-process)."""
    caches = settings.get("compile_caches")
    if not caches or caches.startswith("disabled"):
        return ""
    return f" Compile caches {caches}."


def render_memory_cap(settings: dict[str, Any]) -> str:
    cap = settings.get("memory_cap_gb")
    if cap is None:
        return ""
    return (
        f" CUDA memory capped at {cap:g} GiB (`set_per_process_memory_fraction({settings.get('memory_fraction', 0):.4f})` "
        f"of {_number(settings.get('device_memory_gb'), '.1f')} GiB)."
    )


# -- targets -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Verdict:
    workload: str
    target: str
    measured: str
    verdict: str


def _is_measurement(result: dict[str, Any]) -> str | None:
    """Why a result cannot be held to the SPEC's H200 targets, or None."""
    if result.get("smoke"):
        return "n/a (smoke run)"
    if not result.get("gpu"):
        return "n/a (not on a GPU)"
    return None


def _not_steady(record: dict[str, Any] | None) -> str | None:
    """Why a callback variant's speed answers no target, or None: its plan froze after its steady window
    began, so that window timed trials and compiles, not the plan (its memory and counts still answer)."""
    if record is None or record.get("window_after_plan_frozen") is not False:
        return None
    return (f"{NOT_APPLICABLE} (plan frozen at step {record.get('plan_frozen_at_step')} of "
            f"{record.get('steps_run')}: no steady window)")


def _cut_short(record: dict[str, Any] | None) -> str | None:
    """Why a callback variant's speed answers no steady-state speed target (the anchors' speedups, the aim,
    the MFU), or None: the run's length decided its plan. Its search skipped candidates, or the CUDA-graph
    trial, because the batches left could not repay them (a 1000-step GPT-2 run keeps its blocks, 1.13x, where
    the whole model with CUDA graphs, 1.25x, repays in a longer one): the plan a run that short should
    keep, not the workload's steady one. Its telemetry, memory, wall time and stall still answer."""
    callback = (record or {}).get("callback") or {}
    skipped = [d.get("region") for d in callback.get("decisions") or []
               if str(d.get("reason", "")).startswith("skipped: ")
               and ("batches left" in d["reason"] or "the run ends" in d["reason"])]
    graphs = any(str(n).startswith("reduce-overhead (CUDA graphs) not tried: the ")
                 for n in (callback.get("plan") or {}).get("notes") or [])
    if not skipped and not graphs:
        return None
    what = ", ".join(f"`{name}`" for name in dict.fromkeys(skipped)) or "CUDA graphs"
    return f"{NOT_APPLICABLE} (a plan cut short by the run's length: {what} skipped for the batches left)"


def _ok(records: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    record = records.get(name)
    return record if record is not None and record.get("status") == "ok" else None


def _verdict(passed: bool | None) -> str:
    return NOT_MEASURED if passed is None else MET if passed else NOT_MET


SPEEDUP_TARGETS = {"gpt2": (1.31, 1.35), "resnet50": (1.24, 1.28), "resnet18_cifar": (3.4, 3.6)}
GPT_AIM_COMPILE_S = 15.0
GPT_MFU = 0.45
GPT_STALL_S = 5.0  # SPEC: the training loop waits for the compiler ≤ 5 s on a cold GPT-2 run
VARLEN_PADDING_WASTE = 0.15
CEILING_WORKLOADS = ("gpt2", "resnet50")  # issue 23's: the callback within 2% of the plain loop's best compile


def background_seconds(record: dict[str, Any] | None) -> float | None:
    """The seconds the callback's background children compiled and checked candidates (compiling that
    stalled nothing, so not in the record's ``compile_s``); None where no child finished."""
    decisions = ((record or {}).get("callback") or {}).get("decisions") or []
    seconds = [d["background_s"] for d in decisions if d.get("background_s") is not None]
    return sum(seconds) if seconds else None


def evaluate_targets(result: dict[str, Any], peers: Sequence[dict[str, Any]] = ()) -> list[Verdict]:
    """The SPEC's targets for ``CompileCallback()`` that this workload's result can answer.

    ``peers``: other runs of the same workload, where a variable-length run finds baselines it lacks.
    """
    workload = result["workload"]
    if (result.get("settings") or {}).get("pairs"):  # --pairs: a first-steps wall-time A/B and nothing else
        return [_paired_wall_time_verdict(result)] if workload in SPEEDUP_TARGETS else []
    records = records_by_variant(result)
    callback = _ok(records, "callback")
    invalid = _is_measurement(result)
    not_steady = _not_steady(callback)
    verdicts: list[Verdict] = []
    drift = host_drift(records, by_throughput=workload.endswith("varlen"))
    order = [record.get("variant") for record in result.get("records", [])]

    cut_short = _cut_short(callback)

    def add(target: str, measured: str, passed: bool | None, *, between_variants: bool = True,
            steady_speed: bool = False) -> None:
        # A comparison between variants that ran at different times is only as good as the host's
        # steadiness. These compare the callback with eager.
        unsteady = None
        if between_variants and passed is not None:
            unsteady = drift_verdict(drift, passed=passed, ran_later=ran_after(order, "callback", ["eager"]),
                                     ran_earlier=ran_before(order, "callback", ["eager"]))
        short = cut_short if steady_speed else None
        verdicts.append(Verdict(workload, target, measured, invalid or not_steady or short or unsteady or _verdict(passed)))

    speedup = callback.get("speedup_vs_eager") if callback else None
    if workload in SPEEDUP_TARGETS:
        floor, aim = SPEEDUP_TARGETS[workload]
        add(f"callback speedup ≥ {floor}× (best anchor)", _number(speedup, ".3f", "×"),
            None if speedup is None else speedup >= floor, steady_speed=True)
        compile_s = callback.get("compile_s") if callback else None
        child_s = background_seconds(callback)
        if compile_s is not None:
            compile_s += child_s or 0.0
        if workload == "gpt2":
            add(f"aim: ≥ {aim}× with ≤ {GPT_AIM_COMPILE_S:.0f} s compiling",
                f"{_number(speedup, '.3f', '×')}, {_number(compile_s, '.1f', ' s')}"
                + (f" ({child_s:.1f} s of it in a background child)" if child_s else ""),
                None if speedup is None or compile_s is None else speedup >= aim and compile_s <= GPT_AIM_COMPILE_S,
                steady_speed=True)
            value = callback.get("mfu") if callback else None
            add(f"MFU ≥ {GPT_MFU:.0%} (6N + attention, 989 TFLOP/s)", _percent(value),
                None if value is None else value >= GPT_MFU, between_variants=False, steady_speed=True)
            verdicts.append(_stall_verdict(workload, callback, invalid or not_steady,
                                           (result.get("settings") or {}).get("compile_caches")))
        else:
            add(f"aim: ≥ {aim}×", _number(speedup, ".3f", "×"), None if speedup is None else speedup >= aim,
                steady_speed=True)
    drift_text = f" (eager drifted {drift - 1:+.1%} by the run's end)" if drift is not None else ""
    add("callback never slower than eager", _number(speedup, ".3f", "×") + drift_text,
        None if speedup is None else speedup >= 1.0)
    verdicts.extend(_check_verdicts(result, callback, invalid or not_steady, invalid, drift, eager_wander(records), order))
    if workload in SPEEDUP_TARGETS:
        verdicts.append(_wall_time_verdict(workload, records, invalid, (result.get("settings") or {}).get("compile_caches"),
                                           drift=drift, order=order))
    if workload.endswith("varlen"):
        verdicts.extend(_varlen_verdicts(workload, records, invalid, peers, drift, order))
    return verdicts


def _check_verdicts(
    result: dict[str, Any], callback: dict[str, Any] | None, speed_invalid: str | None, invalid: str | None,
    drift: float | None, wander: tuple[float, float] | None, order: Sequence[str],
) -> list[Verdict]:
    """Issue 20's telemetry error and best-anchor targets, issue 23's ceiling and issue 19's memory target,
    for ``callback``; ``speed_invalid`` (also a plan frozen inside the steady window) holds for all but memory."""
    workload = result["workload"]
    checked = record_checks(result, callback) if callback else {}
    telemetry = checked.get("telemetry_error") or {}
    anchor = checked.get("versus_best_anchor") or {}
    memory = checked.get("memory_check") or {}
    verdicts = []

    passed = telemetry.get("passed")
    # How the callback priced it: a trial early in the run goes stale where the host drifts (issue 20).
    priced = f" ({PRICED.get(telemetry['priced'], telemetry['priced'])})" if telemetry.get("priced") else ""
    measured = (
        f"{_number(telemetry.get('reported'), '.3f', '×')} reported{priced} vs "
        f"{_number(telemetry.get('harness'), '.3f', '×')} harness: {_number(telemetry.get('error'), '+.1%')}"
    ) if telemetry else "–"
    if telemetry.get("in_fit") is not None:
        measured += f"; vs {_number(telemetry.get('in_fit'), '.3f', '×')} in-fit A/B: {_number(telemetry.get('in_fit_error'), '+.1%')}"
    if telemetry.get("same_batches") is not None:  # information: the reported figure's own moment, another clock
        measured += (f"; vs {_number(telemetry.get('same_batches'), '.3f', '×')} on its re-pricing round's batches: "
                     f"{_number(telemetry.get('same_batches_error'), '+.1%')}")
    verdicts.append(Verdict(
        workload, f"callback `compile/speedup` within ±{checks.TELEMETRY_TOLERANCE:.0%} of the harness's A/B",
        measured, speed_invalid or telemetry_verdict(telemetry, drift, wander)))

    passed = anchor.get("passed")
    best = anchor.get("best")
    missing = f" ({' / '.join(anchor['missing'])} not run)" if anchor.get("missing") else ""
    measured = f"{_number(anchor.get('ratio'), '.3f', '×')} of {best}{missing}" if best else "–"
    unsteady = drift_verdict(drift, passed=passed, ran_later=ran_after(order, "callback", [best]),
                                 ran_earlier=ran_before(order, "callback", [best])) if best else None
    if not set(anchor.get("anchors") or ()) - {"eager"}:
        # Beating eager alone says nothing of the compiles it must beat: a run that has them answers.
        passed, unsteady = None, None
    verdicts.append(Verdict(
        workload, f"callback ≥ best of {' / '.join(checks.ANCHORS)} − {checks.ANCHOR_MARGIN:.0%}", measured,
        speed_invalid or unsteady or _verdict(passed)))

    if workload in CEILING_WORKLOADS:
        ceiling = checked.get("versus_ceiling") or {}
        passed = ceiling.get("passed")
        best = ceiling.get("best")
        measured = f"{_number(ceiling.get('step_ratio'), '.3f', '×')} of {best}'s step" if best else "– (not run)"
        unsteady = drift_verdict(drift, passed=passed, ran_later=ran_after(order, "callback", [best]),
                                 ran_earlier=ran_before(order, "callback", [best])) if best else None
        verdicts.append(Verdict(
            workload, f"callback step ≤ {checks.CEILING_LIMIT}× the plain-loop ceiling ({' / '.join(checks.CEILINGS)})",
            measured, speed_invalid or unsteady or _verdict(passed)))

    passed = memory.get("passed")
    measured = (
        f"{_number(memory.get('peak_gb'), '.2f', ' GB')} vs {_number(memory.get('limit_gb'), '.2f', ' GB')} "
        f"(eager {_number(memory.get('eager_peak_gb'), '.2f')}, plan {_number(memory.get('plan_peak_gb'), '.2f')}: "
        f"{memory.get('plan_peak_source')})"
    ) if memory.get("peak_gb") is not None else "–"
    verdicts.append(Verdict(
        workload, f"callback peak memory ≤ {checks.MEMORY_FACTOR} × max(eager, kept plan)", measured,
        invalid or _verdict(passed)))
    return verdicts


# What the callback's summary says of how it priced compile/speedup (compile_callback.run), as a table says it.
PRICED = {"trials": "priced by its trials", "re-measured": "re-measured late in the run",
          "shape by shape": "eager median of each shape over the latest steps",
          "medians": "eager baseline median over the latest steps", "nothing compiled": "nothing compiled"}


def telemetry_verdict(telemetry: dict[str, Any], drift: float | None,
                      wander: tuple[float, float] | None = None) -> str:
    """Issue 20's telemetry verdict. The A/B between variants compares two that ran at different times,
    so it is only as good as the host: where eager drifted over the run, or wandered within its own
    run (:func:`eager_wander`), it is inconclusive, and an in-fit A/B (eager and compiled blocks in turn
    inside the callback's own fit, which a drift puts on both sides alike) answers alone, saying so.
    An in-fit A/B whose own ABBA cycles read further apart than the tolerance measured a host that
    moved within it (session 16: ResNet-18 CIFAR's cycles 2.305x and 2.811x): it answers only where
    the whole interval of its cycles (:func:`benchmarks.checks.in_fit_spread`: their lowest and highest
    up to 7 cycles, from 8 without the outer ones) and the A/B's pooled medians give the
    same verdict (session 26: reported 2.456x, cycles 2.398x and 2.536x, +2.4% and -3.2%, pooled 2.515x:
    met whichever stands), else nothing. Otherwise both must pass where both exist."""
    passed, in_fit = telemetry.get("passed"), telemetry.get("in_fit_passed")
    unsteady = (drift_verdict(drift) or wander_verdict(wander)) if passed is not None else None
    cycles = telemetry.get("in_fit_cycles")
    if in_fit is not None and cycles and cycles[1] > cycles[0] * (1 + checks.TELEMETRY_TOLERANCE):
        every = _every_cycle(telemetry.get("reported"), cycles)
        if every is None or every != in_fit:  # the ratio of pooled medians need not lie between the cycles
            moved = f"in-fit A/B inconclusive (its cycles' interval {cycles[0]:.3f}-{cycles[1]:.3f}×)"
            return f"{unsteady or _verdict(passed)}; {moved}"
        if unsteady:
            return (f"{_verdict(every)} by the whole interval of the in-fit A/B's cycles ({cycles[0]:.3f}-{cycles[1]:.3f}×; "
                    f"between variants: {unsteady})")
        return _verdict(every if passed is None else passed and every)
    if in_fit is None:
        return unsteady or _verdict(passed)
    if unsteady:
        return f"{_verdict(in_fit)} by the in-fit A/B (between variants: {unsteady})"
    return _verdict(in_fit if passed is None else passed and in_fit)


def _every_cycle(reported: Any, cycles: Sequence[float]) -> bool | None:
    """Whether the ``reported`` speedup is within the tolerance of the whole interval of the in-fit A/B's
    cycles (True), outside it on the same side of all of it (False), or either, by where in it the truth
    lies (None). ``cycles``: the interval's ends; the error is monotonic in the speedup, so they decide."""
    if not isinstance(reported, (int, float)):
        return None
    errors = [reported / cycle - 1.0 for cycle in cycles]
    if all(abs(error) <= checks.TELEMETRY_TOLERANCE for error in errors):
        return True
    if min(errors) > checks.TELEMETRY_TOLERANCE or max(errors) < -checks.TELEMETRY_TOLERANCE:
        return False
    return None


def ran_after(order: Sequence[str], name: str, others: Sequence[str]) -> bool:
    """Whether ``name`` ran after every one of ``others`` in the run (``order``: the variants as they ran)."""
    return name in order and all(other in order and order.index(other) < order.index(name) for other in others)


def ran_before(order: Sequence[str], name: str, others: Sequence[str]) -> bool:
    """Whether ``name`` ran before every one of ``others`` in the run (``order``: the variants as they ran)."""
    return ran_after(list(reversed(order)), name, others)


def drift_verdict(
    drift: float | None, *, passed: bool | None = None, ran_later: bool = False, ran_earlier: bool = False,
) -> str | None:
    """The verdict of a comparison between variants when eager's speed drifted beyond
    :data:`DRIFT_WARNING` during the run (``eager`` against ``eager_end``), else None.

    Inconclusive, except where the drift worked against the winner: the variant that passed ran after
    every variant it was compared with (``ran_later``) and eager ran slower at the run's end than at
    its start, or it ran before every one of them (``ran_earlier``) and eager ran faster at the end.
    The drift is measured at those two points only, so this assumes it grew during the run rather
    than came and went (a slowing or settling host does; so does an earlier variant's after-effect on
    the variants that follow it, BENCHMARKS.md); the verdict says so."""
    if drift is None or abs(drift - 1) <= DRIFT_WARNING:
        return None
    if passed and ran_later and drift < 1:
        return f"{MET} if the slowdown only grew (it ran after what it beat; eager {1 - drift:.1%} slower by the run's end)"
    if passed and ran_earlier and drift > 1:
        return (f"{MET} if the speed-up only grew (it ran before what it matched; eager {drift - 1:.1%} faster "
                "by the run's end)")
    return f"inconclusive (host drift {drift - 1:+.1%})"


CACHES_DISABLED = " with compile caches disabled (run with --compile-caches fresh: torch's default has them on)"


def _caches_disabled(caches: str | None) -> bool:
    """Whether a run's ``compile_caches`` setting had Inductor's caches off: the callback then compiles
    in-process, a route a user's run takes only with caches off (no background child to hand over)."""
    return caches is not None and caches.startswith("disabled")


def _stall_verdict(workload: str, callback: dict[str, Any] | None, invalid: str | None, caches: str | None) -> Verdict:
    """The SPEC's "the training loop waits for the compiler ≤ 5 s on a cold GPT-2 run": the callback's
    ``compile/stall_s``. Cold is a machine with no compile caches, as ``--compile-caches fresh`` makes one
    (torch's default has the caches on); with the harness's default (caches disabled) the callback cannot
    hand a compile over from a background child and stalls for all of it, a route a user's run takes only
    with caches off: not measured, as :func:`_wall_time_verdict`."""
    target = f"training loop waits for the compiler ≤ {GPT_STALL_S:.0f} s (cold)"
    stall = checks.reported_figures(callback).get("stall_s") if callback else None
    measured = _number(stall, ".1f", " s") + " (the callback's `compile/stall_s`)"
    if stall is not None and _caches_disabled(caches):
        return Verdict(workload, target, f"{stall:.1f} s{CACHES_DISABLED}", invalid or NOT_MEASURED)
    return Verdict(workload, target, measured, invalid or _verdict(None if stall is None else stall <= GPT_STALL_S))


def _wall_time_verdict(workload: str, records: dict[str, dict[str, Any]], invalid: str | None,
                       caches: str | None = None, *, drift: float | None = None, order: Sequence[str] = ()) -> Verdict:
    """The SPEC's first-steps wall time, from a run with Inductor's caches on (``caches``: the run's
    ``compile_caches`` setting): torch's default, where the callback may compile in a background child.
    With the harness's default (caches disabled, to keep variants from each other's compiles) the callback
    compiles in-process, a route a user's run takes only with caches off: not measured. Where eager
    drifted during the run, as every comparison between variants: :func:`drift_verdict`. The SPEC's bound:
    at most :data:`SPEC_WALL_RATIO` times eager's wall time, and below it on the workloads of
    :data:`SPEC_WALL_BELOW_EAGER`."""
    below = workload in SPEC_WALL_BELOW_EAGER
    target = (f"first {SPEC_WALL_STEPS} steps wall time below eager's" if below
              else f"first {SPEC_WALL_STEPS} steps wall time ≤ {SPEC_WALL_RATIO:.2f}× eager's")

    def wall(record: dict[str, Any] | None) -> float | None:
        return (record or {}).get("wall_s_at_step", {}).get(str(SPEC_WALL_STEPS))

    callback_wall, eager_wall = wall(_ok(records, "callback")), wall(_ok(records, "eager"))
    if callback_wall is None or eager_wall is None:
        return Verdict(workload, target, f"(run with --total-steps {SPEC_WALL_STEPS})", invalid or NOT_MEASURED)
    if _caches_disabled(caches):
        return Verdict(workload, target, f"{callback_wall:.1f} s{CACHES_DISABLED}", invalid or NOT_MEASURED)
    measured = f"{callback_wall:.1f} s vs eager {eager_wall:.1f} s ({callback_wall / eager_wall:.3f}×)"
    passed = callback_wall < eager_wall if below else callback_wall <= SPEC_WALL_RATIO * eager_wall
    unsteady = drift_verdict(drift, passed=passed, ran_later=ran_after(order, "callback", ["eager"]),
                             ran_earlier=ran_before(order, "callback", ["eager"]))
    return Verdict(workload, target, measured, invalid or unsteady or _verdict(passed))


PAIRS_FOR_A_VERDICT = 3  # pairs whose two eager runs agree within DRIFT_WARNING


def _against_either_side(before: float, run: float, after: float) -> float:
    """A paired run's figure against the mean of the eager runs' either side of it."""
    return run / ((before + after) / 2)


def _paired_runs(result: dict[str, Any], name: str) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """A ``--pairs`` run's ``name`` runs, each with the eager runs either side of it: (before, run, after)."""
    records = result.get("records", [])
    return [(records[index - 1], records[index], records[index + 1]) for index in range(1, len(records) - 1)
            if records[index].get("variant") == name and records[index - 1].get("variant") == "eager"
            and records[index + 1].get("variant") == "eager"]


def paired_walls(result: dict[str, Any], steps: int = SPEC_WALL_STEPS, name: str = "callback") -> list[dict[str, float]]:
    """A ``--pairs`` run's ``name`` runs (records in the order they ran: eager, name, eager, name, ..., eager),
    each one's wall time over its first ``steps`` steps against the eager runs either side of it: ``ratio`` to their mean, and
    ``eager_move``, how far the second eager run's differs from the first's (the host's move across the pair)."""
    pairs = []
    for before, record, after in _paired_runs(result, name):
        walls = [(r.get("wall_s_at_step") or {}).get(str(steps)) if r.get("status") == "ok" else None
                 for r in (before, record, after)]
        if None in walls:
            continue
        eager_before, wall, eager_after = walls
        pair = {"wall_s": wall, "eager_before_s": eager_before, "eager_after_s": eager_after,
                "ratio": _against_either_side(eager_before, wall, eager_after), "eager_move": eager_after / eager_before - 1,
                "waited_after_s": after.get("waited_for_compile_processes_s") or 0.0}
        threads = [(r.get("main_thread_at_step") or {}).get(str(steps)) for r in (before, record, after)]
        if None not in threads:  # the training thread's own CPU time and context switches (records since session 37)
            pair["thread"] = threads
        pairs.append(pair)
    return pairs


def _thread_line(threads: list[dict[str, float]]) -> str:
    """A pair's training-thread figures: the callback run's CPU seconds against the eager runs' mean, and its
    involuntary context switches (pre-empted) against theirs."""
    before, run, after = threads
    ratio = _against_either_side(before["cpu_s"], run["cpu_s"], after["cpu_s"])
    return (f"; training thread CPU {run['cpu_s']:.2f} s against {before['cpu_s']:.2f} / {after['cpu_s']:.2f} "
            f"({ratio:.3f}×), involuntary switches {run['involuntary_switches']} against "
            f"{before['involuntary_switches']} / {after['involuntary_switches']}")


PAIR_WINDOW = 100  # steps per window of paired_windows


def paired_windows(result: dict[str, Any], name: str = "callback", window: int = PAIR_WINDOW) -> list[float]:
    """A ``--pairs`` run's ``name`` runs window by window: per ``window`` steps from the start, the median over
    the pairs of the run's summed step times there against the mean of the eager runs' either side, in the
    windows every run of the pairs covers: where in the run its cost lies (a child's start, its compile)."""
    triples = [[r.get("step_ms_all") or [] for r in runs] for runs in _paired_runs(result, name)]
    if not triples:
        return []
    windows = min(len(steps) for triple in triples for steps in triple) // window
    ratios = []
    for number in range(windows):
        cut = slice(number * window, (number + 1) * window)
        ratios.append(statistics.median(_against_either_side(sum(before[cut]), sum(run[cut]), sum(after[cut]))
                                        for before, run, after in triples))
    return ratios


def paired_thread_windows(result: dict[str, Any], name: str = "callback", window: int = PAIR_WINDOW) -> list[float]:
    """As :func:`paired_windows`, for the training thread's CPU seconds (``main_thread_at_step``, read every
    ``window`` steps): per window, the median over the pairs of the run's thread CPU there against the mean of the
    eager runs' either side, in the windows every run of the pairs read."""
    triples = [[r.get("main_thread_at_step") or {} for r in runs] for runs in _paired_runs(result, name)]
    if not triples:
        return []
    ratios = []
    begun = {"cpu_s": 0.0}  # the readings count from the run's start
    for end in itertools.count(window, window):
        readings = [[(usage.get(str(end - window)) if end > window else begun, usage.get(str(end))) for usage in triple]
                    for triple in triples]
        if any(first is None or last is None for triple in readings for first, last in triple):
            break
        spans = [[last["cpu_s"] - first["cpu_s"] for first, last in triple] for triple in readings]
        if any(before + after <= 0 for before, _, after in spans):
            break
        ratios.append(statistics.median(_against_either_side(*triple) for triple in spans))
    return ratios


def paired_child_stages(result: dict[str, Any], name: str = "callback") -> list[dict[str, Any]]:
    """A ``--pairs`` run's ``name`` runs by what their background child was doing: the steps before the
    hand-over, then each stage the child had started by the fit's end (the report's
    ``plan.compiling_in_background``, on the wall clock, set on the steps by the host's clock of each step's
    end). Per span, the median over the pairs of the run's summed step times there against the mean of the
    eager runs' over the same steps, and the steps it spans in the first pair; spans in the order the child
    ran them. Pairs whose child finished within the fit (no such field) are left out."""
    spans: dict[str, list[float]] = {}
    steps_of: dict[str, tuple[int, int]] = {}
    for before, run, after in _paired_runs(result, name):
        progress = ((run.get("callback") or {}).get("plan") or {}).get("compiling_in_background")
        ends, begun = run.get("step_ends_s") or [], run.get("begun_at")
        if not progress or not ends or begun is None:
            continue
        count = min(len(r.get("step_ms_all") or []) for r in (before, run, after))
        marks = [("before the hand-over", float("-inf")), ("hand-over, before the child's first stage", progress["sent_at"])]
        marks += [(stage["stage"], stage["at"]) for stage in progress["stages"]]
        for number, (stage, at) in enumerate(marks):
            until = marks[number + 1][1] if number + 1 < len(marks) else float("inf")
            picked = [i for i in range(min(count, len(ends))) if at <= begun + ends[i] < until]
            if not picked:
                continue
            summed = [sum(r["step_ms_all"][i] for i in picked) for r in (before, run, after)]
            spans.setdefault(stage, []).append(_against_either_side(*summed))
            steps_of.setdefault(stage, (picked[0], picked[-1]))
    return [{"stage": stage, "ratio": statistics.median(ratios), "pairs": len(ratios), "steps": steps_of[stage]}
            for stage, ratios in spans.items()]


def paired_child_pauses(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A ``--pairs`` run's child-pause A/B (``callback_pause_ab``: :class:`benchmarks.measure.ChildPauseAB`):
    each run's median ratio of its running blocks' wall to its stopped ones', the median over every counted
    cycle of the run's runs, and the same blocks of the eager runs (nothing stopped there: how far the
    method reads from 1 with no child at all). None where the run has no such A/B."""
    runs = [r.get("child_pause_ab") for r in result.get("records", []) if r.get("variant") == name]
    runs = [ab for ab in runs if ab and ab.get("blocks")]
    if not runs:
        return None
    first, blocks, block_steps = runs[0]["first"], runs[0]["blocks"], runs[0]["block_steps"]
    cycles = [c for ab in runs for c in ab["cycle_ratios"]]
    null = [c for r in result.get("records", []) if r.get("variant") == "eager"
            for c in abba_ratios(block_walls(r.get("step_ends_s") or [], first, blocks, block_steps))]
    return {"first": first, "block_steps": block_steps, "per_run": [ab["ratio"] for ab in runs],
            "cycles": len(cycles), "ratio": statistics.median(cycles) if cycles else None,
            "eager_cycles": len(null), "eager_ratio": statistics.median(null) if null else None,
            "without_a_process": sum(ab.get("cycles_without_a_process", 0) for ab in runs)}


def _paired_wall_time_verdict(result: dict[str, Any]) -> Verdict:
    """The SPEC's first-steps wall time from a ``--pairs`` run: the median of the callback's ratios to the eager
    runs either side of it, over the pairs whose two eager runs agree within :data:`DRIFT_WARNING` (a host that
    moved inside a pair says nothing about it); inconclusive with fewer than :data:`PAIRS_FOR_A_VERDICT` such
    pairs. The bound is :func:`_wall_time_verdict`'s."""
    workload = result["workload"]
    below = workload in SPEC_WALL_BELOW_EAGER
    target = (f"first {SPEC_WALL_STEPS} steps wall time below eager's" if below
              else f"first {SPEC_WALL_STEPS} steps wall time ≤ {SPEC_WALL_RATIO:.2f}× eager's")
    invalid = _is_measurement(result)
    caches = (result.get("settings") or {}).get("compile_caches")
    pairs = paired_walls(result)
    if not pairs:
        return Verdict(workload, target, f"(run with --total-steps {SPEC_WALL_STEPS})", invalid or NOT_MEASURED)
    if _caches_disabled(caches):
        return Verdict(workload, target, f"{len(pairs)} pairs{CACHES_DISABLED}", invalid or NOT_MEASURED)
    steady = [pair for pair in pairs if abs(pair["eager_move"]) <= DRIFT_WARNING]
    listed = ", ".join(f"{pair['ratio']:.3f}×" + ("" if pair in steady else f" (eager moved {pair['eager_move']:+.1%})")
                       for pair in pairs)
    if len(steady) < PAIRS_FOR_A_VERDICT:
        return Verdict(workload, target, f"pairs {listed}", invalid or (
            f"inconclusive ({len(steady)} of {len(pairs)} pairs with eager within {DRIFT_WARNING:.0%} either side; "
            f"{PAIRS_FOR_A_VERDICT} needed)"))
    median = statistics.median(pair["ratio"] for pair in steady)
    measured = (f"median {median:.3f}× over {len(steady)} pairs, each against the eager runs either side "
                f"(pairs {listed}; callback {statistics.median(p['wall_s'] for p in steady):.1f} s)")
    return Verdict(workload, target, measured, invalid or _verdict(median < 1.0 if below else median <= SPEC_WALL_RATIO))


INCONCLUSIVE = "inconclusive (cross-run)"


def _eager_rate(records: dict[str, dict[str, Any]]) -> float | None:
    return (_ok(records, "eager") or {}).get("tokens_per_s")


def _varlen_verdicts(
    workload: str, records: dict[str, dict[str, Any]], invalid: str | None, peers: Sequence[dict[str, Any]] = (),
    drift: float | None = None, order: Sequence[str] = (),
) -> list[Verdict]:
    """Recompiles after the first epoch, padding waste and real tokens/s of the callback variants.

    A baseline missing from this run may come from a peer run; eager's throughput drifts between runs,
    so such a comparison must hold both in tokens/s and as each variant's ratio to its own run's eager,
    else it is inconclusive. Within a run whose eager drifted, see :func:`drift_verdict` (``order``:
    the variants in the order they ran).
    """
    verdicts = []
    # name -> (tokens/s, ratio to that run's eager, from another run)
    baselines: dict[str, tuple[float, float | None, bool]] = {}
    own_eager = _eager_rate(records)
    for name in ("eager", "whole", "whole_padmax"):
        value = (_ok(records, name) or {}).get("tokens_per_s")
        if value:
            baselines[name] = (value, value / own_eager if own_eager else None, False)
            continue
        for peer in sorted(peers, key=lambda r: str(r.get("date", "")), reverse=True):
            peer_records = records_by_variant(peer)
            value = (_ok(peer_records, name) or {}).get("tokens_per_s")
            if value:
                peer_eager = _eager_rate(peer_records)
                label = f"{name} (run of {str(peer.get('date', ''))[:16]})"
                baselines[label] = (value, value / peer_eager if peer_eager else None, True)
                break
    target_rate = "real tokens/s ≥ best of eager / no-padding / pad-to-max compile"
    for name in ("callback", "callback_pad"):
        record = _ok(records, name)
        if record is None:
            status = (records.get(name) or {}).get("status", "not run")
            verdicts.append(Verdict(workload, f"`{name}`: variable-length targets", status, invalid or NOT_MEASURED))
            continue
        later = record.get("recompiles_after_first_epoch")
        verdicts.append(Verdict(workload, f"`{name}`: zero recompiles after the first epoch",
                                f"{_number(later, 'd')} (per epoch {record.get('recompiles_per_epoch')})",
                                invalid or _verdict(None if later is None else later == 0)))
        waste = record.get("padding_waste")
        verdicts.append(Verdict(workload, f"`{name}`: padding waste ≤ {VARLEN_PADDING_WASTE:.0%}", _percent(waste),
                                invalid or _verdict(None if waste is None else waste <= VARLEN_PADDING_WASTE)))
        rate = record.get("tokens_per_s")
        if not (baselines and rate):
            verdicts.append(Verdict(workload, f"`{name}`: {target_rate}", "–", invalid or NOT_MEASURED))
            continue
        best = max(baselines, key=lambda key: baselines[key][0])
        value, ratio, other_run = baselines[best]
        measured = f"{rate:,.0f} vs {best} {value:,.0f}"
        passed = rate >= value
        verdict = _verdict(passed)
        if other_run:
            own_ratio = rate / own_eager if own_eager else None
            measured += f"; vs own run's eager {_number(own_ratio, '.3f', '×')} against {_number(ratio, '.3f', '×')}"
            if own_ratio is None or ratio is None or (own_ratio >= ratio) != passed:
                verdict = INCONCLUSIVE
        if not other_run:
            # After every baseline of its own run: one that ran later was slowed too and may only look beaten.
            own = [key for key, (_, _, elsewhere) in baselines.items() if not elsewhere]
            verdict = drift_verdict(drift, passed=passed, ran_later=ran_after(order, name, own),
                                    ran_earlier=ran_before(order, name, own)) or verdict
        elif drift_verdict(drift):
            verdict = drift_verdict(drift)
        verdicts.append(Verdict(workload, f"`{name}`: {target_rate}", measured, invalid or _not_steady(record) or verdict))
    return verdicts


def _unanswered(verdict: Verdict) -> bool:
    return verdict.verdict == NOT_MEASURED or verdict.verdict.startswith(NOT_APPLICABLE)


def experiment(result: dict[str, Any]) -> str | None:
    """What takes a run off the protocol, or None: such a run is shown but answers no target. Either
    cuDNN attention turned off on the fixed-shape GPT-2 (the variable-length one always runs without it;
    the convnets have no attention), or an ``experiment`` field the run's JSON was given by hand for a
    run made with the project changed for a diagnosis (the field says what was changed)."""
    if result.get("experiment"):
        return str(result["experiment"])
    if result.get("workload") == "gpt2" and (result.get("settings") or {}).get("cudnn_attention") is False:
        return "cuDNN attention off"
    return None


def is_experiment(result: dict[str, Any]) -> bool:
    return experiment(result) is not None


def best_verdicts(results: Sequence[dict[str, Any]]) -> list[tuple[Verdict, dict[str, Any]]]:
    """Per workload and target, the verdict of the newest run that measured it (else the newest run's);
    experiments (:func:`is_experiment`) answer none. Where that verdict is inconclusive, it says what the
    newest conclusive run found, so that a noisy run does not hide a clear one before it."""
    chosen: dict[tuple[str, str], tuple[Verdict, dict[str, Any]]] = {}
    conclusive: dict[tuple[str, str], tuple[Verdict, dict[str, Any]]] = {}
    order: list[tuple[str, str]] = []
    for verdict, result in _every_verdict(results):
        key = (verdict.workload, verdict.target)
        if key not in chosen:
            order.append(key)
            chosen[key] = (verdict, result)
        elif _unanswered(chosen[key][0]) and not _unanswered(verdict):
            chosen[key] = (verdict, result)
        if key not in conclusive and not (_unanswered(verdict) or verdict.verdict.startswith("inconclusive")):
            conclusive[key] = (verdict, result)
    for key, (verdict, result) in chosen.items():
        if verdict.verdict.startswith("inconclusive") and key in conclusive:
            clear, run = conclusive[key]
            chosen[key] = (dataclasses.replace(verdict, verdict=(
                f"{verdict.verdict}; the newest conclusive run ({str(run.get('date', ''))[:16]}): "
                f"{clear.verdict}, {clear.measured}")), result)
    for workload, target in list(order):
        # "`callback_pad`: variable-length targets / not run" says a run lacked the variant; drop it
        # where another run measured that variant's targets.
        variant = target.split(":")[0]
        if target.endswith("variable-length targets") and any(
            w == workload and t != target and t.startswith(variant + ":") for w, t in order
        ):
            order.remove((workload, target))
    return [chosen[key] for key in sorted(order, key=lambda key: (_workload_rank(key[0]), order.index(key)))]


def _every_verdict(results: Sequence[dict[str, Any]]) -> list[tuple[Verdict, dict[str, Any]]]:
    """Every run's verdict on every target it was held to, newest run first; experiments answer none."""
    results = [r for r in results if not is_experiment(r)]
    found = []
    for result in sorted(results, key=lambda r: str(r.get("date", "")), reverse=True):
        peers = [r for r in results if r is not result and r["workload"] == result["workload"] and not r.get("smoke")]
        found += [(verdict, result) for verdict in evaluate_targets(result, peers)]
    return found


RECENT = 5  # the newest answers counted apart in the targets table's record column


def verdict_record(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Per workload and target, how many of the stored runs that answered it met it, and how many of the
    newest :data:`RECENT` (older runs measured older code): where the margin is a few percent on a noisy
    host, the newest run's verdict alone can flip from run to run. Inconclusive answers are left out."""
    answers: dict[tuple[str, str], list[bool]] = {}
    for verdict, _ in _every_verdict(results):  # newest first
        if not (_unanswered(verdict) or verdict.verdict.startswith("inconclusive")):
            answers.setdefault((verdict.workload, verdict.target), []).append(verdict.verdict.startswith("met"))
    return {key: f"{sum(met)} of {len(met)}" + (f" (newest {RECENT}: {sum(met[:RECENT])})" if len(met) > RECENT else "")
            for key, met in answers.items()}


WORKLOAD_ORDER = ("gpt2", "resnet50", "resnet18_cifar", "gpt2_varlen", "hf_gpt2", "hf_gpt2_direct", "timm_vit",
                  "hf_bert_mlm")


def _workload_rank(workload: str) -> int:
    return WORKLOAD_ORDER.index(workload) if workload in WORKLOAD_ORDER else len(WORKLOAD_ORDER)


def render_targets(results: Sequence[dict[str, Any]]) -> str:
    lines = ["| workload | target | measured | verdict | run | stored runs that met it |", "|---|---|---|---|---|---|"]
    record = verdict_record(results)
    for verdict, result in best_verdicts(results):
        lines.append(
            f"| {verdict.workload} | {verdict.target} | {verdict.measured} | {verdict.verdict} | "
            f"{str(result.get('date', ''))[:16]} | {record.get((verdict.workload, verdict.target), '–')} |"
        )
    return "\n".join(lines)


# -- BENCHMARKS.md ------------------------------------------------------------------------------------
def render_anatomy_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per run whose callback variants reported the compile anatomy (see docs/metrics.md)."""
    lines = [
        "| workload | variant | run | plan | graph coverage S | ops eager / step ops | backend coverage | "
        "fallback kernels per step | guard checks × µs (share of step) | compile s: dynamo / AOT / Inductor | "
        "break-even steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    newest_first = sorted(results, key=lambda r: str(r.get("date", "")), reverse=True)
    for result in sorted(newest_first, key=lambda r: _workload_rank(r["workload"])):
        for record in result.get("records", []):
            callback = record.get("callback") or {}
            anatomy = callback.get("anatomy") or {}
            if anatomy.get("graph_coverage") is None:
                continue
            plan = ", ".join(f"{d['region']} ({d['mode']})" for d in callback.get("decisions", []) if d.get("kept"))
            fallbacks = ", ".join(f"`{n}` ×{c}" for n, c in (anatomy.get("fallback_kernels") or {}).items()) or "none"
            if anatomy.get("kernels_note"):
                fallbacks += " (CUDA graphs: replayed kernels not visible)"
            lines.append(
                f"| {result['workload']} | {record['variant']} | {str(result.get('date', ''))[:16]}"
                f"{' (experiment)' if is_experiment(result) else ''} | {plan or 'eager'} | "
                f"{_percent(anatomy.get('graph_coverage'))} | {_number(anatomy.get('eager_ops'), '.0f')} / "
                f"{_number(anatomy.get('step_ops'), '.0f')} | {_percent(anatomy.get('backend_coverage'))} | {fallbacks} | "
                f"{_number(anatomy.get('guard_checks'), '.0f')} × {_number(anatomy.get('guard_us_per_call'), '.0f')} "
                f"({_percent(anatomy.get('guard_share'))}) | {_number(anatomy.get('dynamo_s'), '.1f')} / "
                f"{_number(anatomy.get('aot_autograd_s'), '.1f')} / {_number(anatomy.get('inductor_s'), '.1f')}"
                f"{'' if anatomy.get('compile_split') == 'exclusive' else ' (nested¹)'} | "
                f"{_number(anatomy.get('break_even_steps'), '.0f')} |"
            )
    if len(lines) == 2:
        return ""
    if any("(nested¹)" in line for line in lines):
        lines += ["", "¹ Recorded before the split became exclusive: torch's own cumulative figures, which nest "
                  "(dynamo's includes AOTAutograd's, which includes Inductor's forward graph)."]
    return "\n".join(lines)


def render_benchmarks(results: Sequence[dict[str, Any]], notes: str = "") -> str:
    """BENCHMARKS.md: the targets with verdicts, then one section per run, newest first per workload."""
    measured = [r for r in results if not r.get("smoke")] or list(results)
    lines = [
        "# Benchmarks",
        "",
        "Made by `python -m benchmarks.table benchmarks/results/*.json --notes benchmarks/NOTES.md --output BENCHMARKS.md` from the JSON that "
        "`python -m benchmarks --workload <name>` writes (the command of each run heads its section). "
        "Variants run one after another in one process on the same data and initial weights; step time is "
        "forward + backward + optimizer step (CUDA events), median and p90 over the steady-state steps; "
        "speedups are against Lightning eager (`eager`) in the same run; `bare_eager` is a plain PyTorch "
        "loop, to show Lightning's own cost, and `bare_whole` / `bare_whole_ro` the same loop with the model "
        "compiled (default / `reduce-overhead`), the ceiling a compiled step reaches without Lightning's "
        "loop. Compile seconds: dynamo's compile records, or the "
        "CompileCallback's own report for the callback variants.",
        "",
        "## Targets (SPEC.md)",
        "",
        "The newest run that measured a target answers it (where it was inconclusive, the newest conclusive "
        "run's verdict follows); the last column counts the stored runs that "
        f"answered it (inconclusive ones left out) and met it, and of the newest {RECENT} of those. Older runs "
        "measured older code: the record says how often a verdict held, not that it holds now.",
        "",
        render_targets(measured),
        "",
    ]
    anatomy = render_anatomy_table(measured)
    if anatomy:
        lines += [
            "## Compile anatomy (CompileCallback's `compile/anatomy/*`, from the run's report)",
            "",
            anatomy,
            "",
        ]
    if notes:
        lines += [notes.strip(), ""]
    lines += ["## Workloads", ""]
    newest_first = sorted(measured, key=lambda r: str(r.get("date", "")), reverse=True)
    for result in sorted(newest_first, key=lambda r: _workload_rank(r["workload"])):  # stable: newest first within
        lines += [render_result(result), ""]
    return "\n".join(lines).rstrip() + "\n"


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    results = []
    for path in paths:
        with open(path) as handle:
            result = json.load(handle)
        if not isinstance(result, dict) or "workload" not in result or "records" not in result:
            raise ValueError(f"{path} is not a result of `python -m benchmarks` (no 'workload' and 'records').")
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.table", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON files written by python -m benchmarks")
    parser.add_argument("--output", help="write the Markdown here (default: print it)")
    parser.add_argument("--notes", help="a Markdown file put after the targets (the reading of the verdicts)")
    args = parser.parse_args(argv)
    try:
        notes = ""
        if args.notes:
            with open(args.notes, encoding="utf-8") as handle:
                notes = handle.read()
        text = render_benchmarks(load(args.results), notes)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
