"""A fit under Lightning's ModelParallelStrategy (FSDP2 ``fully_shard`` in ``configure_model``) on 2 CPU
processes (gloo), with a CompileCallback; each rank writes what it decided to ``<out>/rank<N>.json``.

Run as a script (the strategy relaunches the command for its second process, so it cannot run inside
pytest's own process): ``python tests/fsdp2_fit.py <out>``. Used by tests/test_sharded.py.
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from compile_callback import CompileCallback, torch_internals  # noqa: E402
from tests.conftest import TinyModel, loader  # noqa: E402


class Sharded(TinyModel):
    """TinyModel sharded the torchtitan way: each block, then the root."""

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)


def main(out: str) -> None:
    torch.set_num_threads(1)
    callback = CompileCallback(backend="eager", eager_baseline_steps=4, warmup_steps=1, trial_steps=4, max_trials=3,
                               min_speedup=1.0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                        max_steps=48, max_epochs=20, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, logger=False, callbacks=[callback], default_root_dir=out)
    model = Sharded()
    trainer.fit(model, loader(batch_size=8))
    report = callback.last_report
    record = {
        # The reason's words, not its figures: each rank times its own steps (rank 0's verdict is everyone's).
        "decisions": [(d["region"], d["kept"], d["verified"], re.sub(r"\d+(\.\d+)?", "#", d["reason"].split(":")[0]))
                      for d in report["decisions"]],
        "notes": report["plan"]["notes"],
        "compiled": sorted(n for n, m in model.named_modules() if torch_internals.is_module_compiled(m)),
        "sharded": type(model.head.linear.weight).__name__,
        "keys": sorted(model.state_dict()),
        "plain_keys": sorted(TinyModel().state_dict()),
        "summary": {k: report["summary"][k] for k in ("graphs", "graph_breaks", "recompiles", "eager_fallbacks")},
    }
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main(sys.argv[1])
