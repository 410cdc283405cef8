"""The CV recipe: any torchvision classification model, and images from a folder or made up.

Models are built with ``weights=None``: nothing is ever downloaded. Region patterns name the network's
own modules under ``net`` (``"net.layer*"`` for a ResNet's stages, ``"net.layer*.*"`` for its blocks).

Images come from an ImageFolder (one sub-folder per class) or are synthetic: a fixed low-resolution
pattern per class plus noise, so the classes can be told apart and the loss falls. With
``variable_sizes`` every image gets its own height and width from a small set, and the collate
resizes a batch to the size of its first image: all images in a batch share a size, and the size
changes from batch to batch, as with real data bucketed by aspect ratio.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.utils.data import Dataset, random_split

from recipes.data import SplitDataModule
from torchvision.transforms.v2 import functional as TF

from recipes.config import CVDataConfig, CVModelConfig, OptimConfig
from recipes.optim import build_adamw, clips_gradients_under_mixed_precision, with_warmup

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PATTERN_SIZE = 4  # synthetic class patterns are 4x4, upsampled to the image size


# -- model -------------------------------------------------------------------------------------------
def classification_models() -> list[str]:
    """Names ``torchvision.models.get_model`` accepts for image classification."""
    return torchvision.models.list_models(module=torchvision.models)


def build_classifier(arch: str, num_classes: int) -> nn.Module:
    """``torchvision.models.get_model(arch)`` with random weights and ``num_classes`` outputs.

    Raises:
        ValueError: ``arch`` is not a torchvision classification model (with the closest names).
    """
    known = classification_models()
    if arch not in known:
        close = difflib.get_close_matches(arch, known, n=5)
        hint = f" Closest: {', '.join(close)}." if close else ""
        raise ValueError(
            f"config key 'model.arch' must name a torchvision classification model; got {arch!r}.{hint} "
            f"All {len(known)} names: torchvision.models.list_models(module=torchvision.models)."
        )
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


class CVModule(L.LightningModule):
    """An image classifier as a LightningModule: cross-entropy loss, accuracy, AdamW.

    Args:
        config: ``arch`` (any torchvision classification model), ``num_classes``, ``channels_last``.
        optim: AdamW settings.

    Batches are dicts: ``images`` (``[B, 3, H, W]``) and ``labels`` (LongTensor ``[B]``).

    Example:
        >>> module = CVModule(CVModelConfig(arch="resnet18", num_classes=10), OptimConfig())
    """

    #: Whether ``train/loss`` also goes to the progress bar. Off by default: Lightning converts every
    #: metric logged with ``prog_bar=True`` in ``training_step`` to a Python number after each batch, a
    #: host sync that leaves the GPU idle while the host prepares the next step (measured in
    #: BENCHMARKS.md). The loggers get the loss every ``log_every_n_steps`` either way.
    train_loss_in_progress_bar = False

    def __init__(self, config: CVModelConfig, optim: OptimConfig) -> None:
        super().__init__()
        self.config = config
        self.optim_config = optim
        self.net = build_classifier(config.arch, config.num_classes)
        if config.channels_last:
            # NHWC lets cuDNN's convolutions and bf16 tensor cores skip layout transposes.
            self.net = self.net.to(memory_format=torch.channels_last)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        output = self.net(images)
        # Inception and GoogLeNet return (logits, aux_logits) in training mode.
        return output.logits if hasattr(output, "logits") else output

    def _loss_and_accuracy(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        images = batch["images"]
        if self.config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)  # a no-op when already NHWC
        logits = self(images)
        loss = F.cross_entropy(logits, batch["labels"])
        accuracy = (logits.argmax(dim=-1) == batch["labels"]).float().mean()
        return loss, accuracy

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, accuracy = self._loss_and_accuracy(batch)
        batch_size = batch["labels"].shape[0]
        self.log("train/loss", loss, prog_bar=self.train_loss_in_progress_bar, batch_size=batch_size)
        self.log("train/accuracy", accuracy, batch_size=batch_size)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, accuracy = self._loss_and_accuracy(batch)
        batch_size = batch["labels"].shape[0]
        self.log("val/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=True)
        self.log("val/accuracy", accuracy, batch_size=batch_size, sync_dist=True)

    def configure_optimizers(self) -> Any:
        clipping = clips_gradients_under_mixed_precision(self.trainer)
        optimizer = build_adamw(self, self.optim_config, clips_under_mixed_precision=clipping)
        return with_warmup(optimizer, self.optim_config.warmup_steps, lambda: self.trainer.global_step)


# -- data --------------------------------------------------------------------------------------------
def size_choices(config: CVDataConfig) -> list[int]:
    """The heights and widths images may have: ``image_size``, or min_size..max_size in size_step steps."""
    if not config.variable_sizes:
        return [config.image_size]
    return list(range(config.min_size, config.max_size + 1, config.size_step))


def draw_sizes(count: int, choices: Sequence[int], seed: int) -> list[tuple[int, int]]:
    """A (height, width) per image, each drawn uniformly from ``choices`` with a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(choices), (count, 2), generator=generator).tolist()
    return [(choices[h], choices[w]) for h, w in picks]


class SyntheticImages(Dataset):
    """Deterministic random images whose class shows as a 4x4 color pattern under noise.

    Image ``i`` has label ``i % num_classes`` and noise seeded by ``(seed, i)``: the same index always
    gives the same image, in any worker.
    """

    def __init__(self, sizes: Sequence[tuple[int, int]], num_classes: int, *, seed: int) -> None:
        self.sizes = list(sizes)
        self.num_classes = num_classes
        self.seed = seed
        generator = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(num_classes, 3, PATTERN_SIZE, PATTERN_SIZE, generator=generator)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | int]:
        label = index % self.num_classes
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        height, width = self.sizes[index]
        pattern = F.interpolate(self.patterns[label][None], size=(height, width), mode="bilinear", align_corners=False)
        # Noise drawn at 1/8 of the resolution and upsampled: cheap even at 224 px (one worker makes
        # a 128-image batch in tens of ms), and as strong as the pattern.
        noise = torch.randn(1, 3, max(1, height // 8), max(1, width // 8), generator=generator)
        noise = F.interpolate(noise, size=(height, width), mode="bilinear", align_corners=False)
        image = (pattern + noise)[0]
        return {"image": image, "label": label}


class FolderImages(Dataset):
    """An ImageFolder whose image ``i`` is resized to ``sizes[i]`` and normalized with ImageNet statistics."""

    def __init__(self, root: str, sizes: Sequence[tuple[int, int]] | None = None) -> None:
        self.folder = torchvision.datasets.ImageFolder(root)
        self.sizes = list(sizes) if sizes is not None else None

    @property
    def classes(self) -> list[str]:
        return self.folder.classes

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | int]:
        picture, label = self.folder[index]
        image = TF.to_dtype(TF.to_image(picture.convert("RGB")), torch.float32, scale=True)
        if self.sizes is not None:
            image = TF.resize(image, list(self.sizes[index]), antialias=True)
        return {"image": TF.normalize(image, IMAGENET_MEAN, IMAGENET_STD), "label": label}


def collate_images(samples: Sequence[dict[str, torch.Tensor | int]]) -> dict[str, torch.Tensor]:
    """Stacks images into one batch at the first image's size, resizing the others to it.

    Example:
        >>> batch = collate_images([{"image": torch.rand(3, 32, 24), "label": 1}, ...])
        >>> batch["images"].shape   # (B, 3, 32, 24)
    """
    height, width = samples[0]["image"].shape[-2:]
    images = []
    for sample in samples:
        image = sample["image"]
        if image.shape[-2:] != (height, width):
            image = F.interpolate(image[None], size=(height, width), mode="bilinear", align_corners=False)[0]
        images.append(image)
    labels = torch.tensor([int(sample["label"]) for sample in samples], dtype=torch.long)
    return {"images": torch.stack(images), "labels": labels}


class CVDataModule(SplitDataModule):
    """Train and validation images, split at random (fixed by ``seed``) by ``val_fraction``.

    Args:
        config: source, sizes, sample count, batch size and workers.
        num_classes: the model's outputs; an ImageFolder must not have more classes.
        seed: fixes the synthetic images, the image sizes and the split.

    Example:
        >>> data = CVDataModule(CVDataConfig(variable_sizes=True), num_classes=10, seed=0)
    """

    collate = staticmethod(collate_images)

    def __init__(self, config: CVDataConfig, *, num_classes: int, seed: int) -> None:
        super().__init__(config)
        self.num_classes = num_classes
        self.seed = seed

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        config = self.config
        choices = size_choices(config)
        if config.source == "synthetic":
            sizes = draw_sizes(config.num_samples, choices, self.seed)
            dataset: Dataset = SyntheticImages(sizes, self.num_classes, seed=self.seed)
        else:
            folder = FolderImages(config.source)
            if len(folder.classes) > self.num_classes:
                raise ValueError(
                    f"the ImageFolder {config.source!r} has {len(folder.classes)} classes but "
                    f"model.num_classes is {self.num_classes}; set model.num_classes={len(folder.classes)}."
                )
            folder.sizes = draw_sizes(len(folder), choices, self.seed)
            dataset = folder
        val_count = max(1, int(len(dataset) * config.val_fraction))
        generator = torch.Generator().manual_seed(self.seed)
        self.train_set, self.val_set = random_split(dataset, [len(dataset) - val_count, val_count], generator=generator)
        sizes = f"{choices[0]} px" if len(choices) == 1 else f"sides of {', '.join(map(str, choices))} px"
        rank_zero_info(
            f"CV data: {config.source}, {len(self.train_set):,} training and {len(self.val_set):,} validation "
            f"images, {sizes}."
        )
