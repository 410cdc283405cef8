"""Diagnostic (off-protocol, issue 22): a background compile's child, alone and beside training.

On the H200 (session 17) a child compiling ResNet-50's whole model (CUDA graphs) had not finished after
65 s beside eager training, where the in-process cold compile took 33 s, and the eager steps beside it ran
18% slower. This separates the two directions on one workload: the child started as the callback starts
it (:func:`compile_callback.background.start`, the whole model, the mode given, bf16 autocast, verified),
each time into an empty Inductor cache folder (Triton's following it), in the phases asked for:

- ``alone``: the child with nothing else on the device; the parent only polls.
- ``standby``: as ``alone``, on an interpreter started ``STANDBY_LEAD_S`` before (the callback's first child
  runs on one started with the fit: :class:`compile_callback.background.Standby`).
- ``beside:N``: the child at niceness N while the parent trains eagerly (plain loop, fused AdamW, bf16
  autocast, every step timed with CUDA events), with ``--reference-steps`` eager steps before it and as many
  after it as the reference (session 26: 50 before alone, ~0.45 s of ResNet-18 CIFAR, could not tell a child's
  cost from the host's moves).

One JSON line per phase: the child's seconds in all and by stage (its own report), and the eager steps'
median and mean before and during it, and their wall time per step. Session 17's runs synchronized every
step and left cuDNN's benchmark off, where the harness's Lightning loop runs ahead and its Trainer sets
``benchmark=True`` (which the child copies): ``--async-steps`` and ``--cudnn-benchmark`` run it so.

    python -m benchmarks.diagnostics.child resnet50 --phases beside:10,alone,beside:0 > child.jsonl
    python -m benchmarks.diagnostics.child resnet50 --phases beside:10 --async-steps --cudnn-benchmark
    python -m benchmarks.diagnostics.child gpt2 --module transformer.h.0 --mode default --phases standby,beside:0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

from benchmarks.workloads import make_workload
from compile_callback import background
from compile_callback.profile import _copy
from compile_callback.regions import CompileOptions

REFERENCE_STEPS = 50
STANDBY_LEAD_S = 20.0  # how long a standby waits before its payload (the fit's first steps, then profiling)


def _phase(name: str) -> tuple[str, int | None]:
    kind, _, niceness = name.partition(":")
    if kind in ("alone", "standby") and not niceness:
        return kind, None
    if kind == "beside" and niceness.isdigit() and int(niceness) <= 19:
        return kind, int(niceness)
    raise argparse.ArgumentTypeError(f"a phase is 'alone', 'standby' or 'beside:N' (N the child's niceness, 0-19); got {name!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.child")
    parser.add_argument("workload", help="resnet50, resnet18_cifar, hf_gpt2, timm_vit or hf_bert_mlm")
    parser.add_argument("--phases", default="beside:10,alone", help="comma-separated: alone, standby, beside:N")
    parser.add_argument("--mode", default="reduce-overhead", help="the compile mode the child compiles with")
    parser.add_argument("--child-limit", type=float, default=150.0, help="seconds after which a child is stopped (a failed phase)")
    parser.add_argument("--async-steps", action="store_true",
                        help="steps without a sync (as Lightning's loop): only the wall time per step is read")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark=True, as the harness's Trainer(benchmark=True) sets it (the child copies it)")
    parser.add_argument("--reference-steps", type=int, default=REFERENCE_STEPS,
                        help=f"eager steps timed before and after each child beside training (default {REFERENCE_STEPS})")
    parser.add_argument("--cache-root", default=None, help="where the empty cache folders go (default: a temporary folder)")
    parser.add_argument("--module", default="",
                        help="the submodule the child compiles, by its dotted name (e.g. transformer.h.0: a repeated "
                             "block, as the callback prepares a group of them); default: the whole model")
    args = parser.parse_args(argv)
    if args.reference_steps < 1:
        parser.error(f"--reference-steps must be at least 1; got {args.reference_steps}")
    phases = [_phase(name) for name in args.phases.split(",") if name]
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    workload = make_workload(args.workload, smoke=device.type == "cpu", device=device)
    module = workload.build_module().to(device)
    optimizer = workload.optimizer(module)
    batch = {k: v.to(device) for k, v in next(iter(workload.train_loader(1, False))).items()}
    target = module.get_submodule(args.module)
    held: list[tuple[tuple, dict]] = []  # the target's input in one training step, as the callback holds it
    dtype = torch.bfloat16

    def context():
        return torch.autocast(device.type, dtype=dtype)

    def step() -> float | None:
        if args.async_steps and device.type == "cuda":  # as Lightning's loop runs: no sync, the host runs ahead
            with context():
                loss = workload.loss(module, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return None
        if device.type != "cuda":  # a check of the script on CPU
            started = time.perf_counter()
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        with context():
            loss = workload.loss(module, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type != "cuda":
            return (time.perf_counter() - started) * 1e3
        end.record()
        end.synchronize()  # one step at a time: the timing, not the throughput, is what is read
        return start.elapsed_time(end)

    root = args.cache_root or tempfile.mkdtemp(prefix="child-diagnostic-")
    options = CompileOptions(mode=args.mode)
    hook = target.register_forward_pre_hook(lambda _m, a, k: held.append(_copy((a, k), "cpu")) if not held else None, with_kwargs=True)
    for _ in range(10):
        step()  # cuDNN's and the allocator's first-call work
    hook.remove()
    def reference() -> tuple[list[float | None], float]:
        """``--reference-steps`` eager steps: each one's time, and the wall time per step."""
        wall = time.perf_counter()
        times = [step() for _ in range(args.reference_steps)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        return times, (time.perf_counter() - wall) * 1e3 / args.reference_steps

    for kind, niceness in phases:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"{kind}-", dir=root)
        os.environ.pop("TRITON_CACHE_DIR", None)
        if niceness is not None:
            os.environ[background.NICENESS_VARIABLE] = str(niceness)
        before, before_wall_ms = reference() if kind == "beside" else ([], None)
        standby = None
        if kind == "standby":  # as the callback's first child: an interpreter started with the fit, idle since
            standby = background.Standby()
            time.sleep(STANDBY_LEAD_S)
        started = time.monotonic()
        child = background.start(args.module, target, held[0], options, context=context, device=device, verify=True,
                                 tolerance=None, standby=standby)
        child.time_limit_s = args.child_limit
        during: list[float | None] = []
        while not child.done():
            if kind == "beside":
                during.append(step())
            else:
                time.sleep(0.05)
        if device.type == "cuda":
            torch.cuda.synchronize()
        waited = time.monotonic() - started
        ok, detail = child.outcome()
        # The same reference after the child: a host that moved shows as before != after.
        after_wall_ms = reference()[1] if kind == "beside" else None
        steps = len(during)
        before, during = [t for t in before if t is not None], [t for t in during if t is not None]
        print(json.dumps({
            "workload": args.workload, "module": args.module or "(whole model)", "phase": kind, "niceness": niceness, "mode": args.mode, "ok": ok, "detail": detail,
            "async_steps": args.async_steps, "cudnn_benchmark": args.cudnn_benchmark,
            "waited_s": waited, "child_s": child.seconds, "stages": child.stages,
            "eager_before_ms": statistics.median(before) if before else None,
            "eager_during_ms": statistics.median(during) if during else None, "steps_during": steps,
            # The mean too: a child that stalls the loop now and then moves the wall time, not the median.
            "eager_before_mean_ms": statistics.fmean(before) if before else None,
            "eager_during_mean_ms": statistics.fmean(during) if during else None,
            # Wall time per step (host gaps included; the only figure with --async-steps).
            "before_wall_ms_per_step": before_wall_ms,
            "during_wall_ms_per_step": waited * 1e3 / steps if steps else None,
            "after_wall_ms_per_step": after_wall_ms,
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
