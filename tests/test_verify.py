"""Verification: per-tensor errors with their scale, the bf16 rule on CPU, and out-of-memory as a fault."""

import pytest
import torch
from torch._dynamo import register_backend

from compile_callback import CompileCallback, torch_internals
from compile_callback.report import render_markdown
from compile_callback.verify import TensorError, _errors, further_from_fp32
from tests.conftest import TinyModel, seeded_fit

CPU = torch.device("cpu")


def test_a_gradient_the_loss_barely_reaches_is_judged_against_its_kinds_scale():
    big = torch.randn(1000)
    tiny = torch.randn(1000) * 1e-9
    names = ["grad of big", "grad of tiny"]
    # 10% off relative to its own norm, but 1e-10 absolute where its siblings are ~1: not a disagreement.
    errors = _errors(names, [big, tiny * 1.1], [big, tiny], CPU)
    assert errors[1].absolute and errors[1].error < 1e-6, errors
    assert "reference norm" in errors[1].describe() and "grad of tiny" in errors[1].describe()
    # A meaningful gradient 1% off is judged by its own norm, and named.
    errors = _errors(names, [big * 1.01, tiny], [big, tiny], CPU)
    assert not errors[0].absolute and errors[0].error == pytest.approx(0.01, rel=1e-3)
    # A NaN where the reference is finite is a disagreement whatever the scale.
    broken = tiny.clone()
    broken[0] = float("nan")
    assert _errors(names, [big, broken], [big, tiny], CPU)[1].error == float("inf")


def test_the_fp32_rule_allows_one_rounding_unit_where_eagers_own_error_is_tiny():
    """Session 9, HF BERT on the H200: the loss 2e-4 from fp32 eagerly and 1.7e-3 compiled (a bf16
    rounding unit is 7.8e-3) was rejected by a floor of 1e-3; the same 1.7e-3 in fp16 (unit 9.8e-4) is
    still too far, and so is 2% in bf16."""
    eager = [TensorError("output", 2e-4, 10.0, False), TensorError("grad of w", 0.83, 2e-3, False)]
    compiled = [TensorError("output", 1.7e-3, 10.0, False), TensorError("grad of w", 0.92, 2e-3, False)]
    assert further_from_fp32(eager, compiled, torch.bfloat16) is None
    assert further_from_fp32(eager, compiled, torch.float16).startswith("output (further from fp32 than eager: 1.7e-03")
    wrong = [TensorError("output", 2e-2, 10.0, False), compiled[1]]
    assert further_from_fp32(eager, wrong, torch.bfloat16).startswith("output (further")
    # A gradient eager itself gets 83% wrong may be 92% off compiled (both are bf16 noise); 2x + a unit is the bound.
    assert further_from_fp32(eager, [compiled[0], TensorError("grad of w", 1.7, 2e-3, False)], torch.bfloat16) \
        .startswith("grad of w (further")


def _scaled(factor: float):
    """A backend whose floating outputs are ``factor`` times the graph's."""

    def backend(gm, example_inputs):
        def run(*args):
            outputs = gm.forward(*args)
            return [o * factor if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outputs]

        return run

    return backend


_perturbed = _scaled(1.2)
_rounded = _scaled(1.01)  # 1% off: past fp32's tolerance, within bf16's


def _oom_on_first_call(gm, example_inputs):
    calls = {"n": 0}

    def run(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return gm.forward(*args)

    return run


def _oom_at_compile(gm, example_inputs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB (injected at compile)")


for _name, _fn in [("test_verify_perturbed", _perturbed), ("test_verify_rounded", _rounded), ("test_oom_first_call", _oom_on_first_call),
                   ("test_oom_at_compile", _oom_at_compile)]:
    try:
        register_backend(compiler_fn=_fn, name=_name)
    except Exception:
        pass  # registered already in this process


def fit(tmp_path, callbacks, **kwargs):
    return seeded_fit(tmp_path, callbacks, TinyModel, seed=5, max_epochs=kwargs.pop("max_epochs", 3), **kwargs)


def test_bf16_rule_on_cpu_keeps_a_faithful_compile_and_rejects_a_wrong_one(tmp_path):
    auto = dict(eager_baseline_steps=4, warmup_steps=1, trial_steps=4, max_trials=1, min_speedup=1.0)
    good = CompileCallback(backend="aot_eager", **auto)
    fit(tmp_path / "good", [good], precision="bf16-mixed")
    decision = good.last_report["decisions"][0]
    assert decision["max_rel_error"] is not None and "numerics" not in decision["reason"], decision
    # The report names the tensor the error is from (issue 20: a bare "1.1e+00" beside "kept" told nothing).
    assert decision["error_in"] == "output" or decision["error_in"].startswith("grad of "), decision
    assert f"in {decision['error_in']}" in render_markdown(good.last_report)
    assert decision["peak_gb"] is None  # the fit's memory peak so far: a CUDA figure
    # Within bf16's tolerance of eager: no fp32 reference was run (its fp32 activations cost memory).
    bad = CompileCallback(backend="test_verify_perturbed", **auto)
    fit(tmp_path / "bad", [bad], precision="bf16-mixed")
    decision = bad.last_report["decisions"][0]
    assert not decision["kept"] and "further from fp32 than eager" in decision["reason"], decision


@pytest.mark.parametrize("backend", ["test_verify_rounded", "test_verify_perturbed"])
def test_a_model_trained_in_bf16_true_precision_is_verified_to_bf16s_tolerance(tmp_path, backend):
    """Lightning's ``precision="bf16-true"`` casts the parameters to bf16, with no autocast: a compile 1% off
    eager (bf16 rounding) passes as under ``"bf16-mixed"``, where fp32's 1e-3 refused every compiled model
    (HF GPT-2 with Inductor on CPU: 1.1e-2 off); 20% off fails on bf16's tolerance alone, with no fp32
    reference (the parameters are bf16: autocast off computes in bf16 all the same)."""
    auto = dict(eager_baseline_steps=4, warmup_steps=1, trial_steps=4, max_trials=1, min_speedup=1.0)
    callback = CompileCallback(backend=backend, **auto)
    fit(tmp_path, [callback], precision="bf16-true")
    decision = callback.last_report["decisions"][0]
    if backend == "test_verify_rounded":
        assert 1e-3 < decision["max_rel_error"] < 5e-2 and "numerics" not in decision["reason"], decision
    else:
        assert not decision["kept"] and decision["reason"].startswith("numerics differ from eager"), decision
        assert decision["reason"].endswith("tolerance 5e-02") and "fp32" not in decision["reason"], decision


@pytest.mark.parametrize("backend", ["test_oom_first_call", "test_oom_at_compile"])
@pytest.mark.parametrize("regions", ["auto", "model"])
def test_out_of_memory_reverts_and_the_run_matches_eager(tmp_path, backend, regions):
    eager_losses, _, _ = fit(tmp_path / "eager", [])
    callback = CompileCallback(regions, backend=backend, eager_baseline_steps=2, warmup_steps=1, trial_steps=4)
    losses, model, trainer = fit(tmp_path / "oom", [callback])
    assert trainer.global_step == 3 * 12 and model.batches_seen == 3 * 12  # no batch skipped or repeated
    assert losses == pytest.approx(eager_losses, rel=1e-6)
    reasons = " ".join(d["reason"] for d in callback.last_report["decisions"])
    assert "out of memory" in reasons and "injected" in reasons, callback.last_report["decisions"]
    assert not any(d["kept"] for d in callback.last_report["decisions"])


def _autocast_states(module):
    states = []
    module.register_forward_pre_hook(lambda *_: states.append(torch.is_autocast_enabled("cpu")))
    return states


@pytest.mark.parametrize(("backend", "reference_runs"), [("aot_eager", 0), ("test_verify_perturbed", 1)])
def test_the_fp32_reference_runs_only_for_a_tensor_past_bf16s_tolerance(backend, reference_runs):
    from compile_callback.verify import verify_module

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    states = _autocast_states(module[0])
    module.compile(backend=backend)
    x = torch.randn(32, 8)
    result = verify_module(module, (x,), {}, context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert result.passed == (reference_runs == 0), result
    assert states.count(False) == reference_runs, states  # autocast off: the fp32 reference's forward
    if reference_runs:
        assert "further from fp32 than eager" in result.where


def test_only_storages_that_hold_bytes_and_resize_are_parked():
    import numpy as np

    from compile_callback.verify import parkable

    assert parkable(torch.ones(4).untyped_storage())
    assert not parkable(torch.empty(0).untyped_storage())
    assert not parkable(torch.from_numpy(np.ones(4, dtype=np.float32)).untyped_storage())  # not resizable


class _WithDropoutAndABreak(TinyModel):
    def __init__(self):
        super().__init__(width=8, depth=1)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        x = self.embed(self.drop(x))
        torch._dynamo.graph_break()  # as HF GPT-2's loss_function warning does: frames below it are shared code
        return self.head(self.blocks[0](x))


def _record_inductor_graphs(monkeypatch) -> list[dict]:
    """Per graph Inductor compiles from now on: whether fallback_random was on, and its calls since."""
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as inductor_config

    graphs: list[dict] = []
    real = compile_fx.compile_fx

    inside = []  # compile_fx calls itself once with a backend's options applied: record the outer call

    def recording(gm, example_inputs, *args, **kwargs):
        if inside:
            return real(gm, example_inputs, *args, **kwargs)
        graph = {"fallback_random": inductor_config.fallback_random, "calls": 0}
        graphs.append(graph)
        inside.append(gm)
        try:
            compiled = real(gm, example_inputs, *args, **kwargs)
        finally:
            inside.pop()

        def run(*inputs):
            graph["calls"] += 1
            return compiled(*inputs)

        return run

    monkeypatch.setattr(compile_fx, "compile_fx", recording)
    return graphs


def test_a_region_that_draws_random_numbers_is_verified_on_a_twin_and_trains_on_its_own_graph(tmp_path, monkeypatch):
    """Verifying dropout needs Inductor's fallback_random (random numbers drawn like eager), whose graph
    saves what it draws for the backward (on the H200 BERT's step took 16.3 GB against 14.05): the twin
    compiled that way runs once, in verification; the steps run graphs compiled without it. The twin's
    compiles, and the recompiles the region's own graph makes where the twin's was cached first (below
    the graph break), are counted apart from the region's."""
    graphs = _record_inductor_graphs(monkeypatch)
    torch._dynamo.reset()
    callback = CompileCallback(eager_baseline_steps=2, warmup_steps=1, trial_steps=4, max_trials=1, anatomy=False)
    losses, model, trainer = seeded_fit(tmp_path, [callback], _WithDropoutAndABreak, seed=5, max_epochs=3)
    assert model.drop.p == 0.2 and not torch_internals.twin_running()  # dropout back on, no twin left running
    decision = callback.last_report["decisions"][0]
    assert decision["region"] == "model" and decision["max_rel_error"] is not None, decision
    assert decision["max_rel_error"] < 1e-3, decision  # the twin drew dropout's numbers as eager did
    twins = [g for g in graphs if g["fallback_random"]]
    trained = [g for g in graphs if g["calls"] > 1]
    assert twins and all(g["calls"] == 1 for g in twins), graphs  # run once, in verification
    assert trained and not any(g["fallback_random"] for g in trained), graphs
    assert min(g["calls"] for g in trained) >= 1 + 4, graphs  # warm-up and trial steps
    regions = callback.last_report["regions"]
    assert regions["model"]["graphs"] >= 1 and regions["model"]["recompiles"] == 0, regions
    twin = regions["model (verification twin)"]
    assert twin["graphs"] == len(twins) and twin["recompiles"] >= 1, regions  # its own graph, below the break
    assert len(losses) == trainer.global_step == 36
    torch._dynamo.reset()


def test_the_modules_of_one_region_share_one_twin_and_leave_nothing_behind(monkeypatch):
    """``blocks.*`` with dropout: the region's own graph compiles once for all blocks, and so does the twin
    that verifies them (one compile, not one a block); the twin's compiled code goes with it."""
    from compile_callback.regions import CompileOptions
    from compile_callback.verify import verify_module

    graphs = _record_inductor_graphs(monkeypatch)
    torch._dynamo.reset()
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3)) for _ in range(3)]
    options = CompileOptions()
    scope = torch_internals.TwinScope()
    for block in blocks:
        block.compile(**options.as_kwargs())
        result = verify_module(block, (torch.randn(4, 8),), {}, options=options, twin_scope=scope)
        assert result.passed and result.max_rel_error < 1e-5, result
    assert [g["fallback_random"] for g in graphs] == [True], graphs  # one twin compile, no training graph yet
    assert [b[1].p for b in blocks] == [0.3] * 3
    assert not any(name.startswith("__compiled_fn") for name in vars(torch_internals))  # kept in the twin's own globals
    torch._dynamo.reset()


def test_a_group_of_blocks_is_verified_with_the_optimizers_state_left_in_place(tmp_path, monkeypatch):
    """The whole model's verification needs a step's activations two or three times over: the optimizer's state
    and the last step's gradients wait in host memory meanwhile. A group of four or more blocks verifies one
    block at a time, each at most a quarter of those activations: both stay (parking the state was ~1.5 s of
    GPT-2's blocks' set-up on the H200); a group of fewer blocks parks both."""
    import lightning as L
    import torch.optim

    from compile_callback import planner as planner_module
    from tests.conftest import loader, make_trainer

    parked: dict[str, list[tuple[int, int, int, int]]] = {}
    verifying: list[str] = []
    original_verify, original_park = planner_module.AutoPlanner._verify, planner_module.in_host_memory

    def verify(self, region):
        verifying.append(region.name)
        return original_verify(self, region)

    def park(tensors):  # which of them are the optimizer's state, which the last step's gradients
        ids = {id(t) for t in tensors}
        state = {id(t) for s in trainer.optimizers[0].state.values() for t in s.values() if torch.is_tensor(t)}
        grads = {id(p.grad) for p in model.parameters() if p.grad is not None}
        parked.setdefault(verifying[-1], []).append((len(ids & state), len(state), len(ids & grads), len(grads)))
        return original_park(tensors)

    monkeypatch.setattr(planner_module.AutoPlanner, "_verify", verify)
    monkeypatch.setattr(planner_module, "in_host_memory", park)

    class Adam(TinyModel):
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class StopWhenPlanned(L.Callback):  # a long run planned (every trial repays), ended once the plan is frozen
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.should_stop = callback.run.planner.frozen

    def fit(depth):
        nonlocal model, callback, trainer
        parked.clear()
        model = Adam(depth=depth)
        # nothing kept, whatever the host does to the timings: every candidate is tried (a busy host once
        # timed the eager backend's whole model 2.7x faster than eager and kept it at min_speedup=1.5, session 47)
        callback = CompileCallback(backend="eager", eager_baseline_steps=2, warmup_steps=1, trial_steps=4,
                                   max_trials=3, min_speedup=1e6)
        trainer = make_trainer(tmp_path, [callback, StopWhenPlanned()], max_steps=100_000, max_epochs=-1,
                               limit_val_batches=0)
        trainer.fit(model, loader(batch_size=8))
        assert {"model", "blocks.*"} <= set(parked), (parked, callback.last_report["decisions"])
        return parked["model"], parked["blocks.*"]

    model = callback = trainer = None
    [(state_parked, state, grads_parked, grads)], [group] = fit(planner_module.GROUP_UNPARKED)
    assert state > 0 and state_parked == state and grads_parked == grads > 0, parked
    state_parked, state, grads_parked, grads = group
    assert state > 0 and state_parked == 0 and grads > 0 and grads_parked == 0, parked
    _, [(state_parked, state, grads_parked, grads)] = fit(planner_module.GROUP_UNPARKED - 1)  # fewer blocks: larger parts
    assert state > 0 and state_parked == state and grads_parked == grads > 0, parked
