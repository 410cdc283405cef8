"""Diagnostic (off-protocol, issue 22): the fp32 reference run of verification, its saved activations in
pageable against pinned host memory (:func:`compile_callback.verify.pin_reference` decides in the product).

On the H200 a GPT-2 trial's verification stopped training 22 s, 17 s of it this run with pageable
copies. This times the run alone on one batch of a workload, eager and in fp32 as verification makes it
(:func:`~compile_callback.verify.lean_reference`), in the order pageable, pinned, pinned, pageable, the
pinned host cache given back before each run (each pays its pinned allocation, as a search's first
reference does), and prints one JSON line per run and the device peak of each.

    python -m benchmarks.diagnostics.reference hf_gpt2 > reference.jsonl  (a workload whose module takes (x, y))
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from benchmarks.workloads import make_workload
from compile_callback import verify


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.reference")
    parser.add_argument("workload")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workload = make_workload(args.workload, smoke=device.type == "cpu", device=device)
    module = workload.build_module().to(device)
    batch = next(iter(workload.train_loader(1, False)))
    x_key, y_key = module.inputs
    inputs = (batch[x_key].to(device), batch[y_key].to(device))
    print(json.dumps({"host_available_gb": (verify._host_available_bytes() or 0) / 2**30,
                      "would_pin": device.type == "cuda" and verify.pin_reference(device)}), flush=True)
    for pinned in (False, True, True, False):
        verify.release_host_memory()
        verify.pin_reference = lambda device, pinned=pinned: pinned  # the product's rule, overridden here
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        with torch.autocast(device.type, enabled=False), verify.lean_reference(device):
            count, grads = verify._run(module, inputs, {}, lambda outputs: None)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(json.dumps({"pinned": pinned, "seconds": time.perf_counter() - started, "outputs": count,
                          "grads": len(grads),
                          "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}),
              flush=True)
        del grads


if __name__ == "__main__":
    sys.exit(main())
