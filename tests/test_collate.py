"""PadCollate, bucket choice and padding statistics: shapes, masks, loss invariance, workers, errors."""

from __future__ import annotations

import collections
import functools
import itertools
import pathlib
import pickle
import random
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from compile_callback.collate import (
    PadCollate,
    PaddingStats,
    ShapeCensus,
    bucket_for,
    choose_buckets,
    padding_stats,
    padding_waste,
)


def token_sample(length: int, start: int = 1) -> dict[str, torch.Tensor]:
    ids = torch.arange(start, start + length)
    return {"input_ids": ids, "labels": ids.clone()}


# ---------------------------------------------------------------------------------------------------
# Token sequences
# ---------------------------------------------------------------------------------------------------


def test_dict_tokens_pad_to_bucket_with_labels_ignored_and_mask_produced():
    collate = PadCollate(sequence_buckets=[8, 16])
    batch = collate([token_sample(5), token_sample(9, start=20)])
    assert batch["input_ids"].shape == (2, 16)
    assert batch["input_ids"][0].tolist() == [1, 2, 3, 4, 5] + [0] * 11
    assert batch["input_ids"][1, :9].tolist() == list(range(20, 29))
    assert batch["labels"][0].tolist() == [1, 2, 3, 4, 5] + [-100] * 11
    assert batch["attention_mask"].dtype == torch.long
    assert batch["attention_mask"].sum(dim=1).tolist() == [5, 9]
    assert batch["attention_mask"][1].tolist() == [1] * 9 + [0] * 7


def test_smallest_bucket_that_holds_the_longest_sample_is_used():
    collate = PadCollate(sequence_buckets=[16, 8])  # unsorted edges are sorted
    assert collate([token_sample(8)])["input_ids"].shape == (1, 8)
    assert collate([token_sample(3), token_sample(8)])["input_ids"].shape == (2, 8)
    assert collate([token_sample(9)])["input_ids"].shape == (1, 16)


def test_without_buckets_the_batch_longest_is_aligned_to_the_multiple():
    batch = PadCollate(multiple=8)([token_sample(3), token_sample(11)])
    assert batch["input_ids"].shape == (2, 16)
    assert PadCollate(multiple=1)([token_sample(3), token_sample(11)])["input_ids"].shape == (2, 11)


def test_existing_attention_mask_is_extended_with_zeros_in_its_dtype():
    samples = [
        {"input_ids": torch.arange(1, 4), "attention_mask": torch.tensor([True, True, False])},
        {"input_ids": torch.arange(1, 6), "attention_mask": torch.ones(5, dtype=torch.bool)},
    ]
    batch = PadCollate(sequence_buckets=[8])(samples)
    assert batch["attention_mask"].dtype == torch.bool
    assert batch["attention_mask"][0].tolist() == [True, True, False] + [False] * 5
    assert batch["attention_mask"][1].tolist() == [True] * 5 + [False] * 3


def test_no_mask_is_produced_when_mask_field_is_none():
    batch = PadCollate(sequence_buckets=[8], mask_field=None)([token_sample(3)])
    assert set(batch) == {"input_ids", "labels"}


def test_unknown_dict_fields_pass_through():
    samples = [dict(token_sample(3), source=torch.tensor(7)), dict(token_sample(5), source=torch.tensor(8))]
    batch = PadCollate(sequence_buckets=[8])(samples)
    assert batch["source"].tolist() == [7, 8]


def test_explicit_dict_fields_and_pad_ids():
    samples = [{"ids": torch.tensor([5, 6]), "target": torch.tensor([6, 7])}]
    batch = PadCollate(fields={"ids": "tokens", "target": "labels"}, pad_id=99, label_pad_id=-1, sequence_buckets=[4])(samples)
    assert batch["ids"][0].tolist() == [5, 6, 99, 99]
    assert batch["target"][0].tolist() == [6, 7, -1, -1]
    assert batch["attention_mask"][0].tolist() == [1, 1, 0, 0]


def test_tuple_samples_keep_their_arity():
    samples = [(torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])), (torch.tensor([1]), torch.tensor([2]))]
    batch = PadCollate(fields={0: "tokens", 1: "labels"}, sequence_buckets=[4])(samples)
    assert len(batch) == 2  # no mask position added: ``x, y = batch`` still unpacks
    tokens, labels = batch
    assert tokens.tolist() == [[1, 2, 3, 0], [1, 0, 0, 0]]
    assert labels.tolist() == [[2, 3, 4, -100], [2, -100, -100, -100]]


def test_namedtuple_samples_are_rebuilt_as_their_type():
    Pair = collections.namedtuple("Pair", ["tokens", "labels"])
    seen = []

    def inner(samples):
        seen.extend(samples)
        return samples

    PadCollate(inner, fields={0: "tokens", 1: "labels"}, sequence_buckets=[4])([Pair(torch.tensor([1, 2]), torch.tensor([2, 3]))])
    assert isinstance(seen[0], Pair) and seen[0].labels.tolist() == [2, 3, -100, -100]


def test_bare_tensor_samples():
    batch = PadCollate(fields="tokens", pad_id=-1, sequence_buckets=[4])([torch.tensor([1, 2]), torch.tensor([3, 4, 5])])
    assert batch.tolist() == [[1, 2, -1, -1], [3, 4, 5, -1]]


def test_truncate_cuts_to_the_largest_edge():
    batch = PadCollate(sequence_buckets=[4, 8], truncate=True)([token_sample(11), token_sample(2)])
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][0].tolist() == list(range(1, 9))
    assert batch["attention_mask"].sum(dim=1).tolist() == [8, 2]


def test_a_sample_longer_than_the_largest_edge_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"size 11 is larger than the largest bucket edge 8.*truncate=True"):
        PadCollate(sequence_buckets=[4, 8])([token_sample(11)])


def test_oversize_pad_pads_past_the_largest_edge_to_an_aligned_size_and_warns_once():
    collate = PadCollate(sequence_buckets=[4, 8], multiple=8, oversize="pad")
    with pytest.warns(UserWarning, match=r"sequence length 11 exceeds the largest bucket edge 8: padded to 16"):
        batch = collate([token_sample(11), token_sample(2)])
    assert batch["input_ids"].shape == (2, 16) and batch["attention_mask"].sum(dim=1).tolist() == [11, 2]
    assert batch["input_ids"][0, :11].tolist() == list(range(1, 12))  # nothing cut
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a process: the next oversize batch pads quietly
        assert collate([token_sample(20)])["input_ids"].shape == (1, 24)
        assert collate([token_sample(3)])["input_ids"].shape == (1, 4)
    images = PadCollate(fields="image", image_buckets=[4, 8], multiple=8, oversize="pad")
    with pytest.warns(UserWarning, match=r"image height 9 exceeds the largest bucket edge 8: padded to 16"):
        assert images([torch.ones(3, 9, 5)]).shape == (1, 3, 16, 8)


# ---------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------


def test_images_are_padded_bottom_right_with_zeros_to_a_fixed_size():
    first = torch.full((3, 5, 6), 2.0)
    second = torch.full((3, 8, 7), 3.0)
    images, labels = PadCollate(fields={0: "image", 1: "labels"}, image_size=(8, 8))([(first, 1), (second, 2)])
    assert images.shape == (2, 3, 8, 8)
    assert torch.equal(images[0, :, :5, :6], first)
    assert images[0, :, 5:, :].abs().sum() == 0 and images[0, :, :, 6:].abs().sum() == 0
    assert torch.equal(images[1, :, :8, :7], second) and images[1, :, :, 7:].abs().sum() == 0
    assert labels.tolist() == [1, 2]


def test_images_pad_to_bucket_edges_per_side():
    collate = PadCollate(fields={0: "image", 1: "labels"}, image_buckets=[16, 32])
    images, _ = collate([(torch.ones(3, 10, 20), 0), (torch.ones(3, 12, 5), 1)])
    assert images.shape == (2, 3, 16, 32)


def test_pixel_mask_is_produced_for_dict_samples_when_asked():
    collate = PadCollate(image_size=(4, 4), image_mask_field="pixel_mask")
    batch = collate([{"image": torch.ones(1, 2, 3), "label": 0}])
    assert batch["pixel_mask"][0].tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert float(collate.padding_stats(batch).waste) == pytest.approx(10 / 16)


def test_images_resize_to_fixed_size_keeping_dtype():
    constant = torch.full((3, 5, 9), 77, dtype=torch.uint8)
    ramp = torch.linspace(0, 1, 40).reshape(1, 5, 8)
    images, _ = PadCollate(fields={0: "image", 1: "labels"}, image_mode="resize", image_size=(10, 4))([(constant, 0)])
    assert images.dtype == torch.uint8 and images.shape == (1, 3, 10, 4)
    assert (images == 77).all()  # resizing a constant image keeps it constant: no zero padding
    resized, _ = PadCollate(fields={0: "image", 1: "labels"}, image_mode="resize", image_size=(5, 8))([(ramp, 0)])
    assert torch.equal(resized[0], ramp)  # already the target size: untouched


def test_an_image_larger_than_image_size_in_pad_mode_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"image of 9×4 does not fit image_size=\(8, 8\).*image_mode='resize'"):
        PadCollate(fields={0: "image", 1: "labels"}, image_size=(8, 8))([(torch.ones(3, 9, 4), 0)])


# ---------------------------------------------------------------------------------------------------
# The short last batch
# ---------------------------------------------------------------------------------------------------


def test_short_batch_pad_adds_masked_samples():
    collate = PadCollate(sequence_buckets=[8], batch_size=4, short_batch="pad")
    batch = collate([token_sample(5), token_sample(3)])
    assert batch["input_ids"].shape == (4, 8)
    assert (batch["labels"][2:] == -100).all()
    assert (batch["attention_mask"][2:] == 0).all()
    assert (batch["input_ids"][2:] == 0).all()
    assert torch.equal(batch["input_ids"][:2], PadCollate(sequence_buckets=[8])([token_sample(5), token_sample(3)])["input_ids"])


def test_short_batch_pad_masks_class_labels_and_zeroes_images():
    collate = PadCollate(fields={0: "image", 1: "labels"}, image_size=(4, 4), batch_size=3, short_batch="pad")
    images, labels = collate([(torch.ones(3, 4, 4), 2)])
    assert labels.tolist() == [2, -100, -100]
    assert images[1:].abs().sum() == 0 and images[0].sum() == 48


def test_short_batch_pad_copies_unknown_fields_from_the_first_sample():
    collate = PadCollate(fields={0: "labels"}, batch_size=3, short_batch="pad")
    labels, features = collate([(torch.tensor(1), torch.tensor([0.5, 0.25]))])
    assert labels.tolist() == [1, -100, -100]
    assert features.tolist() == [[0.5, 0.25]] * 3


def test_short_batch_keep_leaves_the_batch_short():
    collate = PadCollate(sequence_buckets=[8], batch_size=4, short_batch="keep")
    assert collate([token_sample(5)])["input_ids"].shape == (1, 8)


def test_short_batch_drop_accepts_full_batches_and_refuses_short_ones():
    collate = PadCollate(sequence_buckets=[8], batch_size=2, short_batch="drop")
    assert collate([token_sample(5), token_sample(2)])["input_ids"].shape == (2, 8)
    with pytest.raises(ValueError, match=r"short batch of 1 samples \(batch_size=2\).*drop_last=True"):
        collate([token_sample(5)])


def test_short_batch_pad_without_labels_or_mask_is_refused():
    collate = PadCollate(fields={0: "image"}, image_size=(4, 4), batch_size=2, short_batch="pad")
    with pytest.raises(ValueError, match=r"no field with role 'labels' or 'mask'"):
        collate([(torch.ones(1, 4, 4), torch.ones(3))])


def test_more_samples_than_batch_size_is_refused():
    with pytest.raises(ValueError, match=r"got 3 samples but batch_size=2"):
        PadCollate(batch_size=2, short_batch="pad")([token_sample(1)] * 3)


# ---------------------------------------------------------------------------------------------------
# Loss invariance: padding must not change the loss or the gradients of the real samples
# ---------------------------------------------------------------------------------------------------


def per_token_model(vocab: int = 50, width: int = 8) -> nn.Module:
    # Embedding + Linear sees each token alone, so padding cannot leak into real positions.
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, vocab))


def loss_and_grads(model: nn.Module, loss: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_token_loss_and_gradients_are_unchanged_by_padding():
    generator = torch.Generator().manual_seed(1)
    samples = []
    for length in (3, 7, 5):
        ids = torch.randint(1, 50, (length,), generator=generator)
        samples.append({"input_ids": ids, "labels": torch.randint(0, 50, (length,), generator=generator)})
    model = per_token_model()

    # Reference: every real token, no padding at all.
    ids = torch.cat([s["input_ids"] for s in samples])
    labels = torch.cat([s["labels"] for s in samples])
    ref_loss, ref_grads = loss_and_grads(model, nn.functional.cross_entropy(model(ids), labels))

    batch = PadCollate(sequence_buckets=[16], batch_size=5, short_batch="pad")(samples)
    assert batch["input_ids"].shape == (5, 16)  # padded in length and with two masked samples
    logits = model(batch["input_ids"])
    padded_loss, padded_grads = loss_and_grads(
        model, nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    )
    torch.testing.assert_close(padded_loss, ref_loss)
    for padded, reference in zip(padded_grads, ref_grads):
        torch.testing.assert_close(padded, reference)


def test_class_loss_and_gradients_are_unchanged_by_masked_samples():
    generator = torch.Generator().manual_seed(2)
    samples = [(torch.randn(1, 4, 4, generator=generator), label) for label in (0, 2, 1)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))

    images = torch.stack([s[0] for s in samples])
    ref_loss, ref_grads = loss_and_grads(model, nn.functional.cross_entropy(model(images), torch.tensor([0, 2, 1])))

    padded_images, labels = PadCollate(fields={0: "image", 1: "labels"}, image_size=(4, 4), batch_size=8, short_batch="pad")(samples)
    assert labels.tolist() == [0, 2, 1] + [-100] * 5
    padded_loss, padded_grads = loss_and_grads(model, nn.functional.cross_entropy(model(padded_images), labels, ignore_index=-100))
    torch.testing.assert_close(padded_loss, ref_loss)
    for padded, reference in zip(padded_grads, ref_grads):
        torch.testing.assert_close(padded, reference)


# ---------------------------------------------------------------------------------------------------
# Choosing buckets
# ---------------------------------------------------------------------------------------------------


def padded_elements(sizes: list[int], edges: list[int]) -> int:
    return sum(bucket_for(size, sorted(edges)) - size for size in sizes)


@pytest.mark.parametrize("seed", range(40))
def test_choose_buckets_is_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    multiple = rng.choice([1, 4, 8])
    sizes = [rng.randint(0, 40) for _ in range(rng.randint(1, 12))]
    max_buckets = rng.randint(1, 4)
    edges = choose_buckets(sizes, max_buckets=max_buckets, multiple=multiple)

    assert edges == sorted(edges) and len(edges) <= max_buckets
    assert all(edge % multiple == 0 and edge > 0 for edge in edges)
    assert edges[-1] >= max(sizes)
    # Brute force over every multiple up to the aligned maximum (a superset of the DP's candidates).
    top = max(multiple, -(-max(sizes) // multiple) * multiple)
    grid = list(range(multiple, top, multiple))
    best = min(
        padded_elements(sizes, [*subset, top])
        for r in range(max_buckets)
        for subset in itertools.combinations(grid, r)
    )
    assert padded_elements(sizes, edges) == best


def test_choose_buckets_examples():
    assert choose_buckets([100, 120, 128, 500, 510], max_buckets=2, multiple=8) == [128, 512]
    assert choose_buckets([100, 120, 128, 500, 510], max_buckets=1, multiple=8) == [512]
    assert choose_buckets([3, 3, 3], max_buckets=4, multiple=8) == [8]  # fewest edges on ties
    assert choose_buckets([0], max_buckets=1, multiple=8) == [8]
    assert choose_buckets(ShapeCensus([5, 7, 7, 30]), max_buckets=2) == [8, 32]


def test_choose_buckets_never_exceeds_max_size():
    assert choose_buckets([10, 1001], max_buckets=2, multiple=8, max_size=1001) == [16, 1001]
    assert choose_buckets([10, 1000], max_buckets=1, multiple=8, max_size=1024) == [1000]


@pytest.mark.parametrize(
    "sizes, options, message",
    [
        ([], {"max_buckets": 2}, r"`sizes` is empty"),
        ([4], {"max_buckets": 0}, r"`max_buckets` must be an integer >= 1; got 0"),
        ([4], {"max_buckets": 2, "multiple": 0}, r"`multiple` must be an integer >= 1; got 0"),
        ([4, -1], {"max_buckets": 2}, r"sizes >= 0; got -1"),
        ([4, 2.5], {"max_buckets": 2}, r"must hold integers"),
        ([4, 2000], {"max_buckets": 2, "max_size": 1024}, r"size 2000 is larger than max_size=1024\. Raise max_size"),
        ([4], {"max_buckets": 2, "max_size": 0}, r"`max_size` must be an integer >= 1"),
    ],
)
def test_choose_buckets_errors(sizes, options, message):
    with pytest.raises(ValueError, match=message):
        choose_buckets(sizes, **options)


def test_bucket_for():
    assert bucket_for(100, [64, 128, 256]) == 128
    assert bucket_for(128, [64, 128, 256]) == 128
    with pytest.raises(ValueError, match=r"size 300 is larger than the largest bucket edge 256\. Raise max_size"):
        bucket_for(300, [64, 128, 256])
    with pytest.raises(ValueError, match=r"strictly ascending"):
        bucket_for(3, [8, 4])
    with pytest.raises(ValueError, match=r"`edges` is empty"):
        bucket_for(3, [])


def test_padding_waste_numbers():
    assert padding_waste([6, 8], [8]) == pytest.approx(2 / 16)
    assert padding_waste([100, 120], [128]) == pytest.approx((28 + 8) / 256)
    assert padding_waste([100, 120], [100, 128]) == pytest.approx(8 / 228)
    assert padding_waste([8, 16], [8, 16]) == 0.0
    with pytest.raises(ValueError, match=r"larger than the largest bucket edge"):
        padding_waste([20], [16])


def test_shape_census():
    census = ShapeCensus([5, 7, 7])
    census.add(30)
    census.update([7, 5])
    assert len(census) == 6
    assert census.most_common() == [(7, 3), (5, 2), (30, 1)]
    assert census.most_common(1) == [(7, 3)]
    assert census.sizes() == [5, 5, 7, 7, 7, 30]
    with pytest.raises(ValueError, match=r"integer sizes >= 0; got -3"):
        census.add(-3)


def test_measure_feeds_a_census():
    collate = PadCollate()
    census = ShapeCensus(collate.measure(token_sample(n))["length"] for n in (3, 5, 5))
    assert census.sizes() == [3, 5, 5]
    image_collate = PadCollate(fields={0: "image", 1: "labels"})
    assert image_collate.measure((torch.ones(3, 10, 20), 0)) == {"height": 10, "width": 20}


# ---------------------------------------------------------------------------------------------------
# Option and sample errors
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"short_batch": "trim", "batch_size": 2}, r"`short_batch` must be one of \('pad', 'drop', 'keep'\); got 'trim'"),
        ({"short_batch": "pad"}, r"short_batch='pad' needs `batch_size`"),
        ({"short_batch": "drop"}, r"short_batch='drop' needs `batch_size`"),
        ({"image_mode": "crop"}, r"`image_mode` must be one of \('pad', 'resize'\); got 'crop'"),
        ({"image_mode": "resize"}, r"image_mode='resize' needs `image_size=\(height, width\)`"),
        ({"image_size": (8,)}, r"`image_size` must be \(height, width\)"),
        ({"image_size": (8, 8), "image_buckets": [8]}, r"not both"),
        ({"fields": {"x": "pixels"}}, r"`fields` roles must be one of .*; got 'pixels'"),
        ({"fields": 3}, r"`fields` must be a role string, a dict"),
        ({"truncate": True}, r"truncate=True .* no buckets were given"),
        ({"oversize": "cut"}, r"`oversize` must be one of \('raise', 'pad'\); got 'cut'"),
        ({"oversize": "pad", "truncate": True, "sequence_buckets": [8]}, r"truncate=True cuts .* oversize='pad' pads it"),
        ({"sequence_buckets": []}, r"`sequence_buckets` must name at least one bucket edge"),
        ({"multiple": 0}, r"`multiple` must be an integer >= 1; got 0"),
        ({"batch_size": 0}, r"`batch_size` must be an integer >= 1; got 0"),
        ({"pad_id": "0"}, r"`pad_id` must be an integer"),
    ],
)
def test_pad_collate_option_errors(options, message):
    with pytest.raises(ValueError, match=message):
        PadCollate(**options)


def test_image_and_class_label_pairs_need_no_fields():
    """torchvision's and timm's ``(image, label)`` samples: padded and counted with no ``fields``; a float second
    item (a regression target) or a 1-D first (features) is not read as one."""
    collate = PadCollate(image_buckets=[8], batch_size=2, short_batch="pad")
    images, labels = collate([(torch.ones(3, 5, 7), 4)])
    assert images.shape == (2, 3, 8, 8) and labels.tolist() == [4, -100]  # the filler's label is masked
    assert float(padding_stats((images, labels)).waste) > 0
    for sample in ((torch.ones(3, 5, 7), 0.5), (torch.ones(3), 1)):
        with pytest.raises(ValueError, match=r"so PadCollate needs `fields`"):
            PadCollate()([sample])


def test_numpy_integer_class_labels_are_class_labels():
    """An image dataset's labels are often NumPy integers (``np.int64``, e.g. read from a CSV or an array of
    targets): the pair is recognised with no ``fields``, padded, and the filler's label is masked; a NumPy bool
    is not a class label."""
    np = pytest.importorskip("numpy")
    collate = PadCollate(image_buckets=[8], batch_size=3, short_batch="pad")
    images, labels = collate([(torch.ones(3, 5, 7), np.int64(4)), (torch.ones(3, 6, 6), np.int32(2))])
    assert images.shape == (3, 3, 8, 8) and labels.tolist() == [4, 2, -100]
    with pytest.raises(ValueError, match=r"so PadCollate needs `fields`"):
        PadCollate()([(torch.ones(3, 5, 7), np.bool_(True))])
    with pytest.raises(ValueError, match=r"must be a tensor or an int class label; got"):
        PadCollate(fields={0: "image", 1: "labels"})([(torch.ones(3, 5, 7), np.float32(0.5))])


def test_sample_errors_say_what_to_pass():
    with pytest.raises(ValueError, match=r"tuple of 2 items, so PadCollate needs `fields`.*fields=\{0: 'tokens'"):
        PadCollate()([(torch.ones(3), 1)])
    with pytest.raises(ValueError, match=r"bare tensor of shape \(3,\), so `fields` must be its role"):
        PadCollate()([torch.ones(3)])
    with pytest.raises(ValueError, match=r"`fields` names \['ids'\] but the sample has keys \['input_ids'\]"):
        PadCollate(fields={"ids": "tokens"})([{"input_ids": torch.ones(3)}])
    with pytest.raises(ValueError, match=r"`fields` names positions \[2\]"):
        PadCollate(fields={2: "tokens"})([(torch.ones(3), 1)])
    with pytest.raises(ValueError, match=r"field 'input_ids' \(role 'tokens'\) must be a 1-D tensor.*\(2, 3\)"):
        PadCollate()([{"input_ids": torch.ones(2, 3)}])
    with pytest.raises(ValueError, match=r"field 0 \(role 'image'\) must be a tensor of shape \(C, H, W\)"):
        PadCollate(fields={0: "image", 1: "labels"})([([1, 2], 0)])
    with pytest.raises(ValueError, match=r"sample 1 of the batch lacks \['labels'\]"):
        PadCollate()([token_sample(2), {"input_ids": torch.ones(2, dtype=torch.long)}])
    with pytest.raises(TypeError, match=r"expects the list of samples of one batch; got a tuple.*batch_size=None"):
        PadCollate(fields={0: "tokens"})((torch.ones(2), torch.ones(2)))


# ---------------------------------------------------------------------------------------------------
# Padding statistics
# ---------------------------------------------------------------------------------------------------


def test_stats_in_process_and_read_back_from_the_batch_agree_for_tokens():
    collate = PadCollate(sequence_buckets=[8], batch_size=4, short_batch="pad")
    batch = collate([token_sample(5), token_sample(3)])
    assert collate.stats == PaddingStats(8, 32)
    read = collate.padding_stats(batch)
    assert isinstance(read.real_elements, torch.Tensor) and int(read.real_elements) == 8 and read.total_elements == 32
    assert float(read.waste) == pytest.approx(24 / 32)
    collate([token_sample(8)] * 4)
    assert collate.stats.total_elements == 64 and collate.stats.waste == pytest.approx(24 / 64)


def test_padding_stats_without_a_mask_uses_labels_then_tokens():
    tuple_batch = PadCollate(fields={0: "tokens", 1: "labels"}, sequence_buckets=[4])([(torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4]))])
    assert int(padding_stats(tuple_batch, fields={0: "tokens", 1: "labels"}).real_elements) == 3
    bare = PadCollate(fields="tokens", sequence_buckets=[4])([torch.tensor([1, 2])])
    assert int(padding_stats(bare, fields="tokens").real_elements) == 2


def test_padding_stats_of_images_counts_masked_samples_without_a_pixel_mask():
    collate = PadCollate(fields={0: "image", 1: "labels"}, image_size=(4, 4), batch_size=4, short_batch="pad")
    batch = collate([(torch.ones(3, 2, 4), 0), (torch.ones(3, 4, 4), 1)])
    read = collate.padding_stats(batch)
    assert int(read.real_elements) == 2 * 16 and read.total_elements == 4 * 16  # a lower bound of the waste
    assert collate.stats == PaddingStats(8 + 16, 64)  # exact, in the process that padded


def test_padding_stats_of_class_labels_only():
    batch = PadCollate(fields={1: "labels"}, batch_size=4, short_batch="pad")([(torch.ones(2), 1)])
    assert int(padding_stats(batch, fields={1: "labels"}).real_elements) == 1


def test_padding_stats_with_nothing_to_count_says_so():
    with pytest.raises(ValueError, match=r"padding_stats found nothing to count"):
        padding_stats({"x": torch.ones(2, 3)})


# ---------------------------------------------------------------------------------------------------
# Pickling and real DataLoaders with workers
# ---------------------------------------------------------------------------------------------------


def test_pad_collate_pickles():
    collate = PadCollate(sequence_buckets=[8, 16], batch_size=3, short_batch="pad")
    copy = pickle.loads(pickle.dumps(collate))
    samples = [token_sample(5), token_sample(11)]
    expected, got = collate(samples), copy(samples)
    assert all(torch.equal(expected[key], got[key]) for key in expected)
    assert copy.inner is torch.utils.data.default_collate


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_two_workers(context):
    lengths = [3, 9, 17, 5, 30, 2, 12]
    collate = PadCollate(sequence_buckets=[8, 16, 32], batch_size=3, short_batch="pad")
    # A plain list as the dataset: spawned workers unpickle it without importing this test module.
    dataset = [token_sample(length, start=index + 1) for index, length in enumerate(lengths)]
    loader = DataLoader(dataset, batch_size=3, num_workers=2, multiprocessing_context=context, collate_fn=collate)
    batches = list(loader)
    assert [tuple(b["input_ids"].shape) for b in batches] == [(3, 32), (3, 32), (3, 16)]
    assert batches[2]["labels"][1:].eq(-100).all()
    # The workers padded; this process's copy saw nothing, so stats are read from the batches.
    assert collate.stats == PaddingStats()
    total = functools.reduce(lambda a, b: a + b, (collate.padding_stats(b) for b in batches))
    assert int(total.real_elements) == sum(lengths)
    assert total.total_elements == 3 * 32 + 3 * 32 + 3 * 16


def test_collation_modules_do_not_import_lightning():
    # Loaded by file path, outside the package (whose __init__ imports the callback and so Lightning).
    code = (
        "import importlib.util, sys\n"
        "for name in ('collate', 'loaders'):\n"
        "    spec = importlib.util.spec_from_file_location(name, f'compile_callback/{name}.py')\n"
        "    sys.modules[name] = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(sys.modules[name])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
    )
    root = pathlib.Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
