"""The process after a CompileCallback fit is the process before it.

A snapshot of every process-wide thing the callback, dynamo or the profiler could change (dynamo,
Inductor and functorch config, dynamo's frame-evaluation callback and stance, environment, global module hooks, dynamo's compile-event callbacks
(where the callback's watch listens), torch function and dispatch modes,
profilers, Python's profile/trace functions, autograd and backend flags, saved-tensor hooks, torch's
loggers, threads) is taken before a fit and after it, and must be equal: with regions kept, with a
region tried and reverted, and with padding injected into the loaders. The modules the callback
reverted, or never compiled, carry no hook and no compiled call afterwards.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import pytest
import torch
from torch import nn
from torch._dynamo import register_backend  # the documented way to add a custom backend

from compile_callback import CompileCallback
from tests.conftest import FasterCompiled, TinyModel, loader, make_trainer
from tests.test_padding import ModelWithLoaders, padded


def _slower(gm, example_inputs):
    def run(*args):
        time.sleep(0.05)  # a margin no loaded machine closes: the trial surely reverts it
        return gm.forward(*args)

    return run


try:
    register_backend(compiler_fn=_slower, name="test_state_slower")
except Exception:
    pass  # registered by an earlier test in this process


def _configs() -> dict[str, object]:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    return {
        f"{name}.{key}": repr(value)
        for name, config in (("dynamo", torch._dynamo.config), ("inductor", inductor_config), ("functorch", functorch_config))
        for key, value in config.get_config_copy().items()
    }


def snapshot() -> dict[str, object]:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback
    from torch._dynamo.callback import callback_handler
    from torch.overrides import _get_current_function_mode_stack

    module_globals = torch.nn.modules.module
    # torch drops its own lazy structured-trace handler at the first compile (plain torch.compile does it too).
    loggers = {
        name: (logger.level, len(logger.handlers), logger.propagate, logger.disabled)
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and name.split(".")[0] in ("torch", "compile_callback")
        and name != "torch.__trace"
    }
    return {
        "configs": _configs(),
        "environ": dict(os.environ),
        "global_module_hooks": [len(getattr(module_globals, name)) for name in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks", "_global_forward_hooks_always_called")],
        "dynamo_compile_callbacks": [len(callback_handler.start_callbacks), len(callback_handler.end_callbacks)],
        # The frame-evaluation callback dynamo installs while a compiled call runs, and the stance
        # (set_stance) the callback uses around eager steps: both must be off again after fit.
        "dynamo_eval_frame": (get_eval_frame_callback(), repr(torch._dynamo.eval_frame._stance)),
        "function_modes": [type(mode).__name__ for mode in _get_current_function_mode_stack()],
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "profiler": (bool(torch.autograd.profiler._is_profiler_enabled), torch._C._autograd._profiler_enabled()),
        "sys_profile_trace": (sys.getprofile(), sys.gettrace()),
        "autograd": (torch.is_grad_enabled(), torch.is_anomaly_enabled(), torch.is_inference_mode_enabled()),
        "saved_tensor_hooks": repr(torch._C._autograd._top_saved_tensors_default_hooks(False)),
        "deterministic": (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        "numerics": (torch.get_default_dtype(), torch.get_float32_matmul_precision(), torch.get_num_threads()),
        "cudnn": (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic),
        "autocast": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "loggers": loggers,
        # Lightning's progress bar may start its tqdm monitor; anything else new is someone's leftover.
        "threads": sorted(t.name for t in threading.enumerate() if t.name != "tqdm_monitor"),
    }


def assert_same(before: dict[str, object], after: dict[str, object]) -> None:
    after = dict(after)
    # Loggers made by modules first imported during the fit are new, not changed: only a level or a
    # handler on one would be someone's doing.
    after["loggers"] = {
        name: state for name, state in after["loggers"].items()  # type: ignore[union-attr]
        if name in before["loggers"] or state[0] or state[1]  # type: ignore[operator,index]
    }
    changed = {
        key: (before[key], after[key]) if not isinstance(before[key], dict) else {
            k: (before[key].get(k), after[key].get(k))  # type: ignore[union-attr]
            for k in set(before[key]) | set(after[key])  # type: ignore[arg-type]
            if before[key].get(k) != after[key].get(k)  # type: ignore[union-attr]
        }
        for key in before
        if before[key] != after[key]
    }
    assert not changed, f"left changed after fit: {changed}"


def assert_plain(modules) -> None:
    for module in modules:
        for sub in module.modules():
            hooks = (sub._forward_hooks, sub._forward_pre_hooks, sub._backward_hooks, sub._backward_pre_hooks)
            assert not any(hooks), f"{type(sub).__name__} keeps a hook after fit"
            assert getattr(sub, "_compiled_call_impl", None) is None, f"{type(sub).__name__} is still compiled"


def fit_with(tmp_path, callback, model, **fit_kwargs) -> None:
    trainer = make_trainer(tmp_path, [callback], max_epochs=3)
    trainer.fit(model, **fit_kwargs)


def test_a_fit_that_keeps_a_region_leaves_the_process_as_it_found_it(tmp_path):
    model = FasterCompiled()
    callback = CompileCallback(backend="eager", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=1)
    before = snapshot()
    fit_with(tmp_path, callback, model, train_dataloaders=loader(batch_size=8))
    assert [d.kept for d in callback.run.planner.decisions] == [True]  # the fit did compile and keep
    assert_same(before, snapshot())
    assert_plain(model.children())  # the whole model was kept: its children were never compiled alone


def test_a_fit_that_reverts_a_region_leaves_the_process_and_the_module_as_they_were(tmp_path):
    model = TinyModel()
    callback = CompileCallback(backend="test_state_slower", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=2)
    before = snapshot()
    fit_with(tmp_path, callback, model, train_dataloaders=loader(batch_size=8))
    decisions = callback.run.planner.decisions
    assert decisions and not any(d.kept for d in decisions), decisions  # tried, and reverted
    assert_same(before, snapshot())
    assert_plain([model])


def test_a_padded_fit_leaves_the_process_as_it_found_it(tmp_path):
    model = ModelWithLoaders()
    callback = padded(dynamic=None, pad_max_buckets=3)  # static buckets: 3 x (full, short) x (train, val) graphs, above 8
    before = snapshot()
    fit_with(tmp_path, callback, model)
    assert callback.last_report["padding"]["edges"]  # padding was chosen and injected
    assert any("recompile limit raised" in note for note in callback.last_report["plan"]["notes"])
    assert torch._dynamo.config.recompile_limit == int(before["configs"]["dynamo.recompile_limit"])  # type: ignore[index]
    assert_same(before, snapshot())


@pytest.mark.parametrize("leak", ["config", "hook"])
def test_the_snapshot_sees_a_leak(leak, tmp_path):
    """The control: a change of the kind a leaking fit would make is caught by the comparison."""
    before = snapshot()
    if leak == "config":
        with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit + 1):
            with pytest.raises(AssertionError, match="recompile_limit"):
                assert_same(before, snapshot())
    else:
        handle = nn.modules.module.register_module_forward_hook(lambda *args: None)
        try:
            with pytest.raises(AssertionError, match="global_module_hooks"):
                assert_same(before, snapshot())
        finally:
            handle.remove()
