"""A host clock beside a benchmark run: is a variant slower because of the process, or because of the host?

Issue 19's after-effect: on the shared H200 host, host-bound eager steps (ResNet-18 CIFAR, timm ViT,
variable-length GPT-2) often ran 14-40% slower in ``eager_end`` than in ``eager`` after a callback
variant, while the host's own speed swings as much within minutes. Probes taken in turn, before and
after, in the same or a fresh process, cannot tell the two apart. This clock runs *beside* the
benchmark, in its own process, for the whole run: every ``--interval`` seconds it times a fixed piece of
pure-Python work and of small CPU tensor ops (no CUDA: it must not touch the benchmark's GPU) and
writes one JSON line. If ``eager_end`` is slower than ``eager`` and the clock slowed as much over the
same spans, the host did it; if the clock held steady, something in the benchmark's process did.

    python -m benchmarks.diagnostics.hostclock run --out clock.jsonl &      # beside the benchmark
    python -m benchmarks --workload resnet18_cifar ...                       # records carry started_at/ended_at
    python -m benchmarks.diagnostics.hostclock read clock.jsonl result.json  # per variant: steps against clock

The clock samples a different core than the benchmark's main thread may run on, so it sees what the
host does to every core (a busy tenant, clocks) but not contention on one core alone: a steady clock
beside a slower ``eager_end`` points at the process, it does not prove it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

PY_LOOP = 100_000  # iterations of the pure-Python probe (~5 ms on the H200 host)
CPU_OPS = 2_000  # small CPU tensor adds of the dispatcher probe (~5 ms)


def _cpu_now() -> int | None:
    """The core this thread runs on now (``/proc``; None where there is none)."""
    try:
        with open("/proc/thread-self/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def _cpu_jiffies() -> dict[str, int] | None:
    """The machine's CPU time so far over all cores (``/proc/stat``, in clock ticks): busy (user, nice,
    system, irq, softirq), steal (time a virtual machine's cores waited for the host's) and in all; None
    where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(value) for value in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return {"busy": user + nice + system + irq + softirq, "steal": steal, "all": sum(fields)}


def sample() -> dict[str, Any]:
    """One reading: milliseconds of the pure-Python and of the CPU-op probe, the wall time and core, and the
    machine's CPU time so far (:func:`_cpu_jiffies`)."""
    start = time.perf_counter()
    total = 0
    for i in range(PY_LOOP):
        total += i * 2
    python_ms = (time.perf_counter() - start) * 1e3
    x = torch.ones(8)
    start = time.perf_counter()
    for _ in range(CPU_OPS):
        x = x + 1
    ops_ms = (time.perf_counter() - start) * 1e3
    return {"t": time.time(), "py_ms": round(python_ms, 4), "ops_ms": round(ops_ms, 4), "core": _cpu_now(),
            "jiffies": _cpu_jiffies()}


def cpu_shares(samples: list[dict[str, Any]], start: float, end: float) -> dict[str, float] | None:
    """The machine's busy and steal shares of its CPU time between ``start`` and ``end`` (the samples nearest
    inside): how loaded its cores were (a background child's compile workers among the load), and how much of
    the time the host withheld them; None with fewer than two samples that carry the counters."""
    inside = [s for s in samples if start <= s["t"] <= end and s.get("jiffies")]
    if len(inside) < 2:
        return None
    first, last = inside[0]["jiffies"], inside[-1]["jiffies"]
    total = last["all"] - first["all"]
    if total <= 0:
        return None
    return {"busy": (last["busy"] - first["busy"]) / total, "steal": (last["steal"] - first["steal"]) / total}


def run(out: str, interval: float, seconds: float | None) -> None:
    stop = time.monotonic() + seconds if seconds else None
    with open(out, "a") as handle:
        while stop is None or time.monotonic() < stop:
            handle.write(json.dumps(sample()) + "\n")
            handle.flush()
            time.sleep(interval)


def variant_spans(result: dict[str, Any], *, tail: float = 0.5) -> list[tuple[str, float, float, float | None, float]]:
    """``(variant, start, end, median_ms, started)`` of each record with wall times: the last ``tail`` of its span,
    where its steady window lies, and when its whole run started."""
    spans = []
    for record in result.get("records", []):
        start, end = record.get("started_at"), record.get("ended_at")
        if start is None or end is None:
            continue
        spans.append((record["variant"], end - tail * (end - start), end, record.get("median_ms"), start))
    return spans


def compare(samples: list[dict[str, Any]], result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant: its median step, the clock's medians over the same span, and both as ratios to the
    first ``eager``'s. ``process_over_host``: the step's ratio over the clock's (ops probe): above 1, the
    variant ran slower than the host's speed explains."""
    rows = []
    for variant, start, end, median_ms, started in variant_spans(result):
        inside = [s for s in samples if start <= s["t"] <= end]
        shares = cpu_shares(samples, started, end)  # over the variant's whole run: a child's start-up too
        rows.append({
            "variant": variant, "median_ms": median_ms, "clock_samples": len(inside),
            "busy": shares and shares["busy"], "steal": shares and shares["steal"],
            "py_ms": statistics.median(s["py_ms"] for s in inside) if inside else None,
            "ops_ms": statistics.median(s["ops_ms"] for s in inside) if inside else None,
        })
    eager = next((row for row in rows if row["variant"] == "eager"), None)
    for row in rows:
        step = _ratio(row["median_ms"], eager and eager["median_ms"])
        clock = _ratio(row["ops_ms"], eager and eager["ops_ms"])
        row.update(step_vs_eager=step, clock_vs_eager=clock, process_over_host=_ratio(step, clock))
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _read(argv: argparse.Namespace) -> None:
    with open(argv.clock) as handle:
        samples = [json.loads(line) for line in handle if line.strip()]
    for path in argv.results:
        with open(path) as handle:
            result = json.load(handle)
        print(f"{result.get('workload')}: {path}")
        for row in compare(samples, result):
            cells = [f"{row['variant']:<10}"] + [
                f"{key} {row[key]:.3f}" if isinstance(row[key], float) else f"{key} -"
                for key in ("median_ms", "ops_ms", "py_ms", "step_vs_eager", "clock_vs_eager", "process_over_host",
                            "busy", "steal")
            ]
            print("  " + ", ".join(cells) + f", samples {row['clock_samples']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.hostclock", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="sample until killed (or --seconds), one JSON line per sample")
    runner.add_argument("--out", required=True)
    runner.add_argument("--interval", type=float, default=0.5)
    runner.add_argument("--seconds", type=float, default=None)
    reader = commands.add_parser("read", help="per variant of each result: step time against the clock")
    reader.add_argument("clock")
    reader.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.interval, args.seconds)
    else:
        _read(args)


if __name__ == "__main__":
    sys.exit(main())
