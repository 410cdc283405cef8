"""The documented options of CompileCallback, each in a real fit, seen from outside: what reaches
torch.compile, what verification lets through, what is printed and written, what shapes training_step gets."""

import glob
import json
import os

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch._dynamo import register_backend  # the documented way to add a custom backend
from torch.utils.data import DataLoader, Dataset

from compile_callback import CompileCallback, torch_internals
from tests.conftest import (
    FasterCompiled,
    Head,
    TinyModel,
    TokenModel,
    VarLenDataset,
    loader,
    make_trainer,
    pad_to_longest,
    read_scalars,
    read_text,
)

RECEIVED: list[dict] = []  # what torch.compile handed the recording backend, one entry per graph


def _recording(gm, example_inputs, **kwargs):
    RECEIVED.append(kwargs)
    return gm.forward


def _perturbed(gm, example_inputs):
    """Compiled code 1% off: every floating output (and so every gradient) scaled by 1.01."""

    def run(*args):
        outputs = gm.forward(*args)
        scale = lambda o: o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o  # noqa: E731
        return type(outputs)(scale(o) for o in outputs) if isinstance(outputs, (tuple, list)) else scale(outputs)

    return run


for _name, _fn in [("test_options_recording", _recording), ("test_options_perturbed", _perturbed)]:
    try:
        register_backend(compiler_fn=_fn, name=_name)
    except Exception:
        pass  # registered already in this process


def auto(**kwargs) -> CompileCallback:
    defaults = dict(eager_baseline_steps=3, warmup_steps=1, trial_steps=3, log_every_n_steps=4)
    defaults.update(kwargs)
    return CompileCallback(**defaults)


# -- what reaches torch.compile ------------------------------------------------------------------------


def test_options_reach_the_backend(tmp_path):
    RECEIVED.clear()
    callback = CompileCallback("model", backend="test_options_recording", options={"answer": 42, "nested": {"a": 1}},
                               eager_baseline_steps=2, warmup_steps=1)
    make_trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(), loader())
    assert RECEIVED and all(kwargs == {"options": {"answer": 42, "nested": {"a": 1}}} for kwargs in RECEIVED), RECEIVED


def test_no_options_pass_none():
    RECEIVED.clear()
    model = TinyModel()
    CompileCallback("model", backend="test_options_recording")  # constructing changes nothing
    model.compile(backend="test_options_recording")
    model(torch.randn(2, 8))
    assert RECEIVED == [{}]  # the control: torch.compile passes options only when there are some


def test_an_unknown_inductor_option_fails_before_training(tmp_path):
    model = TinyModel()
    trainer = make_trainer(tmp_path, [CompileCallback(["head"], options={"no_such_option": 1}, eager_baseline_steps=2)])
    with pytest.raises(ValueError, match=r"`options`.*no_such_option"):
        trainer.fit(model, loader())
    assert model.batches_seen == 0


# -- verification -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tolerance", [None, 1e-3])
def test_a_tolerance_tighter_than_the_error_reverts_for_numerics(tmp_path, tolerance):
    callback = auto(backend="test_options_perturbed", max_trials=1, verify_tolerance=tolerance)
    model = TinyModel()
    make_trainer(tmp_path, [callback], max_epochs=2).fit(model, loader())
    (decision,) = callback.last_report["decisions"]
    assert decision["region"] == "model" and not decision["kept"]
    assert decision["reason"].startswith("numerics differ from eager: output: RMSE against the reference"), decision
    assert "PyTorch's accuracy rule" in decision["reason"], decision
    assert decision["reason"].endswith("max relative error 1.00e-02, tol 1e-03")  # None: fp32's own, 1e-3
    assert not torch_internals.is_module_compiled(model)


def test_verify_tolerance_decides_which_error_passes(tmp_path):
    """The same 1% error passes a 5% tolerance; the region (much faster compiled) is kept, and its
    verified error is reported and logged."""
    callback = auto(backend="test_options_perturbed", max_trials=1, verify_tolerance=0.05)
    model = FasterCompiled()
    trainer = make_trainer(tmp_path, [callback], logger=TensorBoardLogger(str(tmp_path), name="tb"), max_epochs=2)
    trainer.fit(model, loader())
    (decision,) = callback.last_report["decisions"]
    assert decision["kept"] and "faster" in decision["reason"], decision
    assert decision["max_rel_error"] == pytest.approx(0.01, rel=1e-3)
    assert torch_internals.is_module_compiled(model)
    logged = read_scalars(trainer.logger.log_dir)["compile/max_rel_error"]
    assert logged[-1] == (trainer.global_step, pytest.approx(0.01, rel=1e-3))


@pytest.mark.slow
def test_a_real_inductor_compile_past_a_tighter_tolerance_is_judged_by_the_float64_reference(tmp_path):
    """Inductor's fused kernels sum in another order than eager: about 1e-7 apart in fp32, within the
    default 1e-3, beyond a 1e-12 tolerance. Past it, the float64 reference decides (with a floor of 1e-13
    the rule is a bare ratio of the two runs' errors), and the decision says so."""
    from tests.conftest import PLANNED, StopWhenPlanned

    callback = auto(backend="inductor", max_trials=1, verify_tolerance=1e-12, anatomy=False, background_compile=False)
    make_trainer(tmp_path, [callback, StopWhenPlanned(callback)], **PLANNED).fit(TinyModel(), loader())
    decision = callback.last_report["decisions"][0]
    assert decision["verified"] is not None and 1e-12 < decision["max_rel_error"] < 1e-3, decision
    assert "PyTorch's accuracy rule" in decision["error_in"] and "a float64 reference" in decision["error_in"], decision


def test_verify_false_trusts_the_compiled_region_unchecked(tmp_path):
    """The 1% error that verification rejects (test above) is not looked for: the region is tried and
    kept, with no verified error."""
    callback = auto(backend="test_options_perturbed", max_trials=1, verify=False)
    model = FasterCompiled()
    make_trainer(tmp_path, [callback], max_epochs=2).fit(model, loader())
    (decision,) = callback.last_report["decisions"]
    assert decision["kept"] and "faster" in decision["reason"], decision
    assert decision["max_rel_error"] is None
    assert torch_internals.is_module_compiled(model)
    assert "compile/max_rel_error" not in callback.run.metrics()


# -- trials --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_trials", [0, 1, 2])
def test_max_trials_stops_the_trials(tmp_path, max_trials):
    """Every candidate fails verification here (1% off), so each trial is decided without timing; the
    model has more candidates (model, blocks.*, and its hot children) than any of these limits."""
    from tests.conftest import PLANNED, StopWhenPlanned

    callback = auto(backend="test_options_perturbed", max_trials=max_trials)
    make_trainer(tmp_path, [callback, StopWhenPlanned(callback)], **PLANNED).fit(TinyModel(), loader())
    report = callback.last_report
    tried = [d["region"] for d in report["decisions"] if not d["reason"].startswith("skipped")]
    # The whole model goes first; the next candidate is the hottest by the profile, which on a busy CPU
    # may be the blocks or the embedding (microseconds apart): which one is not what is tested here.
    assert len(tried) == max_trials and tried[:1] == ["model"][:max_trials], report["decisions"]
    assert len(set(tried)) == len(tried), tried
    assert f"stopped after max_trials={max_trials}" in report["plan"]["notes"]


# -- the report -----------------------------------------------------------------------------------------


def test_the_report_table_is_printed_at_the_end_of_fit(tmp_path, lightning_stderr):
    callback = CompileCallback(["head"], backend="eager", eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    trainer.fit(TinyModel(), loader())
    printed = lightning_stderr.readouterr().err
    path = os.path.join(trainer.logger.log_dir, "compile_report.json")
    lines = printed[printed.index("compile report"):].splitlines()
    summary = callback.last_report["summary"]
    assert lines[1].startswith("  speedup ") and f"graphs {summary['graphs']}  " in lines[1], lines[1]
    assert lines[2].split() == ["region", "mode", "kept", "speedup", "compile", "s", "cache", "max", "err", "reason"]
    assert set(lines[3].strip()) == {"-"}
    row = lines[4]  # the one decision
    assert row.split()[:3] == ["head", "default", "yes"] and row.endswith("named in regions="), row
    assert lines[5].split() == ["region", "graphs", "breaks", "recomp", "compile", "s", "fallback"]
    assert lines[6].split()[:4] == ["head", str(summary["graphs"]), "0", "0"], lines[6]  # dynamo's counts for it
    assert f"written to {path}" in printed
    assert printed.count("compile report") == 1  # once, at the end of fit
    with open(path) as handle:
        assert json.load(handle)["decisions"] == callback.last_report["decisions"]


def test_report_false_writes_and_prints_nothing(tmp_path, lightning_stderr):
    callback = CompileCallback(["head"], backend="eager", eager_baseline_steps=2, warmup_steps=1, report=False)
    trainer = make_trainer(tmp_path, [callback], logger=TensorBoardLogger(str(tmp_path), name="tb"), max_epochs=2)
    trainer.fit(TinyModel(), loader())
    printed = lightning_stderr.readouterr()
    assert "compile report" not in printed.err and "compile report" not in printed.out
    assert glob.glob(str(tmp_path / "**" / "compile_report.json"), recursive=True) == []
    assert read_text(trainer.logger.log_dir, "compile/report") == []  # no Markdown report, at epoch ends or after
    assert "compile/graphs" in read_scalars(trainer.logger.log_dir)  # the scalars are still logged
    assert callback.last_report["summary"]["batches"] == 24  # and the report is still built, for code to read


# -- padding through the callback --------------------------------------------------------------------------

LENGTHS = [5, 9, 14, 20, 27, 31]  # VarLenDataset: 4 samples of each length in a row, twice: 48 samples


class TokenModelWithLoader(TokenModel):
    """Loaders from the module's hook, so the callback pads from the first batch; records every batch."""

    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.batches: list[dict[str, torch.Tensor]] = []

    def train_dataloader(self):
        return DataLoader(VarLenDataset(LENGTHS), batch_size=self.batch_size, collate_fn=pad_to_longest)

    def training_step(self, batch, batch_idx):
        self.batches.append({key: value.clone() for key, value in batch.items()})
        return super().training_step(batch, batch_idx)


def padding(**kwargs) -> CompileCallback:
    defaults = dict(backend="eager", dynamic=False, eager_baseline_steps=0, warmup_steps=0, max_recompiles_per_epoch=100)
    defaults.update(kwargs)
    return CompileCallback(["blocks.*"], **defaults)


def expected_lengths(batch_size: int) -> list[int]:
    """Each batch's longest sample, in loader order (no shuffling)."""
    lengths = [length for _ in range(2) for length in LENGTHS for _ in range(4)]
    return [max(lengths[i:i + batch_size]) for i in range(0, len(lengths), batch_size)]


@pytest.mark.parametrize(("pad", "bucket"), [
    ("max", lambda n: 32),  # one size: the longest (31), up to pad_multiple=8
    ([16, 40], lambda n: 16 if n <= 16 else 40),  # the edges given
])
def test_sequences_are_padded_to_the_buckets_from_the_first_batch(tmp_path, pad, bucket):
    model = TokenModelWithLoader()
    callback = padding(pad=pad)
    make_trainer(tmp_path, [callback], max_epochs=1).fit(model)
    assert callback.last_report["padding"]["edges"] == ([32] if pad == "max" else [16, 40])
    assert model.shapes_seen == [(4, bucket(n)) for n in expected_lengths(4)]
    for batch, n in zip(model.batches, expected_lengths(4)):  # tokens kept, padding masked out of the loss
        assert (batch["labels"][:, n:] == -100).all() and (batch["labels"][:, :n] != -100).any()


@pytest.mark.parametrize("short_batch", ["keep", "pad"])
def test_pad_short_batch_pad_fills_the_last_batch(tmp_path, short_batch):
    """48 samples in batches of 5: nine full batches and one of 3, kept short or filled with 2 masked samples."""
    model = TokenModelWithLoader(batch_size=5)
    make_trainer(tmp_path, [padding(pad="max", pad_short_batch=short_batch)], max_epochs=1).fit(model)
    assert model.shapes_seen[:-1] == [(5, 32)] * 9
    last = model.batches[-1]
    if short_batch == "keep":
        assert model.shapes_seen[-1] == (3, 32)
    else:
        assert model.shapes_seen[-1] == (5, 32)
        assert (last["labels"][3:] == -100).all()  # the fillers count for nothing in the loss
        assert (last["labels"][:3] != -100).any(dim=1).all()  # the 3 real samples are all there


IMAGE_SIZES = [(10, 12), (16, 9), (20, 20), (7, 30), (12, 12), (30, 7)]  # (H, W), two samples a batch


class ImageDataset(Dataset):
    def __len__(self) -> int:
        return len(IMAGE_SIZES) * 2

    def __getitem__(self, index: int):
        height, width = IMAGE_SIZES[index // 2]
        generator = torch.Generator().manual_seed(index)
        return {"pixel_values": torch.rand(3, height, width, generator=generator) + 0.5, "label": index % 3}


class ImageModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = Head(8, 3)
        self.batches: list[torch.Tensor] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(images)).mean(dim=(2, 3)))

    def training_step(self, batch, batch_idx):
        self.batches.append(batch["pixel_values"].clone())
        return nn.functional.cross_entropy(self(batch["pixel_values"]), batch["label"])

    def train_dataloader(self):
        return DataLoader(ImageDataset(), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pytest.mark.parametrize(("pad", "edges"), [([16, 32], [16, 32]), ("max", [32])])
def test_images_are_padded_at_the_bottom_right_to_the_buckets(tmp_path, pad, edges):
    model = ImageModel()
    callback = CompileCallback("model", backend="eager", dynamic=False, eager_baseline_steps=0, warmup_steps=0,
                               max_recompiles_per_epoch=100, pad=pad)
    make_trainer(tmp_path, [callback], max_epochs=1).fit(model)
    assert callback.last_report["padding"]["edges"] == edges
    assert callback.last_report["padding"]["target"] == "image"

    def bucket(side: int) -> int:
        return next(edge for edge in edges if edge >= side)

    assert [tuple(b.shape) for b in model.batches] == [(2, 3, bucket(h), bucket(w)) for h, w in IMAGE_SIZES]
    for index, (images, (height, width)) in enumerate(zip(model.batches, IMAGE_SIZES)):
        for row in range(2):
            original = ImageDataset()[2 * index + row]["pixel_values"]
            assert torch.equal(images[row, :, :height, :width], original)  # the image at the top left
        assert (images[:, :, height:, :] == 0).all() and (images[:, :, :, width:] == 0).all()  # zeros elsewhere


# -- errors a user can make ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(options=["max_autotune"]), r"`options` must be a dict of inductor options or None; got \['max_autotune'\]"),
    (dict(regions=["auto"]), r"`regions` can be 'auto' or a list of names, not a list containing 'auto'"),
    (dict(trial_steps=0), r"`trial_steps` must be an integer >= 1; got 0"),
    (dict(max_trials=-1), r"`max_trials` must be an integer >= 0; got -1"),
    (dict(min_speedup=0.9), r"`min_speedup` must be a number >= 1.0; got 0.9"),
    (dict(verify="yes"), r"`verify` must be True or False; got 'yes'"),
    (dict(report=1), r"`report` must be True or False; got 1"),
    (dict(anatomy="yes"), r"`anatomy` must be True, False or None \(on CPU only\); got .yes."),
    (dict(verify_tolerance=-1e-3), r"`verify_tolerance` must be a number >= 0.0; got -0.001"),
    (dict(verify_tolerance="loose"), r"`verify_tolerance` must be a number >= 0.0; got 'loose'"),
    (dict(pad_multiple=0), r"`pad_multiple` must be an integer >= 1; got 0"),
    (dict(cache_dir=""), r"`cache_dir` must be a directory path or None; got ''"),
])
def test_bad_option_values_are_refused_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileCallback(**kwargs)


def test_a_cache_dir_that_cannot_be_made_fails_before_training(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    model = TinyModel()
    trainer = make_trainer(tmp_path, [auto(backend="eager", cache_dir=str(tmp_path / "a_file" / "cache"))])
    with pytest.raises(ValueError, match=r"`cache_dir` '.*a_file/cache' cannot be created: .*Give a writable directory"):
        trainer.fit(model, loader())
    assert model.batches_seen == 0


def test_the_anatomy_samples_on_cpu_by_default_and_on_cuda_only_when_asked():
    from compile_callback.run import anatomy_sampled

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert anatomy_sampled(None, cpu) and not anatomy_sampled(None, cuda)
    assert anatomy_sampled(True, cuda) and not anatomy_sampled(False, cpu)


def test_the_state_key_names_regions_and_backend_and_is_built_once():
    # Lightning reads state_key around every hook call (6 a batch): built once, and still telling two
    # callbacks of different regions or backends apart in a checkpoint.
    named, auto, eager = CompileCallback("model"), CompileCallback(), CompileCallback("model", backend="eager")
    assert len({named.state_key, auto.state_key, eager.state_key}) == 3
    assert named.state_key is named.state_key
