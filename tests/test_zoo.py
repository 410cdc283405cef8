"""A model zoo: third-party models as their users train them, each compiled whole by Inductor, verified
against eager and counted as dynamo counts.

Each model comes from its library's own code (timm, Hugging Face transformers, PEFT, torchvision), built
from a tiny config (nothing downloaded) with the library's training-time defaults: dropout as the config
sets it, timm's stochastic depth on at ``drop_path_rate=0.1``, ``model.train()``. A LightningModule holds it
as ``self.model`` and its ``training_step`` computes the loss (Hugging Face's from ``labels=``, the
classifiers' by cross-entropy) over a real DataLoader of tiny random data.

The callback prices a compile before trying it, and a short fit cannot repay one: each fit is planned as a
long run and ended a fixed number of steps after the plan froze. Then the whole model must have been tried
and verified (no candidate refused for its numerics), the steps counted must be the steps trained, and the
callback's counts of graphs, graph breaks and recompiles must be dynamo's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import lightning as L
import pytest
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3

# DynamoRecords comes from tests/test_third_party.py, which imports both at its top: without either, this
# whole file is skipped.
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

from compile_callback import CompileCallback  # noqa: E402
from tests.conftest import make_trainer  # noqa: E402
from tests.test_third_party import DynamoRecords, assert_counts_are_dynamos  # noqa: E402

VOCAB = 64
MASK = 3  # BERT's mask token here: the text's own tokens are drawn from 4 up
SEQ = 16
CLASSES = 10
CHARACTERS = 16  # Wav2Vec2's CTC vocabulary, the blank (id 0) among them
SAMPLES = 32  # 8 batches of 4 an epoch; the fit runs as many epochs as the plan needs
BATCH = 4  # BatchNorm over 2 values (ResNet's last stage at 1x1) leaves eager itself 5e-4 off float64
STEPS_AFTER_FROZEN = 3  # steps trained on the frozen plan before the fit is ended


# Data: dict samples for Hugging Face models (the loss from ``labels``), (image, label) pairs for classifiers.


class DictSamples(Dataset):
    def __init__(self, **columns: torch.Tensor) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def images() -> Dataset:
    generator = _generator()
    return TensorDataset(torch.randn(SAMPLES, 3, 32, 32, generator=generator),
                         torch.randint(0, CLASSES, (SAMPLES,), generator=generator))


def causal_text() -> Dataset:
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=_generator())
    return DictSamples(input_ids=ids, labels=ids)  # the model shifts the labels itself


def masked_text() -> Dataset:
    """A quarter of the tokens masked (at least one a sample), the loss on those alone."""
    generator = _generator()
    ids = torch.randint(4, VOCAB, (SAMPLES, SEQ), generator=generator)
    masked = torch.rand(SAMPLES, SEQ, generator=generator) < 0.25
    masked[:, 0] = True
    return DictSamples(input_ids=torch.where(masked, MASK, ids), labels=torch.where(masked, ids, -100))


def text_pairs() -> Dataset:
    generator = _generator()
    return DictSamples(input_ids=torch.randint(4, VOCAB, (SAMPLES, SEQ), generator=generator),
                       labels=torch.randint(4, VOCAB, (SAMPLES, SEQ), generator=generator))


def labelled_pixels() -> Dataset:
    generator = _generator()
    return DictSamples(pixel_values=torch.randn(SAMPLES, 3, 32, 32, generator=generator),
                       labels=torch.randint(0, CLASSES, (SAMPLES,), generator=generator))


def transcribed_audio() -> Dataset:
    """400 samples of audio (39 frames after the tiny feature encoder) and 8 characters each, none the blank."""
    generator = _generator()
    return DictSamples(input_values=torch.randn(SAMPLES, 400, generator=generator),
                       labels=torch.randint(1, CHARACTERS, (SAMPLES, 8), generator=generator))


# Models: tiny configs of the libraries' own code, training-time defaults left as they are.


def timm_model(name: str, **config) -> nn.Module:
    return timm.create_model(name, pretrained=False, num_classes=CLASSES, drop_path_rate=0.1, **config)


def hf_llama() -> nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=SEQ))


def hf_gpt2() -> nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=SEQ, bos_token_id=0, eos_token_id=0))


def hf_bert() -> nn.Module:
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=SEQ))


def hf_bart() -> nn.Module:
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=SEQ))


def hf_vit() -> nn.Module:
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, num_labels=CLASSES))


def hf_wav2vec2() -> nn.Module:
    return transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
        vocab_size=CHARACTERS, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2))


def peft_lora_llama() -> nn.Module:
    peft = pytest.importorskip("peft")
    # PEFT's README settings (LoRA dropout on) on Llama's attention projections, the base model frozen.
    config = peft.LoraConfig(r=8, lora_alpha=32, lora_dropout=0.1, target_modules=["q_proj", "v_proj"],
                             task_type="CAUSAL_LM")
    return peft.get_peft_model(hf_llama(), config)


def torchvision_resnet() -> nn.Module:
    """ResNet-18's code and widths, one block a stage."""
    return torchvision.models.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=CLASSES)


def torchvision_mobilenet_v3() -> nn.Module:
    """MobileNetV3-Small's first three stages (squeeze-excitation, hard-swish) and its head, dropout 0.2."""
    # Each row: in, kernel, expanded, out channels, squeeze-excitation, activation, stride, dilation, width.
    stages = [InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 1.0),
              InvertedResidualConfig(16, 3, 72, 24, False, "RE", 2, 1, 1.0),
              InvertedResidualConfig(24, 5, 96, 40, True, "HS", 2, 1, 1.0)]
    return MobileNetV3(stages, last_channel=64, num_classes=CLASSES)


@dataclasses.dataclass
class Entry:
    build: Callable[[], nn.Module]
    data: Callable[[], Dataset]


ZOO = {
    "timm_vit": Entry(lambda: timm_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32,
                                         num_heads=2), images),
    "timm_convnext": Entry(lambda: timm_model("convnext_atto", depths=(1, 1, 1, 1), dims=(16, 16, 32, 32)), images),
    "timm_efficientnet": Entry(lambda: timm_model("test_efficientnet"), images),
    "hf_llama": Entry(hf_llama, causal_text),
    "hf_gpt2": Entry(hf_gpt2, causal_text),
    "hf_bert": Entry(hf_bert, masked_text),
    "hf_bart": Entry(hf_bart, text_pairs),
    "hf_vit": Entry(hf_vit, labelled_pixels),
    "hf_wav2vec2": Entry(hf_wav2vec2, transcribed_audio),
    "peft_lora_llama": Entry(peft_lora_llama, causal_text),
    "torchvision_resnet": Entry(torchvision_resnet, images),
    "torchvision_mobilenet_v3": Entry(torchvision_mobilenet_v3, images),
}


class Trained(L.LightningModule):
    """``self.model`` and a ``training_step`` that calls it, as most users wrap a library's model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.batches_seen = 0

    def training_step(self, batch, batch_idx):
        self.batches_seen += 1
        if isinstance(batch, dict):
            return self.model(**batch).loss
        pixels, labels = batch
        return nn.functional.cross_entropy(self.model(pixels), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-3)


class StopAfterPlan(L.Callback):
    """Ends a long run ``steps`` steps after the compile plan froze."""

    def __init__(self, callback: CompileCallback, steps: int) -> None:
        self.callback, self.steps = callback, steps
        self.frozen_at: int | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.frozen_at is None and self.callback.run.planner.frozen:
            self.frozen_at = trainer.global_step
        trainer.should_stop = self.frozen_at is not None and trainer.global_step >= self.frozen_at + self.steps


@pytest.mark.parametrize("name", [name for name in ZOO if name.startswith("timm_")])
def test_timm_models_train_with_stochastic_depth_on(name):
    drop_rates = [m.drop_prob for m in ZOO[name].build().modules() if isinstance(m, timm.layers.DropPath)]
    assert drop_rates and 0 < max(drop_rates) <= 0.1 + 1e-6, drop_rates  # timm spreads the rate over the depth


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZOO))
def test_the_whole_model_is_compiled_verified_and_counted_like_dynamo(tmp_path, name):
    torch.manual_seed(0)
    module = Trained(ZOO[name].build())
    data = DataLoader(ZOO[name].data(), batch_size=BATCH)
    callback = CompileCallback(backend="inductor", eager_baseline_steps=2, warmup_steps=1, trial_steps=3,
                               max_trials=1, anatomy=False, background_compile=False)
    stopper = StopAfterPlan(callback, STEPS_AFTER_FROZEN)
    # Planned as a long run, so that the whole model's compile repays; ended by the stopper.
    trainer = make_trainer(tmp_path, [callback, stopper], max_steps=100_000, max_epochs=-1, limit_val_batches=0,
                           logger=False)
    with DynamoRecords() as dynamo:
        trainer.fit(module, data)

    report = callback.last_report
    decisions = report["decisions"]
    assert stopper.frozen_at is not None, (decisions, report["plan"]["notes"])
    assert trainer.global_step == stopper.frozen_at + STEPS_AFTER_FROZEN
    assert trainer.global_step == module.batches_seen == report["summary"]["batches"]
    assert decisions and decisions[0]["region"] == "self.model" and decisions[0]["modules"] == ["model"], (
        decisions, report["plan"]["notes"])
    first = decisions[0]
    assert first["verified"] is True, f"{first['reason']} (error in: {first['error_in']})"
    refused = [(d["region"], d["reason"]) for d in decisions
               if d["verified"] is False or str(d["reason"]).startswith("numerics differ")]
    assert not refused, refused
    assert_counts_are_dynamos(callback, report, dynamo)
