"""The core-pairs diagnostic: a pinned loop's rate beside each other CPU busy, against its rate alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.diagnostics import corepairs


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_loop_is_timed_beside_each_other_cpu_and_all_and_a_cpu_it_may_not_use_is_refused():
    allowed = sorted(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    line = corepairs.probe(allowed[0], allowed[1:2], 0.05)
    os.sched_setaffinity(0, before)
    assert line["home"] == allowed[0] and list(line["beside_one"]) == [str(allowed[1])]
    # Ratios of rates: a loop beside a busy CPU runs at some positive share of its alone rate.
    assert all(0 < r < 5 for r in [*line["beside_one"].values(), line["beside_all"]])
    assert line["alone_median_per_s"] > 0 and line["alone_spread"] >= 0
    done = subprocess.run([sys.executable, "-m", "benchmarks.diagnostics.corepairs", "--home", str(max(allowed) + 1)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "is not a CPU this process may use" in done.stderr
    json.dumps(line)  # one JSON line
