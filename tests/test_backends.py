"""Backends of the user's own: a callable, a registered name, a dotted import path; and the public API."""

import time

import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI

from compile_callback import CompileCallback
from tests.conftest import TinyModel, TokenModel, loader, make_trainer

CALLS = {"compiled": 0}


def counting_backend(gm, example_inputs):
    """Runs the graph as it is and counts the graphs handed to it (reached by its dotted path in a test)."""
    CALLS["compiled"] += 1
    return gm.forward


def slow_backend(gm, example_inputs):
    def run(*args):
        time.sleep(0.02)  # 20 ms slower than eager per call: a trial must revert it
        return gm.forward(*args)

    return run


def fit(tmp_path, callback, max_epochs=3):
    trainer = make_trainer(tmp_path, [callback], max_epochs=max_epochs)
    trainer.fit(TinyModel(), loader(batch_size=8))
    return callback.last_report


def test_a_callable_backend_compiles_the_region(tmp_path):
    seen = []

    def my_backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    report = fit(tmp_path, CompileCallback("model", backend=my_backend, eager_baseline_steps=2, warmup_steps=1), max_epochs=1)
    assert seen, "the callable was never handed a graph"
    assert report["decisions"][0]["kept"]
    assert report["environment"]["backend"].endswith("my_backend")


def test_a_slow_callable_backend_is_reverted_by_its_trial(tmp_path):
    report = fit(tmp_path, CompileCallback(backend=slow_backend, eager_baseline_steps=4, warmup_steps=1, trial_steps=4,
                                           max_trials=1))
    (decision,) = report["decisions"]
    assert decision["region"] == "model" and not decision["kept"] and decision["reason"].startswith("not faster"), decision


def test_a_dotted_path_backend_is_imported(tmp_path):
    CALLS["compiled"] = 0
    fit(tmp_path, CompileCallback("model", backend="tests.test_backends.counting_backend", eager_baseline_steps=2,
                                  warmup_steps=1), max_epochs=1)
    assert CALLS["compiled"] >= 1


def test_lightning_cli_builds_a_dotted_path_backend_from_yaml(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"accelerator": "cpu", "callbacks": [
        {"class_path": "compile_callback.CompileCallback",
         "init_args": {"regions": "model", "backend": "tests.test_backends.counting_backend"}}]}}))
    cli = LightningCLI(TokenModel, run=False, args=["--config", str(path)], save_config_callback=None)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, CompileCallback)]
    assert callback.backend in ("tests.test_backends.counting_backend", counting_backend)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("no_such_backend", r"`backend='no_such_backend'` is not a registered torch.compile backend: registered are .*inductor"),
        ("no_such_package.compile", r"is not a registered torch.compile backend and cannot be imported \(ModuleNotFoundError"),
        ("tests.test_backends.CALLS", r"names dict, not a callable backend function"),
    ],
)
def test_a_backend_that_is_neither_registered_nor_importable_fails_in_setup(tmp_path, backend, message):
    callback = CompileCallback("model", backend=backend, eager_baseline_steps=2)
    with pytest.raises(ValueError, match=message):
        fit(tmp_path, callback, max_epochs=1)


def test_modes_need_inductor_even_for_a_callable():
    with pytest.raises(ValueError, match=r"`mode='reduce-overhead'` needs backend='inductor'"):
        CompileCallback(backend=counting_backend, mode="reduce-overhead")


def test_the_readme_public_api_is_importable():
    from compile_callback import PadCollate, choose_buckets, rewrap_collate

    edges = choose_buckets([10, 12, 30, 31, 64], max_buckets=2, multiple=8)
    assert len(edges) <= 2 and max(edges) >= 64
    collate = PadCollate(sequence_buckets=edges)
    batch = collate([{"input_ids": torch.ones(10, dtype=torch.long)}, {"input_ids": torch.ones(12, dtype=torch.long)}])
    assert batch["input_ids"].shape[1] in edges
    samples = [{"input_ids": torch.ones(n, dtype=torch.long)} for n in (10, 12, 30)]
    loader = torch.utils.data.DataLoader(samples, batch_size=3, collate_fn=lambda b: b)
    padded = rewrap_collate(loader, lambda _: PadCollate(sequence_buckets=edges))
    (batch,) = list(padded)
    assert batch["input_ids"].shape == (3, min(e for e in edges if e >= 30))
