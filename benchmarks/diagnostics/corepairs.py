"""Diagnostic (off-protocol, issue 22): does busy work on one CPU slow a host-bound loop on another?

A background compile's child costs ResNet-18 CIFAR's host-bound eager step ~3% on the GPU machine while
the machine stays ~78% idle (session 34), and capping Inductor's workers moved nothing. One way a mostly
idle machine can still slow one thread: the guest's CPUs are the host's hyperthreads (the guest sees
"1 thread per core" under KVM), so a busy CPU that is another's sibling takes half its core. This pins a
pure-Python loop to one CPU and, in turn, a busy process to each other CPU (then to all of them), and
times the loop's rate against its rate with nothing beside it, measured between each pair of trials.

    python -m benchmarks.diagnostics.corepairs --home 0 --seconds 0.5 > corepairs.jsonl

One JSON line per home CPU: the loop's rate beside a busy CPU against its rate alone, per CPU, and beside
all. A sibling shows as one CPU far below the others (on a shared host the loop moves a few percent alone).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time


def _spin(cpu: int, stop: float) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while time.time() < stop:
        x += 1


def _rate(seconds: float) -> float:
    """Iterations of a pure-Python loop a second, over ``seconds``."""
    count, started = 0, time.perf_counter()
    while True:
        for _ in range(10_000):
            count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return count / elapsed


def _beside(cpus: list[int], seconds: float) -> float:
    """The loop's rate with busy processes pinned to ``cpus`` (started first, ended after)."""
    stop = time.time() + seconds + 0.3
    context = multiprocessing.get_context("fork")
    spinners = [context.Process(target=_spin, args=(cpu, stop)) for cpu in cpus]
    for spinner in spinners:
        spinner.start()
    time.sleep(0.1)
    rate = _rate(seconds)
    for spinner in spinners:
        spinner.join()
    return rate


def probe(home: int, others: list[int], seconds: float) -> dict:
    """The loop on ``home`` beside each of ``others`` busy, and beside all: rate against the alone rates either side."""
    os.sched_setaffinity(0, {home})
    alone = [_rate(seconds)]
    ratios: dict[str, float] = {}
    for cpu in others:
        rate = _beside([cpu], seconds)
        alone.append(_rate(seconds))
        ratios[str(cpu)] = round(rate / ((alone[-2] + alone[-1]) / 2), 3)
    rate = _beside(others, seconds)
    alone.append(_rate(seconds))
    return {"home": home, "seconds": seconds, "beside_one": ratios,
            "beside_all": round(rate / ((alone[-2] + alone[-1]) / 2), 3),
            "alone_spread": round(max(alone) / min(alone) - 1, 3), "alone_median_per_s": round(statistics.median(alone))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=int, nargs="+", default=[0], help="the CPUs the loop runs on, in turn")
    parser.add_argument("--seconds", type=float, default=0.5, help="each timing's length")
    args = parser.parse_args(argv)
    allowed = os.sched_getaffinity(0)
    for home in args.home:
        if home not in allowed:
            parser.error(f"--home {home} is not a CPU this process may use ({sorted(allowed)})")
        print(json.dumps(probe(home, sorted(allowed - {home}), args.seconds)), flush=True)
        os.sched_setaffinity(0, allowed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
