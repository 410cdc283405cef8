"""Putting shape-stabilizing collation into the DataLoaders a Trainer uses.

Mechanism only, no Lightning: given a DataLoader (or a list/tuple/dict of them), replace its
``collate_fn`` in place with a :class:`~compile_callback.collate.PadCollate` around the one it had.
In place, because the loader object is the one Lightning already holds: sampler (DDP's distributed
sampler included), workers, pinning and every other setting stay exactly as the user made them.
A worker process picks the new collate up with the next iterator (the next epoch, or at once when
the loader has not been iterated yet); persistent workers keep the old one, which is reported.

Bucket edges are chosen once, from a census of the training set's sizes, and shared by the
validation loaders so that validation reuses the training graphs' shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from compile_callback.collate import PadCollate, ShapeCensus, choose_buckets

CENSUS_SAMPLES = 20_000  # every sample of most datasets; an even spread of larger ones (pass edges for those)
PAD_STRATEGIES = ("auto", "max")


class PaddingNotApplied(Exception):
    """A loader that cannot take a padding collate; the message says why and what to do instead."""


@dataclasses.dataclass
class PaddingPlan:
    """How batches are padded: a strategy ("auto", "max" or fixed edges) and the chosen edges.

    Args:
        strategy: ``"auto"`` (at most ``max_buckets`` edges chosen from the census to minimize padding),
            ``"max"`` (one edge: the largest size seen) or a list of edges.
        max_buckets: the graph budget for ``"auto"``.
        multiple: edges are multiples of this (tensor-core friendly sizes).
        short_batch: ``"keep"`` or ``"pad"`` (fill the last batch with masked samples).
    """

    strategy: str | list[int]
    max_buckets: int = 8
    multiple: int = 8
    short_batch: str = "keep"
    edges: list[int] | None = None
    target: str | None = None  # "sequence" or "image", found by the census
    census_size: int = 0

    def choose(self, census: ShapeCensus, target: str) -> list[int]:
        """Fixes the edges from a census of sizes (sequence lengths, or image sides)."""
        self.target = target
        self.census_size = len(census)
        if isinstance(self.strategy, list):
            self.edges = sorted({int(e) for e in self.strategy})  # a repeated edge is one bucket
        elif self.strategy == "max":
            self.edges = choose_buckets(census, max_buckets=1, multiple=self.multiple)
        else:
            self.edges = choose_buckets(census, max_buckets=self.max_buckets, multiple=self.multiple)
        return self.edges

    def shapes(self) -> int:
        """How many padded shapes the edges make: one per edge, or per (height, width) pair for images."""
        assert self.edges is not None, "choose() the edges first"
        return len(self.edges) ** 2 if self.target == "image" else len(self.edges)

    def collate(self, inner: Callable[[list[Any]], Any] | None, batch_size: int | None) -> PadCollate:
        assert self.edges is not None, "choose() the edges first"
        # A size past the largest edge (a sample the census did not read, in a dataset of more than
        # CENSUS_SAMPLES) is padded to its own aligned size, not lost nor a failed fit.
        common = dict(
            pad_id=tokenizer_pad_id(inner),
            multiple=self.multiple,
            oversize="pad",
            batch_size=batch_size,
            short_batch=self.short_batch if batch_size else "keep",
        )
        if self.target == "image":
            return PadCollate(inner, image_buckets=self.edges, **common)
        return PadCollate(inner, sequence_buckets=self.edges, **common)


def tokenizer_pad_id(inner: Any) -> int:
    """The pad id of the tokenizer the loader's own collate pads with (a Hugging Face data collator's
    ``tokenizer``), else 0. Tokens must be padded with it: the collate after ours builds labels and masks
    from the ids (``DataCollatorForLanguageModeling`` sets labels to -100 only where ids are the pad id)."""
    pad = getattr(getattr(inner, "tokenizer", None), "pad_token_id", None)
    return pad if isinstance(pad, int) and not isinstance(pad, bool) else 0


def census_from_dataset(dataset: Any, *, limit: int = CENSUS_SAMPLES) -> tuple[ShapeCensus, str]:
    """Sizes of up to ``limit`` samples of a map-style dataset, spread evenly over it.

    Returns:
        The census and its target: ``"sequence"`` (1-D token lengths) or ``"image"`` (H and W).

    Raises:
        PaddingNotApplied: an iterable dataset, an empty one, or samples with no sequence or image.
    """
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise PaddingNotApplied(
            f"{type(dataset).__name__} is not a map-style dataset, so its sizes cannot be read ahead. "
            f"Give explicit bucket edges (pad=[256, 512, ...]) or pad='max' with known sizes."
        )
    size = len(dataset)
    if size == 0:
        raise PaddingNotApplied("the training dataset is empty; there is nothing to pad.")
    step = max(1, size // limit)
    measurer = PadCollate()
    census = ShapeCensus()
    target = None
    for index in range(0, size, step):
        try:
            measured = measurer.measure(dataset[index])
        except ValueError as error:
            raise PaddingNotApplied(f"cannot find what to pad in the samples: {error}") from error
        if "length" in measured:
            census.add(measured["length"])
            target = "sequence"
        elif "height" in measured:
            census.add(measured["height"])
            census.add(measured["width"])
            target = "image"
        else:
            raise PaddingNotApplied(
                "samples have no token sequence (input_ids) or image field to pad; name the fields, or "
                "turn padding off."
            )
    assert target is not None
    return census, target


def apply_to_loaders(loaders: Any, plan: PaddingPlan) -> tuple[list[str], bool]:
    """Puts ``plan``'s collate into every DataLoader in ``loaders`` (one, or a list/tuple/dict of them).

    Returns:
        Warnings for loaders that could not take it or take it late, each with the fix, and whether
        every loader took it.
    """
    warnings: list[str] = []
    every = True
    for loader in _flatten(loaders):
        if not isinstance(loader, DataLoader):
            warnings.append(
                f"padding not applied to a {type(loader).__name__}: only torch DataLoaders are wrapped. "
                f"Pass collate_fn=PadCollate(...) to it yourself."
            )
            every = False
            continue
        if loader.batch_size is None:
            warnings.append(
                "padding not applied to a DataLoader with batch_size=None (its dataset yields whole "
                "batches) or a batch_sampler: pad inside the dataset or the sampler's collate, or let the "
                "DataLoader batch samples."
            )
            every = False
            continue
        inner = loader.collate_fn.inner if isinstance(loader.collate_fn, PadCollate) else loader.collate_fn
        loader.collate_fn = plan.collate(inner, loader.batch_size)
        if loader.persistent_workers:
            warnings.append(
                "a DataLoader with persistent_workers=True keeps the collate its workers started with; "
                "padding applies once they restart. Set persistent_workers=False to pad from the next epoch."
            )
    return warnings, every


def _flatten(loaders: Any) -> list[Any]:
    if loaders is None:
        return []
    if isinstance(loaders, (list, tuple)):
        return [item for value in loaders for item in _flatten(value)]
    if isinstance(loaders, dict):
        return [item for value in loaders.values() for item in _flatten(value)]
    return [loaders]


def first_loader(loaders: Any) -> DataLoader | None:
    return next((item for item in _flatten(loaders) if isinstance(item, DataLoader)), None)
