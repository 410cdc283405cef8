"""pad=...: padding injected into the Trainer's dataloaders however they were given."""

import lightning as L
import pytest
from torch.utils.data import DataLoader

from compile_callback import CompileCallback
from compile_callback.padding import PaddingPlan, census_from_dataset
from tests.conftest import TokenModel, VarLenDataset, make_trainer, pad_to_longest, read_scalars

LENGTHS = [5, 9, 14, 20, 27, 31]


def make_loader():
    return DataLoader(VarLenDataset(LENGTHS), batch_size=4, collate_fn=pad_to_longest)


class VarLenData(L.LightningDataModule):
    def train_dataloader(self):
        return make_loader()

    def val_dataloader(self):
        return make_loader()


class ModelWithLoaders(TokenModel):
    def train_dataloader(self):
        return make_loader()

    def val_dataloader(self):
        return make_loader()


def padded(**kwargs):
    defaults = dict(backend="eager", dynamic=False, eager_baseline_steps=0, warmup_steps=0, pad="auto",
                    pad_max_buckets=2, pad_multiple=8, max_recompiles_per_epoch=100)
    defaults.update(kwargs)
    return CompileCallback(["blocks.*"], **defaults)


@pytest.mark.parametrize("way", ["datamodule", "module_hooks"])
def test_padding_from_the_first_batch(tmp_path, way):
    callback = padded()
    model = ModelWithLoaders() if way == "module_hooks" else TokenModel()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    if way == "datamodule":
        trainer.fit(model, datamodule=VarLenData())
    else:
        trainer.fit(model)
    report = callback.last_report
    edges = report["padding"]["edges"]
    assert len(edges) <= 2 and all(edge % 8 == 0 for edge in edges)
    assert {shape[1] for shape in model.shapes_seen} <= set(edges)
    # One graph per bucket and grad mode (training; validation runs under no_grad), none after epoch 0.
    shape_recompiles = [r for r in report["recompiles"] if r["kind"] == "shape"]
    assert len([r for r in shape_recompiles if r["stage"] == "train"]) <= len(edges) - 1
    assert report["summary"]["graphs"] <= 2 * len(edges)
    assert all(r["epoch"] == 0 for r in report["recompiles"])
    waste = report["summary"]["padding_waste"]
    assert 0 < waste < 0.5
    assert read_scalars(trainer.logger.log_dir)["compile/padding_waste"][-1][1] == pytest.approx(waste)


def test_loaders_given_to_fit_are_padded_from_the_second_epoch(tmp_path):
    callback = padded()
    model = TokenModel()
    trainer = make_trainer(tmp_path, [callback], max_epochs=3)
    with pytest.warns(UserWarning, match=r"pads dataloaders given to trainer\.fit\(\.\.\.\) from the second epoch on"):
        trainer.fit(model, train_dataloaders=make_loader(), val_dataloaders=make_loader())
    edges = callback.last_report["padding"]["edges"]
    per_epoch = len(model.shapes_seen) // 3
    assert {shape[1] for shape in model.shapes_seen[:per_epoch]} == set(LENGTHS)
    assert {shape[1] for shape in model.shapes_seen[per_epoch:]} <= set(edges)
    assert all(r["epoch"] <= 1 for r in callback.last_report["recompiles"])


def test_padding_keeps_every_other_loader_setting(tmp_path):
    loader = DataLoader(VarLenDataset(LENGTHS), batch_size=4, collate_fn=pad_to_longest, shuffle=True, drop_last=True)
    sampler = loader.sampler
    callback = padded()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(TokenModel(), train_dataloaders=loader)
    assert trainer.train_dataloader is loader and loader.sampler is sampler and loader.drop_last
    assert loader.collate_fn.inner is pad_to_longest


def test_census_and_edges_minimize_padding():
    census, target = census_from_dataset(VarLenDataset(LENGTHS))
    assert target == "sequence" and len(census) == len(LENGTHS) * 8
    plan = PaddingPlan("auto", max_buckets=2, multiple=8)
    assert plan.choose(census, target) == [16, 32]
    assert PaddingPlan("max", multiple=8).choose(census, target) == [32]


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(pad="min"), r"`pad` must be None, 'auto', 'max' or a list of positive sizes \(bucket edges\); got 'min'"),
    (dict(pad=[128, 0]), r"`pad` must be None, 'auto', 'max' or a list of positive sizes"),
    (dict(pad_max_buckets=0), r"`pad_max_buckets` must be an integer >= 1; got 0"),
    (dict(pad_short_batch="drop"), r"`pad_short_batch` must be 'keep' or 'pad'; got 'drop'"),
])
def test_bad_pad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileCallback(**kwargs)
