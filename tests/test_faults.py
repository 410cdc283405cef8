"""Fault injection: a region whose compile or compiled code fails never costs the run a step."""

import pytest
import torch
from torch import nn
from torch._dynamo import register_backend  # the documented way to add a custom backend

from compile_callback import CompileCallback, torch_internals
from tests.conftest import TinyModel, loader, make_trainer, seeded_fit


def _raise_at_compile(gm, example_inputs):
    raise RuntimeError("injected: backend failed to compile")


def _raises_on_call(number: int, message: str):
    """A backend whose compiled code raises ``message`` on its ``number``-th call, and runs otherwise."""

    def backend(gm, example_inputs):
        calls = {"n": 0}

        def run(*args):
            calls["n"] += 1
            if calls["n"] == number:
                raise RuntimeError(message)
            return gm.forward(*args)

        return run

    return backend


for _name, _fn in [
    ("test_raise_at_compile", _raise_at_compile),
    ("test_raise_at_first_call", _raises_on_call(1, "injected: compiled code failed on its first call")),
    ("test_raise_on_third_call", _raises_on_call(3, "injected: compiled code failed on a later call")),
]:
    try:
        register_backend(compiler_fn=_fn, name=_name)
    except Exception:
        pass  # registered already in this process


def losses(tmp_path, callbacks):
    return seeded_fit(tmp_path, callbacks, TinyModel, seed=3, max_epochs=2)


@pytest.mark.parametrize("backend", ["test_raise_at_compile", "test_raise_at_first_call"])
@pytest.mark.parametrize("regions", [["blocks.*", "head"], "model"])
def test_failing_region_reverts_and_the_run_matches_eager(tmp_path, backend, regions):
    eager_losses, _, _ = losses(tmp_path / "eager", [])
    callback = CompileCallback(regions, backend=backend, eager_baseline_steps=2, warmup_steps=1)
    fault_losses, model, trainer = losses(tmp_path / "fault", [callback])
    assert fault_losses == pytest.approx(eager_losses, rel=1e-6)  # reverted before it affected anything
    assert model.batches_seen == 2 * 12 and trainer.global_step == 2 * 12  # none skipped, none repeated
    assert not any(torch_internals.is_module_compiled(m) for m in model.modules())
    decisions = callback.last_report["decisions"]
    assert all(not d["kept"] for d in decisions)
    for decision in decisions:
        assert decision["reason"].startswith("failed at run time, reverted to eager and the call rerun eagerly: ")
        assert "injected: " in decision["reason"], decision["reason"]


def test_fullgraph_break_reverts_instead_of_crashing(tmp_path):
    from tests.conftest import BreakingBlock

    callback = CompileCallback(["blocks.*"], backend="eager", fullgraph=True, eager_baseline_steps=2, warmup_steps=1)
    model = TinyModel(block=BreakingBlock)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    trainer.fit(model, loader(batch_size=8))
    assert model.batches_seen == 12
    decision = callback.last_report["decisions"][0]
    assert not decision["kept"] and "failed at run time" in decision["reason"]


def test_auto_region_failing_at_run_time_after_verification_is_reverted(tmp_path):
    """Compiled code that passes verification and then fails on a later call (here: its third)."""
    callback = CompileCallback(backend="test_raise_on_third_call", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=1)
    eager_losses, _, _ = losses(tmp_path / "eager", [])
    fault_losses, model, trainer = losses(tmp_path / "fault", [callback])
    assert model.batches_seen == 24 and trainer.global_step == 24
    decision = callback.last_report["decisions"][0]
    assert not decision["kept"] and "injected: compiled code failed on a later call" in decision["reason"]
    assert fault_losses == pytest.approx(eager_losses, rel=1e-5)


def _forward_compiles_backward_raises(gm, example_inputs):
    from torch._dynamo.backends.common import aot_autograd  # the documented helper for AOT backends

    def forward_compiler(graph, inputs):
        return graph.forward

    def backward_compiler(graph, inputs):
        raise RuntimeError("injected: the backward graph failed to compile")

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)(gm, example_inputs)


try:
    register_backend(compiler_fn=_forward_compiles_backward_raises, name="test_raise_at_backward_compile")
except Exception:
    pass


@pytest.mark.parametrize("regions", [["blocks.*", "head"], "model"])
def test_backward_that_fails_to_compile_reverts_before_the_step(tmp_path, regions):
    """Compiled lazily, this backward would fail inside loss.backward(), past the point of rerunning
    the call; the callback has AOTAutograd compile it with the forward, so the forward's guard catches it."""
    import torch._functorch.config as functorch_config

    before = functorch_config.force_non_lazy_backward_lowering
    eager_losses, _, _ = losses(tmp_path / "eager", [])
    callback = CompileCallback(regions, backend="test_raise_at_backward_compile", eager_baseline_steps=2, warmup_steps=1)
    fault_losses, model, trainer = losses(tmp_path / "fault", [callback])
    assert fault_losses == pytest.approx(eager_losses, rel=1e-6)
    assert model.batches_seen == 2 * 12 and trainer.global_step == 2 * 12
    reasons = [d["reason"] for d in callback.last_report["decisions"]]
    assert reasons and all("injected: the backward graph failed to compile" in r for r in reasons), reasons
    assert functorch_config.force_non_lazy_backward_lowering == before  # restored after fit


def test_without_eager_backward_lowering_the_failure_would_reach_backward(tmp_path, monkeypatch):
    """The control: with the setting kept off, the same backend fails inside loss.backward()."""
    monkeypatch.setattr(torch_internals, "compile_backward_with_forward", lambda on: None)
    callback = CompileCallback("model", backend="test_raise_at_backward_compile", eager_baseline_steps=2, warmup_steps=1)
    with pytest.raises(Exception, match="injected: the backward graph failed to compile"):
        losses(tmp_path, [callback])


def test_an_exception_in_user_code_gives_back_process_wide_settings(tmp_path, monkeypatch):
    """Lightning calls no teardown hook after an exception: the callback restores what it changed anyway."""
    import os

    import torch._functorch.config as functorch_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    before = functorch_config.force_non_lazy_backward_lowering

    class Failing(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 5:
                raise RuntimeError("user error")
            return super().training_step(batch, batch_idx)

    callback = CompileCallback("model", backend="eager", cache_dir=str(tmp_path / "cache"), eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback])
    with pytest.raises(RuntimeError, match="user error"):
        trainer.fit(Failing(), loader(batch_size=8))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"
    assert functorch_config.force_non_lazy_backward_lowering == before
    assert callback.run.watch._handles is None  # dynamo's compile hooks removed


def _backward_raises_when_run(gm, example_inputs):
    from torch._dynamo.backends.common import aot_autograd

    def forward_compiler(graph, inputs):
        return graph.forward

    def backward_compiler(graph, inputs):
        def run(*args):
            raise RuntimeError("injected: the compiled backward failed when run")

        return run

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)(gm, example_inputs)


try:
    register_backend(compiler_fn=_backward_raises_when_run, name="test_backward_raises_when_run")
except Exception:
    pass


def test_auto_verification_runs_the_compiled_backward_before_training_does(tmp_path):
    """A compiled backward that fails when it runs would surface inside loss.backward(), where the step
    cannot be redone without running training_step twice. regions="auto" verifies each region on a held
    input, outputs and gradients, before any training step uses it: the failure shows there."""
    callback = CompileCallback(backend="test_backward_raises_when_run", eager_baseline_steps=3, warmup_steps=1,
                               trial_steps=3, max_trials=2)
    eager_losses, _, _ = losses(tmp_path / "eager", [])
    fault_losses, model, trainer = losses(tmp_path / "fault", [callback])
    assert model.batches_seen == 24 and trainer.global_step == 24
    decisions = callback.last_report["decisions"]
    tried = [d for d in decisions if not d["reason"].startswith("skipped")]  # the others priced at the compile it took
    assert tried and all(not d["kept"] for d in decisions)
    assert all("injected: the compiled backward failed when run" in d["reason"] for d in tried), decisions
    assert fault_losses == pytest.approx(eager_losses, rel=1e-5)


# -- state a doubled or skipped call would leave behind --------------------------------------------------


class StatefulBlock(nn.Module):
    """BatchNorm (running statistics, num_batches_tracked) and dropout (draws from the global RNG): a
    call made twice, or not at all, shows in the buffers, the RNG stream and the losses."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)
        self.dropout = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(torch.relu(self.norm(self.linear(x)))) + x


class StatefulModel(TinyModel):
    def __init__(self) -> None:
        super().__init__(block=StatefulBlock)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)  # momentum buffers: optimizer state


def stateful_fit(tmp_path, callbacks):
    """A seeded fit of 2 epochs (24 batches); returns what a rerun call could change: losses, model state (parameters
    and buffers), optimizer state and the global RNG state after fit."""
    recorded, model, trainer = seeded_fit(tmp_path, callbacks, StatefulModel, seed=5, max_epochs=2)
    return {
        "losses": recorded,
        "state": {name: value.clone() for name, value in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "rng": torch.get_rng_state(),
        "model": model,
        "trainer": trainer,
    }


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory):
    """The same seeded fit without the callback (deterministic: made once for the module)."""
    return stateful_fit(tmp_path_factory.mktemp("eager"), [])


def assert_same_run(fault, eager):
    tracked = {n: int(v) for n, v in fault["state"].items() if n.endswith("num_batches_tracked")}
    assert len(tracked) == 3 and set(tracked.values()) == {2 * 12}, tracked  # one forward a batch, none doubled
    assert fault["state"].keys() == eager["state"].keys()
    for name, value in eager["state"].items():
        assert torch.equal(fault["state"][name], value), name  # running statistics, weights
    assert torch.equal(fault["rng"], eager["rng"])  # dropout drew its masks once a batch
    assert fault["losses"] == eager["losses"]  # all eager in the end: the same numbers, bit for bit
    fault_opt, eager_opt = fault["optimizer"], eager["optimizer"]
    assert fault_opt["param_groups"] == eager_opt["param_groups"]
    assert fault_opt["state"].keys() == eager_opt["state"].keys() and eager_opt["state"]
    for index, state in eager_opt["state"].items():
        assert torch.equal(fault_opt["state"][index]["momentum_buffer"], state["momentum_buffer"]), index
    assert fault["trainer"].global_step == eager["trainer"].global_step == 2 * 12


@pytest.mark.parametrize(("regions", "backend"), [
    (["blocks.*"], "test_raise_at_compile"),  # three guarded blocks, each rerun once
    ("model", "test_raise_at_first_call"),
    (["blocks.*"], "test_raise_at_backward_compile"),
])
def test_a_failing_call_is_rerun_eagerly_once_leaving_the_state_of_an_eager_run(tmp_path, eager_run, backend, regions):
    """The guarded region holds BatchNorm and dropout; the failing call is rerun eagerly exactly once."""
    callback = CompileCallback(regions, backend=backend, eager_baseline_steps=2, warmup_steps=1)
    fault = stateful_fit(tmp_path / "fault", [callback])
    decisions = callback.last_report["decisions"]
    assert decisions and all(not d["kept"] and "failed at run time" in d["reason"] for d in decisions), decisions
    assert not any(torch_internals.is_module_compiled(m) for m in fault["model"].modules())
    assert_same_run(fault, eager_run)


def test_a_call_failing_after_verification_is_rerun_once_in_an_auto_fit(tmp_path, eager_run):
    """regions="auto": verification runs the compiled region (and restores buffers and RNG), then the
    third compiled call, in training, fails and is rerun eagerly."""
    callback = CompileCallback(backend="test_raise_on_third_call", eager_baseline_steps=3, warmup_steps=1,
                               trial_steps=3, max_trials=1)
    fault = stateful_fit(tmp_path / "fault", [callback])
    (decision,) = callback.last_report["decisions"]
    assert not decision["kept"] and "injected: compiled code failed on a later call" in decision["reason"]
    assert_same_run(fault, eager_run)
