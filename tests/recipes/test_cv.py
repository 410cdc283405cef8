"""The CV recipe's model and data: torchvision by name, synthetic and folder images, per-batch sizes."""

from __future__ import annotations

import pytest
import torch

from recipes.config import CVDataConfig, CVModelConfig, OptimConfig
from recipes.cv import CVDataModule, CVModule, build_classifier, collate_images


def test_any_torchvision_classifier_by_name_and_a_clear_error_otherwise():
    model = build_classifier("mobilenet_v3_small", num_classes=7)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    with pytest.raises(ValueError, match=r"config key 'model.arch' must name a torchvision classification model; got 'resnet181'\. Closest: resnet18"):
        build_classifier("resnet181", num_classes=7)


def test_channels_last_converts_model_and_inputs():
    module = CVModule(CVModelConfig(arch="resnet18", num_classes=3, channels_last=True), OptimConfig())
    assert module.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    seen = []
    module.net.conv1.register_forward_pre_hook(lambda _, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    module.training_step({"images": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 1])}, 0)
    assert seen == [True]


def test_collate_resizes_a_batch_to_its_first_image():
    samples = [{"image": torch.rand(3, 24, 32), "label": 1}, {"image": torch.rand(3, 40, 16), "label": 2}]
    batch = collate_images(samples)
    assert batch["images"].shape == (2, 3, 24, 32)
    assert batch["labels"].tolist() == [1, 2]
    torch.testing.assert_close(batch["images"][0], samples[0]["image"])


def test_synthetic_images_are_deterministic_and_separable():
    config = CVDataConfig(num_samples=64, image_size=16, batch_size=64)
    data = CVDataModule(config, num_classes=4, seed=0)
    data.setup("fit")
    first = next(iter(data.val_dataloader()))
    again = next(iter(data.val_dataloader()))
    torch.testing.assert_close(first["images"], again["images"])
    # The class shows through the noise: images of one class are closer to their class mean.
    everything = torch.utils.data.ConcatDataset([data.train_set, data.val_set])
    batch = collate_images([everything[i] for i in range(len(everything))])
    means = torch.stack([batch["images"][batch["labels"] == c].mean(0) for c in range(4)])
    distances = torch.cdist(batch["images"].flatten(1), means.flatten(1))
    accuracy = (distances.argmin(dim=1) == batch["labels"]).float().mean().item()
    assert accuracy > 0.9


def test_variable_sizes_change_per_batch_and_stay_within_a_batch():
    config = CVDataConfig(num_samples=200, variable_sizes=True, min_size=16, max_size=32, size_step=8, batch_size=8)
    data = CVDataModule(config, num_classes=10, seed=0)
    data.setup("fit")
    shapes = {tuple(batch["images"].shape[-2:]) for batch in data.train_dataloader()}
    assert len(shapes) > 1
    assert all(h in (16, 24, 32) and w in (16, 24, 32) for h, w in shapes)


def test_image_folder_source(tmp_path):
    from PIL import Image

    for class_index, name in enumerate(["cat", "dog"]):
        (tmp_path / name).mkdir()
        for i in range(5):
            color = (200 * class_index, 50 + 10 * i, 30)
            Image.new("RGB", (20 + i, 12), color).save(tmp_path / name / f"{i}.png")
    config = CVDataConfig(source=str(tmp_path), image_size=8, batch_size=4, val_fraction=0.2)
    data = CVDataModule(config, num_classes=2, seed=0)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch["images"].shape == (4, 3, 8, 8)
    assert set(batch["labels"].tolist()) <= {0, 1}
    too_few = CVDataModule(config, num_classes=1, seed=0)
    with pytest.raises(ValueError, match=r"has 2 classes but model.num_classes is 1; set model.num_classes=2"):
        too_few.setup("fit")
