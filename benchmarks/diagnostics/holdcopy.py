"""Diagnostic (off-protocol, issue 22): what holding a profiled step's inputs in host memory costs.

The region profiler copies the first input of every candidate module to host memory (GPT-2 recipe: 14
copies of 25 MB, ResNet-50's about 0.8 GB), inside a training step, so the loop waits for it; on the
H200 that step took 0.26-0.98 s longer than its neighbours (session 17). This times the copies as the
profiler makes them, into pinned memory (an allocation each, no sync), against pageable memory (one
sync, then plain copies), each twice in one process (pinned blocks come back from torch's host cache the
second time), with a queue of GPU work in front of each so the sync waits as it would in a step.

    python -m benchmarks.diagnostics.holdcopy --copies 14 --mb 25
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _held(sources: list[torch.Tensor], pinned: bool) -> list[torch.Tensor]:
    copies = []
    for value in sources:
        copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="cpu", pin_memory=pinned)
        copy.copy_(value, non_blocking=pinned)
        copies.append(copy)
    return copies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.holdcopy")
    parser.add_argument("--copies", type=int, default=14)
    parser.add_argument("--mb", type=float, default=25.0, help="size of each copy in MB")
    parser.add_argument("--order", default="pinned,pageable,pinned,pageable")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("holdcopy times copies from a GPU: no CUDA device here")
    elements = int(args.mb * 2**20 / 2)
    sources = [torch.randn(elements, device="cuda", dtype=torch.bfloat16) for _ in range(args.copies)]
    work = torch.randn(4096, 4096, device="cuda")
    for kind in args.order.split(","):
        torch.cuda.synchronize()
        for _ in range(20):  # about 10-20 ms of queued GPU work, as a step in flight
            work = work @ work / 4096
        started = time.perf_counter()
        held = _held(sources, pinned=kind == "pinned")
        host_s = time.perf_counter() - started
        torch.cuda.synchronize()
        print(json.dumps({"kind": kind, "copies": args.copies, "mb_each": args.mb, "host_s": round(host_s, 4),
                          "until_done_s": round(time.perf_counter() - started, 4),
                          "equal": all(torch.equal(h, s.cpu()) for h, s in zip(held, sources))}), flush=True)
        del held


if __name__ == "__main__":
    main()
