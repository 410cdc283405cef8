"""The optimizer both recipes use: AdamW with nanoGPT's weight-decay grouping."""

from __future__ import annotations

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
