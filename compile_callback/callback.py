"""CompileCallback: the Lightning adapter over a :class:`~compile_callback.run.CompileRun` per fit.

The options are checked once into a frozen :class:`~compile_callback.config.CompileConfig`; each fit
gets a fresh ``CompileRun`` (planner, watch, timer, churn policy, padding, plan persistence: no
Lightning). This module keeps what only Lightning has: the hooks, the dataloader hooks wrapped for
padding at the source, the strategy's collectives, rank-zero output, loggers and the log directory.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden

from compile_callback import telemetry
from compile_callback.config import AUTO, CompileConfig
from compile_callback.regions import backend_name, resolve_backend, resolve_regions
from compile_callback.report import render_markdown, render_table, write_json
from compile_callback.run import CompileRun, FitEnv

OPTIONS = frozenset(field.name for field in dataclasses.fields(CompileConfig))


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
            ``"reduce-overhead"`` and ``"max-autotune"`` (or ``options={"triton.cudagraphs": True}``) run
            CUDA graphs on a GPU: each trial in them is timed against the plan right before it, not between
            its steps, and is not tried where the graphs' memory pool would not fit.
        fullgraph: passed to ``torch.compile``; a graph break then raises.
        dynamic: passed to ``torch.compile``. ``None``: dynamo decides after the first shape change,
            except that with ``pad`` applied from the first batch each bucket is compiled as a static
            graph of its own (``False``).
        options: inductor options passed to ``torch.compile`` (not together with a ``mode``); a backend of
            your own gets them as its ``options`` keyword, torch's ``eager``/``aot_eager``/``cudagraphs`` take none.
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
            5e-2 under bf16 autocast); only with ``verify=True``.
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
        pad_multiple: chosen edges (``"auto"``, ``"max"``) and sizes past the largest edge are multiples
            of this; edges you list are used as given.
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
            ``None`` (default): on CPU only. On CUDA, profiler sessions left the process's host work
            20-25% slower for the rest of its life (H200, torch 2.11), which biases the trials' eager
            timings and whatever runs after the fit; ``True`` samples anyway.
        background_compile: compile each candidate first in a child process, into the run's Inductor
            cache, while training goes on with the plan before it; the trial then compiles from that
            cache (seconds instead of tens of seconds of stopped training). ``None``: where it can pay
            (one process on a CUDA device, Inductor by name, its FX-graph cache on); ``True``: wherever
            one process runs (CPU too); ``False``: off. Only ``regions="auto"`` has trials to prepare.
            The child needs a copy of the step's memory on the device and some CPU; every failure falls
            back to compiling in-process, with the reason in the report.

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
        anatomy: bool | None = None,
        background_compile: bool | None = None,
    ) -> None:
        super().__init__()
        self.config = CompileConfig(
            regions=regions, backend=backend, mode=mode, fullgraph=fullgraph, dynamic=dynamic, options=options,
            eager_baseline_steps=eager_baseline_steps, warmup_steps=warmup_steps, trial_steps=trial_steps,
            min_speedup=min_speedup, max_trials=max_trials, verify=verify, verify_tolerance=verify_tolerance,
            on_recompile=on_recompile, max_recompiles_per_epoch=max_recompiles_per_epoch, pad=pad,
            pad_max_buckets=pad_max_buckets, pad_multiple=pad_multiple, pad_short_batch=pad_short_batch,
            cache_dir=cache_dir, log_every_n_steps=log_every_n_steps, report=report, anatomy=anatomy,
            background_compile=background_compile,
        )
        # Built once: Lightning reads it around every hook call (6 a batch); the options never change.
        self._state_key = self._generate_state_key(regions=str(self.regions), backend=backend_name(self.backend))
        self.run: CompileRun | None = None  # this fit's planner, watch, timer, metrics(); new for each fit
        self._wrapped_hooks: list[tuple[Any, str]] = []  # (datamodule or module, hook name) wrapped for padding
        self._loaded_state: dict[str, Any] | None = None
        self._last_logged_step: int | None = None
        self._last_report: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        """The options read back as given (``callback.mode``, ``callback.pad``): the config's, lists as lists."""
        config = self.__dict__.get("config")
        if config is None or name not in OPTIONS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return config.given(name)

    @property
    def last_report(self) -> dict[str, Any] | None:
        """The report built at the end of the last fit (also written as ``compile_report.json``)."""
        return self._last_report

    @property
    def state_key(self) -> str:
        return self._state_key

    # -- setup: checks before any training, a fresh run, padding at the source --------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not isinstance(pl_module, LightningModule):
            raise TypeError(f"CompileCallback needs a LightningModule; got {type(pl_module).__name__}.")
        if stage == "fit" and not any(p.requires_grad for p in pl_module.parameters()):
            raise ValueError(
                f"CompileCallback found no trainable parameters in {type(pl_module).__name__}: there is no "
                f"training step to speed up. Define the layers in __init__ (or configure_model), or remove the callback."
            )
        if self.config.regions != AUTO:
            resolve_regions(pl_module, self.config.region_names)  # a typo costs nothing yet
        # Here, not in __init__: a backend of the user's own is registered or importable by now.
        backend = resolve_backend(self.config.backend)
        self.config.check_inductor_options(backend)
        if stage != "fit":
            return
        self.run = CompileRun(self.config, backend, self._environment(trainer))
        self._loaded_state = None  # a resumed fit's comes after this, from load_state_dict
        self._last_logged_step = None
        if self.config.pad is not None:
            self._pad_at_the_source(trainer, pl_module)
        if self.config.cache_dir is not None:
            self.run.use_inductor_cache()
        # Also for a resumed fit (its checkpoint is read after setup): a plan it brings back frozen stops it at begin.
        home = type(pl_module).__module__  # what unpickling the payload imports (a script's __main__ it cannot)
        self.run.start_standby(trainer.strategy.root_device, () if home == "__main__" else (home,))

    def _environment(self, trainer: Trainer) -> FitEnv:
        """What the run needs of the Trainer, as plain values and callables."""
        strategy = trainer.strategy

        def planned_batches() -> int | None:
            planned = trainer.estimated_stepping_batches
            return int(planned) * max(1, trainer.accumulate_grad_batches) if math.isfinite(planned) else None

        return FitEnv(
            broadcast=lambda value, src: strategy.broadcast(value, src=src),
            agree_all=lambda value: strategy.reduce_boolean_decision(bool(value), all=True),
            world_size=trainer.world_size,
            multi_process=trainer.world_size > 1 and dist.is_available() and dist.is_initialized(),
            is_global_zero=trainer.is_global_zero,
            warn=rank_zero_warn,
            planned_batches=planned_batches,
            forward_context=lambda: trainer.precision_plugin.forward_context(),
            optimizers=lambda: trainer.optimizers,
            train_loaders=lambda: trainer.train_dataloader,
            val_loaders=lambda: trainer.val_dataloaders,
            sample_anatomy=trainer.is_global_zero and not isinstance(trainer.profiler, PyTorchProfiler),
            log_every=self.config.log_every_n_steps or trainer.log_every_n_steps or 50,
        )

    def _pad_at_the_source(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Wraps the ``*_dataloader`` hooks that will make the loaders, so batches are padded from the
        first (:meth:`CompileRun.loaders_made`); ``_release`` gives the hooks back."""
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        wrapped = [kind for kind in ("train", "val") if getattr(source, f"{kind}_dataloader", None) is not None
                   and is_overridden(f"{kind}_dataloader", source)]
        for kind in wrapped:
            name = f"{kind}_dataloader"
            original = getattr(source, name)

            def padded(original=original, kind=kind):  # noqa: ANN001 - binds loop variables
                loaders = original()
                if self.run is not None:
                    self.run.loaders_made(loaders, kind, training_loaders_follow="train" in wrapped)
                return loaders

            setattr(source, name, padded)
            self._wrapped_hooks.append((source, name))

    # -- the fit's hooks -----------------------------------------------------------------------------
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # On every rank, after the strategy has moved and wrapped the model.
        self.run.begin(pl_module, first_epoch=trainer.current_epoch, loaded_state=self._loaded_state)  # type: ignore[union-attr]
        telemetry.log_layout(trainer.loggers)

    # The training hooks run only inside fit, after setup made the run.
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.config.pad is not None:  # loaders given to trainer.fit(...) directly are only reachable now
            self.run.pad_late(trainer.train_dataloader, trainer.val_dataloaders)  # type: ignore[union-attr]

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.run.set_phase("train", trainer.current_epoch, trainer.global_step)  # type: ignore[union-attr]

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        run = self.run
        assert run is not None
        if not run.quiet_step():  # a steady step of the frozen plan reads nothing more (see CompileRun.quiet_step)
            run.before_batch(pl_module, epoch=trainer.current_epoch, step=trainer.global_step)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        self.run.before_backward()  # type: ignore[union-attr]

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.run.after_backward(last=pl_module.automatic_optimization)  # type: ignore[union-attr]

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.run is not None
        step, every = trainer.global_step, self.run.env.log_every
        self.run.after_batch(batch, step=step)
        # Every `every` optimizer steps, as Lightning's log_every_n_steps counts them (with gradient
        # accumulation several batches share a step: logged once).
        if step > 0 and step % every == 0 and step != self._last_logged_step:
            self._last_logged_step = step
            telemetry.log_scalars(trainer.loggers, self.run.metrics(), step=step)
        self.run.start_probe(allowed=lambda: self._nothing_but_a_batch_follows(trainer, batch_idx))

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

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.run is not None:  # this validation's batches, and training batches between validations
            batches = sum(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)
            every = trainer.val_check_batch if isinstance(trainer.val_check_batch, int) else None
            self.run.validation_start(
                epoch=trainer.current_epoch, step=trainer.global_step, sanity_check=trainer.sanity_checking,
                batches=int(batches) if math.isfinite(batches) else None,
                every=every * (trainer.check_val_every_n_epoch or 1) if every else None)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.run is not None:
            self.run.validation_end(epoch=trainer.current_epoch, step=trainer.global_step,
                                    sanity_check=trainer.sanity_checking)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.run is None or not self.run.begun:
            return
        metrics = self.run.epoch_end(epoch=trainer.current_epoch, step=trainer.global_step)
        telemetry.log_scalars(trainer.loggers, metrics, step=trainer.global_step)
        if self.config.report and telemetry.tensorboard_writers(trainer.loggers):
            telemetry.log_report_text(trainer.loggers, render_markdown(self.run.build_report()), step=trainer.global_step)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, final=True)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # An interrupted or failed run still leaves its report and metrics up to this point.
        try:
            if self.run is not None:
                self.run.anatomy_ops.close()
            self._finish(trainer, final=False)
        finally:
            self._release()  # Lightning calls no teardown hook after an exception

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._release()

    def _finish(self, trainer: Trainer, *, final: bool) -> None:
        report = self.run.finish(final=final) if self.run is not None else None
        if report is None:
            return
        self._last_report = report
        telemetry.log_scalars(trainer.loggers, self.run.metrics(), step=trainer.global_step)  # type: ignore[union-attr]
        if not self.config.report:
            return
        telemetry.log_report_text(trainer.loggers, render_markdown(report), step=trainer.global_step)
        if trainer.is_global_zero:
            log_dir = next((logger.log_dir for logger in trainer.loggers if logger.log_dir), None)
            path = write_json(report, log_dir or trainer.default_root_dir or os.getcwd())
            if final:
                rank_zero_info(render_table(report) + f"\n  written to {path}")

    def _release(self) -> None:
        """Gives back what fit took (the run's process-wide settings, the wrapped dataloader hooks). Safe to
        call twice."""
        if self.run is not None:
            self.run.release()
        while self._wrapped_hooks:  # the datamodule's or module's own dataloader hooks again
            source, name = self._wrapped_hooks.pop()
            vars(source).pop(name, None)

    # -- resumable state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.run is None or not self.run.begun:
            return dict(self._loaded_state or {})
        return self.run.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Applied in on_fit_start, once the model's regions exist; old checkpoints load with defaults.
        self._loaded_state = dict(state_dict)


__all__ = ["CompileCallback"]
