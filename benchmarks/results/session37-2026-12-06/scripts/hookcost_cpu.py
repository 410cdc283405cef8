# Session 37 (CPU): each waiting batch's CompileCallback hooks timed in a tiny MLP fit with background_compile=True;
# run from the repository root: .venv/bin/python benchmarks/results/session37-2026-12-06/scripts/hookcost_cpu.py "dict(anatomy=False)"
import time, statistics, sys, collections, os
import torch, torch.nn as nn
import lightning as L
from torch.utils.data import DataLoader, TensorDataset
from compile_callback import CompileCallback

class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    def training_step(self, b, i):
        x, y = b; return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)

HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_train_batch_end")
times = collections.defaultdict(float); labels = []
cb = CompileCallback(background_compile=True, **({} if len(sys.argv) < 2 else eval(sys.argv[1])))
for h in HOOKS:
    f = getattr(cb, h)
    def w(*a, _f=f, _h=h, **k):
        t = time.perf_counter(); r = _f(*a, **k); times[_h] += time.perf_counter() - t
        if _h == "on_train_batch_end":
            labels.append((cb.run.planner._label if cb.run and cb.run.planner else "?", sum(times.values()))); times.clear()
        return r
    setattr(cb, h, w)
ds = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
t = L.Trainer(max_steps=3000, callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
t.fit(M(), DataLoader(ds, batch_size=8, shuffle=True))
by = collections.defaultdict(list)
for lab, s in labels: by[lab].append(s * 1e6)
for lab, v in by.items(): print(lab, len(v), "median us", round(statistics.median(v), 1), "mean", round(statistics.mean(v), 1))
