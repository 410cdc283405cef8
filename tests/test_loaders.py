"""rewrap_collate / rewrap_loaders: every DataLoader setting survives, only the collate changes."""

from __future__ import annotations

import collections
import functools
import inspect

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, SequentialSampler, TensorDataset

from compile_callback.collate import PadCollate
from compile_callback.loaders import LoaderRewrapError, rewrap_collate, rewrap_loaders


def token_dataset(lengths: list[int]) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": torch.arange(1, n + 1), "labels": torch.arange(1, n + 1)} for n in lengths]


def pad_to(edges: list[int], **options):
    return functools.partial(PadCollate, sequence_buckets=edges, **options)


def seed_worker(worker_id: int) -> None:  # a module-level worker_init_fn that pickles
    torch.manual_seed(worker_id)


class Numbers(IterableDataset):
    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(torch.arange(self.count))


def test_every_setting_is_carried_over():
    dataset = token_dataset([3, 5, 7, 9, 11])
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        dataset,
        batch_size=2,
        shuffle=True,
        num_workers=2,
        pin_memory=True,
        drop_last=True,
        timeout=30,
        worker_init_fn=seed_worker,
        multiprocessing_context="fork",
        generator=generator,
        prefetch_factor=3,
        persistent_workers=True,
    )
    rebuilt = rewrap_collate(loader, pad_to([16]))
    assert type(rebuilt) is DataLoader and rebuilt is not loader
    assert rebuilt.dataset is dataset
    assert rebuilt.sampler is loader.sampler  # the same RandomSampler, with its generator
    assert rebuilt.batch_size == 2 and rebuilt.drop_last is True
    assert rebuilt.num_workers == 2 and rebuilt.pin_memory is True and rebuilt.timeout == 30
    assert rebuilt.worker_init_fn is seed_worker
    assert rebuilt.multiprocessing_context is loader.multiprocessing_context
    assert rebuilt.generator is generator
    assert rebuilt.prefetch_factor == 3 and rebuilt.persistent_workers is True
    assert rebuilt.pin_memory_device == loader.pin_memory_device
    if "in_order" in inspect.signature(DataLoader.__init__).parameters:
        assert rebuilt.in_order == loader.in_order
    assert isinstance(rebuilt.collate_fn, PadCollate) and rebuilt.collate_fn.inner is loader.collate_fn
    assert loader.collate_fn is torch.utils.data.default_collate  # the original is untouched


def test_shuffled_order_is_the_same_as_the_original_loaders():
    def make() -> DataLoader:
        return DataLoader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))

    original = [batch[0].tolist() for batch in make()]
    rebuilt = rewrap_collate(make(), lambda inner: inner)
    assert [batch[0].tolist() for batch in rebuilt] == original


def test_distributed_sampler_is_kept_with_its_rank():
    dataset = token_dataset([1, 2, 3, 4, 5, 6, 7, 8])
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    rebuilt = rewrap_collate(loader, pad_to([8]))
    assert rebuilt.sampler is sampler and isinstance(rebuilt.sampler, DistributedSampler)
    assert rebuilt.sampler.rank == 1 and rebuilt.sampler.num_replicas == 2
    batches = list(rebuilt)
    # Rank 1 of 2 gets the odd indices 1, 3, 5, 7: lengths 2, 4, 6, 8, padded to 8.
    assert [b["attention_mask"].sum(dim=1).tolist() for b in batches] == [[2, 4], [6, 8]]
    assert all(b["input_ids"].shape == (2, 8) for b in batches)


def test_rebuilt_loader_produces_padded_batches_with_workers():
    loader = DataLoader(token_dataset([3, 9, 5, 2, 7]), batch_size=2, num_workers=2)
    rebuilt = rewrap_collate(loader, pad_to([8, 16], batch_size=2, short_batch="pad"))
    shapes = [tuple(b["input_ids"].shape) for b in rebuilt]
    assert shapes == [(2, 16), (2, 8), (2, 8)]


def test_custom_batch_sampler_is_kept():
    dataset = token_dataset([1, 2, 3, 4, 5])
    batch_sampler = BatchSampler(SequentialSampler(dataset), batch_size=3, drop_last=False)
    loader = DataLoader(dataset, batch_sampler=batch_sampler)
    rebuilt = rewrap_collate(loader, pad_to([8]))
    assert rebuilt.batch_sampler is batch_sampler and rebuilt.batch_size is None
    assert [b["input_ids"].shape[0] for b in rebuilt] == [3, 2]
    with pytest.raises(LoaderRewrapError, match=r"cannot set drop_last=True: .* own batch_sampler \(BatchSampler\)"):
        rewrap_collate(loader, pad_to([8]), drop_last=True)


def test_drop_last_override_drops_the_short_batch():
    loader = DataLoader(token_dataset([1, 2, 3, 4, 5]), batch_size=2)
    rebuilt = rewrap_collate(loader, pad_to([8], batch_size=2, short_batch="drop"), drop_last=True)
    assert rebuilt.drop_last is True and loader.drop_last is False
    assert len(list(rebuilt)) == 2


def test_iterable_dataset():
    loader = DataLoader(Numbers(5), batch_size=2)
    rebuilt = rewrap_collate(loader, pad_to([4], fields="labels", batch_size=2, short_batch="pad"))
    assert [b.tolist() for b in rebuilt] == [[0, 1], [2, 3], [4, -100]]
    assert [b.tolist() for b in rewrap_collate(loader, lambda inner: inner, drop_last=True)] == [[0, 1], [2, 3]]


def test_batch_size_none_loader_keeps_its_convert():
    loader = DataLoader(TensorDataset(torch.arange(3)), batch_size=None)
    rebuilt = rewrap_collate(loader, lambda inner: inner)
    assert rebuilt.batch_size is None and rebuilt.sampler is loader.sampler
    assert [item[0].item() for item in rebuilt] == [0, 1, 2]
    with pytest.raises(LoaderRewrapError, match=r"cannot set drop_last=True: the loader has batch_size=None"):
        rewrap_collate(loader, lambda inner: inner, drop_last=True)


class PlainSubclass(DataLoader):
    pass


class SameSignatureSubclass(DataLoader):
    """Overrides __init__ but takes exactly DataLoader's arguments (what Lightning-style wrappers do)."""

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
    ):
        arguments = dict(locals())
        del arguments["self"], arguments["__class__"]
        super().__init__(**arguments)


class OtherSignatureSubclass(DataLoader):
    def __init__(self, dataset, tokens_per_batch: int):
        super().__init__(dataset, batch_size=tokens_per_batch // 4)


def test_subclasses_with_dataloaders_arguments_are_rebuilt_as_themselves():
    dataset = token_dataset([1, 2])
    assert type(rewrap_collate(PlainSubclass(dataset, batch_size=2), pad_to([8]))) is PlainSubclass
    if "in_order" in inspect.signature(DataLoader.__init__).parameters:
        assert type(rewrap_collate(SameSignatureSubclass(dataset, batch_size=2), pad_to([8]))) is SameSignatureSubclass


def test_rewrap_errors_say_why_and_what_to_do():
    with pytest.raises(LoaderRewrapError, match=r"got an object of type list\. For other iterables, pass collate_fn=PadCollate\(\.\.\.\)"):
        rewrap_collate([1, 2], pad_to([8]))
    with pytest.raises(LoaderRewrapError, match=r"OtherSignatureSubclass overrides DataLoader.__init__ with different arguments"):
        rewrap_collate(OtherSignatureSubclass(token_dataset([1]), tokens_per_batch=8), pad_to([8]))
    with pytest.raises(ValueError, match=r"`wrap` must return a collate function \(callable\); it returned None"):
        rewrap_collate(DataLoader(token_dataset([1])), lambda inner: None)


def test_rewrap_loaders_keeps_the_structure():
    Pair = collections.namedtuple("Pair", ["a", "b"])
    a, b, c = (DataLoader(token_dataset([3])) for _ in range(3))
    rebuilt = rewrap_loaders({"train": [a, (b,)], "pair": Pair(a, c)}, pad_to([8]))
    assert set(rebuilt) == {"train", "pair"}
    assert isinstance(rebuilt["train"], list) and isinstance(rebuilt["train"][1], tuple)
    assert isinstance(rebuilt["pair"], Pair)
    loaders = [rebuilt["train"][0], rebuilt["train"][1][0], rebuilt["pair"].a, rebuilt["pair"].b]
    assert all(isinstance(loader.collate_fn, PadCollate) for loader in loaders)
    assert next(iter(rebuilt["pair"].b))["input_ids"].shape == (1, 8)
    assert isinstance(rewrap_loaders(a, pad_to([8])).collate_fn, PadCollate)


def test_rewrap_loaders_refuses_other_containers():
    class LooksLikeCombinedLoader:
        iterables = {"a": None}

    with pytest.raises(LoaderRewrapError, match=r"got an object of type LooksLikeCombinedLoader\. It looks like Lightning's CombinedLoader: rewrap its `\.iterables`"):
        rewrap_loaders(LooksLikeCombinedLoader(), pad_to([8]))
    with pytest.raises(LoaderRewrapError, match=r"handles a DataLoader or lists, tuples and dicts of them; got an object of type int\."):
        rewrap_loaders([DataLoader(token_dataset([1])), 3], pad_to([8]))
