"""The compile report: what was decided and why, what dynamo did, as JSON, a terminal table and Markdown."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from compile_callback.churn import HF_CACHE_FIX, HF_CACHE_SOURCE
from compile_callback.regions import MODEL
from compile_callback.watch import is_twin

REPORT_FILE = "compile_report.json"


def _cache_word(state: str | None) -> str:
    """The text table's one word for :func:`cache_state` (the Markdown and JSON have it whole)."""
    return "-" if not state else "part" if state.startswith("partly") else state


def cache_state(hits: int, misses: int) -> str | None:
    """Whether a compile's graphs came from Inductor's FX-graph cache: ``"cold"`` (none did), ``"warm"``
    (all did) or ``"partly warm (H of N graphs from the cache)"``; None where no graph went through the
    cache (nothing compiled, or a backend other than Inductor)."""
    if hits + misses == 0:
        return None
    if not hits:
        return "cold"
    if not misses:
        return "warm"
    return f"partly warm ({hits} of {hits + misses} graphs from the cache)"


@dataclasses.dataclass
class Decision:
    """One keep/revert decision about a region, with the numbers behind it."""

    region: str
    modules: list[str]
    mode: str
    kept: bool
    reason: str
    step: int
    time_share: float | None = None
    compile_seconds: float | None = None
    step_ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None
    speedup_noise: float | None = None  # relative standard error of ``speedup``
    max_rel_error: float | None = None
    error_in: str | None = None  # the tensor ``max_rel_error`` is from, and how it was judged (verify.TensorError)
    verified: bool | None = None  # numerics checked against eager: passed (True), differed (False), or not checked
    compile_cache: str | None = None  # "cold", "warm" or "partly warm ..." (cache_state); None: no cache involved
    background: str | None = None  # "prepared in the background: ..." or why not; None: background compiles off
    background_s: float | None = None  # a child's seconds compiling and checking it (not in compile_seconds: no stall)
    peak_gb: float | None = None  # the fit's peak allocated memory (GB) when this was decided; None off CUDA
    # Host seconds of the trial's set-up batch (the one that compiles and verifies), by piece: "memory
    # release" before a CUDA-graph trial, verification's stages (verify.VerificationResult.seconds) and
    # "verification in all" (parking the optimizer's state and gradients in host memory included); then, where a
    # background child prepared it, the child's stages ("in the child: start-up (interpreter and imports)",
    # "... loading (unpickling, to the device)", its verification's stages): spent while training went on.
    setup_s: dict[str, float] | None = None
    replaced_by: str | None = None  # kept, then replaced by this region (the whole model), priced against it

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = dict(data)
        if "verified" not in data and data.get("max_rel_error") is not None:
            # Saved before decisions said it: a checked region had its error recorded, a failed one said so.
            data["verified"] = not str(data.get("reason", "")).startswith("numerics")
        return cls(**{k: v for k, v in data.items() if k in fields})


def _background(decision: dict[str, Any]) -> str:
    """What a decision says of its background compile, after its reason (nothing where they were off)."""
    return f"; {decision['background']}" if decision.get("background") else ""


def _error(decision: dict[str, Any]) -> str:
    """A decision's max relative error and the tensor it is from ("-" where numerics were not checked)."""
    error = _fmt(decision.get("max_rel_error"), ".1e")
    return f"{error} in {decision['error_in']}" if decision.get("error_in") and error != "-" else error


def _error_in(decision: dict[str, Any]) -> str:
    """The tensor a decision's max relative error is from, after its reason in the text summary."""
    where = decision.get("error_in")
    return f" (max err in {where})" if where and where not in decision["reason"] else ""


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:{spec}}{suffix}"
    return f"{value}{suffix}"


# How the headline speedup was priced, where it is not simply eager over step (a plan priced by its trials
# can read above the two medians beside it: they come from different stretches of the run).
_PRICED = {"shape by shape": " (shapes priced one by one)", "trials": " (the product of its trials, each beside the plan before it)",
           "re-measured": " (eager re-measured beside the plan late in the run)",
           "nothing compiled": " (nothing compiled: the step and eager times beside it are both eager, from different stretches of the run)"}


def _priced(summary: dict[str, Any]) -> str:
    """How the headline speedup was priced, with the batch of a re-measured price."""
    text = _PRICED.get(summary.get("speedup_priced"), "")
    at = summary.get("speedup_priced_at_batch")
    return text[:-1] + f", at batch {at} of {summary.get('batches')})" if text and at is not None else text


# The two renderings are long on purpose: each is the report's layout, top to bottom.
def render_table(report: dict[str, Any]) -> str:
    """A plain-text table for the terminal, printed at the end of fit."""
    summary = report["summary"]
    lines = [
        "compile report",
        f"  speedup {_fmt(summary.get('speedup'), '.3f', 'x')}"
        f"{_priced(summary)}"
        f"  step {_fmt(summary.get('step_time_ms'), '.2f', ' ms')}"
        f"  eager {_fmt(summary.get('eager_step_time_ms'), '.2f', ' ms')}  compile time "
        f"{_fmt(summary.get('compile_time_s'), '.1f', ' s')} (training stalled {_fmt(summary.get('stall_s'), '.1f', ' s')})"
        f"  graphs {summary.get('graphs', 0)}  "
        f"graph breaks {summary.get('graph_breaks', 0)}  recompiles {summary.get('recompiles', 0)}  "
        f"eager fallbacks {summary.get('eager_fallbacks', 0)}",
    ]
    decisions = report.get("decisions", [])
    if decisions:
        header = f"  {'region':<24} {'mode':<16} {'kept':<5} {'speedup':>8} {'compile s':>9} {'cache':<5} {'max err':>9}  reason"
        lines += [header, "  " + "-" * (len(header) + 10)]
        for item in decisions:
            lines.append(
                f"  {item['region'][:24]:<24} {item['mode'][:16]:<16} {'yes' if item['kept'] else 'no':<5} "
                f"{_fmt(item.get('speedup'), '.3f'):>8} {_fmt(item.get('compile_seconds'), '.1f'):>9} "
                f"{_cache_word(item.get('compile_cache')):<5} {_fmt(item.get('max_rel_error'), '.1e'):>9}  {item['reason']}"
                f"{_background(item)}{_error_in(item)}"
            )
    regions = report.get("regions", {})
    if regions:
        lines.append(f"  {'region':<40} {'graphs':>6} {'breaks':>6} {'recomp':>6} {'compile s':>9}  fallback")
        for name, stats in regions.items():
            lines.append(
                f"  {name[:40]:<40} {stats['graphs']:>6} {stats['graph_breaks']:>6} {stats['recompiles']:>6} "
                f"{stats['compile_seconds']:>9.2f}  {'EAGER (limit hit)' if stats['eager_fallback'] else ''}"
            )
    anatomy = report.get("anatomy") or {}
    if anatomy.get("graph_coverage") is not None:
        fallbacks = ", ".join(f"{name} x{n}" for name, n in list(anatomy.get("fallback_kernels", {}).items())[:5])
        lines.append(
            f"  anatomy: graph coverage {anatomy['graph_coverage']:.1%} ({_fmt(anatomy.get('eager_ops'), '.0f')} of "
            f"{_fmt(anatomy.get('step_ops'), '.0f')} ops eager)  backend coverage "
            f"{_fmt(anatomy.get('backend_coverage'), '.1%')}  guards {_fmt(anatomy.get('guard_us_per_call'), '.1f')} us "
            f"x {_fmt(anatomy.get('guard_checks'), '.0f')} per step  fallback kernels: {fallbacks or 'none'}"
        )
    if anatomy.get("host_syncs_between_steps") is not None or anatomy.get("host_syncs_in_step") is not None:
        sites = "; ".join(f"{site} x{n}" for site, n in (anatomy.get("host_sync_sites") or {}).items())
        lines.append(
            f"  host syncs per step: {_fmt(anatomy.get('host_syncs_in_step'), '.0f')} in the step, "
            f"{_fmt(anatomy.get('host_syncs_between_steps'), '.0f')} between steps{f' ({sites})' if sites else ''}"
        )
    for cause in report.get("recompile_causes", [])[:10]:
        lines.append(f"  recompile x{cause['count']} in {cause['region']}: {cause['reason']}")
    for item in report.get("graph_break_reasons", [])[:10]:
        lines.append(f"  graph break x{item['count']} in {item['region']}: {item['reason']}")
    for row in report.get("ranks") or []:
        lines.append("  rank {rank}: graphs {graphs}  graph breaks {graph_breaks}  recompiles {recompiles}  "
                     "eager fallbacks {eager_fallbacks}  DDP pieces {ddp_pieces}".format(**row) + _child_caches(row, "  "))
    for note in (report.get("plan") or {}).get("notes", []):
        lines.append(f"  note: {note}")
    for suggestion in report.get("suggestions", []):
        lines.append(f"  suggestion: {suggestion}")
    return "\n".join(lines)


def _child_caches(row: dict[str, Any], lead: str) -> str:
    """A rank's compiles of background-prepared candidates, each with its cache state ("warm": served by a
    child's cache; "no cache": a backend that keeps none), or "" where none."""
    caches = row.get("background_caches") or {}
    return "".join(f"{lead}`{region}` {state or 'no cache'}" for region, state in caches.items())


def render_markdown(report: dict[str, Any]) -> str:
    """The same report as Markdown, for TensorBoard's text plugin (``compile/report``)."""
    summary = report["summary"]
    out = [
        "### Summary",
        "",
        "| speedup | step ms | eager ms | compile s | stall s | graphs | graph breaks | recompiles | eager fallbacks |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {_fmt(summary.get('speedup'), '.3f', 'x')} | {_fmt(summary.get('step_time_ms'))} | "
        f"{_fmt(summary.get('eager_step_time_ms'))} | {_fmt(summary.get('compile_time_s'), '.1f')} | "
        f"{_fmt(summary.get('stall_s'), '.1f')} | "
        f"{summary.get('graphs', 0)} | {summary.get('graph_breaks', 0)} | {summary.get('recompiles', 0)} | "
        f"{summary.get('eager_fallbacks', 0)} |",
        "",
    ]
    if report.get("decisions"):
        out += [
            "### Decisions",
            "",
            "| region | mode | kept | time share | speedup | compile s | cache | peak GB so far | max rel err | reason |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for item in report["decisions"]:
            out.append(
                f"| `{item['region']}` | {item['mode']} | {'yes' if item['kept'] else 'no'} | "
                f"{_fmt(item.get('time_share'), '.0%')} | {_fmt(item.get('speedup'), '.3f')} | "
                f"{_fmt(item.get('compile_seconds'), '.1f')} | {item.get('compile_cache') or '-'} | "
                f"{_fmt(item.get('peak_gb'), '.2f')} | {_error(item)} | {item['reason']}{_background(item)} |"
            )
        out.append("")
    if report.get("regions"):
        out += ["### Regions", "", "| region | graphs | graph breaks | recompiles | compile s | eager fallback |", "|---|---|---|---|---|---|"]
        for name, stats in report["regions"].items():
            out.append(
                f"| `{name}` | {stats['graphs']} | {stats['graph_breaks']} | {stats['recompiles']} | "
                f"{stats['compile_seconds']:.2f} | {stats['fallback_reason'] or 'no'} |"
            )
        out.append("")
    out += _anatomy_markdown(report.get("anatomy") or {})
    if report.get("recompile_causes"):
        out += ["### Recompile causes", "", "| region | count | guard that failed |", "|---|---|---|"]
        out += [f"| `{c['region']}` | {c['count']} | `{c['reason']}` |" for c in report["recompile_causes"]]
        out.append("")
    if report.get("graph_break_reasons"):
        out += ["### Graph breaks", "", "| region | count | reason (location) |", "|---|---|---|"]
        out += [f"| `{c['region']}` | {c['count']} | {c['reason']} |" for c in report["graph_break_reasons"]]
        out.append("")
    if report.get("ranks"):
        child = any(row.get("background_caches") for row in report["ranks"])
        out += ["### Ranks", "", "| rank | graphs | graph breaks | recompiles | eager fallbacks | DDP pieces |"
                + (" compiled after rank 0's background child (cache) |" if child else ""),
                "|---|---|---|---|---|---|" + ("---|" if child else "")]
        out += ["| {rank} | {graphs} | {graph_breaks} | {recompiles} | {eager_fallbacks} | {ddp_pieces} |".format(**row)
                + (f"{_child_caches(row, ' ')} |" if child else "") for row in report["ranks"]]
        out.append("")
    notes = (report.get("plan") or {}).get("notes", [])
    if notes:
        out += ["### Notes", ""] + [f"- {note}" for note in notes] + [""]
    if report.get("suggestions"):
        out += ["### Suggestions", ""] + [f"- {s}" for s in report["suggestions"]]
    return "\n".join(out)


ANATOMY_ROWS = (
    ("graph coverage S (ops in compiled graphs / all ops of the step)", "graph_coverage", ".1%"),
    ("ops still run eagerly per step", "eager_ops", ".0f"),
    ("ops of the fully eager step", "step_ops", ".0f"),
    ("backend coverage (1 - fallback kernel calls / ops moved into graphs)", "backend_coverage", ".1%"),
    ("fallback kernel calls per step", "fallback_calls", ".0f"),
    ("guard checks per step", "guard_checks", ".0f"),
    ("guard time per check (us)", "guard_us_per_call", ".1f"),
    ("guard time, share of the step", "guard_share", ".2%"),
    ("guard time per check at compile, torch's own figure (us)", "guard_latency_us_at_compile", ".1f"),
    ("host time spent processing the sampled steps' profiles (s)", "sampling_s", ".2f"),
    ("host syncs in the step (tensor values read on the host)", "host_syncs_in_step", ".0f"),
    ("host syncs between two steps", "host_syncs_between_steps", ".0f"),
    ("compile: dynamo capture (s)", "dynamo_s", ".1f"),
    ("compile: AOTAutograd (s)", "aot_autograd_s", ".1f"),
    ("compile: Inductor (s)", "inductor_s", ".1f"),
    ("compile cache hit rate", "cache_hit_rate", ".0%"),
    ("break-even (steps until compiling has paid for itself)", "break_even_steps", ".0f"),
    ("projected saving over the planned run, compile time paid (s)", "projected_saving_s", ".1f"),
    ("verification pass rate", "verification_pass_rate", ".0%"),
)


def _anatomy_markdown(anatomy: dict[str, Any]) -> list[str]:
    rows = [(label, anatomy.get(key), spec) for label, key, spec in ANATOMY_ROWS if anatomy.get(key) is not None]
    if not rows:
        return []
    out = ["### Anatomy", "", "| figure | value |", "|---|---|"]
    out += [f"| {label} | {_fmt(float(value), spec)} |" for label, value, spec in rows]
    for key, title in (("fallback_kernels", "fallback kernels (ATen ops Inductor could not lower)"),
                       ("library_kernels", "library kernels called by compiled code")):
        kernels = anatomy.get(key) or {}
        if kernels:
            out.append(f"| {title} | " + ", ".join(f"`{name}` x{n}" for name, n in kernels.items()) + " |")
    worst = anatomy.get("worst_rel_error")
    if worst:
        tensor = f": {worst['error_in']}" if worst.get("error_in") else ""
        out.append(f"| worst verified max relative error | {worst['error']:.1e} in `{worst['region']}` ({worst['mode']}"
                   f"{', kept' if worst['kept'] else ', reverted'}{tensor}) |")
    for name, coverage in (anatomy.get("region_graph_coverage") or {}).items():
        out.append(f"| graph coverage of `{name}` | {_fmt(coverage, '.1%')} |")
    for site, count in (anatomy.get("host_sync_sites") or {}).items():
        out.append(f"| host sync between steps: {site} | x{count} |")
    out.append("")
    return out


def write_json(report: dict[str, Any], directory: str) -> str:
    """Writes ``compile_report.json`` into ``directory`` atomically; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, REPORT_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=False, default=str)
    os.replace(temporary, path)
    return path


def ddp_note(graphs: int, pieces: int) -> str | None:
    """What DDPOptimizer did to the graphs, when it split them: not graph breaks, and why."""
    if not pieces:
        return None
    return (
        f"DDP: dynamo's DDPOptimizer split the {graphs} captured graph(s) into {pieces} compiled "
        f"pieces at DDP's gradient buckets, so that each bucket's all-reduce starts while the backward "
        f"still runs. These splits are not graph breaks (no eager code runs between the pieces); larger "
        f"buckets (DDPStrategy(bucket_cap_mb=...)) make fewer pieces, and "
        f"torch._dynamo.config.optimize_ddp=False none, at the cost of that overlap."
    )


def build_suggestions(
    regions: dict[str, Any],
    compiled_regions: Sequence[Any],
    decisions: Sequence[Decision],
    *,
    eager_gb: float | None,
    plan_gb: float | None,
    host_syncs: Sequence[str] = (),
) -> list[str]:
    """The report's suggestions: what the user can change, from the per-region accounting (``regions``:
    the watch's stats as dicts), the planner's regions and decisions, the memory the eager and the
    compiled steps held, and the advice on host syncs."""
    suggestions = list(host_syncs)
    if eager_gb and plan_gb and plan_gb < 0.8 * eager_gb and any(d.kept for d in decisions):
        suggestions.append(f"The compiled step holds {plan_gb:.1f} GB against {eager_gb:.1f} GB eager (at the "
                           f"forward/backward boundary): a larger batch may fit.")
    for region in compiled_regions:
        if region.is_compiled and region.name == MODEL and not regions.get(region.name, {}).get("graphs"):
            suggestions.append(
                f"`{MODEL}` (the LightningModule's forward) is compiled but dynamo made no graph for it: most "
                f"likely training_step does not call forward (self(...)). Name the module it calls "
                f"(regions=['self.model'] for self.model), or use regions='auto'."
            )
        elif region.is_compiled and not regions.get(region.name, {}).get("graphs"):
            suggestions.append(
                f"`{region.name}` is compiled but dynamo made no graph for it, so it runs eager "
                f"(torch {torch.__version__} may skip torch.nn's own modules compiled on their own); "
                f"compile the module that contains it instead."
            )
    for name, stats in regions.items():
        if stats["eager_fallback"]:
            fix = (HF_CACHE_FIX if HF_CACHE_SOURCE in (stats["fallback_reason"] or "") else
                   "Pad the changing dimension to a few fixed sizes, mark it dynamic (dynamic=True), or stop the "
                   "Python value from changing.")
            suggestions.append(f"`{name}` runs eager: {stats['fallback_reason']}. {fix[0].upper()}{fix[1:]}")
        if stats["graph_breaks"] and not is_twin(name):  # a twin's breaks are its region's, counted again
            suggestions.append(
                f"`{name}` has {stats['graph_breaks']} graph break(s); each splits the compiled code. "
                f"Move the cause out of the region or rewrite it in tensor ops (see Graph breaks)."
            )
    return suggestions
