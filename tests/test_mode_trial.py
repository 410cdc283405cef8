"""The CUDA-graph (reduce-overhead) trial of the kept plan, driven step by step on CPU with Inductor.

On a CPU Inductor skips the CUDA graphs themselves, but the trial's logic is the same: its guard, the
agreement that it survived on every rank, keep or restore.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from compile_callback import torch_internals
from compile_callback.planner import CONTROL, AutoPlanner, Candidate
from compile_callback.profile import RegionProfiler
from compile_callback.regions import CompileOptions, compile_region, resolve_regions
from compile_callback.report import Decision
from compile_callback.timing import StepTimer
from compile_callback.watch import CompileWatch


class Flaky(nn.Module):
    """A head whose forward raises on a batch of the wrong width (:data:`BAD`), in compiled and eager
    code alike: a failure that comes with its input, which dynamo must guard on (a class-level flag
    read inside the compiled code did not fail it on torch 2.11)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        if x.shape[-1] != 8:
            raise RuntimeError("injected failure")
        return self.linear(x).relu()


BAD = torch.randn(4, 9)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = Flaky()


def make_planner(model: nn.Module, x: torch.Tensor, trial_ms: float) -> AutoPlanner:
    (region,) = resolve_regions(model, ["head"])
    watch = CompileWatch({id(region.modules[0]): "head"}, {id(m): n for n, m in model.named_modules()})
    def median(label: str) -> float:  # the kept default-mode plan, timed right before the trial, took 2 ms
        return 2.0 if label.endswith(CONTROL) else trial_ms

    planner = AutoPlanner(
        model, CompileOptions(backend="inductor"), timer=SimpleNamespace(
            median_ms=lambda label, wait=False: median(label), samples_by_key=lambda label, wait=False: {},
            samples_ms=lambda label, wait=False: [median(label)] * 5, settle=lambda label, steps: None,
        ),
        watch=watch, device=torch.device("cpu"), warmup_steps=1, profile_steps=1, baseline_steps=1,
        trial_steps=2, min_speedup=1.05, max_trials=3, verify=True, tolerance=None, agree=lambda v: v,
        remaining_batches=lambda: 10**6, context=lambda: torch.autocast("cpu", enabled=False),
    )
    profiler = RegionProfiler({"head": model.head}, torch.device("cpu"))
    profiler.held_inputs["head"] = ((x,), {})
    planner.profiler = profiler
    watch.add_region(region)
    compile_region(region, planner.options, on_error=planner._failed)  # kept in default mode
    planner.regions.append(region)
    planner._kept.append(region)
    return planner


def drive(planner: AutoPlanner, model: nn.Module, x: torch.Tensor, fail_at: int | None = None) -> None:
    for index, _label in enumerate(planner._mode_trial(current_ms=2.0)):
        try:
            model.head(BAD if index == fail_at else x).sum().backward()
        except RuntimeError:
            assert fail_at == index  # the eager rerun fails too: the step itself is lost, as it would be


def test_a_faster_trial_is_kept_and_its_later_failures_revert_the_region():
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    drive(planner, model, x)
    decision = planner.decisions[-1]
    assert decision.kept and decision.mode == "reduce-overhead", decision
    (region,) = planner.regions
    assert region.compiled_with.mode == "reduce-overhead"
    with pytest.raises(RuntimeError, match="injected failure"):
        model.head(BAD)
    assert planner.regions == [] and not region.is_compiled  # a kept region's failure: reverted, dropped
    assert not any(d.kept for d in planner.decisions)  # the CUDA-graph decision says so too


def test_a_trial_that_fails_at_run_time_restores_the_default_mode_plan():
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    (region,) = planner.regions
    default_call = torch_internals.compiled_call(region.modules[0])
    drive(planner, model, x, fail_at=3)  # warm-up is steps 0-2 (1 + 2 for CUDA graphs): a timed step
    decision = planner.decisions[-1]
    assert not decision.kept
    assert decision.reason.startswith("CUDA graphs failed at run time during the trial: "), decision.reason
    assert "injected failure" in decision.reason
    assert region.is_compiled and region.compiled_with.mode is None  # the default-mode plan is back
    assert torch_internals.compiled_call(region.modules[0]) is default_call  # without compiling again
    assert planner.regions == [region]


def test_a_failure_on_another_rank_is_a_failure_here():
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    calls = []

    def agree_all(value):  # as reduce_boolean_decision(all=True) with another rank that failed
        calls.append(value)
        return False if len(calls) == 2 else bool(value)  # 1st: verification; 2nd: the trial survived

    planner.agree_all = agree_all
    drive(planner, model, x)
    decision = planner.decisions[-1]
    assert not decision.kept and decision.reason.endswith("during the trial: on another rank"), decision.reason
    assert planner.regions[0].is_compiled and planner.regions[0].compiled_with.mode is None


def test_a_cuda_graph_plan_that_would_not_fit_is_not_tried():
    """Eager's step needed 3 GB of activations and 1 GB is free: the pool is not recorded, the
    default-mode plan stays, and the report says why with both figures."""
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    (region,) = planner.regions
    default_call = torch_internals.compiled_call(region.modules[0])
    planner.activation_bytes = lambda: 3 * 2**30
    planner.room_bytes = lambda: 2**30
    drive(planner, model, x)
    decision = planner.decisions[-1]
    assert not decision.kept and decision.mode == "reduce-overhead"
    assert decision.reason == ("not tried: its CUDA-graph pool would hold up to 3.0 GB (the eager step's "
                               "activations) and 1.0 GB are free"), decision.reason
    assert region.compiled_with.mode is None and torch_internals.compiled_call(region.modules[0]) is default_call


def test_a_cuda_graph_plan_that_fits_is_tried():
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    planner.activation_bytes = lambda: 2**30
    planner.room_bytes = lambda: 3 * 2**30
    drive(planner, model, x)
    assert planner.decisions[-1].kept and planner.decisions[-1].mode == "reduce-overhead"


def drive_timed(planner: AutoPlanner, model: nn.Module, x: torch.Tensor, ms: dict[str, list[float]]) -> list[str]:
    """``drive`` with a real StepTimer fed scripted step times: each label's steps take, in turn, the
    times listed for it (its last one once they run out). Returns the labels timed, in order."""
    planner.timer = StepTimer(torch.device("cpu"))
    planner._trial_length = 10
    timed: list[str] = []
    for label in planner._mode_trial(current_ms=2.0):
        model.head(x).sum().backward()
        if label is not None:
            times = ms[label]
            planner.timer.add(label, times[min(timed.count(label), len(times) - 1)])
            timed.append(label)
    return timed


CONTROL_LABEL = "trial:reduce-overhead" + CONTROL
DISTURBED_WINDOW = [2.0] * 5 + [2.6] * 5  # half the steps 30% slower: a busy host's episode


def test_a_disturbed_control_window_is_timed_again_and_the_quickest_prices_the_trial():
    """Host interference slows eager steps and hardly touches a CUDA-graph step: a control window half
    of whose steps a busy host slowed would read the trial 2.3x faster where it is 2.0x."""
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    timed = drive_timed(planner, model, x, {CONTROL_LABEL: DISTURBED_WINDOW, CONTROL_LABEL + "#1": [2.0],
                                            "trial:reduce-overhead": [1.0]})
    assert timed.count(CONTROL_LABEL) == 10 and timed.count(CONTROL_LABEL + "#1") == 10
    assert CONTROL_LABEL + "#2" not in timed  # the second window was quiet: no third
    decision = planner.decisions[-1]
    assert decision.kept and decision.speedup == pytest.approx(2.0) and decision.baseline_ms == pytest.approx(2.0)
    assert "timed right before (the quickest of 2 windows: the host disturbed the first)" in decision.reason


def test_a_quiet_control_window_is_timed_once():
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    timed = drive_timed(planner, model, x, {CONTROL_LABEL: [2.0, 2.01, 1.99, 2.02] * 3, "trial:reduce-overhead": [1.0]})
    assert set(timed) == {CONTROL_LABEL, "trial:reduce-overhead"}
    decision = planner.decisions[-1]
    assert decision.speedup == pytest.approx(2.0, rel=0.01) and "windows" not in decision.reason, decision.reason


def test_control_windows_stop_at_three_and_the_quickest_prices_the_trial():
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    slower = [ms + 0.2 for ms in DISTURBED_WINDOW]
    timed = drive_timed(planner, model, x, {CONTROL_LABEL: slower, CONTROL_LABEL + "#1": DISTURBED_WINDOW,
                                            CONTROL_LABEL + "#2": slower, "trial:reduce-overhead": [1.0]})
    assert [timed.count(CONTROL_LABEL + suffix) for suffix in ("", "#1", "#2")] == [10, 10, 10]
    decision = planner.decisions[-1]
    assert decision.speedup == pytest.approx(statistics.median(DISTURBED_WINDOW))
    assert "(the quickest of 3 windows: the host disturbed the first)" in decision.reason


# -- CUDA graphs for the largest region tried, where its default mode was not kept -------------------------
# (AutoPlanner._graphs_of_the_largest_tried: which region, and when not; the trial itself is _trial's, run on the
# GPU by tests/test_cuda.py.)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.head = nn.Linear(8, 4)


def unrun_planner(model: nn.Module, options: CompileOptions | None = None, *, device: str = "cuda",
                  max_trials: int = 3, remaining: int = 10**6, agree=lambda v: v) -> AutoPlanner:
    """An auto planner whose methods are called directly, never driven through steps (so a CUDA device is only
    read, never used)."""
    return AutoPlanner(
        model, options or CompileOptions(backend="inductor"), timer=SimpleNamespace(), watch=CompileWatch({}, {}),
        device=torch.device(device), warmup_steps=1, profile_steps=1, baseline_steps=1, trial_steps=2,
        min_speedup=1.05, max_trials=max_trials, verify=True, tolerance=None, agree=agree,
        remaining_batches=lambda: remaining, context=lambda: torch.autocast("cpu", enabled=False),
    )


def largest_tried(*, kept: tuple[str, ...] = (), tried: dict[str, float] | None = None, launch_bound=True,
                  recompiles: int = 0, trials: int = 0, remaining: int = 10**6, decisions: list | None = None):
    """A planner after its search: ``tried`` maps each region tried in default mode (measured) to its share;
    ``kept`` those of them kept. Returns the candidate chosen (or None) and the planner's notes."""
    model = Blocks()
    tried = {"blocks.*": 0.6, "head": 0.1} if tried is None else tried
    regions = {region.name: region for region in resolve_regions(model, list(tried))}
    planner = unrun_planner(model, remaining=remaining)
    planner.launch_bound = launch_bound
    planner._all_candidates = [Candidate(region, forward_ms=share, share=share, units=2) for name, share in tried.items()
                               for region in [regions[name]]]
    for name in kept:
        planner._kept.append(regions[name])
    planner.decisions = decisions if decisions is not None else [
        Decision(region=name, modules=[], mode="default", kept=name in kept, reason="", step=10, step_ms=2.0)
        for name in tried
    ]
    planner.watch.stats["blocks.*"].recompiles = recompiles
    return planner._graphs_of_the_largest_tried(current_ms=2.0, trials=trials), planner.notes


def test_the_largest_region_tried_and_not_kept_gets_cuda_graphs_on_top_of_what_was_kept():
    for kept in ((), ("head",)):
        chosen, notes = largest_tried(kept=kept)
        assert chosen is not None and chosen.name == "blocks.*" and chosen.mode == "reduce-overhead", (kept, notes)
        assert notes == []


def test_no_graphs_of_the_largest_region_where_it_was_kept_or_graphs_were_tried_or_the_step_keeps_ahead():
    assert largest_tried(kept=("blocks.*",)) == (None, [])  # the kept plan's own graph trial follows instead
    assert largest_tried(launch_bound=False) == (None, [])
    tried_graphs = [Decision(region="model", modules=[""], mode="reduce-overhead", kept=False, reason="", step=5, step_ms=3.0),
                    Decision(region="blocks.*", modules=[], mode="default", kept=False, reason="", step=9, step_ms=2.0)]
    assert largest_tried(decisions=tried_graphs) == (None, [])
    # A trial that was never measured (failed verification, skipped) is not "tried": the next largest is.
    unmeasured = [Decision(region="blocks.*", modules=[], mode="default", kept=False, reason="", step=9),
                  Decision(region="head", modules=[], mode="default", kept=False, reason="", step=9, step_ms=2.0)]
    chosen, _ = largest_tried(decisions=unmeasured)
    assert chosen is not None and chosen.name == "head"


@pytest.mark.parametrize("setting, says", [
    (dict(recompiles=5), "it recompiled in default mode"),
    (dict(trials=3), "max_trials=3 reached"),
    (dict(remaining=0), "the run ends before a trial could finish"),
])
def test_where_the_largest_regions_graphs_are_not_tried_a_note_says_why(setting, says):
    chosen, notes = largest_tried(**setting)
    assert chosen is None and len(notes) == 1, notes
    assert notes[0].startswith("reduce-overhead (CUDA graphs) of `blocks.*`, whose default mode was not kept, not tried: ")
    assert says in notes[0], notes


@pytest.mark.parametrize("options", [dict(mode="max-autotune"), dict(options={"triton.cudagraphs": True})])
def test_a_users_mode_that_captures_cuda_graphs_gets_the_cuda_graph_trials_memory_rule(options):
    """``mode="max-autotune"`` (or Inductor's own ``triton.cudagraphs``) captures CUDA graphs as
    ``reduce-overhead`` does: a region's trial in it is not interleaved with eager steps (both memories
    at once) and its pool must fit beside the rest, or it is not tried and nothing is compiled."""
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    (kept,) = planner.regions
    planner.options = CompileOptions(backend="inductor", **options)
    assert not planner._graphs(planner.options)  # on CPU Inductor captures none: trials interleave as usual
    planner._graphs = lambda options: options.cuda_graphs  # as on a CUDA device
    planner.activation_bytes = lambda: 3 * 2**30
    planner.room_bytes = lambda: 2**30
    (region,) = resolve_regions(model, ["head.linear"])
    candidate = Candidate(region, forward_ms=1.0, share=0.5)
    assert planner._trial_batches(candidate) == planner._graph_trial_batches()
    labels = list(planner._trial(candidate, 2.0, label="trial:0"))
    assert labels and set(labels) <= {"trial:0" + CONTROL, None}, labels  # the plan before it, timed right before it
    decision = planner.decisions[-1]
    assert not decision.kept and decision.reason == (
        "not tried: its CUDA-graph pool would hold up to 3.0 GB (the eager step's activations) and 1.0 GB are free")
    assert not region.is_compiled and kept.is_compiled


def test_which_compile_arguments_capture_cuda_graphs():
    assert [CompileOptions(**kw).cuda_graphs for kw in (
        dict(), dict(mode="default"), dict(mode="max-autotune-no-cudagraphs"), dict(backend="aot_eager"),
        dict(mode="reduce-overhead"), dict(mode="max-autotune"), dict(options={"triton.cudagraphs": True}),
        dict(backend="cudagraphs"),
    )] == [False] * 4 + [True] * 4


def test_with_the_users_inductor_options_the_cuda_graph_trial_adds_them_no_mode():
    """``CompileCallback(options={...})`` with the mode left to the planner: torch.compile refuses a mode beside
    options, so the CUDA-graph trial compiles the user's options with ``triton.cudagraphs`` (before, it raised
    out of the fit). The decision names it ``reduce-overhead``, and a resumed run compiles the same."""
    model, x = Model(), torch.randn(4, 8)
    planner = make_planner(model, x, trial_ms=1.0)
    user = {"epilogue_fusion": True}
    planner.options = CompileOptions(backend="inductor", options=user)
    drive(planner, model, x)
    decision = planner.decisions[-1]
    assert decision.kept and decision.mode == "reduce-overhead", decision
    (region,) = planner.regions
    assert region.compiled_with.mode is None and region.compiled_with.options == {**user, "triton.cudagraphs": True}
    assert planner.options.options == user  # the user's own dict is not changed
    planner.frozen = True  # as the search ends
    saved = planner.state_dict()
    resumed = make_planner(Model(), x, trial_ms=1.0)
    resumed.options, resumed.regions = planner.options, []
    resumed.load_state_dict(saved)
    resumed._apply_saved_plan(resumed._saved_plan)
    assert [r.compiled_with.options for r in resumed.regions] == [{**user, "triton.cudagraphs": True}]


def test_where_no_cuda_graph_trial_can_be_had_none_is_planned():
    """Inductor options that run CUDA graphs already need no second trial (their decisions name
    ``reduce-overhead``); another backend has no CUDA-graph mode of Inductor's to try."""
    graphs = CompileOptions(options={"triton.cudagraphs": True})
    assert graphs.with_cuda_graphs() is None and graphs.mode_name == "reduce-overhead"
    assert CompileOptions(backend="aot_eager").with_cuda_graphs() is None
    assert CompileOptions().with_cuda_graphs() == CompileOptions(mode="reduce-overhead")
    planner = make_planner(Model(), torch.randn(4, 8), trial_ms=1.0)
    planner.launch_bound = True
    assert planner._graphs_first()
    planner.device = torch.device("cuda")  # not run: only the rule is read
    assert planner._graphs(CompileOptions(mode="max-autotune")) and not planner._graphs(CompileOptions())
    assert CompileOptions(mode="default", options={"triton.cudagraphs": True}).mode_name == "reduce-overhead"
    planner.options = CompileOptions(backend="aot_eager")
    assert not planner._graphs_first()


def kept_plan_graphs(*, options: CompileOptions | None = None, trials: int = 0, max_trials: int = 3) -> list[str]:
    """The notes of a launch-bound GPU planner's last step, ``blocks.*`` kept and no CUDA graphs tried yet, where
    the kept plan's graph trial is not to be had (it would take steps: the test fails on the first)."""
    model = Blocks()
    (region,) = resolve_regions(model, ["blocks.*"])
    planner = unrun_planner(model, options, max_trials=max_trials)
    planner.launch_bound = True
    planner._kept.append(region)
    planner.regions.append(region)
    assert next(planner._kept_plan_graphs(2.0, trials, tried_graphs=False), None) is None, planner.notes
    return planner.notes


def test_the_kept_plans_cuda_graph_trial_is_not_had_past_max_trials_nor_against_the_users_options():
    assert kept_plan_graphs(trials=3, max_trials=3) == [
        "reduce-overhead (CUDA graphs) of the kept plan not tried: max_trials=3 reached"]
    assert kept_plan_graphs(options=CompileOptions(options={"triton.cudagraphs": False})) == [
        "reduce-overhead (CUDA graphs) not tried: the options turn them off (triton.cudagraphs=False)"]
    assert kept_plan_graphs(options=CompileOptions(backend="aot_eager")) == [
        "reduce-overhead (CUDA graphs) not tried: backend 'aot_eager' has no CUDA-graph mode (Inductor's has)"]
    assert CompileOptions(options={"triton.cudagraphs": False, "max_autotune": True}).with_cuda_graphs() is None


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])


class Wrapper(nn.Module):
    """``self.model`` with repeated blocks and a small ``aux`` beside it; training_step calls both, no forward."""

    def __init__(self) -> None:
        super().__init__()
        self.model, self.aux = Inner(), nn.Linear(4, 4)


class Profiled:
    def __init__(self, forward_ms: dict[str, float]) -> None:
        self._forward, self.seen = forward_ms, set(forward_ms)

    def forward_ms(self) -> dict[str, float]:
        return dict(self._forward)


def ranks_candidates(model_ms: dict[int, float]) -> dict[int, list[tuple[str, bool]]]:
    """Each simulated DDP rank's candidates, its own ``self.model`` time against ``aux``'s 1 ms, every value
    agreed as rank 0's (``agree``: rank 0 answers first and its answers are every rank's)."""
    answers: list = []
    out = {}
    for rank in sorted(model_ms):
        def agree(value, rank=rank):
            if rank == 0:
                answers.append(value)
                return value
            return answers.pop(0)

        planner = unrun_planner(Wrapper(), CompileOptions(backend="eager"), device="cpu", remaining=1000, agree=agree)
        planner.eager_ms = 10.0
        planner.profiler = Profiled({"model": model_ms[rank], "model.h.0": 2.0, "model.h.1": 2.0, "model.h.2": 2.0,
                                     "aux": 1.0})
        planner._all_candidates = planner._candidates({})
        out[rank] = [c.name for c in planner._order(planner._all_candidates)]
        holder = next((c for c in planner._all_candidates if c.whole), None)
        if holder is not None:  # kept: the plan covers the whole step
            planner.regions.append(holder.region)
            assert planner._coverage() == 1.0
    return out


def test_the_whole_model_stand_in_is_rank_zeros_on_every_rank():
    """9.2 of 10.2 ms (90.2%) holds the step on rank 0, 8.8 of 9.8 (89.8%) would not on rank 1: both ranks
    try rank 0's candidates in rank 0's order (a rank with its own list failed looking rank 0's names up)."""
    orders = ranks_candidates({0: 9.2, 1: 8.8})
    assert orders[0] == orders[1] and orders[0][0] == "self.model", orders
