"""The variants a workload is run as, and how each one prepares the model before training.

Every variant but the ``bare_*`` ones trains through the same Lightning loop, so the ratios between
them are the compile strategy's alone; ``bare_eager`` (a plain PyTorch loop) shows Lightning's own
cost, and ``bare_whole`` / ``bare_whole_ro`` (the same loop, the model compiled) the ceiling a compiled
step can reach without Lightning's loop around it (issue 23: the callback within 2% of it).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from torch import nn

from compile_callback import CompileCallback
from compile_callback import run as run_module


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of training a workload.

    Attributes:
        name: the key used on the command line and in the results.
        description: one line for the report.
        lightning: trained by the Lightning Trainer (else by a plain PyTorch loop).
        compile: ``"whole"`` (``model.compile()`` on the LightningModule), ``"per_block"`` (``.compile()``
            on each repeated block) or None.
        mode: ``torch.compile`` mode for ``compile`` (None: default).
        options: Inductor options for ``compile`` (``torch.compile(options=...)``; not with ``mode``).
        pad_to_max: batches padded to the model's context length (one shape, one graph).
        callback: keyword arguments of ``CompileCallback`` (None: no callback).
        progress_bar_loss: the module logs its training loss with ``prog_bar=True``, which makes Lightning
            read it on the host after every batch (a host sync per step); for modules with the recipes'
            ``train_loss_in_progress_bar`` switch (the GPT workloads; the convnet workloads' module has none).
        optimizer_mode: the plain loop's optimizer step compiled too (``torch.compile(optimizer.step)``,
            on the ``foreach`` twin of a fused optimizer: ``runner.foreach_twin``), ``"default"`` or a
            ``torch.compile`` mode; None: eager.
        next_standby: an experiment: the callback readies a next child's interpreter at every hand-over, as it
            did before session 39 (``background.bytecode_unwritten`` read as true while the variant runs).
        pause_child_ab: an experiment: the callback's background child stopped and continued in blocks of steps
            (:class:`benchmarks.measure.ChildPauseAB`), what it costs the steps beside it measured inside the fit.
    """

    name: str
    description: str
    lightning: bool = True
    compile: str | None = None
    mode: str | None = None
    options: dict[str, Any] | None = None
    pad_to_max: bool = False
    callback: dict[str, Any] | None = None
    progress_bar_loss: bool = False
    optimizer_mode: str | None = None
    next_standby: bool = False
    pause_child_ab: bool = False


VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("bare_eager", "plain PyTorch loop, eager (no Lightning)", lightning=False),
        Variant("bare_whole", "plain PyTorch loop, model.compile() of the whole module (the ceiling)", lightning=False,
                compile="whole"),
        Variant(
            "bare_whole_ro", "plain PyTorch loop, whole model, mode='reduce-overhead' (the ceiling with CUDA graphs)",
            lightning=False, compile="whole", mode="reduce-overhead",
        ),
        # Past the ceiling (issue 23): a host-bound step's optimizer step compiled as well, its Python and
        # launches into Inductor's code (default) or into a CUDA graph (reduce-overhead). Session 29's first
        # run of these compiled nothing of the step: dynamo skips a fused optimizer's kernel.
        Variant(
            "bare_whole_ro_opt", "plain PyTorch loop, whole model with CUDA graphs, optimizer step compiled",
            lightning=False, compile="whole", mode="reduce-overhead", optimizer_mode="default",
        ),
        Variant(
            "bare_whole_ro_opt_ro", "plain PyTorch loop, whole model and optimizer step with CUDA graphs",
            lightning=False, compile="whole", mode="reduce-overhead", optimizer_mode="reduce-overhead",
        ),
        Variant("eager", "Lightning, eager"),
        Variant("whole", "Lightning, model.compile() of the whole LightningModule", compile="whole"),
        Variant(
            "whole_ro", "Lightning, whole model, mode='reduce-overhead' (CUDA graphs)", compile="whole",
            mode="reduce-overhead",
        ),
        # The same plan compiled as the callback's verification compiled a region that draws random numbers
        # (dropout) until session 11: with Inductor's fallback_random, whose graph the training steps then
        # ran. On the H200 it put BERT's step 2.2 GB above whole_ro's (16.29 against 14.05 GB): why the
        # callback now verifies such a region on a twin (compile_callback.verify.verify_module).
        Variant(
            "whole_ro_fr", "Lightning, whole model, CUDA graphs, Inductor's fallback_random=True", compile="whole",
            options={"triton.cudagraphs": True, "fallback_random": True},
        ),
        # Inductor options beyond torch.compile's defaults (issue 23, "past the ceiling"), on whole_ro's plan:
        # which of them moves a step on the H200, and what each adds to the compile.
        Variant(
            "whole_ro_cdt", "Lightning, whole model, CUDA graphs, Inductor's coordinate_descent_tuning=True",
            compile="whole", options={"triton.cudagraphs": True, "coordinate_descent_tuning": True},
        ),
        Variant(
            "whole_ro_aggr", "Lightning, whole model, CUDA graphs, Inductor's aggressive_fusion=True", compile="whole",
            options={"triton.cudagraphs": True, "aggressive_fusion": True},
        ),
        Variant(
            "whole_ro_combo", "Lightning, whole model, CUDA graphs, Inductor's combo_kernels=True", compile="whole",
            options={"triton.cudagraphs": True, "combo_kernels": True},
        ),
        Variant(
            "whole_padmax", "Lightning, whole model, batches padded to the context length", compile="whole",
            pad_to_max=True,
        ),
        Variant("per_block", "Lightning, .compile() of each repeated block", compile="per_block"),
        Variant("callback", "Lightning, CompileCallback() defaults", callback={}),
        # The background compile wherever one process runs, whatever its pricing says (issue 22's first 1000 steps).
        Variant("callback_bg", "Lightning, CompileCallback(background_compile=True)", callback={"background_compile": True}),
        # Issue 22's first 1000 steps: the callback as it was before session 39, a second interpreter readied
        # (importing beside the first child's, beside training) at every hand-over, used or not.
        Variant("callback_next_standby", "Lightning, CompileCallback() defaults, a next child's interpreter readied "
                "at every hand-over (before session 39)", callback={}, next_standby=True),
        # Issue 22's first 1000 steps: what the child (its imports, then its compile) costs the training steps
        # beside it, stopped and continued in blocks inside each fit (an experiment: its own figures answer nothing).
        Variant("callback_pause_ab", "Lightning, CompileCallback() defaults, its background child stopped and "
                "continued in turn (ABBA blocks of steps)", callback={}, pause_child_ab=True),
        # What the anatomy's sampling costs: the same run without it.
        Variant("callback_no_anatomy", "Lightning, CompileCallback(anatomy=False)", callback={"anatomy": False}),
        # The same three with the training loss in the progress bar: a host sync after every batch.
        Variant("eager_pbar", "Lightning, eager, loss logged with prog_bar=True", progress_bar_loss=True),
        Variant(
            "whole_pbar", "Lightning, whole model, loss logged with prog_bar=True", compile="whole",
            progress_bar_loss=True,
        ),
        Variant(
            "callback_pbar", "Lightning, CompileCallback() defaults, loss logged with prog_bar=True", callback={},
            progress_bar_loss=True,
        ),
        Variant("callback_pad", "Lightning, CompileCallback(pad='auto')", callback={"pad": "auto"}),
        Variant(
            "callback_pad6", "Lightning, CompileCallback(pad='auto', pad_max_buckets=6)",
            callback={"pad": "auto", "pad_max_buckets": 6},
        ),
        Variant(
            "callback_pad4", "Lightning, CompileCallback(pad='auto', pad_max_buckets=4)",
            callback={"pad": "auto", "pad_max_buckets": 4},
        ),
        # Eager again, after every other variant: how far the host's speed drifted during the run.
        Variant("eager_end", "Lightning, eager, run again last (the host's drift over the run)"),
    )
}

# Smoke runs use dynamo with the "eager" backend: the same capture, guards and recompiles, without
# Inductor's code generation (minutes on a 2-core CPU).
SMOKE_BACKEND = "eager"
SMOKE_CALLBACK_OPTIONS = {
    "backend": SMOKE_BACKEND, "eager_baseline_steps": 2, "warmup_steps": 1, "trial_steps": 2, "max_trials": 2,
}


def apply_progress_bar_loss(variant: Variant, module: nn.Module) -> None:
    """Makes ``module`` log its training loss to the progress bar, as the variant asks."""
    if not variant.progress_bar_loss:
        return
    if not hasattr(module, "train_loss_in_progress_bar"):
        raise ValueError(
            f"variant {variant.name!r} needs a module with a `train_loss_in_progress_bar` switch (the recipes' "
            f"GPTModule and CVModule); {type(module).__name__} has none: run it on a GPT workload."
        )
    module.train_loss_in_progress_bar = True


def skip_reason(variant: Variant) -> str | None:
    """Why ``variant`` cannot run with this version of the project, or None when it can."""
    if variant.callback:
        accepted = inspect.signature(CompileCallback).parameters
        missing = [key for key in variant.callback if key not in accepted]
        if missing:
            return f"CompileCallback has no {', '.join(repr(k) for k in missing)} option yet"
    return None


def callback_options(variant: Variant, *, smoke: bool) -> dict[str, Any]:
    options = dict(SMOKE_CALLBACK_OPTIONS) if smoke else {}
    options.update(variant.callback or {})
    return options


def make_callback(variant: Variant, *, smoke: bool) -> CompileCallback:
    return CompileCallback(**callback_options(variant, smoke=smoke))


def compile_kwargs(variant: Variant, *, smoke: bool) -> dict[str, Any]:
    """``torch.compile`` keyword arguments of a ``whole`` or ``per_block`` variant."""
    if smoke:
        return {"backend": SMOKE_BACKEND}  # modes are Inductor's; the smoke run only checks the plumbing
    kwargs: dict[str, Any] = {"backend": "inductor"}
    if variant.mode:
        kwargs["mode"] = variant.mode
    if variant.options:
        kwargs["options"] = dict(variant.options)
    return kwargs


def optimizer_compile_kwargs(variant: Variant, *, smoke: bool) -> dict[str, Any] | None:
    """``torch.compile`` keyword arguments of the plain loop's optimizer step (None: it stays eager)."""
    if variant.optimizer_mode is None:
        return None
    if smoke:
        return {"backend": SMOKE_BACKEND}
    return {"backend": "inductor", **({} if variant.optimizer_mode == "default" else {"mode": variant.optimizer_mode})}


def apply_compile(variant: Variant, module: nn.Module, blocks: list[nn.Module], *, smoke: bool) -> str | None:
    """Compiles ``module`` in place as the variant says; returns what was done, for the record."""
    if variant.compile is None:
        return None
    kwargs = compile_kwargs(variant, smoke=smoke)
    if variant.compile == "whole":
        module.compile(**kwargs)
        return f"model.compile({_describe(kwargs)})"
    if variant.compile == "per_block":
        for block in blocks:
            block.compile(**kwargs)
        return f"{len(blocks)} x {type(blocks[0]).__name__}.compile({_describe(kwargs)})"
    raise ValueError(f"variant {variant.name!r}: `compile` must be 'whole', 'per_block' or None; got {variant.compile!r}.")


def trial_budget(callback: CompileCallback) -> int:
    """Batches the CompileCallback may spend before its plan is frozen, at most (every trial run).

    Warm-up, profile, eager baseline, ``max_trials`` trials of warm-up + ``trial_steps`` (and one batch before
    each, where a part's inputs are held: ``AutoPlanner._hold_inputs``), the CUDA-graph
    trial (warm-up + 2 recording calls + ``trial_steps``) and the warm-up after the last compile. Not
    counted: a CUDA-graph trial's control window timed again because the host disturbed it (up to two
    more windows of warm-up + ``trial_steps``; ``planner.CONTROL_WINDOWS``); the callback variant then
    runs on past the total, up to the budget once more (``--total-steps`` + budget + the steady window),
    until its steady window holds its frozen plan only.
    """
    profile_steps = run_module.PROFILE_STEPS
    trial = callback.warmup_steps + callback.trial_steps
    return (
        callback.warmup_steps
        + profile_steps
        + callback.eager_baseline_steps
        + callback.max_trials * (trial + 1)
        + trial + 2
        + callback.warmup_steps
    )


def _describe(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
