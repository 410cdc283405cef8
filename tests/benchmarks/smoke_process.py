"""The benchmark smoke run (``python -m benchmarks --smoke``, ~2 min on 2 cores) as a process started once
per test session, as soon as the tests that read it are collected (``tests/benchmarks/conftest.py``), so
it runs beside the rest of the suite instead of in front of its own tests; the fixture waits for it."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# ~2 min on 2 idle cores; past 600 s with two CPU-bound processes and a test run beside it (2026-12-01):
# the limit is for a hung run, not a slow machine.
TIMEOUT_S = 1500
_RUN: dict[str, Any] = {}


def start() -> None:
    """Starts the smoke run unless it has started. One intra-op thread: the tests beside it keep the other core."""
    if _RUN:
        return
    out = tempfile.mkdtemp(prefix="benchmarks-smoke-")
    log = open(os.path.join(out, "output.txt"), "w+")  # noqa: SIM115 -- read back and closed by finish()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "benchmarks", "--smoke", "--out", out], cwd=REPO, env=env,
                               stdout=log, stderr=subprocess.STDOUT, text=True)
    _RUN.update(out=out, log=log, process=process)
    atexit.register(_clean_up)


def _clean_up() -> None:
    """At the session's end: a run still going (an interrupted session) is stopped, its folder removed."""
    if _RUN["process"].poll() is None:
        _RUN["process"].kill()
        _RUN["process"].wait()
    _RUN["log"].close()
    shutil.rmtree(_RUN["out"], ignore_errors=True)


def finish() -> tuple[subprocess.CompletedProcess, str]:
    """Waits for the run (starting it if no test collected it) and returns it with its output folder."""
    start()
    process: subprocess.Popen = _RUN["process"]
    try:
        returncode = process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    log = _RUN["log"]
    log.seek(0)
    output = log.read()
    return subprocess.CompletedProcess(process.args, returncode, stdout=output, stderr=""), _RUN["out"]
