"""LightningCLI builds CompileCallback from YAML: its constructor takes plain typed values."""

import pytest
import yaml
from lightning.pytorch.cli import LightningCLI

from compile_callback import CompileCallback
from tests.conftest import TokenModel


def test_lightning_cli_builds_the_callback_from_yaml(tmp_path):
    config = {
        "trainer": {
            "accelerator": "cpu",
            "callbacks": [
                {
                    "class_path": "compile_callback.CompileCallback",
                    "init_args": {"regions": ["blocks.*"], "backend": "eager", "on_recompile": "pad",
                                  "pad": [16, 32], "pad_max_buckets": 2, "min_speedup": 1.05, "dynamic": False},
                }
            ],
        }
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(TokenModel, run=False, args=["--config", str(path)], save_config_callback=None)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, CompileCallback)]
    assert callback.regions == ["blocks.*"] and callback.pad == [16, 32] and callback.on_recompile == "pad"
    assert callback.min_speedup == 1.05 and callback.dynamic is False


def test_lightning_cli_reports_a_bad_value(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "compile_callback.CompileCallback", "init_args": {"mode": "fast"}}]}}))
    with pytest.raises(ValueError, match=r"`mode` must be one of .*got 'fast'"):
        LightningCLI(TokenModel, run=False, args=["--config", str(path)], save_config_callback=None)
