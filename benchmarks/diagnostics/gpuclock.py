"""The GPU's own clock beside a benchmark run: did a variant run slower because the card clocked down?

Issue 23's MFU: GPT-2's compiled step on the H200 stayed 3-4% above the SPEC's anchor (33.4 ms) while
eager matched its anchor. The card caps its power (700 W on the H200): when a step draws more, the
driver lowers the SM clock and sets the "SW power cap" reason. ``call.sh`` (session 29 on) samples
``nvidia-smi`` every 0.5 s into ``gpu.csv``, epoch seconds first, and this reads it against each
variant's span (records carry ``started_at``/``ended_at`` in the same clock), as
:mod:`benchmarks.diagnostics.hostclock` does for the host:

    python -m benchmarks.diagnostics.gpuclock gpu.csv result.json

Per variant, over the last half of its span (where its steady window lies): the median and lowest SM
clock, the card's top clock, the median power against the enforced limit, and the share of samples per
clock-event reason. ``nvidia-smi``'s samples are instants, not averages: a median over tens of them
says what the card ran at, one sample says little.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from typing import Any

from benchmarks.diagnostics.hostclock import variant_spans

# nvml.h's clock-event reasons (nvidia-smi --help-query-gpu, "clocks_event_reasons").
REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}


def reason_names(mask: int) -> list[str]:
    """The names of the reasons set in ``mask`` ("none" where none is: the clock is as high as it goes)."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    if unknown:
        names.append(f"other ({unknown:#x})")
    return names or ["none"]


def read_samples(lines: list[str]) -> list[dict[str, Any]]:
    """``gpu.csv``'s rows as dicts keyed by its header (``epoch`` first); a row ``nvidia-smi`` answered with
    an error, or with ``[N/A]``, is left out; the reasons' hex mask becomes an int."""
    header = [name.strip() for name in lines[0].split(",")]
    samples = []
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(header):
            continue
        row: dict[str, Any] = {}
        try:
            for name, cell in zip(header, cells):
                if name == "timestamp":
                    row[name] = cell
                elif name.startswith("clocks_event_reasons") or name.startswith("clocks_throttle_reasons"):
                    row["reasons"] = int(cell, 16)
                else:
                    row[name] = float(cell)
        except ValueError:
            continue
        samples.append(row)
    return samples


def compare(samples: list[dict[str, Any]], result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant: its median step and, over the same span, the SM clock, power and reasons."""
    rows = []
    for variant, start, end, median_ms in variant_spans(result):
        inside = [s for s in samples if start <= s["epoch"] <= end]
        row: dict[str, Any] = {"variant": variant, "median_ms": median_ms, "samples": len(inside)}
        if inside:
            clocks = [s["clocks.sm"] for s in inside]
            row.update(sm_mhz=statistics.median(clocks), sm_min_mhz=min(clocks),
                       sm_max_mhz=max(s.get("clocks.max.sm", 0.0) for s in inside) or None,
                       power_w=statistics.median(s["power.draw"] for s in inside) if "power.draw" in inside[0] else None,
                       power_limit_w=inside[0].get("enforced.power.limit"))
            counts: collections.Counter[str] = collections.Counter()
            for sample in inside:
                for name in reason_names(sample["reasons"]) if "reasons" in sample else ["not sampled"]:
                    counts[name] += 1
            row["reasons"] = {name: round(count / len(inside), 3) for name, count in counts.most_common()}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.gpuclock", description=__doc__.split("\n")[0])
    parser.add_argument("samples", help="gpu.csv as call.sh writes it (epoch seconds, then nvidia-smi's fields)")
    parser.add_argument("results", nargs="+", help="benchmark result JSON files of the same run")
    args = parser.parse_args(argv)
    with open(args.samples) as handle:
        samples = read_samples(handle.read().splitlines())
    for path in args.results:
        with open(path) as handle:
            result = json.load(handle)
        print(f"{result.get('workload')}: {path}")
        for row in compare(samples, result):
            if not row["samples"]:
                print(f"  {row['variant']:<14} no samples in its span")
                continue
            power = (f", power {row['power_w']:.0f} W" + (f" of {row['power_limit_w']:.0f}" if row["power_limit_w"] else "")
                     if row["power_w"] is not None else "")
            reasons = ", ".join(f"{name} {share:.0%}" for name, share in row["reasons"].items())
            print(f"  {row['variant']:<14} median {row['median_ms']:.2f} ms, SM clock {row['sm_mhz']:.0f} MHz "
                  f"(lowest {row['sm_min_mhz']:.0f}, top {row['sm_max_mhz']:.0f}){power}; reasons: {reasons}; "
                  f"{row['samples']} samples")


if __name__ == "__main__":
    sys.exit(main())
