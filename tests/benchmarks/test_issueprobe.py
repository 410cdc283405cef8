"""``benchmarks.diagnostics.issueprobe``'s model: the recipe's GPT with its forward written out in ``training_step``,
so that what it probes is the recipe's network with no whole-model candidate."""

import pytest
import torch

from benchmarks.diagnostics.issueprobe import BlocksOnlyGPT, main
from benchmarks.workloads import pool_loader
from compile_callback import CompileCallback
from recipes.config import GPTModelConfig, OptimConfig
from tests.conftest import make_trainer


def tiny() -> BlocksOnlyGPT:
    torch.manual_seed(0)
    return BlocksOnlyGPT(GPTModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=256), OptimConfig())


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    tokens = torch.randint(256, (2, 17), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}


def test_its_training_step_is_the_recipes_loss():
    module, held = tiny(), batch()
    torch.testing.assert_close(module.training_step(held, 0), module(held["input_ids"], held["labels"])[1])


def test_the_planner_finds_no_whole_model_to_try_and_tries_the_blocks(tmp_path):
    callback = CompileCallback(backend="eager", eager_baseline_steps=2, warmup_steps=1, trial_steps=3, max_trials=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=30, limit_val_batches=0, logger=False)
    trainer.fit(tiny(), pool_loader([batch(seed) for seed in range(4)], 30))
    report = callback.last_report
    notes = report["plan"]["notes"]
    assert any(n.startswith("whole model not tried: training_step does not call the LightningModule's forward, and no "
                            "one submodule holds its step") for n in notes), notes  # lm_head, the only child it calls, is small
    assert [d["region"] for d in report["decisions"]][:1] == ["transformer.h.*"], report["decisions"]


@pytest.mark.parametrize("shapes, says", [("4x", "is not BATCHxSEQ"), ("0x64", "at least 1"), ("4,8x8", "is not BATCHxSEQ")])
def test_a_shape_that_is_not_batch_x_sequence_is_named(shapes, says, capsys):
    with pytest.raises(SystemExit):
        main(["--shapes", shapes])
    assert says in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal where there is no GPU")
def test_it_refuses_to_run_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        main(["--shapes", "1x64"])
    assert "a CUDA device is needed" in capsys.readouterr().err
