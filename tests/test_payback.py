"""Payback order: in a run too short to repay the whole model's compile, a cheaper region that repays is
tried first, and the whole model after it is judged on the compile seconds measured in the run."""

import time

import lightning as L
import pytest
import torch
from torch import nn

from compile_callback import CompileCallback, background, payback, profile
from compile_callback.run import PROFILE_STEPS
from compile_callback.payback import CompileCosts, Priced, compile_units, graph_trial_price, payback_order, saving_seconds
from compile_callback.regions import backend_name
from compile_callback.torch_internals import is_module_compiled
from tests.conftest import Block, TinyModel, loader, make_trainer

GRAPH_S = 0.15


def slow_to_compile(gm, example_inputs):
    time.sleep(GRAPH_S)  # a known compile time per graph
    return gm.forward


def graph_trial_unpaid(kept, costs, **priced):
    """Why the CUDA-graph trial of ``kept`` is not tried (:meth:`payback.GraphPrice.unpaid`), None where it is."""
    price = graph_trial_price(kept, costs, **priced)
    return None if price is None else price.unpaid()


def test_a_group_of_repeated_blocks_counts_one_block():
    model = TinyModel(depth=12)  # embed, 12 blocks and a head: one Linear each
    assert compile_units([model], repeated=False) == 14
    assert compile_units(list(model.blocks), repeated=True) == 1
    assert compile_units([model.head], repeated=False) == 1
    assert compile_units([nn.Linear(2, 2)], repeated=False) == 1  # a leaf is itself
    # An Identity puts no op in the graph (timm's unused norms, layer scales and drop paths).
    assert compile_units([nn.Sequential(nn.Linear(2, 2), nn.Identity(), nn.Sequential(nn.Identity()))], repeated=False) == 1


def test_costs_come_from_the_run_once_measured_else_from_inductors_prior():
    assert CompileCosts("eager").rate is None  # no prior: nothing is estimated before a compile
    prior = CompileCosts("inductor")
    assert prior.seconds(125) == pytest.approx(0.15 * (payback.FIXED_UNITS + 125))  # GPT-2's 21 s
    assert "prior" in prior.source
    measured = CompileCosts("inductor")
    measured.observe(10, 2.2)
    measured.observe(0, 0.0)  # a trial that compiled nothing tells nothing
    assert measured.rate == pytest.approx(2.2 / (payback.FIXED_UNITS + 10))
    assert "1 cold compile(s) measured" in measured.source


def test_a_compile_from_the_cache_prices_no_cold_one():
    # On the H200 GPT-2's blocks loaded from a warm cache in 1.1 s; priced at that rate the whole model
    # read ~6.5 s and then compiled cold in 21.5 s. A warm compile only raises the estimate.
    warm = CompileCosts("inductor")
    warm.observe(9, 1.1, cold=False)
    assert warm.known and warm.rate == pytest.approx(0.15)  # the prior: 1.1 s / 21 units is faster
    assert "came from the cache" in warm.source
    slow = CompileCosts("inductor")
    slow.observe(9, 6.3, cold=False)  # even from the cache slower than the prior: the larger stands
    assert slow.rate == pytest.approx(6.3 / (payback.FIXED_UNITS + 9)) and "lower bound" in slow.source
    unknown = CompileCosts("eager")
    unknown.observe(9, 1.1, cold=False)  # no prior: the warm rate is all there is
    assert unknown.rate == pytest.approx(1.1 / (payback.FIXED_UNITS + 9))
    both = CompileCosts("inductor")
    both.observe(9, 1.1, cold=False)
    both.observe(9, 10.5)
    assert both.rate == pytest.approx(0.5) and "1 cold compile(s)" in both.source  # a cold compile prices


def test_cuda_graphs_are_tried_only_where_recompiling_for_them_repays():
    costs = CompileCosts("inductor")
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=866) is None  # nothing measured: tried
    costs.observe(10, 1.1, cold=False)  # the blocks came from the cache: priced as a cold compile (0.15 s/unit)
    # Blocks at 80% of a 38 ms step: half of that over 866 batches is ~13 s against ~3.3 s of compiling.
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=866) is None
    note = graph_trial_unpaid([BLOCKS, WHOLE], costs, step_ms=38.0, batches=100)
    assert note is not None and "the 100 batches left would save ~1.9 s" in note, note  # 0.5 x 38 ms x 100
    assert f"~{costs.seconds(10 + 125):.1f} s" in note  # both regions recompile
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=None, batches=100) is None


def test_cuda_graphs_are_priced_low_where_the_host_issues_the_kept_step_ahead_of_the_device():
    """GPT-2's kept blocks on the H200: CUDA graphs gained 1.5-3.1% of the step over default mode in eight
    trials (sessions 21-22), none kept, each ~2 s of stopped training; the host issues that step ahead of the device."""
    costs = CompileCosts("inductor")
    costs.observe(10, 1.1, cold=False)
    costs.observe_check(2.0)
    # Host-bound (or not measured): half the kept share, ~6.1 s over 400 batches against ~5.3 s: tried.
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=400) is None
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=400, issue_ms=38.0) is None  # the host's pace
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=400, issue_ms=41.0) is None  # slower still
    note = graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=400, issue_ms=33.4)  # 88%: the H200's GPT-2
    assert note is not None and "would save ~0.6 s" in note, note  # 5% of 0.8 x 38 ms x 400
    assert "issues the kept plan's step in 33.4 ms, the device runs it in 38.0 ms" in note, note
    # A run long enough repays even the device-bound price: 0.05 x 0.8 x 38 ms x 5000 = 7.6 s.
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=5000, issue_ms=33.4) is None


def test_cuda_graphs_near_the_devices_pace_are_priced_between_the_two_shares():
    """Between ISSUE_BOUND_SHARE and ISSUE_HOST_BOUND_SHARE of the step the price is a ramp, not a cliff. GPT-2's
    kept blocks on a loaded H200 host (session 25) as the planner priced them: the quickest probe 37.546 ms of
    the kept trial's 39.405 ms step (0.953), ~765 of 1248 planned batches left, checking ~0.4 s. On the ramp 29%
    of their share, still enough to try them (as at half their share, where they saved <=1% for ~2.3 s)."""
    assert payback.graph_saved_share(None, 38.0) == payback.GRAPH_SAVED_SHARE
    assert payback.graph_saved_share(0.9 * 38.0, 38.0) == pytest.approx(payback.GRAPH_SAVED_SHARE_DEVICE_BOUND)
    assert payback.graph_saved_share(0.95 * 38.0, 38.0) == pytest.approx(0.275)  # halfway: (0.05 + 0.5) / 2
    assert payback.graph_saved_share(38.0, 38.0) == pytest.approx(payback.GRAPH_SAVED_SHARE)
    readings = [payback.graph_saved_share(r / 100 * 38.0, 38.0) for r in range(80, 111)]
    assert readings == sorted(readings) and len(set(readings)) == 11  # flat to 90%, ten steps up to 100%, flat
    costs = CompileCosts("inductor")
    costs.observe(9, 0.59, cold=False)  # the blocks came from the child's warm cache: the prior prices them
    costs.observe_check(0.4)
    gpt2 = Priced("transformer.h.*", share=0.6285, units=9, whole=False)
    assert payback.graph_saved_share(37.546, 39.405) == pytest.approx(0.288, abs=0.001)
    assert graph_trial_unpaid([gpt2], costs, step_ms=39.405, batches=765, issue_ms=37.546) is None  # ~5.5 s: tried
    report = graph_trial_price([gpt2], costs, step_ms=39.405, batches=765, issue_ms=37.546).as_report()
    assert report == {"step_ms": 39.405, "batches": 765, "share": 0.6285, "issue_ms": 37.546,
                      "saved_share": pytest.approx(0.2877, abs=1e-4), "saving_s": pytest.approx(5.451, abs=1e-3),
                      "compile_s": pytest.approx(0.15 * (payback.FIXED_UNITS + 9)), "check_s": pytest.approx(0.4),
                      "source": costs.source, "cost_s": pytest.approx(3.55), "issue_share_of_step": pytest.approx(0.9528, abs=1e-4)}
    note = graph_trial_unpaid([gpt2], costs, step_ms=39.405, batches=480, issue_ms=37.546)  # break-even ~498
    assert note is not None and "would save ~3.4 s" in note and "costs ~3.1 s" in note, note
    assert "0.95 of it, graphs priced at 29% of the kept regions' share, between 5% where" in note, note
    assert graph_trial_unpaid([gpt2], costs, step_ms=39.405, batches=480) is None  # unmeasured: half, ~6.0 s
    assert graph_trial_unpaid([gpt2], costs, step_ms=39.405, batches=480, issue_ms=39.405) is None  # host's pace


def test_a_trials_set_up_beyond_its_compile_is_priced_too():
    """The H200's GPT-2 (2026-12-03): priced at its 3.15 s compile alone, the blocks' CUDA-graph trial was run
    with 290 batches left and stopped training 5.2 s (verification and parking the optimizer ~1.6 s more)."""
    costs = CompileCosts("inductor")
    costs.observe(10, 1.1, cold=False)
    assert costs.check_s == 0.0 and costs.trial_seconds(10) == pytest.approx(costs.seconds(10))
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=290) is None  # ~4.4 s saved, 3.3 s compile
    costs.observe_check(2.1)
    costs.observe_check(1.7)
    assert costs.check_s == pytest.approx(1.9) and costs.trial_seconds(10) == pytest.approx(costs.seconds(10) + 1.9)
    note = graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=290)
    assert note is not None and "would save ~4.4 s" in note and "costs ~3.3 s" in note and "~1.9 s more" in note, note
    assert graph_trial_unpaid([BLOCKS], costs, step_ms=38.0, batches=400) is None  # ~6.1 s saved: tried
    costs.observe_check(-0.5)  # a set-up quicker than its compile's record (clock granularity): counts nothing
    assert costs.checks[-1] == 0.0


# GPT-2-like: the whole model (125 leaves) and a group of twelve 10-leaf blocks with 80% of the step.
WHOLE, BLOCKS, HEAD = Priced("model", 1.0, 125, True), Priced("h.*", 0.8, 10, False), Priced("lm_head", 0.15, 1, False)


def test_a_long_run_tries_the_whole_model_first():
    order, note = payback_order([BLOCKS, HEAD, WHOLE], CompileCosts("inductor"), step_ms=43.0, batches=5000)
    assert order == ["model", "h.*", "lm_head"] and note is None  # 5000 batches repay ~20.6 s


def test_a_short_run_tries_what_repays_first_and_says_why():
    # 1000 batches: the whole model saves ~10.8 s against ~20.6 s; the blocks ~8.6 s against ~3.3 s.
    order, note = payback_order([WHOLE, HEAD, BLOCKS], CompileCosts("inductor"), step_ms=43.0, batches=1000)
    assert order == ["h.*", "model", "lm_head"]
    assert note.startswith("payback order: the whole model's compile (~20.6 s") and "tried first: h.*" in note
    assert saving_seconds(1.0, 43.0, 1000) == pytest.approx(10.75)


def test_nothing_is_reordered_when_no_region_repays_or_costs_are_unknown():
    # 200 batches repay nothing: the usual order (skipping is left to the measured costs).
    assert payback_order([WHOLE, BLOCKS], CompileCosts("inductor"), step_ms=43.0, batches=200) == (["model", "h.*"], None)
    assert payback_order([WHOLE, BLOCKS], CompileCosts("eager"), step_ms=43.0, batches=1000) == (["model", "h.*"], None)
    assert payback_order([BLOCKS, HEAD], CompileCosts("inductor"), step_ms=43.0, batches=1000)[0] == ["h.*", "lm_head"]


class Sleepy(TinyModel):
    """A step of ~20 ms whatever this machine's speed (the sleep is outside the model, so compiling
    speeds none of it up): the savings the order weighs do not depend on the CPU."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


@pytest.mark.slow
def test_the_planner_tries_the_repeated_blocks_first_in_a_short_run(tmp_path, monkeypatch):
    # A prior of 0.5 s a leaf (no fixed part) for this backend: the whole model, 14 leaves, ~7 s against
    # the ~1.1-1.3 s its 87 batches left could save (steps of ~55 ms on an idle 2-core machine); one block
    # ~0.5 s against ~1.0 s. That order holds for steps from ~26 ms to ~320 ms (the step sleeps 20 ms). At
    # 0.1 s a leaf (1.4 s) a step slower by a fifth made the whole model repay: it went first in about one
    # fit of three; at 0.3 s, under three busy loops on 2 cores.
    monkeypatch.setattr(payback, "FIXED_UNITS", 0)
    monkeypatch.setitem(payback.PRIOR_SECONDS_PER_UNIT, backend_name(slow_to_compile), 0.5)
    held_at = {}  # module name -> the batch its input was held in (below: held in the batch before the trial)
    real_hold = profile.RegionProfiler._hold

    def hold(self, name, args, kwargs):
        held_at[name] = trainer.global_step
        real_hold(self, name, args, kwargs)

    monkeypatch.setattr(profile.RegionProfiler, "_hold", hold)
    callback = CompileCallback(backend=slow_to_compile, eager_baseline_steps=4, warmup_steps=1, trial_steps=4)
    trainer = make_trainer(tmp_path, [callback], max_steps=96, max_epochs=20, limit_val_batches=0)
    # Blocks 768 wide: milliseconds of forward between them, so that one hiccup of this machine inside the
    # embedding's span (microseconds at width 16) cannot make it look hotter than the twelve blocks (it did in
    # about one fit of eight on a 2-core machine: the embedding went first).
    trainer.fit(Sleepy(width=768, depth=12), loader(batch_size=8, shuffle=False))
    report = callback.last_report
    decisions = [(d["region"], d["reason"]) for d in report["decisions"]]
    assert decisions[0][0] == "blocks.*", decisions
    # The profile held the whole model's input only (ResNet-50's five candidates' inputs stopped training
    # 1.05-1.19 s on the H200 where its first trial needed the batch alone); the blocks' were held in one
    # untimed batch right before their trial, and verified on.
    assert held_at.pop("") == 1  # the first profiled batch, after one warm-up
    assert set(held_at) == {f"blocks.{i}" for i in range(12)} and len(set(held_at.values())) == 1
    assert held_at["blocks.0"] > 1 + PROFILE_STEPS and report["decisions"][0]["step"] > held_at["blocks.0"]
    assert report["decisions"][0]["verified"] is True
    assert any(n.startswith("payback order: the whole model's compile") for n in report["plan"]["notes"])
    weighed = {c["region"]: c for c in report["plan"]["candidates"]}  # what the order weighed, in the report
    assert weighed["model"]["units"] == 14 and weighed["model"]["compile_s_estimate"] == pytest.approx(7.0)
    assert weighed["blocks.*"]["units"] == 1 and 0 < weighed["blocks.*"]["share"] < 1
    assert weighed["model"]["saving_s_estimate"] < weighed["model"]["compile_s_estimate"]
    whole = [reason for region, reason in decisions if region == "model"]
    # The whole model comes after the blocks, priced on the blocks' measured compile (two graphs of
    # 0.15 s for one leaf): skipped.
    assert whole and whole[0].startswith("skipped:") and "measured in this run" in whole[0], decisions


def test_without_the_prior_the_whole_model_still_goes_first(tmp_path):
    callback = CompileCallback(backend=slow_to_compile, eager_baseline_steps=4, warmup_steps=1, trial_steps=4, max_trials=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=40, max_epochs=20, limit_val_batches=0)
    trainer.fit(Sleepy(depth=12), loader(batch_size=8, shuffle=False))
    report = callback.last_report
    assert report["decisions"][0]["region"] == "model", report["decisions"]
    assert not any(n.startswith("payback order") for n in report["plan"]["notes"])


def test_a_candidate_even_the_prior_cannot_repay_is_not_tried(tmp_path, monkeypatch):
    # The prior is optimistic (a fast GPU host's cold compile): where even it says no candidate can repay over
    # the batches left (10 s a leaf here), none is compiled, and each skip says it was the prior that priced it.
    monkeypatch.setattr(payback, "FIXED_UNITS", 0)
    monkeypatch.setitem(payback.PRIOR_SECONDS_PER_UNIT, backend_name(slow_to_compile), 10.0)
    callback = CompileCallback(backend=slow_to_compile, eager_baseline_steps=4, warmup_steps=1, trial_steps=4, max_trials=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=40, max_epochs=20, limit_val_batches=0)
    trainer.fit(Sleepy(depth=12), loader(batch_size=8, shuffle=False))
    decisions = callback.last_report["decisions"]
    assert decisions and all(d["reason"].startswith("skipped") and "from the prior" in d["reason"] for d in decisions), decisions
    assert not any(d["compile_seconds"] for d in decisions) and callback.last_report["summary"]["graphs"] == 0, decisions


def test_the_step_that_holds_inputs_is_not_timed(monkeypatch):
    # Holding each module's input (pinned host memory on a GPU: milliseconds a copy) happens inside the
    # spans of the modules around it; timed, it made the root's forward look long and the blocks' share
    # small (the GPT-2 recipe on the H200 kept its whole model first at 1000 steps).
    import torch

    copy = profile._copy

    def slow_copy(value, device):
        time.sleep(0.02)
        return copy(value, device)

    monkeypatch.setattr(profile, "_copy", slow_copy)
    model = TinyModel(depth=12)
    modules = {"": model, **{f"blocks.{i}": b for i, b in enumerate(model.blocks)}}
    profiler = profile.RegionProfiler(modules, torch.device("cpu"))
    profiler.attach()
    for _ in range(3):
        profiler.steps += 1
        model(torch.randn(8, 8))
    profiler.detach()
    forward = profiler.forward_ms()
    assert len(profiler.held_inputs) == 13
    assert forward[""] < 15, forward  # the 13 copies (260 ms) in step 1 are not in the mean
    assert sum(forward[f"blocks.{i}"] for i in range(12)) / forward[""] > 0.3


def test_a_compile_in_the_background_is_priced_by_the_stopped_training_and_the_batches_after_it():
    # The H200's GPT-2 recipe: the blocks (estimated 3.15 s) are priced at a ~17 s child on the interpreter
    # started with the fit (10 s loading, 2.2x the estimate): with 460 steps left at 43 ms (~20 s) that is too
    # late to repay; in a 5000-step run it is not. ResNet-18 CIFAR's whole model (9.6 s; a child measured at
    # 32 s on a standby, priced 31 s) with 40 s left compiles here: its plan would run a fifth of what is
    # left. A 1 s head compiles here whatever the run.
    use, note = payback.background_pays(3.15, left_s=20.0)
    assert not use and "the batches left (~20 s at eager speed) are too few for a child's ~17 s" in note
    assert payback.background_pays(3.15, left_s=215.0) == (True, None)
    assert not payback.background_pays(9.6, left_s=40.0)[0]
    assert payback.background_pays(9.6, left_s=200.0) == (True, None)
    assert payback.background_pays(1.0, left_s=1000.0) == (False, None)
    assert payback.background_pays(None, left_s=1000.0) == (False, None)  # no estimate (no prior): in-process
    # Prepared beside the run: training stops for a tenth of the compile, and the saving starts once the
    # child is done ((10 + 2.2 x 3.15) s at 43 ms a step: 394 batches later).
    stopped, left = payback.after_background(3.15, step_ms=43.0, batches=4900)
    assert stopped == pytest.approx(0.315) and left == 4900 - 394
    assert payback.after_background(30.0, step_ms=43.0, batches=100) == (pytest.approx(3.0), 0)


def test_in_the_background_a_part_ready_much_sooner_goes_first_and_the_whole_model_after_it():
    # The H200's GPT-2 recipe (launch-bound: the whole model saves half its step with CUDA graphs): its blocks
    # (69% of the step, 10 leaves) are priced at a ~17 s child, the whole model (125 leaves) at ~55 s. Over a
    # 1400-batch run the whole model's plan would start at batch ~1270; the blocks' at ~400.
    gpt2_blocks = Priced("transformer.h.*", 0.69, 10, False)
    costs = CompileCosts("inductor")
    first = payback.part_first_in_background(WHOLE, [gpt2_blocks, HEAD], costs, step_ms=43.4, batches=1400,
                                             whole_saved=payback.GRAPH_SAVED_SHARE)
    assert first is not None and first[0] is gpt2_blocks
    assert first[1].startswith("payback order: `transformer.h.*` is prepared in the background first (ready in ~17 s "
                               "against ~55 s for the whole model"), first[1]
    # 5000 batches repay the whole model's compile (the order's first rule), and the blocks still go first.
    first = payback.part_first_in_background(WHOLE, [gpt2_blocks, HEAD], costs, step_ms=43.4, batches=5000,
                                             whole_saved=payback.GRAPH_SAVED_SHARE)
    order, note = payback_order([WHOLE, HEAD, gpt2_blocks], costs, step_ms=43.4, batches=5000,
                                in_background=lambda _: True, whole_saved=payback.GRAPH_SAVED_SHARE)
    assert order == ["transformer.h.*", "model", "lm_head"] and note == first[1]
    # ResNet-50 (launch-bound too): its largest part, layer1, has a third of the step and would save a sixth
    # of what the whole model's graphs do; waiting ~15 s more for the whole model costs less: whole first.
    layer1 = Priced("net.layer1.*", 0.32, 9, False)
    assert payback.part_first_in_background(Priced("model", 1.0, 126, True), [layer1], costs, step_ms=29.5,
                                            batches=20000, whole_saved=payback.GRAPH_SAVED_SHARE) is None
    # Where the whole model compiles in-process (no child to wait for), or the part would, nothing changes.
    in_process = payback_order([WHOLE, gpt2_blocks], costs, step_ms=43.4, batches=5000, whole_saved=payback.GRAPH_SAVED_SHARE)
    assert in_process == (["model", "transformer.h.*"], None)
    only_whole = payback_order([WHOLE, gpt2_blocks], costs, step_ms=43.4, batches=5000,
                               in_background=lambda c: c.whole, whole_saved=payback.GRAPH_SAVED_SHARE)
    assert only_whole == (["model", "transformer.h.*"], None)


class SleepyBlock(Block):
    """Eager forwards sleep 15 ms; compiled ones do not (dynamo traces with ``is_compiling()`` true)."""

    def forward(self, x):
        if not torch.compiler.is_compiling():
            time.sleep(0.015)
        return super().forward(x)


class SleepyRoot(TinyModel):
    """Three sleepy blocks (45 ms eagerly) and, where ``root_sleep_s``, as long again in the root's own
    forward: compiling the blocks saves their sleep, the whole model every sleep. ``compiled_busy``: the
    root's compiled forward does that many 640-wide matmuls more (the whole model slower than the blocks)."""

    def __init__(self, root_sleep_s: float = 0.04, step_sleep_s: float = 0.0, compiled_busy: int = 0) -> None:
        super().__init__(depth=3, block=SleepyBlock)
        self.root_sleep_s = root_sleep_s
        self.step_sleep_s = step_sleep_s  # outside the model: no compile saves it
        self.compiled_busy = compiled_busy

    def forward(self, x):
        if not torch.compiler.is_compiling():
            time.sleep(self.root_sleep_s)
        elif self.compiled_busy:
            busy = torch.ones(640, 640)
            for _ in range(self.compiled_busy):
                busy = busy @ busy * 1e-3
            x = x + 0.0 * busy.sum()
        return super().forward(x)

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_sleep_s)
        return super().training_step(batch, batch_idx)


class StopWhenFrozen(L.Callback):
    """Ends the fit a few batches after the plan froze (the run was planned longer: the order weighs that)."""

    def __init__(self, callback: CompileCallback) -> None:
        self.callback = callback
        self.frozen_at: int | None = None

    def on_train_batch_end(self, trainer, *args):
        if self.frozen_at is None and self.callback.run.planner.frozen:
            self.frozen_at = trainer.global_step
        if self.frozen_at is not None and trainer.global_step >= self.frozen_at + 3:
            trainer.should_stop = True


def _part_first_fit(tmp_path, monkeypatch, model):
    # Children priced at the compile estimate alone, one second a leaf for dynamo's eager backend: the
    # blocks (one leaf, ~1 s, ~11 batches) ready long before the whole model (5 leaves, ~5 s, ~55 batches).
    monkeypatch.setattr(payback, "FIXED_UNITS", 0)
    monkeypatch.setattr(payback, "CHILD_START_S", 0.0)
    monkeypatch.setattr(payback, "CHILD_COMPILE_FACTOR", 1.0)
    monkeypatch.setitem(payback.PRIOR_SECONDS_PER_UNIT, "eager", 1.0)
    callback = CompileCallback(backend="eager", background_compile=True, eager_baseline_steps=2, warmup_steps=1,
                               trial_steps=4, max_trials=3)
    trainer = make_trainer(tmp_path, [callback, StopWhenFrozen(callback)], max_steps=2000, max_epochs=1000,
                           limit_val_batches=0)
    trainer.fit(model, loader(batch_size=8))
    assert callback.run.planner.frozen and trainer.global_step == model.batches_seen  # no batch lost or repeated
    assert trainer.global_step < 2000
    report = callback.last_report
    assert any(n.startswith("payback order: `blocks.*` is prepared in the background first") for n in report["plan"]["notes"])
    return callback, report["decisions"]


@pytest.mark.slow
def test_the_whole_model_prepared_after_a_kept_part_replaces_it(tmp_path, monkeypatch):
    readied = []

    class Standby(background.Standby):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            readied.append(self)

    monkeypatch.setattr(background, "Standby", Standby)
    monkeypatch.setattr(background, "bytecode_unwritten", lambda: False)  # no bytecode for a standby to write
    model = SleepyRoot()
    callback, decisions = _part_first_fit(tmp_path, monkeypatch, model)
    blocks, whole = decisions[0], decisions[1]
    assert [blocks["region"], whole["region"]] == ["blocks.*", "model"], decisions
    assert blocks["background"].startswith("prepared in the background") and whole["background"].startswith("prepared")
    # The whole model's child follows the blocks' whatever they do: its interpreter was readied as the blocks
    # were handed over, and it took the whole model (the fit's own standby, then that one).
    assert len(readied) == 2 and all(s.process.poll() is not None for s in readied)
    assert whole["background"].endswith("; its interpreter started as the child before it was handed over)"), whole["background"]
    # The blocks were kept, then the whole model, timed right before it against the blocks compiled, replaced them.
    assert not blocks["kept"] and blocks["replaced_by"] == "model" and "then replaced by `model`" in blocks["reason"]
    assert whole["kept"] and "timed right before it" in whole["reason"] and whole["speedup"] > 1.5
    assert whole["baseline_ms"] < 0.8 * decisions[0]["baseline_ms"]  # its control was the blocks' plan, not eager
    assert [r.name for r in callback.run.planner.regions] == ["model"]
    assert is_module_compiled(model) and not any(is_module_compiled(b) for b in model.blocks)
    # The plan's price chains both measurements: eager -> blocks -> whole model.
    priced, _ = callback.run.planner.priced_speedup()
    assert priced == pytest.approx(blocks["speedup"] * whole["speedup"])


@pytest.mark.slow
def test_a_whole_model_no_faster_than_the_kept_part_leaves_the_part_compiled(tmp_path, monkeypatch):
    # The blocks' sleep is all the model's time, and the whole model's compiled forward does ten 640-wide
    # matmuls more: slower than the blocks. (Merely no faster, it was kept in about one fit of eight on a
    # 2-core machine: 4-step windows beside the children read the blocks' plan 0.79-1.14x of the whole
    # model's; with the matmuls 0.39-0.71x in six fits.)
    model = SleepyRoot(root_sleep_s=0.0, step_sleep_s=0.02, compiled_busy=10)
    callback, decisions = _part_first_fit(tmp_path, monkeypatch, model)
    blocks, whole = decisions[0], decisions[1]
    assert blocks["kept"] and blocks["replaced_by"] is None, [(d["region"], d["reason"], d["baseline_ms"], d["step_ms"]) for d in decisions]
    assert not whole["kept"] and whole["reason"].startswith("not faster"), whole
    # The blocks' compiled code was put back (no compile again) and runs: no eager sleep in the last steps.
    assert [r.name for r in callback.run.planner.regions] == ["blocks.*"]
    assert all(is_module_compiled(b) for b in model.blocks) and not is_module_compiled(model)
    assert callback.last_report["summary"]["regions_compiled"] >= 1
