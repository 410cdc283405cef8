"""What both recipes' data modules share: a train/validation split and how its DataLoaders are made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class SplitDataModule(L.LightningDataModule):
    """A DataModule whose ``setup`` fills ``train_set`` and ``val_set``; subclasses set ``collate``.

    Loaders use the config's ``batch_size`` and ``num_workers``, keep workers alive between epochs and
    pin memory on CUDA. Training drops the epoch's last, shorter batch: compiled, it is a new shape
    once an epoch (the GPT-2 recipe on the H200 spent 20 s recompiling its CUDA graphs for a batch of
    11 after 618 of 16), for a few samples a model sees again next epoch anyway.
    """

    collate: Callable[[list[Any]], Any]

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def _loader(self, dataset: Dataset | None, *, shuffle: bool) -> DataLoader:
        assert dataset is not None, "call setup() first"
        workers = self.config.num_workers
        return DataLoader(
            dataset,
            batch_size=self.config.batch_size,
            shuffle=shuffle,
            collate_fn=type(self).collate,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
            drop_last=shuffle,  # training only: validation sees every sample
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)
