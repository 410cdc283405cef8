"""Diagnostic (off-protocol, issue 20): which tensors of a workload's step the compiled model gets furthest
from eager, and how far eager and compiled each are from an fp32 reference.

The callback's verification reports its worst tensor only; this prints every tensor's errors, worst
first, for the LightningModule compiled whole (the callback's ``model`` region) on one batch of the
workload, under its precision (bf16 autocast on CUDA): compiled against eager, eager against an fp32
eager reference and compiled against the same, each with the reference's norm and whether it was
judged against its kind's scale (:class:`compile_callback.verify.TensorError`). Then the callback's own
verdict on the same module and batch.

    python -m benchmarks.diagnostics.numerics hf_bert_mlm --top 15 > numerics.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

import torch

from compile_callback import torch_internals
from compile_callback.verify import _errors, verify_module
from benchmarks.workloads import make_workload


def _step(module: torch.nn.Module, args: tuple[Any, ...], *, autocast: bool, device: torch.device
          ) -> list[torch.Tensor]:
    """The loss and every parameter's gradient of one forward and backward, seeded alike each time."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    cast = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with cast:
        loss = module(*args)
    loss.backward()
    return [loss.detach().float().reshape(1)] + [p.grad.detach().clone() for p in module.parameters() if p.grad is not None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.numerics")
    parser.add_argument("workload")
    parser.add_argument("--top", type=int, default=15, help="tensors printed, worst first")
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args(argv)
    smoke = not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    workload = make_workload(args.workload, smoke=smoke, device=device)
    module = workload.build_module().to(device)
    batch = next(iter(workload.train_loader(1, False)))
    x_key, y_key = module.inputs
    inputs = (batch[x_key].to(device), batch[y_key].to(device))

    with torch_internals.fallback_random():  # dropout draws like eager's in compiled code too
        eager = _step(module, inputs, autocast=not smoke, device=device)
        names = ["output"] + [f"grad of {n}" for n, p in module.named_parameters() if p.grad is not None]
        reference = _step(module, inputs, autocast=False, device=device)
        module.compile(backend=args.backend)
        compiled = _step(module, inputs, autocast=not smoke, device=device)
    comparisons = {
        "compiled_vs_eager": _errors(names, compiled, eager, device),
        "eager_vs_fp32": _errors(names, eager, reference, device),
        "compiled_vs_fp32": _errors(names, compiled, reference, device),
    }
    order = sorted(range(len(names)), key=lambda i: -comparisons["compiled_vs_eager"][i].error)
    for i in order[:args.top]:
        line: dict[str, Any] = {"tensor": names[i], "numel": eager[i].numel()}
        for key, errors in comparisons.items():
            line[key] = {"error": errors[i].error, "reference_norm": errors[i].reference_norm,
                         "against_kind_scale": errors[i].absolute}
        print(json.dumps(line), flush=True)
    context = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if not smoke else contextlib.nullcontext
    verdict = verify_module(module, inputs, {}, context=context)
    print(json.dumps({"verdict": {"passed": verdict.passed, "max_rel_error": verdict.max_rel_error,
                                  "tolerance": verdict.tolerance, "where": verdict.where, "error": verdict.error}}))


if __name__ == "__main__":
    sys.exit(main())
