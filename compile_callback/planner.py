"""Policy: which regions to compile when, and whether to keep them.

A planner is asked before every training batch what the batch is for (a warm-up step that is not
timed, an eager baseline step, a step of a trial, a steady compiled step) and may compile or revert
regions at that point. The mechanism it uses (compile/revert a region, time a step, verify numerics)
lives in ``regions``, ``timing`` and ``verify``; the decisions live here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from compile_callback import torch_internals
from compile_callback.background import POLL_EVERY, BackgroundCompile, Unavailable
from compile_callback.memory import GB, graph_pool_misfit
from compile_callback.payback import (
    GRAPH_SAVED_SHARE, LAUNCH_BOUND_SHARE, SAVED_SHARE, CompileCosts, GraphPrice, Priced, after_background, background_pays,
    compile_units, graph_trial_price, payback_order, saving_seconds,
)
from compile_callback.profile import RegionProfiler, repeated_block_groups
from compile_callback.regions import (
    MODEL,
    CompileOptions,
    Region,
    backend_name,
    compile_region,
    guard_region,
    region_name,
    revert_region,
    uses_cuda_graphs,
)
from compile_callback.report import Decision, cache_state
from compile_callback.timing import disturbed, lower_quartile, median_noise, paired_speedup
from compile_callback.verify import (
    VerificationResult, cuda_devices, in_host_memory, release_device_memory, release_host_memory,
    run_forward_and_backward, timed_stage, verify_module,
)
from compile_callback.watch import twin_of

WARMUP = None  # a batch that is run but not timed (label None)
EAGER = "eager"
COMPILED = "compiled"
CONTROL = ":control"  # suffix of a trial's label: its steps that ran the plan before it
INTERLEAVE_BLOCK = 4  # steps per block of an interleaved trial, the first not timed
ISSUE = "issue"  # a batch of the kept plan that starts from an empty launch queue: the run times its issue
ISSUE_PROBES = 5  # such batches before the CUDA-graph trial of a kept plan is priced (the quickest stands)
GROUP_UNPARKED = 4  # a group of at least this many blocks is verified with the optimizer's state and gradients in place
CONTROL_WINDOWS = 3  # a CUDA-graph trial's control window, timed again (at most twice) while disturbed
DISTURBED = 0.02  # ... where its median sits more than 2% above its lower decile (see timing.disturbed)


class Planner(Protocol):
    """What the callback drives and reads, the same for both planners (no probing for attributes).

    ``searches`` says whether the plan comes from trials (:class:`AutoPlanner`): its trials recompile, so
    the churn policy judges only the frozen plan's recompiles, and the frozen plan is worth caching.
    ``priced_speedup`` is the plan's speedup as its trials measured it (None where there are none).
    """

    searches: bool
    regions: list[Region]
    decisions: list[Decision]
    notes: list[str]
    launch_bound: bool | None
    issue_ms: float | None  # the kept plan's step issued from an empty launch queue (AutoPlanner._time_issue)
    issue_samples_ms: list[float]  # ... each time it was timed, this rank's
    graph_price: GraphPrice | None  # the CUDA-graph trial of the kept plan as last priced, rank 0's (AutoPlanner._graphs_unpaid)
    coverage: float | None
    eager_ms: float | None

    @property
    def frozen(self) -> bool: ...

    def background_progress(self) -> dict[str, Any] | None: ...

    def waiting_alone(self) -> bool:
        """Whether it only waits for a background child, in one process: the batches until its next poll need
        nothing of it (:meth:`compile_callback.run.CompileRun.quiet_step`)."""
        ...

    def before_fit(self) -> None: ...

    def before_batch(self, batch_index: int, **_: Any) -> str | None: ...

    def after_batch(self, batch_index: int, **_: Any) -> None: ...

    def stall_in_batch_s(self) -> float:
        """Host seconds the planner's own work took inside the batch just run (the profiler holding its
        inputs), counted once: training waited for it as for the work before a batch."""
        ...

    def close(self) -> None: ...

    def recompile(self, region: Region, options: CompileOptions) -> None: ...

    def compile_static(self, shape_budget: int) -> None: ...

    def revert(self, region: Region, reason: str) -> None: ...

    def region_modules(self) -> dict[str, list[nn.Module]]: ...

    def priced_speedup(self) -> tuple[float, float] | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _CompilesRegions:
    """What both planners do to a region on request: compile it again, make the plan static, revert it.
    Subclasses set ``regions``, ``options``, ``decisions`` and ``_failed`` (a run-time failure's handler)."""

    regions: list[Region]
    options: CompileOptions
    decisions: list[Decision]
    _failed: Callable[[Region, BaseException], None]

    def recompile(self, region: Region, options: CompileOptions) -> None:
        """Compiles ``region`` again with ``options``, guarded like every region this planner compiles."""
        compile_region(region, options, on_error=self._failed)

    def compile_static(self, shape_budget: int) -> None:
        """Batches come in a few fixed (padded) shapes: each is compiled as a static graph of its own,
        regions compiled before the first batch (no eager baseline, a resumed or cached plan) with
        ``dynamic`` unset included."""
        self.options = dataclasses.replace(self.options, dynamic=False)
        for region in self.regions:
            if region.is_compiled and region.compiled_with.dynamic is None:
                self.recompile(region, dataclasses.replace(region.compiled_with, dynamic=False))

    def revert(self, region: Region, reason: str) -> None:
        """Puts ``region`` back to eager for the rest of the run (the churn policy), its decision saying why."""
        revert_region(region)
        mark_not_kept(self.decisions, region, reason)


class FixedPlanner(_CompilesRegions):
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
        self.searches = False
        self.notes: list[str] = []
        self.launch_bound: bool | None = None  # not measured: nothing is chosen by it
        self.issue_ms: float | None = None
        self.issue_samples_ms: list[float] = []
        self.graph_price: GraphPrice | None = None  # the CUDA-graph trial of the kept plan as last priced, rank 0's
        self.coverage: float | None = None
        self.eager_ms: float | None = None  # the callback's timer holds the baseline

    @property
    def frozen(self) -> bool:
        return self.applied

    def _failed(self, region: Region, error: BaseException) -> None:
        mark_failed(self.decisions, region, error)

    def apply(self, batch_index: int) -> None:
        for region in self.regions:
            compile_region(region, self.options, on_error=self._failed)
            self.decisions.append(
                Decision(
                    region=region.name,
                    modules=[name or "model" for name in region.module_names],
                    mode=self.options.mode_name,
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
                if any(d.region == region.name and d.kept for d in self.decisions):
                    compile_region(region, self.options, on_error=self._failed)
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

    def stall_in_batch_s(self) -> float:
        return 0.0

    def close(self) -> None:
        return None

    def priced_speedup(self) -> tuple[float, float] | None:
        return None  # no trials: the callback prices the plan against its eager baseline

    def waiting_alone(self) -> bool:
        return False

    def background_progress(self) -> None:
        return None  # named regions compile in place, never in a child

    def region_modules(self) -> dict[str, list[nn.Module]]:
        """The named regions, by name, with their modules."""
        return {region.name: list(region.modules) for region in self.regions}

    def state_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "decisions": [d.as_dict() for d in self.decisions]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("applied"):
            self.decisions = [Decision.from_dict(d) for d in state.get("decisions", [])]
            self.applied = True


def candidate_block(block: int) -> bool:
    """Whether block ``block`` of an interleaved trial runs the candidate: compiled, control, control,
    compiled, and again. With alternating pairs (compiled, control, compiled, ...) the control always ran
    later, so steps that lengthen over the trial made an eager-speed candidate look 9% faster (a loaded
    2-core machine kept one); in this order a steady drift falls on both sides alike."""
    return block % 4 in (0, 3)


def _setup_s(verdict: VerificationResult, released: dict[str, float], child: dict[str, float]) -> dict[str, float]:
    """A decision's ``setup_s``: the trial's set-up batch by piece (see :class:`~compile_callback.report.Decision`),
    then the background child's stages, where one ran (training went on meanwhile)."""
    return {**released, **verdict.seconds, **{f"in the child: {stage}": t for stage, t in child.items()}}


def _retimed(windows: int) -> str:
    """How a CUDA-graph trial's control was timed, for its decision's reason ("" for one quiet window)."""
    return "" if windows == 1 else f" (the quickest of {windows} windows: the host disturbed the first)"


def mark_failed(decisions: list[Decision], region: Region, error: BaseException) -> None:
    """Records that a kept region failed at run time and now runs eager."""
    text = torch_internals.describe_error(error)[:300]
    if isinstance(error, torch.OutOfMemoryError):
        text = f"out of memory: {release_device_memory()}; {text}"
    mark_not_kept(decisions, region, f"failed at run time, reverted to eager and the call rerun eagerly: {text}")


def mark_not_kept(decisions: list[Decision], region: Region, reason: str) -> None:
    """A kept region is kept no more: its own decision, and a kept group's (the CUDA-graph trial of
    several kept regions) it is part of, say so."""
    # Decisions list modules by display name (the root as "model", which a child may also be called).
    names = {name or MODEL for name in region.module_names}
    for decision in decisions:
        shares_modules = region.name != MODEL and decision.region != MODEL and names & set(decision.modules)
        if decision.kept and (decision.region == region.name or shares_modules):
            decision.kept = False
            decision.reason = reason


def mark_replaced(decisions: list[Decision], region: Region, by: str) -> None:
    """A kept region is replaced by ``by`` (the whole model), whose speedup was measured against it: its
    decision is kept no more, and its speedup still prices the plan (:meth:`AutoPlanner.priced_speedup`)."""
    for decision in decisions:
        if decision.kept and decision.region == region.name:
            decision.kept = False
            decision.replaced_by = by
            decision.reason += f"; then replaced by `{by}`, faster than it"


def _snapshot(regions: list[Region]) -> list[tuple[nn.Module, Any]]:
    """The compiled code ``regions`` run now, module by module, for :func:`_put_back` (no compile again);
    pairs, not a dict: a module class may define ``__eq__`` and so not hash."""
    return [(m, torch_internals.compiled_call(m)) for r in regions for m in r.modules]


def _set_aside(regions: list[Region]) -> list[tuple[nn.Module, Any]]:
    """Runs ``regions`` eagerly for now, their compiled code kept for :func:`_put_back` (no compile again)."""
    saved = _snapshot(regions)
    for module, _ in saved:
        torch_internals.restore_compiled_call(module, None)
    return saved


def _inside(part: Region, whole: Region) -> bool:
    """Whether every module of ``part`` lies inside ``whole``'s (the root, ``""``, holds every one)."""
    return all(any(w == "" or n == w or n.startswith(w + ".") for w in whole.module_names) for n in part.module_names)


def _put_back(saved: list[tuple[nn.Module, Any]]) -> None:
    for module, call in saved:
        torch_internals.restore_compiled_call(module, call)


PROFILE = "profile"


def candidate_regions(root: nn.Module) -> dict[str, list[str]]:
    """The regions the auto planner may try, ``name -> module names`` (``""`` is the root): the whole
    model, each group of repeated blocks (``"blocks.*"``) and each top-level child outside them. A
    child called ``model`` is region ``"self.model"`` (:func:`region_name`): ``"model"`` is the root's."""
    regions: dict[str, list[str]] = {MODEL: [""]}
    groups = repeated_block_groups(root)
    regions.update(groups)
    grouped = {member for members in groups.values() for member in members}
    for name, _ in root.named_children():
        if not any(member == name or member.startswith(name + ".") for member in grouped):
            regions[region_name(name)] = [name]
    return regions
MIN_SHARE = 0.05  # submodules under 5% of the eager forward are not worth a compile of their own
# Where training_step does not call the LightningModule's forward, a top-level child taking at least this share
# of the modules' forward time (``self.model`` of the usual Hugging Face / timm wrapper) is the whole model.
WHOLE_STEP_SHARE = 0.9


@dataclasses.dataclass
class Candidate:
    """A region the auto planner may try, with its share of the profiled eager step."""

    region: Region
    forward_ms: float
    share: float
    mode: str | None = None
    cold: bool = False  # too small a share (on this rank's timings) to be worth a compile of its own
    units: int = 0  # its size for compile cost (payback.compile_units)
    whole: bool = False  # the whole model: the LightningModule's forward, or the child that holds the step

    @property
    def name(self) -> str:
        return self.region.name

    @property
    def priced(self) -> Priced:
        """As the payback order prices it."""
        return Priced(self.name, self.share, self.units, self.whole)


class AutoPlanner(_CompilesRegions):
    """Profile, then compile candidates one at a time; keep each only if it verifies and measures faster.

    The script, one batch per ``yield``: ``warmup`` eager batches (not timed), ``profile`` batches
    with forward hooks on the candidates, ``baseline`` eager batches timed, then for each candidate:
    compile in place and verify against eager on a held input (before the batch, outside its timing),
    ``settle`` batches (lazy backward compile, autotuning, CUDA-graph recording), ``measure`` batches
    timed; keep it when the current plan's median over its median is at least ``min_speedup`` and
    beyond the noise, else revert. The whole model is tried first (one graph is usually best); if it is
    not kept, repeated block groups and hot submodules follow, each on top of what was kept. When the
    step is launch-bound on CUDA, ``reduce-overhead`` (CUDA graphs) is tried last: on the largest region tried
    where it was not kept (:meth:`_graphs_of_the_largest_tried`), and on the kept plan where that did not keep
    graphs.

    Args:
        root: the LightningModule.
        options: the user's ``torch.compile`` options (mode ``None`` = choose by measurement).
        timer: the callback's step timer; the planner reads medians from it.
        watch: the callback's compile watch; the planner reads compile seconds from it.
        agree: makes every rank take rank 0's value (``strategy.broadcast``); identity on one device.
        agree_all: true on every rank only if true on every rank (``strategy.reduce_boolean_decision``);
            for correctness: verification and a trial's survival. ``bool`` on one device.
        remaining_batches: how many training batches the run still has.
        context: the training step's forward context for verification (precision/autocast).
        background: starts a child process that compiles a candidate into the run's Inductor cache while
            training goes on (:mod:`compile_callback.background`); None: trials compile in-process.
        background_always: use ``background`` for every candidate; else where it pays
            (:func:`~compile_callback.payback.background_pays`).
        processes: the ranks (collectives through ``agree``).
        rank_zero: whether this process is rank 0 (it starts background children; a rank on another
            device than rank 0's starts its own, as Inductor's cache key holds the inputs' device).
    """

    # Long on purpose: the planner's settings and the per-fit state it starts from, listed once.
    def __init__(
        self,
        root: nn.Module,
        options: CompileOptions,
        *,
        timer: Any,
        watch: Any,
        device: torch.device,
        warmup_steps: int,
        profile_steps: int,
        baseline_steps: int,
        trial_steps: int,
        min_speedup: float,
        max_trials: int,
        verify: bool,
        tolerance: float | None,
        agree: Callable[[Any], Any],
        remaining_batches: Callable[[], int],
        context: Callable[[], Any],
        agree_all: Callable[[bool], bool] = bool,
        idle_state: Callable[[], list[torch.Tensor]] = list,
        activation_bytes: Callable[[], int | None] = lambda: None,
        room_bytes: Callable[[], int | None] = lambda: None,
        peak_bytes: Callable[[], int | None] = lambda: None,
        background: Callable[..., BackgroundCompile] | None = None,
        background_always: bool = False,
        processes: int = 1,
        rank_zero: bool = True,
    ) -> None:
        self.root = root
        self.options = options
        self.timer = timer
        self.watch = watch
        self.device = device
        self.warmup_steps = warmup_steps
        self.profile_steps = profile_steps
        self.baseline_steps = baseline_steps
        self.trial_steps = trial_steps
        self.min_speedup = min_speedup
        self.max_trials = max_trials
        self.verify = verify
        self.tolerance = tolerance
        self.agree = agree  # rank 0's value, on every rank: decisions from timings
        self.agree_all = agree_all  # true on every rank only if true on all: correctness
        self.remaining_batches = remaining_batches
        self.context = context
        self.idle_state = idle_state  # tensors no forward or backward reads (the optimizer's state)
        self.activation_bytes = activation_bytes  # the eager step's activations (memory.graph_pool_misfit)
        self.room_bytes = room_bytes  # what a new reservation can take now (memory.room_bytes)
        self.peak_bytes = peak_bytes  # the fit's peak so far (memory.peak_bytes), stamped on each decision
        # (name, module, held input, options, another=...) -> a child compiling it (background.Launcher), or None: off.
        self.background = background
        self.background_always = background_always  # asked for (True), not chosen where it pays (None)
        self.processes = processes  # the ranks (1: one process)
        self.rank_zero = rank_zero
        self.children_started = 0
        # (region, batch it started at, its child or None on a rank that waits for rank 0's) while one compiles
        self.compiling_in_background: tuple[str, int, Any] | None = None
        self.decisions: list[Decision] = []
        self.regions: list[Region] = []  # kept, compiled
        self._kept: list[Region] = []  # kept by agreement (a failing guard drops one from `regions` on its rank only)
        self._numerics_refused: dict[str, str] = {}  # region -> the mode whose verification its numerics failed
        self.notes: list[str] = []
        self.searches = True
        self.frozen = False
        self.launch_bound: bool | None = None
        self.coverage: float | None = None
        self.eager_ms: float | None = None
        self._host_ms: list[float] = []
        self.issue_ms: float | None = None  # the kept plan's step issued from an empty queue (ISSUE batches)
        self.issue_samples_ms: list[float] = []  # every ISSUE batch's, this rank's
        self.graph_price: GraphPrice | None = None  # the CUDA-graph trial of the kept plan as last priced, rank 0's
        self._batch_index = 0
        self._label: str | None = WARMUP
        self._script = self._run()
        self._saved_plan: list[dict[str, Any]] | None = None
        self.profiler: RegionProfiler | None = None
        self._all_candidates: list[Candidate] = []
        self.weighed: list[dict[str, Any]] = []  # the candidates the order weighed (payback.payback_order)
        self._last_failure = ""
        self._trial_length = trial_steps  # longer where batches come in several shapes (set after the baseline)
        self._settle_per_shape = 0  # timed steps a trial discards on each shape
        self._by_shape = False  # whether trials compare steps shape by shape
        self.shape_budget = 0  # recompiles per region expected from static padding buckets (compile_static)

    # -- the interface the callback drives --------------------------------------------------------
    def before_fit(self) -> None:
        if self._saved_plan is not None:
            self._apply_saved_plan(self._saved_plan)

    def before_batch(self, batch_index: int, *, issue_ms: float | None = None, **_: Any) -> str | None:
        """``issue_ms``: the host's milliseconds from the last :data:`ISSUE` batch's start to this one's."""
        if issue_ms is not None:
            self.issue_samples_ms.append(issue_ms)
        self._batch_index = batch_index
        self._label = next(self._script)
        return self._label

    def after_batch(self, batch_index: int, *, host_ms: float | None = None, **_: Any) -> None:
        if self._label == EAGER and host_ms is not None:
            self._host_ms.append(host_ms)

    def stall_in_batch_s(self) -> float:
        if self.profiler is None:
            return 0.0
        return self.profiler.take_holding_s()

    def close(self) -> None:
        """Ends the script where it stands (fit is over): a trial cut short puts its plan back."""
        self._script.close()

    def compile_static(self, shape_budget: int) -> None:
        """As every planner does; besides, up to ``shape_budget`` recompiles per region (one graph per
        bucket) do not count against a trial."""
        self.shape_budget = shape_budget
        super().compile_static(shape_budget)

    def _failed(self, region: Region, error: BaseException) -> None:
        self._last_failure = torch_internals.describe_error(error)[:300]
        if region in self.regions:
            self.regions.remove(region)
        mark_failed(self.decisions, region, error)

    # -- the script ----------------------------------------------------------------------------------
    # Long on purpose: the search, step by step, as one generator that reads in the order it runs.
    def _run(self) -> Iterator[str | None]:
        for _ in range(self.warmup_steps):
            yield WARMUP
        candidates = self._candidate_modules()
        # Only the whole model's input is held now; a part's when its trial comes (_hold_inputs).
        self.profiler = RegionProfiler(candidates, self.device, hold={""})
        self.profiler.attach()
        for _ in range(self.profile_steps):
            self.profiler.steps += 1
            yield PROFILE
        self.profiler.detach()
        for _ in range(self.baseline_steps):
            yield EAGER
        shapes, steps = self._shapes_seen()
        if self._recurring(shapes, steps) and steps < 3 * shapes:
            # A few shapes that recur, too rarely yet to price each: more eager steps, about three a shape.
            for _ in range(min(3 * shapes - steps, 2 * self.baseline_steps)):
                yield EAGER
            shapes, steps = self._shapes_seen()
        self.eager_ms = self.agree(self.timer.median_ms(EAGER, wait=True))
        self._fit_trials_to_shapes(shapes, steps)
        device_ms = self.eager_ms
        host_ms = statistics.median(self._host_ms) if self._host_ms else None
        if self.device.type == "cuda" and device_ms and host_ms:
            # The GPU waits on the host when issuing the step takes about as long as running it. Measured
            # as the loop runs: with no host sync per step a host that keeps ahead fills the launch queue
            # and then waits, so its time nears the device's and CUDA graphs are tried first (on the H200
            # the right call for ResNet-50/18, within 1% of default mode for GPT-2). A step of few kernels
            # leaves the queue unfilled and reads below (H200, session 22: four blocks of a 2048-wide matmul
            # and thirty elementwise ops, a 12.5 ms eager step, not launch-bound). The kept plan's step is
            # timed from an empty queue before its CUDA-graph trial (_time_issue).
            self.launch_bound = bool(self.agree(host_ms >= LAUNCH_BOUND_SHARE * device_ms))
        current_ms = self.eager_ms
        trials = 0
        self._all_candidates = self._candidates(candidates)
        plan = self._order(self._all_candidates)
        whole_at = next((i for i, c in enumerate(plan) if c.whole), None)
        if self._graphs_first() and whole_at is not None:
            # A launch-bound step gains most from CUDA graphs, which need the whole step in few graphs:
            # the whole model is tried with reduce-overhead before it is in default mode.
            plan.insert(whole_at, dataclasses.replace(plan[whole_at], mode="reduce-overhead"))
        whole_skipped = False
        for index, candidate in enumerate(plan):
            if trials >= self.max_trials:
                self.notes.append(f"stopped after max_trials={self.max_trials}")
                break
            if self._whole_kept():
                break  # the whole model is compiled: its parts (and other modes of it) are not tried
            if candidate.whole and whole_skipped:
                continue  # its other mode costs the same compile: skipped once, said once
            if candidate.name in self._numerics_refused:
                self.notes.append(f"`{candidate.name}` not tried in {candidate.mode or 'default'} mode: its numerics "
                                  f"differed from eager in {self._numerics_refused[candidate.name]} mode, and the "
                                  "modes tried share their kernels")
                continue
            if not self._worth_trying(candidate, current_ms):
                whole_skipped = whole_skipped or candidate.whole
                continue
            trials += 1
            # A part prepared before the whole model (payback.part_first_in_background): the whole model's
            # child follows whatever the part's outcome, on an interpreter started as the part's is handed over.
            whole_follows = not candidate.whole and any(c.whole for c in plan[index + 1:])
            kept_ms = yield from self._trial(candidate, current_ms, label=f"trial:{index}", another=whole_follows)
            if kept_ms is not None:
                current_ms = kept_ms
        tried_graphs = any(d.mode == "reduce-overhead" for d in self.decisions)  # the whole model's, tried first
        graphs = self._graphs_of_the_largest_tried(current_ms, trials)
        if graphs is not None:
            trials += 1
            kept_ms = yield from self._trial(graphs, current_ms, label=f"trial:{len(plan)}")
            if kept_ms is not None:
                current_ms = kept_ms
                tried_graphs = True  # where they were not kept, the kept plan's own graph trial may still follow
        # A kept region's guard reverts it on its own rank when its compiled code fails; before the
        # ranks go on together, a region lost on one rank is given up on all of them.
        if self._kept and not self.agree_all(all(r in self.regions for r in self._kept)):
            for region in self._kept:
                revert_region(region)
                mark_not_kept(self.decisions, region, "a kept region failed at run time on some rank: reverted on every rank")
            self.regions.clear()
            self._kept.clear()
            self.notes.append("a kept region failed at run time on some rank: every kept region reverted on every rank")
        yield from self._kept_plan_graphs(current_ms, trials, tried_graphs)
        release_host_memory()  # verification's pinned copies: the search is over
        self.frozen = True
        self.coverage = self._coverage()
        while True:
            yield COMPILED

    def _kept_plan_graphs(self, current_ms: float | None, trials: int, tried_graphs: bool) -> Iterator[str | None]:
        """After the search: the kept plan's CUDA-graph trial where it may repay (on a launch-bound GPU step, no mode
        asked for, none tried yet, ``max_trials`` not reached), or a note that says why there is none."""
        remaining = self.remaining_batches() - (self.warmup_steps + 2 + self._graph_trial_batches())
        if self._kept and self._graphs_first() and not tried_graphs and trials >= self.max_trials:
            self.notes.append(f"reduce-overhead (CUDA graphs) of the kept plan not tried: "
                              f"max_trials={self.max_trials} reached")
        elif self._kept and self._graphs_first() and not tried_graphs:
            unpaid = self._graphs_unpaid(current_ms, remaining)
            if unpaid is None and remaining > ISSUE_PROBES:  # the probes can only lower the price: only where it repays
                yield from self._time_issue()
                remaining -= ISSUE_PROBES
                unpaid = self._graphs_unpaid(current_ms, remaining)
            go, unpaid = self.agree((remaining > 0 and unpaid is None, unpaid))  # rank 0's, as every choice
            if go:
                yield from self._mode_trial(current_ms)
            else:
                self.notes.append(unpaid or "reduce-overhead (CUDA graphs) not tried: the run ends before its trial could finish")
        elif self.options.mode is None and self.device.type != "cuda":
            self.notes.append("reduce-overhead (CUDA graphs) not tried: the model runs on CPU")
        elif self.options.mode is None and self.regions and self.launch_bound is False:
            self.notes.append("reduce-overhead (CUDA graphs) not tried: the step is not launch-bound")
        elif (self.options.mode is None and self.regions and self.launch_bound and not tried_graphs
              and self.options.with_cuda_graphs() is None):
            why = (f"backend {backend_name(self.options.backend)!r} has no CUDA-graph mode (Inductor's has)"
                   if self.options.backend != "inductor" else "the options turn them off (triton.cudagraphs=False)")
            self.notes.append(f"reduce-overhead (CUDA graphs) not tried: {why}")

    # Long on purpose: one trial as a generator (compile, verify, control, candidate, verdict), in order.
    def _trial(self, candidate: Candidate, current_ms: float | None, *, label: str,
               another: bool = False) -> Iterator[str | None]:
        options = self._options_for(candidate)
        control = label + CONTROL
        # The whole model after a kept part (payback.part_first_in_background) replaces it: the part runs
        # eagerly during the trial, and the plan before it (the part compiled) is timed right before it.
        replaces = [r for r in self._kept if _inside(r, candidate.region)] if candidate.whole else []
        interleaved = not self._graphs(options) and not replaces
        windows = 1  # eager windows timed as the control (CUDA graphs: see _control_window)
        released: dict[str, float] = {}  # seconds handing eager's cached memory back before a CUDA-graph trial
        if not (yield from self._hold_inputs(candidate.region)):
            self._decide(candidate, options, kept=False,
                         reason="not tried: its input could not be held for verification (its forward did not run)")
            return None
        background, checked, child_s = yield from self._prepare(candidate.region, options, candidate.units,
                                                                 another=another)
        if not interleaved:
            # CUDA graphs keep their memory pool between steps: eager steps run beside it would need both
            # memories at once, so the plan before it is timed right before it instead of between its steps.
            control, windows = yield from self._control_window(control)
            with timed_stage(released, "memory release", self.device):
                misfit = self._graph_pool_misfit()
            if misfit is not None:
                self._decide(candidate, options, kept=False, reason=misfit, **background)
                return None
        self._last_failure = ""
        self.watch.add_region(candidate.region)
        set_aside = _set_aside(replaces)
        compile_region(candidate.region, options)
        compile_before = self._compile_counts([candidate.region.name])
        verdict = self._checked_in_child(candidate.region, checked, [candidate.region.name]) or self._verify(candidate.region)
        if verdict.passed:
            # Guarded only after verification, which must see a failing compile as a failure.
            guard_region(candidate.region, self._failed)
        else:
            revert_region(candidate.region)
            _put_back(set_aside)
            if self._verified(verdict) is False:  # the modes tried share Inductor's kernels: no other mode of it
                self._numerics_refused[candidate.name] = options.mode_name
            compile_seconds, compile_cache = self._compiled_since(compile_before, [candidate.region.name])
            self._decide(candidate, options, kept=False, reason=self._failure_reason(verdict),
                         compile_seconds=compile_seconds or None, compile_cache=compile_cache,
                         **self._numerics(verdict), **background, setup_s=_setup_s(verdict, released, child_s))
            return None
        try:
            for _ in range(self.warmup_steps):
                yield WARMUP
            if interleaved:
                yield from self._interleaved(candidate.region, label, control)
            else:
                yield from self._window(label)
        except GeneratorExit:  # the fit ended during the trial: the plan before it stands
            if replaces:
                revert_region(candidate.region)
                _put_back(set_aside)
            raise
        if not self.agree_all(candidate.region.is_compiled):  # its guard reverted it (on some rank) during the trial
            if candidate.region.is_compiled:
                failure = "on another rank"
            else:
                failure = self._last_failure or "reverted by the recompile policy"
            revert_region(candidate.region)
            _put_back(set_aside)
            compile_seconds, compile_cache = self._compiled_since(compile_before, [candidate.region.name])
            self._decide(candidate, options, kept=False,
                         reason=f"failed at run time during its trial, reverted to eager: {failure}", **background,
                         compile_seconds=compile_seconds or None, compile_cache=compile_cache,
                         setup_s=_setup_s(verdict, released, child_s))
            return None
        trial_ms = self.timer.median_ms(label, wait=True)
        current_ms = self.timer.median_ms(control, wait=True) or current_ms
        speedup, noise, low, threshold, keep = self._verdict(control, label)
        compile_seconds, compile_cache = self._compiled_since(compile_before, [candidate.region.name])
        how = "between its own steps" if interleaved else "right before it" + _retimed(windows)
        if keep:
            for part in replaces:  # compiled code set aside: dropped now
                part.compiled_with = None
                if part in self.regions:
                    self.regions.remove(part)
                self._kept.remove(part)
                mark_replaced(self.decisions, part, candidate.name)
            self.regions.append(candidate.region)
            self._kept.append(candidate.region)
            reason = (f"{speedup:.3f}x faster than the plan before it, timed {how} ({low:.3f}x by lower quartiles; "
                      f"threshold {threshold:.3f}x)")
        else:
            revert_region(candidate.region)
            _put_back(set_aside)
            reason = (
                f"not faster: {speedup:.3f}x against the plan before it, timed {how} ({low:.3f}x by lower "
                f"quartiles; threshold {threshold:.3f}x)"
                if speedup is not None and low is not None
                else "no steady steps could be timed"
            )
        self._decide(candidate, options, kept=keep, reason=reason, speedup=speedup, speedup_noise=noise,
                     step_ms=trial_ms, baseline_ms=current_ms, compile_seconds=compile_seconds, compile_cache=compile_cache,
                     **self._numerics(verdict), **background, setup_s=_setup_s(verdict, released, child_s))
        return trial_ms if keep else None

    def _hold_inputs(self, region: Region) -> Generator[str | None, None, bool]:
        """Batches, not timed, that hold the inputs of ``region``'s modules where the profile did not (it holds
        the whole model's only: copying every candidate's input to host memory stopped ResNet-50's training
        1.05-1.19 s on the H200, and most runs try one candidate): as many as the profile had, until every
        module the profile saw run has its input, on every rank; whether they all do."""
        assert self.profiler is not None
        wanted = [name for name in region.module_names if name in self.profiler.seen]

        def held() -> bool:
            return bool(self.agree_all(all(name in self.profiler.held_inputs for name in wanted)))

        if held():
            return True
        remove = self.profiler.hold_next(wanted)
        try:
            for _ in range(self.profile_steps):
                yield WARMUP
                if held():
                    return True
        finally:
            remove()
        return False

    def _prepare(self, region: Region, options: CompileOptions, units: int, *, another: bool = False
                 ) -> Generator[str | None, None, tuple[dict[str, Any], VerificationResult | None, dict[str, float]]]:
        """Compiles ``region``'s first module in a child process (:mod:`compile_callback.background`)
        while training goes on with the plan before it, one batch a ``yield``; returns the decision's
        fields of it: ``background`` (what it says, None where background compiles are off) and
        ``background_s`` (the child's seconds compiling and checking, None where none finished), the
        child's verification (None: none), which :meth:`_checked_in_child` may stand for the trial's, and
        the child's seconds by stage (empty: none). The trial then compiles here, from the cache
        the child filled, or cold where it could not. Unless asked for always, only a compile long enough
        to be worth a child's start-up, in a run long enough for the child to finish. With several
        processes rank 0 starts a child and so does every rank on another device; all wait until every
        child is done and follow rank 0's outcome; no child's verification stands there (each rank
        verifies its own compile on its own batch). ``another``: a further child follows this one whatever
        its outcome (:class:`~compile_callback.background.Launcher` readies an interpreter for it)."""
        use, note = self.agree(self._in_background(region, units))
        if not use:
            return {"background": note}, None, {}
        child, why = None, None
        # Rank 0 starts a child, and so does every rank on another device than rank 0's: Inductor's cache key
        # holds the inputs' device, so rank 0's child fills no entry for it (CPU processes share rank 0's).
        elsewhere = self.agree(str(self.device)) != str(self.device)  # on every rank: a collective
        leads = self.rank_zero or elsewhere
        if leads:
            held = self.profiler.held_input(region.module_names[0]) if self.profiler is not None else None
            try:
                child = self.background(region.module_names[0], region.modules[0], held, options, another=another)
                self.children_started += 1
            except Unavailable as error:
                why = f"not prepared in the background: {error}"
        why = self.agree(why)
        if why is not None:  # rank 0's child did not start: no rank waits for one
            if child is not None:
                child.discard()
            return {"background": why}, None, {}
        # Stands in the notes while the child runs (a report made meanwhile says so); the decision says how it went.
        waiting = (f"`{region.name}` was compiling in the background (since batch {self._batch_index}) when this report "
                   "was made; a fit that ends first trains eagerly throughout (`background_compile=False` compiles "
                   "in-process instead, stopping training while it compiles)")
        self.notes.append(waiting)
        self.compiling_in_background = (region.name, self._batch_index, child)
        every = 1 if self.processes == 1 else POLL_EVERY  # a collective each time: not every batch under DDP
        try:
            batches = 0
            while batches % every or not self.agree_all(child.done() if child is not None else True):
                batches += 1
                yield WARMUP
        except GeneratorExit:  # the fit ended while the child compiled: not tried
            self.compiling_in_background = None
            if child is not None:
                child.discard()
            raise
        self.notes.remove(waiting)
        self.compiling_in_background = None
        outcome = None
        if child is not None:  # every rank that started one reads (and cleans up) its own; rank 0's is reported
            ok, detail = child.outcome()
            outcome = (ok, detail, child.seconds, child.stages)
        ok, detail, seconds, stages = self.agree(outcome)
        fields = {"background": f"prepared in the background: {detail}" if ok else f"not prepared in the background: {detail}",
                  "background_s": seconds}
        return fields, child.checked if ok and child is not None and self.processes == 1 else None, stages

    def waiting_alone(self) -> bool:
        # Under DDP the ranks meet every POLL_EVERY of its batches to agree: each one is the planner's.
        return self.compiling_in_background is not None and self.processes == 1

    def background_progress(self) -> dict[str, Any] | None:
        """What a child compiling now has done so far (None: none compiles): its region, the batch it started
        at, its stages started (:meth:`compile_callback.background.BackgroundCompile.progress`; none on a rank
        that waits for rank 0's child)."""
        if self.compiling_in_background is None:
            return None
        name, batch, child = self.compiling_in_background
        return {"region": name, "since_batch": batch, "sent_at": child.sent_at if child is not None else None,
                "stages": child.progress() if child is not None else []}

    def _trial_batches(self, candidate: Candidate) -> int:
        """Batches a trial runs after its compile: at most its control windows and its own, or the interleaved blocks."""
        if self._graphs(self._options_for(candidate)):
            return self._graph_trial_batches()
        return self._interleaved_blocks() * INTERLEAVE_BLOCK

    def _graphs(self, options: CompileOptions) -> bool:
        """Whether ``options`` run CUDA graphs here: so compiled, on a CUDA device (on CPU Inductor captures none)."""
        return options.cuda_graphs and self.device.type == "cuda"

    def _options_for(self, candidate: Candidate) -> CompileOptions:
        """What ``candidate`` is compiled with: the callback's options, with CUDA graphs where its mode asks for them."""
        if candidate.mode == "reduce-overhead":
            graphs = self.options.with_cuda_graphs()
            assert graphs is not None, "a CUDA-graph candidate where none can be had (see _graphs_first)"
            return graphs
        return self.options

    def _graph_trial_batches(self) -> int:
        """A CUDA-graph trial's timed batches at most: its control windows and its own, each after one untimed step."""
        return (CONTROL_WINDOWS + 1) * (1 + self._trial_length)

    def _interleaved_blocks(self) -> int:
        """Blocks of an interleaved trial: enough for ``_trial_length`` timed steps on each side."""
        return 2 * math.ceil(self._trial_length / (INTERLEAVE_BLOCK - 1))

    def _window(self, label: str) -> Iterator[str | None]:
        """One untimed step, then the trial's length of steps timed under ``label``."""
        yield WARMUP
        self.timer.settle(label, self._settle_per_shape)
        for _ in range(self._trial_length):
            yield label

    def _control_window(self, control: str) -> Generator[str | None, None, tuple[str, int]]:
        """The plan before a CUDA-graph trial, timed right before it; returns the label of the window
        that prices the trial and how many windows were timed. A busy host only adds time, in episodes
        of a few to tens of steps that a CUDA-graph step (one launch) hardly feels: one such episode in
        a 20-step eager window read ResNet-50's speedup 6.5% high on the H200 (17 of 20 steps at
        30.3-41.5 ms where eager runs at 29.7). So a disturbed window (:func:`~compile_callback.timing.disturbed`) is timed again, at most
        ``CONTROL_WINDOWS - 1`` times, and the quickest by median prices the trial. Not where batches
        come in several shapes: their mix spreads a window's steps, and they are priced shape by shape."""
        yield from self._window(control)
        best, windows = control, 1
        while windows < CONTROL_WINDOWS and not self._by_shape:
            if not self.agree(disturbed(self.timer.samples_ms(best, wait=True), tolerance=DISTURBED)):
                break
            retimed = f"{control}#{windows}"
            windows += 1
            yield from self._window(retimed)
            if self.agree(self.timer.median_ms(retimed, wait=True) < self.timer.median_ms(best, wait=True)):
                best = retimed
        return best, windows

    def _interleaved(self, region: Region, label: str, control: str) -> Iterator[str | None]:
        """The trial's steps in alternating blocks: ``region`` compiled (timed under ``label``), then the
        plan before it, ``region``'s modules eager and everything else as it is (``control``), in the
        order of :func:`candidate_block` (compiled, control, control, compiled, ...). Both see the same
        clocks, host load and allocator state, so a drift over the trial (a GPU whose clocks still ramp,
        a busy host, steps that lengthen) moves both alike and cancels in their ratio. Switching costs
        nothing (dynamo's cache stays with the compiled callable); the first step of each block is not
        timed (the queue the previous block left)."""
        compiled = [torch_internals.compiled_call(module) for module in region.modules]

        def switch(on: bool) -> None:
            if region.is_compiled:  # else its guard reverted it: it runs eager either way
                for module, call in zip(region.modules, compiled):
                    torch_internals.restore_compiled_call(module, call if on else None)

        self.timer.settle(label, self._settle_per_shape)
        self.timer.settle(control, self._settle_per_shape)
        try:
            for block in range(self._interleaved_blocks()):
                on = candidate_block(block)
                switch(on)
                yield WARMUP
                for _ in range(INTERLEAVE_BLOCK - 1):
                    yield label if on else control
        finally:
            switch(True)

    # Long on purpose: the CUDA-graph trial as a generator, each guard before the step it protects.
    def _mode_trial(self, current_ms: float | None) -> Iterator[str | None]:
        if self._recompiled([r.name for r in self.regions]):
            self.notes.append("reduce-overhead (CUDA graphs) not tried: kept regions recompiled (shapes change)")
            return
        kept = list(self._kept)
        options = self.options.with_cuda_graphs()
        assert options is not None, "a CUDA-graph trial where none can be had (see the search's gate)"
        group = Region(name="+".join(r.name for r in kept), module_names=[n for r in kept for n in r.module_names],
                       modules=[m for r in kept for m in r.modules])
        units = sum(c.units for c in self._all_candidates if c.region in kept)
        background, checked, child_s = yield from self._prepare(group, options, units)
        control = "trial:reduce-overhead" + CONTROL
        control, windows = yield from self._control_window(control)  # the kept plan, right before (see _trial)
        released: dict[str, float] = {}
        with timed_stage(released, "memory release", self.device):
            misfit = self._graph_pool_misfit()
        if misfit is not None:
            self._add(Decision(region=group.name, modules=group.module_names, mode="reduce-overhead",
                               kept=False, reason=misfit, step=self._batch_index, **background))
            return
        saved = _snapshot(kept)
        saved_with = {id(r): r.compiled_with for r in kept}
        names = [r.name for r in kept]  # the watch counts compiles by the kept regions' names
        compile_before = self._compile_counts(names)
        compile_region(group, options)
        verdict = self._checked_in_child(group, checked, names) or self._verify(group)
        label = "trial:reduce-overhead"
        keep, survived = False, True
        trial_ms = speedup = low = None
        noise, threshold = 0.0, self.min_speedup
        failures: list[str] = []

        def on_error(region: Region, error: BaseException) -> None:
            # During the trial a failure is noted (the guard has reverted the region on this rank); once
            # kept, it is any kept region's failure.
            if keep:
                self._failed(region, error)
            else:
                failures.append(torch_internals.describe_error(error)[:300])

        def restore() -> None:  # back to the default-mode compiled code, without compiling again
            for region in kept:
                region.compiled_with = saved_with[id(region)]
            _put_back(saved)

        if verdict.passed:
            for region in kept:
                guard_region(region, on_error)
            try:
                for _ in range(self.warmup_steps + 2):  # CUDA graphs record on the third call
                    yield WARMUP
                self.timer.settle(label, self._settle_per_shape)
                for _ in range(self._trial_length):
                    yield label
            except GeneratorExit:  # fit ended during the trial (close()): the plan before it stands
                restore()
                raise
            survived = bool(self.agree_all(not failures))  # failed on any rank: given up on all
            if survived:
                trial_ms = self.timer.median_ms(label, wait=True)
                current_ms = self.timer.median_ms(control, wait=True) or current_ms
                speedup, noise, low, threshold, keep = self._verdict(control, label)
        if keep:
            for region in kept:
                region.compiled_with = options
            reason = (f"CUDA graphs: {speedup:.3f}x faster than the same regions in default mode, timed right before"
                      f"{_retimed(windows)} ({low:.3f}x by lower quartiles; threshold {threshold:.3f}x)")
        else:
            restore()
            if not verdict.passed:
                reason = self._failure_reason(verdict)
            elif not survived:
                reason = f"CUDA graphs failed at run time during the trial: {failures[0] if failures else 'on another rank'}"
            else:
                reason = (f"CUDA graphs not faster: {speedup:.3f}x ({low:.3f}x by lower quartiles; threshold "
                          f"{threshold:.3f}x)" if speedup and low else "no steady steps could be timed")
        compile_seconds, compile_cache = self._compiled_since(compile_before, names)
        self._add(Decision(region=group.name, modules=group.module_names, mode="reduce-overhead",
                           kept=keep, reason=reason, step=self._batch_index, speedup=speedup,
                           speedup_noise=noise, step_ms=trial_ms, baseline_ms=current_ms,
                           compile_seconds=compile_seconds or None, compile_cache=compile_cache,
                           **self._numerics(verdict), **background, setup_s=_setup_s(verdict, released, child_s)))

    def priced_speedup(self) -> tuple[float, float] | None:
        """The plan's speedup over eager and its relative noise: the product of the kept decisions'
        speedups, each measured against the plan before it in the same stretch of the run (interleaved
        with it, or right before it for CUDA graphs), so a baseline timed while the run still settles
        prices nothing. None until the plan is frozen; 1.0 when nothing was kept (the steps run the
        eager code)."""
        if not self.frozen:
            return None
        # A part the whole model replaced priced the plan the whole model was measured against.
        standing = {d.region for d in self.decisions if d.kept}
        kept = [d for d in self.decisions if (d.kept or d.replaced_by in standing) and d.speedup is not None]
        if not kept and any(d.kept for d in self.decisions):
            return None  # kept without a measurement (a plan saved before decisions carried one)
        speedup = math.prod(d.speedup for d in kept)
        return speedup, math.sqrt(sum((d.speedup_noise or 0.0) ** 2 for d in kept))

    # -- pieces ---------------------------------------------------------------------------------------
    def _candidate_modules(self) -> dict[str, nn.Module]:
        """What profiling times: every module of a candidate region, and every top-level child (their
        sum is the step's forward time when training_step does not call the root)."""
        named = dict(self.root.named_modules())
        modules = {name: named[name] for names in candidate_regions(self.root).values() for name in names}
        for name, child in self.root.named_children():
            modules.setdefault(name, child)
        return modules

    def region_modules(self) -> dict[str, list[nn.Module]]:
        """The regions this planner may decide on, by name, with their modules."""
        named = dict(self.root.named_modules())
        return {region: [named[name] for name in names] for region, names in candidate_regions(self.root).items()}

    def _candidates(self, modules: dict[str, nn.Module]) -> list[Candidate]:
        assert self.profiler is not None
        forward = self.profiler.forward_ms()
        # Without the root's forward, the modules training_step called: those seen with no profiled module around them.
        seen = self.profiler.seen
        outer = [n for n in seen if n and not any(n.startswith(o + ".") for o in seen if o and o != n)]
        total = forward.get("") or sum(forward.get(n, 0.0) for n in outer) or 1e-9
        named = dict(self.root.named_modules())
        regions = candidate_regions(self.root)
        candidates: list[Candidate] = []
        if "" in self.profiler.seen:
            # Under DDP the strategy's rerouted call of training_step runs eagerly and the model's own
            # forward inside it compiled (torch_internals.eager_while_rerouted).
            candidates.append(Candidate(Region(MODEL, [""], [self.root]), forward[""], 1.0,
                                        units=compile_units([self.root], repeated=False), whole=True))
        # Rank 0's: shares differ by rank, the candidates must not (_order looks rank 0's names up here).
        holder = self.agree(None if "" in self.profiler.seen else self._step_holder(forward, total))
        if holder is not None:  # the whole model's stand-in, a candidate even where it holds repeated blocks
            regions = {region_name(holder): [holder], **{r: m for r, m in regions.items() if m != [holder]}}
            self.notes.append(f"training_step does not call the LightningModule's forward: `{region_name(holder)}`, "
                              f"{forward[holder] / total:.0%} of its modules' forward time, is tried as the whole model")
        elif "" not in self.profiler.seen:
            self.notes.append("whole model not tried: training_step does not call the LightningModule's forward, "
                              "and no one submodule holds its step (name the module it calls in regions=[...])")
        for region, members in regions.items():
            if region == MODEL:
                continue
            ms = sum(forward.get(name, 0.0) for name in members)
            modules = [named[n] for n in members]
            candidate = Candidate(Region(region, members, modules), ms, ms / total,
                                  units=compile_units(modules, repeated="*" in region))
            candidate.whole = members == [holder]
            if "*" not in region and not candidate.whole:  # a top-level child: worth a compile of its own only when hot
                child = named[members[0]]
                has_params = any(p.requires_grad for p in child.parameters())
                candidate.cold = not (
                    ms / total >= MIN_SHARE and members[0] in self.profiler.seen and (has_params or ms > 0)
                )
            candidates.append(candidate)
        return candidates

    def _whole_names(self) -> set[str]:
        """The whole model's candidates: the root's, or the child standing for it (:meth:`_step_holder`)."""
        return {c.name for c in self._all_candidates if c.whole}

    def _whole_kept(self) -> bool:
        """Whether the whole model (or the child standing for it) is kept."""
        return bool(self._whole_names() & {r.name for r in self._kept})

    def _step_holder(self, forward: dict[str, float], total: float) -> str | None:
        """The top-level child that holds the training step where the LightningModule's forward is not called:
        seen running, with parameters, and at least :data:`WHOLE_STEP_SHARE` of the forward time of the modules
        training_step called (``total``)."""
        assert self.profiler is not None
        for name, child in self.root.named_children():
            if (name in self.profiler.seen and forward.get(name, 0.0) >= WHOLE_STEP_SHARE * total
                    and any(p.requires_grad for p in child.parameters())):
                return name
        return None

    def _order(self, candidates: list[Candidate]) -> list[Candidate]:
        """Whole model first, then the hot parts by share, unless the batches left cannot repay the
        whole model's compile while a part's they can (:func:`payback.payback_order`). Shares come from
        each rank's own timings, so rank 0's choice and order are every rank's (all ranks hold the same
        candidates, cold or not)."""
        hot = [c.priced for c in candidates if not c.cold]
        costs, batches = self._costs(), self._batches_left()
        weighed = [  # what the order weighed, in the report
            {"region": c.name, "share": round(c.share, 4), "units": c.units, "compile_s_estimate": costs.seconds(c.units),
             "saving_s_estimate": saving_seconds(c.share, self.eager_ms, batches) if self.eager_ms else None}
            for c in hot
        ]
        by_name = {c.name: c for c in candidates}

        def in_background(priced: Priced) -> bool:
            return self._in_background(by_name[priced.name].region, priced.units)[0]

        whole_saved = GRAPH_SAVED_SHARE if self._graphs_first() else SAVED_SHARE
        # One broadcast: rank 0's order, note and figures on every rank.
        order, note, self.weighed = self.agree((*payback_order(hot, costs, step_ms=self.eager_ms, batches=batches,
                                                               in_background=in_background, whole_saved=whole_saved),
                                                weighed))
        if note:
            self.notes.append(note)
        return [by_name[name] for name in order]

    def _graphs_first(self) -> bool:
        """Whether the whole model is tried with CUDA graphs first: a launch-bound step, no mode asked for."""
        return bool(self.launch_bound) and self.options.mode is None and self.options.with_cuda_graphs() is not None

    def _batches_left(self, candidate: Candidate | None = None) -> int:
        """Training batches left once ``candidate``'s trial (or none) and the frozen plan's warm-up are done."""
        trial = self._trial_batches(candidate) if candidate is not None else 0
        return self.remaining_batches() - (self.warmup_steps + trial)

    def _graphs_unpaid(self, current_ms: float | None, remaining: int) -> str | None:
        """Why the CUDA-graph trial of the kept regions cannot repay its compile (:class:`payback.GraphPrice`,
        kept as ``graph_price`` for the report)."""
        kept_names = {r.name for r in self._kept}
        kept = [c.priced for c in self._all_candidates if c.name in kept_names]
        price = graph_trial_price(kept, self._costs(), step_ms=current_ms, batches=remaining,
                                  issue_ms=self.issue_ms) if kept else None
        # Rank 0's, as every choice: each rank's step and compile times differ, and whether the probes run
        # follows from this price (ranks that went different ways would pair their collectives wrongly).
        self.graph_price = self.agree(price)
        return self.graph_price.unpaid() if self.graph_price else None

    def _time_issue(self) -> Iterator[str]:
        """The host's time to issue a step of the kept plan, from an empty launch queue (the run waits for the
        device before each :data:`ISSUE` batch and times to the next batch's start): the eager test of
        ``launch_bound`` times the loop as it runs, where a host that keeps ahead fills the queue and then
        waits, so its time nears the device's whatever the step. The quickest of :data:`ISSUE_PROBES` (what
        the host can do; interference only adds time: on the H200 GPT-2's kept blocks read a median of 24.9 ms
        in one run and 38.1 ms in the next, against a 38.2 ms step), rank 0's. A wait for the device before
        each, once a fit; a batch interrupted (validation) is not counted."""
        if self.device.type != "cuda":
            return
        self.issue_samples_ms.clear()
        for _ in range(ISSUE_PROBES):
            yield ISSUE
        self.issue_ms = self.agree(min(self.issue_samples_ms) if self.issue_samples_ms else None)

    def _costs(self) -> CompileCosts:
        """Compile seconds per unit: from this run's decisions (a region's first; cold ones price a cold
        compile, warm ones only bound it), else the backend's prior; and what its trials' set-up batches
        cost beyond their compiles."""
        costs = CompileCosts(backend_name(self.options.backend))
        units = {c.name: c.units for c in self._all_candidates}
        seen: set[str] = set()
        for decision in self.decisions:
            setup = decision.setup_s or {}
            if "verification in all" in setup:  # the set-up batch's stop beyond its compile
                costs.observe_check(setup["verification in all"] + setup.get("memory release", 0.0)
                                    - (decision.compile_seconds or 0.0))
            if decision.compile_seconds and decision.region in units and decision.region not in seen:
                seen.add(decision.region)
                cold = decision.compile_cache in (None, "cold")  # None: a backend without Inductor's cache
                costs.observe(units[decision.region], decision.compile_seconds, cold=cold)
        return costs

    def _fit_trials_to_shapes(self, shapes: int, steps: int) -> None:
        """``shapes`` distinct batch shapes in the ``steps`` timed before the trials. A few shapes that
        recur (padding buckets, a handful of lengths) are compared shape by shape; a compiled region
        compiles or warms up on each new one (CUDA graphs record on the third call), so a trial discards
        the first two timed steps of every shape and runs longer by three steps a shape (the compiling
        one is not timed either), at most three times ``trial_steps``. Shapes that hardly recur (raw
        lengths) cannot be paired: trials compare medians, as for one shape."""
        if shapes <= 1:
            return
        if not self._recurring(shapes, steps):
            self.notes.append(f"batches come in {shapes} shapes in {steps} steps, too many to compare trials shape "
                              f"by shape: medians compared (pad them to a few sizes for steadier decisions)")
            return
        self._by_shape = True
        self._settle_per_shape = 2
        self._trial_length = min(self.trial_steps + 3 * shapes, 3 * self.trial_steps)
        self.notes.append(
            f"batches come in {shapes} shapes: trials compare like shapes, run {self._trial_length} steps "
            f"and skip each shape's first two"
        )

    def _shapes_seen(self) -> tuple[int, int]:
        """Distinct batch shapes and steps timed so far (profiling and eager baseline), rank 0's."""
        seen = self.timer.keys((PROFILE, EAGER))
        shapes, steps = self.agree((len(seen), sum(seen.values())))
        return int(shapes), int(steps)

    def _recurring(self, shapes: int, steps: int) -> bool:
        """A few shapes that come back (at most ``trial_steps``, in at most two thirds of the steps)."""
        return 1 < shapes <= min(self.trial_steps, (2 * steps) // 3)

    def _verdict(self, control: str, label: str) -> tuple[float | None, float, float | None, float, bool]:
        """The keep rule of every trial: ``(speedup, noise, lower-quartile speedup, threshold, keep)``.

        Kept only if faster by the medians and by the lower quartiles alike, each by more than
        ``min_speedup`` and twice the noise: interference (a busy host, a logger's first write) adds
        time to a few steps of either side and moves one statistic of a short trial far (on 2 loaded CPU
        cores an unchanged model read 2.4x by medians, and 1.35x by lower quartiles at 1.04x by medians).
        On a quiet GPU the two agree within a percent. A region so reverted costs a missed speedup; one
        wrongly kept, a slower run. Rank 0's verdict on every rank.
        """
        speedup, noise = self._speedup(control, label)
        threshold = max(self.min_speedup, 1.0 + 2.0 * noise)
        low = self._speedup(control, label, statistic=lower_quartile)[0]
        keep = bool(self.agree(speedup is not None and low is not None and min(speedup, low) >= threshold))
        return speedup, noise, low, threshold, keep

    def _speedup(self, before: str, after: str, *, statistic: Any = statistics.median) -> tuple[float | None, float]:
        """How much faster the steps timed under ``after`` ran than those under ``before``, and the
        relative noise of that ratio; shape by shape (:func:`paired_speedup`) where batches come in a
        few recurring shapes, else by medians."""
        if self._by_shape:
            paired = paired_speedup(self.timer.samples_by_key(before, wait=True), self.timer.samples_by_key(after, wait=True),
                                    statistic=statistic)
            if paired is not None:
                return paired
        before_samples, after_samples = self.timer.samples_ms(before, wait=True), self.timer.samples_ms(after, wait=True)
        if not before_samples or not after_samples:
            return None, 0.0
        before_ms, after_ms = statistic(before_samples), statistic(after_samples)
        if not before_ms or not after_ms:
            return None, 0.0
        noise = math.hypot(median_noise(before_samples), median_noise(after_samples))
        return before_ms / after_ms, noise

    def _in_background(self, region: Region, units: int) -> tuple[bool, str | None]:
        """Whether ``region`` (``units`` in compile cost) is compiled first in a child process, and where
        not, what its decision says (None: nothing worth saying); see :func:`payback.background_pays`."""
        # A child needs the region's first input: held by now, or to be held before its trial (_hold_inputs).
        if self.background is None or self.profiler is None or region.module_names[0] not in self.profiler.seen:
            return False, None
        if self.background_always:
            return True, None
        return background_pays(self._costs().seconds(units), left_s=self.remaining_batches() * (self.eager_ms or 0.0) / 1e3)

    def _recompiled(self, names: list[str]) -> bool:
        """Whether any region of ``names`` recompiled beyond the static padding buckets' budget: shapes that
        keep changing would re-record CUDA graphs (buckets record once each). Rank 0's answer: a rank that
        went on alone would wait in a collective."""
        stats = self.watch.stats
        return bool(self.agree(any(stats[n].recompiles > self.shape_budget for n in names if n in stats)))

    def _graphs_of_the_largest_tried(self, current_ms: float | None, trials: int) -> Candidate | None:
        """On a launch-bound step where no CUDA graphs were tried (no whole-model candidate, or it could not repay)
        and the region of the largest share tried in default mode was not kept: that region with
        ``reduce-overhead``, on top of what was kept, where it did not recompile, ``max_trials`` leaves room and the
        batches left repay it; else None (with a note where it was not tried for one of those). Where it was kept,
        the kept plan's own CUDA-graph trial follows instead.

        Fusing alone may not pay where the host sets the pace: the graphs take the region's launches off the host.
        On the H200 (session 27), the recipe's GPT-2 with its blocks called from ``training_step`` at batch 1 x 64
        (a host-bound ~15 ms step): its blocks 1.00-1.12x in default mode, not kept, and the run stayed eager;
        with graphs 2.12x, kept."""
        if not self._graphs_first() or any(d.mode == "reduce-overhead" for d in self.decisions):
            return None
        if self._whole_kept():
            return None  # the whole model is compiled: its parts are not tried (as in the search)
        tried = {d.region for d in self.decisions if d.mode == "default" and d.step_ms is not None}
        pool = [c for c in self._all_candidates if c.name in tried and not c.whole]
        # Rank 0's: shares (and a trial's timings) differ by rank, the region must not.
        name = self.agree(max(pool, key=lambda c: c.share).name if pool else None)
        largest = next((c for c in self._all_candidates if c.name == name), None)
        if largest is None or any(r.name == largest.name for r in self._kept):
            return None
        candidate = dataclasses.replace(largest, mode="reduce-overhead")
        if self._recompiled([largest.name]):
            why = "it recompiled in default mode (shapes change: graphs would re-record for each)"
        elif trials >= self.max_trials:
            why = f"max_trials={self.max_trials} reached"
        else:
            why = self._unpaid(candidate, current_ms)
            if why is None:
                return candidate
            why = why.removeprefix("skipped: ")
        self.notes.append(f"reduce-overhead (CUDA graphs) of `{largest.name}`, whose default mode was not kept, "
                          f"not tried: {why}")
        return None

    def _worth_trying(self, candidate: Candidate, current_ms: float | None) -> bool:
        """Whether the batches left can repay ``candidate``'s compile: judged on this run's measured
        compiles, or before the first on the backend's prior, an optimistic figure (a fast GPU host's cold
        compile): a candidate even that cannot repay is not tried (:meth:`_unpaid`)."""
        reason = self._unpaid(candidate, current_ms)
        if reason is None:
            return True
        self._decide(candidate, self.options, kept=False, reason=reason)
        return False

    def _unpaid(self, candidate: Candidate, current_ms: float | None) -> str | None:
        """Why the batches left cannot repay ``candidate``'s compile, or None (whether it repays is rank 0's
        judgement; the reason is this rank's own figures)."""
        remaining = self._batches_left(candidate)
        costs = self._costs()
        reason = None
        if remaining <= 0:
            reason = "skipped: the run ends before a trial could finish"
        elif costs.rate is not None and current_ms:
            estimate = costs.seconds(candidate.units) or 0.0
            cost, how = estimate, f"compiling costs ~{estimate:.1f} s"
            if self._in_background(candidate.region, candidate.units)[0]:
                cost, remaining = after_background(estimate, step_ms=current_ms, batches=remaining)
                how = f"compiling costs ~{cost:.1f} s of stopped training after a background compile of ~{estimate:.1f} s"
            if costs.check_s:
                cost += costs.check_s
                how += f", checking it ~{costs.check_s:.1f} s more (as this run's trials did)"
            saving_s = saving_seconds(candidate.share, current_ms, max(0, remaining))
            if saving_s < cost:
                reason = f"skipped: {max(0, remaining)} batches left save ~{saving_s:.1f} s, {how} (estimated {costs.source})"
        # Compile times and shares differ by rank; whether to try must not.
        if bool(self.agree(reason is None)):
            return None
        return reason or "skipped: rank 0 judged that the batches left cannot repay a compile"

    def _checked_in_child(self, region: Region, checked: VerificationResult | None,
                          names: list[str]) -> VerificationResult | None:
        """The background child's verification standing for the trial's, where it can: a region of one
        module (the child compiled and checked just that) whose compile here came whole from the child's
        cache (the same code; the watch counts it under ``names``). Runs the compiled forward and backward
        once (loading both); None where the trial must verify itself."""
        if checked is None or not self.verify or len(region.modules) != 1 or self.profiler is None:
            return None
        held = self.profiler.held_input(region.module_names[0])
        if held is None:
            return None
        before = self._compile_counts(names)
        seconds: dict[str, float] = {}
        # One forward and backward's memory, as a step's: the last step's gradients wait in host memory
        # beside the new ones (the optimizer's state is a step's too, and parking it took 1.5 s on GPT-2).
        with timed_stage(seconds, "compiled (from the child's cache)", self.device), \
                in_host_memory(self._between_steps(optimizer=False)):
            loaded = warm_call(region.modules[0], *held, context=self.context, backward=True)
        if not loaded.passed or self._compiled_since(before, names)[1] != "warm":
            return None  # failed here or compiled anew: verified here as always (a failing compile fails again)
        seconds["verification in all"] = seconds["compiled (from the child's cache)"]
        return dataclasses.replace(checked, where=f"{checked.where}; verified in the background child", seconds=seconds)

    def _verify(self, region: Region) -> VerificationResult:
        """Verifies each of ``region``'s modules on its held input; the worst result, with the seconds of
        every module's stages summed and ``"verification in all"``."""
        assert self.profiler is not None
        worst = VerificationResult(True, 0.0, self.tolerance or 0.0, "output")
        twin = torch_internals.TwinScope()  # one verification twin for all of the region's modules (verify_module)
        seconds: dict[str, float] = {}
        # The state is parked once for all of the region's modules; "verification in all" includes its copies.
        # A group of GROUP_UNPARKED or more repeated blocks (one class, so about one size each) verifies one
        # member at a time, each run's results moved to the host before the next: its peak is one run's, at
        # most twice a member's activations (bf16's fp32 reference), about half the step's activations (free
        # between steps) for four members. The step's own peak holds the optimizer's state and the last
        # step's gradients beside all of its activations (Lightning sets the gradients to None after the
        # forward), so both stay on the device: parking the state took ~1.5 s of GPT-2's blocks' 2.0-2.5 s
        # set-up on the H200 (session 21), the fit's peak the same without it (15.17 GB, session 22); with the
        # gradients left too, that set-up took 0.75 s against 1.25-1.46, the peak still 15.17 GB (session 23).
        unparked = len(region.modules) >= GROUP_UNPARKED
        with timed_stage(seconds, "verification in all", self.device), \
                in_host_memory([] if unparked else self._between_steps()):
            for name, module in zip(region.module_names, region.modules):
                held = self.profiler.held_input(name)
                if held is None:
                    continue
                args, kwargs = held
                if self.verify:
                    result = verify_module(module, args, kwargs, context=self.context, tolerance=self.tolerance,
                                           options=region.compiled_with, twin_scope=twin)
                else:
                    result = warm_call(module, args, kwargs, context=self.context)
                for stage, spent in result.seconds.items():
                    seconds[stage] = seconds.get(stage, 0.0) + spent
                if not result.passed or result.max_rel_error > worst.max_rel_error:
                    worst = result
                if not result.passed:
                    break
        worst = dataclasses.replace(worst, seconds=seconds)
        # Wrong on any rank is wrong: compiled code that differs from eager on one GPU must not train there.
        passed = bool(self.agree_all(worst.passed))
        if worst.passed and not passed:
            return dataclasses.replace(
                worst, passed=False, where=f"{worst.where} on this rank; another rank's compiled code failed its check"
            )
        return dataclasses.replace(worst, passed=passed)

    def _graph_pool_misfit(self) -> str | None:
        """Before a CUDA-graph trial: hands eager's cached blocks back (the pool is a new reservation), then
        says why the pool would not fit, or None; rank 0's answer on every rank."""
        if self.device.type == "cuda":
            release_device_memory()
        return self.agree(graph_pool_misfit(self.activation_bytes(), self.room_bytes()))

    def _between_steps(self, *, optimizer: bool = True) -> list[torch.Tensor]:
        """What waits between two steps and is not read by verification's runs: the optimizer's state
        (``optimizer``) and the last step's gradients (except where a kept CUDA-graph region's pool may
        own them)."""
        tensors = list(self.idle_state()) if optimizer else []
        if not uses_cuda_graphs(self._kept):
            tensors += [p.grad for p in self.root.parameters() if p.grad is not None]
        return tensors

    def _add(self, decision: Decision) -> None:
        """Records a trial's decision with the fit's memory peak so far: the decision whose trial raised it
        is the one whose peak exceeds the one before (torch's peak counter is never reset: it is the user's)."""
        peak = self.peak_bytes()
        decision.peak_gb = None if peak is None else peak / GB
        self.decisions.append(decision)

    def _numerics(self, verdict: VerificationResult) -> dict[str, Any]:
        """A decision's numerics fields: the max relative error, the tensor it is from, and the verdict."""
        checked = self.verify and verdict.error is None
        return {"max_rel_error": verdict.max_rel_error if checked else None,
                "error_in": verdict.where if checked else None, "verified": self._verified(verdict)}

    def _verified(self, verdict: VerificationResult) -> bool | None:
        """What verification said of the numerics: passed, differed, or nothing (not checked, or it
        could not run: a compile error)."""
        if not self.verify or verdict.error is not None:
            return None
        return verdict.passed

    @staticmethod
    def _failure_reason(verdict: VerificationResult) -> str:
        if verdict.error:
            what = "compile failed" if verdict.where == "compile" else "not verified, so not trusted"
            return f"{what}: {verdict.error}"  # the torch error in it is cut at 300 characters, a fix beside it not
        return (f"numerics differ from eager: {verdict.where}; max relative error {verdict.max_rel_error:.2e}, "
                f"tol {verdict.tolerance:.0e}")

    def _compile_counts(self, region_names: list[str]) -> tuple[float, int, int]:
        """Compile seconds and FX-graph cache hits and misses the watch has counted for these regions."""
        self.watch.collect()
        names = [n for name in region_names for n in (name, twin_of(name))]  # a verification twin's too
        stats = [self.watch.stats[name] for name in names if name in self.watch.stats]
        return (sum(s.compile_seconds for s in stats), sum(s.cache_hits for s in stats), sum(s.cache_misses for s in stats))

    def _compiled_since(self, before: tuple[float, int, int], region_names: list[str]) -> tuple[float, str | None]:
        """A trial's compile seconds and whether they came from the cache (:func:`report.cache_state`)."""
        seconds, hits, misses = (now - then for now, then in zip(self._compile_counts(region_names), before))
        return seconds, cache_state(int(hits), int(misses))

    def _decide(self, candidate: Candidate, options: CompileOptions, *, kept: bool, reason: str, **numbers: Any) -> None:
        self._add(Decision(region=candidate.name, modules=[n or MODEL for n in candidate.region.module_names],
                           mode=options.mode_name, kept=kept, reason=reason,
                           step=self._batch_index, time_share=candidate.share, **numbers))

    def _coverage(self) -> float | None:
        if self.profiler is None:
            return None
        if any(r.name == MODEL or r.name in self._whole_names() for r in self.regions):
            return 1.0
        forward = self.profiler.forward_ms()
        total = forward.get("") or 0.0
        if not total:
            return None
        covered = sum(forward.get(name, 0.0) for region in self.regions for name in region.module_names)
        return min(1.0, covered / total)

    # -- resume --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "frozen": self.frozen,
            "decisions": [d.as_dict() for d in self.decisions],
            # What runs compiled now: a region the churn policy reverted stays eager after a resume,
            # and one it recompiled dynamic stays dynamic.
            "plan": [{"name": r.name, "modules": r.module_names, "mode": r.compiled_with.mode,
                      "options": r.compiled_with.options, "dynamic": r.compiled_with.dynamic}
                     for r in self.regions if r.is_compiled and r.compiled_with is not None],
            "eager_ms": self.eager_ms,
            "coverage": self.coverage,
            "notes": list(self.notes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("frozen"):
            return  # a run stopped mid-trials starts its trials again
        self.decisions = [Decision.from_dict(d) for d in state.get("decisions", [])]
        self.eager_ms = state.get("eager_ms")
        self.coverage = state.get("coverage")
        self.notes = list(state.get("notes", []))
        self._saved_plan = list(state.get("plan", []))

    def _apply_saved_plan(self, plan: list[dict[str, Any]]) -> None:
        named = dict(self.root.named_modules())
        for item in plan:
            # The root is "" (named_modules' own name for it): a child called "model" is not the root.
            missing = [n for n in item["modules"] if n not in named]
            if missing:
                raise ValueError(f"the saved compile plan names modules this model lacks: {missing}; "
                                 f"resume with the same model, or start without ckpt_path.")
            modules = [named[n] for n in item["modules"]]
            region = Region(item["name"], list(item["modules"]), modules)
            self.watch.add_region(region)
            options = dataclasses.replace(self.options, mode=item.get("mode"))
            if "options" in item:  # CUDA graphs beside the user's options are in them
                options = dataclasses.replace(options, options=item["options"])
            elif options.mode not in (None, "default") and options.options:  # a plan saved before they were kept:
                # its mode as options beside this run's (torch.compile takes no mode beside options)
                options = dataclasses.replace(options, mode=None, options={
                    **torch_internals.mode_options(options.mode), **options.options})  # the user's own win
            if "dynamic" in item:  # plans saved before it was kept compile with the options of this run
                options = dataclasses.replace(options, dynamic=item["dynamic"])
            compile_region(region, options, on_error=self._failed)
            self.regions.append(region)
        self.frozen = True
        self._script = self._frozen()

    def _frozen(self) -> Iterator[str | None]:
        """A loaded plan's script: compiled from the start. Once its first batches have compiled it, each
        kept decision's ``compile_cache`` says how this fit's compile went (a warm restart: ``warm``);
        the rest of a loaded decision is the search that made it."""
        for _ in range(self.warmup_steps):
            yield WARMUP
        yield COMPILED
        for decision in self.decisions:
            if decision.kept:
                _, hits, misses = self._compile_counts(decision.region.split("+"))
                decision.compile_cache = cache_state(hits, misses)
        while True:
            yield COMPILED


def warm_call(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, context: Callable[[], Any],
              backward: bool = False) -> VerificationResult:
    """With verification off, still compile outside the step (so a failing compile reverts, not crashes);
    ``backward``: the backward too (verification's forward and backward, results dropped)."""
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    try:
        # Grad mode on, as in training, so the graph compiled here is the one the steps use.
        with torch.random.fork_rng(devices=cuda_devices(module)), context(), torch.enable_grad():
            if backward:
                run_forward_and_backward(module, args, kwargs)
            else:
                module(*args, **kwargs)
    except Exception as error:
        return VerificationResult(False, float("inf"), 0.0, "compile", torch_internals.describe_error(error)[:300])
    finally:
        with torch.no_grad():
            for name, b in module.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    return VerificationResult(True, 0.0, 0.0, "not verified")
