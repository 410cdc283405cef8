"""CompileCallback: the Lightning adapter.

It translates Lightning hooks into calls on plain objects that know nothing of Lightning: a planner
(policy: what to compile when, keep or revert), regions (mechanism: compile/revert in place), a step
timer, and a compile watch (dynamo's accounting per region). It owns no logic of its own beyond
wiring, validation and logging.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden

from compile_callback import telemetry
from compile_callback.anatomy import OpAnatomy, StepOps, host_sync_advice
from compile_callback.churn import ON_RECOMPILE_POLICIES, ChurnAction, ChurnPolicy, RecompileChurnError, remedies, same_cause
from compile_callback.collate import PaddingStats, padding_stats
from compile_callback import torch_internals
from compile_callback.plan_cache import PlanCacheError, load_plan, plan_key, plan_path, save_plan
from compile_callback.padding import (
    PAD_STRATEGIES,
    PaddingNotApplied,
    PaddingPlan,
    apply_to_loaders,
    census_from_dataset,
    first_loader,
)
from compile_callback.regions import revert_region
from compile_callback.memory import room_bytes
from compile_callback.watch import SHAPE
from compile_callback.verify import optimizer_state_tensors
from compile_callback.planner import COMPILED, EAGER, WARMUP, AutoPlanner, FixedPlanner, Planner
from compile_callback.regions import (
    BACKENDS_WITH_MODES,
    MODEL,
    MODES,
    CompileOptions,
    backend_name,
    resolve_backend,
    resolve_regions,
    uses_cuda_graphs,
)
from compile_callback.report import render_markdown, render_table, write_json
from compile_callback.timing import StepTimer, paired_speedup, summarize
from compile_callback.watch import CompileWatch

AUTO = "auto"
SHORT_BATCH_MODES = ("keep", "pad")
SAVED_EAGER = "eager (checkpoint)"  # timer label: eager medians by shape from a checkpoint or a cached plan
# compile/speedup is priced shape by shape when at least this share of the latest steps have a shape
# the eager baseline saw; else it compares medians.
STEADY_PRICED_SHARE = 0.5
# Per-rank counts (the watch's totals, this fit's) gathered at the end of a multi-process fit.
RANK_COUNTS = ("graphs", "recompiles", "graph_breaks", "eager_fallbacks", "ddp_pieces")
PROFILE_STEPS = 3  # eager batches with forward hooks on the candidates (not timed as baseline)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}; got {value!r}.")


def _check_float(name: str, value: Any, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"`{name}` must be a number >= {minimum}; got {value!r}.")


def batch_shapes(batch: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of a batch's tensors: the step timer's key, so trials compare steps of like shapes."""
    return tuple(tuple(leaf.shape) for leaf in torch_internals.tree_leaves(batch) if isinstance(leaf, torch.Tensor))


def _multi_process(trainer: Trainer) -> bool:
    """Whether the ranks are separate processes, which must meet in a collective to agree."""
    return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()


def _from_every_rank(trainer: Trainer, value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank: one ``strategy.broadcast`` from
    each rank, the collective the planner's agreements already use."""
    return [trainer.strategy.broadcast(value, src=rank) for rank in range(trainer.world_size)]


class CompileCallback(Callback):
    """Compiles the hot parts of a LightningModule in place, measures and watches them, and reports.

    Args:
        regions: ``"auto"`` (profile, then compile and keep what measures faster), ``"model"`` (the
            whole LightningModule's forward), or a list of submodule names / glob patterns with one
            ``*`` per name component (``["blocks.*", "head"]``; ``"self.model"`` for a submodule
            called ``model``, since ``"model"`` is the whole LightningModule).
        backend: ``torch.compile`` backend: a registered name (``"inductor"``, ``"aot_eager"``, ``"eager"``,
            or one of your own registered with ``torch._dynamo.register_backend``), a dotted import path
            to a backend function (``"my_package.compilers.my_backend"``, the form for YAML), or the
            callable itself. Checked in ``setup``; modes other than ``"default"`` need ``"inductor"``.
        mode: ``"auto"`` (chosen by measurement with ``regions="auto"``, else ``"default"``) or one of
            ``"default"``, ``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``.
        fullgraph: passed to ``torch.compile``; a graph break then raises.
        dynamic: passed to ``torch.compile``. ``None``: dynamo decides after the first shape change,
            except that with ``pad`` applied from the first batch each bucket is compiled as a static
            graph of its own (``False``).
        options: inductor options passed to ``torch.compile`` (not together with a ``mode``).
        eager_baseline_steps: eager batches timed before compiling, the baseline of
            ``compile/speedup``; 0 compiles before the first batch and reports no speedup.
        warmup_steps: batches not timed at the start and after each compile.
        trial_steps: timed batches of each side of a trial of ``regions="auto"`` (the candidate, and
            the plan before it, in alternating blocks).
        min_speedup: a trial is kept only if it is at least this much faster than the plan before it
            (and faster than twice the measured noise).
        max_trials: at most this many trials (each costs a compile).
        verify: compare each compiled region with eager on a held input (outputs and gradients)
            before trusting it; off, a region is still compiled outside the step so a failing
            compile reverts instead of crashing.
        verify_tolerance: max relative error allowed; ``None`` picks it by dtype (1e-3 for fp32,
            5e-2 under bf16 autocast).
        on_recompile: what to do about recompile churn (a recompile after the first epoch, more than
            ``max_recompiles_per_epoch`` in one epoch, or a region that hit dynamo's recompile limit):
            ``"warn"`` (once per cause, with the fix), ``"pad"`` (turn on padding for a churning
            dataloader dimension; otherwise ``"dynamic"``), ``"dynamic"`` (recompile the region once
            with ``dynamic=True``), ``"eager"`` (run the region eager from now on) or ``"raise"``.
        max_recompiles_per_epoch: more recompiles than this in one epoch is churn.
        pad: pad batches to fixed sizes so shapes stop changing: ``None`` (off), ``"auto"`` (at most
            ``pad_max_buckets`` sizes chosen from a census of the training set to minimize padding),
            ``"max"`` (one size: the largest) or a list of sizes (bucket edges). Sequences (dict
            samples with ``input_ids``; labels padded with -100, an ``attention_mask`` made or
            extended) and images (padded at the bottom/right) are padded.
        pad_max_buckets: the graph budget of ``pad="auto"``.
        pad_multiple: padded sizes are multiples of this.
        pad_short_batch: ``"keep"`` the short last batch or ``"pad"`` it with masked samples.
        cache_dir: warm restarts: the auto plan is saved here as JSON (keyed by the model's structure,
            torch version, device and these options) and Inductor's compile caches are kept here; a
            second identical run applies the plan without profiling or trials and hits the caches.
        log_every_n_steps: how often the ``compile/*`` scalars are logged; ``None`` follows the
            Trainer's ``log_every_n_steps``.
        report: print the report table at the end of fit and write ``compile_report.json``.
        anatomy: profile a few sampled steps (``torch.profiler``, CPU ops only) to measure graph
            coverage, the kernels compiled code hands to libraries or falls back on, and guard cost
            (``compile/anatomy/*``): one eager step before compiling, then one step each time the plan
            or its graphs changed, at most once an epoch; off, those figures are not reported.

    Raises:
        ValueError: an argument of the wrong type or out of range, with what is allowed.

    Example:
        >>> trainer = Trainer(callbacks=[CompileCallback(regions=["blocks.*", "lm_head"])])
    """

    def __init__(
        self,
        regions: str | list[str] = AUTO,
        *,
        backend: str | Callable[..., Any] = "inductor",
        mode: str = AUTO,
        fullgraph: bool = False,
        dynamic: bool | None = None,
        options: dict[str, Any] | None = None,
        eager_baseline_steps: int = 10,
        warmup_steps: int = 3,
        trial_steps: int = 20,
        min_speedup: float = 1.03,
        max_trials: int = 6,
        verify: bool = True,
        verify_tolerance: float | None = None,
        on_recompile: str = "warn",
        max_recompiles_per_epoch: int = 4,
        pad: str | list[int] | None = None,
        pad_max_buckets: int = 8,
        pad_multiple: int = 8,
        pad_short_batch: str = "keep",
        cache_dir: str | None = None,
        log_every_n_steps: int | None = None,
        report: bool = True,
        anatomy: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(regions, str):
            if regions not in (AUTO, MODEL):
                raise ValueError(
                    f"`regions` must be 'auto', 'model' or a list of submodule names or glob patterns; "
                    f"got {regions!r}. To compile one submodule, pass a list: regions=[{regions!r}]."
                )
        elif isinstance(regions, (list, tuple)) and regions and all(isinstance(r, str) and r for r in regions):
            if len(set(regions)) != len(regions):
                raise ValueError(f"`regions` names a region twice: {list(regions)!r}. Give each once.")
            if AUTO in regions:
                raise ValueError("`regions` can be 'auto' or a list of names, not a list containing 'auto'.")
        else:
            raise ValueError(
                f"`regions` must be 'auto', 'model' or a non-empty list of submodule names; got {regions!r}."
            )
        if not callable(backend) and (not isinstance(backend, str) or not backend):
            raise ValueError(f"`backend` must be a torch.compile backend name such as 'inductor', a dotted import "
                             f"path to a backend function, or a callable; got {backend!r}.")
        allowed_modes = (AUTO, *MODES)
        if mode not in allowed_modes:
            raise ValueError(f"`mode` must be one of {', '.join(repr(m) for m in allowed_modes)}; got {mode!r}.")
        if mode not in (AUTO, "default") and backend not in BACKENDS_WITH_MODES:
            raise ValueError(f"`mode={mode!r}` needs backend='inductor'; got backend={backend!r}.")
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"`options` must be a dict of inductor options or None; got {options!r}.")
        if options and mode not in (AUTO, "default"):
            raise ValueError(
                "`options` and `mode` cannot be given together (torch.compile refuses both); "
                "set mode='default' or put the mode's settings into `options`."
            )
        if not isinstance(fullgraph, bool):
            raise ValueError(f"`fullgraph` must be True or False; got {fullgraph!r}.")
        if dynamic is not None and not isinstance(dynamic, bool):
            raise ValueError(f"`dynamic` must be True, False or None; got {dynamic!r}.")
        _check_int("eager_baseline_steps", eager_baseline_steps, 0)
        _check_int("warmup_steps", warmup_steps, 0)
        _check_int("trial_steps", trial_steps, 1)
        _check_int("max_trials", max_trials, 0)
        _check_float("min_speedup", min_speedup, 1.0)
        for flag_name, flag in (("verify", verify), ("report", report), ("anatomy", anatomy)):
            if not isinstance(flag, bool):
                raise ValueError(f"`{flag_name}` must be True or False; got {flag!r}.")
        if verify_tolerance is not None:
            _check_float("verify_tolerance", verify_tolerance, 0.0)
        if on_recompile not in ON_RECOMPILE_POLICIES:
            raise ValueError(
                f"`on_recompile` must be one of {', '.join(repr(p) for p in ON_RECOMPILE_POLICIES)}; got {on_recompile!r}."
            )
        _check_int("max_recompiles_per_epoch", max_recompiles_per_epoch, 0)
        if pad is not None and not (
            pad in PAD_STRATEGIES
            or (isinstance(pad, (list, tuple)) and pad and all(isinstance(e, int) and not isinstance(e, bool) and e > 0 for e in pad))
        ):
            raise ValueError(
                f"`pad` must be None, 'auto', 'max' or a list of positive sizes (bucket edges); got {pad!r}."
            )
        _check_int("pad_max_buckets", pad_max_buckets, 1)
        _check_int("pad_multiple", pad_multiple, 1)
        if pad_short_batch not in SHORT_BATCH_MODES:
            raise ValueError(f"`pad_short_batch` must be 'keep' or 'pad'; got {pad_short_batch!r}.")
        if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir):
            raise ValueError(f"`cache_dir` must be a directory path or None; got {cache_dir!r}.")
        if regions == AUTO and eager_baseline_steps < 2:
            raise ValueError(
                f"`eager_baseline_steps` must be >= 2 with regions='auto' (trials are measured against "
                f"it); got {eager_baseline_steps}. Use explicit regions to compile without a baseline."
            )
        if log_every_n_steps is not None:
            _check_int("log_every_n_steps", log_every_n_steps, 1)
        self.regions = regions if isinstance(regions, str) else list(regions)
        self.backend = backend
        self._backend: str | Callable[..., Any] = backend  # resolved in setup (a dotted path, imported)
        self.mode = mode
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.options = dict(options) if options else None
        self.eager_baseline_steps = eager_baseline_steps
        self.warmup_steps = warmup_steps
        self.trial_steps = trial_steps
        self.min_speedup = float(min_speedup)
        self.max_trials = max_trials
        self.verify = verify
        self.verify_tolerance = verify_tolerance
        self.on_recompile = on_recompile
        self.max_recompiles_per_epoch = max_recompiles_per_epoch
        self.pad = list(pad) if isinstance(pad, (list, tuple)) else pad
        self._pad_asked = self.pad  # the churn policy may turn padding on for one fit (see _act)
        self.pad_max_buckets = pad_max_buckets
        self.pad_multiple = pad_multiple
        self.pad_short_batch = pad_short_batch
        self.cache_dir = cache_dir
        self.log_every_n_steps = log_every_n_steps
        self.report = report
        self.anatomy = anatomy
        self._anatomy_ops = OpAnatomy(backend)  # made again for each fit, in on_fit_start
        self._warned_host_syncs = False
        self._on_gpu = False
        self._memory_high: dict[str, int] = {}
        self._eager_activations: int | None = None  # bytes an eager step allocated beyond its start's
        self._memory_at_start = 0
        self._memory_device: torch.device | None = None
        self._last_logged_step: int | None = None
        self._planned_batches: int | None = None
        self._previous_backward_lowering: bool | None = None
        self._inductor_cache_set = False
        self._previous_inductor_cache: str | None = None
        self._plan_file: str | None = None
        self._plan_key: dict[str, Any] | None = None
        self.padding: PaddingPlan | None = None
        self.churn: ChurnPolicy | None = None
        self._churn_pending: list[ChurnAction] = []
        self._recompiles_seen = 0
        self._fallbacks_seen = 0
        self._padding_seen = PaddingStats()
        self._notes: list[str] = []
        self._churn_actions: list[dict[str, Any]] = []
        self._loaders_padded: set[str] = set()
        self._static_buckets = False
        self._val_loaders_waiting: list[Any] = []  # asked for before the training loaders' census
        self._wrapped_hooks: list[tuple[Any, str]] = []  # (datamodule or module, hook name) wrapped for padding
        self._bucket_graphs = 0  # static graphs an epoch's padded batches may need, per stage
        self._previous_recompile_limit: int | None = None

        self.planner: Planner | None = None
        self.watch: CompileWatch | None = None
        self.timer: StepTimer | None = None
        self._batch_index = 0
        self._label: str | None = None
        self._host_start = 0.0
        self._ranks: list[dict[str, int]] | None = None
        self._rank_note: str | None = None
        self._totals_at_start: dict[str, float] = {}
        self._loaded_state: dict[str, Any] | None = None
        self._last_report: dict[str, Any] | None = None

    # -- Lightning hooks ---------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        return self._generate_state_key(regions=str(self.regions), backend=backend_name(self.backend))

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not isinstance(pl_module, LightningModule):
            raise TypeError(f"CompileCallback needs a LightningModule; got {type(pl_module).__name__}.")
        if stage == "fit" and not any(p.requires_grad for p in pl_module.parameters()):
            raise ValueError(
                f"CompileCallback found no trainable parameters in {type(pl_module).__name__}: there is no "
                f"training step to speed up. Define the layers in __init__ (or configure_model), or remove the callback."
            )
        if self.regions != AUTO:
            # Names are checked here, before any training, so a typo costs nothing.
            resolve_regions(pl_module, [MODEL] if self.regions == MODEL else self.regions)
        # Here, not in __init__: a backend of the user's own is registered or importable by now.
        self._backend = resolve_backend(self.backend)
        if self.options and self._backend == "inductor":
            # torch.compile checks them only at the first compile, after training started.
            known = torch_internals.inductor_option_names()
            unknown = sorted(name for name in self.options if name not in known)
            if unknown:
                hints = {name: difflib.get_close_matches(name, sorted(known), n=3) for name in unknown}
                detail = "; ".join(f"{name!r} (close: {', '.join(close) or 'none'})" for name, close in hints.items())
                raise ValueError(f"`options` names Inductor options that do not exist: {detail}. Use names from "
                                 f"torch._inductor.list_options(), dotted for nested ones ('triton.cudagraphs').")
        if stage == "fit":
            self._begin_fit()
        if self.pad is not None and stage == "fit":
            self._static_buckets = False
            self._loaders_padded.clear()
            self._val_loaders_waiting.clear()
            self._pad_at_the_source(trainer, pl_module)
        if self.cache_dir is not None and stage == "fit":
            try:
                os.makedirs(os.path.join(self.cache_dir, "inductor"), exist_ok=True)
            except OSError as error:
                raise ValueError(f"`cache_dir` {self.cache_dir!r} cannot be created: {error}. Give a writable directory.") from error
            self._previous_inductor_cache = torch_internals.use_inductor_cache_dir(os.path.join(self.cache_dir, "inductor"))
            self._inductor_cache_set = True

    # -- padding -----------------------------------------------------------------------------------
    def _padding_plan(self) -> PaddingPlan:
        if self.padding is None:
            self.padding = PaddingPlan(
                self.pad if self.pad is not None else AUTO,
                max_buckets=self.pad_max_buckets,
                multiple=self.pad_multiple,
                short_batch=self.pad_short_batch,
            )
        return self.padding

    def _pad_loaders(self, loaders: Any, kind: str) -> bool:
        """Chooses the edges (from the first training loader's dataset) and puts the collate in;
        returns whether every loader took it."""
        plan = self._padding_plan()
        try:
            if plan.edges is None:
                loader = first_loader(loaders)
                if loader is None:
                    raise PaddingNotApplied(f"no torch DataLoader among the {kind} dataloaders")
                census, target = census_from_dataset(loader.dataset)
                plan.choose(census, target)
                self._notes.append(
                    f"padding: {plan.target} sizes from a census of {plan.census_size} samples -> edges {plan.edges}"
                )
            warnings, every = apply_to_loaders(loaders, plan)
            for warning in warnings:
                rank_zero_warn(warning)
            self._loaders_padded.add(kind)
            return every
        except PaddingNotApplied as error:
            rank_zero_warn(f"CompileCallback(pad={self.pad!r}) could not pad the {kind} dataloaders: {error}")
            self._notes.append(f"padding not applied to {kind}: {error}")
            self._loaders_padded.add(kind)  # said once; not retried every epoch
            return False

    def _pad_at_the_source(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Wraps the ``*_dataloader`` hooks that will make the loaders, so batches are padded from the
        first. The edges come from the training set's census: validation loaders asked for before the
        training ones (the sanity check comes first when ``estimated_stepping_batches`` has not made
        the training loaders yet, e.g. ``Trainer(max_steps=...)``) wait, unpadded, and are padded with
        them, from their next iterator on."""
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        wrapped = [kind for kind in ("train", "val") if getattr(source, f"{kind}_dataloader", None) is not None
                   and is_overridden(f"{kind}_dataloader", source)]
        for kind in wrapped:
            name = f"{kind}_dataloader"
            original = getattr(source, name)

            def padded(original=original, kind=kind):  # noqa: ANN001 - binds loop variables
                loaders = original()
                if kind == "train":
                    if self._pad_loaders(loaders, "train"):
                        self._compile_static_buckets()
                    if self._padding_plan().edges is not None:
                        while self._val_loaders_waiting:
                            self._pad_validation(self._val_loaders_waiting.pop(0))
                elif "train" in wrapped and self._padding_plan().edges is None:
                    self._val_loaders_waiting.append(loaders)
                else:
                    self._pad_validation(loaders)
                return loaders

            setattr(source, name, padded)
            self._wrapped_hooks.append((source, name))

    def _pad_validation(self, loaders: Any) -> None:
        """Pads the validation loaders; says what it costs when some cannot be and training is static."""
        if not self._pad_loaders(loaders, "val") and self._static_buckets:
            rank_zero_warn(
                "CompileCallback: some validation dataloaders cannot be padded while training compiles a static "
                "graph per bucket: each validation batch shape compiles a graph of its own, up to dynamo's "
                "recompile limit, and then runs eager. Let the validation DataLoader batch samples (no "
                "batch_sampler), or pass dynamic=True."
            )

    def _compile_static_buckets(self) -> None:
        """With batches padded from the first, every batch has one of a few fixed shapes: each is compiled
        as a static graph of its own (``dynamic=False``), unless the user chose ``dynamic``. Left alone,
        dynamo makes the padded size dynamic at the second bucket, and dynamic-shape kernels over padded
        batches lose to static ones (BENCHMARKS.md, variable-length GPT-2). Dynamo's recompile limit is
        raised, for this fit, to the graphs the buckets need, so none of them falls back to eager."""
        plan = self._padding_plan()
        if self._static_buckets or self.dynamic is not None or not plan.edges:
            return
        self._static_buckets = True
        # Per padded shape a full batch and a short last one, each in training and in validation (no_grad).
        self._bucket_graphs = plan.shapes() * (2 if plan.short_batch == "keep" else 1)
        needed = 2 * self._bucket_graphs
        limit = torch_internals.recompile_limit()
        note = "padding: regions compiled static (dynamic=False), one graph per bucket"
        if limit < needed:
            self._previous_recompile_limit = torch_internals.set_recompile_limit(needed)
            note += f"; dynamo's recompile limit raised from {limit} to {needed} for this fit"
        self._notes.append(note)
        self._apply_static_buckets()

    def _apply_static_buckets(self) -> None:
        """Makes the planner compile static graphs and the churn policy expect the buckets' recompiles.
        Neither may exist yet: Lightning may ask for the loaders before ``on_fit_start`` (for
        ``estimated_stepping_batches``), and ``on_fit_start`` calls this again."""
        if not self._static_buckets:
            return
        if self.churn is not None:
            self.churn.shape_budget = self._bucket_graphs
        if self.planner is None:
            return
        self.planner.compile_static(self._bucket_graphs)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.pad is None:
            return
        # Loaders given to trainer.fit(...) directly are only reachable now, after the first epoch's
        # iterator exists: they are padded from the next epoch on.
        if "train" not in self._loaders_padded and trainer.train_dataloader is not None:
            self._pad_loaders(trainer.train_dataloader, "train")
            rank_zero_warn(
                "CompileCallback(pad=...) pads dataloaders given to trainer.fit(...) from the second epoch on "
                "(Lightning creates the first epoch's iterator before any callback hook). To pad from the "
                "first batch, return the loaders from a LightningDataModule or the LightningModule's "
                "train_dataloader()/val_dataloader()."
            )
        if "val" not in self._loaders_padded and trainer.val_dataloaders is not None:
            self._pad_validation(trainer.val_dataloaders)

    def _begin_fit(self) -> None:
        """Forgets the previous fit: one callback through two ``trainer.fit`` calls (a notebook, a sweep)
        takes its eager baseline and decides in the second as in the first. A resumed fit's state comes
        after this, from ``load_state_dict``."""
        self.pad = self._pad_asked
        self._batch_index = 0
        self._label = None
        self._notes = []
        self._churn_actions = []
        self._churn_pending = []
        self._recompiles_seen = 0
        self._fallbacks_seen = 0
        self._padding_seen = PaddingStats()
        self._ranks = None
        self._rank_note = None
        self._loaded_state = None
        self._last_report = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Runs on every rank after the strategy has moved and wrapped the model: compiling in place
        # here is seen by DDP's wrapper and keeps state-dict keys unchanged.
        compile_options = CompileOptions(
            backend=self._backend,
            mode=None if self.mode == AUTO else self.mode,
            fullgraph=self.fullgraph,
            dynamic=self.dynamic,
            options=self.options,
        )
        names = {id(module): name for name, module in pl_module.named_modules()}
        self._anatomy_ops = OpAnatomy(self.backend)
        self._anatomy_ops.device_type = pl_module.device.type
        self._warned_host_syncs = False
        self._on_gpu = pl_module.device.type == "cuda"  # where a host sync costs time
        self._frozen_at_step: int | None = None  # global step at which the plan froze
        planned = trainer.estimated_stepping_batches
        self._planned_batches = int(planned) * max(1, trainer.accumulate_grad_batches) if math.isfinite(planned) else None
        self._previous_backward_lowering = torch_internals.compile_backward_with_forward(True)
        self._memory_high = {}  # label -> bytes allocated at the forward/backward boundary
        self._eager_activations = None
        self._memory_at_start = 0
        self._memory_device = pl_module.device
        self._last_logged_step = None
        self.timer = StepTimer(pl_module.device)
        self._steady_keys: bool | None = None  # whether steady steps keep their shapes (see _keys_wanted)
        if self.regions == AUTO:
            self.watch = CompileWatch({}, names)
            self.planner = AutoPlanner(
                pl_module,
                compile_options,
                timer=self.timer,
                watch=self.watch,
                device=pl_module.device,
                warmup_steps=self.warmup_steps,
                profile_steps=PROFILE_STEPS,
                baseline_steps=self.eager_baseline_steps,
                trial_steps=self.trial_steps,
                min_speedup=self.min_speedup,
                max_trials=self.max_trials,
                verify=self.verify,
                tolerance=self.verify_tolerance,
                agree=lambda value: trainer.strategy.broadcast(value, src=0),
                agree_all=lambda value: trainer.strategy.reduce_boolean_decision(bool(value), all=True),
                remaining_batches=lambda: self._remaining_batches(trainer),
                context=trainer.precision_plugin.forward_context,
                idle_state=lambda: optimizer_state_tensors(trainer.optimizers),
                activation_bytes=lambda: self._eager_activations,
                room_bytes=lambda: room_bytes(pl_module.device),
            )
        else:
            regions = resolve_regions(pl_module, [MODEL] if self.regions == MODEL else self.regions)
            self.watch = CompileWatch({id(m): r.name for r in regions for m in r.modules}, names)
            self.planner = FixedPlanner(
                regions, compile_options, baseline_steps=self.eager_baseline_steps, warmup_steps=self.warmup_steps
            )
        if self._loaded_state is not None:
            reference = self._loaded_state.get("anatomy_reference")
            if reference:  # resumed: the eager reference of graph coverage was sampled before the checkpoint
                self._anatomy_ops.eager = StepOps(**reference)
            self.watch.load_state_dict(self._loaded_state.get("watch", {}))
            self.planner.load_state_dict(self._loaded_state.get("planner", {}))
            self._batch_index = int(self._loaded_state.get("batch_index", 0))
            self._add_saved_eager(self._loaded_state.get("eager_by_shape", []))
        elif self.cache_dir is not None and self.regions == AUTO:
            self._load_cached_plan(trainer, pl_module)
        self._churn_pending = []  # found on this rank, not yet agreed by every rank
        self._totals_at_start = dict(self.watch.totals())  # after a resume: the checkpoint's (rank 0's)
        self._ranks = None  # every rank's counts, gathered at the end of a multi-process fit
        self._rank_note = None  # says how the ranks differed, when they did
        self.churn = ChurnPolicy(
            self.on_recompile,
            max_recompiles_per_epoch=self.max_recompiles_per_epoch,
            first_epoch=trainer.current_epoch,
        )
        self._apply_static_buckets()
        self.watch.start()
        telemetry.log_layout(trainer.loggers)
        self.planner.before_fit()

    def _cache_options(self) -> dict[str, Any]:
        return {
            "regions": self.regions, "backend": backend_name(self.backend), "mode": self.mode, "fullgraph": self.fullgraph,
            "dynamic": self.dynamic, "options": self.options, "min_speedup": self.min_speedup, "verify": self.verify,
            # Padding changes the shapes the plan was measured on (and makes regions static).
            "pad": self.pad, "pad_max_buckets": self.pad_max_buckets, "pad_multiple": self.pad_multiple,
        }

    def _load_cached_plan(self, trainer: Trainer, pl_module: LightningModule) -> None:
        assert self.planner is not None and self.cache_dir is not None
        self._plan_key = plan_key(pl_module, device=pl_module.device, options=self._cache_options())
        self._plan_file = plan_path(self.cache_dir, self._plan_key)
        try:
            state, problem = load_plan(self._plan_file, self._plan_key), None
        except PlanCacheError as error:
            state, problem = None, str(error)
        # Rank 0's file decides for all: a rank that planned alone would wait in the planner's collectives.
        state, problem = trainer.strategy.broadcast((state, problem), src=0)
        if problem is not None:
            rank_zero_warn(f"CompileCallback ignores its cached plan and plans again: {problem}.")
            self._notes.append(f"cached plan ignored: {problem}")
            return
        if state is not None:
            self.planner.load_state_dict(state["planner"])
            self._add_saved_eager(state["eager_by_shape"])
            self._notes.append(f"plan loaded from {self._plan_file}: no profiling, no trials")

    def _save_cached_plan(self, trainer: Trainer) -> None:
        if self.cache_dir is None or self._plan_file is None or self._plan_key is None or not trainer.is_global_zero:
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

    def _remaining_batches(self, trainer: Trainer) -> int:
        total = trainer.estimated_stepping_batches
        if not math.isfinite(total):
            return 10**9
        return int(total) * max(1, trainer.accumulate_grad_batches) - self._batch_index

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.watch is not None:
            self.watch.set_phase(stage="train", epoch=trainer.current_epoch, step=trainer.global_step)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        assert self.planner is not None and self.watch is not None and self.timer is not None
        self.watch.start()  # re-installs the hooks if someone called torch._dynamo.reset()
        self.watch.set_phase(stage="train", epoch=trainer.current_epoch, step=trainer.global_step)
        self._finish_sync_probe()  # first: the planner may compile and run code below
        self._label = self.planner.before_batch(self._batch_index)
        if self.anatomy and trainer.is_global_zero and not isinstance(trainer.profiler, PyTorchProfiler):
            watch = self.watch
            self._anatomy_ops.before_batch(
                pl_module,
                eager_step=self._is_eager_reference_step(),
                compiled_step=self._label == COMPILED,
                regions=self.planner.regions,
                epoch=trainer.current_epoch,
                graph_counts=lambda: tuple(watch.totals()[key] for key in ("graphs", "graph_breaks")),
                region_modules=self.planner.region_modules,
            )
        if self._on_gpu and self._label == EAGER:
            self._memory_at_start = torch.cuda.memory_allocated(pl_module.device)
        self._host_start = time.perf_counter()
        self.timer.start()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.planner is not None and self.watch is not None and self.timer is not None
        compiled_now = self.watch.compiled_since_collect
        sampled = self._anatomy_ops.end_batch(compiled=compiled_now)
        # A step that compiled is not a steady-state step: its time goes to compile time, not speed;
        # nor is a profiled one.
        key = batch_shapes(batch) if self._keys_wanted() else None
        self.timer.stop(None if compiled_now or sampled else self._label, key=key)
        host_ms = (time.perf_counter() - self._host_start) * 1e3
        self.watch.collect()
        self.planner.after_batch(self._batch_index, host_ms=host_ms)
        self._batch_index += 1
        if self.padding is not None and self.padding.edges is not None:
            self._count_padding(batch)
        every = self.log_every_n_steps or trainer.log_every_n_steps or 50
        # Every rank runs the same batches: a policy that acts is agreed on every `every` batches too,
        # not only at an epoch's end (one long epoch, or an iterable dataset with max_steps).
        self._check_churn(trainer, every_rank_here=self.on_recompile != "warn" and self._batch_index % every == 0)
        # Every `every` optimizer steps, as Lightning's log_every_n_steps counts them (with gradient
        # accumulation several batches share a step: logged once).
        step = trainer.global_step
        if step > 0 and step % every == 0 and step != self._last_logged_step:
            self._last_logged_step = step
            telemetry.log_scalars(trainer.loggers, self.metrics(), step=step)
        self._anatomy_ops.start_probe_if_due(allowed=self._nothing_but_a_batch_follows(trainer, batch_idx))

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

    def _steady_speedup(self, eager_ms: float | None, compiled_ms: float | None) -> tuple[float | None, str]:
        """``compile/speedup`` and how it was priced. The auto planner's frozen plan is priced by its
        trials (:meth:`AutoPlanner.priced_speedup`: each kept step measured beside the plan before it),
        not by the eager baseline, which runs while clocks, allocator and host still settle (on the H200
        it read 11-16% slow on third-party models). Otherwise eager median over compiled median; with
        variable shapes each of the latest 100 steps is priced by the eager median of its own shape
        (:func:`paired_speedup`), so a plan that changes nothing reads 1.0."""
        assert self.timer is not None
        priced = self.planner.priced_speedup() if self.planner is not None else None
        if priced is not None:
            kept = any(d.kept for d in self.planner.decisions)  # type: ignore[union-attr]
            return priced[0], "trials" if kept else "nothing compiled"
        if self._steady_keys:
            latest = self.timer.samples_by_key(COMPILED, last=100)
            # Only if most of the latest steps have a shape the baseline saw (raw lengths rarely recur).
            paired = paired_speedup(self._eager_by_shape(), latest, min_share=STEADY_PRICED_SHARE)
            if paired is not None:
                return paired[0], "shape by shape"
        return ((eager_ms / compiled_ms) if eager_ms and compiled_ms else None), "medians"

    @staticmethod
    def _nothing_but_a_batch_follows(trainer: Trainer, batch_idx: int) -> bool:
        """Whether the next hook is surely the next batch's start: not the epoch's last batch, not a
        validation point, not the last step. (Validation makes its DataLoader workers before any hook,
        and a fork would inherit a running host-sync probe.)"""
        if trainer.should_stop or trainer.check_val_every_n_epoch is None or trainer.val_check_batch is None:
            return False  # validation may come next, counted across epochs or by time: do not guess
        batches = trainer.num_training_batches
        if not (isinstance(batches, (int, float)) and math.isfinite(batches)) or batch_idx + 1 >= batches:
            return False  # the epoch's last batch, or one that may be (an iterable dataset)
        every = trainer.val_check_batch
        if isinstance(every, (int, float)) and math.isfinite(every) and every >= 1 and (batch_idx + 1) % int(every) == 0:
            return False
        return not (trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps)

    # -- anatomy sampling ----------------------------------------------------------------------------
    def _is_eager_reference_step(self) -> bool:
        """Whether this batch may be graph coverage's eager reference (the first such batch is): not the
        first batch (its one-time work, e.g. the first ``self.log``, adds ops), not a profiling batch
        (its hooks copy inputs), and not the only timed baseline batch."""
        return self._batch_index >= 1 and (
            self._label == WARMUP or (self._label == EAGER and self.eager_baseline_steps >= 2)
        )

    def _finish_sync_probe(self) -> None:
        """Ends the probe of the interval since the last sampled batch; on a GPU, says once what its
        host syncs cost and how to remove them (they also appear in the report's suggestions)."""
        syncs = self._anatomy_ops.finish_probe()
        if syncs is None or self._warned_host_syncs or not self._on_gpu:
            return
        advice = host_sync_advice(syncs, 0)
        if advice:
            self._warned_host_syncs = True
            rank_zero_warn(f"CompileCallback: {syncs.count} host sync(s) between training steps. " + " ".join(advice))

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self._anatomy_ops.backward_started()
        if self._on_gpu and self._label in (EAGER, COMPILED):
            # Every activation the backward needs is alive here: the step's memory high point, read from
            # the allocator's counters (host-side, no sync) for the eager baseline and the plan alike.
            allocated = torch.cuda.memory_allocated(pl_module.device)
            self._memory_high[self._label] = max(self._memory_high.get(self._label, 0), allocated)
            if self._label == EAGER:
                self._eager_activations = max(self._eager_activations or 0, allocated - self._memory_at_start)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._anatomy_ops.backward_ended(last=pl_module.automatic_optimization)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._anatomy_ops.abort_probe()
        if self.watch is not None:
            self.watch.collect()
            self.watch.set_phase(stage="validate", epoch=trainer.current_epoch, step=trainer.global_step)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.watch is not None:
            self.watch.collect()
            if not trainer.sanity_checking:
                self._check_churn(trainer, every_rank_here=True)
            self.watch.set_phase(stage="train", epoch=trainer.current_epoch, step=trainer.global_step)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._anatomy_ops.abort_probe()
        if self.watch is None:
            return
        self.watch.collect()
        self._check_churn(trainer, every_rank_here=True)
        metrics = self.metrics()
        metrics[telemetry.RECOMPILES_EPOCH] = float(self.watch.recompiles_in("train", trainer.current_epoch))
        for name, stats in self.watch.stats.items():
            # Per region, once an epoch: enough to see which region churns without flooding the tag list.
            tag = telemetry.region_tag(name)
            metrics[f"compile/region/{tag}/graphs"] = stats.graphs
            metrics[f"compile/region/{tag}/recompiles"] = stats.recompiles
            metrics[f"compile/region/{tag}/compile_time_s"] = stats.compile_seconds
        telemetry.log_scalars(trainer.loggers, metrics, step=trainer.global_step)
        if self.report and telemetry.tensorboard_writers(trainer.loggers):
            telemetry.log_report_text(trainer.loggers, render_markdown(self.build_report()), step=trainer.global_step)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, final=True)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # An interrupted or failed run still leaves its report and metrics up to this point.
        try:
            self._anatomy_ops.close()
            self._finish(trainer, final=False)
        finally:
            self._release()  # Lightning calls no teardown hook after an exception

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._release()

    def _release(self) -> None:
        """Gives back what fit took: the profiler of a sampled step that raised, torch's process-wide
        settings, dynamo's compile hooks, a trial cut short. Safe to call twice."""
        self._anatomy_ops.close()
        if self.planner is not None:
            self.planner.close()
        if self._previous_backward_lowering is not None:
            torch_internals.compile_backward_with_forward(self._previous_backward_lowering)
            self._previous_backward_lowering = None
        if self._previous_recompile_limit is not None:
            torch_internals.set_recompile_limit(self._previous_recompile_limit)
            self._previous_recompile_limit = None
        while self._wrapped_hooks:  # the datamodule's or module's own dataloader hooks again
            source, name = self._wrapped_hooks.pop()
            vars(source).pop(name, None)
        if self.watch is not None:
            self.watch.stop()
        if self._inductor_cache_set:
            torch_internals.restore_inductor_cache_dir(self._previous_inductor_cache)
            self._inductor_cache_set = False

    def state_dict(self) -> dict[str, Any]:
        if self.planner is None or self.watch is None:
            return dict(self._loaded_state or {})
        self.watch.collect()
        return {
            "version": 1,
            "batch_index": self._batch_index,
            "planner": self.planner.state_dict(),
            "watch": self.watch.state_dict(),
            "anatomy_reference": self._anatomy_ops.eager.as_dict() if self._anatomy_ops.eager else None,
            # The eager median of each batch shape, so that a resumed run prices its steps shape by shape too.
            "eager_by_shape": self._eager_medians_by_shape(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Applied in on_fit_start, once the model's regions exist; old checkpoints load with defaults.
        self._loaded_state = dict(state_dict)

    # -- churn ---------------------------------------------------------------------------------------
    def _count_padding(self, batch: Any) -> None:
        try:
            stats = padding_stats(batch)
        except (ValueError, TypeError):
            return  # a batch the padding does not describe (e.g. a tuple without roles): not counted
        self._padding_seen = self._padding_seen + stats  # real elements stay a device tensor: no host sync

    def _check_churn(self, trainer: Trainer, *, every_rank_here: bool = False) -> None:
        """Finds new churn and acts on it. With several processes each rank sees its own recompiles
        (its own shard's shapes), so actions wait for a point every rank reaches (``every_rank_here``:
        a training or validation epoch's end, or every ``log_every_n_steps`` batches for a policy that
        acts) and every rank then takes the same ones, in the same
        order: one rank raising or reverting a region alone would leave the others waiting in DDP's
        next all-reduce, or running another plan."""
        assert self.churn is not None
        self._churn_pending += self._new_churn(trainer)
        if _multi_process(trainer):
            if not every_rank_here:
                return
            actions = self._agree_on_churn(trainer, self._churn_pending)
        else:
            actions = self._churn_pending
        self._churn_pending = []
        for action in actions:
            self._act(trainer, action)

    def _new_churn(self, trainer: Trainer) -> list[ChurnAction]:
        assert self.watch is not None and self.churn is not None and self.planner is not None
        if self.planner.searches:
            # The planner's own trials recompile (a new mode is a new backend): the policy judges the
            # frozen plan's recompiles only, so it never acts in the middle of a trial.
            if not self.planner.frozen:
                return []
            if self._frozen_at_step is None:
                self._frozen_at_step = trainer.global_step
        fallbacks = [(name, s.fallback_reason or "") for name, s in self.watch.stats.items() if s.eager_fallback]
        if len(self.watch.recompiles) == self._recompiles_seen and len(fallbacks) == self._fallbacks_seen:
            return []
        self._recompiles_seen, self._fallbacks_seen = len(self.watch.recompiles), len(fallbacks)
        recompiles = self.watch.recompiles
        if self._frozen_at_step is not None:
            recompiles = [r for r in recompiles if r.step >= self._frozen_at_step]
        return self.churn.check(recompiles, fallbacks)

    def _agree_on_churn(self, trainer: Trainer, mine: list[ChurnAction]) -> list[ChurnAction]:
        """Every rank's new actions, the same list on every rank (rank order, one per cause)."""
        assert self.churn is not None
        gathered = _from_every_rank(trainer, mine)
        agreed: list[ChurnAction] = []
        for actions in gathered:
            for action in actions or []:
                if any(same_cause(action, other) for other in agreed):
                    continue
                self.churn.adopt(action)  # another rank's cause: not acted on again here
                agreed.append(action)
        return agreed

    def _our_region(self, name: str) -> Any:
        assert self.planner is not None
        return next((r for r in self.planner.regions if r.name == name and r.is_compiled), None)

    def _act(self, trainer: Trainer, action: ChurnAction) -> None:
        """Carries out :func:`churn.remedies` for ``action``, the first that applies."""
        assert self.planner is not None
        if action.kind != SHAPE:
            not_padded = "not a dataloader size"
        elif self.pad is not None:
            not_padded = f"the loaders are padded already (pad={self.pad!r})"
        else:
            not_padded = "no training dataloader"
        for policy in remedies(action, padding_possible=self.pad is None and trainer.train_dataloader is not None):
            if policy == "raise":
                raise RecompileChurnError(action.message())
            if policy == "pad":
                if self._pad_for_the_rest_of_fit(trainer):
                    self._record(action, "padding turned on from the next epoch: edges " + str(self.padding.edges))  # type: ignore[union-attr]
                    return
                not_padded = "the training dataloaders could not take the padding collate"
                continue
            if action.policy == "pad":
                self._notes.append(f"on_recompile='pad' fell back to 'dynamic' for {action.cause}: {not_padded}")
            self._act_on_region(action, policy)
            return

    def _pad_for_the_rest_of_fit(self, trainer: Trainer) -> bool:
        """Turns ``pad="auto"`` on for this fit (``_begin_fit`` gives the user's value back) and pads the
        loaders; whether every training loader took the padding, with buckets."""
        self.pad = AUTO
        padded = self._pad_loaders(trainer.train_dataloader, "train")
        if trainer.val_dataloaders is not None:
            self._pad_loaders(trainer.val_dataloaders, "val")
        return padded and self.padding is not None and self.padding.edges is not None

    def _act_on_region(self, action: ChurnAction, policy: str) -> None:
        assert self.planner is not None
        region = self._our_region(action.region)
        if policy in ("eager", "dynamic") and region is None:
            rank_zero_warn(action.message() + f" (on_recompile={policy!r} acts on regions this callback compiled; "
                           f"`{action.region}` was compiled elsewhere)")
            return
        if policy == "eager":
            self.planner.revert(region, f"reverted to eager by on_recompile='eager': {action.cause} ({action.why})")
            self._record(action, "reverted to eager: recompile churn")
        elif policy == "dynamic":
            options = region.compiled_with
            revert_region(region)
            self.planner.recompile(region, dataclasses.replace(options, dynamic=True))
            self._record(action, "recompiled once with dynamic=True against recompile churn")
        else:
            rank_zero_warn(action.message())
        self._notes.append(action.message())

    def _record(self, action: ChurnAction, what: str) -> None:
        self._churn_actions.append(
            {"region": action.region, "policy": action.policy, "action": what, "cause": action.cause,
             "why": action.why, "batch": self._batch_index}
        )
        rank_zero_warn(f"CompileCallback: `{action.region}` {what}: {action.cause} ({action.why}).")

    # -- metrics and report ------------------------------------------------------------------------
    def metrics(self) -> dict[str, float | None]:
        """The ``compile/*`` scalars now: speedup and step times (medians), and dynamo's accounting."""
        assert self.watch is not None and self.timer is not None and self.planner is not None
        totals = self.watch.totals()
        # A plan applied from a checkpoint or the plan cache measured its eager baseline in the run that made it.
        eager_ms = self.timer.median_ms(EAGER) or self.planner.eager_ms
        compiled_ms = self.timer.median_ms(COMPILED, last=100)
        priced = self.planner.priced_speedup()
        first = self.planner.decisions[0] if self.planner.decisions else None
        if priced is not None and first is not None and first.baseline_ms:
            eager_ms = first.baseline_ms  # eager as timed beside the first trial, which prices the plan
        kept = sum(1 for d in self.planner.decisions if d.kept)
        values: dict[str, float | None] = {
            telemetry.STEP_TIME_MS: compiled_ms,
            telemetry.EAGER_STEP_TIME_MS: eager_ms,
            telemetry.SPEEDUP: self._steady_speedup(eager_ms, compiled_ms)[0],
            # Two standard errors either side of a trial-priced speedup.
            telemetry.SPEEDUP_LOW: priced[0] * (1 - 2 * priced[1]) if priced else None,
            telemetry.SPEEDUP_HIGH: priced[0] * (1 + 2 * priced[1]) if priced else None,
            telemetry.COMPILE_TIME_S: totals["compile_time_s"],
            telemetry.GRAPHS: totals["graphs"],
            telemetry.GRAPH_BREAKS: totals["graph_breaks"],
            telemetry.RECOMPILES: totals["recompiles"],
            telemetry.EAGER_FALLBACKS: totals["eager_fallbacks"],
            telemetry.REGIONS_COMPILED: kept,
            telemetry.REGIONS_REVERTED: len(self.planner.decisions) - kept,
        }
        values.update(self._memory())
        errors = [d.max_rel_error for d in self.planner.decisions if d.kept and d.max_rel_error is not None]
        if errors:
            values[telemetry.MAX_REL_ERROR] = max(errors)
        coverage = self.planner.coverage
        if coverage is not None:
            values[telemetry.COVERAGE] = coverage
        if self._padding_seen.total_elements:
            values[telemetry.PADDING_WASTE] = float(self._padding_seen.waste)
        values.update(self._anatomy(eager_ms, compiled_ms))
        return values

    def _memory(self) -> dict[str, float | None]:
        """``compile/memory/*`` in GB: the fit's peak (torch's peak counter, which the callback never
        resets: yours stays yours), and what the eager baseline's and the plan's steps held at their
        forward/backward boundary."""
        if not self._on_gpu:
            return {}
        gb = 2.0**30
        eager, plan = self._memory_high.get(EAGER), self._memory_high.get(COMPILED)
        if self.planner is not None and uses_cuda_graphs(self.planner.regions):
            # A replayed CUDA graph allocates nothing: its activations live in the graph's pool, which the
            # allocator's counters do not show (HF GPT-2 read 2.6 GB where the same plan peaks at 8.2 GB).
            plan = None
        return {
            telemetry.MEMORY_PEAK_GB: torch.cuda.max_memory_allocated(self._memory_device) / gb,
            telemetry.MEMORY_EAGER_PEAK_GB: eager / gb if eager else None,
            telemetry.MEMORY_PLAN_PEAK_GB: plan / gb if plan else None,
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
            # Over the planned run (trainer.estimated_stepping_batches): every batch at today's speeds.
            telemetry.ANATOMY_PROJECTED_SAVING_S: (
                self._planned_batches * saved_ms / 1e3 - compile_s if saved_ms and self._planned_batches else None
            ),
            telemetry.ANATOMY_VERIFICATION_PASS_RATE: (
                sum(1 for d in verified if d.verified) / len(verified) if verified else None
            ),
            **self._anatomy_ops.metrics(self.planner.regions, self.planner.decisions, compiled_ms),
        }

    def _anatomy_details(self) -> dict[str, Any]:
        """What the scalars summarize: kernels by name, per-region coverage, torch's guard figure."""
        assert self.watch is not None and self.planner is not None
        details: dict[str, Any] = {
            "compile_split": "exclusive",  # each stage's own time (see watch.py)
            **self._anatomy_ops.details(self.planner.regions, self.planner.decisions),
        }
        verified = [d for d in self.planner.decisions if d.max_rel_error is not None]
        if verified:
            worst = max(verified, key=lambda d: d.max_rel_error)
            details["worst_rel_error"] = {"error": worst.max_rel_error, "region": worst.region, "mode": worst.mode,
                                          "kept": worst.kept}
        latencies = [us for stats in self.watch.stats.values() for us in stats.guard_latencies_us]
        if latencies:
            # torch's own figure: one guard evaluation timed right after each compile (cold caches).
            details["guard_latency_us_at_compile"] = sum(latencies) / len(latencies)
        return details

    def build_report(self) -> dict[str, Any]:
        """The report as a JSON-ready dict: summary, decisions, per-region accounting, causes, suggestions."""
        assert self.watch is not None and self.timer is not None and self.planner is not None
        self.watch.collect()
        metrics = self.metrics()
        priced = self._steady_speedup(metrics[telemetry.EAGER_STEP_TIME_MS], metrics[telemetry.STEP_TIME_MS])[1]
        totals = self.watch.totals()
        eager = summarize(self.timer.samples_ms(EAGER, wait=True))
        compiled = summarize(self.timer.samples_ms(COMPILED, wait=True)[-100:])
        regions = {name: stats.as_dict() for name, stats in self.watch.stats.items()}
        recompile_causes = [
            {"region": name, "reason": item["reason"], "count": item["count"]}
            for name, stats in regions.items()
            for item in stats["recompile_reasons"]
        ]
        graph_break_reasons = [
            {"region": name, "reason": item["reason"], "count": item["count"]}
            for name, stats in regions.items()
            for item in stats["graph_break_reasons"]
        ]
        return {
            "summary": {
                "speedup": metrics[telemetry.SPEEDUP],
                "speedup_priced": priced if metrics[telemetry.SPEEDUP] is not None else None,
                "step_time_ms": metrics[telemetry.STEP_TIME_MS],
                "step_time_p90_ms": compiled.get("p90_ms"),
                "eager_step_time_ms": metrics[telemetry.EAGER_STEP_TIME_MS],
                "eager_step_time_p90_ms": eager.get("p90_ms"),
                "compile_time_s": metrics[telemetry.COMPILE_TIME_S],
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
                "batches": self._batch_index,
                "ddp_pieces": int(totals["ddp_pieces"]),
            },
            "ranks": self._ranks,
            "environment": {"torch": torch.__version__, "backend": backend_name(self.backend)},
            "plan": {
                "regions": self.regions,
                "frozen": self.planner.frozen,
                "launch_bound": self.planner.launch_bound,
                "coverage": self.planner.coverage,
                "notes": list(self.planner.notes) + self._notes + [
                    note for note in (
                        self._ddp_note(int(totals["graphs"]), int(totals["ddp_pieces"])),
                        self._rank_note,
                    ) if note
                ],
            },
            "padding": dataclasses.asdict(self.padding) if self.padding is not None else None,
            "churn_actions": list(self._churn_actions),
            "anatomy": {
                **{tag.rsplit("/", 1)[-1]: value for tag, value in metrics.items() if "/anatomy/" in tag},
                **self._anatomy_details(),
            },
            "decisions": [d.as_dict() for d in self.planner.decisions],
            "regions": regions,
            "recompiles": [r.as_dict() for r in self.watch.recompiles],
            "recompile_causes": recompile_causes,
            "graph_break_reasons": graph_break_reasons,
            "suggestions": self._suggestions(regions),
        }

    def _suggestions(self, regions: dict[str, Any]) -> list[str]:
        suggestions = []
        assert self.planner is not None
        if self._on_gpu:  # on a CPU the "device" is the host: reading a value there costs nothing extra
            suggestions += host_sync_advice(self._anatomy_ops.host_syncs, self._anatomy_ops.step_host_syncs or 0)
        memory = self._memory()
        eager_gb, plan_gb = memory.get(telemetry.MEMORY_EAGER_PEAK_GB), memory.get(telemetry.MEMORY_PLAN_PEAK_GB)
        if eager_gb and plan_gb and plan_gb < 0.8 * eager_gb and any(d.kept for d in self.planner.decisions):
            suggestions.append(f"The compiled step holds {plan_gb:.1f} GB against {eager_gb:.1f} GB eager (at the "
                               f"forward/backward boundary): a larger batch may fit.")
        for region in self.planner.regions:
            if region.is_compiled and not regions.get(region.name, {}).get("graphs"):
                suggestions.append(
                    f"`{region.name}` is compiled but dynamo made no graph for it, so it runs eager "
                    f"(torch {torch.__version__} may skip torch.nn's own modules compiled on their own); "
                    f"compile the module that contains it instead."
                )
        for name, stats in regions.items():
            if stats["eager_fallback"]:
                suggestions.append(
                    f"`{name}` runs eager: {stats['fallback_reason']}. Pad the changing dimension to a few "
                    f"fixed sizes, mark it dynamic (dynamic=True), or stop the Python value from changing."
                )
            if stats["graph_breaks"]:
                suggestions.append(
                    f"`{name}` has {stats['graph_breaks']} graph break(s); each splits the compiled code. "
                    f"Move the cause out of the region or rewrite it in tensor ops (see Graph breaks)."
                )
        return suggestions

    def _finish(self, trainer: Trainer, *, final: bool) -> None:
        if self.watch is None or self.planner is None:
            return
        if final and _multi_process(trainer):  # every rank is here (not after an exception): a collective is safe
            self._ranks = self._gather_rank_counts(trainer)
        self._save_cached_plan(trainer)
        report = self.build_report()
        self._last_report = report
        telemetry.log_scalars(trainer.loggers, self.metrics(), step=trainer.global_step)
        if not self.report:
            return
        telemetry.log_report_text(trainer.loggers, render_markdown(report), step=trainer.global_step)
        if trainer.is_global_zero:
            directory = self._report_dir(trainer)
            path = write_json(report, directory)
            if final:
                rank_zero_info(render_table(report) + f"\n  written to {path}")

    def _gather_rank_counts(self, trainer: Trainer) -> list[dict[str, int]]:
        """Each rank's :data:`RANK_COUNTS` for this fit, in rank order (:func:`_from_every_rank`): decisions
        are agreed, but what dynamo does on each rank is its own."""
        assert self.watch is not None
        self.watch.collect()
        totals = self.watch.totals()
        # This fit's own: a resumed run's loaded counts are rank 0's (every rank loads its checkpoint).
        mine = {key: int(totals[key] - self._totals_at_start.get(key, 0)) for key in RANK_COUNTS}
        ranks = [{"rank": rank, **counts} for rank, counts in enumerate(_from_every_rank(trainer, mine))]
        differ = [key for key in RANK_COUNTS if len({r[key] for r in ranks}) > 1]
        if differ:
            note = (
                "the ranks compiled differently (" + "; ".join(
                    f"{key}: " + ", ".join(f"rank {r['rank']} {r[key]}" for r in ranks) for key in differ
                ) + "). The plan is the same on every rank; a rank that recompiles more saw other shapes or "
                "values (e.g. its own shard's lengths): the report's recompile causes are rank 0's"
            )
            self._rank_note = note
            rank_zero_warn(f"CompileCallback: {note}.")
        return ranks

    @staticmethod
    def _ddp_note(graphs: int, pieces: int) -> str | None:
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

    @staticmethod
    def _report_dir(trainer: Trainer) -> str:
        for logger in trainer.loggers:
            if logger.log_dir:
                return logger.log_dir
        return trainer.default_root_dir or os.getcwd()

    @property
    def last_report(self) -> dict[str, Any] | None:
        """The report built at the end of the last fit (also written as ``compile_report.json``)."""
        return self._last_report


__all__ = ["CompileCallback"]
