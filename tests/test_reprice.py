"""Re-pricing (issue 20): once the plan froze, eager is timed again beside it in ABBA rounds late in the
run, and ``compile/speedup`` is that round's ratio; the rounds' cost stays within their budget."""

from __future__ import annotations

import pytest
import torch

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
    # Eager 10 ms (two steps 13 ms: the p90), compiled 2 ms: 5x; 12 timed eager steps ran 102 ms more than
    # compiled ones, and the 4 untimed ones as much again per step: 136 ms, which at 1% of 2 ms steps is
    # 6800 batches before the next round.
    found = repricer.finish(46, [10.0] * 10 + [13.0, 13.0], [2.0] * 12)
    assert found.speedup == 5.0 and found.cycles == [5.0, 5.0] and found.eager_p90_ms == 13.0
    assert repricer.next_at == 46 + 6800 and repricer.latest() is found
    assert not repricer.due(47) and repricer.due(6846)
    repricer.stop("no room")
    assert not repricer.due(10**6) and repricer.skipped == "no room"


def test_a_round_runs_as_many_cycles_as_its_budget_allows_over_what_is_left_of_the_run():
    """Two eager blocks of 4 a cycle, each step eager_ms - compiled_ms over the plan, within 1% of the
    compiled time left. ResNet-18 CIFAR on the H200 (eager 8, compiled 3 ms, 40 ms a cycle): 4,000 batches
    left pay 3 cycles, 19,000 the most; GPT-2 (43 and 35 ms, 64 ms a cycle) 2,000 batches pay 10."""
    assert reprice.round_cycles(4000, 8.0, 3.0) == 3  # 120 ms / 40 ms
    assert reprice.round_cycles(19000, 8.0, 3.0) == reprice.MAX_CYCLES == 8
    assert reprice.round_cycles(500, 8.0, 3.0) == reprice.MIN_CYCLES == 2  # 15 ms: the fewest still
    assert reprice.round_cycles(2000, 43.0, 35.0) == 8  # 700 ms / 64 ms = 10, at most 8
    assert reprice.round_cycles(1000, 43.0, 35.0, budget=0.02) == 8
    assert reprice.round_cycles(1000, 43.0, 35.0) == 5
    assert reprice.round_cycles(4000, None, 3.0) == reprice.round_cycles(4000, 8.0, None) == 2  # unknown: the fewest
    assert reprice.round_cycles(4000, 3.0, 3.0) == 8  # eager costs nothing extra
    # Never more than the batches left hold (16 a cycle); fewer than 2: no round fits.
    assert reprice.round_cycles(100, 3.0, 3.0) == 6 and reprice.round_cycles(40, None, 3.0) == 2
    assert reprice.round_cycles(31, 8.0, 3.0) == 1 and reprice.round_cycles(-5, 8.0, 3.0) == 0


def test_a_round_of_more_cycles_is_longer_and_prices_each_cycle():
    repricer = Repricer(first_after=0, budget=0.01)
    repricer.plan_frozen(0)
    repricer.cycles = 3
    assert repricer.length == 48
    steps = [repricer.step(b) for b in range(48)]
    assert [e for e, _ in steps] == ([True] * 4 + [False] * 8 + [True] * 4) * 3 and repricer.round_over(47)
    assert repricer.step(48) is None
    # 18 eager and 18 compiled timed steps: 3 a block; the cycles 4x, 5x and 3x.
    eager = [8.0] * 6 + [10.0] * 6 + [6.0] * 6
    found = repricer.finish(47, eager, [2.0] * 18)
    assert found.cycles == [4.0, 5.0, 3.0] and found.speedup == 4.0 and found.interval() == (3.0, 5.0)
    assert repricer.finish(47, eager[:12], [2.0] * 12) is None  # two cycles' steps of a three-cycle round


def test_a_round_of_fewer_cycles_than_the_price_it_would_replace_is_put_off():
    repricer = Repricer(first_after=10, budget=0.01)
    assert repricer.size(0, 4) and repricer.cycles == 4  # nothing priced yet: any round
    repricer.plan_frozen(0)
    repricer.next_at = 0
    for batch in range(repricer.length):
        repricer.step(batch)
    repricer.finish(repricer.length - 1, [8.0] * 24, [2.0] * 24)
    due = repricer.next_at
    assert repricer.due(due) and not repricer.size(due, 2) and repricer.cycles == 4
    assert repricer.next_at == due + 10 and not repricer.due(due + 9) and repricer.due(due + 10)
    assert not repricer.size(due + 10, 1)  # the run ends before two cycles
    assert repricer.size(due + 20, 4) and repricer.cycles == 4  # as many: the fresher price
    assert repricer.size(due + 20, 8) and repricer.cycles == 8
    repricer.plan_changed()  # a region reverted: its price is gone, any round may price the new plan
    assert repricer.latest() is None and repricer.next_at is None and repricer.size(due + 30, 2)


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
    # The round's eager steps ran eagerly (each sleeps 100 ms), the rest compiled (no sleep): apart by most of the
    # sleep however loaded the machine (3 busy loops on 2 cores: 119 ms against 26 ms).
    assert found.eager_ms > 100 and found.eager_ms - found.compiled_ms > 50
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


class QuickerEager(FasterCompiled):
    """Eager forwards sleep 20 ms: rounds of eight cycles (64 eager steps) in a few seconds."""

    EAGER_SLEEP_S = 0.02


def test_the_run_sizes_each_round_by_what_is_left_of_it(tmp_path, monkeypatch):
    """The run asks :func:`reprice.round_cycles` when a round is due, with the batches left and the eager
    and compiled step times it has, and the round runs that many cycles; the report says how many, and
    ``compile/speedup_low``/``_high`` bound their median without the outer cycles. A round that would run
    fewer than the one pricing the run is put off (20 batches here)."""
    asked, answers = [], [8, 2, 8]

    def sized(remaining, eager_ms, compiled_ms, *, budget):
        asked.append((remaining, eager_ms, compiled_ms, budget))
        return answers.pop(0) if answers else 0  # then none fits

    monkeypatch.setattr(reprice, "FIRST_AFTER", 20)
    monkeypatch.setattr(reprice, "BUDGET", 1e9)  # the next round 20 batches after the last
    monkeypatch.setattr("compile_callback.run.round_cycles", sized)
    model = QuickerEager()
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=340, max_epochs=100, limit_val_batches=0)
    trainer.fit(model, loader(batch_size=8))
    assert callback.last_report["summary"]["batches"] == 340
    first, second = callback.run.repricer.rounds
    (remaining, eager_ms, compiled_ms, budget), put_off, again, *_ = asked
    assert remaining == 340 - (first.batch - 127) and budget == 1e9
    assert eager_ms > compiled_ms + 15  # the eager baseline's steps and the plan's
    assert put_off[0] == remaining - 127 - 20 and again[0] == put_off[0] - 20  # 20 after the first, put off 20
    assert (again[1], again[2]) == (first.eager_ms, first.compiled_ms)  # the latest round's times
    assert len(first.cycles) == len(second.cycles) == 8 and second.batch == first.batch + 20 + 20 + 127
    assert model.eager_forwards == 2 + 64 + 64 + 1
    assert callback.last_report["summary"]["speedup_priced_cycles"] == 8
    ordered = sorted(second.cycles)
    metrics = callback.run.metrics()
    assert (metrics["compile/speedup_low"], metrics["compile/speedup_high"]) == (ordered[1], ordered[6])


def test_a_resumed_run_keeps_its_rounds_price_and_schedule(tmp_path, monkeypatch):
    """The rounds go into the checkpoint: the resumed fit is priced by them at once and its next round
    waits for the budget they left, not a fresh ``FIRST_AFTER`` (nor does a smaller round replace them)."""
    monkeypatch.setattr(reprice, "FIRST_AFTER", 20)
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], max_epochs=5, enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(QuickerEager(), loader(batch_size=8))  # 12 batches an epoch
    found = callback.run.repricer.latest()
    assert found is not None and callback.run.repricer.next_at > 60
    path = trainer.checkpoint_callback.best_model_path

    torch._dynamo.reset()
    resumed = CompileCallback("model", backend="eager", eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [resumed], max_epochs=6, enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(QuickerEager(), loader(batch_size=8), ckpt_path=path)
    assert resumed.run.repricer.rounds == [found]
    assert resumed.run.repricer.next_at == callback.run.repricer.next_at
    summary = resumed.last_report["summary"]
    assert summary["speedup_priced"] == "re-measured" and summary["speedup"] == pytest.approx(found.speedup)


def test_several_shapes_are_not_repriced(tmp_path, monkeypatch):
    from tests.conftest import VariableBatchDataset

    monkeypatch.setattr(reprice, "FIRST_AFTER", 5)
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=4, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], max_steps=40, max_epochs=100, limit_val_batches=0)
    trainer.fit(FasterCompiled(), loader(VariableBatchDataset([8, 5], repeats=4), batch_size=None))
    assert callback.run.repricer.rounds == []
    assert any("not re-measured late in the run: batches come in several shapes" in note
               for note in callback.last_report["plan"]["notes"])
