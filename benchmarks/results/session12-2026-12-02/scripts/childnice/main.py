import subprocess, sys, time, statistics, torch, torch.nn as nn
torch.set_num_threads(1)
m=nn.Sequential(*[nn.Sequential(nn.Linear(512,512), nn.ReLU()) for _ in range(8)]); opt=torch.optim.SGD(m.parameters(), lr=0.01)
x=torch.randn(64,512)
def step():
    t=time.perf_counter(); m(x).sum().backward(); opt.step(); opt.zero_grad(); return time.perf_counter()-t
def window(n=300): return statistics.median([step() for _ in range(n)])*1e3
for _ in range(100): step()
for mode in sys.argv[1:]:
    base=window()
    p=subprocess.Popen([sys.executable, "/tmp/nice/child.py", mode], stdout=subprocess.PIPE, text=True)
    ts=[]
    while p.poll() is None: ts.append(step())
    out=p.stdout.read().strip()
    print(mode, "eager alone %.2f ms, beside the child %.2f ms (+%.0f%%), %d steps; %s" % (base, statistics.median(ts)*1e3, 100*(statistics.median(ts)*1e3/base-1), len(ts), out), flush=True)
