"""The runner end to end: the tiny configs train a few steps through `run`, leaving TensorBoard event
files with the callback's scalars and its compile_report.json under the run dir."""

from __future__ import annotations

import json
import os

import pytest

from recipes import run
from recipes.__main__ import main
from tests.conftest import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A few steps with the callback's mechanics but little compiling: backend "eager" runs dynamo's capture
# and accounting without code generation. 1 warm-up + 2 eager steps, compile, 1 warm-up, 2 timed steps.
QUICK = [
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=2",
    "trainer.enable_progress_bar=false",
    "callback.backend=eager",
    "callback.eager_baseline_steps=2",
    "callback.warmup_steps=1",
    "callback.log_every_n_steps=2",
]
RECIPES = {
    "gpt_tiny": ["data.max_bytes=50000", "callback.regions=[transformer.h.*]"],
    "gpt_tiny_varlen": ["data.max_bytes=50000", "callback.regions=[transformer.h.*]"],
    "cv_tiny": ["data.num_samples=128", "data.batch_size=8", "data.image_size=16", "callback.regions=model"],
}
COMPILE_TAGS = ["compile/speedup", "compile/graphs", "compile/recompiles", "compile/compile_time_s"]


def config_path(name: str) -> str:
    return os.path.join(ROOT, "configs", f"{name}.yaml")


@pytest.mark.parametrize("name", ["gpt_tiny", "cv_tiny"])
def test_tiny_config_trains_and_leaves_logs_and_report(name, tmp_path, capsys):
    result = run(config_path(name), [f"run_dir={tmp_path}", *QUICK, *RECIPES[name]])

    assert result["global_step"] == 6
    assert result["steady_steps"] == 6 and result["steady_step_ms"] > 0
    assert result["log_dir"] == os.path.join(str(tmp_path), "version_0")
    scalars = read_scalars(result["log_dir"])
    missing = [tag for tag in COMPILE_TAGS + ["train/loss", "val/loss"] if tag not in scalars]
    assert not missing, f"missing {missing}; have {sorted(scalars)}"
    assert scalars["compile/graphs"][-1][1] >= 1

    assert result["report_path"] == os.path.join(result["log_dir"], "compile_report.json")
    with open(result["report_path"]) as handle:
        report = json.load(handle)
    assert report["summary"]["batches"] == 6
    assert os.listdir(os.path.join(result["log_dir"], "checkpoints")), "a checkpoint (with the callback's state)"

    printed = capsys.readouterr().out
    assert f"TensorBoard logs: {result['log_dir']}" in printed
    assert f"--logdir {tmp_path}" in printed

    # Throughput of the same timed steps, logged every log_every_n_steps and printed at the end; no MFU
    # on a CPU (no peak assumed), and the line says so.
    rate = "train/tokens_per_sec" if name == "gpt_tiny" else "train/samples_per_sec"
    steps = [step for step, _ in scalars[rate]]
    assert len(steps) == 3 and steps == [step for step, _ in scalars["train/loss"]], (steps, scalars["train/loss"])
    assert all(value > 0 for _, value in scalars[rate])
    assert "train/mfu" not in scalars
    throughput = result["throughput"]
    if name == "gpt_tiny":
        assert f"throughput:       {throughput['tokens_per_sec']:,.0f} tokens/s (" in printed
    else:
        assert f"throughput:       {throughput['samples_per_sec']:,.1f} images/s" in printed
    assert ", MFU – (no peak FLOP/s assumed on cpu)" in printed


def test_gpt_varlen_run_logs_perplexity_and_sees_the_length_change(tmp_path):
    # 10 steps: lengths change every batch, so steps that compile (untimed) leave few to time the speedup.
    overrides = [f"run_dir={tmp_path}", *QUICK, *RECIPES["gpt_tiny_varlen"], "trainer.max_steps=10"]
    result = run(config_path("gpt_tiny_varlen"), overrides)
    scalars = read_scalars(result["log_dir"])
    missing = [tag for tag in COMPILE_TAGS + ["val/perplexity"] if tag not in scalars]
    assert not missing, f"missing {missing}; have {sorted(scalars)}"
    # The sequence length changes from batch to batch, and dynamo's guards notice.
    causes = [cause["reason"] for cause in result["report"]["recompile_causes"]]
    assert any("size" in cause for cause in causes), causes


def test_command_line_runs_without_the_callback_as_plain_eager(tmp_path, capsys):
    overrides = [f"run_dir={tmp_path}", "callback_enabled=false", *QUICK, *RECIPES["gpt_tiny"]]
    assert main([config_path("gpt_tiny"), *overrides]) == 0
    printed = capsys.readouterr().out
    assert "compile report:   (none: callback disabled" in printed
    # Every run ends with its steady step time, so eager and compiled runs of a recipe compare directly.
    assert "6 steps in" in printed and "(median step of the last 6: " in printed
    scalars = read_scalars(os.path.join(tmp_path, "version_0"))
    assert "train/loss" in scalars
    assert not [tag for tag in scalars if tag.startswith("compile/")]
    assert not os.path.exists(os.path.join(tmp_path, "version_0", "compile_report.json"))


def test_gpt_recipe_trains_sharded_with_fsdp2(tmp_path, monkeypatch):
    # trainer.strategy=model_parallel: the recipe shards each block and the root (FSDP2) in
    # configure_model; one CPU process (gloo) here, two in tests/test_sharded.py. The callback tries and
    # verifies the whole model on the shards.
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from recipes.gpt import GPTModule

    sharded = []
    configure_model = GPTModule.configure_model

    def recorded(self):
        configure_model(self)
        sharded.append(all(isinstance(m, FSDPModule) for m in [self, *self.transformer.h]))

    monkeypatch.setattr(GPTModule, "configure_model", recorded)
    overrides = [
        "trainer.strategy=model_parallel", "trainer.devices=1", "trainer.accelerator=cpu", "trainer.max_steps=40",
        f"run_dir={tmp_path}", "callback.backend=eager", "callback.eager_baseline_steps=4", "callback.trial_steps=4",
        "callback.warmup_steps=1", "trainer.enable_checkpointing=false", "trainer.limit_val_batches=0"]
    environment = dict(os.environ)  # the strategy sets MASTER_PORT & co.: later fits must pick their own
    try:
        result = run(config_path("gpt_tiny"), overrides)
        assert dist.is_initialized()  # the strategy's own process group
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)
    report = json.loads(next(tmp_path.rglob("compile_report.json")).read_text())
    whole = [d for d in report["decisions"] if d["region"] == "model"]
    assert whole and whole[0]["verified"] is True, report["decisions"]
    assert result and sharded and all(sharded), sharded  # each block and the root really were sharded


def test_model_parallel_is_refused_where_it_cannot_run():
    from recipes.config import ConfigError, load_config
    from recipes.train import build_strategy

    with pytest.raises(ConfigError, match="trainer.devices=<count>"):
        build_strategy(load_config("configs/gpt_tiny.yaml", ["trainer.strategy=model_parallel", "trainer.devices=auto"]))
    with pytest.raises(ConfigError, match="does not shard itself"):
        build_strategy(load_config("configs/cv_tiny.yaml", ["trainer.strategy=model_parallel", "trainer.devices=2"]))
    assert build_strategy(load_config("configs/gpt_tiny.yaml", [])) == "auto"
