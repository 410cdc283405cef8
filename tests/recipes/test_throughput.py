"""recipes.throughput: a step's FLOPs counted on a meta-device model against the formula MFU is usually
quoted with, the window's rates by hand, the peak the MFU assumes, and a real Trainer's run whose
stalled step, validation and data-loader wait leave the rates at the median step."""

from __future__ import annotations

import importlib.util
import time

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads import gpt_flops_per_token
from recipes.config import load_config
from recipes.gpt import GPTModule
from recipes.throughput import at_median, peak_flops, rates, step_flops
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
    # Five steps of 10 ms, 4 sequences of 64 tokens, 1 GFLOP each: 50 ms, 20 sequences, 1280 tokens, 5 GFLOP.
    found = rates([10.0] * 5, [4] * 5, [256] * 5, [1e9] * 5, peak=1e12)
    assert found == pytest.approx({"samples_per_sec": 400.0, "items_per_sec": 25_600.0, "flops_per_sec": 1e11, "mfu": 0.1})
    assert "mfu" not in rates([10.0] * 5, [4] * 5, None, [1e9] * 5, peak=None)
    assert "items_per_sec" not in rates([10.0] * 5, [4] * 5, None, None, peak=None)
    # Every step counts, the first too (Throughput's window opens at zero): 8 sequences in 40 ms.
    assert rates([10.0, 30.0], [4, 4], None, None, peak=None) == pytest.approx({"samples_per_sec": 200.0})
    assert rates([10.0], [4], [256], None, peak=None) == pytest.approx({"samples_per_sec": 400.0, "items_per_sec": 25_600.0})
    assert rates([], [], None, None, peak=None) == {}


def test_a_window_at_the_median_prices_each_step_at_its_shapes_median():
    # One 500 ms stall among 10 ms steps: the summed window reads 4 steps in 540 ms, the median's 4 in 40 ms.
    timed = {(4, 256): [10.0, 10.0, 500.0, 10.0, 10.0], (2, 64): [7.0]}
    assert at_median(timed) == {(4, 256): [10.0] * 5, (2, 64): [7.0]}
    priced = at_median(timed)[(4, 256)]
    assert rates(priced, [4] * 5, [256] * 5, None, peak=None)["items_per_sec"] == pytest.approx(25_600.0)
    assert rates(timed[(4, 256)], [4] * 5, [256] * 5, None, peak=None)["items_per_sec"] == pytest.approx(1280 / 0.54)


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


SIZE, LENGTH, VOCAB = 4, 16, 32
STALL_S = 0.25  # one training step, the validation and one batch's loading each sleep this long


class StallingSequences(Dataset):
    """Token sequences; loading item ``stall_at`` sleeps (a data-loader wait, outside any step)."""

    def __init__(self, count: int, stall_at: int | None = None) -> None:
        self.count, self.stall_at = count, stall_at

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index == self.stall_at:
            time.sleep(STALL_S)
        ids = torch.arange(index, index + LENGTH) % VOCAB
        return {"input_ids": ids, "labels": (ids + 1) % VOCAB}


class TinyLM(L.LightningModule):
    """An embedding and a linear head whose step ``stall_step`` sleeps (a host stall inside a step)."""

    def __init__(self, stall_step: int | None = None) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)
        self.stall_step = stall_step

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.embed(input_ids)).flatten(0, 1), labels.flatten())

    def training_step(self, batch, batch_idx):
        if self.global_step == self.stall_step:
            time.sleep(STALL_S)
        return self(batch["input_ids"], batch["labels"])

    def validation_step(self, batch, batch_idx):
        time.sleep(STALL_S)
        self.log("val/loss", self(batch["input_ids"], batch["labels"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_stalled_step_validation_and_a_loader_wait_leave_the_rates_at_the_median_step(monkeypatch, tmp_path):
    """A real Trainer, 30 steps of a ~1 ms model: step 12 stalls 0.25 s inside the step, validation at
    step 10 and the loading of batch 20 stall 0.25 s each. The logged and final tokens/s, sequences/s and
    MFU (Throughput over the window, FLOPs from measure_flops) are the median step's; the summed times
    (the window's mean step, as the recipes reported before) show the stall."""
    import sys

    from recipes.train import StepTimes, summary

    # No peak is assumed on a CPU: one for the test, so that the MFU is counted too.
    monkeypatch.setattr(sys.modules["recipes.train"], "peak_flops", lambda device, precision: (1e12, "1 TFLOP/s assumed for the test"))
    steps = 30
    timer = StepTimes(lambda batch: (batch["input_ids"].shape[0], batch["input_ids"].numel()),
                      lambda batch: step_flops(TinyLM, lambda model, b: model(b["input_ids"], b["labels"]), batch))
    trainer = L.Trainer(max_steps=steps, val_check_interval=10, limit_val_batches=1, num_sanity_val_steps=0,
                        log_every_n_steps=5, accelerator="cpu", devices=1, logger=False, callbacks=[timer],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path))
    train_loader = DataLoader(StallingSequences(SIZE * steps, stall_at=SIZE * 20), batch_size=SIZE)
    trainer.fit(TinyLM(stall_step=12), train_loader, DataLoader(StallingSequences(SIZE), batch_size=SIZE))

    steady = timer.steady()
    assert steady["n"] == steps
    times_ms = timer.timer.samples_ms("step")
    # The stall is inside one step; validation's and the loader's are in none (outside the step hooks).
    assert sum(ms >= STALL_S * 1e3 for ms in times_ms) == 1 and steady["median_ms"] < STALL_S * 1e3, times_ms
    median_s = steady["median_ms"] / 1e3
    batch = {"input_ids": torch.zeros(SIZE, LENGTH, dtype=torch.long), "labels": torch.zeros(SIZE, LENGTH, dtype=torch.long)}
    flops = step_flops(TinyLM, lambda model, b: model(b["input_ids"], b["labels"]), batch)
    assert flops > 0
    found = timer.throughput(wait=True)
    assert found == pytest.approx({"samples_per_sec": SIZE / median_s, "tokens_per_sec": SIZE * LENGTH / median_s,
                                   "mfu": flops / median_s / 1e12}, rel=1e-6)
    # Logged at step 30 from the same 30 steps (on a CPU every step's time is in at its end).
    logged = trainer.callback_metrics
    assert float(logged["train/tokens_per_sec"]) == pytest.approx(found["tokens_per_sec"], rel=1e-5)
    assert float(logged["train/mfu"]) == pytest.approx(found["mfu"], rel=1e-5)

    # The same steps over their summed times (what the recipes reported before): the stalled step drags them.
    summed = timer.throughput(wait=True, summed=True)
    total_s = sum(times_ms) / 1e3
    assert summed["tokens_per_sec"] == pytest.approx(steps * SIZE * LENGTH / total_s, rel=1e-6)
    assert summed["mfu"] == pytest.approx(steps * flops / total_s / 1e12, rel=1e-6)
    assert summed["tokens_per_sec"] < found["tokens_per_sec"]
    assert summed["slow_steps"] >= 1 and summed["slowest_ms"] == max(times_ms)


def test_the_summary_gives_the_median_steps_rate_and_the_summed_one_where_a_stall_drags_it(tmp_path):
    """The H200's GPT-2 run: median step 34.38 ms of 16 x 1024 tokens; one 0.54 s step in the last 100."""
    from recipes.train import summary

    config = load_config(config_path("gpt_tiny"), [f"run_dir={tmp_path}"])
    median = {"samples_per_sec": 16 / 0.03438, "tokens_per_sec": 16 * 1024 / 0.03438, "mfu": 0.411}
    summed = {"samples_per_sec": 401.6, "tokens_per_sec": 411_220.0, "mfu": 0.355, "slow_steps": 1.0, "slowest_ms": 575.0}
    result = {"global_step": 400, "seconds": 72.0, "steady_step_ms": 34.38, "steady_steps": 100, "throughput": median,
              "throughput_summed": summed, "metrics": {}, "log_dir": str(tmp_path), "report_path": None,
              "peak_flops": "989 TFLOP/s assumed: the dense 16-bit tensor-core peak of an H200"}
    printed = summary(config, result)
    assert ("  throughput:       476,556 tokens/s (465.4 sequences/s) at the median step of the last 100, MFU 41.1%"
            " (989 TFLOP/s assumed: the dense 16-bit tensor-core peak of an H200)\n"
            "  summed times:     411,220 tokens/s, MFU 35.5% over the same steps' total time (1 step over twice the"
            " median, the slowest 575.0 ms)\n") in printed
    # Within 2% of the median step's rate the summed one is not given.
    result["throughput_summed"] = dict(summed, tokens_per_sec=0.99 * median["tokens_per_sec"])
    assert "summed times" not in summary(config, result)
