"""Third-party models the way users train them: a tiny Hugging Face GPT-2 and Llama and a tiny timm ViT,
built from config objects (nothing downloaded), each held as ``self.model`` by a LightningModule whose
``forward(x, y)`` returns the loss, trained by a real Trainer under ``CompileCallback``.

The counts are checked against dynamo's own records, read here directly over the same fit:
``counters["stats"]["unique_graphs"]`` (graphs), ``graph_break_reasons`` (every graph break, one per
frame dynamo cuts), ``counters["graph_break"]`` (the breaks at a call, the only kind it counts there)
and ``guard_failures`` (one per recompile).
"""

from __future__ import annotations

import itertools
import json
import os

import lightning as L
import pytest
import timm
import torch
import torch._dynamo.utils as dynamo_utils
import transformers
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from compile_callback import CompileCallback
from compile_callback.regions import MODEL
from compile_callback.verify import REENTRANT_CHECKPOINT_FIX, verify_module
from compile_callback.padding import PaddingPlan, census_from_dataset
from compile_callback.profile import RegionProfiler
from compile_callback.watch import AT_CALL, NO_RESUME_POINT
from tests.conftest import make_trainer

VOCAB = 64
SEQ = 16


def tiny_gpt2() -> nn.Module:
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32)
    )


def tiny_gpt2_named_loss() -> nn.Module:
    """GPT-2 with its loss named. HF picks a model's loss from its class name, which names none for
    GPT2LMHeadModel (LlamaForCausalLM's does), and its ``loss_function`` property warns each call
    until one is named: a graph break in every frame it runs under. Named, no break: a quicker compile."""
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"
    return model


def tiny_llama() -> nn.Module:
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    )


def tiny_vit(depth: int = 2) -> nn.Module:
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=depth,
                             embed_dim=32, num_heads=2, num_classes=10)


MODELS = {"gpt2": tiny_gpt2, "gpt2_named_loss": tiny_gpt2_named_loss, "llama": tiny_llama, "vit": tiny_vit}


class CausalLM(L.LightningModule):
    """The usual wrapper of a Hugging Face language model: ``self.model``, the loss from ``forward``."""

    def __init__(self, name: str = "gpt2") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = MODELS[name]()

    def forward(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids=x, labels=y, attention_mask=mask).loss

    def training_step(self, batch, batch_idx):
        if isinstance(batch, dict):  # tokenized samples, padded by a collate
            return self(batch["input_ids"], batch["labels"], batch.get("attention_mask"))
        x, y = batch
        return self(x, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ImageClassifier(L.LightningModule):
    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = tiny_vit(depth)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.model(x), y)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self(x, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class DirectCausalLM(CausalLM):
    """The other usual wrapper: ``training_step`` calls ``self.model`` itself, the LightningModule has no forward."""

    forward = L.LightningModule.forward

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.model(input_ids=x, labels=y).loss


class DirectImageClassifier(ImageClassifier):
    forward = L.LightningModule.forward

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)


def token_loader(samples: int, batch_size: int = 2) -> DataLoader:
    ids = torch.randint(0, VOCAB, (samples, SEQ), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(ids, ids), batch_size=batch_size)  # HF shifts the labels itself


def image_loader(samples: int, batch_size: int = 2) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(samples, 3, 32, 32, generator=generator)
    return DataLoader(TensorDataset(images, torch.randint(0, 10, (samples,), generator=generator)), batch_size=batch_size)


def module_and_loader(name: str, samples: int):
    if name.startswith("vit"):
        return ImageClassifier(depth=1 if name == "vit_one_block" else 2), image_loader(samples)
    return CausalLM(name), token_loader(samples)


def direct_module_and_loader(name: str, samples: int):
    if name == "vit":
        return DirectImageClassifier(), image_loader(samples)
    return DirectCausalLM(name), token_loader(samples)


class DynamoRecords:
    """Dynamo's own records over a block, read without the package."""

    def __enter__(self) -> DynamoRecords:
        self.graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        self.breaks = len(dynamo_utils.graph_break_reasons)
        self.counted_breaks = sum(dynamo_utils.counters["graph_break"].values())
        self.guard_failures = sum(len(reasons) for reasons in dynamo_utils.guard_failures.values())
        return self

    def __exit__(self, *exc) -> None:
        self.graphs = dynamo_utils.counters["stats"]["unique_graphs"] - self.graphs
        self.breaks = len(dynamo_utils.graph_break_reasons) - self.breaks
        self.counted_breaks = sum(dynamo_utils.counters["graph_break"].values()) - self.counted_breaks
        self.guard_failures = sum(len(r) for r in dynamo_utils.guard_failures.values()) - self.guard_failures


def assert_counts_are_dynamos(callback: CompileCallback, report: dict, dynamo: DynamoRecords) -> None:
    summary, metrics = report["summary"], callback.run.metrics()
    assert summary["graphs"] == metrics["compile/graphs"] == dynamo.graphs > 0
    assert summary["graph_breaks"] == metrics["compile/graph_breaks"] == dynamo.breaks
    assert summary["recompiles"] == metrics["compile/recompiles"] == dynamo.guard_failures
    # counters["graph_break"] holds the breaks at a call; the report names every other break as such.
    assert callback.run.watch.totals()["graph_breaks_in_dynamo_counter"] == dynamo.counted_breaks
    by_kind = sum((region["graph_break_kinds"].get(AT_CALL, 0) for region in report["regions"].values()))
    assert by_kind == dynamo.counted_breaks
    uncounted = sum(item["count"] for item in report["graph_break_reasons"]
                    if "not counters['graph_break']" in item["reason"])
    assert uncounted == dynamo.breaks - dynamo.counted_breaks


def fit_with_one_trial(tmp_path, module: L.LightningModule, data: DataLoader, backend: str = "eager"):
    """24 steps under the auto plan (one trial), dynamo's own records kept beside the callback's."""
    callback = CompileCallback(backend=backend, eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=1,
                               anatomy=False)
    trainer = make_trainer(tmp_path, [callback], max_steps=24, logger=False)
    with DynamoRecords() as dynamo:
        trainer.fit(module, data)
    return trainer, callback, dynamo


@pytest.mark.parametrize("name", ["gpt2", "llama", "vit", "vit_one_block"])
def test_auto_plan_tries_the_whole_model_and_counts_like_dynamo(tmp_path, name):
    """``self.model`` does not hide the whole model: the auto plan decides on it first. (A ``self.model``
    with no repeated blocks, the one-block ViT, is a candidate of its own, and its name once took the
    root's: the whole model went untried.)"""
    trainer, callback, dynamo = fit_with_one_trial(tmp_path, *module_and_loader(name, samples=2 * 24))
    assert trainer.global_step == 24 and callback.last_report["summary"]["batches"] == 24
    with open(os.path.join(tmp_path, "compile_report.json")) as handle:
        report = json.load(handle)
    decisions = report["decisions"]
    assert decisions and decisions[0]["region"] == MODEL, (decisions, report["plan"]["notes"])
    assert decisions[0]["speedup"] is not None and decisions[0]["max_rel_error"] is not None  # timed, verified
    assert not any("whole model not tried" in note for note in report["plan"]["notes"])
    assert callback.last_report["decisions"] == decisions
    assert_counts_are_dynamos(callback, report, dynamo)
    if name == "gpt2":
        # HF's loss_function property warns that GPT2LMHeadModel names no loss_type (Llama's class name
        # picks its loss): dynamo cuts every frame the warning runs under, at a call in most
        # (counters["graph_break"]) but at the read of the property in the model's forward, which it
        # cannot resume after (counters["unimplemented"]): the report must tell the two apart.
        assert dynamo.breaks > dynamo.counted_breaks > 0
        kinds = report["regions"][MODEL]["graph_break_kinds"]
        assert kinds[NO_RESUME_POINT] == dynamo.breaks - dynamo.counted_breaks, kinds
        reasons = [item["reason"] for item in report["graph_break_reasons"]]
        assert any("logging.Logger" in reason and "loss_function" in reason for reason in reasons), reasons


@pytest.mark.parametrize("name", ["gpt2", "vit"])
def test_where_training_step_calls_self_model_itself_self_model_is_tried_as_the_whole_model(tmp_path, name):
    """No LightningModule forward: ``self.model``, which holds the step (and its repeated blocks), is the whole
    model's candidate, tried first (before: only its blocks were candidates, and HF GPT-2's failed verification)."""
    trainer, callback, dynamo = fit_with_one_trial(tmp_path, *direct_module_and_loader(name, samples=2 * 24))
    report = callback.last_report
    decisions, notes = report["decisions"], report["plan"]["notes"]
    assert decisions and decisions[0]["region"] == "self.model" and decisions[0]["modules"] == ["model"], (decisions, notes)
    assert decisions[0]["speedup"] is not None and decisions[0]["max_rel_error"] is not None  # timed, verified
    assert any(n.startswith("training_step does not call the LightningModule's forward: `self.model`") for n in notes), notes
    assert trainer.global_step == 24 and report["summary"]["batches"] == 24
    assert_counts_are_dynamos(callback, report, dynamo)


def test_hf_gradient_checkpointing_with_dropout_on_is_compiled_and_verified(tmp_path):
    """``gradient_checkpointing_enable()`` (Hugging Face's default: non-reentrant ``torch.utils.checkpoint``
    around each block), GPT-2's dropout on: the whole model is tried and verified against eager to float
    rounding, as AOTAutograd (Inductor's front end) saves dropout's masks for the backward and eager's
    recompute replays them. (Dynamo's plain ``"eager"`` backend, which runs the checkpointed blocks without
    AOTAutograd, got gradients 0.76 off eager's here: verification refused it, as it should.)"""
    module, data = module_and_loader("gpt2", samples=2 * 24)
    module.model.gradient_checkpointing_enable()
    assert module.model.is_gradient_checkpointing and any(m.p > 0 for m in module.modules() if isinstance(m, nn.Dropout))
    trainer, callback, dynamo = fit_with_one_trial(tmp_path, module, data, backend="aot_eager")
    decision = callback.last_report["decisions"][0]
    assert decision["region"] == MODEL and decision["speedup"] is not None, decision
    assert decision["max_rel_error"] is not None and decision["max_rel_error"] <= 1e-6, decision
    assert trainer.global_step == 24
    assert_counts_are_dynamos(callback, callback.last_report, dynamo)


def test_hf_reentrant_gradient_checkpointing_is_not_verified_and_the_fix_is_named(tmp_path):
    """Reentrant checkpointing refuses ``torch.autograd.grad``, which verification takes its gradients with: the
    whole model is not trusted, and the decision says why and how to checkpoint instead."""
    module, data = module_and_loader("gpt2", samples=2 * 24)
    module.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    trainer, callback, _ = fit_with_one_trial(tmp_path, module, data)
    decision = callback.last_report["decisions"][0]
    assert decision["region"] == MODEL and not decision["kept"], decision
    assert "not verified" in decision["reason"] and REENTRANT_CHECKPOINT_FIX in decision["reason"], decision
    assert trainer.global_step == 24


def test_resume_keeps_plain_state_dict_keys(tmp_path):
    first = CompileCallback(MODEL, backend="eager", eager_baseline_steps=2, warmup_steps=1, anatomy=False)
    # Saved during training, at step 6 of 12, while the model runs compiled (since batch 3).
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=6, save_last=True)
    trainer = make_trainer(tmp_path, [first, checkpoint], max_steps=6, logger=False, enable_checkpointing=True)
    trainer.fit(CausalLM("gpt2_named_loss"), token_loader(samples=24))
    path = str(tmp_path / "ckpt" / "last.ckpt")
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    assert set(state) == set(CausalLM("gpt2_named_loss").state_dict())
    # The checkpoint loads into a plain Hugging Face model, key for key.
    plain = tiny_gpt2_named_loss()
    plain.load_state_dict({key.removeprefix("model."): value for key, value in state.items()}, strict=True)

    graphs_before = first.last_report["summary"]["graphs"]

    torch._dynamo.reset()  # as in a new process: the resumed fit compiles again
    second = CompileCallback(MODEL, backend="eager", eager_baseline_steps=2, warmup_steps=1, anatomy=False)
    resumed = CausalLM("gpt2_named_loss")
    trainer = make_trainer(tmp_path, [second], max_steps=10, logger=False)
    with DynamoRecords() as dynamo:
        trainer.fit(resumed, token_loader(samples=24), ckpt_path=path)
    report = second.last_report
    assert trainer.global_step == 10 and report["summary"]["batches"] == 10
    assert [d["region"] for d in report["decisions"] if d["kept"]] == [MODEL]
    assert set(resumed.state_dict()) == set(state)
    # The counts go on from the checkpoint's: what the first fit compiled, and the resumed fit's compile.
    assert dynamo.graphs > 0
    assert report["summary"]["graphs"] == graphs_before + dynamo.graphs


class VariableLengthText(Dataset):
    """Tokenized samples of a few lengths: dict samples, as a tokenizer gives them."""

    def __init__(self, lengths: list[int], repeats: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = []
        for length in lengths * repeats:
            ids = torch.randint(1, VOCAB, (length,), generator=generator)
            self.items.append({"input_ids": ids, "labels": ids.clone()})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


class PaddedCausalLM(CausalLM):
    """Loaders from the LightningModule, so that the padding applies from the first batch."""

    def __init__(self) -> None:
        super().__init__("gpt2_named_loss")
        self.shapes_seen: list[tuple[int, ...]] = []
        self.masked = []  # whether each batch came with the attention mask the padding makes

    def training_step(self, batch, batch_idx):
        self.shapes_seen.append(tuple(batch["input_ids"].shape))
        self.masked.append("attention_mask" in batch)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(VariableLengthText([5, 9, 14, 20], repeats=3), batch_size=2)


def test_pad_auto_buckets_hf_token_batches(tmp_path):
    callback = CompileCallback(MODEL, backend="eager", eager_baseline_steps=0, warmup_steps=0, pad="auto",
                               pad_max_buckets=2, pad_multiple=8, anatomy=False)
    module = PaddedCausalLM()
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, logger=False)
    with DynamoRecords() as dynamo:
        trainer.fit(module)
    report = callback.last_report
    assert trainer.global_step == 12
    edges = report["padding"]["edges"]
    assert 1 <= len(edges) <= 2 and all(edge % 8 == 0 for edge in edges)
    assert {shape[1] for shape in module.shapes_seen} <= set(edges) and all(module.masked)
    assert 0 < report["summary"]["padding_waste"] < 0.5
    assert all(r["epoch"] == 0 for r in report["recompiles"])  # the buckets' graphs are made in epoch 0
    assert dynamo.guard_failures > 0  # the second bucket recompiles: a count to compare
    assert_counts_are_dynamos(callback, report, dynamo)


def tiny_tokenizer(tmp_path, pad_token: str) -> transformers.PreTrainedTokenizerBase:
    """A real Hugging Face tokenizer from a vocabulary file, its pad token set as GPT-2/Llama users set it (not id 0)."""
    vocab = ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]"] + [f"w{i}" for i in range(VOCAB - 5)]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(vocab))
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(path))
    tokenizer.pad_token = pad_token
    return tokenizer


def test_padding_before_a_hf_language_modeling_collator_pads_with_its_tokenizers_pad_id(tmp_path):
    """``DataCollatorForLanguageModeling(mlm=False)`` builds labels from the ids and masks only its tokenizer's pad
    id: the padding put before it must pad with that id, or the loss trains on padding (found with a pad id of 3)."""
    tokenizer = tiny_tokenizer(tmp_path, "[SEP]")
    assert tokenizer.pad_token_id not in (None, 0)
    plan = PaddingPlan([16])
    plan.target, plan.edges = "sequence", [16]
    collate = plan.collate(transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False), batch_size=2)
    samples = [{"input_ids": torch.arange(5, 5 + n)} for n in (5, 9)]
    batch = collate(samples)
    assert batch["input_ids"].shape == (2, 16)
    assert (batch["labels"] != -100).sum(dim=1).tolist() == [5, 9]  # only the real tokens are targets
    assert batch["attention_mask"].sum(dim=1).tolist() == [5, 9]


def test_bert_samples_with_token_type_ids_are_padded_alike(tmp_path):
    """``token_type_ids`` are padded with the ids (with 0s): left as they were, the batch's tensors differ in
    length and collating them fails the fit at its first batch. Rows of lists of ints (a ``datasets`` row before
    ``set_format("torch")``) are padded as tensors are."""
    tokenizer = tiny_tokenizer(tmp_path, "[PAD]")
    rows = [dict(tokenizer(text)) for text in ("w1 w2", "w3 w4 w5 w6 w7")]  # lists of ints, as `datasets` rows
    assert {"input_ids", "token_type_ids", "attention_mask"} <= set(rows[0]) and isinstance(rows[0]["input_ids"], list)
    tensors = [{k: torch.tensor(v) for k, v in row.items()} for row in rows]  # after set_format("torch")
    plan = PaddingPlan([8])
    plan.target, plan.edges = "sequence", [8]
    assert census_from_dataset(rows)[0].sizes() == census_from_dataset(tensors)[0].sizes() == [4, 7]
    for inner, samples in itertools.product((None, transformers.DataCollatorWithPadding(tokenizer)), (rows, tensors)):
        batch = plan.collate(inner, batch_size=2)(samples)
        assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (2, 8)
        assert batch["token_type_ids"].sum() == 0 and batch["input_ids"][0, 4:].tolist() == [tokenizer.pad_token_id] * 4


def test_hf_blocks_recompiling_on_the_kv_cache_are_told_to_turn_the_cache_off(tmp_path):
    """HF GPT-2 builds its key/value cache in training too (use_cache defaults to True): compiled blocks guard on
    each layer's cache entry, a graph per layer (past 8 layers, dynamo's limit sends the rest to eager). The fix
    named is the cache's, not a generic one."""
    callback = CompileCallback(["model.transformer.h.*"], backend="eager", eager_baseline_steps=0, warmup_steps=0,
                               max_recompiles_per_epoch=0, anatomy=False)
    trainer = make_trainer(tmp_path, [callback], max_steps=4, logger=False)
    trainer.fit(DirectCausalLM(), token_loader(8))
    report = callback.last_report
    churn = [n for n in report["plan"]["notes"] if "recompiles:" in n]
    assert churn and all("cache_utils.py" in n and "model.config.use_cache = False" in n for n in churn), report["plan"]["notes"]


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_hf_block_held_with_its_kv_cache_is_not_verified_and_the_cache_fix_is_named(use_cache):
    """With ``use_cache`` on (GPT-2's default, in training too) each block is passed the step's ``DynamicCache``.
    The held input holds it by reference and the live step fills it, so its eager replay fails ("backward
    through the graph a second time"): not trusted, and the reason names the cache and how to turn it off.
    With the cache off the same block, held the same way, verifies."""
    model = tiny_gpt2()
    model.config.use_cache = use_cache
    block = model.transformer.h[1]
    profiler = RegionProfiler({"h.1": block}, torch.device("cpu"))
    profiler.attach()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()  # the live step: fills the cache, frees its graph
    profiler.detach()
    args, kwargs = profiler.held_input("h.1")
    block.compile(backend="eager")
    result = verify_module(block, args, kwargs)
    if use_cache:
        assert not result.passed and result.where == "verification", result
        assert "DynamicCache" in result.error and "model.config.use_cache = False" in result.error, result.error
    else:
        assert result.passed, result


def test_the_whole_model_named_where_training_step_does_not_call_forward_is_said_so(tmp_path):
    callback = CompileCallback("model", backend="eager", eager_baseline_steps=0, warmup_steps=0, anatomy=False)
    trainer = make_trainer(tmp_path, [callback], max_steps=4, logger=False)
    trainer.fit(DirectCausalLM(), token_loader(8))
    report = callback.last_report
    assert report["summary"]["graphs"] == 0
    assert report["summary"]["speedup"] == 1.0 and report["summary"]["speedup_priced"] == "nothing compiled"
    assert any("training_step does not call forward" in s and "regions=['self.model']" in s
               for s in report["suggestions"]), report["suggestions"]


class PaddedImages(DirectImageClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.shapes_seen: list[tuple[int, ...]] = []

    def training_step(self, batch, batch_idx):
        self.shapes_seen.append(tuple(batch[0].shape))
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return image_loader(7, batch_size=2)  # a short last batch of one


def test_pad_takes_timm_image_and_label_pairs_and_fills_the_short_last_batch(tmp_path):
    callback = CompileCallback(["self.model"], backend="eager", eager_baseline_steps=0, warmup_steps=0, pad="auto",
                               pad_short_batch="pad", anatomy=False)
    module = PaddedImages()
    make_trainer(tmp_path, [callback], max_epochs=2, logger=False).fit(module)
    report = callback.last_report
    assert report["padding"]["edges"] == [32] and not any("padding not applied" in n for n in report["plan"]["notes"])
    assert set(module.shapes_seen) == {(2, 3, 32, 32)} and len(module.shapes_seen) == 8
    assert not [r for r in report["recompiles"] if r["stage"] == "train"], report["recompiles"]
