"""AdamW as the recipes build it: decay on matrices only, fused only where Lightning allows it."""

from __future__ import annotations

import lightning as L

from recipes.config import GPTModelConfig, OptimConfig
from recipes.gpt import GPTModule
from recipes.optim import build_adamw, clips_gradients_under_mixed_precision


def test_weight_decay_on_matrices_only_and_tied_weights_once():
    model = GPTModule(GPTModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8), OptimConfig())
    optimizer = build_adamw(model, OptimConfig(weight_decay=0.1, betas=[0.8, 0.9]))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    assert decay["betas"] == (0.8, 0.9)
    assert not decay["fused"]  # fused=None on CPU


def test_clipping_under_mixed_precision_is_detected():
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0, logger=False)
    assert clips_gradients_under_mixed_precision(trainer)
    trainer = L.Trainer(accelerator="cpu", precision="32-true", gradient_clip_val=1.0, logger=False)
    assert not clips_gradients_under_mixed_precision(trainer)
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False)
    assert not clips_gradients_under_mixed_precision(trainer)
