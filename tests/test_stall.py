"""``compile/stall_s``: the seconds the training loop waited for compiling, against a backend that takes a
known time to compile."""

import time

import pytest

from compile_callback import CompileCallback
from tests.conftest import TinyModel, VariableBatchDataset, loader, make_trainer, read_scalars

COMPILE_S = 0.3
compiles: list[int] = []


def slow_to_compile(gm, example_inputs):
    compiles.append(len(example_inputs))
    time.sleep(COMPILE_S)  # what a real backend spends in Inductor, here known exactly
    return gm.forward


def test_stall_counts_the_compiles_the_training_loop_waited_for(tmp_path):
    compiles.clear()
    # Two batch sizes and static graphs: the first graph is compiled before its step (the callback
    # compiles outside the step), the second inside the step that meets the new size.
    callback = CompileCallback("model", backend=slow_to_compile, dynamic=False, eager_baseline_steps=2, warmup_steps=0)
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    started = time.perf_counter()
    trainer.fit(TinyModel(), loader(VariableBatchDataset([8, 5], repeats=4), batch_size=None))
    wall_s = time.perf_counter() - started
    summary = callback.last_report["summary"]
    assert len(compiles) == 2  # one graph per size (each backward lowered with its forward)
    # Every compile happened inside training steps, each one waited for in full.
    assert len(compiles) * COMPILE_S <= summary["stall_s"] < wall_s, (compiles, summary["stall_s"], wall_s)
    assert summary["compile_time_s"] >= len(compiles) * COMPILE_S  # dynamo's records hold the same sleeps
    # In parts: with a fixed region both graphs compile on their first call, inside the steps that meet
    # them; the planner's own work before steps is the rest.
    parts = summary["stall_parts_s"]
    assert parts["compiling_steps_s"] >= len(compiles) * COMPILE_S and parts["before_steps_s"] >= 0, parts
    assert sum(parts.values()) == pytest.approx(summary["stall_s"])
    longest = summary["longest_stall"]
    assert COMPILE_S <= longest["seconds"] <= summary["stall_s"] and 0 <= longest["batch"] < trainer.global_step
    logged = read_scalars(trainer.logger.log_dir)["compile/stall_s"]
    assert logged[-1][1] == pytest.approx(summary["stall_s"], rel=1e-6)  # TensorBoard keeps float32


def test_nothing_compiled_stalls_nothing(tmp_path):
    # Eager baseline only: no step waits for a compile.
    callback = CompileCallback("model", backend=slow_to_compile, eager_baseline_steps=20, warmup_steps=0)
    trainer = make_trainer(tmp_path, [callback], max_steps=8, limit_val_batches=0)
    trainer.fit(TinyModel(), loader(batch_size=8))
    assert callback.last_report["summary"]["compile_time_s"] == 0
    assert callback.last_report["summary"]["stall_s"] < COMPILE_S / 10


def test_a_trials_set_up_batch_is_timed_by_piece(tmp_path):
    # Where a trial's set-up batch spends its time (issue 22: on the H200 one such batch waited 30 s
    # with 1.6 s of compiling): verification's stages, each against the known compile time.
    compiles.clear()
    callback = CompileCallback(backend=slow_to_compile, eager_baseline_steps=4, warmup_steps=0)  # a trial of the whole model
    trainer = make_trainer(tmp_path, [callback], max_steps=80, max_epochs=30, limit_val_batches=0)
    trainer.fit(TinyModel(), loader(batch_size=8))
    report = callback.last_report
    assert report["decisions"][0]["region"] == "model" and report["decisions"][0]["compile_seconds"]
    setup = report["decisions"][0]["setup_s"]
    assert {"eager", "compiled", "comparison", "verification in all"} <= set(setup), setup
    assert len(compiles) == 1 and setup["compiled"] >= COMPILE_S  # the region compiles in verification's compiled run
    assert setup["eager"] < COMPILE_S  # nothing compiles in the eager run
    assert setup["eager"] + setup["compiled"] + setup["comparison"] <= setup["verification in all"]
    # The set-up batch waited for at least its verification.
    assert setup["verification in all"] <= report["summary"]["longest_stall"]["seconds"]


HOLD_S = 0.2


def test_the_profilers_held_input_copies_count_as_stalled(tmp_path, monkeypatch):
    # The profiler copies the inputs it holds to host memory inside a training step (the whole model's at the
    # first profiled step, a part's before its trial; on the H200 ResNet-50's first profiled step once took
    # 0.8 s more for it, which compile/stall_s did not count). Each copy to the host made HOLD_S slower: every
    # one of them is in the stall, in its own part.
    from compile_callback import profile

    copies = []
    real_copy = profile._copy

    def slow_copy(value, device):
        if str(device) == "cpu":
            copies.append(device)
            time.sleep(HOLD_S)
        return real_copy(value, device)

    monkeypatch.setattr(profile, "_copy", slow_copy)
    callback = CompileCallback(backend="eager", eager_baseline_steps=2, warmup_steps=0, max_trials=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=30, limit_val_batches=0)
    trainer.fit(TinyModel(), loader(batch_size=8))
    summary = callback.last_report["summary"]
    assert len(copies) >= 2  # args and kwargs of the root, at least
    parts = summary["stall_parts_s"]
    assert len(copies) * HOLD_S <= parts["holding_inputs_s"] < len(copies) * HOLD_S + 0.5, (parts, len(copies))
    assert sum(parts.values()) == pytest.approx(summary["stall_s"]) and summary["stall_s"] >= len(copies) * HOLD_S
    # All held in one step, the first profiled one: the longest wait, at that batch.
    assert summary["longest_stall"]["seconds"] >= len(copies) * HOLD_S and summary["longest_stall"]["batch"] == 0
