"""Diagnostic (off-protocol, issue 22): where a real model's kept blocks read on the CUDA-graph price's probes.

The planner prices CUDA graphs over a kept plan by the host's time to issue the kept step from an empty launch
queue against the device's step (:func:`compile_callback.payback.graph_saved_share`: 5% of the kept share up to
0.9 of the step, 50% from 1.0 on, linear between). Device-bound GPT-2 blocks read 0.52-0.95 on the H200; the
only host-bound readings (1.55, 1.91) came from tiny fused blocks in ``tests/test_cuda.py``, whose loop work
between steps is a large part of a 2.7 ms step. Where does a real model's host-bound kept step read, and do its
graphs then pay? This runs the recipe's GPT-2 at shrinking batch x sequence shapes (smaller steps, the same
launches), with its blocks called from ``training_step`` (no whole-model candidate, so the blocks are kept in
default mode first and their graphs priced by the probes, as in a short run), under ``CompileCallback()`` until
the plan freezes, over a long planned run (every trial repays, so the probes are taken).

One JSON line per shape: the plan's probes, the price as the planner made it, every decision, and the steps'
own CUDA-event times (this script's timer) in the last default-mode and reduce-overhead trial windows.

    python -m benchmarks.diagnostics.issueprobe --shapes 1x64,2x128,4x256,8x512 > issue.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile

import lightning as L
import torch
import torch.nn.functional as F

from benchmarks.workloads import pool_loader
from compile_callback import CompileCallback
from recipes.config import GPTModelConfig, OptimConfig
from recipes.gpt import IGNORE_INDEX, GPTModule

TRIAL_STEPS = 15  # the callback's trial_steps here, and the window of this script's own times read per decision


class BlocksOnlyGPT(GPTModule):
    """The recipe's GPT with its forward written out in ``training_step``: no call of the LightningModule's
    forward, so the planner has no whole-model candidate and tries the repeated blocks first."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        input_ids, labels = batch["input_ids"], batch["labels"]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class StepTimer(L.Callback):
    """Every training batch's time by CUDA events (start of the batch to its end, the optimizer step in it);
    ends the fit once the callback's plan is frozen."""

    def __init__(self, callback: CompileCallback) -> None:
        self.callback = callback
        self.events: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self.events.append((batch_idx, start, torch.cuda.Event(enable_timing=True)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.events[-1][2].record()
        if self.callback.run is not None and self.callback.run.planner.frozen:
            trainer.should_stop = True

    def times_ms(self) -> dict[int, float]:
        torch.cuda.synchronize()
        return {index: start.elapsed_time(end) for index, start, end in self.events}


def window_ms(times: dict[int, float], decision: dict) -> float | None:
    """The median of this script's own step times over the :data:`TRIAL_STEPS` batches before a decision's
    step (its trial's window; the trial's own settling steps may fall in it)."""
    end = decision.get("step")
    if end is None:
        return None
    window = [times[i] for i in range(end - TRIAL_STEPS, end) if i in times]
    return statistics.median(window) if window else None


def probe(batch: int, seq: int, *, planned: int, layers: int, out: str) -> dict:
    torch.manual_seed(0)
    config = GPTModelConfig(n_layer=layers, n_head=12, n_embd=768, block_size=max(seq, 64), vocab_size=50304,
                            dropout=0.0)
    module = BlocksOnlyGPT(config, OptimConfig())
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(8):
        tokens = torch.randint(50304, (batch, seq + 1), generator=generator)
        batches.append({"input_ids": tokens[:, :-1].contiguous().cuda(), "labels": tokens[:, 1:].contiguous().cuda()})
    loader = pool_loader(batches, planned)
    callback = CompileCallback(trial_steps=TRIAL_STEPS)
    timer = StepTimer(callback)
    trainer = L.Trainer(accelerator="cuda", devices=1, precision="bf16-mixed", max_steps=planned, max_epochs=-1,
                        callbacks=[callback, timer], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=out)
    trainer.fit(module, loader)
    report = callback.last_report
    times = timer.times_ms()
    plan = report["plan"]
    price = plan["graph_trial_price"]
    decisions = [
        {key: d.get(key) for key in ("region", "mode", "kept", "step", "step_ms", "baseline_ms", "speedup",
                                     "compile_seconds", "time_share", "reason")}
        | {"own_window_ms": window_ms(times, d)}
        for d in report["decisions"]
    ]
    return {
        "shape": f"{batch}x{seq}", "layers": layers, "planned": planned, "batches_run": len(times),
        "launch_bound": plan["launch_bound"], "host_issue_ms": plan["host_issue_ms"],
        "host_issue_samples_ms": plan["host_issue_samples_ms"], "graph_trial_price": price,
        "decisions": decisions, "notes": plan["notes"],
        "frozen_own_median_ms": statistics.median(list(times.values())[-5:]) if times else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.issueprobe", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="1x64,4x256", help="batch x sequence, comma-separated (default 1x64,4x256)")
    parser.add_argument("--planned-steps", type=int, default=20000)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args(argv)
    shapes = []
    for item in args.shapes.split(","):
        try:
            batch, seq = (int(part) for part in item.lower().split("x"))
        except ValueError:
            parser.error(f"--shapes: {item!r} is not BATCHxSEQ (e.g. 4x256).")
        if batch < 1 or seq < 1:
            parser.error(f"--shapes: {item!r} needs a batch and a sequence of at least 1.")
        shapes.append((batch, seq))
    if not torch.cuda.is_available():
        parser.error("a CUDA device is needed: the probes time a GPU step.")
    for batch, seq in shapes:
        with tempfile.TemporaryDirectory() as out:
            try:
                line = probe(batch, seq, planned=args.planned_steps, layers=args.layers, out=out)
            except Exception as error:  # one shape's failure should not lose the others'
                line = {"shape": f"{batch}x{seq}", "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(line), flush=True)
        torch.compiler.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
