"""Diagnostic (off-protocol, issues 20 and 23): what the CompileCallback's own hooks cost the host per step.

On the H200 the callback's ResNet-18 CIFAR plan (whole model, CUDA graphs) ran 6-8% slower than the same
plan compiled by ``model.compile(mode="reduce-overhead")`` in both orders (0.3 ms of a 4.3 ms host-bound
step); profiler traces of the two show the same step. This runs the given variants in one process, in
the order given, and for every callback variant times each of the callback's Lightning hooks on the
host (``perf_counter`` around the call), so the hooks' share of the gap is a figure, not a guess. One
JSON line per variant: its median step, and per hook the median and the total over the measured steps.
Measured so (NOTES.md, twelfth session): 196-222 us a step as the hooks were, 96 us after the fixes it led to.
``hooks_by_batch_kind`` splits the hooks' time a batch by kind: a re-pricing round's batches (which take the
full path) against the frozen plan's quiet ones, the time a clock around every callback's hooks holds and the
callback's own step timer does not (session 25).
With ``--profile N``, the hooks of the last callback variant run under ``cProfile`` over its last
``--last`` steps (its timings then carry the profiler's overhead) and its line lists the N functions
with the most own time inside them, per step: where the hooks' time goes on that host.
With ``--step-profile N``, every variant's whole steps (from the harness's step start to its step end:
forward, backward, optimizer, every callback's hooks) run under ``cProfile`` over its last ``--last``
steps, and its line lists the N functions with the most own time per step and their calls per step:
what a callback variant's step does that another variant's does not (the profiler's overhead falls on
Python code, so compare calls and own time between variants, not with unprofiled step times).

    python -m benchmarks.diagnostics.hookcost resnet18_cifar whole_ro,callback,whole_ro,callback --total-steps 1500
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import json
import statistics
import sys
import time
from collections import defaultdict

from benchmarks import runner
from benchmarks.diagnostics import prepare
from benchmarks.variants import VARIANTS
from compile_callback import CompileCallback

HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_train_batch_end",
         "on_before_optimizer_step", "on_before_zero_grad")
timings: dict[str, list[float]] = defaultdict(list)
kinds: list[str] = []  # each batch's kind as its start hook left it: "round" (a re-pricing round's), "quiet" or "full"
profiling: dict[str, object] = {"profile": None, "from_step": None}  # the cProfile run over a variant's last steps
stepping: dict[str, object] = {"profile": None, "from_step": None, "steps": 0}  # --step-profile: the whole steps


def install_step_profile() -> None:
    """Profiles whole steps: enabled at the harness's step start, disabled at its step end."""
    from benchmarks.measure import StepEnd, StepStart

    start, end = StepStart.on_train_batch_start, StepEnd.on_train_batch_end

    def started(self, trainer, *args, **kwargs):  # noqa: ANN001, ANN202
        start(self, trainer, *args, **kwargs)
        profile = stepping["profile"]
        if profile is not None and trainer.global_step >= stepping["from_step"]:
            stepping["steps"] += 1
            profile.enable()

    def ended(self, *args, **kwargs):  # noqa: ANN001, ANN202
        profile = stepping["profile"]
        if profile is not None:
            profile.disable()
        return end(self, *args, **kwargs)

    StepStart.on_train_batch_start, StepEnd.on_train_batch_end = started, ended


def _timed(name: str, hook):  # noqa: ANN001, ANN202
    @functools.wraps(hook)
    def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN202
        profile = profiling["profile"]
        if profile is not None and len(timings["on_train_batch_start"]) < profiling["from_step"]:
            profile = None
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        try:
            return hook(self, *args, **kwargs)
        finally:
            if profile is not None:
                profile.disable()
            timings[name].append((time.perf_counter() - started) * 1e6)
            if name == "on_train_batch_start":
                kinds.append(batch_kind(self.run))
    return wrapper


def batch_kind(run) -> str:  # noqa: ANN001
    """A batch's kind once its start hook ran: a re-pricing round's, a quiet step of the frozen plan, or a full one."""
    if run is None:
        return "full"
    return "round" if run.repricer.running else "quiet" if run._quiet else "full"


def per_kind(last: int) -> dict[str, dict[str, float]]:
    """Every hook's host time summed per batch, then the median and count by the batch's kind, over the
    last ``last`` batches: what a re-pricing round's batches cost beside the plan's quiet ones."""
    batches = len(kinds)
    totals = [0.0] * batches
    for samples in timings.values():
        if len(samples) == batches:  # hooks called once a batch (no gradient accumulation here)
            for index, us in enumerate(samples):
                totals[index] += us
    grouped: dict[str, list[float]] = defaultdict(list)
    for index in range(max(0, batches - last), batches):
        grouped[kinds[index]].append(totals[index])
    return {kind: {"batches": len(us), "median_us": statistics.median(us)} for kind, us in grouped.items()}


def top_functions(profile: cProfile.Profile, steps: int, count: int) -> list[list]:
    """The ``count`` functions with the most own time: [name, calls per step, own us per step, cumulative us per step]."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:count]
    return [[f"{path.rsplit('/', 2)[-1] if '/' in path else path}:{line}({func})", round(calls / steps, 2),
             round(own * 1e6 / steps, 2), round(cumulative * 1e6 / steps, 2)]
            for (path, line, func), (_, calls, own, cumulative, _) in rows]


def install() -> list[str]:
    """Wraps every hook CompileCallback defines (not Lightning's empty defaults); returns their names."""
    wrapped = []
    for name in HOOKS:
        if name in vars(CompileCallback):
            setattr(CompileCallback, name, _timed(name, vars(CompileCallback)[name]))
            wrapped.append(name)
    return wrapped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.hookcost")
    parser.add_argument("workload")
    parser.add_argument("variants", help="comma-separated variant names, run in this order")
    parser.add_argument("--total-steps", type=int, default=1500)
    parser.add_argument("--last", type=int, default=1000, help="steps of each variant's end that are summarized")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the last callback variant's hooks over its last steps; list the top N functions")
    parser.add_argument("--step-profile", type=int, default=0, metavar="N",
                        help="profile every variant's whole steps over its last steps; list the top N functions")
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    profiled = max((i for i, name in enumerate(names) if VARIANTS[name].callback is not None), default=None)
    prepared = prepare(args.workload, "/tmp/hookcost", "--total-steps", str(args.total_steps))
    wrapped = install()
    if args.step_profile:
        install_step_profile()
    for index, name in enumerate(names):
        timings.clear()
        kinds.clear()
        stepping.update(profile=cProfile.Profile() if args.step_profile else None, steps=0,
                        from_step=max(0, args.total_steps - args.last))
        profile = cProfile.Profile() if args.profile and index == profiled else None
        profiling.update(profile=profile, from_step=max(0, args.total_steps - args.last))
        record = runner.run_variant(prepared.workload, VARIANTS[name], prepared.settings, prepared.state)
        every = record.get("step_ms_all") or []
        steps = every[-args.last:]
        hooks = {hook: {"median_us": statistics.median(samples[-args.last:]),
                        "per_step_us": sum(samples[-args.last:]) / max(1, len(steps))}
                 for hook, samples in timings.items() if samples}
        print(json.dumps({
            "variant": name, "status": record.get("status"), "median_ms": statistics.median(steps) if steps else None,
            "steps": len(steps), "hooks": hooks,
            # 100-step medians over the whole run: whether a gap is steady or the host's wander.
            "window_medians_ms": [round(statistics.median(every[i:i + 100]), 3)
                                  for i in range(0, len(every) - 99, 100)], "hooks_per_step_us": sum(h["per_step_us"] for h in hooks.values()),
            "wrapped": wrapped, "hooks_by_batch_kind": per_kind(args.last),
            **({"profile_top": top_functions(profile, max(1, len(steps)), args.profile)} if profile is not None else {}),
            **({"step_profile_steps": stepping["steps"],
                "step_profile_top": top_functions(stepping["profile"], max(1, stepping["steps"]), args.step_profile)}
               if args.step_profile else {}),
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
