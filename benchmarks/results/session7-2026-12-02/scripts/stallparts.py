"""The recipe with host timers around the planner's verification parts: where a trial's stall goes (written to $OUT)."""
import atexit, collections, contextlib, functools, importlib, json, os, sys, time
import torch
import compile_callback.planner as P, compile_callback.verify as V, compile_callback.run as R

tot = collections.defaultdict(float); cnt = collections.Counter(); events = []
def timed(mod, name, key=None):
    f = getattr(mod, name); key = key or f"{mod.__name__.split('.')[-1]}.{name}"
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: tot[key] += time.perf_counter() - t; cnt[key] += 1
    setattr(mod, name, w)
def timed_cm(mod, name):
    f = getattr(mod, name); key = f"{mod.__name__.split('.')[-1]}.{name}"
    @contextlib.contextmanager
    def w(*a, **k):
        t = time.perf_counter(); cm = f(*a, **k); cm.__enter__(); tot[key + ":enter"] += time.perf_counter() - t
        try: yield
        finally:
            t = time.perf_counter(); cm.__exit__(None, None, None); tot[key + ":exit"] += time.perf_counter() - t; cnt[key] += 1
    setattr(mod, name, w)
for n in ("_offload", "_difference", "_run", "_errors"): timed(V, n)
timed_cm(V, "lean_reference"); timed_cm(P, "in_host_memory")
timed(P, "verify_module"); timed(P, "release_device_memory"); timed(P, "compile_region")
orig_bb = P.AutoPlanner.before_batch
def bb(self, i, **k):
    t = time.perf_counter(); r = orig_bb(self, i, **k); d = time.perf_counter() - t
    if d > 0.1: events.append(("planner.before_batch", i, round(d, 2), dict((k2, round(v, 2)) for k2, v in tot.items())))
    return r
P.AutoPlanner.before_batch = bb
orig_ab = R.CompileRun.after_batch
def ab(self, batch, **k):
    t = self._host_start; r = orig_ab(self, batch, **k); d = time.perf_counter() - t
    if d > 0.3: events.append(("batch", self.batch_index - 1, round(d, 2)))
    return r
R.CompileRun.after_batch = ab
@atexit.register
def dump():
    with open(os.path.join(os.environ["OUT"], os.environ.get("TL", "stall") + ".json"), "w") as f:
        json.dump({"totals": tot, "counts": cnt, "events": events}, f, indent=1)
from recipes.__main__ import main
sys.exit(main(sys.argv[1:]))
