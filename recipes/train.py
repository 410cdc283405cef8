"""Runs a recipe: builds the data, the model, the Trainer and the CompileCallback from a config, and fits.

Everything a run leaves goes under ``run_dir`` (default ``runs/<name>``): TensorBoard event files and
the callback's ``compile_report.json`` in ``version_N/`` (one per run, so runs can be compared side by
side in TensorBoard), and checkpoints in ``version_N/checkpoints/``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import ModelParallelStrategy

from compile_callback import CompileCallback
from compile_callback.timing import StepTimer, summarize
from recipes.config import ConfigError, CVRecipeConfig, GPTRecipeConfig, RecipeConfig, load_config, to_dict
from recipes.cv import CVDataModule, CVModule
from recipes.gpt import GPTDataModule, GPTModule
from recipes.throughput import at_median, peak_flops, rates, step_flops

REPORT_FILE = "compile_report.json"
STEADY_STEPS = 100  # the run's last steps, whose median step time the summary prints
SUMMED_NOTE = 0.02  # the summary gives the summed rate too where it is this much below the median step's


class StepTimes(L.Callback):
    """Times every training batch (CUDA events, no host sync per step) so that any run, with the
    CompileCallback or without it (``callback_enabled=false``), ends with the median time of its last
    :data:`STEADY_STEPS` steps: eager and compiled runs of a recipe compare directly. Of the same steps
    it logs ``train/samples_per_sec``, ``train/tokens_per_sec`` (sequence batches; padding included)
    and ``train/mfu`` every ``log_every_n_steps`` (:mod:`recipes.throughput`: fabric's ``Throughput``
    and ``measure_flops``; the MFU where a peak is known for the device), each step priced at the median
    time of its shape's steps, so that the rates are the median step's (one shape: tokens per median
    step). :meth:`throughput` with ``summed=True`` gives the same steps' rates over their summed time.

    A step is timed from this callback's ``on_train_batch_start`` to its ``on_train_batch_end``:
    validation, the wait for the next batch and what the CompileCallback does before a step (it
    compiles and checks a plan there) fall outside. The callback's profiled steps, its trials and a
    plan's first steps (CUDA graphs record) fall inside, but leave the window as the run goes on, and
    the median does not move for a few of them as a mean over the window would.

    Args:
        counts: ``(samples, items)`` of a batch from its shapes (items None for images).
        flops: FLOPs of a training step on a batch's shapes (``recipes.throughput.step_flops``),
            measured once, on the first batch; per item where batches vary in length.
    The peak FLOP/s comes from the device and the Trainer's precision (:func:`recipes.throughput.peak_flops`).
    """

    def __init__(
        self,
        counts: Callable[[Any], tuple[int, int | None]] | None = None,
        flops: Callable[[Any], int] | None = None,
    ) -> None:
        self.timer: StepTimer | None = None
        self.counts, self.flops = counts, flops
        self.flops_per_item: float | None = None  # FLOPs of a step per item (per sample for images)
        self.peak: float | None = None
        self.peak_note = ""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.timer = StepTimer(pl_module.device, keep=STEADY_STEPS)
        self.peak, self.peak_note = peak_flops(pl_module.device, str(trainer.precision))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.timer is not None:
            self.timer.start()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.timer is None:
            return
        # Each step's counts ride with its time as the sample's key: read from shapes, on the host.
        counts = self.counts(batch) if self.counts is not None else None
        self.timer.stop("step", key=counts)
        if counts is not None and self.flops is not None and self.flops_per_item is None:
            try:
                self.flops_per_item = self.flops(batch) / (counts[1] or counts[0])
            except Exception as error:  # a model that cannot run on the meta device: no MFU, the run goes on
                self.flops, self.peak, self.peak_note = None, None, f"FLOPs not counted: {type(error).__name__}: {error}"
        every = trainer.log_every_n_steps or 50
        if counts is not None and trainer.global_step % every == 0:
            for name, value in self.throughput().items():
                pl_module.log(f"train/{name}", value, on_step=True, on_epoch=False)

    def steady(self) -> dict[str, float]:
        """``median_ms``, ``p90_ms`` and ``n`` of the last steps (empty before any step)."""
        return summarize(self.timer.samples_ms("step", wait=True)) if self.timer is not None else {}

    def throughput(self, *, wait: bool = False, summed: bool = False) -> dict[str, float]:
        """``samples_per_sec``, ``tokens_per_sec`` (sequences), ``mfu`` (a known peak) of the last steps
        whose times are in (all of them with ``wait``; else those already done: no host sync), each step
        priced at the median time of its shape's steps (:func:`recipes.throughput.at_median`). With
        ``summed``, over the steps' own summed times instead (the window's mean step: a stalled step
        drags it), with ``slow_steps`` (those over twice their shape's median) and ``slowest_ms``."""
        if self.timer is None or self.counts is None:
            return {}
        timed = self.timer.samples_by_key("step", wait=wait)
        priced = timed if summed else at_median(timed)
        times, samples, items = [], [], []
        for (batch_samples, batch_items), steps in priced.items():
            times += steps
            samples += [batch_samples] * len(steps)
            items += [batch_items or 0] * len(steps)
        tokens = any(items)
        flops = ([self.flops_per_item * (count or sample) for sample, count in zip(samples, items)]
                 if self.flops_per_item is not None else None)
        found = rates(times, samples, items if tokens else None, flops, self.peak)
        result = {"samples_per_sec": found["samples_per_sec"]} if "samples_per_sec" in found else {}
        if tokens and "items_per_sec" in found:
            result["tokens_per_sec"] = found["items_per_sec"]
        if "mfu" in found:
            result["mfu"] = found["mfu"]
        if summed and result:
            medians = at_median(timed)
            result["slow_steps"] = float(sum(ms > 2 * medians[key][0] for key, steps in timed.items() for ms in steps))
            result["slowest_ms"] = max(max(steps) for steps in timed.values())
        return result


def run(config_path: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Loads ``config_path`` with ``overrides`` and trains it; see :func:`train` for what comes back.

    Example:
        >>> result = run("configs/gpt_tiny.yaml", ["trainer.max_steps=20"])
        >>> result["report_path"]
        'runs/gpt_tiny/version_0/compile_report.json'
    """
    return train(load_config(config_path, overrides))


def build_callback(config: RecipeConfig) -> CompileCallback | None:
    """The CompileCallback the ``callback`` section describes, or None with ``callback_enabled: false``.

    Raises:
        ConfigError: the callback refused a value; the message names the ``callback.`` key.
    """
    if not config.callback_enabled:
        return None
    try:
        return CompileCallback(**to_dict(config)["callback"])
    except ValueError as error:  # the callback's own check, e.g. "`mode` must be one of ..."
        raise ConfigError(f"config section 'callback': {error}") from error


def build_task(config: RecipeConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """The datamodule and the LightningModule of the config's task."""
    if isinstance(config, GPTRecipeConfig):
        return GPTDataModule(config.data, seed=config.seed), GPTModule(config.model, config.optim)
    if isinstance(config, CVRecipeConfig):
        data = CVDataModule(config.data, num_classes=config.model.num_classes, seed=config.seed)
        return data, CVModule(config.model, config.optim)
    raise ConfigError(f"config key 'task' must be 'gpt' or 'cv'; got {config.task!r}.")


def step_times(config: RecipeConfig) -> StepTimes:
    """The step timer of the config's task: how to count a batch, and how to measure a step's FLOPs."""
    if isinstance(config, GPTRecipeConfig):
        def counts(batch: Any) -> tuple[int, int | None]:
            size, length = batch["input_ids"].shape
            return size, size * length

        def flops(batch: Any) -> int:
            return step_flops(lambda: GPTModule(config.model, config.optim),
                              lambda model, b: model(b["input_ids"], b["labels"])[1], batch)
    else:
        def counts(batch: Any) -> tuple[int, int | None]:
            return batch["images"].shape[0], None

        def flops(batch: Any) -> int:
            return step_flops(lambda: CVModule(config.model, config.optim),
                              lambda model, b: F.cross_entropy(model(b["images"]), b["labels"]), batch)
    return StepTimes(counts, flops)


def build_strategy(config: RecipeConfig) -> str | ModelParallelStrategy:
    """Lightning's strategy by name, and ``"model_parallel"``: FSDP2 over ``trainer.devices`` processes
    (data-parallel only; the GPT recipe shards itself in ``configure_model``).

    Raises:
        ConfigError: ``model_parallel`` for a recipe that does not shard itself, or without a device count.
    """
    settings = config.trainer
    if settings.strategy != "model_parallel":
        return settings.strategy
    if config.task != "gpt":
        raise ConfigError(f"trainer.strategy=model_parallel shards the GPT recipe's blocks (FSDP2); the "
                         f"{config.task!r} recipe does not shard itself: use trainer.strategy=ddp or fsdp.")
    if isinstance(settings.devices, bool) or not isinstance(settings.devices, int) or settings.devices < 1:
        raise ConfigError(f"trainer.strategy=model_parallel needs trainer.devices=<count> (the processes to "
                         f"shard over, e.g. trainer.devices=2); got {settings.devices!r}.")
    return ModelParallelStrategy(data_parallel_size=settings.devices, tensor_parallel_size=1)


def build_trainer(config: RecipeConfig, callback: CompileCallback | None) -> L.Trainer:
    """A Trainer that logs to TensorBoard under ``run_dir``, on whatever accelerator is there."""
    settings = config.trainer
    logger = TensorBoardLogger(save_dir=config.run_dir, name="", default_hp_metric=False)
    logger.log_hyperparams(to_dict(config))
    callbacks: list[L.Callback] = ([callback] if callback is not None else []) + [step_times(config)]
    if settings.enable_progress_bar and settings.max_epochs is None and settings.max_steps != -1:
        # A run bounded by steps has max_epochs -1, which Lightning's rich progress bar (its default
        # where `rich` is installed) shows as "Epoch 0/-2"; the tqdm bar shows the epoch alone.
        callbacks.append(TQDMProgressBar())
    return L.Trainer(
        default_root_dir=config.run_dir,
        logger=logger,
        callbacks=callbacks,
        max_steps=settings.max_steps,
        max_epochs=settings.max_epochs,
        precision=settings.precision,
        accelerator=settings.accelerator,
        devices=settings.devices,
        strategy=build_strategy(config),
        log_every_n_steps=settings.log_every_n_steps,
        val_check_interval=settings.val_check_interval,
        limit_val_batches=settings.limit_val_batches,
        num_sanity_val_steps=settings.num_sanity_val_steps,
        gradient_clip_val=settings.gradient_clip_val,
        enable_checkpointing=settings.enable_checkpointing,
        enable_progress_bar=settings.enable_progress_bar,
    )


def train(config: RecipeConfig) -> dict[str, Any]:
    """Trains the recipe ``config`` describes and says where its logs and report are.

    Returns:
        ``run_dir``, ``log_dir`` (TensorBoard event files), ``report_path`` (``compile_report.json``, or
        None without the callback), ``report`` (the callback's report dict), ``metrics`` (the last
        logged values, e.g. ``train/loss``, ``val/loss``), ``global_step``, ``seconds``,
        ``steady_step_ms`` (the median of the last ``steady_steps`` steps' times, at most 100), and of
        the same steps ``throughput`` (``samples_per_sec``, ``tokens_per_sec`` for sequences, ``mfu``
        where a peak is known) at the median step (each step priced at its shape's median),
        ``throughput_summed`` (the same over the steps' summed times, the window's mean step, with
        ``slow_steps`` and ``slowest_ms``) and ``peak_flops``, the peak assumed (or why none).

    Raises:
        ConfigError: a value that only shows as wrong once things are built (e.g. a callback option).
    """
    # Global torch settings, from the config: "high" lets float32 matmuls use TF32 tensor cores on
    # Ampere and later GPUs (about 10 bits of mantissa; the GPU configs train in bf16 anyway).
    torch.set_float32_matmul_precision(config.trainer.matmul_precision)
    torch.backends.cuda.enable_cudnn_sdp(config.trainer.cudnn_attention)
    L.seed_everything(config.seed, workers=True)
    callback = build_callback(config)
    datamodule, module = build_task(config)
    trainer = build_trainer(config, callback)

    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    seconds = time.perf_counter() - started

    log_dir = trainer.logger.log_dir if trainer.logger is not None else config.run_dir
    report_path = os.path.join(log_dir, REPORT_FILE)
    timer = next(c for c in trainer.callbacks if isinstance(c, StepTimes))
    times = timer.steady()
    result = {
        "steady_step_ms": times.get("median_ms"),
        "steady_steps": int(times.get("n", 0)),
        # Of the same steps: samples/s, tokens/s (sequences) and MFU (where a peak is known) at the
        # median step, the same over their summed times, and what peak.
        "throughput": timer.throughput(wait=True),
        "throughput_summed": timer.throughput(wait=True, summed=True),
        "peak_flops": timer.peak_note,
        "run_dir": config.run_dir,
        "log_dir": log_dir,
        "report_path": report_path if os.path.isfile(report_path) else None,
        "report": callback.last_report if callback is not None else None,
        "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
        "global_step": trainer.global_step,
        "seconds": seconds,
    }
    if trainer.is_global_zero:
        print(summary(config, result))
    return result


def summary(config: RecipeConfig, result: dict[str, Any]) -> str:
    """What the run left and how to look at it, for the end of the run's output."""
    metrics = result["metrics"]
    losses = ", ".join(f"{name} {metrics[name]:.4f}" for name in ("train/loss", "val/loss") if name in metrics)
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    command = "tensorboard"
    if os.path.exists(tensorboard):  # the one next to this Python, so it works without activating a venv
        relative = os.path.relpath(tensorboard)
        command = tensorboard if relative.startswith("..") else relative
    headline = f"run {config.name!r}: {result['global_step']} steps in {result['seconds']:.1f} s"
    if result.get("steady_step_ms") is not None:
        headline += f" (median step of the last {result['steady_steps']}: {result['steady_step_ms']:.2f} ms)"
    rates = result.get("throughput") or {}
    speed = ""
    steps = f"the median step of the last {result.get('steady_steps', 0)}"
    if "tokens_per_sec" in rates:
        speed = (f"  throughput:       {rates['tokens_per_sec']:,.0f} tokens/s ({rates['samples_per_sec']:,.1f} sequences/s)"
                 f" at {steps}")
    elif "samples_per_sec" in rates:
        speed = f"  throughput:       {rates['samples_per_sec']:,.1f} images/s at {steps}"
    if speed:
        speed += (f", MFU {rates['mfu']:.1%} ({result['peak_flops']})" if "mfu" in rates
                  else f", MFU – ({result['peak_flops']})")
    summed = result.get("throughput_summed") or {}
    name = "tokens_per_sec" if "tokens_per_sec" in rates else "samples_per_sec"
    if speed and name in summed and summed[name] < (1 - SUMMED_NOTE) * rates[name]:
        # The mean step of the same window: a step that stalled (a host pause inside it) drags it.
        unit = "tokens/s" if name == "tokens_per_sec" else "images/s"
        slow = int(summed["slow_steps"])
        speed += (f"\n  summed times:     {summed[name]:,.{0 if name == 'tokens_per_sec' else 1}f} {unit}"
                  + (f", MFU {summed['mfu']:.1%}" if "mfu" in summed else "")
                  + f" over the same steps' total time ({slow} step{'s' if slow != 1 else ''} over twice the"
                  f" median, the slowest {summed['slowest_ms']:,.1f} ms)")
    lines = [
        "\n" + headline + (f"; {losses}" if losses else ""),
        *([speed] if speed else []),
        f"  TensorBoard logs: {result['log_dir']}",
        f"  compile report:   {result['report_path'] or '(none: callback disabled or report=false)'}",
        f"  open TensorBoard: {command} --logdir {config.run_dir}",
    ]
    return "\n".join(lines)
