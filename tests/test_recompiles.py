"""Recompile watch across epochs and the policies against churn, with real Trainers."""

import pytest
import torch
from torch.utils.data import DataLoader

from compile_callback import CompileCallback, torch_internals
from compile_callback.churn import RecompileChurnError
from tests.conftest import TinyModel, TokenModel, VariableBatchDataset, VarLenDataset, loader, make_trainer, pad_to_longest, read_scalars


def varlen_loader(lengths, **kwargs):
    return DataLoader(VarLenDataset(lengths, **kwargs), batch_size=4, collate_fn=pad_to_longest)


def blocks(**kwargs):
    defaults = dict(backend="eager", dynamic=False, eager_baseline_steps=0, warmup_steps=0, log_every_n_steps=2)
    defaults.update(kwargs)
    return CompileCallback(["blocks.*"], **defaults)


def test_variable_sequence_length_counts_and_causes(tmp_path):
    callback = blocks(max_recompiles_per_epoch=100)
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(TokenModel(), varlen_loader([4, 8, 12]))
    report = callback.last_report
    # Three lengths, one graph each for the block's code, shared by both blocks; epoch 2 reuses them.
    assert report["summary"]["recompiles"] == 2
    assert [r["epoch"] for r in report["recompiles"]] == [0, 0]
    assert {c["reason"] for c in report["recompile_causes"]} == {"`x.size(1)` changed 4 → 8", "`x.size(1)` changed 8 → 12"}
    scalars = read_scalars(trainer.logger.log_dir)
    assert [value for _, value in scalars["compile/recompiles_epoch"]] == [2.0, 0.0]


def test_variable_batch_size_counts(tmp_path):
    callback = blocks()
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    trainer.fit(TinyModel(), DataLoader(VariableBatchDataset([3, 5]), batch_size=None))
    causes = callback.last_report["recompile_causes"]
    assert [c["reason"] for c in causes] == ["`x.size(0)` changed 3 → 5"]


def test_more_shapes_than_the_limit_is_reported_as_eager_fallback(tmp_path):
    limit = torch_internals.recompile_limit()
    callback = blocks(max_recompiles_per_epoch=100)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    with pytest.warns(UserWarning, match=r"`blocks\.\*` recompiles: .*hit the recompile limit and now runs eager"):
        trainer.fit(TokenModel(), varlen_loader(list(range(2, limit + 4)), repeats=1))
    report = callback.last_report
    assert report["summary"]["eager_fallbacks"] == 1
    assert report["regions"]["blocks.*"]["eager_fallback"]
    assert f"recompile_limit ({limit})" in report["regions"]["blocks.*"]["fallback_reason"]
    assert read_scalars(trainer.logger.log_dir)["compile/eager_fallbacks"][-1][1] == 1.0


def test_warn_names_the_cause_and_the_fix_once(tmp_path):
    callback = blocks(max_recompiles_per_epoch=1)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    with pytest.warns(UserWarning, match=r"`blocks\.\*` recompiles: `x\.size\(1\)` changed .* Fix: pad that dimension") as caught:
        trainer.fit(TokenModel(), varlen_loader([4, 8, 12, 16]))
    churn_warnings = [w for w in caught if "recompiles:" in str(w.message)]
    assert len(churn_warnings) == 1  # one cause (x.size(1)), warned once


def test_raise_stops_with_region_guard_and_fix(tmp_path):
    callback = blocks(on_recompile="raise", max_recompiles_per_epoch=1)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    with pytest.raises(RecompileChurnError, match=r"^`blocks\.\*` recompiles: `x\.size\(1\)` changed 4 → 8 \(2 recompiles in train epoch 0 \(max_recompiles_per_epoch=1\)\)\. Fix: pad that dimension"):
        trainer.fit(TokenModel(), varlen_loader([4, 8, 12, 16]))


def _count_plan_changes(monkeypatch) -> list[int]:
    """Counts the calls telling the re-pricing rounds that the plan they priced changed."""
    from compile_callback.reprice import Repricer

    calls, original = [], Repricer.plan_changed
    monkeypatch.setattr(Repricer, "plan_changed", lambda self: (calls.append(1), original(self))[1])
    return calls


def test_eager_policy_reverts_the_churning_region(tmp_path, monkeypatch):
    plan_changes = _count_plan_changes(monkeypatch)
    callback = blocks(on_recompile="eager", max_recompiles_per_epoch=1)
    model = TokenModel()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(model, varlen_loader([4, 8, 12, 16, 20]))
    assert plan_changes == [1]  # the rounds' price was the reverted plan's
    assert not any(torch_internals.is_module_compiled(b) for b in model.blocks)
    actions = callback.last_report["churn_actions"]
    assert [a["action"] for a in actions] == ["reverted to eager: recompile churn"]
    assert callback.last_report["summary"]["recompiles"] == 2  # none after the revert


def test_dynamic_policy_recompiles_once_with_dynamic_shapes(tmp_path, monkeypatch):
    plan_changes = _count_plan_changes(monkeypatch)
    callback = blocks(on_recompile="dynamic", max_recompiles_per_epoch=1)
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(TokenModel(), varlen_loader([4, 8, 12, 16, 20, 24]))
    assert plan_changes == [1]
    actions = callback.last_report["churn_actions"]
    assert [a["action"] for a in actions] == ["recompiled once with dynamic=True against recompile churn"]
    recompiles = callback.last_report["recompiles"]
    # After the switch a single dynamic graph serves every remaining length: no recompile in epoch 2.
    assert all(r["epoch"] == 0 for r in recompiles)
    assert callback.run.planner.regions[0].compiled_with.dynamic is True


def test_pad_policy_turns_on_padding_for_the_next_epoch(tmp_path):
    callback = blocks(on_recompile="pad", max_recompiles_per_epoch=1, pad_multiple=8, pad_max_buckets=2)
    model = TokenModel()
    trainer = make_trainer(tmp_path, [callback], max_epochs=3)
    trainer.fit(model, varlen_loader([4, 8, 12, 16, 20]))
    report = callback.last_report
    assert report["churn_actions"][0]["action"].startswith("padding turned on from the next epoch: edges")
    edges = report["padding"]["edges"]
    assert len(edges) <= 2
    per_epoch = len(model.shapes_seen) // 3
    assert {shape[1] for shape in model.shapes_seen[per_epoch:]} <= set(edges)
    assert all(r["epoch"] <= 1 for r in report["recompiles"])
    assert 0 < report["summary"]["padding_waste"] < 0.5


def test_pad_policy_falls_back_to_dynamic_where_the_loader_cannot_be_padded(tmp_path):
    # Batches from a batch_sampler cannot take the padding collate: the churn is met with one dynamic
    # graph instead, and the report says why (it used to claim "padding turned on" and pad nothing).
    dataset = VarLenDataset([4, 8, 12, 16, 20, 24])
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), 4, drop_last=False)
    callback = blocks(on_recompile="pad", max_recompiles_per_epoch=1)
    model = TokenModel()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(model, DataLoader(dataset, batch_sampler=batches, collate_fn=pad_to_longest))
    report = callback.last_report
    assert [a["action"] for a in report["churn_actions"]] == ["recompiled once with dynamic=True against recompile churn"]
    assert any("fell back to 'dynamic'" in n and "could not take the padding collate" in n for n in report["plan"]["notes"])
    assert callback.run.planner.regions[0].compiled_with.dynamic is True
    assert {shape[1] for shape in model.shapes_seen} == {4, 8, 12, 16, 20, 24}  # nothing was padded


def test_python_value_guard_is_diagnosed(tmp_path):
    class Counting(TinyModel):
        def __init__(self):
            super().__init__()
            self.head.calls = 0

            def forward(x, head=self.head):
                head.calls += 1  # a Python int the compiled code reads and changes every call
                return head.linear(x) * (1 + head.calls % 2)

            self.head.forward = forward

    callback = CompileCallback(["head"], backend="eager", eager_baseline_steps=0, warmup_steps=0, max_recompiles_per_epoch=100)
    trainer = make_trainer(tmp_path, [callback], max_steps=4)
    trainer.fit(Counting(), loader())
    recompiles = callback.last_report["recompiles"]
    assert recompiles and all(r["kind"] == "python value" for r in recompiles)
    assert "(a Python value) changed from" in recompiles[0]["reason"]


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(on_recompile="ignore"), r"`on_recompile` must be one of 'warn', 'pad', 'dynamic', 'eager', 'raise'; got 'ignore'"),
    (dict(max_recompiles_per_epoch=-1), r"`max_recompiles_per_epoch` must be an integer >= 0; got -1"),
])
def test_bad_recompile_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileCallback(**kwargs)


@pytest.mark.parametrize(
    "policy, kind, padding_possible, expected",
    [
        ("pad", "shape", True, ("pad", "dynamic")),  # pad a changing size; dynamic if no buckets come of it
        ("pad", "shape", False, ("dynamic",)),  # the user chose padding already, or no training loader
        ("pad", "python_value", True, ("dynamic",)),  # not a dataloader size: padding cannot help
        ("eager", "shape", True, ("eager",)),
        ("dynamic", "shape", True, ("dynamic",)),
        ("raise", "shape", True, ("raise",)),
        ("warn", "shape", True, ("warn",)),
    ],
)
def test_what_each_policy_does_about_churn(policy, kind, padding_possible, expected):
    from compile_callback.churn import ChurnAction, remedies
    from compile_callback.watch import PYTHON_VALUE, SHAPE

    kinds = {"shape": SHAPE, "python_value": PYTHON_VALUE}
    action = ChurnAction(policy, "model", "`x.size(1)` changed 8 → 16", kinds[kind], "recompiled in epoch 1, after the first")
    assert remedies(action, padding_possible=padding_possible) == expected
