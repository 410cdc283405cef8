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
clock-event reason. The SM clock is an instant (``power.draw`` is the last second's average on Ampere and
newer cards): a median over tens of samples says what the card ran at, one sample says little. One GPU:
``call.sh`` prefixes the epoch to the first line ``nvidia-smi`` prints, which is the only one read.
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
    """``gpu.csv``'s rows as dicts keyed by its header (``epoch`` first); the reasons' hex mask becomes an
    int, a field the card does not report (``[N/A]``) None; a row ``nvidia-smi`` answered with an error, or
    without an epoch or SM clock, is left out."""
    if not lines:
        return []
    header = [name.strip() for name in lines[0].split(",")]
    samples = []
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(header):
            continue
        row: dict[str, Any] = {}
        for name, cell in zip(header, cells):
            reasons = name.startswith(("clocks_event_reasons", "clocks_throttle_reasons"))
            try:
                if name == "timestamp":
                    row[name] = cell
                elif reasons:
                    row["reasons"] = int(cell, 16)
                else:
                    row[name] = float(cell)
            except ValueError:
                row["reasons" if reasons else name] = None
        if row.get("epoch") is not None and row.get("clocks.sm") is not None:
            samples.append(row)
    return samples


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def compare(samples: list[dict[str, Any]], result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant: its median step and, over the same span, the SM clock, power and reasons."""
    rows = []
    for variant, start, end, median_ms, _ in variant_spans(result):
        inside = [s for s in samples if start <= s["epoch"] <= end]
        row: dict[str, Any] = {"variant": variant, "median_ms": median_ms, "samples": len(inside)}
        if inside:
            clocks = [s["clocks.sm"] for s in inside]
            top = [s["clocks.max.sm"] for s in inside if s.get("clocks.max.sm") is not None]
            row.update(sm_mhz=statistics.median(clocks), sm_min_mhz=min(clocks), sm_max_mhz=max(top) if top else None,
                       power_w=_median([s.get("power.draw") for s in inside]),
                       power_limit_w=_median([s.get("enforced.power.limit") for s in inside]))
            counts: collections.Counter[str] = collections.Counter()
            for sample in inside:
                mask = sample.get("reasons")
                for name in reason_names(mask) if mask is not None else ["not sampled"]:
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
            top = f", top {row['sm_max_mhz']:.0f}" if row["sm_max_mhz"] is not None else ""
            step = f"{row['median_ms']:.2f} ms" if row["median_ms"] is not None else "– (no steps)"
            print(f"  {row['variant']:<14} median {step}, SM clock {row['sm_mhz']:.0f} MHz "
                  f"(lowest {row['sm_min_mhz']:.0f}{top}){power}; reasons: {reasons}; {row['samples']} samples")


if __name__ == "__main__":
    sys.exit(main())
