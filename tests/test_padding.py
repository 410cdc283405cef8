"""pad=...: padding injected into the Trainer's dataloaders however they were given."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from compile_callback import CompileCallback
from compile_callback.padding import PaddingPlan, census_from_dataset
from tests.conftest import TokenModel, VarLenDataset, make_trainer, pad_to_longest, read_scalars

LENGTHS = [5, 9, 14, 20, 27, 31]


def make_loader():
    return DataLoader(VarLenDataset(LENGTHS), batch_size=4, collate_fn=pad_to_longest)


def batch_sampler_loader():
    """Batches made by a batch_sampler: the loader has batch_size=None and cannot take the padding collate."""
    dataset = VarLenDataset(LENGTHS)
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), 4, drop_last=False)
    return DataLoader(dataset, batch_sampler=batches, collate_fn=pad_to_longest)


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


class RecordRecompileLimit(L.Callback):
    def __init__(self, seen):
        self.seen = seen

    def on_train_start(self, trainer, pl_module):
        self.seen.append(torch._dynamo.config.recompile_limit)


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


class ShapeRecordingModel(ModelWithLoaders):
    """Records validation shapes too, and can give validation data of other lengths than training's."""

    def __init__(self, val_lengths=LENGTHS):
        super().__init__()
        self.val_lengths = val_lengths
        self.val_shapes: list[tuple[int, ...]] = []

    def val_dataloader(self):
        return DataLoader(VarLenDataset(self.val_lengths), batch_size=4, collate_fn=pad_to_longest)

    def validation_step(self, batch, batch_idx):
        self.val_shapes.append(tuple(batch["input_ids"].shape))
        return super().validation_step(batch, batch_idx)


@pytest.mark.parametrize("dynamic", [None, False])
def test_padding_from_the_first_batch_compiles_one_static_graph_per_bucket(tmp_path, dynamic):
    # dynamic=None: left alone, dynamo would make the length dynamic at the second bucket (2 graphs
    # for 3 buckets); padded from the first batch, each bucket gets a static graph of its own.
    # dynamic=False asks for the same: the buckets' recompiles are expected as well, not churn.
    callback = padded(dynamic=dynamic, pad_max_buckets=3, max_recompiles_per_epoch=0)
    model = ModelWithLoaders()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    trainer.fit(model)
    report = callback.last_report
    edges = report["padding"]["edges"]
    assert len(edges) == 3
    assert all(region.compiled_with.dynamic is False for region in callback.run.planner.regions)
    train_recompiles = [r for r in report["recompiles"] if r["stage"] == "train"]
    assert len(train_recompiles) == len(edges) - 1 and all(r["kind"] == "shape" for r in train_recompiles)
    # The lengths come in ascending order: one static graph after another, never a dynamic one.
    assert [r["reason"] for r in train_recompiles] == [f"`x.size(1)` changed {a} → {b}" for a, b in zip(edges, edges[1:])]
    # Those recompiles are the buckets' own: no churn, even with max_recompiles_per_epoch=0.
    assert report["churn_actions"] == [] and not any("recompiles in train epoch" in n for n in report["plan"]["notes"])
    assert any("compiled static (dynamic=False), one graph per bucket" in note for note in report["plan"]["notes"])


def test_static_buckets_raise_the_recompile_limit_for_the_fit_only(tmp_path):
    limit = torch._dynamo.config.recompile_limit
    callback = padded(dynamic=None, pad_max_buckets=3)
    torch._dynamo.config.recompile_limit = 4
    try:
        trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0)
        seen = []
        trainer.callbacks.append(RecordRecompileLimit(seen))
        trainer.fit(ModelWithLoaders())
        # 3 buckets x (full, short last batch) x (training, validation)
        assert seen == [12] and torch._dynamo.config.recompile_limit == 4
        assert any("recompile limit raised from 4 to 12 for this fit" in n for n in callback.last_report["plan"]["notes"])
    finally:
        torch._dynamo.config.recompile_limit = limit


def test_the_recompile_limit_comes_back_when_fit_fails(tmp_path):
    class FailsLater(ModelWithLoaders):
        def training_step(self, batch, batch_idx):
            if batch_idx == 5:
                raise RuntimeError("the user's step failed")
            return super().training_step(batch, batch_idx)

    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 4
    try:
        trainer = make_trainer(tmp_path, [padded(dynamic=None, pad_max_buckets=3)], max_epochs=1, limit_val_batches=0)
        with pytest.raises(RuntimeError, match="the user's step failed"):
            trainer.fit(FailsLater())
        assert torch._dynamo.config.recompile_limit == 4
    finally:
        torch._dynamo.config.recompile_limit = limit


def test_a_chosen_dynamic_is_kept_and_fit_loaders_stay_dynamic(tmp_path):
    chosen = padded(dynamic=True)
    make_trainer(tmp_path / "a", [chosen], max_epochs=1, limit_val_batches=0).fit(ModelWithLoaders())
    assert all(region.compiled_with.dynamic is True for region in chosen.run.planner.regions)
    # Loaders given to fit() are padded from the second epoch: the first epoch's shapes vary, so the
    # regions are left to dynamo (static graphs would recompile for each raw length).
    late = padded(dynamic=None)
    trainer = make_trainer(tmp_path / "b", [late], max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match="from the second epoch on"):
        trainer.fit(TokenModel(), train_dataloaders=make_loader())
    assert all(region.compiled_with.dynamic is None for region in late.run.planner.regions)


def test_edges_come_from_the_training_set_with_a_sanity_check(tmp_path):
    # The sanity check's validation loaders would give edges of [8] (lengths 5 only); the training
    # set's lengths reach 31. The callback's on_fit_start makes the training loaders first.
    callback = padded(pad_max_buckets=3)
    model = ShapeRecordingModel(val_lengths=[5])
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, num_sanity_val_steps=2)
    trainer.fit(model)
    edges = callback.last_report["padding"]["edges"]
    assert max(edges) == 32 and len(edges) == 3
    assert {shape[1] for shape in model.shapes_seen} <= set(edges)
    assert len(model.val_shapes) > 2 and {shape[1] for shape in model.val_shapes} == {min(edges)}


def test_bucket_recompiles_in_any_epoch_are_not_churn_but_more_are():
    from compile_callback.churn import ChurnPolicy
    from compile_callback.watch import SHAPE, Recompile

    def recompile(region, epoch, stage="train"):
        return Recompile(region=region, reason="`x.size(1)` changed", stage=stage, epoch=epoch, step=epoch, kind=SHAPE)

    # A short last batch that lands in another bucket in epoch 2, in each of two regions: the buckets' own.
    seen = [recompile("a", 0), recompile("b", 0), recompile("a", 2), recompile("b", 2)]
    policy = ChurnPolicy("raise", max_recompiles_per_epoch=0)
    policy.shape_budget = 2
    assert policy.check(seen) == []
    # A third shape recompile of one region is beyond its buckets: churn.
    (action,) = policy.check([*seen, recompile("a", 3)])
    assert action.region == "a" and "after the first" in action.why
    assert ChurnPolicy("raise", max_recompiles_per_epoch=0).check(seen)  # without buckets: churn


def test_no_static_graphs_when_a_training_loader_cannot_be_padded(tmp_path):
    class BatchSamplerLoaders(ModelWithLoaders):
        def train_dataloader(self):
            return batch_sampler_loader()

    callback = padded(dynamic=None, pad_max_buckets=3)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match="padding not applied to a DataLoader with batch_size=None"):
        trainer.fit(BatchSamplerLoaders())
    # Raw lengths under dynamic=False would compile a graph each: left to dynamo instead.
    assert all(region.compiled_with.dynamic is None for region in callback.run.planner.regions)
    assert not any("compiled static" in note for note in callback.last_report["plan"]["notes"])


def test_edges_come_from_the_training_set_when_validation_is_asked_for_first(tmp_path):
    # Trainer(max_steps=...) leaves max_epochs at -1: estimated_stepping_batches makes no training
    # loaders then, and the sanity check asks for the validation loaders first.
    callback = padded(pad_max_buckets=3)
    model = ShapeRecordingModel(val_lengths=[5])
    trainer = make_trainer(tmp_path, [callback], max_epochs=None, max_steps=30, num_sanity_val_steps=2,
                           val_check_interval=10)
    trainer.fit(model)
    edges = callback.last_report["padding"]["edges"]
    assert max(edges) == 32 and len(edges) == 3
    assert {shape[1] for shape in model.shapes_seen} <= set(edges)
    sanity, later = model.val_shapes[:2], model.val_shapes[2:]
    assert {shape[1] for shape in sanity} == {5}  # asked for before the census: not padded
    assert later and {shape[1] for shape in later} == {min(edges)}


def test_a_validation_loader_that_cannot_be_padded_is_named_when_training_is_static(tmp_path):
    class BatchSamplerValidation(ModelWithLoaders):
        def val_dataloader(self):
            return batch_sampler_loader()

    trainer = make_trainer(tmp_path, [padded(dynamic=None)], max_epochs=1, limit_val_batches=2)
    with pytest.warns(UserWarning, match="each validation batch shape compiles a graph of its own"):
        trainer.fit(BatchSamplerValidation())


def test_the_dataloader_hooks_are_given_back_after_fit(tmp_path):
    model = ModelWithLoaders()
    make_trainer(tmp_path, [padded()], max_epochs=1, limit_val_batches=0).fit(model)
    assert "train_dataloader" not in vars(model) and "val_dataloader" not in vars(model)


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


def test_image_buckets_make_a_shape_per_height_and_width():
    plan = PaddingPlan([32, 48])
    plan.target, plan.edges = "image", [32, 48]
    assert plan.shapes() == 4  # 32x32, 32x48, 48x32, 48x48: the graphs static buckets may need
    plan.target = "sequence"
    assert plan.shapes() == 2


def test_census_and_edges_minimize_padding():
    census, target = census_from_dataset(VarLenDataset(LENGTHS))
    assert target == "sequence" and len(census) == len(LENGTHS) * 8
    plan = PaddingPlan("auto", max_buckets=2, multiple=8)
    assert plan.choose(census, target) == [16, 32]
    assert PaddingPlan("max", multiple=8).choose(census, target) == [32]
    repeated = PaddingPlan([64, 32, 64])
    assert repeated.choose(census, target) == [32, 64] and repeated.shapes() == 2  # your edges as given, once each


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(pad="min"), r"`pad` must be None, 'auto', 'max' or a list of positive sizes \(bucket edges\); got 'min'"),
    (dict(pad=[128, 0]), r"`pad` must be None, 'auto', 'max' or a list of positive sizes"),
    (dict(pad_max_buckets=0), r"`pad_max_buckets` must be an integer >= 1; got 0"),
    (dict(pad_short_batch="drop"), r"`pad_short_batch` must be 'keep' or 'pad'; got 'drop'"),
])
def test_bad_pad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileCallback(**kwargs)


def test_a_size_the_census_did_not_read_is_padded_past_the_edges_not_a_failed_fit():
    """A dataset of more than CENSUS_SAMPLES is read at an even spread: a longer sample between the ones read
    exceeds every edge. The plan's collate pads it to its own aligned length (one more shape), with a warning."""
    plan = PaddingPlan("max", multiple=8)
    census, target = census_from_dataset(VarLenDataset([8, 37, 8, 8]), limit=2)  # reads samples 0 and 16
    assert plan.choose(census, target) == [8]
    collate = plan.collate(None, batch_size=2)
    with pytest.warns(UserWarning, match=r"sequence length 37 exceeds the largest bucket edge 8: padded to 40"):
        batch = collate([VarLenDataset([37])[0], VarLenDataset([8])[0]])
    assert batch["input_ids"].shape == (2, 40)  # aligned up to the plan's multiple
