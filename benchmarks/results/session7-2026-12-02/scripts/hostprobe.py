"""One fresh process: host probes before and after one treatment (is host work slower after it, and which kind?)."""
import json, os, statistics, sys, time
import torch

treatment = sys.argv[1]
dev = torch.device("cuda")
xg = torch.ones(8, device=dev); xc = torch.ones(8)
for _ in range(200): xg = xg + 1
torch.cuda.synchronize()

def py_probe():
    s = time.perf_counter(); a = 0
    for i in range(200_000): a += i * 2
    return (time.perf_counter() - s) * 1e3
def cpu_probe():
    s = time.perf_counter(); x = xc
    for _ in range(5000): x = x + 1
    return (time.perf_counter() - s) * 1e3
def cuda_probe():
    torch.cuda.synchronize(); s = time.perf_counter(); x = xg
    for _ in range(5000): x = x + 1
    t = (time.perf_counter() - s) * 1e3; torch.cuda.synchronize(); return t
def probes():
    out = {}
    for name, f in (("py", py_probe), ("cpu", cpu_probe), ("cuda", cuda_probe)):
        out[name] = statistics.median(sorted(f() for _ in range(7)))
    return out
def cpu_now():
    with open("/proc/thread-self/stat") as f: return int(f.read().rsplit(")", 1)[1].split()[36])

def mlp():
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(6)]).to(dev)
def run_compiled(mode):
    m = mlp(); m.compile(mode=mode); x = torch.randn(64, 256, device=dev)
    for _ in range(30): m(x).sum().backward()
    torch.cuda.synchronize()
def prof30():
    from compile_callback.anatomy import _start_cpu_profiler
    x = torch.ones(8, device=dev)
    for _ in range(30):
        p = _start_cpu_profiler()
        for _ in range(200): x = x + 1
        p.stop(); sum(1 for _ in p.events())
def prof_cuda():
    x = torch.ones(8, device=dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(200): x = x + 1
    sum(1 for _ in p.events())
def sleep():
    time.sleep(15)
T = {"none": lambda: None, "sleep": sleep, "prof30": prof30, "prof_cuda": prof_cuda,
     "inductor": lambda: run_compiled("default"), "ro": lambda: run_compiled("reduce-overhead")}
before = probes(); c0 = cpu_now(); t0 = time.perf_counter()
T[treatment]()
took = time.perf_counter() - t0
after = [probes() for _ in range(3)]
after_m = {k: statistics.median(a[k] for a in after) for k in before}
print(json.dumps({"treatment": treatment, "took_s": round(took, 1), "cpu_before": c0, "cpu_after": cpu_now(),
                  "threads": len(os.listdir("/proc/self/task")),
                  "before_ms": {k: round(v, 3) for k, v in before.items()},
                  "after_ms": {k: round(v, 3) for k, v in after_m.items()},
                  "ratio": {k: round(after_m[k] / before[k], 3) for k in before}}), flush=True)
