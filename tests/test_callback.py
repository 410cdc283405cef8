import json
import os

import pytest
import torch

from compile_callback import CompileCallback, torch_internals
from tests.conftest import BreakingBlock, TinyModel, VariableBatchDataset, loader, make_trainer, read_scalars, read_text

CONTRACT_TAGS = [
    "compile/speedup",
    "compile/step_time_ms",
    "compile/eager_step_time_ms",
    "compile/compile_time_s",
    "compile/graphs",
    "compile/graph_breaks",
    "compile/recompiles",
    "compile/recompiles_epoch",
    "compile/eager_fallbacks",
    "compile/regions_compiled",
    "compile/regions_reverted",
]


def fixed(regions, **kwargs) -> CompileCallback:
    defaults = dict(backend="eager", eager_baseline_steps=3, warmup_steps=1, log_every_n_steps=2)
    defaults.update(kwargs)
    return CompileCallback(regions, **defaults)


def test_tensorboard_has_contract_tags_and_json_matches(tmp_path):
    callback = fixed(["blocks.*", "head"])
    model = TinyModel(block=BreakingBlock)
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(model, loader())
    log_dir = trainer.logger.log_dir
    scalars = read_scalars(log_dir)
    missing = [tag for tag in CONTRACT_TAGS if tag not in scalars]
    assert not missing, f"missing tags {missing}; have {sorted(scalars)}"
    with open(os.path.join(log_dir, "compile_report.json")) as handle:
        report = json.load(handle)
    summary = report["summary"]
    final_step = trainer.global_step
    last = {tag: values[-1] for tag, values in scalars.items()}
    assert last["compile/graphs"] == (final_step, summary["graphs"])
    assert last["compile/graph_breaks"] == (final_step, summary["graph_breaks"])
    assert last["compile/recompiles"] == (final_step, summary["recompiles"])
    assert last["compile/speedup"][1] == pytest.approx(summary["speedup"], rel=1e-6)
    assert summary["graph_breaks"] > 0
    assert report["graph_break_reasons"][0]["region"] == "blocks.*"
    texts = read_text(log_dir, "compile/report")
    assert len(texts) == 3  # updated at the end of each of the 2 epochs, and at the end of fit
    assert "### Decisions" in texts[-1] and "blocks.*" in texts[-1]
    assert scalars["compile/region/blocks.N/graphs"][-1][1] == report["regions"]["blocks.*"]["graphs"]


def test_counts_equal_dynamos_own_in_a_real_fit(tmp_path):
    graphs_before, breaks_before = torch_internals.unique_graphs(), torch_internals.graph_break_count()
    callback = fixed(["blocks.*"], eager_baseline_steps=0, dynamic=False)
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(TinyModel(block=BreakingBlock), loader(VariableBatchDataset([4, 6]), batch_size=None))
    summary = callback.last_report["summary"]
    assert summary["graphs"] == torch_internals.unique_graphs() - graphs_before
    assert summary["graph_breaks"] == torch_internals.graph_break_count() - breaks_before
    assert summary["recompiles"] >= 1
    causes = callback.last_report["recompile_causes"]
    assert any("changed 4 → 6" in cause["reason"] for cause in causes), causes


def test_checkpoint_keeps_keys_and_loads_into_plain_model(tmp_path):
    callback = fixed(["blocks.*", "head"], eager_baseline_steps=0)
    model = TinyModel()
    plain_keys = list(TinyModel().state_dict())
    trainer = make_trainer(tmp_path, [callback], enable_checkpointing=True)
    trainer.fit(model, loader())
    path = trainer.checkpoint_callback.best_model_path
    checkpoint = torch.load(path, weights_only=False)
    assert list(checkpoint["state_dict"]) == plain_keys
    fresh = TinyModel()
    fresh.load_state_dict(checkpoint["state_dict"])
    assert not any(torch_internals.is_module_compiled(m) for m in fresh.modules())
    x = torch.randn(3, 8)
    assert torch.equal(fresh(x), model(x))


def test_resume_restores_decisions_and_counters(tmp_path):
    first = fixed(["head"])
    trainer = make_trainer(tmp_path, [first], max_epochs=1, enable_checkpointing=True)
    trainer.fit(TinyModel(), loader())
    path = trainer.checkpoint_callback.best_model_path
    graphs_first = first.last_report["summary"]["graphs"]
    torch._dynamo.reset()
    second = fixed(["head"])
    trainer = make_trainer(tmp_path, [second], max_epochs=2, enable_checkpointing=True)
    trainer.fit(TinyModel(), loader(), ckpt_path=path)
    report = second.last_report
    assert len(report["decisions"]) == 1 and report["decisions"][0]["step"] == first.last_report["decisions"][0]["step"]
    assert report["summary"]["batches"] == 2 * first.last_report["summary"]["batches"]
    assert report["summary"]["graphs"] >= graphs_first + 1  # the resumed run compiles again and counts on


def test_no_logger_writes_report_to_root_dir(tmp_path):
    callback = fixed(["head"])
    trainer = make_trainer(tmp_path, [callback], logger=False)
    trainer.fit(TinyModel(), loader())
    with open(tmp_path / "compile_report.json") as handle:
        written = json.load(handle)
    assert written == json.loads(json.dumps(callback.last_report))  # the whole report, as built at the end of fit
    assert written["summary"]["batches"] == 12 and written["summary"]["graphs"] == 1
    (decision,) = written["decisions"]
    assert (decision["region"], decision["kept"], decision["reason"]) == ("head", True, "named in regions=")
    assert written["regions"]["head"]["graphs"] == 1


def test_report_survives_an_exception_in_user_code(tmp_path):
    class Exploding(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 6:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    callback = fixed(["head"])
    trainer = make_trainer(tmp_path, [callback])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Exploding(), loader())
    with open(os.path.join(trainer.logger.log_dir, "compile_report.json")) as handle:
        assert json.load(handle)["summary"]["batches"] == 6


def test_unknown_region_fails_before_training(tmp_path):
    model = TinyModel()
    trainer = make_trainer(tmp_path, [fixed(["heads"])])
    with pytest.raises(ValueError, match=r"region 'heads' matches no submodule of TinyModel\. Close matches: 'head'"):
        trainer.fit(model, loader())
    assert model.batches_seen == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(regions="blocks"), r"`regions` must be 'auto', 'model' or a list .* pass a list: regions=\['blocks'\]"),
        (dict(regions=[]), r"`regions` must be 'auto', 'model' or a non-empty list"),
        (dict(regions=["head", "head"]), r"`regions` names a region twice"),
        (dict(mode="fast"), r"`mode` must be one of 'auto', 'default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'; got 'fast'"),
        (dict(mode="reduce-overhead", backend="eager"), r"needs backend='inductor'"),
        (dict(mode="max-autotune", options={"a": 1}), r"`options` and `mode` cannot be given together"),
        (dict(backend="aot_eager", options={"max_autotune": True}), r"`options` are Inductor's and backend='aot_eager' drops them"),
        (dict(eager_baseline_steps=-1), r"`eager_baseline_steps` must be an integer >= 0; got -1"),
        (dict(warmup_steps=1.5), r"`warmup_steps` must be an integer >= 0; got 1.5"),
        (dict(log_every_n_steps=0), r"`log_every_n_steps` must be an integer >= 1; got 0"),
        (dict(fullgraph="yes"), r"`fullgraph` must be True or False; got 'yes'"),
        (dict(dynamic="auto"), r"`dynamic` must be True, False or None; got 'auto'"),
        (dict(backend=""), r"`backend` must be a torch.compile backend name"),
        (dict(verify=False, verify_tolerance=0.01), r"`verify_tolerance=0.01` has no effect with verify=False"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileCallback(**kwargs)


@pytest.mark.slow
def test_inductor_compiles_for_real_and_matches_eager(tmp_path):
    torch.manual_seed(0)
    eager_model = TinyModel()
    compiled_model = TinyModel()
    compiled_model.load_state_dict(eager_model.state_dict())
    callback = CompileCallback(["blocks.*"], backend="inductor", eager_baseline_steps=0, warmup_steps=0)
    trainer = make_trainer(tmp_path, [callback], max_steps=4)
    trainer.fit(compiled_model, loader(shuffle=False))
    eager_trainer = make_trainer(tmp_path / "eager", [], max_steps=4)
    eager_trainer.fit(eager_model, loader(shuffle=False))
    summary = callback.last_report["summary"]
    assert summary["graphs"] >= 1 and summary["compile_time_s"] > 0
    for (name, p_compiled), p_eager in zip(compiled_model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p_compiled, p_eager, rtol=1e-4, atol=1e-5, msg=name)


def test_keyboard_interrupt_still_leaves_the_report(tmp_path):
    class Interrupted(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 5:
                raise KeyboardInterrupt
            return super().training_step(batch, batch_idx)

    callback = fixed(["head"])
    trainer = make_trainer(tmp_path, [callback])
    with pytest.raises(SystemExit):  # Lightning turns Ctrl-C into a graceful stop, then exits
        trainer.fit(Interrupted(), loader())
    with open(os.path.join(trainer.logger.log_dir, "compile_report.json")) as handle:
        assert json.load(handle)["summary"]["batches"] == 5
    assert "compile/graphs" in read_scalars(trainer.logger.log_dir)


def test_model_without_trainable_parameters_is_refused(tmp_path):
    model = TinyModel()
    model.requires_grad_(False)
    trainer = make_trainer(tmp_path, [fixed(["head"])])
    with pytest.raises(ValueError, match=r"CompileCallback found no trainable parameters in TinyModel"):
        trainer.fit(model, loader())
