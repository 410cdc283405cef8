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
from compile_callback.telemetry import custom_scalars_layout
from tests.conftest import BreakingBlock, TinyModel, loader, make_trainer, read_layout, read_scalars, read_text


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
    tensorboard_dir, csv_dir = trainer.loggers[0].log_dir, trainer.loggers[1].log_dir
    # Both get the scalars, at the same steps and values.
    with open(os.path.join(csv_dir, "metrics.csv")) as handle:
        rows = list(csv.DictReader(handle))
    scalars = read_scalars(tensorboard_dir)
    for tag in ("compile/speedup", "compile/graphs", "compile/graph_breaks", "compile/region/blocks.N/graphs"):
        in_csv = [(int(row["step"]), float(row[tag])) for row in rows if row.get(tag)]
        assert in_csv and in_csv == [(step, pytest.approx(value)) for step, value in scalars[tag]], tag
    # Only TensorBoard gets the views: the custom-scalars layout (whole, once) and the Markdown report
    # (at each epoch's end and the end of fit). The CSV logger gets no column for them, no file of them.
    expected = {category: {chart: tags for chart, (_, tags) in charts.items()}
                for category, charts in custom_scalars_layout().items()}
    assert read_layout(tensorboard_dir) == [expected]
    texts = read_text(tensorboard_dir, "compile/report")
    assert len(texts) == 3 and "### Decisions" in texts[-1]
    assert not any("report" in column or "custom" in column for column in rows[0]), list(rows[0])
    assert sorted(os.listdir(csv_dir)) == ["metrics.csv"]
    assert glob.glob(str(tmp_path / "csv" / "**" / "events.out.tfevents.*"), recursive=True) == []
    with open(os.path.join(tensorboard_dir, "compile_report.json")) as handle:  # the report file, once, in the first logger's dir
        assert json.load(handle)["decisions"] == callback.last_report["decisions"]
    assert not os.path.exists(os.path.join(csv_dir, "compile_report.json"))


def test_logger_false_still_reports(tmp_path):
    callback, _ = _fit(tmp_path, False)
    assert callback.last_report["summary"]["graph_breaks"] > 0
    assert os.path.exists(tmp_path / "compile_report.json")
