"""The host clock that runs beside a benchmark (issue 19's after-effect): its readings and how a
variant's steps are set against them."""

from __future__ import annotations

import json

import pytest

from benchmarks.diagnostics import hostclock


def test_a_slower_variant_is_charged_to_the_host_only_as_far_as_the_clock_slowed():
    # eager ran 10 ms a step with the clock's probe at 5 ms; eager_end 13 ms with the probe at 6 ms:
    # the host slowed 1.2x, the steps 1.3x, so the process ran 1.3/1.2 slower than the host explains.
    result = {"records": [
        {"variant": "eager", "median_ms": 10.0, "started_at": 0.0, "ended_at": 10.0},
        {"variant": "callback", "median_ms": 5.0, "started_at": 10.0, "ended_at": 20.0},
        {"variant": "eager_end", "median_ms": 13.0, "started_at": 20.0, "ended_at": 30.0},
        {"variant": "old", "median_ms": 9.0},  # no wall times: not compared
    ]}
    samples = [{"t": t, "py_ms": 1.0, "ops_ms": 5.0 if t < 20 else 6.0} for t in range(30)]
    samples += [{"t": 2.0, "py_ms": 1.0, "ops_ms": 50.0}]  # before the eager span's tail: not in it
    rows = {row["variant"]: row for row in hostclock.compare(samples, result)}
    assert set(rows) == {"eager", "callback", "eager_end"}
    assert rows["eager"]["clock_samples"] == 6 and rows["eager"]["ops_ms"] == 5.0  # t = 5..10: the span's second half
    assert rows["eager_end"]["step_vs_eager"] == pytest.approx(1.3)
    assert rows["eager_end"]["clock_vs_eager"] == pytest.approx(1.2)
    assert rows["eager_end"]["process_over_host"] == pytest.approx(1.3 / 1.2)


def test_the_machines_busy_and_steal_shares_are_read_over_each_variants_whole_run():
    """/proc/stat's counters in each reading: a variant whose background child kept 12 of 16 cores busy, and the
    host withheld 1 in 16, reads busy 0.75 and steal 0.0625 over its whole run, its start-up included."""
    result = {"records": [
        {"variant": "eager", "median_ms": 7.0, "started_at": 0.0, "ended_at": 10.0},
        {"variant": "callback", "median_ms": 7.5, "started_at": 10.0, "ended_at": 20.0},
    ]}
    samples, busy, steal, every = [], 0, 0, 0
    for t in range(21):
        samples.append({"t": float(t), "py_ms": 1.0, "ops_ms": 5.0,
                        "jiffies": {"busy": busy, "steal": steal, "all": every}})
        loaded = t >= 10
        busy, steal, every = busy + (1200 if loaded else 100), steal + (100 if loaded else 0), every + 1600
    rows = {row["variant"]: row for row in hostclock.compare(samples, result)}
    assert rows["eager"]["busy"] == pytest.approx(100 / 1600) and rows["eager"]["steal"] == 0.0
    assert rows["callback"]["busy"] == pytest.approx(0.75) and rows["callback"]["steal"] == pytest.approx(0.0625)
    assert hostclock.cpu_shares(samples[:1], 0.0, 30.0) is None  # one reading: no share


def test_the_clock_writes_one_reading_per_sample_and_reads_them_back(tmp_path, capsys):
    clock, result = tmp_path / "clock.jsonl", tmp_path / "result.json"
    hostclock.main(["run", "--out", str(clock), "--interval", "0.05", "--seconds", "0.3"])
    samples = [json.loads(line) for line in clock.read_text().splitlines()]
    assert len(samples) >= 2 and all(s["py_ms"] > 0 and s["ops_ms"] > 0 for s in samples)
    assert all(s["jiffies"]["all"] >= s["jiffies"]["busy"] + s["jiffies"]["steal"] for s in samples)  # Linux
    result.write_text(json.dumps({"workload": "w", "records": [
        {"variant": "eager", "median_ms": 2.0, "started_at": samples[0]["t"] - 1, "ended_at": samples[-1]["t"] + 1}]}))
    hostclock.main(["read", str(clock), str(result)])
    printed = capsys.readouterr().out
    assert "eager" in printed and "step_vs_eager 1.000" in printed and "clock_vs_eager 1.000" in printed
