"""CompileRun: one fit of CompileCallback, as a plain object.

It holds the fit's planner, compile watch, step timer, churn policy, padding and plan persistence, and
is driven by the callback's hooks through a few calls (``begin``, ``before_batch``, ``after_batch``,
``epoch_end``, ``finish``, ``release``). What it needs of the training loop comes in a :class:`FitEnv` of
plain values and callables (broadcast, agree, warn, the run's length), so nothing here imports
Lightning and a new fit starts from a new object: nothing leaks from one fit to the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from compile_callback import background, torch_internals
from compile_callback.anatomy import OpAnatomy, StepOps, host_sync_advice
from compile_callback.churn import ChurnAction, ChurnPolicy, RecompileChurnError, not_padded, remedies, same_cause
from compile_callback.collate import PaddingStats, padding_stats
from compile_callback.config import AUTO, CompileConfig
from compile_callback.memory import allocated_bytes, graph_pool_free_bytes, peak_bytes, plan_peak_bytes, room_bytes
from compile_callback.padding import PaddingNotApplied, PaddingPlan, apply_to_loaders, census_from_dataset, first_loader
from compile_callback.plan_cache import PlanCacheError, load_plan, plan_key, plan_path, save_plan
from compile_callback.planner import COMPILED, EAGER, ISSUE, WARMUP, AutoPlanner, FixedPlanner, Planner
from compile_callback.regions import backend_name, resolve_regions, revert_region, uses_cuda_graphs
from compile_callback.report import build_suggestions, ddp_note
from compile_callback.reprice import Repricer, Round, round_cycles
from compile_callback import telemetry
from compile_callback.timing import StepTimer, steady_speedup, summarize
from compile_callback.verify import optimizer_state_tensors
from compile_callback.watch import CompileWatch

MEMORY_READS_FIRST, MEMORY_READ_EVERY = 32, 128  # the plan's steps whose memory is read: its first ones, then every 128th
PLAN_TIMED_FIRST, PLAN_TIMED_EVERY = 32, 8  # the frozen plan's steps timed (one shape): its first ones, then every 8th
# While a background child compiles, a batch takes the full path (polls the child) once this long after the last that did.
WAITING_POLL_S = 0.05
SAVED_EAGER = "eager (checkpoint)"  # timer label: eager medians by shape from a checkpoint or a cached plan
# Per-rank counts (the watch's totals, this fit's) gathered at the end of a multi-process fit.
RANK_COUNTS = ("graphs", "recompiles", "graph_breaks", "eager_fallbacks", "ddp_pieces")
PROFILE_STEPS = 3  # eager batches with forward hooks on the candidates (not timed as baseline)
GB = 2.0**30
# Validation runs under no_grad, which compiled regions meet with one more graph each: it is compiled
# only where the run's validation batches left would repay it (:meth:`CompileRun.validation_start`),
# priced from the training plan: a validation batch's forward is about this share of a training step
# (forward + backward + optimizer step), and the no_grad graph's compile about this share of the
# training graph's (GPT-2 on the H200: 10 s against 21 s).
FORWARD_SHARE = 1 / 3
INFERENCE_COMPILE_SHARE = 0.5


def batch_shapes(batch: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of a batch's tensors: the step timer's key, so trials compare steps of like shapes."""
    return tuple(tuple(leaf.shape) for leaf in torch_internals.tree_leaves(batch) if isinstance(leaf, torch.Tensor))


def plan_step_sampled(plan_step: int, first: int, every: int) -> bool:
    """Whether the plan's ``plan_step``-th step since it last compiled is among its first ``first`` or an ``every``-th after."""
    return plan_step <= first or plan_step % every == 0


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, stacklevel=2)


@dataclasses.dataclass
class FitEnv:
    """What the training loop gives a fit: collectives, output, and facts about the run.

    The defaults are one process with nothing around it (a plain loop, or a test).
    """

    broadcast: Callable[[Any, int], Any] = lambda value, src: value  # every rank gets rank ``src``'s value
    agree_all: Callable[[bool], bool] = bool  # True on every rank only if True on all
    world_size: int = 1
    multi_process: bool = False  # the ranks are processes that must meet in a collective to agree
    is_global_zero: bool = True
    warn: Callable[[str], None] = _warn  # rank zero's warnings
    planned_batches: Callable[[], int | None] = lambda: None  # the fit's training batches, if known
    forward_context: Callable[[], Any] = contextlib.nullcontext  # the precision's autocast, for verification
    optimizers: Callable[[], list[Any]] = list  # their state moves to host memory while verification runs
    train_loaders: Callable[[], Any] = lambda: None  # the loaders the loop iterates (for churn's padding)
    val_loaders: Callable[[], Any] = lambda: None
    sample_anatomy: bool = True  # rank zero, and no profiler of the user's own running
    log_every: int = 50  # batches between agreements on churn

    def from_every_rank(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank: one broadcast from each rank,
        the collective the planner's agreements already use."""
        return [self.broadcast(value, rank) for rank in range(self.world_size)]


# Why anatomy=None samples nothing on a CUDA device (the report's note says it).
ANATOMY_OFF_ON_CUDA = (
    "anatomy not sampled (anatomy=None on CUDA): torch.profiler sessions, even CPU-only ones, left this process's "
    "host work slower for the rest of its life on the H200 (eager ResNet-18 steps +20-25% after 30 sessions, a host "
    "clock beside them flat), which would bias the trials' eager timings; anatomy=True samples anyway"
)


def child_progress_note(progress: dict[str, Any] | None) -> str | None:
    """The stages a child still compiling has started, for the report (None: no child compiles)."""
    if progress is None or not progress["stages"]:
        return None
    stages = ", ".join(f"{s['stage']} at {s['after_s']:.1f} s" for s in progress["stages"])
    return f"the background child of `{progress['region']}`, seconds after its hand-over: {stages} (the last still running)"


def anatomy_sampled(anatomy: bool | None, device: torch.device) -> bool:
    """Whether the fit samples steps for the compile anatomy: as asked, else on CPU only (see
    :data:`ANATOMY_OFF_ON_CUDA`)."""
    return anatomy if anatomy is not None else device.type != "cuda"


class CompileRun:
    """One fit: made in the callback's ``setup``, begun in ``on_fit_start``, released in ``teardown``."""

    def __init__(self, config: CompileConfig, backend: Any, env: FitEnv) -> None:
        self.config = config
        self.backend = backend  # resolved: a dotted path imported
        self.env = env
        # As the user gave it (a list of edges as a list); the churn policy may turn padding on for this fit.
        self.pad: str | list[int] | None = list(config.pad) if isinstance(config.pad, tuple) else config.pad
        self.padding: PaddingPlan | None = None
        self.loaders_padded: set[str] = set()
        self.static_buckets = False
        self.bucket_graphs = 0  # static graphs an epoch's padded batches may need, per stage
        self.val_loaders_waiting: list[Any] = []  # asked for before the training loaders' census
        self.previous_recompile_limit: int | None = None
        self.notes: list[str] = []
        self.churn_actions: list[dict[str, Any]] = []
        self.anatomy_ops = OpAnatomy(config.backend)
        self._anatomy_on = False  # whether steps are sampled for the anatomy (set in begin, by device)
        self.planner: Planner | None = None
        self.watch: CompileWatch | None = None
        self.timer: StepTimer | None = None
        self.churn: ChurnPolicy | None = None
        self.batch_index = 0
        self.ranks: list[dict[str, Any]] | None = None
        self._rank_note: str | None = None
        self._label: str | None = None
        self._on_gpu = False
        self._device: torch.device | None = None
        self._warned_host_syncs = False
        self._memory_high: dict[str, int] = {}  # label -> bytes allocated at the forward/backward boundary
        self._graph_step_high: int | None = None  # a CUDA-graph plan's allocated and pool-free bytes there, the most read
        self._eager_activations: int | None = None  # bytes an eager step allocated beyond its start's
        self._plan_steps = 0  # steps of the plan ("compiled") since it last compiled: their reads are sampled
        self._timed = False  # whether this batch's step is timed (see _step_timed)
        self._steady = False  # whether the next batches may be quiet steps (see quiet_step)
        self._quiet = False  # whether this batch is one
        self._waiting = False  # whether the next batches may be quiet while a background child compiles (see quiet_step)
        self._full_at = 0.0  # perf_counter at the last batch that took the full path
        self._step = 0  # the Trainer's global step at the last batch's end
        # Whether the ranks agree on churn every `log_every` batches (a policy that acts, several processes).
        self._churn_agreed_every_log = config.on_recompile != "warn" and env.multi_process
        self._memory_at_start = 0
        self._host_start = 0.0
        self._issue_started: float | None = None  # an ISSUE batch's start, after its wait for the device
        self._steady_keys: bool | None = None  # whether steady steps keep their shapes (see _keys_wanted)
        self._planned_batches: int | None = None
        self._previous_backward_lowering: bool | None = None
        self._plan_file: str | None = None
        self._previous_inductor_cache: tuple[str | None] | None = None  # while ours is set
        self._eager_stance: Any = None  # torch.compiler.set_stance("force_eager") while validation runs eager
        self.repricer = Repricer()  # eager timed again beside the frozen plan (compile_callback.reprice)
        self._reprice_stance: Any = None  # force_eager for one batch of a re-pricing round
        self._launcher: background.Launcher | None = None  # starts the planner's children (None: none)
        self._standby: background.Standby | None = None  # rank 0's first child's interpreter, from setup to begin
        # Seconds the training loop waited for compiling and checking (compile/stall_s is their sum), in two
        # parts, and the longest single wait with its batch (the report's summary): the planner's work before
        # a step (verification, a trial's set-up and compile, a child's start), steps in which dynamo
        # compiled, beyond an eager step's median, and the planner's work inside a step (the profiler copying
        # the inputs it holds to host memory).
        self._stall_parts = {"before_steps_s": 0.0, "compiling_steps_s": 0.0, "holding_inputs_s": 0.0}
        self._longest_stall: tuple[float, int] | None = None
        self._plan_key: dict[str, Any] | None = None
        self._churn_pending: list[ChurnAction] = []  # found on this rank, not yet agreed by every rank
        self._padding_seen = PaddingStats()
        self._totals_at_start: dict[str, float] = {}

    # -- padding -----------------------------------------------------------------------------------
    def padding_plan(self) -> PaddingPlan:
        if self.padding is None:
            config = self.config
            self.padding = PaddingPlan(
                self.pad if self.pad is not None else AUTO,
                max_buckets=config.pad_max_buckets, multiple=config.pad_multiple, short_batch=config.pad_short_batch,
            )
        return self.padding

    def pad_loaders(self, loaders: Any, kind: str) -> bool:
        """Chooses the edges (from the first training loader's dataset) and puts the collate in;
        returns whether every loader took it."""
        plan = self.padding_plan()
        try:
            if plan.edges is None:
                loader = first_loader(loaders)
                if loader is None:
                    raise PaddingNotApplied(f"no torch DataLoader among the {kind} dataloaders")
                census, target = census_from_dataset(loader.dataset)
                plan.choose(census, target)
                self.notes.append(
                    f"padding: {plan.target} sizes from a census of {plan.census_size} samples -> edges {plan.edges}"
                )
            warnings, every = apply_to_loaders(loaders, plan)
            for warning in warnings:
                self.env.warn(warning)
            self.loaders_padded.add(kind)
            return every
        except PaddingNotApplied as error:
            self.env.warn(f"CompileCallback(pad={self.pad!r}) could not pad the {kind} dataloaders: {error}")
            self.notes.append(f"padding not applied to {kind}: {error}")
            self.loaders_padded.add(kind)  # said once; not retried every epoch
            return False

    def loaders_made(self, loaders: Any, kind: str, *, training_loaders_follow: bool) -> None:
        """Pads loaders as a ``*_dataloader`` hook makes them. The edges come from the training set's census:
        validation loaders made before the training ones (``training_loaders_follow``: the sanity check
        comes first when ``estimated_stepping_batches`` has not made the training loaders yet, e.g.
        ``Trainer(max_steps=...)``) wait, unpadded, and are padded with them, from their next iterator on."""
        if kind == "train":
            if self.pad_loaders(loaders, "train"):
                self.compile_static_buckets()
            if self.padding_plan().edges is not None:
                while self.val_loaders_waiting:
                    self.pad_validation(self.val_loaders_waiting.pop(0))
        elif training_loaders_follow and self.padding_plan().edges is None:
            self.val_loaders_waiting.append(loaders)
        else:
            self.pad_validation(loaders)

    def pad_validation(self, loaders: Any) -> None:
        """Pads the validation loaders; says what it costs when some cannot be and training is static."""
        if not self.pad_loaders(loaders, "val") and self.static_buckets:
            self.env.warn(
                "CompileCallback: some validation dataloaders cannot be padded while training compiles a static "
                "graph per bucket: each validation batch shape compiles a graph of its own, up to dynamo's "
                "recompile limit, and then runs eager. Let the validation DataLoader batch samples (no "
                "batch_sampler), or pass dynamic=True."
            )

    def compile_static_buckets(self) -> None:
        """With batches padded from the first, every batch has one of a few fixed shapes: each is compiled
        as a static graph of its own (``dynamic=False``), unless the user chose ``dynamic=True``. Left alone,
        dynamo makes the padded size dynamic at the second bucket, and dynamic-shape kernels over padded
        batches lose to static ones (BENCHMARKS.md, variable-length GPT-2). Dynamo's recompile limit is
        raised, for this fit, to the graphs the buckets need, so none of them falls back to eager."""
        plan = self.padding_plan()
        if self.static_buckets or self.config.dynamic is True or not plan.edges:
            return
        self.static_buckets = True
        # Per padded shape a full batch and a short last one, each in training and in validation (no_grad).
        self.bucket_graphs = plan.shapes() * (2 if plan.short_batch == "keep" else 1)
        needed = 2 * self.bucket_graphs
        limit = torch_internals.recompile_limit()
        note = "padding: regions compiled static (dynamic=False), one graph per bucket"
        if limit < needed:
            self.previous_recompile_limit = torch_internals.set_recompile_limit(needed)
            note += f"; dynamo's recompile limit raised from {limit} to {needed} for this fit"
        self.notes.append(note)
        self._apply_static_buckets()

    def _apply_static_buckets(self) -> None:
        """Makes the planner compile static graphs and the churn policy expect the buckets' recompiles.
        Neither may exist yet: the loop may ask for the loaders before ``begin`` (Lightning does, for
        ``estimated_stepping_batches``), and ``begin`` calls this again."""
        if not self.static_buckets:
            return
        if self.churn is not None:
            self.churn.shape_budget = self.bucket_graphs
        if self.planner is not None:
            self.planner.compile_static(self.bucket_graphs)

    def pad_late(self, train_loaders: Any, val_loaders: Any) -> None:
        """Loaders the loop made without a hook of ours (given to ``fit`` directly): padded from now on."""
        if "train" not in self.loaders_padded and train_loaders is not None:
            self.pad_loaders(train_loaders, "train")
            self.env.warn(
                "CompileCallback(pad=...) pads dataloaders given to trainer.fit(...) from the second epoch on "
                "(Lightning creates the first epoch's iterator before any callback hook). To pad from the "
                "first batch, return the loaders from a LightningDataModule or the LightningModule's "
                "train_dataloader()/val_dataloader()."
            )
        if "val" not in self.loaders_padded and val_loaders is not None:
            self.pad_validation(val_loaders)

    # -- the fit -------------------------------------------------------------------------------------
    def begin(self, module: nn.Module, *, first_epoch: int, loaded_state: dict[str, Any] | None) -> None:
        """Builds the planner for ``module`` (moved and wrapped by the strategy by now: compiling in place
        here is seen by DDP's wrapper and keeps state-dict keys), then a checkpoint's or a cached plan."""
        config, env = self.config, self.env
        device = next(module.parameters()).device
        names = {id(m): name for name, m in module.named_modules()}
        self.anatomy_ops.device_type = device.type
        self._anatomy_on = anatomy_sampled(config.anatomy, device)
        if config.anatomy is None and not self._anatomy_on:
            self.notes.append(ANATOMY_OFF_ON_CUDA)
        self._on_gpu = device.type == "cuda"  # where a host sync costs time
        self._device = device
        self._planned_batches = env.planned_batches()
        self._previous_backward_lowering = torch_internals.compile_backward_with_forward(True)
        self.timer = StepTimer(device)
        compile_options = config.compile_options(self.backend)
        if config.regions == AUTO:
            self.watch = CompileWatch({}, names)
            background_off = background.policy(config.background_compile, device=device, world_size=env.world_size,
                                               options=compile_options)
            # Children start from a Launcher; rank 0's first one on the interpreter started at setup (ranks on
            # other devices start theirs fresh where they need one: most never do).
            standby, self._standby = self._standby, None
            if background_off and standby is not None:
                standby.stop()
            self._launcher = None if background_off else background.Launcher(
                standby=standby, context=env.forward_context, device=device, verify=config.verify,
                tolerance=config.verify_tolerance, needed_bytes=lambda: self._eager_activations)
            self.planner = AutoPlanner(
                module, compile_options, timer=self.timer, watch=self.watch, device=device,
                warmup_steps=config.warmup_steps, profile_steps=PROFILE_STEPS,
                baseline_steps=config.eager_baseline_steps, trial_steps=config.trial_steps,
                min_speedup=config.min_speedup, max_trials=config.max_trials, verify=config.verify,
                tolerance=config.verify_tolerance,
                agree=lambda value: env.broadcast(value, 0),
                agree_all=env.agree_all,
                remaining_batches=self.remaining_batches,
                context=env.forward_context,
                idle_state=lambda: optimizer_state_tensors(env.optimizers()),
                activation_bytes=lambda: self._eager_activations,
                room_bytes=lambda: room_bytes(device),
                peak_bytes=lambda: peak_bytes(device),
                background=self._launcher,
                background_always=config.background_compile is True,
                processes=env.world_size if env.multi_process else 1,
                rank_zero=env.is_global_zero,
            )
            if background_off and (config.background_compile or device.type == "cuda"):
                self.planner.notes.append(background_off)
        else:
            regions = resolve_regions(module, config.region_names)
            if config.background_compile:
                self.notes.append("background compile off: named regions are compiled in place before their first "
                                  "step, with no trial for a child to prepare (regions='auto' has trials)")
            self.watch = CompileWatch({id(m): r.name for r in regions for m in r.modules}, names)
            self.planner = FixedPlanner(
                regions, compile_options, baseline_steps=config.eager_baseline_steps, warmup_steps=config.warmup_steps
            )
        if loaded_state is not None:
            self._resume(loaded_state)
        elif config.cache_dir is not None and config.regions == AUTO:
            self._load_cached_plan(module, device)
        if self.planner.frozen:  # a plan brought back by a checkpoint or the plan cache: no child will run
            self._close_launcher()
        self._totals_at_start = dict(self.watch.totals())  # after a resume: the checkpoint's (rank 0's)
        self.churn = ChurnPolicy(
            config.on_recompile, max_recompiles_per_epoch=config.max_recompiles_per_epoch, first_epoch=first_epoch
        )
        self._apply_static_buckets()
        self.watch.start()
        self.planner.before_fit()

    def _resume(self, state: dict[str, Any]) -> None:
        assert self.planner is not None and self.watch is not None
        reference = state.get("anatomy_reference")
        if reference:  # resumed: the eager reference of graph coverage was sampled before the checkpoint
            self.anatomy_ops.eager = StepOps(**reference)
        self.watch.load_state_dict(state.get("watch", {}))
        self.batch_index = int(state.get("batch_index", 0))
        self._add_saved_eager(state.get("eager_by_shape", []))
        saved, now = state.get("plan_options"), self.config.plan_options()
        if saved is not None and saved != now:  # the plan and its prices were made under other arguments
            changed = ", ".join(sorted(key for key in set(saved) | set(now) if saved.get(key) != now.get(key)))
            self.notes.append(f"the checkpoint's compile plan was chosen with other arguments ({changed}): "
                              f"chosen again in this fit")
            return
        if saved is None:
            self.notes.append("the checkpoint was saved before its compile arguments were recorded: its plan is "
                              "applied as saved, whatever this fit's arguments")
        self.planner.load_state_dict(state.get("planner", {}))
        self.repricer.load_state_dict(state.get("repricer", {}))

    def _load_cached_plan(self, module: nn.Module, device: torch.device) -> None:
        assert self.planner is not None and self.config.cache_dir is not None
        self._plan_key = plan_key(module, device=device, options=self.config.cache_options(self.pad))
        self._plan_file = plan_path(self.config.cache_dir, self._plan_key)
        try:
            state, problem = load_plan(self._plan_file, self._plan_key), None
        except PlanCacheError as error:
            state, problem = None, str(error)
        # Rank 0's file decides for all: a rank that planned alone would wait in the planner's collectives.
        state, problem = self.env.broadcast((state, problem), 0)
        if problem is not None:
            self.env.warn(f"CompileCallback ignores its cached plan and plans again: {problem}.")
            self.notes.append(f"cached plan ignored: {problem}")
            return
        if state is not None:
            self.planner.load_state_dict(state["planner"])
            self._add_saved_eager(state["eager_by_shape"])
            self.notes.append(f"plan loaded from {self._plan_file}: no profiling, no trials")

    def _save_cached_plan(self) -> None:
        if self._plan_file is None or self._plan_key is None or not self.env.is_global_zero:
            return
        if self.planner is not None and self.planner.searches and self.planner.frozen:
            save_plan(self._plan_file, self._plan_key, self.planner.state_dict(), self._eager_medians_by_shape())

    def _eager_medians_by_shape(self) -> list[list[Any]]:
        """``[[shapes, median ms], ...]``: the eager baseline's median per batch shape, as plain lists (they
        load under ``weights_only`` and as JSON), for a resumed run or a warm restart to price by."""
        return [
            [[list(shape) for shape in key], statistics.median(steps)]
            for key, steps in self._eager_by_shape().items() if key is not None
        ]

    def _add_saved_eager(self, rows: list[Any]) -> None:
        """Seeds the timer with saved eager medians by shape (:meth:`_eager_medians_by_shape`)."""
        assert self.timer is not None
        for shapes, ms in rows:
            self.timer.add(SAVED_EAGER, float(ms), tuple(tuple(shape) for shape in shapes))

    def use_inductor_cache(self) -> None:
        """Keeps Inductor's compile caches in ``cache_dir/inductor`` for this fit (``release`` gives the
        previous directory back), so a second identical run hits them."""
        directory = os.path.join(self.config.cache_dir or "", "inductor")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise ValueError(f"`cache_dir` {self.config.cache_dir!r} cannot be created: {error}. "
                             f"Give a writable directory.") from error
        self._previous_inductor_cache = (torch_internals.use_inductor_cache_dir(directory),)

    def start_standby(self, device: torch.device, preload: tuple[str, ...]) -> None:
        """Starts rank 0's first child's interpreter (:class:`~compile_callback.background.Standby`) now, at the
        fit's setup, where background compiles are on: its imports (8 s alone on the H200, 14 s beside a
        training GPT-2) overlap the fit's own start instead of delaying the child. ``preload``: the modules the payload's classes come from."""
        if (self.config.regions == AUTO and self.env.is_global_zero and self._standby is None
                and background.policy(self.config.background_compile, device=device, world_size=self.env.world_size,
                                      options=self.config.compile_options(self.backend)) is None):
            self._standby = background.Standby(preload)

    def remaining_batches(self) -> int:
        return 10**9 if self._planned_batches is None else self._planned_batches - self.batch_index

    # -- each batch ----------------------------------------------------------------------------------
    def set_phase(self, stage: str, epoch: int, step: int) -> None:
        if self.watch is not None:
            self.watch.set_phase(stage=stage, epoch=epoch, step=step)

    def before_batch(self, module: nn.Module, *, epoch: int, step: int) -> None:
        """A batch's start, where :meth:`quiet_step` said it is not a quiet one."""
        assert self.planner is not None and self.watch is not None and self.timer is not None
        self.watch.start()  # re-installs the hooks if someone called torch._dynamo.reset()
        self.watch.set_phase(stage="train", epoch=epoch, step=step)
        self._finish_sync_probe()  # first: the planner may compile and run code below
        planning = self._full_at = time.perf_counter()
        issue_ms = None if self._issue_started is None else (planning - self._issue_started) * 1e3
        self._issue_started = None
        self._label = self.planner.before_batch(self.batch_index, issue_ms=issue_ms)
        self._add_stall("before_steps_s", time.perf_counter() - planning)  # verification and trial set-up
        repricing = self._repricing_step()
        if repricing is not None:
            eager, self._label = repricing
            if eager:
                self._reprice_stance = torch.compiler.set_stance("force_eager")  # ended in after_batch / release
        if self._anatomy_on and self.env.sample_anatomy:
            watch = self.watch
            self.anatomy_ops.before_batch(
                module,
                eager_step=self._is_eager_reference_step(),
                compiled_step=self._label == COMPILED,
                regions=self.planner.regions,
                epoch=epoch,
                graph_counts=lambda: tuple(watch.totals()[key] for key in ("graphs", "graph_breaks")),
                region_modules=self.planner.region_modules,
            )
        if self._label == COMPILED:
            self._plan_steps += 1
        if self._on_gpu and self._label == EAGER:
            self._memory_at_start = allocated_bytes(self._device)
        if self._label == ISSUE:  # timed from an empty launch queue to the next batch's start (planner._time_issue)
            torch.cuda.synchronize(self._device)
            self._issue_started = time.perf_counter()
        self._host_start = time.perf_counter()
        self._timed = self._step_timed()
        if self._timed:
            self.timer.start()

    def quiet_step(self) -> bool:
        """Whether this batch is a quiet step, and if so begins it; else the batch begins with
        :meth:`before_batch`. A quiet step reads nothing of the Trainer and is only counted, timed and read
        for memory where sampled, and watched for a compile: the last full step left the plan steady
        (:meth:`_still_steady`), or waiting for a background child with nothing else to do
        (:meth:`_waits_quietly`; a batch :data:`WAITING_POLL_S` after the last full one takes the full path,
        which polls the child), and this one is neither a re-pricing round's nor a point where ranks agree on
        churn. It skips the planner, the probes, the re-pricing and churn checks, which cost the H200's host
        ~30 us a step (1% of ResNet-18 CIFAR's 3 ms; the ~1000 batches trained while a child compiles
        ResNet-18 CIFAR's whole model, 39 us a batch on a 2-core CPU, session 37); a compile in it sends
        :meth:`after_batch` down the full path, which records it as any other."""
        if not (self._steady or (self._waiting and time.perf_counter() - self._full_at < WAITING_POLL_S)):
            return False
        batch = self.batch_index
        if self.repricer.due(batch) or (self._churn_agreed_every_log and (batch + 1) % self.env.log_every == 0):
            return False
        if self._steady:
            self._plan_steps += 1
        self._quiet = True
        self.watch.step = self._step  # type: ignore[union-attr]  # the step a compile in this batch belongs to
        self._host_start = time.perf_counter()
        self._timed = self._step_timed()
        if self._timed:
            self.timer.start()  # type: ignore[union-attr]
        return True

    def _still_steady(self, compiled_now: bool) -> bool:
        """Whether the batches after this one may be quiet steps (:meth:`quiet_step`): the plan froze (with
        or without anything compiled), this batch ran it without compiling, batches come in one shape, no anatomy
        sample or probe is taken, no re-pricing round runs and no churn waits for the ranks to agree."""
        assert self.planner is not None
        return (self._label == COMPILED and self.planner.frozen and not compiled_now and not self._keys_wanted()
                and self._nothing_pending())

    def _waits_quietly(self, compiled_now: bool) -> bool:
        """Whether the batches after this one may be quiet (:meth:`quiet_step`) until the next poll of a
        background child: this one was a warm-up batch the planner spent waiting for the child, alone (one
        process: ranks meet at the planner's batches to agree), it compiled nothing, and as for a steady
        plan no sample, probe, re-pricing or churn is pending."""
        assert self.planner is not None
        return self._label == WARMUP and self.planner.waiting_alone() and not compiled_now and self._nothing_pending()

    def _nothing_pending(self) -> bool:
        """No anatomy sample or probe is taken, no re-pricing round runs, no churn waits for the ranks to agree
        and validation's eager stance is off."""
        return (not (self._anatomy_on and self.env.sample_anatomy) and not self.repricer.running
                and not self._churn_pending and self._eager_stance is None)

    def before_backward(self) -> None:
        if not self._quiet:  # a quiet step is never an anatomy sample
            self.anatomy_ops.backward_started()
        if self._on_gpu and self._memory_read_due():
            # Every activation the backward needs is alive here: the step's memory high point, read from
            # the allocator's counters (host-side, no sync) for the eager baseline and the plan alike.
            allocated = allocated_bytes(self._device)
            self._memory_high[self._label] = max(self._memory_high.get(self._label, 0), allocated)
            if self._label == COMPILED and self.planner is not None and uses_cuda_graphs(self.planner.regions):
                # Its graphs record at their third call and pools grow with new shapes: the most seen. A
                # snapshot walks every segment (milliseconds): on the sampled reads only.
                self._graph_step_high = max(self._graph_step_high or 0,
                                            allocated + graph_pool_free_bytes(self._device))
            if self._label == EAGER:
                self._eager_activations = max(self._eager_activations or 0, allocated - self._memory_at_start)

    def _add_stall(self, part: str, seconds: float) -> None:
        """Counts ``seconds`` of stopped training at this batch into ``compile/stall_s`` and its ``part``."""
        self._stall_parts[part] += seconds
        if self._longest_stall is None or seconds > self._longest_stall[0]:
            self._longest_stall = (seconds, self.batch_index)

    def _memory_read_due(self) -> bool:
        """Whether this step reads the allocator at its forward/backward boundary: every eager baseline
        step, and the plan's first :data:`MEMORY_READS_FIRST` steps and every :data:`MEMORY_READ_EVERY`-th
        after, counted again from any step that compiled (steady steps of one graph hold alike; a read
        costs the H200's host ~60-80 us, 2% of ResNet-18 CIFAR's 3.3 ms: every 16th added 5 us a step)."""
        if self._label == EAGER:
            return True
        return self._label == COMPILED and self._plan_step_sampled(MEMORY_READS_FIRST, MEMORY_READ_EVERY)

    def _step_timed(self) -> bool:
        """Whether this step is timed: every step but the frozen plan's steady ones where batches come in
        one shape, which are timed on their first :data:`PLAN_TIMED_FIRST` and every
        :data:`PLAN_TIMED_EVERY`-th after, counted again from any step that compiled. Those feed only the
        steady step time (the last 100 timed); a CUDA event pair and its read cost the H200's host ~40 us
        a step, 1% of ResNet-18 CIFAR's 4 ms. With several shapes every step is timed: a sample every few
        steps could fall on some shapes only. A warm-up batch (:data:`WARMUP`: settling after a compile, or
        training on while a background child compiles, often hundreds of batches) is not: its time would be
        discarded, after an event recorded and the batch walked for its shapes (a quarter of the hooks' time
        in such a batch on CPU)."""
        if self._label == WARMUP:
            return False
        if self._label != COMPILED or self._keys_wanted():
            return True
        return self._plan_step_sampled(PLAN_TIMED_FIRST, PLAN_TIMED_EVERY)

    def _plan_step_sampled(self, first: int, every: int) -> bool:
        """Whether this plan step is among its first ``first`` since the plan last compiled, or an ``every``-th after."""
        return plan_step_sampled(self._plan_steps, first, every)

    def after_backward(self, *, last: bool) -> None:
        if not self._quiet:
            self.anatomy_ops.backward_ended(last=last)

    def after_batch(self, batch: Any, *, step: int) -> None:
        assert self.planner is not None and self.watch is not None and self.timer is not None
        quiet, self._quiet = self._quiet, False
        self._step = step  # the next batch's step until the optimizer steps again
        if quiet and self.watch.idle:  # nothing compiled: the plan's step, in one shape (see quiet_step)
            if self._timed:
                self.timer.stop(self._label)
            self.batch_index += 1
            if self.padding is not None and self.padding.edges is not None:
                self._count_padding(batch)
            return
        compiled_now = self.watch.compiled_since_collect
        sampled = self.anatomy_ops.end_batch(compiled=compiled_now)
        # A step that compiled is not a steady-state step: its time goes to compile time, not speed;
        # nor is a profiled one.
        if self._timed:
            key = batch_shapes(batch) if self._keys_wanted() else None
            self.timer.stop(None if compiled_now or sampled else self._label, key=key)
        self._end_repricing_batch()
        host_ms = (time.perf_counter() - self._host_start) * 1e3
        if compiled_now:  # the step waited for dynamo: what it took beyond an eager step (or all of it)
            self._add_stall("compiling_steps_s", max(0.0, host_ms - (self.timer.median_ms(EAGER) or 0.0)) / 1e3)
            self._plan_steps = 0  # a new graph (a new shape's, a recompiled region's): its steps are read afresh
        self.watch.collect()
        self.planner.after_batch(self.batch_index, host_ms=host_ms)
        if self._launcher is not None and self.planner.frozen:
            self._close_launcher()  # the search is over: a standby never told to go ends
        holding = self.planner.stall_in_batch_s()
        if holding > 0:
            self._add_stall("holding_inputs_s", holding)
        self.batch_index += 1
        if self.padding is not None and self.padding.edges is not None:
            self._count_padding(batch)
        # Every rank runs the same batches: a policy that acts is agreed on every `log_every` batches too,
        # not only at an epoch's end (one long epoch, or an iterable dataset with max_steps).
        every_rank_here = self.config.on_recompile != "warn" and self.batch_index % self.env.log_every == 0
        self.check_churn(step, every_rank_here=every_rank_here)
        self._steady = self._still_steady(compiled_now)
        self._waiting = not self._steady and self._waits_quietly(compiled_now)

    def _close_launcher(self) -> None:
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None

    def _repricing_step(self) -> tuple[bool, str | None] | None:
        """This batch's part in a re-pricing round (:mod:`compile_callback.reprice`): None (none), or
        (runs eagerly, timer label). Rounds start once the plan froze with something compiled, where
        batches come in one shape and, under CUDA graphs, eager activations fit beside the pool."""
        assert self.planner is not None
        if not self.planner.frozen or not self._compiled_now():
            return None
        self.repricer.plan_frozen(self.batch_index)
        if self.repricer.due(self.batch_index):
            why = None
            if self._keys_wanted():
                why = "batches come in several shapes: the trials priced them shape by shape"
            elif self._on_gpu and uses_cuda_graphs(self.planner.regions):
                room, need = room_bytes(self._device), int(1.2 * (self._eager_activations or 0))
                if room is not None and room < need:
                    why = (f"eager steps beside the CUDA graphs' pool need ~{need / GB:.1f} GB, the device has "
                           f"{room / GB:.1f} GB free")
            # As many cycles as the budget allows over what is left of the run, timed as the latest
            # round (or the trials) found; rank 0's count, so every rank's rounds keep one schedule.
            latest = self.repricer.latest()
            eager_ms, compiled_ms = (latest.eager_ms, latest.compiled_ms) if latest else self._step_ms()
            cycles = round_cycles(self.remaining_batches(), eager_ms, compiled_ms, budget=self.repricer.budget)
            if self.env.multi_process:
                why, cycles = self.env.broadcast((why, cycles), 0)
            if why is not None:
                self.repricer.stop(f"compile/speedup not re-measured late in the run: {why}")
                return None
            if not self.repricer.size(self.batch_index, cycles):
                return None
        return self.repricer.step(self.batch_index)

    def _compiled_now(self) -> bool:
        """Whether any region of the plan runs compiled now."""
        assert self.planner is not None
        return any(r.is_compiled for r in self.planner.regions)

    def _leave_reprice_stance(self) -> None:
        """Ends a re-pricing round's ``force_eager`` (after its batch, or when a fit raised inside it)."""
        if self._reprice_stance is not None:
            self._reprice_stance.__exit__(None, None, None)
            self._reprice_stance = None

    def _end_repricing_batch(self) -> None:
        """Back to the plan after a round's eager batch; at a round's end, its ratio prices the plan."""
        self._leave_reprice_stance()
        if not self.repricer.round_over(self.batch_index):
            return
        assert self.timer is not None
        eager, compiled = self.repricer.labels()
        self.repricer.finish(
            self.batch_index, self.timer.samples_ms(eager, wait=True), self.timer.samples_ms(compiled, wait=True)
        )
        if self.env.multi_process:  # rank 0's timings price the plan, and time the next round, on every rank
            self.repricer.rounds, self.repricer.next_at = self.env.broadcast((self.repricer.rounds, self.repricer.next_at), 0)

    def start_probe(self, *, allowed: Callable[[], bool]) -> None:
        """The batch's last act (after logging): the host-sync probe of the interval to the next batch, when
        due; ``allowed()``: the next hook is surely the next batch's start (see the callback)."""
        self.anatomy_ops.start_probe_if_due(allowed=allowed)

    def _keys_wanted(self) -> bool:
        """Whether this step's time is kept with its batch's shapes: while the plan is decided (trials
        compare like shapes), and after only where the eager baseline saw several shapes, so that the
        steady speedup is priced shape by shape. Else a frozen plan's steps skip walking the batch."""
        assert self.planner is not None and self.timer is not None
        if not self.planner.frozen:
            return True
        if self._steady_keys is None:
            self._steady_keys = len(self.timer.keys((EAGER, SAVED_EAGER))) > 1
        return self._steady_keys

    def _eager_by_shape(self) -> dict[Any, list[float]]:
        """The eager baseline's step times by batch shape: this run's, else the medians saved in the checkpoint or the cached plan."""
        assert self.timer is not None
        return self.timer.samples_by_key(EAGER) or self.timer.samples_by_key(SAVED_EAGER)

    def _is_eager_reference_step(self) -> bool:
        """Whether this batch may be graph coverage's eager reference (the first such batch is): not the
        first batch (its one-time work, e.g. the first ``self.log``, adds ops), not a profiling batch
        (its hooks copy inputs), and not the only timed baseline batch."""
        return self.batch_index >= 1 and (
            self._label == WARMUP or (self._label == EAGER and self.config.eager_baseline_steps >= 2)
        )

    def _finish_sync_probe(self) -> None:
        """Ends the probe of the interval since the last sampled batch; on a GPU, says once what its
        host syncs cost and how to remove them (they also appear in the report's suggestions)."""
        syncs = self.anatomy_ops.finish_probe()
        if syncs is None or self._warned_host_syncs or not self._on_gpu:
            return
        advice = host_sync_advice(syncs, 0)
        if advice:
            self._warned_host_syncs = True
            self.env.warn(f"CompileCallback: {syncs.count} host sync(s) between training steps. " + " ".join(advice))

    def _count_padding(self, batch: Any) -> None:
        try:
            stats = padding_stats(batch)
        except (ValueError, TypeError):
            return  # a batch the padding does not describe (e.g. a tuple without roles): not counted
        self._padding_seen = self._padding_seen + stats  # real elements stay a device tensor: no host sync

    def validation_start(
        self, *, epoch: int, step: int, batches: int | None, every: int | None, sanity_check: bool
    ) -> None:
        """``batches``: this validation's; ``every``: training batches between validations (None: unknown)."""
        self.anatomy_ops.abort_probe()
        self._issue_started = None  # a batch's issue timed across a validation would count the validation
        if self.watch is not None:
            self.watch.collect()
            self.watch.set_phase(stage="validate", epoch=epoch, step=step)
        why = self._validation_stays_eager(batches, every, sanity_check=sanity_check)
        if self.env.multi_process:  # rank 0's timings decide for every rank: one plan everywhere
            why = self.env.broadcast(why, 0)
        if why is None:
            return
        self._eager_stance = torch.compiler.set_stance("force_eager")  # ended in validation_end / release
        if why not in self.notes:
            self.notes.append(why)

    def _validation_stays_eager(self, batches: int | None, every: int | None, *, sanity_check: bool) -> str | None:
        """Why validation runs eagerly this time, or None where it may compile its graph: nothing is
        compiled, its graph exists already, or its batches left repay the compile (or that is unknown)."""
        if self.planner is None or self.watch is None or not self._compiled_now():
            return None
        if any(r.stage == "validate" for r in self.watch.recompiles):
            return None  # a validation compiled its graph already: using it costs nothing
        if sanity_check:
            return "validation's sanity check ran eagerly: its batches come before any training step to repay a compile"
        eager_ms, compiled_ms = self._step_ms()
        if not (eager_ms and compiled_ms and batches and every and self._planned_batches is not None):
            return None  # no measured plan or no known run length: as torch.compile would
        left = batches * (1 + max(0, self.remaining_batches()) // every)
        saving_s = left * max(0.0, eager_ms - compiled_ms) * FORWARD_SHARE / 1e3
        kept = [d.compile_seconds for d in self.planner.decisions if d.kept and d.compile_seconds]
        cost_s = (sum(kept) if kept else self.watch.totals()["compile_time_s"]) * INFERENCE_COMPILE_SHARE
        if saving_s > cost_s:
            return None
        return (f"validation runs eagerly (torch.compiler.set_stance('force_eager')): its {left} batches left "
                f"would save about {saving_s:.1f} s against about {cost_s:.1f} s to compile its no_grad graph "
                f"(estimated from the training plan)")

    def _end_eager_validation(self) -> None:
        if self._eager_stance is not None:
            self._eager_stance.__exit__(None, None, None)  # the stance before ours again
            self._eager_stance = None

    def validation_end(self, *, epoch: int, step: int, sanity_check: bool) -> None:
        self._end_eager_validation()
        if self.watch is not None:
            self.watch.collect()
            if not sanity_check:
                self.check_churn(step, every_rank_here=True)
            self.watch.set_phase(stage="train", epoch=epoch, step=step)

    def epoch_end(self, *, epoch: int, step: int) -> dict[str, float | None]:
        """Churn checked at a point every rank reaches, and the epoch's scalars (per region too)."""
        self.anatomy_ops.abort_probe()
        if self.watch is None:
            return {}
        self.watch.collect()
        self.check_churn(step, every_rank_here=True)
        metrics = self.metrics()
        metrics[telemetry.RECOMPILES_EPOCH] = float(self.watch.recompiles_in("train", epoch))
        for name, stats in self.watch.stats.items():
            # Per region, once an epoch: enough to see which region churns without flooding the tag list.
            tag = telemetry.region_tag(name)
            metrics[f"compile/region/{tag}/graphs"] = stats.graphs
            metrics[f"compile/region/{tag}/recompiles"] = stats.recompiles
            metrics[f"compile/region/{tag}/compile_time_s"] = stats.compile_seconds
        return metrics

    # -- churn ---------------------------------------------------------------------------------------
    def check_churn(self, step: int, *, every_rank_here: bool = False) -> None:
        """Finds new churn and acts on it. With several processes each rank sees its own recompiles
        (its own shard's shapes), so actions wait for a point every rank reaches (``every_rank_here``:
        a training or validation epoch's end, or every ``log_every`` batches for a policy that acts) and
        every rank then takes the same ones, in the same order: one rank raising or reverting a region
        alone would leave the others waiting in DDP's next all-reduce, or running another plan."""
        assert self.churn is not None
        self._churn_pending += self._new_churn(step)
        if self.env.multi_process:
            if not every_rank_here:
                return
            actions = self._agree_on_churn(self._churn_pending)
        else:
            actions = self._churn_pending
        self._churn_pending = []
        for action in actions:
            self._act(action)

    def _new_churn(self, step: int) -> list[ChurnAction]:
        assert self.watch is not None and self.churn is not None and self.planner is not None
        fallbacks = [(name, s.fallback_reason or "") for name, s in self.watch.stats.items() if s.eager_fallback]
        return self.churn.judge(
            self.watch.recompiles, fallbacks, searched=self.planner.searches, frozen=self.planner.frozen, step=step
        )

    def _agree_on_churn(self, mine: list[ChurnAction]) -> list[ChurnAction]:
        """Every rank's new actions, the same list on every rank (rank order, one per cause)."""
        assert self.churn is not None
        agreed: list[ChurnAction] = []
        for actions in self.env.from_every_rank(mine):
            for action in actions or []:
                if any(same_cause(action, other) for other in agreed):
                    continue
                self.churn.adopt(action)  # another rank's cause: not acted on again here
                agreed.append(action)
        return agreed

    def _act(self, action: ChurnAction) -> None:
        """Carries out :func:`churn.remedies` for ``action``, the first that applies."""
        self._steady = self._waiting = False  # the plan may change: the next batch takes the full path
        train_loaders = self.env.train_loaders()
        padding_failed = False
        for policy in remedies(action, padding_possible=self.pad is None and train_loaders is not None):
            if policy == "raise":
                raise RecompileChurnError(action.message())
            if policy == "pad":
                if self._pad_for_the_rest_of_fit(train_loaders):
                    self._record(action, "padding turned on from the next epoch: edges " + str(self.padding.edges))  # type: ignore[union-attr]
                    return
                padding_failed = True
                continue
            if action.policy == "pad":
                why = not_padded(action, self.pad, padding_failed=padding_failed)
                self.notes.append(f"on_recompile='pad' fell back to 'dynamic' for {action.cause}: {why}")
            self._act_on_region(action, policy)
            return

    def _pad_for_the_rest_of_fit(self, train_loaders: Any) -> bool:
        """Turns ``pad="auto"`` on for this fit (the next fit starts from the user's value again) and pads
        the loaders; whether every training loader took the padding, with buckets."""
        self.pad = AUTO
        padded = self.pad_loaders(train_loaders, "train")
        val_loaders = self.env.val_loaders()
        if val_loaders is not None:
            self.pad_loaders(val_loaders, "val")
        return padded and self.padding is not None and self.padding.edges is not None

    def _act_on_region(self, action: ChurnAction, policy: str) -> None:
        assert self.planner is not None
        region = next((r for r in self.planner.regions if r.name == action.region and r.is_compiled), None)
        if policy in ("eager", "dynamic") and region is None:
            self.env.warn(action.message() + f" (on_recompile={policy!r} acts on regions this callback compiled; "
                          f"`{action.region}` was compiled elsewhere)")
            return
        if policy == "eager":
            self.planner.revert(region, f"reverted to eager by on_recompile='eager': {action.cause} ({action.why})")
            self._record(action, "reverted to eager: recompile churn")
            self.repricer.plan_changed()
        elif policy == "dynamic":
            options = region.compiled_with
            revert_region(region)
            self.planner.recompile(region, dataclasses.replace(options, dynamic=True))
            self._record(action, "recompiled once with dynamic=True against recompile churn")
            self.repricer.plan_changed()
        else:
            self.env.warn(action.message())
        self.notes.append(action.message())

    def _record(self, action: ChurnAction, what: str) -> None:
        self.churn_actions.append(
            {"region": action.region, "policy": action.policy, "action": what, "cause": action.cause,
             "why": action.why, "batch": self.batch_index}
        )
        self.env.warn(f"CompileCallback: `{action.region}` {what}: {action.cause} ({action.why}).")

    # -- metrics and report ------------------------------------------------------------------------
    def _speedup(self, eager_ms: float | None, compiled_ms: float | None) -> tuple[float | None, str]:
        """``compile/speedup`` and how it was priced: the latest re-pricing round where one ran, else
        :func:`timing.steady_speedup`."""
        assert self.timer is not None and self.planner is not None
        latest = self._repriced()
        if latest is not None:
            return latest.speedup, "re-measured"
        if compiled_ms is not None and self.watch is not None and not self.watch.totals()["graphs"]:
            return 1.0, "nothing compiled"  # dynamo made no graph (a named region never called): every step ran eager
        return steady_speedup(
            self.planner.priced_speedup(),
            kept=any(d.kept for d in self.planner.decisions),
            eager_by_shape=self._eager_by_shape() if self._steady_keys else None,
            latest=self.timer.samples_by_key(COMPILED, last=100) if self._steady_keys else None,
            eager_ms=eager_ms,
            compiled_ms=compiled_ms,
        )

    def _repriced(self) -> Round | None:
        """The latest re-pricing round, while the plan it priced still runs compiled (it prices the speedup)."""
        assert self.planner is not None
        return self.repricer.latest() if self._compiled_now() else None

    def _step_ms(self) -> tuple[float | None, float | None]:
        """The eager baseline's median step and the latest 100 compiled steps' median (ms). A plan applied
        from a checkpoint or the plan cache measured its eager baseline in the run that made it."""
        assert self.timer is not None and self.planner is not None
        return self.timer.median_ms(EAGER) or self.planner.eager_ms, self.timer.median_ms(COMPILED, last=100)

    def metrics(self) -> dict[str, float | None]:
        """The ``compile/*`` scalars now: speedup and step times (medians), and dynamo's accounting."""
        assert self.watch is not None and self.timer is not None and self.planner is not None
        totals = self.watch.totals()
        eager_ms, compiled_ms = self._step_ms()
        priced = self.planner.priced_speedup()
        first = self.planner.decisions[0] if self.planner.decisions else None
        if priced is not None and first is not None and first.baseline_ms:
            eager_ms = first.baseline_ms  # eager as timed beside the first trial, which prices the plan
        latest = self._repriced()
        if latest is not None:
            eager_ms = latest.eager_ms  # eager as timed in the latest round, which prices the plan now
        kept = sum(1 for d in self.planner.decisions if d.kept)
        values: dict[str, float | None] = {
            telemetry.STEP_TIME_MS: compiled_ms,
            telemetry.EAGER_STEP_TIME_MS: eager_ms,
            telemetry.SPEEDUP: self._speedup(eager_ms, compiled_ms)[0],
            # Two standard errors either side of a trial-priced speedup.
            telemetry.SPEEDUP_LOW: priced[0] * (1 - 2 * priced[1]) if priced else None,
            telemetry.SPEEDUP_HIGH: priced[0] * (1 + 2 * priced[1]) if priced else None,
            **(dict(zip((telemetry.SPEEDUP_LOW, telemetry.SPEEDUP_HIGH), latest.interval())) if latest else {}),
            telemetry.COMPILE_TIME_S: totals["compile_time_s"],
            telemetry.STALL_S: sum(self._stall_parts.values()),
            telemetry.GRAPHS: totals["graphs"],
            telemetry.GRAPH_BREAKS: totals["graph_breaks"],
            telemetry.RECOMPILES: totals["recompiles"],
            telemetry.EAGER_FALLBACKS: totals["eager_fallbacks"],
            telemetry.REGIONS_COMPILED: kept,
            telemetry.REGIONS_REVERTED: len(self.planner.decisions) - kept,
        }
        values.update(self.memory())
        errors = [d.max_rel_error for d in self.planner.decisions if d.kept and d.max_rel_error is not None]
        if errors:
            values[telemetry.MAX_REL_ERROR] = max(errors)
        if self.planner.coverage is not None:
            values[telemetry.COVERAGE] = self.planner.coverage
        if self._padding_seen.total_elements:
            values[telemetry.PADDING_WASTE] = float(self._padding_seen.waste)
        values.update(self._anatomy(eager_ms, compiled_ms))
        return values

    def memory(self) -> dict[str, float | None]:
        """``compile/memory/*`` in GB: the fit's peak (torch's peak counter, which the callback never
        resets: yours stays yours), and what the eager baseline's and the plan's steps held at their
        forward/backward boundary."""
        if not self._on_gpu:
            return {}
        eager = self._memory_high.get(EAGER)
        graphs = self.planner is not None and uses_cuda_graphs(self.planner.regions)
        plan = plan_peak_bytes(self._memory_high.get(COMPILED), cuda_graphs=graphs, graph_step_high=self._graph_step_high)
        return {
            telemetry.MEMORY_PEAK_GB: (peak_bytes(self._device) or 0) / GB,
            telemetry.MEMORY_EAGER_PEAK_GB: eager / GB if eager else None,
            telemetry.MEMORY_PLAN_PEAK_GB: plan / GB if plan else None,
        }

    def _anatomy(self, eager_ms: float | None, compiled_ms: float | None) -> dict[str, float | None]:
        """Where compile time went (dynamo's own split), cache hits, and when compiling pays back."""
        assert self.watch is not None and self.planner is not None
        stats = list(self.watch.stats.values())
        hits, misses = sum(s.cache_hits for s in stats), sum(s.cache_misses for s in stats)
        compile_s = sum(s.compile_seconds for s in stats)
        saved_ms = (eager_ms - compiled_ms) if eager_ms and compiled_ms else None
        verified = [d for d in self.planner.decisions if d.verified is not None]
        return {
            telemetry.ANATOMY_DYNAMO_S: sum(s.dynamo_seconds for s in stats),
            telemetry.ANATOMY_AOT_AUTOGRAD_S: sum(s.aot_autograd_seconds for s in stats),
            telemetry.ANATOMY_INDUCTOR_S: sum(s.inductor_seconds for s in stats),
            telemetry.ANATOMY_CACHE_HIT_RATE: hits / (hits + misses) if hits + misses else None,
            # Steps of the current plan needed to repay every second spent compiling.
            telemetry.ANATOMY_BREAK_EVEN_STEPS: compile_s * 1e3 / saved_ms if saved_ms and saved_ms > 0 else None,
            # Over the planned run (the loop's planned batches): every batch at today's speeds.
            telemetry.ANATOMY_PROJECTED_SAVING_S: (
                self._planned_batches * saved_ms / 1e3 - compile_s if saved_ms and self._planned_batches else None
            ),
            telemetry.ANATOMY_VERIFICATION_PASS_RATE: (
                sum(1 for d in verified if d.verified) / len(verified) if verified else None
            ),
            **self.anatomy_ops.metrics(self.planner.regions, self.planner.decisions, compiled_ms),
        }

    def _anatomy_details(self) -> dict[str, Any]:
        """What the scalars summarize: kernels by name, per-region coverage, torch's guard figure."""
        assert self.watch is not None and self.planner is not None
        details: dict[str, Any] = {
            "compile_split": "exclusive",  # each stage's own time (see watch.py)
            **self.anatomy_ops.details(self.planner.regions, self.planner.decisions),
        }
        verified = [d for d in self.planner.decisions if d.max_rel_error is not None]
        if verified:
            worst = max(verified, key=lambda d: d.max_rel_error)
            details["worst_rel_error"] = {"error": worst.max_rel_error, "region": worst.region, "mode": worst.mode,
                                          "kept": worst.kept, "error_in": worst.error_in}
        latencies = [us for stats in self.watch.stats.values() for us in stats.guard_latencies_us]
        if latencies:
            # torch's own figure: one guard evaluation timed right after each compile (cold caches).
            details["guard_latency_us_at_compile"] = sum(latencies) / len(latencies)
        return details

    def _summary(self, metrics: dict[str, float | None]) -> dict[str, Any]:
        assert self.watch is not None and self.timer is not None
        totals = self.watch.totals()
        eager = summarize(self.timer.samples_ms(EAGER, wait=True))
        compiled = summarize(self.timer.samples_ms(COMPILED, wait=True)[-100:])
        speedup = metrics[telemetry.SPEEDUP]
        latest = self._repriced()  # when a round prices the plan, its eager steps give eager's median and p90
        eager_p90 = latest.eager_p90_ms if latest is not None and latest.eager_p90_ms is not None else eager.get("p90_ms")
        return {
            "speedup": speedup,
            "speedup_priced": self._speedup(metrics[telemetry.EAGER_STEP_TIME_MS], metrics[telemetry.STEP_TIME_MS])[1]
            if speedup is not None else None,
            # The batch a re-measured price was taken at (the round's last): how stale it is on a drifting host.
            "speedup_priced_at_batch": latest.batch if latest is not None and speedup is not None else None,
            "speedup_priced_cycles": len(latest.cycles) if latest is not None and speedup is not None else None,
            "step_time_ms": metrics[telemetry.STEP_TIME_MS],
            "step_time_p90_ms": compiled.get("p90_ms"),
            "eager_step_time_ms": metrics[telemetry.EAGER_STEP_TIME_MS],
            "eager_step_time_p90_ms": eager_p90,
            "compile_time_s": metrics[telemetry.COMPILE_TIME_S],
            "stall_s": metrics[telemetry.STALL_S],
            "stall_parts_s": dict(self._stall_parts),
            "longest_stall": None if self._longest_stall is None else
            {"seconds": self._longest_stall[0], "batch": self._longest_stall[1]},
            "graphs": int(metrics[telemetry.GRAPHS] or 0),
            "graph_breaks": int(metrics[telemetry.GRAPH_BREAKS] or 0),
            # Of those, the ones dynamo's counters["graph_break"] counts (at a call); the rest (no
            # resume point, data-dependent branches) it counts elsewhere: graph_break_kinds per region.
            "graph_breaks_in_dynamo_counter": int(totals.get("graph_breaks_in_dynamo_counter", 0)),
            "recompiles": int(metrics[telemetry.RECOMPILES] or 0),
            "eager_fallbacks": int(metrics[telemetry.EAGER_FALLBACKS] or 0),
            "regions_compiled": int(metrics[telemetry.REGIONS_COMPILED] or 0),
            "regions_reverted": int(metrics[telemetry.REGIONS_REVERTED] or 0),
            "padding_waste": metrics.get(telemetry.PADDING_WASTE),
            "memory_peak_gb": metrics.get(telemetry.MEMORY_PEAK_GB),
            "memory_eager_peak_gb": metrics.get(telemetry.MEMORY_EAGER_PEAK_GB),
            "memory_plan_peak_gb": metrics.get(telemetry.MEMORY_PLAN_PEAK_GB),
            "batches": self.batch_index,
            "ddp_pieces": int(totals["ddp_pieces"]),
        }

    def build_report(self) -> dict[str, Any]:
        """The report as a JSON-ready dict: summary, decisions, per-region accounting, causes, suggestions."""
        assert self.watch is not None and self.timer is not None and self.planner is not None
        self.watch.collect()
        metrics = self.metrics()
        totals = self.watch.totals()
        regions = {name: stats.as_dict() for name, stats in self.watch.stats.items()}

        def causes(key: str) -> list[dict[str, Any]]:
            return [{"region": name, "reason": item["reason"], "count": item["count"]}
                    for name, stats in regions.items() for item in stats[key]]

        progress = self.planner.background_progress()
        notes = [note for note in (ddp_note(int(totals["graphs"]), int(totals["ddp_pieces"])), self._rank_note,
                                   self.repricer.skipped, child_progress_note(progress)) if note]
        return {
            "summary": self._summary(metrics),
            "ranks": self.ranks,
            "environment": {"torch": torch.__version__, "backend": backend_name(self.config.backend)},
            "plan": {
                "regions": self.config.given("regions"),
                "frozen": self.planner.frozen,
                "launch_bound": self.planner.launch_bound,
                "host_issue_ms": self.planner.issue_ms,
                "host_issue_samples_ms": list(self.planner.issue_samples_ms),
                "graph_trial_price": self.planner.graph_price.as_report() if self.planner.graph_price else None,
                "coverage": self.planner.coverage,
                "candidates": list(getattr(self.planner, "weighed", [])),
                "compiling_in_background": progress,
                "notes": list(self.planner.notes) + self.notes + notes,
            },
            "padding": dataclasses.asdict(self.padding) if self.padding is not None else None,
            "churn_actions": list(self.churn_actions),
            "anatomy": {
                **{tag.rsplit("/", 1)[-1]: value for tag, value in metrics.items() if "/anatomy/" in tag},
                **self._anatomy_details(),
            },
            "decisions": [d.as_dict() for d in self.planner.decisions],
            "regions": regions,
            "recompiles": [r.as_dict() for r in self.watch.recompiles],
            "recompile_causes": causes("recompile_reasons"),
            "graph_break_reasons": causes("graph_break_reasons"),
            "suggestions": build_suggestions(
                regions, self.planner.regions, self.planner.decisions,
                eager_gb=metrics.get(telemetry.MEMORY_EAGER_PEAK_GB), plan_gb=metrics.get(telemetry.MEMORY_PLAN_PEAK_GB),
                host_syncs=host_sync_advice(self.anatomy_ops.host_syncs, self.anatomy_ops.step_host_syncs or 0)
                if self._on_gpu else [],  # on a CPU the "device" is the host: reading a value there costs nothing
            ),
        }

    def finish(self, *, final: bool) -> dict[str, Any] | None:
        """The fit's report (None before ``begin``); ``final``: every rank is here (not after an exception),
        so a collective is safe and each rank's counts are gathered."""
        if self.watch is None or self.planner is None:
            return None
        if final and self.env.multi_process:
            self.ranks = self._gather_rank_counts()
        if self.config.cache_dir is not None:
            self._save_cached_plan()
        return self.build_report()

    def _gather_rank_counts(self) -> list[dict[str, Any]]:
        """Each rank's :data:`RANK_COUNTS` for this fit, in rank order: decisions are agreed, but what
        dynamo does on each rank is its own."""
        assert self.watch is not None
        self.watch.collect()
        totals = self.watch.totals()
        # This fit's own: a resumed run's loaded counts are rank 0's (every rank loads its checkpoint).
        mine: dict[str, Any] = {key: int(totals[key] - self._totals_at_start.get(key, 0)) for key in RANK_COUNTS}
        # Which rank compiled a background-prepared candidate from a child's cache ("warm") and which did not:
        # the decision is agreed, each rank's compile its own.
        mine["background_caches"] = {d.region: d.compile_cache for d in self.planner.decisions
                                     if (d.background or "").startswith("prepared in the background")}
        ranks = [{"rank": rank, **counts} for rank, counts in enumerate(self.env.from_every_rank(mine))]
        differ = [key for key in RANK_COUNTS if len({r[key] for r in ranks}) > 1]
        if differ:
            note = (
                "the ranks compiled differently (" + "; ".join(
                    f"{key}: " + ", ".join(f"rank {r['rank']} {r[key]}" for r in ranks) for key in differ
                ) + "). The plan is the same on every rank; a rank that recompiles more saw other shapes or "
                "values (e.g. its own shard's lengths): the report's recompile causes are rank 0's"
            )
            self._rank_note = note
            self.env.warn(f"CompileCallback: {note}.")
        return ranks

    def state_dict(self) -> dict[str, Any]:
        assert self.planner is not None and self.watch is not None
        self.watch.collect()
        return {
            "version": 1,
            "batch_index": self.batch_index,
            "planner": self.planner.state_dict(),
            "plan_options": self.config.plan_options(),
            "watch": self.watch.state_dict(),
            "anatomy_reference": self.anatomy_ops.eager.as_dict() if self.anatomy_ops.eager else None,
            # The eager median of each batch shape, so that a resumed run prices its steps shape by shape too.
            "eager_by_shape": self._eager_medians_by_shape(),
            # The re-pricing rounds: a resumed run is priced by them and schedules its next round after them.
            "repricer": self.repricer.state_dict(),
        }

    @property
    def begun(self) -> bool:
        return self.planner is not None

    def release(self) -> None:
        """Gives back what the fit took: the profiler of a sampled step that raised, torch's process-wide
        settings, dynamo's compile hooks, a trial cut short. Safe to call twice."""
        self.anatomy_ops.close()
        self._end_eager_validation()
        self._leave_reprice_stance()  # a fit that raised inside a round's eager batch
        if self.planner is not None:
            self.planner.close()
        self._close_launcher()
        if self._standby is not None:  # a fit that failed between its setup and its start
            self._standby.stop()
            self._standby = None
        if self._previous_backward_lowering is not None:
            torch_internals.compile_backward_with_forward(self._previous_backward_lowering)
            self._previous_backward_lowering = None
        if self.previous_recompile_limit is not None:
            torch_internals.set_recompile_limit(self.previous_recompile_limit)
            self.previous_recompile_limit = None
        if self.watch is not None:
            self.watch.stop()
        if self._previous_inductor_cache is not None:
            torch_internals.restore_inductor_cache_dir(self._previous_inductor_cache[0])
            self._previous_inductor_cache = None


__all__ = ["CompileRun", "FitEnv", "batch_shapes"]
