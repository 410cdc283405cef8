"""compile-callback: make torch.compile pay off inside Lightning training runs, and show why when it does not."""

from compile_callback.callback import CompileCallback
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
