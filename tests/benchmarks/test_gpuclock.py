"""The GPU clock read beside a benchmark (issue 23's MFU): nvidia-smi's samples as ``call.sh`` writes them,
set against each variant's span."""

from __future__ import annotations

import json

from benchmarks.diagnostics import gpuclock

HEADER = ("epoch,timestamp,clocks.sm,clocks.max.sm,power.draw,enforced.power.limit,temperature.gpu,utilization.gpu,"
          "clocks_event_reasons.active")


def _line(t, clock, power, reasons):
    # Exactly as call.sh writes a row: `date +%s.%N`, then nvidia-smi's csv,noheader,nounits answer.
    return f"{t:.9f},2026/12/04 18:01:36.887, {clock}, 1980, {power:.2f}, 700.00, 62, 100, {reasons}"


def test_a_variant_that_ran_power_capped_reads_a_lower_clock_and_the_reason():
    lines = [HEADER]
    lines += [_line(t, 1890, 694.0, "0x0000000000000004") for t in range(0, 10)]  # eager
    lines += [_line(t, 1755, 699.5, "0x0000000000000004") for t in range(10, 20)]  # whole: clocked down
    lines += [_line(t, 1980, 150.0, "0x0000000000000000") for t in range(20, 25)]  # eager_end, light
    lines += [_line(t, 1980, 150.0, "0x0000000000000005") for t in range(25, 30)]  # idle + power cap (made up)
    lines += ["1796407300.1,No devices were found", "1796407300.2,[N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A]"]
    samples = gpuclock.read_samples(lines)
    assert len(samples) == 30  # the error and [N/A] rows are left out
    result = {"records": [
        {"variant": "eager", "median_ms": 44.0, "started_at": 0.0, "ended_at": 9.0},
        {"variant": "whole", "median_ms": 35.0, "started_at": 10.0, "ended_at": 19.0},
        {"variant": "eager_end", "median_ms": 44.1, "started_at": 20.0, "ended_at": 29.0},
        {"variant": "never_ran", "median_ms": None, "started_at": 100.0, "ended_at": 101.0},
    ]}
    rows = {row["variant"]: row for row in gpuclock.compare(samples, result)}
    assert rows["eager"]["sm_mhz"] == 1890 and rows["whole"]["sm_mhz"] == 1755 and rows["whole"]["sm_max_mhz"] == 1980
    assert rows["whole"]["power_w"] == 699.5 and rows["whole"]["power_limit_w"] == 700.0
    assert rows["whole"]["reasons"] == {"SW power cap": 1.0}
    assert rows["whole"]["samples"] == 5  # t = 15..19: the span's second half
    # eager_end's second half (t = 25..29): every sample idle and power-capped at once.
    assert rows["eager_end"]["reasons"] == {"GPU idle": 1.0, "SW power cap": 1.0}
    assert rows["never_ran"]["samples"] == 0 and "sm_mhz" not in rows["never_ran"]
    assert gpuclock.reason_names(0) == ["none"] and gpuclock.reason_names(0x1004) == ["SW power cap", "other (0x1000)"]


def test_a_card_that_reports_some_fields_as_n_a_still_has_its_clock_read():
    lines = [HEADER, "5.0,2026/12/04 18:01:36.887, 1755, 1980, 650.00, [N/A], 62, 100, [N/A]",
             "6.0,2026/12/04 18:01:37.387, [N/A], 1980, 650.00, [N/A], 62, 100, 0x0"]
    samples = gpuclock.read_samples(lines)
    assert len(samples) == 1 and samples[0]["enforced.power.limit"] is None and samples[0]["reasons"] is None
    row = gpuclock.compare(samples, {"records": [{"variant": "v", "median_ms": 1.0, "started_at": 0, "ended_at": 6}]})[0]
    assert (row["sm_mhz"], row["power_w"], row["power_limit_w"], row["reasons"]) == (1755, 650.0, None, {"not sampled": 1.0})
    assert gpuclock.read_samples([]) == []


def test_the_reader_prints_each_variants_clock(tmp_path, capsys):
    csv, result = tmp_path / "gpu.csv", tmp_path / "result.json"
    csv.write_text("\n".join([HEADER, *(_line(t, 1740, 693.3, "0x0000000000000004") for t in range(4))]) + "\n")
    result.write_text(json.dumps({"workload": "gpt2", "records": [
        {"variant": "callback", "median_ms": 35.55, "started_at": 0.0, "ended_at": 3.0},
        {"variant": "eager_end", "median_ms": 44.0, "started_at": 50.0, "ended_at": 60.0}]}))
    gpuclock.main([str(csv), str(result)])
    printed = capsys.readouterr().out
    assert ("callback       median 35.55 ms, SM clock 1740 MHz (lowest 1740, top 1980), power 693 W of 700; "
            "reasons: SW power cap 100%; 2 samples") in printed
    assert "eager_end      no samples in its span" in printed
