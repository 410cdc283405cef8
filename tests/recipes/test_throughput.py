"""recipes.throughput: a step's FLOPs counted on a meta-device model against the formula MFU is usually
quoted with, the window's rates by hand, and the peak the MFU assumes."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from benchmarks.workloads import gpt_flops_per_token
from recipes.config import load_config
from recipes.gpt import GPTModule
from recipes.throughput import peak_flops, rates, step_flops
from tests.recipes.test_run import config_path


def test_a_gpt_steps_counted_flops_match_nanogpts_formula():
    """Independent of fabric's counter: nanoGPT's 6N + 12·L·C·T per token, N without position embeddings."""
    config = load_config(config_path("gpt_tiny"), [])
    size, length = 4, config.model.block_size
    batch = {"input_ids": torch.zeros(size, length, dtype=torch.long), "labels": torch.zeros(size, length, dtype=torch.long)}
    counted = step_flops(lambda: GPTModule(config.model, config.optim),
                         lambda model, b: model(b["input_ids"], b["labels"])[1], batch)
    formula = gpt_flops_per_token(GPTModule(config.model, config.optim), n_layer=config.model.n_layer,
                                  n_embd=config.model.n_embd, seq_len=length)
    assert counted / (size * length) == pytest.approx(formula, rel=0.03)  # 0.987 of it: LayerNorms are no matmuls


def test_rates_of_a_window_by_hand():
    # Five steps of 10 ms, 4 sequences of 64 tokens, 1 GFLOP each: a window's rates are differences, so
    # the last four steps count (40 ms, 16 sequences, 1024 tokens, 4 GFLOP).
    found = rates([10.0] * 5, [4] * 5, [256] * 5, [1e9] * 5, peak=1e12)
    assert found == pytest.approx({"samples_per_sec": 400.0, "items_per_sec": 25_600.0, "flops_per_sec": 1e11, "mfu": 0.1})
    assert "mfu" not in rates([10.0] * 5, [4] * 5, None, [1e9] * 5, peak=None)
    assert "items_per_sec" not in rates([10.0] * 5, [4] * 5, None, None, peak=None)
    assert rates([10.0], [4], [256], None, peak=None) == {}  # one step: no window


def test_the_peak_is_assumed_from_the_device_name_and_said(monkeypatch):
    assert peak_flops(torch.device("cpu"), "bf16-mixed") == (None, "no peak FLOP/s assumed on cpu")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    value, note = peak_flops(torch.device("cuda", 0), "bf16-mixed")
    assert value == 989e12 and note == "989 TFLOP/s assumed: the dense 16-bit tensor-core peak of an H200"
    assert peak_flops(torch.device("cuda", 0), "32-true")[0] is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    assert peak_flops(torch.device("cuda", 0), "bf16-mixed") == (None, "no peak FLOP/s known for 'NVIDIA L4'")


def test_a_step_bounded_run_gets_the_progress_bar_without_a_negative_epoch_count():
    """Lightning sets max_epochs to -1 at fit for a run bounded by max_steps; its rich bar (the default
    where `rich` is installed, as here) then reads "Epoch 0/-2". The recipes give such runs the tqdm bar."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    from recipes.train import build_trainer

    bounded = build_trainer(load_config(config_path("gpt_tiny"), ["trainer.max_steps=5", "trainer.max_epochs=null"]), None)
    assert type(bounded.progress_bar_callback) is TQDMProgressBar
    by_epochs = build_trainer(load_config(config_path("gpt_tiny"), ["trainer.max_steps=-1", "trainer.max_epochs=2"]), None)
    assert sum(isinstance(c, TQDMProgressBar) for c in by_epochs.callbacks) == 0 or importlib.util.find_spec("rich") is None
