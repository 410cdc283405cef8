"""Which candidate repays first: compile seconds estimated per region, saving over the batches left.

A compile stops training while it runs, so in a short run the candidate to try first is the one whose
expected saving over the remaining batches beats its compile cost by the most, not the biggest: on the
H200 (torch 2.11, cold caches) GPT-2's whole model compiles in ~21 s and one of its twelve blocks, which
serves all twelve, in ~3.4 s. Compile cost grows with the code dynamo traces, so a region is sized in
*units*: its leaf modules (a group of repeated blocks counts one block: one compiled graph serves them
all, as the block's forward is the same code), plus a fixed part for what every compile pays (dynamo's
setup, the backward graph, Inductor's codegen). The seconds per unit come from the compiles measured in
this run; before the first one, from a prior measured for Inductor on the H200 (the two GPT-2 figures
above fit ``0.15 s x (12 + units)``; ResNet-50's whole model, 126 leaves, took 21-30 s). Other backends
get no prior: their costs are unknown until one compile has been timed, so nothing is reordered for them
before that.

The expected saving is the optimistic one the planner already uses for skipping: a quarter of the
candidate's share of the step. The whole model is tried first (one graph is usually fastest) unless the
estimates say it cannot repay over the batches left while a smaller region can; then the regions that
repay go first by net saving, and the whole model follows, judged on measured costs like any candidate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torch import nn

FIXED_UNITS = 12  # what every compile pays, in leaf-module units (GPT-2: 3.4 s for a 10-leaf block, 21 s for 125 leaves)
PRIOR_SECONDS_PER_UNIT = {"inductor": 0.15}  # cold Inductor, H200, torch 2.11; see the module docstring
SAVED_SHARE = 0.25  # optimistic: compiling saves a quarter of the candidate's share of the step


def compile_units(modules: Sequence[nn.Module], *, repeated: bool) -> int:
    """A region's size for compile cost: its leaf modules, one member's only for repeated blocks."""
    members = modules[:1] if repeated else modules
    return sum(1 for module in members for m in module.modules() if next(m.children(), None) is None)


@dataclasses.dataclass
class CompileCosts:
    """Compile seconds per unit: measured in this run where any compile was, else the backend's prior."""

    backend: str
    measured: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (units, seconds)

    def observe(self, units: int, seconds: float) -> None:
        if seconds > 0:
            self.measured.append((units, seconds))

    @property
    def rate(self) -> float | None:
        """Seconds per unit (``FIXED_UNITS`` included), None when neither a measurement nor a prior exists."""
        if self.measured:
            return sum(s for _, s in self.measured) / sum(FIXED_UNITS + u for u, _ in self.measured)
        return PRIOR_SECONDS_PER_UNIT.get(self.backend)

    @property
    def source(self) -> str:
        if self.measured:
            return f"from the {len(self.measured)} compile(s) measured in this run"
        return f"from the prior for {self.backend} (no compile measured yet)"

    def seconds(self, units: int) -> float | None:
        rate = self.rate
        return None if rate is None else rate * (FIXED_UNITS + units)


def saving_seconds(share: float, step_ms: float, batches: int) -> float:
    """What compiling a region of ``share`` of a ``step_ms`` step may save over ``batches`` batches."""
    return SAVED_SHARE * share * step_ms / 1e3 * max(batches, 0)


@dataclasses.dataclass(frozen=True)
class Priced:
    """A candidate as the order sees it."""

    name: str
    share: float
    units: int
    whole: bool  # the whole model


def payback_order(candidates: Sequence[Priced], costs: CompileCosts, *, step_ms: float | None,
                  batches: int) -> tuple[list[str], str | None]:
    """The order to try ``candidates`` in, and a note when it differs from the usual one.

    Usual: the whole model first, then the others by share. When the whole model's estimated compile
    cost exceeds what it could save over ``batches`` while another candidate's does not, the ones that
    repay go first by net saving (saving minus cost) and the rest follow as usual.
    """
    whole = [c for c in candidates if c.whole]
    parts = sorted((c for c in candidates if not c.whole), key=lambda c: -c.share)
    usual = [c.name for c in whole + parts]
    if not whole or not parts or not step_ms or costs.rate is None:
        return usual, None

    def net(candidate: Priced) -> float:
        cost = costs.seconds(candidate.units) or 0.0
        return saving_seconds(candidate.share, step_ms, batches) - cost

    if net(whole[0]) >= 0:
        return usual, None
    repaying = sorted((c for c in parts if net(c) > 0), key=lambda c: -net(c))
    if not repaying:
        return usual, None
    first = [c.name for c in repaying]
    order = first + [name for name in usual if name not in first]
    w = whole[0]
    note = (f"payback order: the whole model's compile (~{costs.seconds(w.units):.1f} s, estimated "
            f"{costs.source}) cannot repay over the {batches} batches left (saves ~"
            f"{saving_seconds(w.share, step_ms, batches):.1f} s); tried first: {', '.join(first)}")
    return order, note
