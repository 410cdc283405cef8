"""compile-callback: make torch.compile pay off inside Lightning training runs, and show why when it does not."""

from typing import Any

from compile_callback.collate import PadCollate, PaddingStats, ShapeCensus, choose_buckets, padding_waste
from compile_callback.loaders import rewrap_collate
from compile_callback.regions import CompileOptions, Region, compile_region, resolve_regions, revert_region
from compile_callback.report import Decision
from compile_callback.timing import StepTimer
from compile_callback.watch import CompileWatch

__all__ = [
    "CompileCallback",
    "CompileOptions",
    "CompileWatch",
    "Decision",
    "PadCollate",
    "PaddingStats",
    "ShapeCensus",
    "Region",
    "StepTimer",
    "choose_buckets",
    "compile_region",
    "padding_waste",
    "resolve_regions",
    "revert_region",
    "rewrap_collate",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``CompileCallback`` is imported on first use, so the plain layer (planner, watch, collate, ...) imports
    without Lightning; ``from compile_callback import CompileCallback`` and LightningCLI's class_path work as usual."""
    if name == "CompileCallback":
        from compile_callback.callback import CompileCallback

        return CompileCallback
    raise AttributeError(f"module 'compile_callback' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"CompileCallback"})
