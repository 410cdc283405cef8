"""AdamW as the recipes build it: decay on matrices only, fused only where Lightning allows it."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from recipes.config import GPTModelConfig, OptimConfig
from recipes.gpt import GPTModule
from recipes.optim import build_adamw, clips_gradients_under_mixed_precision, with_warmup


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


class LearningRates(L.Callback):
    """The learning rate each training batch ran at."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rates.append(trainer.optimizers[0].param_groups[0]["lr"])


def _fit(tmp_path, module, steps, ckpt_path=None):
    tokens = torch.randint(0, 256, (32, 9), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row[:-1], "labels": row[1:]} for row in tokens]
    rates = LearningRates()
    trainer = L.Trainer(
        default_root_dir=str(tmp_path), accelerator="cpu", max_steps=steps, logger=False, callbacks=[rates],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(module, DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
    return trainer, rates.rates


def test_warmup_raises_the_learning_rate_linearly_and_resumes_where_it_stopped(tmp_path):
    config = GPTModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)
    trainer, rates = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01, warmup_steps=4)), steps=6)
    assert rates == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])
    # Stopped mid-warm-up, the checkpoint holds the scheduler: the resumed run goes on from step 3.
    trainer, rates = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01, warmup_steps=4)), steps=2)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    _, resumed = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01, warmup_steps=4)), steps=5, ckpt_path=tmp_path / "mid.ckpt")
    assert resumed == pytest.approx([0.0075, 0.01, 0.01])


def test_no_warmup_gives_the_optimizer_alone():
    model = GPTModule(GPTModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8), OptimConfig())
    optimizer = build_adamw(model, OptimConfig())
    assert with_warmup(optimizer, 0, lambda: 0) is optimizer


def test_warmup_goes_on_at_the_right_rate_from_a_checkpoint_saved_without_one(tmp_path):
    config = GPTModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)
    trainer, _ = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01)), steps=2)
    trainer.save_checkpoint(tmp_path / "plain.ckpt")  # no scheduler in it
    _, resumed = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01, warmup_steps=4)), steps=5, ckpt_path=tmp_path / "plain.ckpt")
    # The first resumed step runs at the checkpoint's saved rate (the optimizer's state), then warm-up's.
    assert resumed[1:] == pytest.approx([0.01, 0.01])
    trainer, _ = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01)), steps=1)
    trainer.save_checkpoint(tmp_path / "early.ckpt")
    _, resumed = _fit(tmp_path, GPTModule(config, OptimConfig(lr=0.01, warmup_steps=4)), steps=4, ckpt_path=tmp_path / "early.ckpt")
    assert resumed[1:] == pytest.approx([0.0075, 0.01])  # steps 3 and 4 of the warm-up, not 1 and 2
