"""The recipe with an independent CUDA-event timer of every training batch (start to next start), written to $OUT."""
import json, os, sys
import lightning as L, torch
import importlib; rt = importlib.import_module("recipes.train")

class Timeline(L.Callback):
    def __init__(self): self.ev = []
    def on_train_batch_start(self, trainer, m, batch, i):
        if torch.cuda.is_available():
            e = torch.cuda.Event(enable_timing=True); e.record()
        else:
            import time; e = time.perf_counter()
        self.ev.append((trainer.global_step, e))
    def on_train_end(self, trainer, m):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        el = (lambda a, b: a.elapsed_time(b)) if torch.cuda.is_available() else (lambda a, b: (b - a) * 1e3)
        ms = [(s, el(a, b)) for (s, a), (_, b) in zip(self.ev, self.ev[1:])]
        with open(os.path.join(os.environ["OUT"], os.environ.get("TL", "timeline") + ".json"), "w") as f:
            json.dump(ms, f)

orig = rt.build_trainer
def build_trainer(config, callback):
    trainer = orig(config, callback); trainer.callbacks.append(Timeline()); return trainer
rt.build_trainer = build_trainer
from recipes.__main__ import main
sys.exit(main(sys.argv[1:]))
