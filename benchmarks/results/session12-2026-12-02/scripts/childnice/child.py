import os, sys, time
if sys.argv[1] == "nice": os.nice(10)
import torch, torch.nn as nn
torch._inductor.config.fx_graph_cache = False
torch._inductor.config.force_disable_caches = True
layers=[]
for i in range(24): layers += [nn.Linear(256,256), nn.LayerNorm(256), nn.GELU()]
m=nn.Sequential(*layers)
t=time.time(); c=torch.compile(m); c(torch.randn(8,256)).sum().backward(); print("child compile", time.time()-t, flush=True)
