"""Re-pricing (issue 20): once the plan froze, eager is timed again beside it in ABBA rounds late in the
run, and ``compile/speedup`` is that round's ratio; the rounds' cost stays within their budget."""

from __future__ import annotations

import pytest

from compile_callback import CompileCallback, reprice
from compile_callback.report import render_table
from compile_callback.reprice import Repricer
from tests.conftest import FasterCompiled, loader, make_trainer


def test_a_round_runs_abba_blocks_and_waits_its_budget_before_the_next():
    repricer = Repricer(first_after=10, budget=0.01)
    repricer.plan_frozen(5)
    assert [repricer.step(b) for b in (5, 14)] == [None, None]  # 10 batches after the plan froze
    steps = [repricer.step(b) for b in range(15, 15 + repricer.length)]
    eager = [e for e, _ in steps]
    assert eager == [True] * 4 + [False] * 8 + [True] * 8 + [False] * 8 + [True] * 4  # E C C E E C C E
    assert [label for _, label in steps[:5]] == [None, "reprice:eager#1", "reprice:eager#1", "reprice:eager#1", None]
    assert repricer.round_over(15 + repricer.length - 1) and repricer.step(15 + repricer.length) is None
    # Eager 10 ms (two steps 13 ms: the p90), compiled 2 ms: 5x; 12 eager steps ran 102 ms more than
    # compiled ones, which at 1% of 2 ms steps is 5100 batches before the next round.
    found = repricer.finish(46, [10.0] * 10 + [13.0, 13.0], [2.0] * 12)
    assert found.speedup == 5.0 and found.cycles == [5.0, 5.0] and found.eager_p90_ms == 13.0
    assert repricer.next_at == 46 + 5100 and repricer.latest() is found
    assert not repricer.due(47) and repricer.due(5146)
    repricer.stop("no room")
    assert not repricer.due(10**6) and repricer.skipped == "no room"


def test_a_frozen_plan_is_repriced_with_eager_beside_it(tmp_path, monkeypatch):
    monkeypatch.setattr(reprice, "FIRST_AFTER", 20)
    model = FasterCompiled()  # eager forwards sleep 100 ms, compiled ones do not
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=60, max_epochs=100, limit_val_batches=0)
    trainer.fit(model, loader(batch_size=8))
    run = callback.run
    assert len(run.repricer.rounds) == 1  # the next waits for its budget
    found = run.repricer.latest()
    summary = callback.last_report["summary"]
    assert summary["speedup_priced"] == "re-measured" and summary["speedup"] == pytest.approx(found.speedup)
    assert found.eager_ms > 100 > 20 > found.compiled_ms  # the round's eager steps ran eagerly, the rest compiled
    assert summary["eager_step_time_ms"] == pytest.approx(found.eager_ms)
    assert summary["eager_step_time_p90_ms"] == pytest.approx(found.eager_p90_ms)  # the same steps' p90
    assert summary["eager_step_time_p90_ms"] >= summary["eager_step_time_ms"]
    metrics = run.metrics()
    assert metrics["compile/speedup_low"] == min(found.cycles) and metrics["compile/speedup_high"] == max(found.cycles)
    assert summary["recompiles"] == 0  # force_eager compiles nothing
    # Eager: 1 warm-up and 2 baseline steps before the plan, and the round's 4 blocks of 4 steps.
    assert model.eager_forwards == 2 + 16 + 1
    # When: the round's last batch, of the fit's.
    assert summary["speedup_priced_at_batch"] == found.batch and found.batch < summary["batches"] == 60
    assert f"(eager re-measured beside the plan late in the run, at batch {found.batch} of 60)" in render_table(callback.last_report)


def test_several_shapes_are_not_repriced(tmp_path, monkeypatch):
    from tests.conftest import VariableBatchDataset

    monkeypatch.setattr(reprice, "FIRST_AFTER", 5)
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=4, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=40, max_epochs=100, limit_val_batches=0)
    trainer.fit(FasterCompiled(), loader(VariableBatchDataset([8, 5], repeats=4), batch_size=None))
    assert callback.run.repricer.rounds == []
    assert any("not re-measured late in the run: batches come in several shapes" in note
               for note in callback.last_report["plan"]["notes"])
