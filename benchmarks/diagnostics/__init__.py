"""Off-protocol diagnostics: scripts that answer one question on the GPU machine, kept beside the
harness (not among the results they produced). Each module's docstring says what it measures and how
to run it: ``phases`` (per-batch peak memory by planner phase, process state and host probes between
variants, cProfile of a variant), ``revert`` (a reverted region's speed), ``ddp_check`` (DDP loss
curves and parameter checksums per rank), ``aftereffect`` (eager windows between treatments),
``hostclock`` (the host's speed beside a run), ``gpuclock`` (the GPU's SM clock, power and clock-event
reasons beside a run, from ``call.sh``'s nvidia-smi samples), ``numerics`` (every tensor's error against eager and
fp32), ``peakstack`` (what is alive at a variant's memory peak), ``hookcost`` (the callback's hooks
timed on the host) and ``eagerarm`` (forced-eager steps of a compiled module against plain eager)."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Prepared:
    """A workload ready to run variants as the benchmark runs them (:func:`prepare`)."""

    settings: object  # benchmarks.runner.RunSettings
    workload: object  # benchmarks.workloads.Workload
    state: dict[str, torch.Tensor]  # the initial weights every variant starts from
    device: torch.device
    smoke: bool


def prepare(name: str, out: str, *extra: str) -> Prepared:
    """What the harness does before its variants, for a diagnostic: cold compiles (no compile caches, so
    no background child either), the CUDA device where there is one (else a smoke run on CPU), the
    benchmark's settings for ``name`` with ``extra`` command-line arguments and no in-fit A/B, the
    initial weights, and the process warmed up."""
    from benchmarks import dynamo_counts, runner
    from benchmarks.__main__ import parse_args, resolve_settings
    from benchmarks.workloads import make_workload

    dynamo_counts.disable_compile_caches()
    smoke = not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    args = parse_args(["--workload", name, "--out", out, "--in-fit-ab", "0", *extra] + (["--smoke"] if smoke else []))
    settings = resolve_settings(args, name, device, args.out)
    workload = make_workload(name, device=device, smoke=smoke)
    state = runner.initial_state(workload, device, seed=settings.seed)
    runner.warm_up_process(workload, settings, state)
    return Prepared(settings, workload, state, device, smoke)
