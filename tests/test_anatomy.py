"""Compile anatomy with real Trainers: graph coverage, fallback kernels, guard cost, sampling."""

from __future__ import annotations

import json
import os

import lightning as L
import pytest
import torch
from torch import nn

from compile_callback import CompileCallback
from compile_callback.anatomy import StepSampler, count_ops, graph_coverage
from tests.conftest import loader, make_trainer, read_scalars


@torch._dynamo.disable
def doubled(t: torch.Tensor) -> torch.Tensor:
    """Two eager ops forward (mul, add) and one backward (mul): dynamo does not trace it (a graph break)."""
    return t * 2 + 1


class LossInForward(L.LightningModule):
    """Everything the step computes is in ``forward``: compiling the model captures all of it."""

    def __init__(self, width: int = 16, depth: int = 2, break_graph: bool = False, cumsum: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.head = nn.Linear(width, 4)
        self.break_graph = break_graph
        self.cumsum = cumsum

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        if self.break_graph:
            x = doubled(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        if self.break_graph:  # (not inside the loop: dynamo cannot resume in a ModuleList iterator)
            x = doubled(x)
        if self.cumsum:
            x = x.cumsum(dim=-1)  # Inductor has no lowering of its own for cumsum: an ATen fallback
        return nn.functional.cross_entropy(self.head(x), y)

    def training_step(self, batch, batch_idx):
        return self(*batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(tmp_path, model, callback, epochs: int = 1, **kwargs):
    trainer = make_trainer(tmp_path, [callback], max_epochs=epochs, **kwargs)
    trainer.fit(model, loader(batch_size=8))
    return callback.last_report


FAST = dict(eager_baseline_steps=2, warmup_steps=1)


def test_fully_captured_model_has_coverage_one(tmp_path):
    report = fit(tmp_path, LossInForward(), CompileCallback("model", backend="aot_eager", **FAST))
    anatomy = report["anatomy"]
    assert anatomy["graph_coverage"] == 1.0
    assert anatomy["eager_ops"] == 0
    assert anatomy["step_ops"] > 10  # the eager reference step: forward, loss and backward ops
    assert anatomy["region_graph_coverage"] == {"model": 1.0}
    assert anatomy["guard_checks"] >= 1 and anatomy["guard_us_per_call"] > 0
    assert 0 < anatomy["sampling_s"] < 1.0  # two small profiles
    summary = report["summary"]
    saved_ms = summary["eager_step_time_ms"] - summary["step_time_ms"]
    assert anatomy["projected_saving_s"] == pytest.approx(12 * saved_ms / 1e3 - summary["compile_time_s"], rel=1e-6)


def test_graph_break_leaves_its_ops_eager(tmp_path):
    report = fit(tmp_path, LossInForward(break_graph=True), CompileCallback("model", backend="aot_eager", **FAST))
    anatomy = report["anatomy"]
    assert report["summary"]["graph_breaks"] >= 2
    # Two breaks, each mul and add forward and mul backward (the add's backward passes the gradient on).
    assert anatomy["eager_ops"] == 2 * 3
    assert anatomy["graph_coverage"] == pytest.approx(1 - 6 / anatomy["step_ops"])
    assert 0 < anatomy["graph_coverage"] < 1
    assert anatomy["region_graph_coverage"]["model"] == pytest.approx(anatomy["graph_coverage"])


def test_uncompiled_and_compiled_regions_are_attributed(tmp_path):
    """Only the head is compiled: the blocks' ops stay eager, the step's coverage is the head's share."""
    from tests.conftest import TinyModel

    report = fit(tmp_path, TinyModel(), CompileCallback(["head"], backend="aot_eager", **FAST))
    anatomy = report["anatomy"]
    reference = anatomy["eager_reference_step"]
    head_ops = reference["region_eager_ops"]["head"]
    assert anatomy["region_graph_coverage"] == {"head": 1.0}
    assert anatomy["eager_ops"] == reference["eager_ops"] - head_ops
    assert anatomy["graph_coverage"] == pytest.approx(head_ops / reference["eager_ops"])


def test_inductor_fallback_kernel_is_named(tmp_path):
    report = fit(tmp_path, LossInForward(cumsum=True), CompileCallback("model", **FAST))
    anatomy = report["anatomy"]
    assert anatomy["fallback_kernels"].get("aten::cumsum", 0) >= 1, anatomy
    assert anatomy["fallback_calls"] >= 1
    assert 0 < anatomy["backend_coverage"] < 1
    assert anatomy["graph_coverage"] == 1.0


def test_sampling_is_rare_and_untimed(tmp_path):
    """Over 3 epochs of a frozen plan: one eager sample and one compiled sample, neither timed."""
    callback = CompileCallback("model", backend="aot_eager", **FAST)
    starts = []
    original = StepSampler.start

    def counting_start(self, *args, **kwargs):
        started = original(self, *args, **kwargs)
        starts.append(started)
        return started

    StepSampler.start = counting_start
    try:
        fit(tmp_path, LossInForward(), callback, epochs=3)
    finally:
        StepSampler.start = original
    assert starts == [True, True]
    batches = 3 * 12
    timed = len(callback.run.timer.samples_ms("eager")) + len(callback.run.timer.samples_ms("compiled"))
    # Not timed: the warm-up batch, the eager sample (the first of two baseline batches), the batch that
    # compiles (the warm-up after compiling) and the compiled sample.
    assert timed == batches - 4
    assert len(callback.run.timer.samples_ms("eager")) == FAST["eager_baseline_steps"] - 1


def test_anatomy_off_reports_none_of_it(tmp_path):
    report = fit(tmp_path, LossInForward(), CompileCallback("model", backend="aot_eager", anatomy=False, **FAST))
    assert "graph_coverage" not in report["anatomy"]
    assert "cache_hit_rate" in report["anatomy"]  # the compile-time figures do not need sampling


def test_anatomy_scalars_reach_tensorboard_and_json(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit(tmp_path, LossInForward(break_graph=True), CompileCallback("model", backend="aot_eager", **FAST), logger=logger)
    scalars = read_scalars(logger.log_dir)
    coverage = scalars["compile/anatomy/graph_coverage"][-1][1]
    assert 0 < coverage < 1
    assert "compile/region/model/graph_coverage" in scalars
    with open(os.path.join(logger.log_dir, "compile_report.json")) as handle:
        report = json.load(handle)
    assert report["anatomy"]["graph_coverage"] == pytest.approx(coverage, rel=1e-6)


def test_a_running_profiler_is_left_alone():
    """A user's own profiler already runs: the sampler starts nothing and says so."""
    module = LossInForward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert StepSampler().start(module) is False
    assert "training_step" not in vars(module)


def test_count_ops_on_a_plain_eager_step():
    """Counted from a real profile: forward ops of training_step and the backward nodes they made."""
    module = LossInForward(depth=1)
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    sampler = StepSampler()
    assert sampler.start(module, {"head": [module.head]})
    loss = module.training_step((x, y), 0)
    sampler.backward_started()
    loss.backward()
    sampler.backward_ended()
    ops = sampler.stop()
    assert "training_step" not in vars(module)  # the class's method again
    # embed, block and head: linear forward (1 op each) and AddmmBackward (mm, mm, sum, view... >= 2)
    assert ops.eager_ops > 6 and ops.library_calls == {} and ops.guard_checks == 0
    assert 0 < ops.region_eager_ops["head"] < ops.eager_ops
    assert graph_coverage(0, ops.eager_ops) == 1.0 and graph_coverage(ops.eager_ops, ops.eager_ops) == 0.0
    assert count_ops([]).eager_ops == 0


def test_a_step_that_raises_while_sampled_leaves_no_profiler_running(tmp_path):
    class Failing(LossInForward):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:  # the eager sample (the second batch)
                raise RuntimeError("user error")
            return super().training_step(batch, batch_idx)

    model = Failing()
    with pytest.raises(RuntimeError, match="user error"):
        fit(tmp_path, model, CompileCallback("model", backend="aot_eager", **FAST))
    assert not torch.autograd.profiler._is_profiler_enabled
    assert "training_step" not in vars(model)


def test_compile_time_split_equals_torchs_own_accounting(tmp_path, monkeypatch):
    """dynamo's figures nest (its time includes AOTAutograd's, which includes Inductor's forward); the
    split is each stage's own time, computed here straight from torch's compile records."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # cold: every stage runs
    before = list(torch._dynamo.utils.get_compilation_metrics())  # held, so no id is reused
    report = fit(tmp_path, LossInForward(), CompileCallback("model", **FAST))
    records = [m for m in torch._dynamo.utils.get_compilation_metrics() if not any(m is b for b in before)]
    us = lambda value: (value or 0) / 1e6  # noqa: E731
    capture = sum(us(m.dynamo_cumulative_compile_time_us) - us(m.aot_autograd_cumulative_compile_time_us)
                  for m in records if m.is_forward is not False)
    aot = sum(us(m.aot_autograd_cumulative_compile_time_us) - us(m.inductor_cumulative_compile_time_us)
              for m in records if m.aot_autograd_cumulative_compile_time_us)
    inductor = sum(us(m.inductor_cumulative_compile_time_us) for m in records)
    anatomy = report["anatomy"]
    assert inductor > 0 and aot > 0 and capture > 0
    assert anatomy["dynamo_s"] == pytest.approx(capture, abs=1e-6)
    assert anatomy["aot_autograd_s"] == pytest.approx(aot, abs=1e-6)
    assert anatomy["inductor_s"] == pytest.approx(inductor, abs=1e-6)
    total = report["summary"]["compile_time_s"]
    assert 0.8 * total <= capture + aot + inductor <= 1.001 * total


def test_a_step_that_compiles_is_not_the_compiled_sample(tmp_path):
    """Without warm-up the first compiled batch is due for sampling, but it compiles: dynamo's tracing
    would count as eager ops. That sample is thrown away and the next batch sampled instead."""
    callback = CompileCallback("model", backend="aot_eager", eager_baseline_steps=2, warmup_steps=0)
    report = fit(tmp_path, LossInForward(), callback)
    assert report["anatomy"]["graph_coverage"] == 1.0 and report["anatomy"]["eager_ops"] == 0


class TwoStepsManual(LossInForward):
    """Manual optimization with two forward/backward passes per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        for _ in range(2):
            loss = self(*batch)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()


def test_manual_optimization_is_sampled_to_the_end_of_the_batch(tmp_path):
    single = fit(tmp_path / "one", LossInForward(), CompileCallback("model", backend="aot_eager", **FAST))
    double = fit(tmp_path / "two", TwoStepsManual(), CompileCallback("model", backend="aot_eager", **FAST))
    # both passes' forward and backward ops are in the reference (plus the optimizer steps, which run
    # inside training_step under manual optimization and stay eager)
    assert double["anatomy"]["step_ops"] >= 2 * single["anatomy"]["step_ops"]
    assert 0 < double["anatomy"]["graph_coverage"] < 1
    assert double["anatomy"]["eager_ops"] == double["anatomy"]["step_ops"] - 2 * single["anatomy"]["step_ops"]


def test_lightnings_pytorch_profiler_is_left_alone(tmp_path):
    callback = CompileCallback("model", backend="aot_eager", **FAST)
    report = fit(tmp_path, LossInForward(), callback, profiler="pytorch")
    assert "graph_coverage" not in report["anatomy"]
    assert report["summary"]["batches"] == 12


def test_resume_keeps_the_eager_reference(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    first = CompileCallback("model", backend="aot_eager", **FAST)
    trainer = make_trainer(tmp_path / "a", [first, checkpoint], max_epochs=1, enable_checkpointing=True)
    trainer.fit(LossInForward(), loader(batch_size=8))
    second = CompileCallback("model", backend="aot_eager", **FAST)
    trainer = make_trainer(tmp_path / "b", [second], max_epochs=2)
    trainer.fit(LossInForward(), loader(batch_size=8), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    anatomy = second.last_report["anatomy"]
    assert anatomy["step_ops"] == first.last_report["anatomy"]["step_ops"]
    assert anatomy["graph_coverage"] == 1.0


def test_the_anatomy_samples_print_nothing_a_users_profiler_would(tmp_path, capfd):
    """Torch's profiler prints ``profiler_start`` / ``profiler_stop`` lines at each start and stop (torch
    2.14 on CPU): a profiler of the user's still does; the callback's samples (step samples and
    between-steps probes) must not."""
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    profiler.start()
    torch.ones(2) + 1
    profiler.stop()
    if "profiler_start" not in capfd.readouterr().err:
        pytest.skip(f"torch {torch.__version__}'s profiler prints nothing here: nothing to silence")
    callback = CompileCallback("model", backend="aot_eager", **FAST)
    fit(tmp_path, LossInForward(), callback, epochs=2)
    assert callback.last_report["anatomy"]["step_ops"] > 0  # the samples ran
    assert "profiler_start" not in capfd.readouterr().err
