"""The dashboard as a user sees it: a real TensorBoard server over a real run's log dir."""

import csv
import glob
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from compile_callback import CompileCallback
from tests.conftest import BreakingBlock, TinyModel, loader, make_trainer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read().decode())


def _fit(tmp_path, loggers):
    callback = CompileCallback(["blocks.*"], backend="eager", eager_baseline_steps=3, warmup_steps=1, log_every_n_steps=2)
    trainer = make_trainer(tmp_path, [callback], logger=loggers, max_epochs=2)
    trainer.fit(TinyModel(block=BreakingBlock), loader())
    return callback, trainer


@pytest.mark.slow
def test_tensorboard_server_shows_tags_layout_and_report(tmp_path):
    _fit(tmp_path, TensorBoardLogger(str(tmp_path), name="tb"))
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path / "tb"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        runs = None
        while time.monotonic() < deadline:
            try:
                runs = _get(f"{base}/data/runs")
                if runs:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert runs, "TensorBoard did not come up or found no runs"
        scalar_tags = _get(f"{base}/data/plugin/scalars/tags")
        tags = set().union(*(set(t) for t in scalar_tags.values()))
        for tag in ("compile/speedup", "compile/graphs", "compile/graph_breaks", "compile/recompiles", "compile/compile_time_s"):
            assert tag in tags
        run = runs[0]
        layout = _get(f"{base}/data/plugin/custom_scalars/layout")
        categories = {category["title"] for category in layout.get("category", [])}
        assert "compile" in categories
        text_tags = _get(f"{base}/data/plugin/text/tags")
        assert "compile/report/text_summary" in text_tags[run]
        texts = _get(f"{base}/data/plugin/text/text?run={run}&tag=compile/report/text_summary")
        assert "Graph breaks" in texts[-1]["text"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_several_loggers_get_scalars_and_only_tensorboard_gets_views(tmp_path):
    callback, trainer = _fit(tmp_path, [TensorBoardLogger(str(tmp_path), name="tb"), CSVLogger(str(tmp_path), name="csv")])
    csv_files = glob.glob(str(tmp_path / "csv" / "**" / "metrics.csv"), recursive=True)
    assert csv_files
    with open(csv_files[0]) as handle:
        header = next(csv.reader(handle))
    assert "compile/speedup" in header and "compile/graphs" in header
    assert os.path.exists(os.path.join(trainer.loggers[0].log_dir, "compile_report.json"))


def test_logger_false_still_reports(tmp_path):
    callback, _ = _fit(tmp_path, False)
    assert callback.last_report["summary"]["graph_breaks"] > 0
    assert os.path.exists(tmp_path / "compile_report.json")
