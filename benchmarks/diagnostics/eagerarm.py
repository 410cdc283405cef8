"""Diagnostic (off-protocol, issue 20): is eager under ``torch.compiler.set_stance("force_eager")`` on a
compiled module as fast as a module never compiled?

The callback's late re-pricing and the harness's in-fit A/B both time their eager arm that way, between
blocks of the compiled plan. On ResNet-18 CIFAR (host-bound, CUDA graphs) both read ~10% above the A/B
between variants in a run whose eager and ``eager_end`` agreed (session 13): either the forced-eager
steps are slower than plain eager ones, or the blocks' switching is. This times, in one process and the
plain loop of the benchmark (no Lightning, no callback), in turn:

- ``plain``: a copy of the workload's module never compiled;
- ``forced``: a second copy, compiled as ``whole``/``whole_ro`` compile it, run under ``force_eager``;
- ``compiled``: that second copy, compiled.

first in blocks of ``--long`` steps, then of ``--short`` (the callback's re-pricing blocks are 4 steps),
the arms' order rotating each round. Every step is timed with CUDA events (synchronized at each block's
end: this is a diagnostic). Prints one JSON line per phase: each arm's median, its median without the
first step of each block, and its first steps' median.

    python -m benchmarks.diagnostics.eagerarm resnet18_cifar --mode reduce-overhead
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks.diagnostics import prepare
from benchmarks.runner import plain_step
from compile_callback.timing import elapsed_ms, time_mark


def _steps(workload: Any, module: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Any, count: int,
           device: torch.device) -> list[float]:
    """``count`` plain-loop steps, each timed (CUDA events, read after one synchronize at the end)."""
    cuda = device.type == "cuda"
    marks = []
    for _ in range(count):
        batch = {key: value.to(device, non_blocking=True) for key, value in next(batches).items()}
        started = time_mark(cuda)
        plain_step(workload, module, optimizer, batch)
        marks.append((started, time_mark(cuda)))
    if cuda:
        torch.cuda.synchronize()
    return [elapsed_ms(started, ended) for started, ended in marks]


def _cycle(workload: Any, steps: int):
    while True:
        yield from workload.train_loader(steps)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.eagerarm")
    parser.add_argument("workload")
    parser.add_argument("--mode", default="reduce-overhead", help="torch.compile mode of the compiled copy ('default' for none)")
    parser.add_argument("--long", type=int, default=50, help="steps per block in the first phase")
    parser.add_argument("--short", type=int, default=4, help="steps per block in the second phase")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of the first phase (each runs every arm once)")
    parser.add_argument("--short-rounds", type=int, default=60, help="rounds of the second phase")
    args = parser.parse_args(argv)
    prepared = prepare(args.workload, "/tmp/eagerarm")
    workload, state, device = prepared.workload, prepared.state, prepared.device

    modules, optimizers = {}, {}
    for name in ("plain", "compiled"):
        torch.manual_seed(0)
        with torch.device(device):
            module = workload.build_module()
        module.load_state_dict(state)
        module.to(device).train()
        modules[name], optimizers[name] = module, workload.optimizer(module)
    mode = None if args.mode == "default" else args.mode
    backend = "inductor" if device.type == "cuda" else "eager"
    modules["compiled"].compile(mode=mode, backend=backend)
    batches = _cycle(workload, 1000)
    began = time.time()
    _steps(workload, modules["compiled"], optimizers["compiled"], batches, 6, device)  # compile, record graphs
    compile_s = time.time() - began

    arms = {
        "plain": lambda n: _steps(workload, modules["plain"], optimizers["plain"], batches, n, device),
        "forced": lambda n: _forced(lambda: _steps(workload, modules["compiled"], optimizers["compiled"], batches, n, device)),
        "compiled": lambda n: _steps(workload, modules["compiled"], optimizers["compiled"], batches, n, device),
    }
    names = list(arms)
    for arm in names:  # one untimed block each: every arm warm before the first timed one
        arms[arm](args.short)
    for phase, block, rounds in (("long", args.long, args.rounds), ("short", args.short, args.short_rounds)):
        samples: dict[str, list[list[float]]] = {name: [] for name in names}
        for round_index in range(rounds):
            order = names[round_index % 3:] + names[:round_index % 3]
            for arm in order:
                samples[arm].append(arms[arm](block))
        line: dict[str, Any] = {"workload": args.workload, "mode": args.mode, "phase": phase, "block": block,
                                "rounds": rounds, "compile_s": round(compile_s, 1)}
        for arm, blocks in samples.items():
            every = [ms for steps in blocks for ms in steps]
            rest = [ms for steps in blocks for ms in steps[1:]]
            line[arm] = {"median_ms": round(statistics.median(every), 4),
                         "median_without_first_ms": round(statistics.median(rest), 4) if rest else None,
                         "first_steps_median_ms": round(statistics.median(steps[0] for steps in blocks), 4),
                         "block_medians_ms": [round(statistics.median(steps), 3) for steps in blocks][:16]}
        line["forced_over_plain"] = round(line["forced"]["median_ms"] / line["plain"]["median_ms"], 4)
        line["plain_over_compiled"] = round(line["plain"]["median_ms"] / line["compiled"]["median_ms"], 4)
        line["forced_over_compiled"] = round(line["forced"]["median_ms"] / line["compiled"]["median_ms"], 4)
        print(json.dumps(line), flush=True)


def _forced(run):
    with torch.compiler.set_stance("force_eager"):
        return run()


if __name__ == "__main__":
    sys.exit(main())
