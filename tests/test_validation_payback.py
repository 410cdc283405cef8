"""Validation's no_grad graph is compiled only when the run's validation batches left repay it."""

import torch

from compile_callback import CompileCallback
from tests.conftest import FasterCompiled, TinyModel, loader, make_trainer


def validation_compiles(report) -> list[dict]:
    return [r for r in report["recompiles"] if r["stage"] == "validate"]


def test_a_two_batch_validation_compiles_no_validation_graph(tmp_path):
    # The "eager" backend makes the compiled model no faster: two validation batches a pass can never
    # repay a compile, so validation runs eagerly and dynamo makes no graph for it.
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=2, warmup_steps=0)
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=2)
    trainer.fit(TinyModel(), loader(batch_size=8), loader(batch_size=8))
    report = callback.last_report
    assert validation_compiles(report) == [], report["recompiles"]
    assert report["summary"]["graphs"] == 1 and report["summary"]["recompiles"] == 0
    assert any(note.startswith("validation runs eagerly") for note in report["plan"]["notes"]), report["plan"]["notes"]
    assert any("sanity check ran eagerly" in note for note in report["plan"]["notes"]) is False  # nothing compiled then
    assert "val/loss" in trainer.callback_metrics  # validation itself ran
    compiled = []  # and the compiler's stance is the default again: torch.compile compiles

    def counting(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    torch.compile(lambda x: x + 1, backend=counting)(torch.ones(2))
    assert len(compiled) == 1


def test_a_validation_that_repays_compiles_its_graph(tmp_path):
    # Eager forwards sleep 100 ms and compiled ones do not: by the first validation (after 8 batches, 5
    # of them compiled and timed) the 24 validation batches left save about 0.8 s against a fraction of
    # a second of compiling, so validation compiles its no_grad graph.
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=2, warmup_steps=0)
    model = FasterCompiled()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=8, limit_val_batches=12)
    trainer.fit(model, loader(batch_size=8), loader(batch_size=8))
    report = callback.last_report
    assert [r["reason"] for r in validation_compiles(report)] == [
        "grad mode changed (validation and inference run under no_grad): one more graph"
    ], report["recompiles"]
    assert not any(note.startswith("validation runs eagerly") for note in report["plan"]["notes"])
    # The sanity check (2 batches, before any compile) and the 2 eager baseline steps ran as Python;
    # the 24 validation batches ran compiled.
    assert model.eager_forwards < 12, model.eager_forwards


def test_the_sanity_check_never_compiles_a_validation_graph(tmp_path):
    # Named regions with no baseline are compiled before the first batch, so the sanity check meets them:
    # its batches come before any training step and run eagerly.
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=0, warmup_steps=0)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, num_sanity_val_steps=2, limit_val_batches=2,
                           check_val_every_n_epoch=2)  # the sanity check is the only validation
    trainer.fit(TinyModel(), loader(batch_size=8), loader(batch_size=8))
    report = callback.last_report
    assert validation_compiles(report) == [] and report["summary"]["graphs"] == 1, report["recompiles"]
    assert any("sanity check ran eagerly" in note for note in report["plan"]["notes"]), report["plan"]["notes"]
