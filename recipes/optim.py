"""The optimizer both recipes use: AdamW with nanoGPT's weight-decay grouping, and an optional linear
learning-rate warm-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from recipes.config import MIXED_PRECISIONS, OptimConfig


def build_adamw(
    module: nn.Module, config: OptimConfig, *, clips_under_mixed_precision: bool = False
) -> torch.optim.AdamW:
    """AdamW over ``module``'s trainable parameters; matrices and embeddings decay, biases and norms do not.

    Args:
        module: the model, already on its training device (the fused choice depends on it).
        config: learning rate, weight decay, betas and ``fused`` (None: fused on CUDA, see below).
        clips_under_mixed_precision: the Trainer clips gradients under 16/bf16-mixed. Lightning
            refuses that for a fused optimizer (it unscales inside its own step), so ``fused=None``
            then means not fused.

    Example:
        >>> optimizer = build_adamw(model, OptimConfig(lr=6e-4))
    """
    parameters = [p for p in module.parameters() if p.requires_grad]  # tied weights appear once
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = config.fused
    if fused is None:
        # The fused CUDA kernel updates all parameters in a few launches instead of several per tensor.
        on_cuda = bool(parameters) and parameters[0].device.type == "cuda"
        fused = on_cuda and not clips_under_mixed_precision
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), fused=fused)


def clips_gradients_under_mixed_precision(trainer: object) -> bool:
    """Whether a Lightning ``trainer`` clips gradients under mixed precision (see :func:`build_adamw`)."""
    clips = bool(getattr(trainer, "gradient_clip_val", None))
    return clips and getattr(trainer, "precision", None) in MIXED_PRECISIONS


def with_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int, steps_done: Callable[[], int]) -> Any:
    """What ``configure_optimizers`` returns: ``optimizer`` alone, or with a scheduler that raises every
    group's learning rate linearly over the first ``warmup_steps`` optimizer steps (the step after
    ``steps_done()`` steps trains at ``(steps_done() + 1) / warmup_steps`` of it) and then holds it.
    Lightning steps it after every optimizer step. The factor comes from ``steps_done`` (the
    LightningModule passes ``lambda: self.trainer.global_step``), not from the scheduler's own count,
    so a run resumed from any checkpoint, even one saved before warm-up was configured, goes on at
    the right rate.

    Example:
        >>> configured = with_warmup(build_adamw(model, OptimConfig(lr=6e-4)), 100, lambda: trainer.global_step)
        >>> configured["lr_scheduler"]["interval"]
        'step'
    """
    if warmup_steps <= 0:
        return optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: min(1.0, (steps_done() + 1) / warmup_steps))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
