"""regions="auto": profile, trial, verify, keep or revert — with real Trainers and real compiles."""

import json
import statistics
import time

import lightning as L
import pytest
import torch
from torch import nn

from compile_callback import CompileCallback, torch_internals
from compile_callback.report import render_table
from tests.conftest import TinyModel, loader, make_trainer


def _sleepy(gm, example_inputs):
    def run(*args):
        time.sleep(0.05)  # a compiled region 50 ms slower than eager
        return gm.forward(*args)

    return run


def _slower(gm, example_inputs):
    def run(*args):
        time.sleep(0.003)  # a compiled region 3 ms slower than eager
        return gm.forward(*args)

    return run


def _perturbed(gm, example_inputs):
    def run(*args):
        outputs = gm.forward(*args)
        return tuple(o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outputs) if isinstance(outputs, (tuple, list)) else outputs * 1.01

    return run


def _raising(gm, example_inputs):
    raise RuntimeError("backend exploded while compiling")


@pytest.fixture(autouse=True)
def test_backends():
    from torch._dynamo import register_backend  # the documented way to add a custom backend

    for name, fn in [("test_sleepy", _sleepy), ("test_slower", _slower), ("test_perturbed", _perturbed),
                     ("test_raising", _raising)]:
        try:
            register_backend(compiler_fn=fn, name=name)
        except Exception:
            pass  # registered by an earlier test in this process
    yield


@pytest.fixture(autouse=True)
def one_thread():
    """Two processes' OpenMP teams on two cores spin against each other and make timings meaningless."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def auto(**kwargs) -> CompileCallback:
    defaults = dict(eager_baseline_steps=4, warmup_steps=1, trial_steps=4, log_every_n_steps=5, min_speedup=1.03)
    defaults.update(kwargs)
    return CompileCallback(**defaults)


def fit(tmp_path, callback, model=None, **trainer_kwargs):
    model = model or TinyModel()
    trainer = make_trainer(tmp_path, [callback], max_epochs=trainer_kwargs.pop("max_epochs", 3), **trainer_kwargs)
    trainer.fit(model, loader(batch_size=8))
    return callback.last_report, model


def test_slower_region_is_reverted(tmp_path):
    report, model = fit(tmp_path, auto(backend="test_sleepy", max_trials=2))
    decisions = report["decisions"]
    assert decisions[0]["region"] == "model" and not decisions[0]["kept"]
    assert decisions[0]["reason"].startswith("not faster")
    assert all(not d["kept"] for d in decisions)
    assert not any(torch_internals.is_module_compiled(m) for m in model.modules())
    assert report["summary"]["regions_reverted"] == len(decisions) >= 2


def test_region_with_wrong_numerics_is_reverted(tmp_path):
    report, model = fit(tmp_path, auto(backend="test_perturbed", max_trials=1))
    decision = report["decisions"][0]
    assert not decision["kept"]
    assert decision["reason"].startswith("numerics differ from eager: output: RMSE against the reference")
    assert not torch_internals.is_module_compiled(model)
    anatomy = report["anatomy"]
    assert anatomy["verification_pass_rate"] == 0.0 and decision["verified"] is False
    assert anatomy["worst_rel_error"] == {"error": decision["max_rel_error"], "region": decision["region"],
                                          "mode": decision["mode"], "kept": False, "error_in": decision["error_in"]}
    assert decision["reason"] == f"numerics differ from eager: {decision['error_in']}; max relative error " \
                                 f"{decision['max_rel_error']:.2e}, tol 1e-03"  # the rule and the tensor, named once
    assert decision["max_rel_error"] > 1e-3


def test_region_whose_compile_raises_is_reverted_and_training_continues(tmp_path):
    model = TinyModel()
    report, model = fit(tmp_path, auto(backend="test_raising", max_trials=2), model=model)
    assert report["decisions"][0]["reason"].startswith("compile failed: ")
    assert "backend exploded" in report["decisions"][0]["reason"]
    assert report["decisions"][0]["verified"] is None  # never verified: it did not compile
    assert model.batches_seen == 3 * 12  # every batch of 3 epochs trained, none skipped or repeated


def test_repeated_blocks_are_one_decision(tmp_path):
    report, _ = fit(tmp_path, auto(backend="test_sleepy", max_trials=3))
    regions = [d["region"] for d in report["decisions"]]
    assert "blocks.*" in regions
    block_decision = next(d for d in report["decisions"] if d["region"] == "blocks.*")
    assert block_decision["modules"] == ["blocks.0", "blocks.1", "blocks.2"]
    assert not any(r.startswith("blocks.0") for r in regions)


class Elementwise(L.LightningModule):
    """Ninety memory-bound elementwise ops over a large tensor: eager makes ninety passes over memory, inductor one."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.batches_seen = 0

    def forward(self, x):
        for _ in range(30):
            x = torch.relu(x * self.scale + 0.1) - 0.05  # memory-bound: fusion saves a pass each
        return x

    def training_step(self, batch, batch_idx):
        self.batches_seen += 1
        x = batch[0].repeat(8192, 1)
        return self(x).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


@pytest.mark.slow
def test_region_that_helps_is_kept_with_inductor(tmp_path):
    from tests.conftest import PLANNED, StopWhenPlanned

    callback = auto(backend="inductor", eager_baseline_steps=6, trial_steps=6, max_trials=1)
    model = Elementwise()
    trainer = make_trainer(tmp_path, [callback, StopWhenPlanned(callback, after=10)], **PLANNED)
    trainer.fit(model, loader(batch_size=8))
    decision = callback.last_report["decisions"][0]
    assert decision["region"] == "model" and decision["kept"], decision["reason"]
    assert decision["speedup"] > 1.3 and decision["max_rel_error"] <= 1e-3
    assert callback.last_report["summary"]["speedup"] > 1.0
    assert torch_internals.is_module_compiled(model)


def test_verification_changes_nothing(tmp_path):
    """Parameters, optimizer state and RNG after training equal a run where verification was off."""

    class WithDropoutAndNorm(TinyModel):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(16)
            self.drop = nn.Dropout(0.3)

        def forward(self, x):
            x = self.drop(self.norm(self.embed(x)))
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    def run(callback, path):
        L.seed_everything(7)
        model = WithDropoutAndNorm()
        trainer = make_trainer(path, [callback] if callback else [], max_epochs=3)
        trainer.fit(model, loader(batch_size=8, shuffle=False))
        optimizer_state = trainer.optimizers[0].state_dict()
        return model.state_dict(), optimizer_state, torch.get_rng_state(), callback.last_report if callback else None

    # The "eager" backend runs the same ops as eager, so any difference would come from verification.
    state_on, optim_on, rng_on, report_on = run(auto(backend="eager", max_trials=2), tmp_path / "on")
    state_off, optim_off, rng_off, _ = run(None, tmp_path / "off")
    assert report_on["decisions"][0]["max_rel_error"] == 0.0  # verified, and the eager backend is exact
    assert "num_batches_tracked" in "".join(state_on)
    for key in state_on:
        assert torch.equal(state_on[key], state_off[key]), key
    assert torch.equal(rng_on, rng_off)
    assert str(optim_on) == str(optim_off)


def test_unverified_trials_report_no_error_figure(tmp_path):
    report, _ = fit(tmp_path, auto(backend="eager", verify=False, max_trials=1))
    assert report["decisions"][0]["max_rel_error"] is None


def test_auto_needs_a_baseline():
    with pytest.raises(ValueError, match=r"`eager_baseline_steps` must be >= 2 with regions='auto'"):
        CompileCallback(eager_baseline_steps=0)


def test_short_run_skips_trials_it_cannot_finish(tmp_path):
    callback = auto(backend="eager")
    trainer = make_trainer(tmp_path, [callback], max_steps=12)
    trainer.fit(TinyModel(), loader(batch_size=8))
    decisions = callback.last_report["decisions"]
    assert decisions and all(d["reason"] == "skipped: the run ends before a trial could finish" for d in decisions)


def test_a_skipped_trial_is_priced_with_the_set_up_the_tried_ones_took(tmp_path):
    # Verification's stop beyond the compile is a trial's cost too (payback.CompileCosts.check_s).
    report, _ = fit(tmp_path, auto(backend="test_sleepy", max_trials=3), max_epochs=8)
    tried = [d for d in report["decisions"] if d["setup_s"]]
    skipped = [d for d in report["decisions"] if d["reason"].startswith("skipped: ") and "batches left save" in d["reason"]]
    assert tried and skipped, report["decisions"]
    check = statistics.mean(d["setup_s"]["verification in all"] - d["compile_seconds"] for d in tried)
    assert all(f", checking it ~{check:.1f} s more (as this run's trials did)" in d["reason"] for d in skipped), skipped


@pytest.mark.slow
def test_warm_restart_skips_trials_and_compiles_faster(tmp_path):
    from tests.conftest import PLANNED, StopWhenPlanned

    def run(path):
        torch._dynamo.reset()
        callback = auto(backend="inductor", cache_dir=str(tmp_path / "cache"), eager_baseline_steps=4, max_trials=1)
        trainer = make_trainer(path, [callback, StopWhenPlanned(callback, after=10)], **PLANNED)
        trainer.fit(Elementwise(), loader(batch_size=8))
        return callback.last_report

    cold = run(tmp_path / "cold")
    warm = run(tmp_path / "warm")
    # The same decisions, each saying how its fit's compile went: from scratch, then from the cache.
    assert [d["compile_cache"] for d in cold["decisions"] if d["kept"]] == ["cold"], cold["decisions"]
    assert [d["compile_cache"] for d in warm["decisions"] if d["kept"]] == ["warm"], warm["decisions"]
    assert [{**d, "compile_cache": None} for d in warm["decisions"]] == [{**d, "compile_cache": None} for d in cold["decisions"]]
    assert any(note.startswith("plan loaded from") for note in warm["plan"]["notes"])
    from compile_callback.report import cache_state, render_table

    assert " warm " in render_table(warm)
    assert warm["summary"]["speedup_priced"] == "trials"  # and the table says so beside the two medians
    assert "(the product of its trials, each beside the plan before it)" in render_table(warm).splitlines()[1]
    assert cache_state(0, 0) is None and cache_state(1, 3) == "partly warm (1 of 4 graphs from the cache)"
    assert warm["anatomy"]["cache_hit_rate"] > 0 and not cold["anatomy"]["cache_hit_rate"], (cold["anatomy"], warm["anatomy"])
    assert warm["summary"]["compile_time_s"] < 0.75 * cold["summary"]["compile_time_s"], (cold["summary"], warm["summary"])


def test_corrupt_plan_cache_is_ignored_with_a_warning_and_rebuilt(tmp_path):
    first = auto(backend="eager", cache_dir=str(tmp_path / "cache"), max_trials=1)
    make_trainer(tmp_path / "a", [first], max_epochs=3).fit(TinyModel(), loader(batch_size=8))
    (plan_file,) = (tmp_path / "cache").glob("compile_plan-*.json")
    plan_file.write_text("{not json")
    second = auto(backend="eager", cache_dir=str(tmp_path / "cache"), max_trials=1)
    with pytest.warns(UserWarning, match=r"ignores its cached plan and plans again: .* is not readable JSON"):
        make_trainer(tmp_path / "b", [second], max_epochs=3).fit(TinyModel(), loader(batch_size=8))
    assert second.run.planner.profiler is not None  # it profiled and tried again
    assert '"planner"' in plan_file.read_text()  # and wrote a good plan back


class LengthCostModel(L.LightningModule):
    """A step whose time is set by the batch's length (a sleep outside the compiled forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)

    def training_step(self, batch, batch_idx):
        time.sleep(batch.shape[1] * 2e-4)  # 25.6 ms for a length of 128, 1.6 ms for 8
        return self(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class MixShiftingBatches(torch.utils.data.Dataset):
    """Mostly long batches first (the eager baseline sees those), mostly short ones later (the trial)."""

    def __init__(self, steps: int) -> None:
        first, later = [128, 128, 8], [8, 8, 8, 128]
        self.lengths = [first[i % 3] if i < 12 else later[i % 4] for i in range(steps)]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(4, self.lengths[index], 16)


def test_trials_compare_steps_of_like_shapes(tmp_path):
    # The compiled region is 3 ms slower on every step. Plain medians would compare the baseline's long
    # batches (~27 ms) with the trial's short ones (~3 + 3 ms) and keep it as ~4x faster (~2.5x on a
    # loaded 2-core machine, whose per-step overhead is added to both); shape by shape it is slower,
    # and it is reverted.
    callback = auto(backend="test_slower", eager_baseline_steps=6, trial_steps=6, max_trials=1)
    data = torch.utils.data.DataLoader(MixShiftingBatches(80), batch_size=None)
    make_trainer(tmp_path, [callback], max_steps=80).fit(LengthCostModel(), data)
    decision = callback.run.planner.decisions[0]
    assert not decision.kept and decision.speedup < 1.0, decision
    assert any("batches come in 2 shapes" in note for note in callback.run.planner.notes)
    timer = callback.run.timer
    naive = statistics.median(timer.samples_ms("eager")) / statistics.median(timer.samples_ms("trial:0"))
    assert naive > 1.5  # what the windows' mixes alone would have made of it: a slower region "faster"


class EverChangingBatches(torch.utils.data.Dataset):
    """A new length every step: no shape recurs, so no trial step can be paired with a baseline step."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randn(4, 8 + index, 16)


def test_shapes_that_never_recur_are_compared_by_medians(tmp_path):
    # Nothing kept whatever a loaded host does to the timings (min_speedup out of any timing's reach).
    callback = auto(backend="eager", eager_baseline_steps=6, trial_steps=6, max_trials=1, min_speedup=1e6)
    data = torch.utils.data.DataLoader(EverChangingBatches(), batch_size=None)
    make_trainer(tmp_path, [callback], max_steps=40).fit(LengthCostModel(), data)
    assert any("too many to compare trials shape by shape" in note for note in callback.run.planner.notes)
    decision = callback.run.planner.decisions[0]
    assert decision.speedup is not None and decision.step_ms is not None  # every step timed, none skipped
    assert callback.run.timer.count("trial:0") >= 6 - 2  # all but the steps that compiled
    # Nothing was kept: the steps run the eager code, and the speedup says so.
    assert callback.last_report["summary"]["speedup_priced"] == "nothing compiled"
    assert callback.last_report["summary"]["speedup"] == 1.0
    # The table says why a step median may sit below eager's beside a 1.000x speedup (make run on CPU did).
    assert "speedup 1x (nothing compiled: the step and eager times beside it are both eager" in \
        render_table(callback.last_report)


def test_steady_speedup_prices_each_shape_by_its_own_eager_time(tmp_path):
    # Named regions (no trials to price the plan): the speedup is the eager baseline against the steady
    # steps. The baseline saw mostly long batches and the steady window mostly short ones, so plain
    # medians would call a compile that changes nothing (backend "eager") several times faster.
    callback = CompileCallback(["blocks"], backend="eager", eager_baseline_steps=6, warmup_steps=1, log_every_n_steps=100)
    data = torch.utils.data.DataLoader(MixShiftingBatches(60), batch_size=None)
    make_trainer(tmp_path, [callback], max_steps=60).fit(LengthCostModel(), data)
    metrics = callback.run.metrics()
    naive = metrics["compile/eager_step_time_ms"] / metrics["compile/step_time_ms"]
    assert naive > 2, naive  # what the two windows' mixes alone make of it (~5x idle, ~3x on a loaded 2-core machine)
    # Wide enough that a loaded 2-core machine cannot cross it, narrow enough to tell it from naive.
    assert 0.5 < metrics["compile/speedup"] < 2.0, metrics["compile/speedup"]
    summary = callback.last_report["summary"]
    assert summary["speedup_priced"] == "shape by shape" and summary["speedup"] == pytest.approx(metrics["compile/speedup"], rel=0.2)


def test_steady_steps_of_one_shape_skip_walking_the_batch(tmp_path):
    callback = auto(backend="test_slower", max_trials=1, min_speedup=1e6)  # nothing kept on any host
    fit(tmp_path, callback)
    assert callback.run._keys_wanted() is False
    assert callback.last_report["summary"]["speedup_priced"] == "nothing compiled"


def test_steady_speedup_is_priced_by_shape_only_where_most_steps_have_a_baseline_shape():
    from compile_callback.timing import steady_speedup

    def speedup(latest):
        by_shape: dict[str, list[float]] = {}
        for ms, key in latest:
            by_shape.setdefault(key, []).append(ms)
        eager = {"a": [10.0, 10.0], "b": [20.0, 20.0]}
        return steady_speedup(None, kept=True, eager_by_shape=eager, latest=by_shape, eager_ms=15.0, compiled_ms=5.0)

    # One step of 100 has a shape the baseline saw: pricing would rest on it alone.
    assert speedup([(5.0, "a")] + [(1.0, f"new{i}") for i in range(99)]) == (3.0, "medians")
    # Most do: each is priced by its own shape's eager median (a: 10 ms, now 5 ms).
    assert speedup([(5.0, "a")] * 60 + [(1.0, f"new{i}") for i in range(40)]) == (pytest.approx(2.0), "shape by shape")


def test_saved_plan_holds_what_runs_compiled_after_the_churn_policy_acted(tmp_path):
    import dataclasses

    from compile_callback import CompileOptions, compile_region, resolve_regions, revert_region

    callback = auto(backend="test_sleepy", min_speedup=1.0, max_trials=2)
    make_trainer(tmp_path, [callback], max_epochs=3).fit(TinyModel(), loader(batch_size=8))
    callback.run.planner.regions.clear()  # the trials reverted everything (slower): apply a plan by hand
    model_regions = resolve_regions(callback.run.planner.root, ["blocks.*", "head"])
    for item in model_regions:
        compile_region(item, CompileOptions(backend="eager"))
        callback.run.planner.regions.append(item)
    regions = [r for r in callback.run.planner.regions if r.is_compiled]
    assert regions, callback.last_report["decisions"]
    region = regions[0]
    callback.run.planner.recompile(region, dataclasses.replace(region.compiled_with, dynamic=True))  # on_recompile="dynamic"
    assert [(item["name"], item["dynamic"]) for item in callback.run.planner.state_dict()["plan"]][0] == (region.name, True)
    revert_region(region)  # on_recompile="eager": a resumed run must not compile it again
    assert region.name not in [item["name"] for item in callback.run.planner.state_dict()["plan"]]


def test_resumed_run_prices_its_steps_by_the_checkpoints_eager_medians(tmp_path):
    first = auto(backend="test_slower", eager_baseline_steps=6, trial_steps=6, max_trials=1, log_every_n_steps=100)
    data = torch.utils.data.DataLoader(MixShiftingBatches(40), batch_size=None)
    trainer = make_trainer(tmp_path, [first], max_epochs=1, enable_checkpointing=True)
    trainer.fit(LengthCostModel(), data)
    saved = first.state_dict()["eager_by_shape"]
    assert sorted(shapes[0][1] for shapes, _ in saved) == [8, 128]  # one median per batch shape
    second = auto(backend="test_slower", eager_baseline_steps=6, trial_steps=6, max_trials=1, log_every_n_steps=100)
    trainer = make_trainer(tmp_path, [second], max_epochs=2)
    trainer.fit(LengthCostModel(), data, ckpt_path=trainer_checkpoint(tmp_path))
    assert second.run.timer.count("eager") == 0  # no new baseline: the plan came from the checkpoint
    metrics = second.run.metrics()
    # The plan is priced by the first run's trials: here nothing was kept, so the eager code runs.
    assert second.last_report["summary"]["speedup_priced"] == "nothing compiled"
    assert metrics["compile/speedup"] == 1.0, metrics


def trainer_checkpoint(root) -> str:
    import glob

    return sorted(glob.glob(str(root / "**" / "*.ckpt"), recursive=True))[-1]


def test_warm_restart_prices_its_steps_by_the_cached_eager_medians(tmp_path):
    data = torch.utils.data.DataLoader(MixShiftingBatches(40), batch_size=None)

    def run(path):
        callback = auto(backend="test_slower", eager_baseline_steps=6, trial_steps=6, max_trials=1,
                        log_every_n_steps=100, cache_dir=str(tmp_path / "cache"))
        make_trainer(path, [callback], max_epochs=1).fit(LengthCostModel(), data)
        return callback

    run(tmp_path / "cold")
    (plan_file,) = (tmp_path / "cache").glob("compile_plan-*.json")
    saved = json.loads(plan_file.read_text())["eager_by_shape"]
    assert sorted(shapes[0][1] for shapes, _ in saved) == [8, 128]  # one median per batch shape
    warm = run(tmp_path / "warm")
    assert any(note.startswith("plan loaded from") for note in warm.last_report["plan"]["notes"])
    assert warm.run.timer.count("eager") == 0  # no baseline of its own
    assert warm.last_report["summary"]["speedup_priced"] == "nothing compiled"
    assert warm.run.metrics()["compile/speedup"] == 1.0, warm.run.metrics()
    # A file written before the medians were kept still loads; its steps are priced by medians.
    plan = json.loads(plan_file.read_text())
    plan_file.write_text(json.dumps({key: value for key, value in plan.items() if key != "eager_by_shape"}))
    older = run(tmp_path / "older")
    assert older.run.timer.count("eager") == 0 and older.last_report["summary"]["speedup_priced"] == "nothing compiled"
    # A file whose medians are not [[shape, ...], ms] pairs is ignored, like any bad plan file.
    plan_file.write_text(json.dumps({**plan, "eager_by_shape": [["not shapes", "fast"]]}))
    with pytest.warns(UserWarning, match=r"ignores its cached plan and plans again: .* eager_by_shape rows"):
        replanned = run(tmp_path / "bad")
    assert replanned.run.timer.count("eager") > 0


class Wrapped(L.LightningModule):
    """The usual Lightning pattern: the network in ``self.model``, the loss from ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.model(x), y)

    def training_step(self, batch, batch_idx):
        return self(*batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_child_called_model_does_not_hide_the_whole_model(tmp_path):
    report, model = fit(tmp_path, auto(backend="eager", max_trials=2, min_speedup=1.0), model=Wrapped())
    regions = [d["region"] for d in report["decisions"]]
    assert regions[0] == "model", report["decisions"]  # the root, tried first
    assert report["decisions"][0]["modules"] == ["model"]
    assert not any("whole model not tried" in note for note in report["plan"]["notes"])
    from compile_callback.planner import candidate_regions

    assert candidate_regions(model) == {"model": [""], "self.model": ["model"]}


class SlowWhenEager(TinyModel):
    """Faster compiled by construction: the sleep runs only eagerly (dynamo traces with
    ``is_compiling()`` true, so the compiled graph has no sleep): 20 ms on a step of 1-3 ms, a margin
    that interference on a loaded machine (a few ms on some steps) cannot close."""

    def forward(self, x):
        if not torch.compiler.is_compiling():
            time.sleep(0.02)
        return super().forward(x)


@pytest.mark.parametrize("seed", range(4))
def test_a_region_no_faster_is_reverted_and_one_clearly_faster_is_kept_in_every_fit(tmp_path, seed):
    L.seed_everything(seed)
    same, _ = fit(tmp_path / "same", auto(backend="eager", max_trials=1, trial_steps=7))
    assert [d["kept"] for d in same["decisions"]] == [False], [(d["region"], d["reason"]) for d in same["decisions"]]
    assert same["summary"]["speedup"] == 1.0 and same["summary"]["speedup_priced"] == "nothing compiled"
    faster, _ = fit(tmp_path / "faster", auto(backend="eager", max_trials=1, trial_steps=7), model=SlowWhenEager())
    (decision,) = faster["decisions"]
    assert decision["region"] == "model" and decision["kept"], decision
    assert faster["summary"]["speedup_priced"] == "trials"
    assert faster["summary"]["speedup"] == pytest.approx(decision["speedup"])
    assert "timed between its own steps" in decision["reason"]


def test_decisions_saved_before_they_said_what_verification_found_load_with_it():
    from compile_callback.report import Decision

    base = dict(region="model", modules=["model"], mode="default", kept=False, step=4)
    failed = Decision.from_dict({**base, "reason": "numerics differ from eager: max relative error 2e-1", "max_rel_error": 0.2})
    passed = Decision.from_dict({**base, "reason": "not faster: 0.9x", "max_rel_error": 1e-6})
    unchecked = Decision.from_dict({**base, "reason": "compile failed: boom"})
    assert (failed.verified, passed.verified, unchecked.verified) == (False, True, None)
    assert Decision.from_dict(passed.as_dict()) == passed



class SlowEagerBackbone(nn.Module):
    """A backbone with repeated blocks whose eager forward sleeps 100 ms (a compiled one does not: dynamo traces
    with ``is_compiling()`` true), so compiling it surely measures faster."""

    def __init__(self) -> None:
        super().__init__()
        from tests.conftest import Block, Head

        self.embed, self.head = Head(8, 16), Head(16, 4)
        self.blocks = nn.ModuleList([Block(16) for _ in range(3)])

    def forward(self, x):
        if not torch.compiler.is_compiling():
            time.sleep(0.1)
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CallsSelfModel(L.LightningModule):
    """The usual wrapper with no forward: training_step calls ``self.model`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.model = SlowEagerBackbone()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_self_model_kept_as_the_whole_model_ends_the_search(tmp_path):
    """Trials to spare (max_trials=3): once ``self.model``, standing for the whole model, is kept, neither its
    blocks nor its parts are tried, and the plan covers the whole step."""
    callback = CompileCallback(backend="eager", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=3,
                               anatomy=False)
    make_trainer(tmp_path, [callback], max_steps=40, max_epochs=-1).fit(CallsSelfModel(), loader(batch_size=8))
    report = callback.last_report
    assert [(d["region"], d["kept"]) for d in report["decisions"]] == [("self.model", True)], report["decisions"]
    assert report["plan"]["coverage"] == 1.0, report["plan"]


def test_a_numerics_failure_is_not_paid_for_again_in_another_mode_and_its_compile_is_reported(tmp_path, monkeypatch):
    """A launch-bound step tries the whole model with CUDA graphs first, then in default mode. The modes share
    Inductor's kernels, so a whole model whose numerics differ in one differs in the other: it is not compiled
    a second time, a note says why, and the rejected decision carries the seconds its compile took."""
    from compile_callback import planner as planner_module
    from compile_callback.planner import AutoPlanner
    from tests.conftest import PLANNED, StopWhenPlanned

    real = planner_module.verify_module

    def planted(*args, **kwargs):  # the real verification, then a planted mismatch in the output
        result = real(*args, **kwargs)
        return type(result)(False, 0.5, result.tolerance, "output: planted mismatch", seconds=result.seconds)

    monkeypatch.setattr(planner_module, "verify_module", planted)
    monkeypatch.setattr(AutoPlanner, "_graphs_first", lambda self: True)  # as on a launch-bound GPU step
    callback = CompileCallback(eager_baseline_steps=2, warmup_steps=1, trial_steps=3, max_trials=2, anatomy=False,
                               background_compile=False)
    trainer = make_trainer(tmp_path, [callback, StopWhenPlanned(callback)], **PLANNED)
    trainer.fit(TinyModel(depth=2), loader(batch_size=8))
    report = callback.last_report
    whole = [d for d in report["decisions"] if d["region"] == "model"]
    assert [d["mode"] for d in whole] == ["reduce-overhead"] and whole[0]["verified"] is False, report["decisions"]
    assert whole[0]["compile_seconds"] and whole[0]["compile_seconds"] > 0, whole
    assert any(n.startswith("`model` not tried in default mode: its numerics differed") for n in report["plan"]["notes"])
    assert report["summary"]["recompiles"] == 0, report["summary"]
