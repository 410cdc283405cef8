"""Diagnostic for the two-GPU DDP run (#10): do the callback's compiled steps train like eager ones?

Runs one recipe (``python benchmarks/diagnostics/ddp_check.py OUT_JSON CONFIG [overrides...]``) with
one more callback that keeps every training step's loss on each rank (on the device, read once at the
end) and, after the fit, a float64 checksum of every parameter on each rank. DDP keeps the ranks'
parameters identical, so the checksums must agree exactly; and a compiled run's loss curve must track
eager's. Rank 0 writes both, with the run's result, to OUT_JSON.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

import lightning as L
import torch

from recipes.config import load_config

recipe_train = importlib.import_module("recipes.train")  # the package's `train` is the function


class LossAndChecksum(L.Callback):
    """With ``CHECK_COMPILE=<mode>`` in the environment and the callback disabled, the reference: the
    LightningModule's forward compiled by plain ``torch.compile(mode=<mode>)`` at setup."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        mode = os.environ.get("CHECK_COMPILE")
        if mode:
            pl_module.forward = torch.compile(pl_module.forward, mode=mode)

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.by_rank: dict[str, Any] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(loss.detach().float().clone())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        with torch.no_grad():
            params = [p.detach().double() for p in pl_module.parameters()]
            checksum = torch.stack([sum(p.sum() for p in params), sum((p * p).sum() for p in params)])
        losses = torch.stack(self.losses) if self.losses else torch.zeros(0, device=pl_module.device)
        sums = trainer.strategy.all_gather(checksum)
        curves = trainer.strategy.all_gather(losses)
        self.by_rank = {
            "checksums": sums.reshape(-1, 2).cpu().tolist(),
            "losses": curves.reshape(trainer.world_size, -1).cpu().tolist(),
        }


def main() -> None:
    out_path, config_path, *overrides = sys.argv[1:]
    probe = LossAndChecksum()
    build_trainer = recipe_train.build_trainer

    def with_probe(config, callback):
        trainer = build_trainer(config, callback)
        trainer.callbacks.append(probe)
        return trainer

    recipe_train.build_trainer = with_probe
    result = recipe_train.train(load_config(config_path, overrides))
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    sums = probe.by_rank["checksums"]
    record = {
        "overrides": overrides,
        "steady_step_ms": result["steady_step_ms"],
        "metrics": result["metrics"],
        "checksums": sums,
        "ranks_identical": all(s == sums[0] for s in sums),
        "losses": probe.by_rank["losses"],
        "report": result["report"],
    }
    with open(out_path, "w") as handle:
        json.dump(record, handle, default=str)
    print(f"checksums per rank: {sums}  identical: {record['ranks_identical']}")


if __name__ == "__main__":
    main()
