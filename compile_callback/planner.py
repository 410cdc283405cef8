"""Policy: which regions to compile when, and whether to keep them.

A planner is asked before every training batch what the batch is for (a warm-up step that is not
timed, an eager baseline step, a step of a trial, a steady compiled step) and may compile or revert
regions at that point. The mechanism it uses (compile/revert a region, time a step, verify numerics)
lives in ``regions``, ``timing`` and ``verify``; the decisions live here.
"""

from __future__ import annotations

from typing import Any

from compile_callback.regions import CompileOptions, Region, compile_region, revert_region
from compile_callback.report import Decision

WARMUP = None  # a batch that is run but not timed (label None)
EAGER = "eager"
COMPILED = "compiled"


class FixedPlanner:
    """Compiles the regions the user named, after an eager baseline, and keeps them.

    Args:
        regions: the resolved regions.
        options: ``torch.compile`` options for every region.
        baseline_steps: eager batches timed before compiling (0 compiles before the first batch).
        warmup_steps: batches not timed at the start and after compiling (allocator, autotuning,
            CUDA-graph recording).
    """

    def __init__(self, regions: list[Region], options: CompileOptions, *, baseline_steps: int, warmup_steps: int) -> None:
        self.regions = regions
        self.options = options
        self.baseline_steps = baseline_steps
        self.warmup_steps = warmup_steps
        self.decisions: list[Decision] = []
        self.applied = False
        self._settle_until = 0

    @property
    def frozen(self) -> bool:
        return self.applied

    def apply(self, batch_index: int) -> None:
        for region in self.regions:
            compile_region(region, self.options)
            self.decisions.append(
                Decision(
                    region=region.name,
                    modules=[name or "model" for name in region.module_names],
                    mode=self.options.mode or "default",
                    kept=True,
                    reason="named in regions=",
                    step=batch_index,
                )
            )
        self.applied = True
        self._settle_until = batch_index + self.warmup_steps

    def before_fit(self) -> None:
        if self.applied:  # resumed from a checkpoint: apply the saved plan at once, no new baseline
            for region in self.regions:
                compile_region(region, self.options)
            self._settle_until = self.warmup_steps
        elif self.baseline_steps == 0:
            self.apply(0)

    def before_batch(self, batch_index: int, **_: Any) -> str | None:
        if not self.applied:
            if batch_index < self.warmup_steps:
                return WARMUP
            if batch_index < self.warmup_steps + self.baseline_steps:
                return EAGER
            self.apply(batch_index)
        return WARMUP if batch_index < self._settle_until else COMPILED

    def after_batch(self, batch_index: int, **_: Any) -> None:
        return None

    def revert_all(self) -> None:
        for region in self.regions:
            if region.is_compiled:
                revert_region(region)

    def state_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "decisions": [d.as_dict() for d in self.decisions]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("applied"):
            self.decisions = [Decision.from_dict(d) for d in state.get("decisions", [])]
            self.applied = True
