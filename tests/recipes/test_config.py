"""The schema: every config in configs/ validates, bad values fail naming the key, the callback section
mirrors CompileCallback's arguments."""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os

import pytest

from compile_callback import CompileCallback
from recipes.__main__ import main
from recipes.config import CallbackConfig, ConfigError, CVRecipeConfig, GPTRecipeConfig, load_config, to_dict
from recipes.train import build_callback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
GPT_TINY = os.path.join(ROOT, "configs", "gpt_tiny.yaml")


def test_configs_exist():
    names = {os.path.basename(path) for path in CONFIGS}
    expected = {"gpt_tiny.yaml", "gpt_tiny_varlen.yaml", "cv_tiny.yaml", "gpt2_124m.yaml", "gpt2_124m_varlen.yaml"}
    assert expected | {"resnet18_cifar.yaml", "resnet50.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_config_loads_validates_and_builds_its_callback(path):
    config = load_config(path)
    assert isinstance(config, (GPTRecipeConfig, CVRecipeConfig))
    assert config.name == os.path.splitext(os.path.basename(path))[0]
    assert config.run_dir == os.path.join("runs", config.name)
    assert isinstance(build_callback(config), CompileCallback)
    with open(path) as handle:
        first_line = handle.readline()
    assert first_line.startswith(f"# python -m recipes configs/{os.path.basename(path)}"), first_line
    if config.trainer.precision != "32-true":
        assert "CUDA" in first_line, "GPU configs say so in the command line that opens them"


def test_callback_config_mirrors_compile_callback_arguments():
    parameters = {
        name: parameter.default
        for name, parameter in inspect.signature(CompileCallback.__init__).parameters.items()
        if name != "self"
    }
    fields = {
        field.name: field.default if field.default is not dataclasses.MISSING else field.default_factory()
        for field in dataclasses.fields(CallbackConfig)
    }
    missing = sorted(set(parameters) - set(fields))
    extra = sorted(set(fields) - set(parameters))
    assert not missing and not extra, (
        f"recipes.config.CallbackConfig must have one field per CompileCallback argument: add {missing}, "
        f"remove {extra} (same name and default)."
    )
    assert fields == parameters
    from compile_callback.config import CompileConfig  # the checked copy the callback keeps: same defaults

    assert {field.name: field.default for field in dataclasses.fields(CompileConfig)} == parameters


def test_overrides_replace_values_and_parse_lists():
    config = load_config(GPT_TINY, ["trainer.max_steps=7", "callback.regions=[transformer.h.*,lm_head]", "run_dir=/x"])
    assert config.trainer.max_steps == 7
    assert config.callback.regions == ["transformer.h.*", "lm_head"]
    assert config.run_dir == "/x"
    assert to_dict(config)["callback"]["regions"] == ["transformer.h.*", "lm_head"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.max_step=5"], r"config key 'trainer.max_step' is not known; did you mean 'max_steps'\? Known keys under 'trainer': max_steps, "),
        (["model.n_layer=abc"], r"config key 'model.n_layer' must be int; got 'abc'"),
        (["optim.betas=[0.9,x]"], r"config key 'optim.betas\[1\]' must be float; got 'x'"),
        (["callback.dynamic=maybe"], r"config key 'callback.dynamic' must be bool or null; got 'maybe'"),
        (["colour=red"], r"config key 'colour' is not known. Known keys at the top level: name, task, "),
        (["model.arch=resnet18"], r"config key 'model.arch' is not known. Known keys under 'model': n_layer, "),
        (["trainer=5"], r"config is not valid: .* must be a mapping of keys"),
        (["task=audio"], r"config key 'task' must be one of 'gpt', 'cv'; got 'audio'"),
        (["data.mode=ragged"], r"config key 'data.mode' must be one of 'fixed', 'varlen'; got 'ragged'"),
        (["data.seq_len=65"], r"config key 'data.seq_len' \(65\) must be at most 'model.block_size' \(64\)"),
        (["model.n_head=3"], r"config key 'model.n_embd' \(64\) must be a multiple of 'model.n_head' \(3\)"),
        (["model.vocab_size=100"], r"config key 'model.vocab_size' must be at least 256"),
        (["data.val_fraction=1.5"], r"config key 'data.val_fraction' must be between 0 and 1"),
        (["trainer.matmul_precision=fast"], r"config key 'trainer.matmul_precision' must be one of 'highest', 'high', 'medium'"),
        (["trainer.val_check_interval=often"], r"config key 'trainer.val_check_interval' must be a number of batches"),
        (["trainer.max_steps=-1"], r"config needs 'trainer.max_steps' or 'trainer.max_epochs'"),
        (["trainer.max_steps"], r"override 'trainer.max_steps' must be key=value"),
        (["optim.warmup_steps=-5"], r"config key 'optim.warmup_steps' must be at least 0; got -5"),
        (
            ["optim.fused=true", "trainer.precision=bf16-mixed"],
            r"config key 'trainer.gradient_clip_val' cannot be set with optim.fused=true under precision 'bf16-mixed'",
        ),
    ],
)
def test_bad_overrides_fail_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GPT_TINY, overrides)


def test_cv_values_are_checked(tmp_path):
    cv_tiny = os.path.join(ROOT, "configs", "cv_tiny.yaml")
    with pytest.raises(ConfigError, match=r"config key 'data.source' must be 'synthetic' or a folder"):
        load_config(cv_tiny, [f"data.source={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match=r"config key 'data.max_size' \(8\) must be at least 'data.min_size' \(24\)"):
        load_config(cv_tiny, ["data.variable_sizes=true", "data.max_size=8"])


def test_unparsable_yaml_and_override(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("task: gpt\nmodel: [1,\n")
    with pytest.raises(ConfigError, match=r"config file '.*broken.yaml' is not valid YAML: .*line"):
        load_config(str(broken))
    with pytest.raises(ConfigError, match=r"overrides \['callback.regions=\[a,'\] cannot be parsed"):
        load_config(GPT_TINY, ["callback.regions=[a,"])


def test_missing_file_and_non_mapping_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope.yaml' not found"):
        load_config(str(tmp_path / "nope.yaml"))
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"must hold a mapping of keys"):
        load_config(str(listing))


def test_callback_refusal_names_the_callback_section():
    config = load_config(GPT_TINY, ["callback.mode=fast"])
    with pytest.raises(ConfigError, match=r"config section 'callback': `mode` must be one of"):
        build_callback(config)


def test_callback_disabled_builds_none():
    assert build_callback(load_config(GPT_TINY, ["callback_enabled=false"])) is None


def test_command_line_prints_config_and_reports_errors(capsys):
    assert main([GPT_TINY, "model.n_layer=3", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("name: gpt_tiny\n")
    assert "n_layer: 3" in printed
    assert main([GPT_TINY, "trainer.max_step=5"]) == 2
    assert "error: config key 'trainer.max_step' is not known" in capsys.readouterr().err


def test_trainer_strategy_reaches_the_trainer(tmp_path):
    """`trainer.strategy=ddp trainer.devices=2` is how a recipe runs on several devices (here CPU processes)."""
    from lightning.pytorch.strategies import DDPStrategy

    from recipes.train import build_trainer

    config = load_config(GPT_TINY, ["trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu",
                                    f"run_dir={tmp_path}"])
    trainer = build_trainer(config, None)
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.num_devices == 2
