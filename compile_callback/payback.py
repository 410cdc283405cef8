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
before that. A compile served from the FX-graph cache says how fast *cached* code loads, not what a
region never compiled on this machine costs (on the H200 GPT-2's blocks loaded in 1.1 s warm, and the
whole model priced at that rate, ~6.5 s, then compiled cold in 21.5 s): candidates are priced as cold
compiles, from this run's cold compiles, else from the prior, a warm rate only raising neither.

The expected saving is the optimistic one the planner already uses for skipping: a quarter of the
candidate's share of the step. The whole model is tried first (one graph is usually fastest) unless the
estimates say it cannot repay over the batches left while a smaller region can; then the regions that
repay go first by net saving, and the whole model follows, judged on measured costs like any candidate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

FIXED_UNITS = 12  # what every compile pays, in leaf-module units (GPT-2: 3.4 s for a 10-leaf block, 21 s for 125 leaves)
PRIOR_SECONDS_PER_UNIT = {"inductor": 0.15}  # cold Inductor, H200, torch 2.11; see the module docstring
SAVED_SHARE = 0.25  # optimistic: compiling saves a quarter of the candidate's share of the step
# Optimistic for CUDA graphs on a launch-bound step, where they remove the host's launches: half of the kept
# regions' share (H200: ResNet-18 CIFAR's whole model 3.2x eager with graphs, GPT-2's blocks 1.01-1.02x over
# default mode).
GRAPH_SAVED_SHARE = 0.5
# A step is launch-bound where the host takes at least this share of the device's time to issue it.
LAUNCH_BOUND_SHARE = 0.7
# Optimistic for CUDA graphs where the kept plan's step is issued faster than the device runs it (the host
# keeps ahead): they only shorten the device's own gaps between kernels. The most seen on the H200 (torch
# 2.11): GPT-2's kept blocks, 1.015-1.031x over default mode in eight runs (sessions 21-22), ~3% of the step
# and ~5% of the blocks' share.
GRAPH_SAVED_SHARE_DEVICE_BOUND = 0.05
# Below this share of the device's step, the host issues the kept plan's step (from an empty launch queue)
# with room to spare and keeps ahead; a host that cannot keep up sets the step's pace and reads at or above 1
# (the time to the next batch holds the loop's work between steps, which the device's step does not). GPT-2's
# kept blocks on the H200 (session 22): the quickest of five probes 0.77 and 0.80 of a 38.3-38.8 ms step (single
# probes 0.65-0.87), CUDA graphs 1.015x and 1.026x over default mode where tried.
ISSUE_BOUND_SHARE = 0.9
# From this share on, graphs are priced as on a host-bound step; between the two bounds the price rises
# linearly, so a probe a percent either side of one bound moves it a little, not tenfold. Host-bound kept steps
# read 1.55 and 1.91 on the H200 (session 26, tests/test_cuda.py's small fused blocks: 4.1-5.2 ms to the next
# batch of a 2.7 ms step). GPT-2's kept blocks on a loaded host (session 25) read 0.953 of their 39.4 ms step:
# on the ramp 29% of their share, ~5.4 s over the ~765 batches left against ~3.6 s for recompiling and
# checking, so tried as at half their share (kept at 1.031x, they saved <=1% of the steps left for ~2.3 s of
# stopped training). The ramp does not decide that case; a higher top would, but no host-bound step of a
# larger model has been probed to place it.
ISSUE_HOST_BOUND_SHARE = 1.0


def compile_units(modules: Sequence[nn.Module], *, repeated: bool) -> int:
    """A region's size for compile cost: its leaf modules, one member's only for repeated blocks.

    ``nn.Identity`` leaves count nothing: they put no op in the graph. timm's ViT-B block has 7 of its 18
    leaves so (unused norms, layer scales, drop paths); counted, they priced its whole model at 30.9 s
    from its blocks' 3.8 s on the H200, and the whole model was skipped where its compile (17.8 s in
    the same process, some kernels cached) would have repaid."""
    members = modules[:1] if repeated else modules
    return sum(1 for module in members for m in module.modules()
               if next(m.children(), None) is None and not isinstance(m, nn.Identity))


@dataclasses.dataclass
class CompileCosts:
    """Seconds per unit of a cold compile: measured in this run where a cold compile was, else the
    backend's prior; compiles from a warm cache only stand in where neither exists."""

    backend: str
    measured: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # cold: (units, seconds)
    warm: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # served (partly) from the cache
    # Seconds each trial's set-up batch stopped training beyond its compile (verification, parking the
    # optimizer's state, a memory release): a trial costs them too. On the H200 GPT-2's blocks: 1.6-1.9 s a
    # trial beside a 3.5 s compile; priced at the compile alone, a CUDA-graph trial of them was run where
    # the 290 batches left could not repay its 5.2 s stall (2026-12-03).
    checks: list[float] = dataclasses.field(default_factory=list)

    def observe(self, units: int, seconds: float, *, cold: bool = True) -> None:
        if seconds > 0:
            (self.measured if cold else self.warm).append((units, seconds))

    def observe_check(self, seconds: float) -> None:
        """A trial's set-up batch spent ``seconds`` beyond its compile."""
        self.checks.append(max(0.0, seconds))

    @property
    def check_s(self) -> float:
        """What a trial's set-up costs beyond its compile: the mean of this run's, 0 before one was timed."""
        return sum(self.checks) / len(self.checks) if self.checks else 0.0

    def trial_seconds(self, units: int) -> float | None:
        """A trial's cost in stopped training: its compile as estimated plus the set-up measured in this run."""
        compile_s = self.seconds(units)
        return None if compile_s is None else compile_s + self.check_s

    @staticmethod
    def _rate_of(compiles: list[tuple[int, float]]) -> float:
        return sum(s for _, s in compiles) / sum(FIXED_UNITS + u for u, _ in compiles)

    @property
    def rate(self) -> float | None:
        """Seconds per unit (``FIXED_UNITS`` included), None when no compile was measured and no prior exists."""
        if self.measured:
            return self._rate_of(self.measured)
        prior = PRIOR_SECONDS_PER_UNIT.get(self.backend)
        if self.warm:  # a lower bound for a cold compile
            return max(prior or 0.0, self._rate_of(self.warm))
        return prior

    @property
    def known(self) -> bool:
        """Whether this run has timed any compile (a machine whose compiles were seen, cold or warm)."""
        return bool(self.measured or self.warm)

    @property
    def source(self) -> str:
        if self.measured:
            return f"from the {len(self.measured)} cold compile(s) measured in this run"
        prior = PRIOR_SECONDS_PER_UNIT.get(self.backend)
        if self.warm and prior is not None and prior >= self._rate_of(self.warm):
            return (f"from the prior for {self.backend}: this run's {len(self.warm)} compile(s) came from the "
                    f"cache, faster than a cold one")
        if self.warm:
            return f"from the {len(self.warm)} compile(s) measured in this run, served from the cache: a lower bound"
        return f"from the prior for {self.backend} (no compile measured yet)"

    def seconds(self, units: int) -> float | None:
        rate = self.rate
        return None if rate is None else rate * (FIXED_UNITS + units)


def saving_seconds(share: float, step_ms: float, batches: int, *, saved: float = SAVED_SHARE) -> float:
    """What compiling a region of ``share`` of a ``step_ms`` step may save over ``batches`` batches,
    ``saved`` of its share each batch."""
    return saved * share * step_ms / 1e3 * max(batches, 0)


@dataclasses.dataclass(frozen=True)
class Priced:
    """A candidate as the order sees it."""

    name: str
    share: float
    units: int
    whole: bool  # the whole model


def payback_order(candidates: Sequence[Priced], costs: CompileCosts, *, step_ms: float | None,
                  batches: int, in_background: Callable[[Priced], bool] = lambda _: False,
                  whole_saved: float = SAVED_SHARE) -> tuple[list[str], str | None]:
    """The order to try ``candidates`` in, and a note when it differs from the usual one.

    Usual: the whole model first, then the others by share. When the whole model's estimated compile
    cost exceeds what it could save over ``batches`` while another candidate's does not, the ones that
    repay go first by net saving (saving minus cost) and the rest follow as usual. When the whole model
    would be prepared in a background child (``in_background``), a part prepared so first may save more
    (:func:`part_first_in_background`); then it goes first and the whole model right after it.
    ``whole_saved``: the share of its step the whole model is expected to save (:data:`GRAPH_SAVED_SHARE`
    where it is tried with CUDA graphs first).
    """
    whole = [c for c in candidates if c.whole]
    parts = sorted((c for c in candidates if not c.whole), key=lambda c: -c.share)
    usual = [c.name for c in whole + parts]
    if not whole or not parts or not step_ms or costs.rate is None:
        return usual, None

    def net(candidate: Priced) -> float:  # whole_saved not here: GPT-2's CUDA graphs saved 0.2 of its step, not 0.5
        cost = costs.seconds(candidate.units) or 0.0
        return saving_seconds(candidate.share, step_ms, batches) - cost

    if net(whole[0]) >= 0:
        if not in_background(whole[0]):
            return usual, None
        first = part_first_in_background(whole[0], [p for p in parts if in_background(p)], costs,
                                         step_ms=step_ms, batches=batches, whole_saved=whole_saved)
        if first is None:
            return usual, None
        part, note = first
        return [part.name] + [name for name in usual if name != part.name], note
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


def part_first_in_background(whole: Priced, parts: Sequence[Priced], costs: CompileCosts, *, step_ms: float,
                             batches: int, whole_saved: float = SAVED_SHARE) -> tuple[Priced, str] | None:
    """The part to prepare in a background child before the whole model, and why; None: the whole model first.

    Children run one at a time, and training runs the plan before each meanwhile, so the order decides
    when each saving starts. Whole model first: it saves ``r_w`` a batch from ``c_w`` batches on (its
    child's time). A part first: ``r_p`` from ``c_p`` on, and the whole model's extra ``r_w - r_p`` from
    ``c_p + c_w`` on. Over the ``batches`` left the part goes first where that saves more: where it is
    ready much sooner than the whole model and saves much of what the whole model would (on the H200,
    GPT-2's repeated blocks: ready ~11 s after their child started against ~28 s for the whole model,
    1.14x against 1.24x; the plan the whole model's child leaves came at batch ~950 of a 1400-batch run,
    the blocks' would have at ~600). Rates are the optimistic shares of the step the order uses
    everywhere (:data:`SAVED_SHARE`; ``whole_saved`` for the whole model), times as children are priced
    (:func:`child_seconds`); the trials then measure, and the whole model is kept only if faster than
    the part before it."""
    whole_s = costs.seconds(whole.units)
    if whole_s is None:
        return None
    c_w = child_seconds(whole_s) * 1e3 / step_ms
    r_w = whole_saved * whole.share * step_ms

    def gain(part: Priced) -> float:
        c_p = child_seconds(costs.seconds(part.units) or 0.0) * 1e3 / step_ms
        r_p = min(SAVED_SHARE * part.share * step_ms, r_w)
        part_first = r_p * max(0.0, batches - c_p) + (r_w - r_p) * max(0.0, batches - c_p - c_w)
        return part_first - r_w * max(0.0, batches - c_w)

    best = max(parts, key=gain, default=None)
    if best is None or gain(best) <= 0:
        return None
    part_s = child_seconds(costs.seconds(best.units) or 0.0)
    note = (f"payback order: `{best.name}` is prepared in the background first (ready in ~{part_s:.0f} s against "
            f"~{child_seconds(whole_s):.0f} s for the whole model, estimated {costs.source}), then the whole model: "
            f"over the {batches} batches left that saves ~{gain(best) / 1e3:.1f} s more than the whole model first")
    return best, note


def graph_saved_share(issue_ms: float | None, step_ms: float) -> float:
    """The share of the kept regions' share of the step that CUDA graphs are priced to save, by how fast the
    host issues the kept step (``issue_ms``, None: not measured) against the ``step_ms`` (> 0) the device
    runs it in: :data:`GRAPH_SAVED_SHARE_DEVICE_BOUND` up to :data:`ISSUE_BOUND_SHARE` of the step (the host
    keeps ahead), :data:`GRAPH_SAVED_SHARE` from :data:`ISSUE_HOST_BOUND_SHARE` on (the host sets the pace) or
    unmeasured, linear between."""
    if issue_ms is None:
        return GRAPH_SAVED_SHARE
    where = (issue_ms / step_ms - ISSUE_BOUND_SHARE) / (ISSUE_HOST_BOUND_SHARE - ISSUE_BOUND_SHARE)
    span = GRAPH_SAVED_SHARE - GRAPH_SAVED_SHARE_DEVICE_BOUND
    return GRAPH_SAVED_SHARE_DEVICE_BOUND + min(1.0, max(0.0, where)) * span


@dataclasses.dataclass(frozen=True)
class GraphPrice:
    """The CUDA-graph trial of the kept regions as priced (the report's ``plan.graph_trial_price``): what it may
    save over the ``batches`` left against recompiling the kept regions (``reduce-overhead`` compiles its own
    graphs: on the H200 GPT-2's cold ones took 25.7 s after the default-mode ones had come from the cache in
    1.1 s) and checking them."""

    step_ms: float  # the kept plan's step, as its trial timed it
    batches: int
    share: float  # the kept regions' share of the step
    issue_ms: float | None  # the host's time to issue the kept step from an empty launch queue (None: not measured)
    saved_share: float  # of ``share``, each batch (graph_saved_share)
    saving_s: float
    compile_s: float
    check_s: float
    source: str  # how the compile was estimated

    @property
    def cost_s(self) -> float:
        return self.compile_s + self.check_s  # as CompileCosts.trial_seconds

    @property
    def issue_share(self) -> float | None:
        """The host's reading as a share of the step (None: not measured)."""
        return None if self.issue_ms is None else self.issue_ms / self.step_ms

    def as_report(self) -> dict[str, Any]:
        """The report's form: every field, the cost and the host's reading as a share of the step."""
        return {**dataclasses.asdict(self), "cost_s": self.cost_s, "issue_share_of_step": self.issue_share}

    def unpaid(self) -> str | None:
        """Why the trial cannot repay itself, or None where it may."""
        if self.saving_s >= self.cost_s:
            return None
        why = ""
        ratio = self.issue_share
        if ratio is not None and ratio < ISSUE_HOST_BOUND_SHARE:
            why = (f" (the host issues the kept plan's step in {self.issue_ms:.1f} ms, the device runs it in "
                   f"{self.step_ms:.1f} ms: ")
            why += ("graphs would only close the device's gaps between kernels)" if ratio <= ISSUE_BOUND_SHARE
                    else f"{ratio:.2f} of it, graphs priced at {self.saved_share:.0%} of the kept regions' share, "
                         f"between {GRAPH_SAVED_SHARE_DEVICE_BOUND:.0%} where the host keeps ahead and "
                         f"{GRAPH_SAVED_SHARE:.0%} where it sets the pace)")
        checking = f" and checking them ~{self.check_s:.1f} s more (as this run's trials did)" if self.check_s else ""
        return (f"reduce-overhead (CUDA graphs) not tried: the {self.batches} batches left would save "
                f"~{self.saving_s:.1f} s{why}, recompiling the kept regions for it costs ~{self.compile_s:.1f} s "
                f"(estimated {self.source}){checking}")


def graph_trial_price(kept: Sequence[Priced], costs: CompileCosts, *, step_ms: float | None,
                      batches: int, issue_ms: float | None = None) -> GraphPrice | None:
    """The CUDA-graph trial of the ``kept`` regions priced over ``batches`` (:class:`GraphPrice`;
    :func:`graph_saved_share` prices the graphs by ``issue_ms``), or None where nothing is known to price it
    by (no compile rate, no step)."""
    compile_s = costs.seconds(sum(c.units for c in kept)) if costs.known else None
    if compile_s is None or not step_ms:
        return None
    share = min(1.0, sum(c.share for c in kept))
    saved = graph_saved_share(issue_ms, step_ms)
    return GraphPrice(step_ms=step_ms, batches=batches, share=share, issue_ms=issue_ms, saved_share=saved,
                      saving_s=saving_seconds(share, step_ms, batches, saved=saved), compile_s=compile_s,
                      check_s=costs.check_s, source=costs.source)


# Background compiles (compile_callback.background), where chosen rather than asked for: a compile
# estimated below BACKGROUND_MIN_COMPILE_S stays in-process (it stops training about as briefly as the warm
# compile would), and a child is started only where the batches left last BACKGROUND_RUN_SHARE times its
# time: the plan it prepares then runs for at least a third of the run left, and the payback rule below
# judges whether that repays. A shorter run compiles in-process: over the whole run that saves more, though
# it stops training. Measured on the H200 (torch 2.11, cold caches, 2026-12-03, the whole model with CUDA
# graphs, benchmarks/diagnostics/child.py): a child's start-up (a fresh interpreter importing torch) took
# 6-10 s, loading the copy onto the device 4-6 s and its exit, which the run waited for, 3-9 s; compiling and
# checking took 2.1-2.2x the estimate (ResNet-50, estimated 20.7 s: 44 s, 63-75 s in all; ResNet-18 CIFAR,
# 9.6 s: 21.5 s, 38.5 s in all; GPT-2, 20.6 s: 43 s, 59 s in all) and a region's small compile more (GPT-2's
# blocks, 3.15 s: 24 s, 39 s in all). The first child now runs on an interpreter started with the fit and
# leaves without the teardown (background.Standby): ResNet-18 CIFAR's 32.0 s in all against 45.7 s fresh in
# one session (start-up 0.0002 s against 7.9 s, exit 0.4 s against 3.3-4.0 s before). CHILD_START_S (loading,
# a process's first compile) and CHILD_COMPILE_FACTOR price that first child; a later one starts a fresh
# interpreter, 6-10 s more than priced. Training
# beside the child ran as fast as alone (ResNet-50 29.8 ms, ResNet-18 CIFAR 8.0 ms a step). The trial then
# compiled from the warm cache in 1.4 s: a prepared candidate stops training for about WARM_COMPILE_SHARE of
# its cold compile (GPT-2's whole model 1.4 s of 21 s, a warm restart 2.2 s of 26.8 s).
BACKGROUND_MIN_COMPILE_S = 2.0
BACKGROUND_RUN_SHARE = 1.5
CHILD_START_S = 10.0
CHILD_COMPILE_FACTOR = 2.2
WARM_COMPILE_SHARE = 0.1


def child_seconds(estimate_s: float) -> float:
    """How long a child takes to prepare a compile estimated at ``estimate_s`` in-process."""
    return CHILD_START_S + CHILD_COMPILE_FACTOR * estimate_s


def background_pays(estimate_s: float | None, *, left_s: float) -> tuple[bool, str | None]:
    """Whether a candidate whose cold compile is estimated at ``estimate_s`` is compiled first in a child
    process, in a run with ``left_s`` seconds of eager steps left; where not, what its decision says
    (None: nothing worth saying)."""
    if estimate_s is None or estimate_s < BACKGROUND_MIN_COMPILE_S:
        return False, None
    if left_s < BACKGROUND_RUN_SHARE * child_seconds(estimate_s):
        return False, (f"not prepared in the background: the batches left (~{left_s:.0f} s at eager speed) are too "
                       f"few for a child's ~{child_seconds(estimate_s):.0f} s (start-up and compile) and the trial after it")
    return True, None


def after_background(estimate_s: float, *, step_ms: float, batches: int) -> tuple[float, int]:
    """A background-prepared candidate's price: (seconds of stopped training, batches left to save in
    once the child is done; training runs the plan before it meanwhile)."""
    waiting = math.ceil(child_seconds(estimate_s) * 1e3 / step_ms)
    return WARM_COMPILE_SHARE * estimate_s, max(0, batches - waiting)
