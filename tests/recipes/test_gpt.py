"""The GPT recipe's model and data: causal, tied, named for region patterns; windows and padded chunks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from compile_callback import resolve_regions
from recipes.config import GPTDataConfig, GPTModelConfig, OptimConfig
from recipes.gpt import (
    GPTDataModule,
    GPTModule,
    chunk_lengths,
    find_files,
    pad_collate,
    padded_vocab_size,
    standard_library_folder,
)


def tiny_gpt(**overrides) -> GPTModule:
    torch.manual_seed(0)
    return GPTModule(GPTModelConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, **overrides}), OptimConfig())


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(bytes(range(32, 127)) * 60)  # 5700 bytes of printable ASCII
    return str(path)


def test_model_is_causal():
    model = tiny_gpt().eval()
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 256
    with torch.no_grad():
        before, _ = model(tokens)
        after, _ = model(changed)
    torch.testing.assert_close(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_vocab_padding_tied_weights_and_region_names():
    assert padded_vocab_size(256) == 256
    assert padded_vocab_size(257) == 320
    assert padded_vocab_size(50257) == 50304
    model = tiny_gpt(vocab_size=300)
    logits, _ = model(torch.zeros(1, 4, dtype=torch.long))
    assert logits.shape == (1, 4, 320)
    assert model.lm_head.weight is model.transformer.wte.weight
    (blocks,) = resolve_regions(model, ["transformer.h.*"])
    assert blocks.module_names == ["transformer.h.0", "transformer.h.1"]
    assert {"transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"} <= dict(model.named_modules()).keys()


def test_gpt2_initialization():
    model = tiny_gpt(n_layer=8, n_embd=128, n_head=4)
    assert model.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.transformer.h[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)
    assert torch.count_nonzero(model.transformer.h[0].attn.c_attn.bias) == 0


def test_loss_ignores_padding_labels():
    model = tiny_gpt()
    tokens = torch.randint(0, 256, (2, 10))
    labels = torch.randint(0, 256, (2, 10))
    labels[1, 6:] = -100
    logits, loss = model(tokens, labels)
    counted = labels != -100
    expected = F.cross_entropy(logits[counted], labels[counted])
    torch.testing.assert_close(loss, expected)


def test_longer_than_block_size_fails_with_the_fix():
    with pytest.raises(ValueError, match=r"sequence of length 17 is longer than model.block_size=16"):
        tiny_gpt()(torch.zeros(1, 17, dtype=torch.long))


def test_pad_collate_pads_inputs_with_zero_and_labels_with_ignore_index():
    samples = [
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([6, 7, 8])},
        {"input_ids": torch.tensor([9]), "labels": torch.tensor([10])},
    ]
    batch = pad_collate(samples)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [9, 0, 0]]
    assert batch["labels"].tolist() == [[6, 7, 8], [10, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_fixed_mode_gives_shifted_windows(text_file):
    data = GPTDataModule(GPTDataConfig(sources=[text_file], mode="fixed", seq_len=16, batch_size=4), seed=0)
    data.setup("fit")
    batch = next(iter(data.val_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    torch.testing.assert_close(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    assert bool(batch["attention_mask"].all())


def test_training_batches_are_all_full_and_validation_sees_every_sample(text_file):
    # A shorter last batch is a new shape once an epoch for a compiled step (a recompile, new CUDA graphs).
    data = GPTDataModule(GPTDataConfig(sources=[text_file], mode="fixed", seq_len=16, batch_size=6), seed=0)
    data.setup("fit")
    assert len(data.train_set) % 6 and len(data.val_set) % 6, "pick a batch size that leaves a remainder"
    assert {b["input_ids"].shape[0] for b in data.train_dataloader()} == {6}
    assert sum(b["input_ids"].shape[0] for b in data.val_dataloader()) == len(data.val_set)


def test_varlen_mode_gives_batches_of_different_lengths_padded_with_ignored_labels(text_file):
    config = GPTDataConfig(sources=[text_file], mode="varlen", min_len=4, max_len=16, batch_size=4)
    data = GPTDataModule(config, seed=0)
    data.setup("fit")
    batches = list(data.train_dataloader())
    widths = {batch["input_ids"].shape[1] for batch in batches}
    assert len(widths) > 1, f"every batch has the same length {widths}"
    for batch in batches:
        real = batch["attention_mask"].bool()
        lengths = real.sum(dim=1)
        assert bool(((lengths >= 4) & (lengths <= 16)).all())
        assert bool((batch["labels"][~real] == -100).all())
        assert bool((batch["input_ids"][~real] == 0).all())
        assert bool((batch["labels"][real] != -100).all())


def test_chunk_lengths_are_in_range_fit_the_text_and_follow_the_seed():
    lengths = chunk_lengths(10_000, min_len=8, max_len=40, seed=3)
    assert min(lengths) >= 8 and max(lengths) <= 40
    assert sum(length + 1 for length in lengths) <= 10_000
    assert lengths == chunk_lengths(10_000, min_len=8, max_len=40, seed=3)
    assert lengths != chunk_lengths(10_000, min_len=8, max_len=40, seed=4)


def test_default_source_is_the_standard_library_without_installed_packages():
    files = find_files([standard_library_folder()], "*.py")
    assert any(path.endswith(os.sep + "os.py") for path in files)
    assert not any("site-packages" in path for path in files)
    assert files == sorted(files)


def test_missing_source_fails_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"data source '.*nowhere' is neither a file nor a folder"):
        find_files([str(tmp_path / "nowhere")], "*.py")
    with pytest.raises(ValueError, match=r"no files matching '\*.py'"):
        find_files([str(tmp_path)], "*.py")
