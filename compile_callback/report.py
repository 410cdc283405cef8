"""The compile report: what was decided and why, what dynamo did, as JSON, a terminal table and Markdown."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

REPORT_FILE = "compile_report.json"


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
    max_rel_error: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:{spec}}{suffix}"
    return f"{value}{suffix}"


def render_table(report: dict[str, Any]) -> str:
    """A plain-text table for the terminal, printed at the end of fit."""
    summary = report["summary"]
    lines = [
        "compile report",
        f"  speedup {_fmt(summary.get('speedup'), '.3f', 'x')}  step {_fmt(summary.get('step_time_ms'), '.2f', ' ms')}"
        f"  eager {_fmt(summary.get('eager_step_time_ms'), '.2f', ' ms')}  compile time "
        f"{_fmt(summary.get('compile_time_s'), '.1f', ' s')}  graphs {summary.get('graphs', 0)}  "
        f"graph breaks {summary.get('graph_breaks', 0)}  recompiles {summary.get('recompiles', 0)}  "
        f"eager fallbacks {summary.get('eager_fallbacks', 0)}",
    ]
    decisions = report.get("decisions", [])
    if decisions:
        header = f"  {'region':<24} {'mode':<16} {'kept':<5} {'speedup':>8} {'compile s':>9} {'max err':>9}  reason"
        lines += [header, "  " + "-" * (len(header) + 10)]
        for item in decisions:
            lines.append(
                f"  {item['region'][:24]:<24} {item['mode'][:16]:<16} {'yes' if item['kept'] else 'no':<5} "
                f"{_fmt(item.get('speedup'), '.3f'):>8} {_fmt(item.get('compile_seconds'), '.1f'):>9} "
                f"{_fmt(item.get('max_rel_error'), '.1e'):>9}  {item['reason']}"
            )
    regions = report.get("regions", {})
    if regions:
        lines.append(f"  {'region':<40} {'graphs':>6} {'breaks':>6} {'recomp':>6} {'compile s':>9}  fallback")
        for name, stats in regions.items():
            lines.append(
                f"  {name[:40]:<40} {stats['graphs']:>6} {stats['graph_breaks']:>6} {stats['recompiles']:>6} "
                f"{stats['compile_seconds']:>9.2f}  {'EAGER (limit hit)' if stats['eager_fallback'] else ''}"
            )
    for cause in report.get("recompile_causes", [])[:10]:
        lines.append(f"  recompile x{cause['count']} in {cause['region']}: {cause['reason']}")
    for item in report.get("graph_break_reasons", [])[:10]:
        lines.append(f"  graph break x{item['count']} in {item['region']}: {item['reason']}")
    for suggestion in report.get("suggestions", []):
        lines.append(f"  suggestion: {suggestion}")
    return "\n".join(lines)


def render_markdown(report: dict[str, Any]) -> str:
    """The same report as Markdown, for TensorBoard's text plugin (``compile/report``)."""
    summary = report["summary"]
    out = [
        "### Summary",
        "",
        "| speedup | step ms | eager ms | compile s | graphs | graph breaks | recompiles | eager fallbacks |",
        "|---|---|---|---|---|---|---|---|",
        f"| {_fmt(summary.get('speedup'), '.3f', 'x')} | {_fmt(summary.get('step_time_ms'))} | "
        f"{_fmt(summary.get('eager_step_time_ms'))} | {_fmt(summary.get('compile_time_s'), '.1f')} | "
        f"{summary.get('graphs', 0)} | {summary.get('graph_breaks', 0)} | {summary.get('recompiles', 0)} | "
        f"{summary.get('eager_fallbacks', 0)} |",
        "",
    ]
    if report.get("decisions"):
        out += [
            "### Decisions",
            "",
            "| region | mode | kept | time share | speedup | compile s | max rel err | reason |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for item in report["decisions"]:
            out.append(
                f"| `{item['region']}` | {item['mode']} | {'yes' if item['kept'] else 'no'} | "
                f"{_fmt(item.get('time_share'), '.0%')} | {_fmt(item.get('speedup'), '.3f')} | "
                f"{_fmt(item.get('compile_seconds'), '.1f')} | {_fmt(item.get('max_rel_error'), '.1e')} | {item['reason']} |"
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
    if report.get("recompile_causes"):
        out += ["### Recompile causes", "", "| region | count | guard that failed |", "|---|---|---|"]
        out += [f"| `{c['region']}` | {c['count']} | `{c['reason']}` |" for c in report["recompile_causes"]]
        out.append("")
    if report.get("graph_break_reasons"):
        out += ["### Graph breaks", "", "| region | count | reason (location) |", "|---|---|---|"]
        out += [f"| `{c['region']}` | {c['count']} | {c['reason']} |" for c in report["graph_break_reasons"]]
        out.append("")
    if report.get("suggestions"):
        out += ["### Suggestions", ""] + [f"- {s}" for s in report["suggestions"]]
    return "\n".join(out)


def write_json(report: dict[str, Any], directory: str) -> str:
    """Writes ``compile_report.json`` into ``directory`` atomically; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, REPORT_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=False, default=str)
    os.replace(temporary, path)
    return path
