"""Training thread CPU per step: eager (no callback) vs CompileCallback waiting on a child that sleeps."""
import os, sys, time, resource, statistics, subprocess, tempfile
import torch, torch.nn as nn
import lightning as L
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
from compile_callback import CompileCallback, background

def sleeper(arguments, stdin=subprocess.DEVNULL, *, write_bytecode=False):
    handle, log = tempfile.mkstemp(prefix="compile-callback-", suffix=".log"); os.close(handle)
    return subprocess.Popen(["sleep", "1000"], stdin=stdin), log
background._spawn = sleeper

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                                 nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    def forward(self, x): return self.net(x)
    def training_step(self, b, i):
        x, y = b; return nn.functional.cross_entropy(self(x), y)
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)

FROM, TO = 200, int(sys.argv[1]) if len(sys.argv) > 1 else 1500
class Meter(L.Callback):
    def on_train_batch_start(self, trainer, *a):
        if trainer.global_step == FROM:
            self.t0, self.u0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
    def on_train_batch_end(self, trainer, *a):
        if trainer.global_step == TO:
            u = resource.getrusage(resource.RUSAGE_THREAD)
            self.wall = time.perf_counter() - self.t0
            self.cpu = u.ru_utime + u.ru_stime - self.u0.ru_utime - self.u0.ru_stime
            self.invol = u.ru_nivcsw - self.u0.ru_nivcsw

ds = TensorDataset(torch.randn(4096, 3, 16, 16), torch.randint(0, 10, (4096,)))
def fit(with_callback):
    meter = Meter(); cbs = [meter]
    cb = None
    if with_callback:
        cb = CompileCallback(backend="eager", background_compile=True, anatomy=False); cbs.append(cb)
    t = L.Trainer(max_steps=TO, callbacks=cbs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, max_epochs=-1)
    t.fit(M(), DataLoader(ds, batch_size=8, shuffle=True))
    waiting = cb is not None and cb.run is not None and cb.last_report is not None and any("compiling in the background" in n for n in cb.last_report["plan"]["notes"])
    return meter.wall, meter.cpu, meter.invol, waiting

order = ["eager", "callback", "callback", "eager"] * 4
res = {"eager": [], "callback": []}
for name in order:
    wall, cpu, invol, waiting = fit(name == "callback")
    res[name].append((wall, cpu))
    print(name, f"wall {wall:.3f} cpu {cpu:.3f} invol {invol} waiting {waiting}", flush=True)
for name, v in res.items():
    print(name, "median wall", round(statistics.median(w for w, _ in v), 3), "median cpu", round(statistics.median(c for _, c in v), 3))
