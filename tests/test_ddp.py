"""Under Lightning DDP (2 CPU processes, gloo) every rank takes the same decisions."""

import json
import math
import os

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch._dynamo import register_backend  # the documented way to add a custom backend

from compile_callback import CompileCallback, reprice, torch_internals
from compile_callback.report import render_markdown
from tests.conftest import TinyModel, loader, make_trainer


def _wrong_on_rank_one(gm, example_inputs):
    """Compiled code that is wrong on rank 1 only: without agreement the ranks would decide apart.

    (Slowness on one rank would not do: DDP's all-reduce makes every rank wait for the slowest.)
    """

    def run(*args):
        outputs = gm.forward(*args)
        if dist.is_initialized() and dist.get_rank() == 1:
            return type(outputs)(o * 1.5 if isinstance(o, torch.Tensor) else o for o in outputs)
        return outputs

    return run


register_backend(compiler_fn=_wrong_on_rank_one, name="test_wrong_on_rank_one")


def reason_kind(reason: str) -> str:
    """"numerics differ from eager: 1.2e-1 ..." -> "numerics differ from eager"; measured numbers differ by rank."""
    return reason.split(":")[0] if ":" in reason else "faster" if "faster than" in reason else reason


class RecordPlan(Callback):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_fit_end(self, trainer, pl_module):
        compile_callback = next(c for c in trainer.callbacks if isinstance(c, CompileCallback))
        record = {
            # region, kept, and the kind of reason ("numerics differ from eager", "not faster", ...)
            "decisions": [(d.region, d.kept, reason_kind(d.reason)) for d in compile_callback.run.planner.decisions],
            "compiled": sorted(n for n, m in pl_module.named_modules() if torch_internals.is_module_compiled(m)),
            "head_weight_sum": float(pl_module.head.linear.weight.sum()),
        }
        with open(f"{self.directory}/rank{trainer.global_rank}.json", "w") as handle:
            json.dump(record, handle)


@pytest.mark.slow
def test_ranks_agree_on_every_decision(tmp_path):
    callback = CompileCallback(
        backend="test_wrong_on_rank_one", eager_baseline_steps=3, warmup_steps=1, trial_steps=3, max_trials=2
    )
    trainer = make_trainer(
        tmp_path, [callback, RecordPlan(str(tmp_path))], accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=3
    )
    trainer.fit(TinyModel(), loader(batch_size=4))
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0["decisions"] and rank0["decisions"] == rank1["decisions"]
    # Wrong on rank 1 is wrong: every region that was checked is rejected on both ranks, none compiled.
    checked = [kind for _, _, kind in rank0["decisions"] if not kind.startswith("skipped")]
    assert checked and all(kind == "numerics differ from eager" for kind in checked), rank0["decisions"]
    assert rank0["compiled"] == rank1["compiled"] == []
    # the whole model is a candidate under DDP too (its rerouted training_step runs eagerly)
    assert any(region == "model" for region, _, _ in rank0["decisions"]), rank0["decisions"]
    assert rank0["head_weight_sum"] == pytest.approx(rank1["head_weight_sum"])


def parameter_checksum(module) -> list[float]:
    """The float64 sum and sum of squares of every parameter: equal on every rank of a DDP run."""
    with torch.no_grad():
        values = [p.detach().double() for p in module.parameters()]
        return [float(sum(v.sum() for v in values)), float(sum((v * v).sum() for v in values))]


class RecordParameters(Callback):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_fit_end(self, trainer, pl_module):
        os.makedirs(self.directory, exist_ok=True)
        with open(f"{self.directory}/parameters{trainer.global_rank}.json", "w") as handle:
            json.dump(parameter_checksum(pl_module), handle)


class RecordReport(Callback):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_fit_end(self, trainer, pl_module):
        compile_callback = next(c for c in trainer.callbacks if isinstance(c, CompileCallback))
        report = compile_callback.last_report
        record = {"ranks": report["ranks"], "summary": report["summary"], "notes": report["plan"]["notes"],
                  "graph_break_reasons": report["graph_break_reasons"], "churn_actions": report["churn_actions"],
                  "parameters": parameter_checksum(pl_module),
                  "compiled": torch_internals.is_module_compiled(pl_module), "batches_seen": pl_module.batches_seen}
        if trainer.global_rank == 0:
            with open(f"{self.directory}/report.md", "w") as handle:
                handle.write(render_markdown(report))
        with open(f"{self.directory}/report{trainer.global_rank}.json", "w") as handle:
            json.dump(record, handle)


class FirstRepricingAfter(Callback):
    """Brings the first re-pricing round forward, in the rank's own process (ddp_spawn imports the package
    afresh there): listed before the CompileCallback, whose ``setup`` makes the run's Repricer."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def setup(self, trainer, pl_module, stage):
        reprice.FIRST_AFTER = self.batches


class MoreCyclesOnRankOne(Callback):
    """Rank 1's own arithmetic asks a re-pricing round for one cycle more than rank 0's, in the rank's own
    process: counts that differ by rank, as timings that differ by rank can give (this one more than the
    batches left hold, which ``round_cycles`` itself would cap). Rank 0's count must be every rank's, or the
    ranks' rounds end apart and a collective is left unjoined (the DDP timeout then fails the fit instead
    of hanging it)."""

    def setup(self, trainer, pl_module, stage):
        from compile_callback import run

        self.original = original = run.round_cycles
        run.round_cycles = lambda *args, **kwargs: original(*args, **kwargs) + trainer.global_rank

    def teardown(self, trainer, pl_module, stage):
        from compile_callback import run

        run.round_cycles = self.original


@pytest.mark.slow
def test_report_counts_every_rank_and_explains_ddp_graph_splits(tmp_path):
    """Every rank's counts are gathered into the report; DDPOptimizer's split of the graph at DDP's
    gradient buckets (1 MiB buckets, the smallest it takes, and 1 MiB blocks: a bucket a block) is
    told apart from graph breaks. And the whole model compiles under DDP without tracing the rerouted
    step: Lightning's DDP calls training_step through the LightningModule's forward (a patched
    ``forward``); a compiled root runs that call eagerly and compiles only the model's own forward
    inside it: one graph, no graph break from ``self.log``, no recompile per step. And a re-pricing round
    runs on both ranks at the same batches, under DDP's all-reduce, with rank 0's cycle count where rank 1's
    own would differ, and rank 0's ratio is both ranks'."""
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy

    callback = CompileCallback("model", backend="aot_eager", report=True, eager_baseline_steps=2, warmup_steps=1)
    # A collective one rank never joins fails the fit after 300 s instead of hanging it for gloo's 30 minutes.
    strategy = DDPStrategy(start_method="spawn", bucket_cap_mb=1, timeout=timedelta(seconds=300))
    trainer = make_trainer(
        tmp_path, [FirstRepricingAfter(0), MoreCyclesOnRankOne(), callback, RecordReport(str(tmp_path))],
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=3,
    )
    torch.manual_seed(0)
    trainer.fit(TinyModel(width=512), loader(batch_size=4))
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    # The compiled pieces' gradients are all-reduced like eager ones: the ranks hold the same weights,
    # and the same as an eager DDP run's.
    assert reports[0]["parameters"] == reports[1]["parameters"]
    torch.manual_seed(0)
    eager = make_trainer(tmp_path / "eager", [RecordParameters(str(tmp_path / "eager"))], accelerator="cpu", devices=2,
                         strategy=DDPStrategy(start_method="spawn", bucket_cap_mb=1), max_epochs=3)
    eager.fit(TinyModel(width=512), loader(batch_size=4))
    expected = json.loads((tmp_path / "eager" / "parameters0.json").read_text())
    assert reports[0]["parameters"] == pytest.approx(expected, rel=1e-6, abs=1e-6 * math.sqrt(expected[1]))
    for report in reports:
        assert report["compiled"] and report["summary"]["eager_fallbacks"] == 0, report["summary"]
        assert report["batches_seen"] == 3 * 96 // 2 // 4  # each rank: 3 epochs of its 48 samples
    # One round (32 batches from the plan's freeze at batch 3 of 36), the same on both ranks: rank 0's timings price both.
    assert [r["summary"]["speedup_priced"] for r in reports] == ["re-measured"] * 2, reports[0]["summary"]
    assert [r["summary"]["speedup_priced_cycles"] for r in reports] == [2, 2]  # rank 0's two, not rank 1's three
    assert reports[0]["summary"]["speedup"] == reports[1]["summary"]["speedup"]
    ranks = reports[0]["ranks"]
    assert reports[1]["ranks"] == ranks and [r["rank"] for r in ranks] == [0, 1]
    for row in ranks:
        # dynamo records each piece as a graph break; they are counted apart
        assert row["graphs"] == 1 and row["graph_breaks"] == 0 and row["recompiles"] == 0, row
        assert row["ddp_pieces"] >= 3, row  # the three 1 MiB blocks, each in a bucket of its own
    assert reports[0]["graph_break_reasons"] == []
    summary = reports[0]["summary"]
    assert summary["graph_breaks"] == 0 and summary["ddp_pieces"] == ranks[0]["ddp_pieces"]
    note = next(n for n in reports[0]["notes"] if n.startswith("DDP: dynamo's DDPOptimizer split"))
    assert f"the 1 captured graph(s) into {summary['ddp_pieces']} compiled pieces" in note
    assert "not graph breaks" in note
    markdown = (tmp_path / "report.md").read_text()
    assert "### Ranks" in markdown and f"| 1 | 1 | 0 | 0 | 0 | {summary['ddp_pieces']} |" in markdown
    assert f"- {note}" in markdown


def test_one_process_reports_no_ranks_and_no_ddp_note(tmp_path):
    callback = CompileCallback("model", backend="aot_eager", report=False)
    make_trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(), loader(batch_size=4))
    report = callback.last_report
    assert report["ranks"] is None
    assert report["summary"]["ddp_pieces"] == 0 and report["summary"]["graphs"] == 1
    assert not any(note.startswith("DDP:") for note in report["plan"]["notes"])


class RankAlternatingBatches(torch.utils.data.Dataset):
    """Whole batches: rank 1's alternate 4 and 6 samples in the order that rank loads them, rank 0's are
    always 4, however the indices are shared out."""

    def __init__(self) -> None:
        self.loaded = 0

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int):
        self.loaded += 1
        size = 6 if dist.get_rank() == 1 and self.loaded % 2 == 0 else 4
        generator = torch.Generator().manual_seed(index)
        return torch.randn(size, 8, generator=generator), torch.randint(0, 4, (size,), generator=generator)


class RankShapedBatches(torch.utils.data.Dataset):
    """Whole batches whose size depends on the rank that loads them: rank 1's alternate 4 and 6
    samples, rank 0's are always 4. Only rank 1 sees its shapes change."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int):
        size = 6 if dist.get_rank() == 1 and index % 2 else 4
        generator = torch.Generator().manual_seed(index)
        return torch.randn(size, 8, generator=generator), torch.randint(0, 4, (size,), generator=generator)


def _churning_fit(tmp_path, policy: str):
    """Only rank 1 sees churn (its batch size changes every step)."""
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy

    callback = CompileCallback("model", backend="eager", dynamic=False, on_recompile=policy, max_recompiles_per_epoch=0,
                               eager_baseline_steps=0, warmup_steps=0)
    # A hang (one rank acting alone) fails in a minute instead of gloo's default half hour.
    strategy = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=60))
    data = torch.utils.data.DataLoader(RankShapedBatches(), batch_size=None)
    trainer = make_trainer(
        tmp_path, [callback, RecordPlan(str(tmp_path)), RecordReport(str(tmp_path))], accelerator="cpu", devices=2,
        strategy=strategy, max_epochs=2,
    )
    trainer.fit(TinyModel(), data)


@pytest.mark.slow
def test_churn_on_one_rank_raises_with_the_cause(tmp_path):
    # That every rank takes the action is the within-epoch test below (the same agreement); under ddp_spawn the
    # first rank to raise ends the others, so a hang would not show here.
    with pytest.raises(Exception, match="RecompileChurnError") as raised:
        _churning_fit(tmp_path, "raise")
    assert "recompiles" in str(raised.value) and "Fix:" in str(raised.value)


@pytest.mark.slow
def test_churn_on_one_rank_is_agreed_within_the_epoch_reverts_everywhere_and_is_reported_per_rank(tmp_path):
    """One DDP fit (one fit for three checks: each costs ~15 s of 2 cores). Rank 1's batches alternate
    4 and 6 samples, rank 0's are always 4; one epoch of 16 batches a rank, agreed every 4 batches:
    - rank 1's churn reverts the region on both ranks, at the same agreement point, inside the epoch
      (the epoch-end agreement is `test_churn_on_one_rank_raises_with_the_cause`'s);
    - the gathered counts show rank 1 recompiled and rank 0 did not, and the report says so;
    - the ranks trained on together (equal weights)."""
    from lightning.pytorch.strategies import DDPStrategy

    callback = CompileCallback("model", backend="eager", dynamic=False, on_recompile="eager", max_recompiles_per_epoch=0,
                               eager_baseline_steps=0, warmup_steps=0, log_every_n_steps=4)
    data = torch.utils.data.DataLoader(RankAlternatingBatches(), batch_size=None)
    trainer = make_trainer(
        tmp_path, [callback, RecordReport(str(tmp_path)), RecordPlan(str(tmp_path))], accelerator="cpu", devices=2,
        strategy=DDPStrategy(start_method="spawn"), max_epochs=1,
    )
    trainer.fit(TinyModel(), data)
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    plans = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    # Each rank took the action itself, the same one at the same batch, before the epoch's 16th batch.
    actions = [[(a["region"], a["policy"], a["action"], a["batch"]) for a in report["churn_actions"]] for report in reports]
    assert actions[0] and actions[0] == actions[1], actions
    assert all(batch < 16 and batch % 4 == 0 for *_, batch in actions[0]), actions  # at an agreement point
    assert [region for region, *_ in actions[0]] == ["model"]
    for plan in plans:  # reverted on both ranks though only rank 1 churned
        assert plan["compiled"] == [] and plan["decisions"] == [["model", False, "reverted to eager by on_recompile='eager'"]], plan
    recompiles = [row["recompiles"] for row in reports[0]["ranks"]]
    assert recompiles[0] == 0 and recompiles[1] >= 1, reports[0]["ranks"]
    note = next(n for n in reports[0]["notes"] if n.startswith("the ranks compiled differently"))
    assert f"recompiles: rank 0 {recompiles[0]}, rank 1 {recompiles[1]}" in note
    assert reports[0]["parameters"] == reports[1]["parameters"]  # the ranks trained on together
    assert plans[0]["head_weight_sum"] == pytest.approx(plans[1]["head_weight_sum"])


class RecordBackground(Callback):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_fit_end(self, trainer, pl_module):
        compile_callback = next(c for c in trainer.callbacks if isinstance(c, CompileCallback))
        planner = compile_callback.run.planner
        record = {"decisions": [(d.region, d.kept, d.background) for d in planner.decisions],
                  "children_started": planner.children_started, "parameters": parameter_checksum(pl_module),
                  "global_step": trainer.global_step, "ranks": compile_callback.last_report["ranks"],
                  "markdown": render_markdown(compile_callback.last_report)}
        with open(f"{self.directory}/background{trainer.global_rank}.json", "w") as handle:
            json.dump(record, handle)


@pytest.mark.slow
def test_under_ddp_rank_zeros_child_prepares_the_compile_for_every_rank(tmp_path):
    from tests.conftest import FasterCompiled

    steps = 600  # 100 ms eager batches: a minute for the child on a loaded 2-core machine; compiled, they take ms
    callback = CompileCallback(backend="eager", background_compile=True, eager_baseline_steps=2, warmup_steps=1,
                               trial_steps=4, max_trials=1)
    trainer = make_trainer(tmp_path, [callback, RecordBackground(str(tmp_path))], accelerator="cpu", devices=2,
                           strategy="ddp_spawn", max_steps=steps, max_epochs=100, limit_val_batches=0)
    trainer.fit(FasterCompiled(), loader(batch_size=8))
    rank0, rank1 = (json.loads((tmp_path / f"background{rank}.json").read_text()) for rank in (0, 1))
    # CPU processes share a device, so one cache key: one child, rank 0's (ranks on distinct GPUs each start
    # their own, the inputs' device being in Inductor's key); its outcome is every rank's: the same
    # decision, kept on both.
    assert (rank0["children_started"], rank1["children_started"]) == (1, 0)
    assert rank0["decisions"] == rank1["decisions"] and len(rank0["decisions"]) == 1
    region, kept, background = rank0["decisions"][0]
    assert region == "model" and kept, rank0["decisions"]
    assert background.startswith("prepared in the background: the child compiled and checked it in"), background
    assert rank0["global_step"] == rank1["global_step"] == steps  # no batch lost while the ranks waited
    assert rank0["parameters"] == pytest.approx(rank1["parameters"])  # the ranks trained as one
    # Each rank's own compile of it, said per rank: here no cache at all (the "eager" backend keeps none; on
    # GPUs "warm" where rank 0's cache served the rank, "cold" where its key differed).
    assert [row["background_caches"] for row in rank0["ranks"]] == [{"model": None}, {"model": None}]
    assert "compiled after rank 0's background child (cache) |" in rank0["markdown"]
    assert "| 1 | 1 | 0 | 0 | 0 | 0 | `model` no cache |" in rank0["markdown"], rank0["markdown"]
