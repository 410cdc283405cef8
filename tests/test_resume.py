"""Resuming from a checkpoint: the saved plan is compiled again, at once, without profiling or trials."""

import torch

from compile_callback import CompileCallback, torch_internals
from tests.conftest import FasterCompiled, loader, make_trainer


def auto_callback() -> CompileCallback:
    return CompileCallback(backend="eager", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=2,
                           log_every_n_steps=4)


def test_the_compiled_forward_skips_the_sleep():
    """The premise of FasterCompiled, on this torch: compiled calls run no Python of the forward."""
    model = FasterCompiled()
    x = torch.randn(4, 8)
    model(x)
    assert model.eager_forwards == 1
    graphs = torch_internals.unique_graphs()  # dynamo's counter: reset() does not clear it (torch 2.14)
    model.compile(backend="eager")
    for _ in range(3):
        model(x)
    assert model.eager_forwards == 1 and torch_internals.unique_graphs() == graphs + 1


def test_resume_compiles_the_saved_plan_without_new_trials(tmp_path):
    first = auto_callback()
    trainer = make_trainer(tmp_path, [first], max_epochs=2, enable_checkpointing=True)
    trainer.fit(FasterCompiled(), loader(batch_size=8))
    path = trainer.checkpoint_callback.best_model_path
    decisions = first.last_report["decisions"]
    kept = [d["region"] for d in decisions if d["kept"]]
    assert kept == ["model"], decisions  # 100 ms a step faster: kept, and nothing tried after the whole model

    torch._dynamo.reset()  # a new process, as far as dynamo knows: nothing compiled
    graphs = torch_internals.unique_graphs()  # dynamo's counter, which reset() leaves (torch 2.14)
    second = auto_callback()
    model = FasterCompiled()
    trainer = make_trainer(tmp_path, [second], max_epochs=3, enable_checkpointing=True)
    trainer.fit(model, loader(batch_size=8), ckpt_path=path)
    assert model.batches_seen == 12  # the third epoch only
    assert second.last_report["decisions"] == decisions  # no new profiling, no new trials
    assert second.run.planner.profiler is None and second.run.timer.count("eager") == 0
    assert [r.name for r in second.run.planner.regions] == ["model"]
    assert torch_internals.is_module_compiled(model)
    # The plan really ran compiled: dynamo made a graph in this fit, and no forward ran as Python.
    assert torch_internals.unique_graphs() == graphs + 1
    assert model.eager_forwards == 0
    assert second.last_report["summary"]["batches"] == 3 * 12


def test_a_plan_chosen_under_other_arguments_is_chosen_again_on_resume(tmp_path):
    """Resumed with another ``min_speedup`` (or backend, mode, options...), the checkpoint's plan is not what was
    asked for: the fit says so and runs its own trials (batches and recompile counts carry on)."""
    first = auto_callback()
    trainer = make_trainer(tmp_path, [first], max_epochs=2, enable_checkpointing=True)
    trainer.fit(FasterCompiled(), loader(batch_size=8))
    path = trainer.checkpoint_callback.best_model_path
    torch._dynamo.reset()
    second = CompileCallback(backend="eager", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=2,
                             log_every_n_steps=4, min_speedup=1.5)
    trainer = make_trainer(tmp_path, [second], max_epochs=4, enable_checkpointing=True)
    trainer.fit(FasterCompiled(), loader(batch_size=8), ckpt_path=path)
    report = second.last_report
    assert "the checkpoint's compile plan was chosen with other arguments (min_speedup): chosen again in this fit" in (
        report["plan"]["notes"]), report["plan"]["notes"]
    assert second.run.timer.count("eager") > 0 and [d["step"] for d in report["decisions"]] != [
        d["step"] for d in first.last_report["decisions"]], report["decisions"]  # its own trials, later in the run
    assert report["summary"]["batches"] == 4 * 12


def test_a_mode_saved_before_plans_kept_their_options_compiles_as_options_beside_the_runs():
    """A plan saved before each region's options were kept (mode only), resumed with Inductor ``options``: its
    mode's options join the run's (torch.compile takes no mode beside options)."""
    from compile_callback.regions import CompileOptions
    from tests.test_mode_trial import Model, make_planner

    x = torch.randn(4, 8)
    planner = make_planner(Model(), x, trial_ms=1.0)
    planner.options, planner.regions = CompileOptions(backend="inductor", options={"epilogue_fusion": True}), []
    planner._apply_saved_plan([{"name": "head", "modules": ["head"], "mode": "reduce-overhead", "dynamic": None}])
    (region,) = planner.regions
    assert region.compiled_with.mode is None
    assert region.compiled_with.options == {"epilogue_fusion": True, "triton.cudagraphs": True}


def test_one_callback_through_two_fits_decides_alike_in_each(tmp_path):
    """A notebook or a sweep reuses the callback: the second fit of a new model takes its own eager
    baseline and decides at the same batch, with nothing carried over (batches, notes, churn)."""
    callback = auto_callback()
    reports, eager_steps = [], []
    for _ in range(2):
        torch._dynamo.reset()
        make_trainer(tmp_path, [callback], max_epochs=2).fit(FasterCompiled(), loader(batch_size=8))
        reports.append(callback.last_report)
        eager_steps.append(callback.run.timer.count("eager"))
    first, second = reports
    assert [d["step"] for d in second["decisions"]] == [d["step"] for d in first["decisions"]], reports
    assert [(d["region"], d["kept"]) for d in second["decisions"]] == [("model", True)]
    assert second["summary"]["batches"] == first["summary"]["batches"] == 24
    assert second["summary"]["speedup"] is not None and second["summary"]["speedup"] > 1.5
    assert eager_steps[0] == eager_steps[1] > 0  # the second fit timed its own eager baseline


def test_named_regions_are_not_chosen_again_for_arguments_that_do_not_choose_them():
    """``min_speedup`` and ``verify`` choose among trials: named regions have none, so changing them keeps the plan;
    a mode or options change still does not."""
    named = [CompileCallback(["blocks.*"], min_speedup=s).config.plan_options() for s in (1.1, 1.5)]
    assert named[0] == named[1] and "min_speedup" not in named[0]
    assert CompileCallback(["blocks.*"], mode="max-autotune").config.plan_options() != named[0]
    assert CompileCallback(["blocks.*"], pad="auto").config.plan_options() != named[0]  # other shapes
    assert CompileCallback(min_speedup=1.5).config.plan_options()["min_speedup"] == 1.5  # auto: they choose


def test_a_checkpoint_without_recorded_arguments_is_applied_as_saved_and_says_so(tmp_path):
    first = auto_callback()
    trainer = make_trainer(tmp_path, [first], max_epochs=2, enable_checkpointing=True)
    trainer.fit(FasterCompiled(), loader(batch_size=8))
    path = trainer.checkpoint_callback.best_model_path
    checkpoint = torch.load(path, weights_only=False)
    (state,) = [v for k, v in checkpoint["callbacks"].items() if "CompileCallback" in k]
    del state["plan_options"]  # as a checkpoint saved before they were recorded
    torch.save(checkpoint, path)
    torch._dynamo.reset()
    second = auto_callback()
    make_trainer(tmp_path, [second], max_epochs=3, enable_checkpointing=True).fit(FasterCompiled(), loader(batch_size=8),
                                                                                  ckpt_path=path)
    assert second.last_report["decisions"] == first.last_report["decisions"]  # no new trials
    assert any(n.startswith("the checkpoint was saved before its compile arguments were recorded")
               for n in second.last_report["plan"]["notes"])
