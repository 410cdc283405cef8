"""What both recipes' data modules share: how a DataLoader is made from their config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


def make_loader(dataset: Dataset | None, *, batch_size: int, num_workers: int, shuffle: bool,
                collate_fn: Callable[[list[Any]], Any]) -> DataLoader:
    """A loader with the recipes' settings: workers kept alive between epochs, pinned memory on CUDA."""
    assert dataset is not None, "call setup() first"
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        collate_fn=collate_fn,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        pin_memory=torch.cuda.is_available(),
    )
