"""Shared fixtures: tiny LightningModules, real Trainers, and TensorBoard's own event reader."""

from __future__ import annotations

import atexit
import glob
import os
import time

import lightning as L
import pytest
import torch
import torch._dynamo
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


def _destroy_process_group() -> None:
    """At a spawned rank's exit (``ddp_spawn`` workers import this module to unpickle the test models):
    gloo's worker threads still hold the last collective's tensors, and releasing them during interpreter
    shutdown needs the GIL, which a finalizing interpreter no longer gives: the worker aborts with
    "terminate called without an active exception" (a core dump showed it in ``ProcessGroupGloo::runLoop``).
    Lightning destroys the group at exit only for NCCL; this does it for gloo, while Python still runs."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


atexit.register(_destroy_process_group)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def reset_dynamo():
    """Every test starts with no compiled code, no dynamo counters and default dynamo config."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class Head(nn.Module):
    """A classifier head of our own. (A bare nn.Linear is not enough: some torch versions, 2.11 among
    them, do not trace torch.nn's own modules when compiled on their own, so no graph is made.)"""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class BreakingBlock(Block):
    """A data-dependent Python branch: dynamo must break the graph here."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum() > 0:
            y = y * 0.5
        return torch.relu(y) + x


class TinyModel(L.LightningModule):
    """Repeated blocks, a head and a loss: the shapes every region test needs."""

    def __init__(self, width: int = 16, depth: int = 3, classes: int = 4, block: type[nn.Module] = Block) -> None:
        super().__init__()
        self.embed = Head(8, width)
        self.blocks = nn.ModuleList([block(width) for _ in range(depth)])
        self.head = Head(width, classes)
        self.batches_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.batches_seen += 1
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def classification_data(n: int = 96, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return TensorDataset(x, y)


class VariableBatchDataset(Dataset):
    """Each item is a whole batch whose size cycles through ``sizes`` (batch_size=None loaders)."""

    def __init__(self, sizes: list[int], repeats: int = 1) -> None:
        self.sizes = sizes * repeats
        generator = torch.Generator().manual_seed(0)
        self.items = [(torch.randn(s, 8, generator=generator), torch.randint(0, 4, (s,), generator=generator)) for s in self.sizes]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


def make_trainer(tmp_path, callbacks, **kwargs) -> L.Trainer:
    defaults = dict(
        default_root_dir=str(tmp_path),
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
        callbacks=callbacks,
    )
    defaults.update(kwargs)
    return L.Trainer(**defaults)


def loader(dataset=None, batch_size: int = 8, **kwargs) -> DataLoader:
    return DataLoader(dataset if dataset is not None else classification_data(), batch_size=batch_size, **kwargs)


def read_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """All scalars in the TensorBoard event files under ``log_dir``, read with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)):
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return scalars


def read_text(log_dir: str, tag: str) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    texts = []
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)):
        accumulator = EventAccumulator(path, size_guidance={"tensors": 0})
        accumulator.Reload()
        # SummaryWriter.add_text stores the tag as "<tag>/text_summary".
        for stored in accumulator.Tags().get("tensors", []):
            if stored in (tag, f"{tag}/text_summary"):
                texts.extend(event.tensor_proto.string_val[0].decode() for event in accumulator.Tensors(stored))
    return texts


class TokenModel(L.LightningModule):
    """A per-token model over dict batches {"input_ids", "labels"[, "attention_mask"]}."""

    def __init__(self, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(2)])
        self.head = nn.Linear(width, vocab)
        self.shapes_seen: list[tuple[int, ...]] = []

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten(), ignore_index=-100)

    def training_step(self, batch, batch_idx):
        self.shapes_seen.append(tuple(batch["input_ids"].shape))
        loss = self(batch["input_ids"], batch["labels"])
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self(batch["input_ids"], batch["labels"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class VarLenDataset(Dataset):
    """Token sequences whose lengths cycle through ``lengths`` (dict samples, like a tokenized corpus)."""

    def __init__(self, lengths: list[int], repeats: int = 2, group: int = 4, vocab: int = 32) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = []
        # ``group`` samples of each length in a row: with batch_size=group every batch has one length.
        for length in [length for _ in range(repeats) for length in lengths for _ in range(group)]:
            tokens = torch.randint(1, vocab, (length + 1,), generator=generator)
            self.items.append({"input_ids": tokens[:-1], "labels": tokens[1:]})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


def pad_to_longest(samples):
    """The usual collate for variable-length text: pad to the batch's longest (shapes change per batch)."""
    longest = max(s["input_ids"].shape[0] for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), -100, dtype=torch.long)
    for row, sample in enumerate(samples):
        n = sample["input_ids"].shape[0]
        ids[row, :n] = sample["input_ids"]
        labels[row, :n] = sample["labels"]
    return {"input_ids": ids, "labels": labels}


class FasterCompiled(TinyModel):
    """Eager forwards sleep 100 ms; compiled ones do not: dynamo traces with ``is_compiling()`` true, so
    the graph it makes has no sleep. Compiled with any backend (even "eager") the whole model is faster
    by 100 ms a step (a step takes a few ms without it), a margin no loaded machine crosses: a trial
    surely keeps it. ``eager_forwards`` counts the forwards that ran as Python, not as a compiled graph
    (the count is not traced either)."""

    EAGER_SLEEP_S = 0.1

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.eager_forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            self.eager_forwards += 1
            time.sleep(self.EAGER_SLEEP_S)
        return super().forward(x)


class _CurrentStderr:
    """A stream that writes to whatever ``sys.stderr`` is at the moment (capsys replaces it per phase)."""

    def write(self, text: str) -> int:
        import sys

        return sys.stderr.write(text)

    def flush(self) -> None:
        import sys

        sys.stderr.flush()


@pytest.fixture
def lightning_stderr(capsys):
    """What Lightning's logger prints (``rank_zero_info``: the report table) lands in ``capsys``'s
    stderr. Lightning gives its logger a stream handler at import, on the ``sys.stderr`` of that moment
    (under pytest, a capture closed since); meanwhile it writes to the test's ``sys.stderr``."""
    import logging

    logger = logging.getLogger("lightning.pytorch")
    handlers = [h for h in logger.handlers if type(h) is logging.StreamHandler]
    added = None if handlers else logging.StreamHandler(_CurrentStderr())
    if added is not None:  # the root logger had handlers at import: Lightning's messages propagate there
        logger.addHandler(added)
    previous = [h.stream for h in handlers]
    for handler in handlers:
        handler.stream = _CurrentStderr()  # not setStream(): it flushes the old stream, which may be closed
    try:
        yield capsys
    finally:
        for handler, stream in zip(handlers, previous):
            handler.stream = stream
        if added is not None:
            logger.removeHandler(added)


def read_layout(log_dir: str) -> list[dict[str, dict[str, list[str]]]]:
    """Every custom-scalars layout in the event files under ``log_dir`` (TensorBoard's reader and its own
    layout proto), each as ``{category: {chart: [tags]}}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    layouts = []
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)):
        accumulator = EventAccumulator(path, size_guidance={"tensors": 0})
        accumulator.Reload()
        if metadata.CONFIG_SUMMARY_TAG not in accumulator.Tags().get("tensors", []):
            continue
        for event in accumulator.Tensors(metadata.CONFIG_SUMMARY_TAG):
            layout = layout_pb2.Layout()
            layout.ParseFromString(event.tensor_proto.string_val[0])
            layouts.append({category.title: {chart.title: list(chart.multiline.tag) for chart in category.chart}
                            for category in layout.category})
    return layouts


class RecordLosses(L.Callback):
    """Every training batch's loss, as a float (a host sync per step: for tests that compare runs)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def seeded_fit(tmp_path, callbacks, model: L.LightningModule, *, seed: int, max_epochs: int, **trainer_kwargs):
    """Fits ``model`` (built after seeding: pass a class) on the unshuffled classification loader;
    returns ``(losses, model, trainer)``, so runs with and without a callback compare step by step."""
    L.seed_everything(seed)
    model = model()
    record = RecordLosses()
    trainer = make_trainer(tmp_path, callbacks + [record], max_epochs=max_epochs, **trainer_kwargs)
    trainer.fit(model, loader(batch_size=8, shuffle=False))
    return record.losses, model, trainer


# A long planned run: the planner prices every trial against the batches the Trainer plans (a short run's
# could not repay an Inductor compile, and its candidates are skipped); StopWhenPlanned ends it early.
PLANNED = dict(max_steps=100_000, max_epochs=-1, limit_val_batches=0)


class StopWhenPlanned(L.Callback):
    """Ends a long planned run ``after`` batches once the plan is frozen, as early stopping or a time limit
    would: the planner prices its trials against the planned batches, the test need not run them."""

    def __init__(self, callback, after: int = 0) -> None:
        self.callback, self.after = callback, after

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.callback.run is not None and self.callback.run.planner.frozen:
            self.after -= 1
            trainer.should_stop = self.after < 0
