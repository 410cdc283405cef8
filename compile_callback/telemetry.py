"""Sending compile metrics to Lightning loggers, and the TensorBoard-only views.

Scalars go to every logger through ``Logger.log_metrics`` (loggers are rank-zero-only themselves);
the custom-scalars layout and the Markdown report go only to TensorBoard loggers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Lightning is imported where loggers are used: the tag names below are for the plain layer too
    from lightning.pytorch.loggers import Logger

# The SPEC's tag names; a contract with users' dashboards.
SPEEDUP = "compile/speedup"
SPEEDUP_LOW = "compile/speedup_low"
MEMORY_PEAK_GB = "compile/memory/peak_gb"
MEMORY_EAGER_PEAK_GB = "compile/memory/eager_peak_gb"
MEMORY_PLAN_PEAK_GB = "compile/memory/plan_peak_gb"
SPEEDUP_HIGH = "compile/speedup_high"
STEP_TIME_MS = "compile/step_time_ms"
EAGER_STEP_TIME_MS = "compile/eager_step_time_ms"
COMPILE_TIME_S = "compile/compile_time_s"
STALL_S = "compile/stall_s"
GRAPHS = "compile/graphs"
GRAPH_BREAKS = "compile/graph_breaks"
RECOMPILES = "compile/recompiles"
RECOMPILES_EPOCH = "compile/recompiles_epoch"
EAGER_FALLBACKS = "compile/eager_fallbacks"
REGIONS_COMPILED = "compile/regions_compiled"
REGIONS_REVERTED = "compile/regions_reverted"
COVERAGE = "compile/coverage"
MAX_REL_ERROR = "compile/max_rel_error"
PADDING_WASTE = "compile/padding_waste"
REPORT_TEXT = "compile/report"
ANATOMY_DYNAMO_S = "compile/anatomy/dynamo_s"
ANATOMY_AOT_AUTOGRAD_S = "compile/anatomy/aot_autograd_s"
ANATOMY_INDUCTOR_S = "compile/anatomy/inductor_s"
ANATOMY_CACHE_HIT_RATE = "compile/anatomy/cache_hit_rate"
ANATOMY_BREAK_EVEN_STEPS = "compile/anatomy/break_even_steps"
ANATOMY_PROJECTED_SAVING_S = "compile/anatomy/projected_saving_s"
ANATOMY_VERIFICATION_PASS_RATE = "compile/anatomy/verification_pass_rate"
ANATOMY_GRAPH_COVERAGE = "compile/anatomy/graph_coverage"
ANATOMY_EAGER_OPS = "compile/anatomy/eager_ops"
ANATOMY_STEP_OPS = "compile/anatomy/step_ops"
ANATOMY_BACKEND_COVERAGE = "compile/anatomy/backend_coverage"
ANATOMY_FALLBACK_CALLS = "compile/anatomy/fallback_calls"
ANATOMY_GUARD_CHECKS = "compile/anatomy/guard_checks"
ANATOMY_GUARD_US_PER_CALL = "compile/anatomy/guard_us_per_call"
ANATOMY_GUARD_SHARE = "compile/anatomy/guard_share"
ANATOMY_SAMPLING_S = "compile/anatomy/sampling_s"
ANATOMY_HOST_SYNCS_STEP = "compile/anatomy/host_syncs_in_step"
ANATOMY_HOST_SYNCS_BETWEEN = "compile/anatomy/host_syncs_between_steps"


def region_tag(name: str) -> str:
    """A region name as a tag component: "transformer.h.*" -> "transformer.h.N", other odd characters -> "_"."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name.replace("*", "N"))


def log_scalars(loggers: Iterable[Logger], metrics: Mapping[str, float | None], step: int) -> None:
    """Logs the finite values of ``metrics`` to every logger at ``step``."""
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    if not clean:
        return
    for logger in loggers:
        logger.log_metrics(clean, step=step)


def tensorboard_writers(loggers: Iterable[Logger]) -> list[Any]:
    from lightning.pytorch.loggers import TensorBoardLogger

    return [logger.experiment for logger in loggers if isinstance(logger, TensorBoardLogger)]


def log_report_text(loggers: Iterable[Logger], markdown: str, step: int) -> None:
    for writer in tensorboard_writers(loggers):
        writer.add_text(REPORT_TEXT, markdown, global_step=step)
        writer.flush()


def custom_scalars_layout() -> dict[str, Any]:
    """TensorBoard custom-scalars layout: the compile dashboard's charts, grouped."""
    return {
        "compile": {
            "speed": ["Multiline", [SPEEDUP, SPEEDUP_LOW, SPEEDUP_HIGH]],
            "step time (ms): compiled vs eager": ["Multiline", [STEP_TIME_MS, EAGER_STEP_TIME_MS]],
            "memory (GB): fit peak, eager steps, plan's steps": [
                "Multiline", [MEMORY_PEAK_GB, MEMORY_EAGER_PEAK_GB, MEMORY_PLAN_PEAK_GB]
            ],
            "compile time (s)": ["Multiline", [COMPILE_TIME_S, STALL_S]],
            "graphs and recompiles": ["Multiline", [GRAPHS, RECOMPILES, RECOMPILES_EPOCH]],
            "graph breaks and eager fallbacks": ["Multiline", [GRAPH_BREAKS, EAGER_FALLBACKS]],
            "decisions": ["Multiline", [REGIONS_COMPILED, REGIONS_REVERTED]],
            "padding waste": ["Multiline", [PADDING_WASTE]],
        },
        "compile anatomy": {
            "compile time split (s)": ["Multiline", [ANATOMY_DYNAMO_S, ANATOMY_AOT_AUTOGRAD_S, ANATOMY_INDUCTOR_S]],
            "cache hit rate": ["Multiline", [ANATOMY_CACHE_HIT_RATE]],
            "break-even (steps)": ["Multiline", [ANATOMY_BREAK_EVEN_STEPS]],
            "projected saving over the run (s)": ["Multiline", [ANATOMY_PROJECTED_SAVING_S]],
            "verification pass rate": ["Multiline", [ANATOMY_VERIFICATION_PASS_RATE]],
            "graph and backend coverage": ["Multiline", [ANATOMY_GRAPH_COVERAGE, ANATOMY_BACKEND_COVERAGE]],
            "ops run eagerly (of the eager step's)": ["Multiline", [ANATOMY_EAGER_OPS, ANATOMY_STEP_OPS]],
            "fallback kernel calls per step": ["Multiline", [ANATOMY_FALLBACK_CALLS]],
            "cost of measuring the anatomy (s)": ["Multiline", [ANATOMY_SAMPLING_S]],
            "host syncs per step": ["Multiline", [ANATOMY_HOST_SYNCS_STEP, ANATOMY_HOST_SYNCS_BETWEEN]],
            "guard checks: us per call, share of step": [
                "Multiline", [ANATOMY_GUARD_US_PER_CALL, ANATOMY_GUARD_SHARE]
            ],
        },
    }


def log_layout(loggers: Iterable[Logger]) -> None:
    for writer in tensorboard_writers(loggers):
        writer.add_custom_scalars(custom_scalars_layout())
