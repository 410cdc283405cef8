"""Rebuilding a DataLoader with a different collate function, every other setting unchanged.

A ``DataLoader`` refuses changes to its sampler, batch size and dataset after construction, so
injecting a collate (``collate.PadCollate``) means building a new loader from the old one's public
attributes. The sampler object itself is reused (a ``DistributedSampler`` keeps its rank, replicas,
seed and epoch; a ``RandomSampler`` its generator), and so are the dataset, batch sampler, worker
settings and generator.

Nothing here imports Lightning: containers of loaders are handled as plain lists, tuples and dicts,
and Lightning's ``CombinedLoader`` is refused with a message that says how to rewrap its contents.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

CollateFn = Callable[[list[Any]], Any]

_PASS_THE_COLLATE_YOURSELF = "pass collate_fn=PadCollate(...) to your DataLoader yourself"


class LoaderRewrapError(TypeError):
    """A loader cannot be rebuilt with a new collate function; the message says why and what to do."""


def _init_matches_dataloader(loader_type: type) -> bool:
    """Whether ``loader_type(**kwargs)`` takes the same arguments, by name and kind, as ``DataLoader``."""
    if loader_type.__init__ is DataLoader.__init__:
        return True
    ours = inspect.signature(loader_type.__init__).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    return [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in theirs.values()]


def _init_kwargs(loader: DataLoader, *, drop_last: bool | None) -> dict[str, Any]:
    """Keyword arguments that rebuild ``loader`` equal, from its public attributes."""
    kwargs: dict[str, Any] = {
        "dataset": loader.dataset,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    # ``in_order`` arrived in torch 2.6; pass it only where this torch has it.
    if "in_order" in inspect.signature(DataLoader.__init__).parameters and hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order

    if isinstance(loader.dataset, IterableDataset):
        # The loader's sampler is torch's internal infinite placeholder, and DataLoader refuses a
        # sampler, shuffle or batch_sampler with an IterableDataset (it already refused them for the
        # original loader), so batch_size and drop_last are all there is.
        if drop_last is not None and loader.batch_size is None:
            raise LoaderRewrapError(
                f"cannot set drop_last={drop_last}: the loader has batch_size=None (each item is a batch). "
                "Batch in the dataset, or leave drop_last=None."
            )
        kwargs["batch_size"] = loader.batch_size
        kwargs["drop_last"] = loader.drop_last if drop_last is None else drop_last
        return kwargs

    if loader.batch_size is None and loader.batch_sampler is not None:
        # A user-given batch_sampler: DataLoader then sets batch_size=None, drop_last=False and a
        # default sampler it does not use; the batch sampler alone decides the batches.
        if drop_last is not None:
            raise LoaderRewrapError(
                f"cannot set drop_last={drop_last}: the loader's batches come from its own batch_sampler "
                f"({type(loader.batch_sampler).__name__}), which decides about short batches. Build the "
                "batch sampler with the drop_last you want, or leave drop_last=None."
            )
        kwargs["batch_sampler"] = loader.batch_sampler
        return kwargs

    # batch_size set: DataLoader built BatchSampler(sampler, batch_size, drop_last) itself; passing the
    # same sampler object (not shuffle=) keeps its order, generator, rank and epoch.
    # batch_size None without batch_sampler: no auto-batching, the sampler yields single items.
    if drop_last is not None and loader.batch_size is None:
        raise LoaderRewrapError(
            f"cannot set drop_last={drop_last}: the loader has batch_size=None (each item is a batch). "
            "Batch in the dataset, or leave drop_last=None."
        )
    kwargs["sampler"] = loader.sampler
    kwargs["batch_size"] = loader.batch_size
    kwargs["drop_last"] = loader.drop_last if drop_last is None else drop_last
    return kwargs


def rewrap_collate(
    loader: DataLoader, wrap: Callable[[CollateFn], CollateFn], *, drop_last: bool | None = None
) -> DataLoader:
    """A new DataLoader equal to ``loader`` except that its collate_fn is ``wrap(loader.collate_fn)``.

    Dataset, sampler (the same object: a ``DistributedSampler`` keeps rank and replicas), batch size
    or batch sampler, drop_last, workers, pin memory, timeout, worker init function, multiprocessing
    context, generator, prefetch factor, persistent workers, pin-memory device and ``in_order`` are
    carried over from the loader's public attributes. Subclasses of DataLoader are rebuilt as the same
    class when their ``__init__`` takes exactly DataLoader's arguments.

    Args:
        loader: the loader to copy.
        wrap: gets the loader's collate_fn, returns the new one (e.g.
            ``functools.partial(PadCollate, batch_size=8, short_batch="pad")``; with workers under the
            spawn start method the returned collate must pickle).
        drop_last: override the loader's drop_last (for ``PadCollate(short_batch="drop")``); None keeps it.

    Returns:
        The new loader. The old one is untouched (its iterator, if any, keeps running).

    Raises:
        LoaderRewrapError: if ``loader`` is not a ``torch.utils.data.DataLoader``, is a subclass whose
            ``__init__`` takes different arguments, or ``drop_last`` cannot apply to how it batches.
        ValueError: if ``wrap`` returns something that is not callable.

    Example:
        >>> padded = rewrap_collate(loader, functools.partial(PadCollate, sequence_buckets=[128, 256]))
    """
    if not isinstance(loader, DataLoader):
        raise LoaderRewrapError(
            "rewrap_collate rebuilds a torch.utils.data.DataLoader; got an object of type "
            f"{type(loader).__name__}. For other iterables, {_PASS_THE_COLLATE_YOURSELF}."
        )
    loader_type = type(loader)
    if not _init_matches_dataloader(loader_type):
        raise LoaderRewrapError(
            f"{loader_type.__name__} overrides DataLoader.__init__ with different arguments "
            f"{inspect.signature(loader_type.__init__)}, so rewrap_collate cannot tell which arguments would "
            f"rebuild it equal. Give {loader_type.__name__} a collate_fn argument and {_PASS_THE_COLLATE_YOURSELF}."
        )
    kwargs = _init_kwargs(loader, drop_last=drop_last)
    collate_fn = wrap(loader.collate_fn)
    if not callable(collate_fn):
        raise ValueError(f"`wrap` must return a collate function (callable); it returned {collate_fn!r}.")
    return loader_type(collate_fn=collate_fn, **kwargs)


def rewrap_loaders(loaders: Any, wrap: Callable[[CollateFn], CollateFn], *, drop_last: bool | None = None) -> Any:
    """:func:`rewrap_collate` over a loader or lists, tuples and dicts of loaders, keeping the structure.

    Args:
        loaders: a DataLoader, or a list / tuple (named tuples included) / dict of them, nested freely
            (the forms Lightning accepts for ``train_dataloaders`` and ``val_dataloaders``).
        wrap: as :func:`rewrap_collate`.
        drop_last: as :func:`rewrap_collate`.

    Returns:
        The same structure with every loader rebuilt.

    Raises:
        LoaderRewrapError: for anything else in the structure (e.g. Lightning's ``CombinedLoader``), and
            as :func:`rewrap_collate`.

    Example:
        >>> rewrap_loaders({"a": loader_a, "b": [loader_b]}, functools.partial(PadCollate, image_size=(224, 224)))
    """
    if isinstance(loaders, DataLoader):
        return rewrap_collate(loaders, wrap, drop_last=drop_last)
    if isinstance(loaders, Mapping):
        rebuilt = {key: rewrap_loaders(value, wrap, drop_last=drop_last) for key, value in loaders.items()}
        return rebuilt if type(loaders) is dict else type(loaders)(rebuilt)
    if isinstance(loaders, (list, tuple)):
        items = [rewrap_loaders(value, wrap, drop_last=drop_last) for value in loaders]
        if hasattr(loaders, "_fields"):  # a namedtuple
            return type(loaders)(*items)
        return type(loaders)(items)
    hint = ""
    if hasattr(loaders, "iterables"):
        hint = (
            " It looks like Lightning's CombinedLoader: rewrap its `.iterables` and build a new "
            "CombinedLoader from them with the same mode."
        )
    raise LoaderRewrapError(
        "rewrap_loaders handles a DataLoader or lists, tuples and dicts of them; got an object of type "
        f"{type(loaders).__name__}.{hint} Otherwise {_PASS_THE_COLLATE_YOURSELF}."
    )
