"""The GPT recipe: a byte-level decoder-only transformer and the text it trains on.

The model follows nanoGPT (pre-norm blocks, causal ``scaled_dot_product_attention``, GELU MLP, token
embedding tied to the output head, GPT-2 initialization) with the same module names, so region
patterns such as ``"transformer.h.*"`` (every block) or ``"lm_head"`` name what they do there.

The data needs no download: by default it is the Python standard library's own source, read as bytes
(token id = byte value). Two modes: ``fixed`` windows of ``seq_len`` bytes (every batch the same shape)
and ``varlen`` chunks of ``min_len``..``max_len`` bytes padded to the longest in each batch (the shape
changes from batch to batch, as with real documents).
"""

from __future__ import annotations

import fnmatch
import math
import os
import sysconfig
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import Dataset

from recipes.data import SplitDataModule

from recipes.config import IGNORE_INDEX, GPTDataConfig, GPTModelConfig, OptimConfig
from recipes.optim import build_adamw, clips_gradients_under_mixed_precision, with_warmup

PAD_ID = 0  # the NUL byte; padded positions are masked out of the loss by IGNORE_INDEX labels
VOCAB_MULTIPLE = 64  # embedding and head sizes padded to a multiple of 64: faster matmuls on GPUs


# -- model -------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # query, key, value in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.c_attn(x).split(channels, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads)
        q, k, v = (t.view(batch, time, self.n_head, channels // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, time, channels)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: GPTModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def padded_vocab_size(vocab_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of 64 (256 stays 256; GPT-2's 50257 becomes 50304)."""
    return math.ceil(vocab_size / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


class GPTModule(L.LightningModule):
    """A byte-level GPT as a LightningModule: the network, its loss, its metrics and its optimizer.

    Args:
        config: the network's shape (layers, heads, width, context length, vocabulary).
        optim: AdamW settings.

    Batches are dicts: ``input_ids`` and ``labels`` (LongTensor ``[B, T]``, label -100 = not counted)
    and an optional ``attention_mask``. Padding is on the right, so causal attention already keeps
    real tokens from seeing it and the mask is not needed.

    Example:
        >>> module = GPTModule(GPTModelConfig(n_layer=2), OptimConfig())
        >>> logits, loss = module(input_ids, labels)
    """

    #: Whether ``train/loss`` also goes to the progress bar. Off by default: Lightning converts every
    #: metric logged with ``prog_bar=True`` in ``training_step`` to a Python number after each batch, a
    #: host sync that leaves the GPU idle while the host prepares the next step (measured in
    #: BENCHMARKS.md). The loggers get the loss every ``log_every_n_steps`` either way.
    train_loss_in_progress_bar = False

    def __init__(self, config: GPTModelConfig, optim: OptimConfig) -> None:
        super().__init__()
        self.config = config
        self.optim_config = optim
        vocab = padded_vocab_size(config.vocab_size)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, parameter in self.named_parameters():
            if name.endswith("c_proj.weight"):
                # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) so the residual stream's
                # variance does not grow with depth.
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self._val_loss_sum: torch.Tensor | None = None
        self._val_tokens: torch.Tensor | None = None

    def configure_model(self) -> None:
        """Under ``trainer.strategy=model_parallel`` (Lightning's ``ModelParallelStrategy``), FSDP2 the
        torchtitan way: each block sharded on its own, then the rest with the root, so a block's
        parameters are gathered just before it runs and freed after. Other strategies: nothing."""
        if self.device_mesh is None or isinstance(self.transformer.h[0], FSDPModule):
            return  # not sharded, or already (configure_model runs again for a later stage)
        mesh = self.device_mesh["data_parallel"]
        for block in self.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T, padded vocab]`` and, given labels, the mean cross-entropy over counted positions.

        The loss is computed here, not in ``training_step``, so that compiling the whole model also
        compiles the loss (and fuses it with the head), as nanoGPT does.
        """
        time = input_ids.shape[1]
        if time > self.config.block_size:
            raise ValueError(
                f"sequence of length {time} is longer than model.block_size={self.config.block_size}; "
                f"shorten the data (data.seq_len / data.max_len) or raise model.block_size."
            )
        positions = torch.arange(time, device=input_ids.device)
        x = self.transformer.drop(self.transformer.wte(input_ids) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if labels is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        _, loss = self(batch["input_ids"], batch["labels"])
        self.log("train/loss", loss, prog_bar=self.train_loss_in_progress_bar)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum = torch.zeros((), device=self.device)
        self._val_tokens = torch.zeros((), device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        _, loss = self(batch["input_ids"], batch["labels"])
        # Weighted by counted tokens, so batches of different lengths count for what they hold; kept
        # on the device so validation never waits for the host.
        tokens = (batch["labels"] != IGNORE_INDEX).sum()
        self._val_loss_sum += loss.detach().float() * tokens
        self._val_tokens += tokens

    def on_validation_epoch_end(self) -> None:
        if self._val_tokens is None:
            return
        loss = self._val_loss_sum / self._val_tokens.clamp(min=1)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/perplexity", loss.exp(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        clipping = clips_gradients_under_mixed_precision(self.trainer)
        optimizer = build_adamw(self, self.optim_config, clips_under_mixed_precision=clipping)
        return with_warmup(optimizer, self.optim_config.warmup_steps, lambda: self.trainer.global_step)


# -- data --------------------------------------------------------------------------------------------
def standard_library_folder() -> str:
    """Where this Python's standard library lives: text that is on every machine."""
    return sysconfig.get_paths()["stdlib"]


def find_files(sources: Sequence[str], pattern: str) -> list[str]:
    """The files ``sources`` name: files as given, folders searched recursively for ``pattern``.

    Installed packages (``site-packages``) and caches inside a folder are skipped, so the standard
    library's folder yields the standard library only. The order is sorted, hence reproducible.

    Raises:
        ValueError: a source that does not exist, or no file at all.
    """
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files: list[str] = []
    for source in sources:
        if os.path.isfile(source):
            files.append(source)
        elif os.path.isdir(source):
            found = []
            for root, folders, names in os.walk(source):
                folders[:] = [f for f in folders if f not in skip and not f.startswith(".")]
                found.extend(os.path.join(root, n) for n in names if fnmatch.fnmatch(n, pattern))
            files.extend(sorted(found))
        else:
            raise ValueError(f"data source {source!r} is neither a file nor a folder; fix data.sources.")
    if not files:
        raise ValueError(
            f"no files matching {pattern!r} in data.sources {list(sources)!r}; give text files or set data.pattern."
        )
    return files


def read_bytes(files: Sequence[str], max_bytes: int) -> torch.Tensor:
    """The files' contents, concatenated in order and cut at ``max_bytes``, as a uint8 tensor."""
    parts, total = [], 0
    for path in files:
        with open(path, "rb") as handle:
            content = handle.read(max_bytes - total)
        parts.append(content)
        total += len(content)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)


def chunk_lengths(total: int, *, min_len: int, max_len: int, seed: int) -> list[int]:
    """Lengths in ``min_len..max_len`` (inclusive, uniform, fixed by ``seed``) that cut ``total`` bytes.

    Each chunk of length L holds L + 1 bytes: L inputs and the L next bytes as labels. The tail that
    cannot make a chunk of ``min_len`` is dropped.
    """
    generator = torch.Generator().manual_seed(seed)
    lengths, used = [], 0
    while True:
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        if used + length + 1 > total:
            length = total - used - 1
            if length >= min_len:
                lengths.append(length)
            return lengths
        lengths.append(length)
        used += length + 1


class ByteWindows(Dataset):
    """Consecutive, non-overlapping windows of ``seq_len`` inputs and their next-byte labels."""

    def __init__(self, data: torch.Tensor, seq_len: int) -> None:
        self.data = data
        self.seq_len = seq_len

    def __len__(self) -> int:
        return max(0, (len(self.data) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index * self.seq_len
        window = self.data[start : start + self.seq_len + 1].long()
        return {"input_ids": window[:-1], "labels": window[1:]}


class ByteChunks(Dataset):
    """Chunks of the given lengths, one after another: variable-length "documents"."""

    def __init__(self, data: torch.Tensor, lengths: Sequence[int]) -> None:
        self.data = data
        self.lengths = list(lengths)
        self.starts = [0]
        for length in self.lengths[:-1]:
            self.starts.append(self.starts[-1] + length + 1)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self.starts[index]
        chunk = self.data[start : start + self.lengths[index] + 1].long()
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}


def pad_collate(samples: Sequence[dict[str, torch.Tensor]], *, pad_id: int = PAD_ID) -> dict[str, torch.Tensor]:
    """Stacks samples, padding on the right to the longest one in the batch.

    Padded positions get ``pad_id`` as input, -100 as label (ignored by the loss) and 0 in
    ``attention_mask``. Samples of one length are stacked as they are (mask all ones).

    Example:
        >>> batch = pad_collate([{"input_ids": a, "labels": b}, {"input_ids": c, "labels": d}])
        >>> batch["input_ids"].shape   # (2, max(len(a), len(c)))
    """
    inputs = [s["input_ids"] for s in samples]
    longest = max(len(t) for t in inputs)
    batch = len(samples)
    input_ids = torch.full((batch, longest), pad_id, dtype=torch.long)
    labels = torch.full((batch, longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((batch, longest), dtype=torch.long)
    for row, sample in enumerate(samples):
        length = len(sample["input_ids"])
        input_ids[row, :length] = sample["input_ids"]
        labels[row, :length] = sample["labels"]
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


class GPTDataModule(SplitDataModule):
    """Train and validation sets of bytes: the last ``val_fraction`` of the text is for validation.

    Args:
        config: sources, mode, lengths, batch size and workers.
        seed: fixes the chunk lengths in ``varlen`` mode.

    Example:
        >>> data = GPTDataModule(GPTDataConfig(mode="varlen", min_len=16, max_len=64), seed=0)
        >>> data.setup("fit"); batch = next(iter(data.train_dataloader()))
    """

    collate = staticmethod(pad_collate)

    def __init__(self, config: GPTDataConfig, *, seed: int) -> None:
        super().__init__(config)
        self.seed = seed

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        config = self.config
        sources = list(config.sources) or [standard_library_folder()]
        files = find_files(sources, config.pattern)
        data = read_bytes(files, config.max_bytes)
        split = int(len(data) * (1.0 - config.val_fraction))
        train, val = data[:split], data[split:]
        if config.mode == "fixed":
            self.train_set, self.val_set = ByteWindows(train, config.seq_len), ByteWindows(val, config.seq_len)
        else:
            lengths = dict(min_len=config.min_len, max_len=config.max_len)
            self.train_set = ByteChunks(train, chunk_lengths(len(train), seed=self.seed, **lengths))
            self.val_set = ByteChunks(val, chunk_lengths(len(val), seed=self.seed + 1, **lengths))
        if len(self.train_set) == 0 or len(self.val_set) == 0:
            raise ValueError(
                f"{len(data)} bytes make {len(self.train_set)} training and {len(self.val_set)} validation "
                f"samples; raise data.max_bytes, add data.sources or shorten the samples."
            )
        rank_zero_info(
            f"GPT data: {len(data):,} bytes from {len(files)} file(s) under {os.path.commonpath(files)}; "
            f"{len(self.train_set):,} training and {len(self.val_set):,} validation samples ({config.mode})."
        )



__all__ = [
    "Block",
    "ByteChunks",
    "ByteWindows",
    "GPTDataModule",
    "GPTModule",
    "chunk_lengths",
    "find_files",
    "pad_collate",
    "padded_vocab_size",
    "read_bytes",
]
