"""The recipe schema: what a YAML in ``configs/`` may say, with types and defaults.

A config is loaded from YAML, merged with ``key=value`` overrides (omegaconf dotlist) and checked
against these dataclasses through ``OmegaConf.structured``, so a misspelled key or a value of the wrong
type fails before anything is built, with a message that names the key:

    config key 'trainer.max_step' is not known; did you mean 'max_steps'? Known keys under 'trainer': ...
    config key 'model.n_layer' must be int; got 'abc'.

Two recipes share the top level and differ in ``model`` and ``data``: ``task: gpt`` (a byte-level GPT)
and ``task: cv`` (a torchvision classifier). Union types are avoided (``Any`` plus a check instead)
because omegaconf 2.3 does not support them in structured configs.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

TASKS = ("gpt", "cv")
GPT_DATA_MODES = ("fixed", "varlen")
MATMUL_PRECISIONS = ("highest", "high", "medium")
MIXED_PRECISIONS = ("16-mixed", "bf16-mixed")
IGNORE_INDEX = -100  # label of a position that takes no part in the loss (padding)


class ConfigError(ValueError):
    """A config that cannot be run: the message names the key, what was expected and how to fix it."""


# -- model and data, per task ------------------------------------------------------------------------
@dataclass
class GPTModelConfig:
    """A decoder-only transformer over bytes (nanoGPT layout; GPT-2 124M is 12/12/768/1024)."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 64
    dropout: float = 0.0
    # Bytes need 256 ids; the GPT-2 benchmark shape uses 50304 (50257 padded), of which bytes use the
    # first 256. The model pads this up to a multiple of 64 either way.
    vocab_size: int = 256


@dataclass
class GPTDataConfig:
    """Byte-level text: the files of ``sources``, cut into fixed windows or variable-length chunks."""

    # Files or folders; empty means the Python standard library's own .py files (always present, no
    # download). Folders are searched recursively for ``pattern``.
    sources: List[str] = field(default_factory=list)
    pattern: str = "*.py"
    max_bytes: int = 1_000_000  # read at most this much text (files in sorted order)
    mode: str = "fixed"  # "fixed": windows of seq_len; "varlen": chunks of min_len..max_len
    seq_len: int = 64
    min_len: int = 16
    max_len: int = 64
    val_fraction: float = 0.1
    batch_size: int = 16
    num_workers: int = 0


@dataclass
class CVModelConfig:
    """Any torchvision classification model, built without weights (nothing is downloaded)."""

    arch: str = "resnet18"
    num_classes: int = 10
    channels_last: bool = False


@dataclass
class CVDataConfig:
    """Images from an ImageFolder, or synthetic ones; of one size, or of sizes that change per batch."""

    source: str = "synthetic"  # "synthetic" or the path of an ImageFolder (one folder per class)
    image_size: int = 32
    variable_sizes: bool = False  # heights and widths drawn from min_size..max_size in size_step steps
    min_size: int = 24
    max_size: int = 40
    size_step: int = 8
    num_samples: int = 2048  # synthetic only
    val_fraction: float = 0.1
    batch_size: int = 32
    num_workers: int = 0


# -- shared sections -----------------------------------------------------------------------------------
@dataclass
class OptimConfig:
    """AdamW; weight decay on matrices and embeddings only (nanoGPT's grouping)."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    fused: Optional[bool] = None  # None: fused AdamW when the parameters are on CUDA
    warmup_steps: int = 0  # the learning rate rises linearly to `lr` over this many steps (0: from the start)


@dataclass
class TrainerConfig:
    """The ``lightning.Trainer`` arguments a recipe sets; the rest keep Lightning's defaults."""

    max_steps: int = -1
    max_epochs: Optional[int] = None
    precision: str = "32-true"
    accelerator: str = "auto"
    devices: Any = "auto"  # "auto", a count, or a list of device indices
    strategy: str = "auto"  # Lightning's strategy name ("auto", "ddp", "fsdp", ...) or "model_parallel" (FSDP2, GPT)
    log_every_n_steps: int = 50
    val_check_interval: Any = None  # int: every N training batches; float: fraction of an epoch
    limit_val_batches: Any = 1.0  # int: that many batches; float: fraction of the val set
    num_sanity_val_steps: int = 2
    gradient_clip_val: Optional[float] = None
    enable_checkpointing: bool = True
    enable_progress_bar: bool = True
    # "high" lets float32 matmuls use TF32 on Ampere and later GPUs; "highest" is torch's default.
    matmul_precision: str = "highest"
    # cuDNN's attention kernel builds an execution plan per sequence length: with lengths that change
    # every batch it made an H200 GPT-2 step 173 ms instead of 45 ms. False leaves flash attention.
    cudnn_attention: bool = True


@dataclass
class CallbackConfig:
    """Keyword arguments of ``compile_callback.CompileCallback``, one field each, same defaults.

    ``tests/recipes/test_config.py`` checks that these fields match ``CompileCallback.__init__``; when
    the callback gains an argument, add it here with the same name and default.
    """

    regions: Any = "auto"  # "auto", "model", or a list of submodule names / glob patterns
    backend: str = "inductor"
    mode: str = "auto"
    fullgraph: bool = False
    dynamic: Optional[bool] = None
    options: Optional[Dict[str, Any]] = None
    eager_baseline_steps: int = 10
    warmup_steps: int = 3
    trial_steps: int = 20
    min_speedup: float = 1.03
    max_trials: int = 6
    verify: bool = True
    verify_tolerance: Optional[float] = None  # None: chosen by dtype
    on_recompile: str = "warn"  # "warn", "pad", "dynamic", "eager" or "raise"
    max_recompiles_per_epoch: int = 4
    pad: Any = None  # None (off), "auto", "max", or a list of sizes (bucket edges)
    pad_max_buckets: int = 8
    pad_multiple: int = 8
    pad_short_batch: str = "keep"  # "keep" or "pad"
    cache_dir: Optional[str] = None  # warm restarts: plan (JSON) and Inductor caches kept here
    log_every_n_steps: Optional[int] = None
    report: bool = True
    anatomy: Optional[bool] = None  # sample steps under torch.profiler (graph coverage, fallbacks, guards); None: CPU only
    background_compile: Optional[bool] = None  # compile candidates in a child process first; None: where it pays


@dataclass
class RecipeConfig:
    """What every recipe has; :class:`GPTRecipeConfig` and :class:`CVRecipeConfig` add model and data."""

    name: str = ""  # empty: the config file's name without .yaml
    task: str = "gpt"
    seed: int = 1337
    run_dir: Optional[str] = None  # None: runs/<name>
    callback_enabled: bool = True  # False: no CompileCallback, a plain eager run to compare against
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    callback: CallbackConfig = field(default_factory=CallbackConfig)


@dataclass
class GPTRecipeConfig(RecipeConfig):
    task: str = "gpt"
    model: GPTModelConfig = field(default_factory=GPTModelConfig)
    data: GPTDataConfig = field(default_factory=GPTDataConfig)


@dataclass
class CVRecipeConfig(RecipeConfig):
    task: str = "cv"
    model: CVModelConfig = field(default_factory=CVModelConfig)
    data: CVDataConfig = field(default_factory=CVDataConfig)


SCHEMAS: dict[str, type[RecipeConfig]] = {"gpt": GPTRecipeConfig, "cv": CVRecipeConfig}


# -- loading -----------------------------------------------------------------------------------------
def load_config(path: str, overrides: Sequence[str] = ()) -> RecipeConfig:
    """Loads a recipe config from YAML, applies ``key=value`` overrides and validates the result.

    Args:
        path: a YAML file such as ``configs/gpt_tiny.yaml``.
        overrides: omegaconf dotlist entries, e.g. ``["trainer.max_steps=10", "callback.backend=eager"]``.

    Returns:
        A :class:`GPTRecipeConfig` or :class:`CVRecipeConfig` (plain dataclasses), with ``name`` and
        ``run_dir`` filled in.

    Raises:
        ConfigError: a missing file, an override that is not ``key=value``, an unknown key, a value of
            the wrong type or out of range; the message names the key and what it must be.

    Example:
        >>> config = load_config("configs/gpt_tiny.yaml", ["trainer.max_steps=20"])
        >>> config.model.n_layer
        2
    """
    if not os.path.isfile(path):
        found = sorted(os.listdir("configs")) if os.path.isdir("configs") else []
        hint = f" Configs in configs/: {', '.join(found)}." if found else ""
        raise ConfigError(f"config file {path!r} not found.{hint}")
    for override in overrides:
        if "=" not in override or override.startswith("="):
            raise ConfigError(
                f"override {override!r} must be key=value, e.g. trainer.max_steps=10 or callback.backend=eager."
            )
    try:
        from_file = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as error:
        raise ConfigError(f"config file {path!r} is not valid YAML: {' '.join(str(error).split())}") from error
    try:
        from_overrides = OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as error:
        raise ConfigError(
            f"overrides {list(overrides)!r} cannot be parsed: {' '.join(str(error).split())}. "
            f"Lists are written [a,b]; quote values with spaces."
        ) from error
    if not isinstance(from_file, DictConfig):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys (task:, model:, ...); got a list.")

    task = from_overrides.get("task", from_file.get("task"))
    if task not in TASKS:
        raise ConfigError(f"config key 'task' must be one of {', '.join(map(repr, TASKS))}; got {task!r}.")
    schema_class = SCHEMAS[task]
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema_class), from_file, from_overrides)
    except ConfigKeyError as error:
        raise ConfigError(_unknown_key_message(error, schema_class)) from error
    except ValidationError as error:
        raise ConfigError(_wrong_type_message(error, schema_class)) from error
    config: RecipeConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]

    if not config.name:
        config.name = os.path.splitext(os.path.basename(path))[0]
    if not config.run_dir:
        config.run_dir = os.path.join("runs", config.name)
    check_values(config)
    return config


def to_dict(config: RecipeConfig) -> dict[str, Any]:
    """The config as plain nested dicts, in reading order (for hyperparameters and ``--print-config``)."""
    values = dataclasses.asdict(config)
    order = ["name", "task", "seed", "run_dir", "callback_enabled", "model", "data", "optim", "trainer", "callback"]
    return {key: values[key] for key in sorted(values, key=lambda k: order.index(k) if k in order else len(order))}


def check_values(config: RecipeConfig) -> None:
    """Checks ranges and choices that types alone cannot express.

    Raises:
        ConfigError: the first value out of range, naming its key.
    """
    _at_least(config, "seed", minimum=0)
    trainer = config.trainer
    if trainer.max_steps == -1 and trainer.max_epochs is None:
        raise ConfigError(
            "config needs 'trainer.max_steps' or 'trainer.max_epochs'; both are unset. "
            "Set e.g. trainer.max_steps=200."
        )
    _one_of("trainer.matmul_precision", trainer.matmul_precision, MATMUL_PRECISIONS)
    _at_least(config, "trainer.log_every_n_steps", minimum=1)
    for key in ("trainer.val_check_interval", "trainer.limit_val_batches"):
        value = _get(config, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ConfigError(
                f"config key {key!r} must be a number of batches (int) or a fraction (float); got {value!r}."
            )
    if config.optim.fused and trainer.gradient_clip_val and trainer.precision in MIXED_PRECISIONS:
        raise ConfigError(
            f"config key 'trainer.gradient_clip_val' cannot be set with optim.fused=true under precision "
            f"{trainer.precision!r}: Lightning refuses to clip the gradients of a fused optimizer under mixed "
            f"precision. Set trainer.gradient_clip_val=null, or optim.fused=false (or null: fused unless clipping)."
        )
    _at_least(config, "optim.lr", minimum=0.0)
    _at_least(config, "optim.warmup_steps", minimum=0)
    if len(config.optim.betas) != 2:
        raise ConfigError(
            f"config key 'optim.betas' must be two numbers, e.g. [0.9, 0.95]; got {config.optim.betas!r}."
        )

    data = config.data
    _at_least(config, "data.batch_size", minimum=1)
    _at_least(config, "data.num_workers", minimum=0)
    if not 0.0 < data.val_fraction < 1.0:
        raise ConfigError(f"config key 'data.val_fraction' must be between 0 and 1; got {data.val_fraction!r}.")

    if isinstance(config, GPTRecipeConfig):
        model, data = config.model, config.data
        for key in ("model.n_layer", "model.n_head", "model.n_embd", "model.block_size", "model.vocab_size"):
            _at_least(config, key, minimum=1)
        if model.n_embd % model.n_head:
            raise ConfigError(
                f"config key 'model.n_embd' ({model.n_embd}) must be a multiple of 'model.n_head' ({model.n_head})."
            )
        if model.vocab_size < 256:
            raise ConfigError(
                f"config key 'model.vocab_size' must be at least 256 (one id per byte); got {model.vocab_size}."
            )
        _one_of("data.mode", data.mode, GPT_DATA_MODES)
        _at_least(config, "data.max_bytes", minimum=1)
        if data.mode == "fixed":
            _at_least(config, "data.seq_len", minimum=1)
            _at_most_block_size("data.seq_len", data.seq_len, model.block_size)
        else:
            _at_least(config, "data.min_len", minimum=1)
            if data.max_len < data.min_len:
                raise ConfigError(
                    f"config key 'data.max_len' ({data.max_len}) must be at least 'data.min_len' ({data.min_len})."
                )
            _at_most_block_size("data.max_len", data.max_len, model.block_size)
    elif isinstance(config, CVRecipeConfig):
        _at_least(config, "model.num_classes", minimum=1)
        _at_least(config, "data.image_size", minimum=1)
        _at_least(config, "data.num_samples", minimum=2)
        if data.variable_sizes:
            _at_least(config, "data.min_size", minimum=1)
            _at_least(config, "data.size_step", minimum=1)
            if data.max_size < data.min_size:
                raise ConfigError(
                    f"config key 'data.max_size' ({data.max_size}) must be at least 'data.min_size' ({data.min_size})."
                )
        if data.source != "synthetic" and not os.path.isdir(data.source):
            raise ConfigError(
                f"config key 'data.source' must be 'synthetic' or a folder of class folders (ImageFolder); "
                f"{data.source!r} is not a folder."
            )


# -- messages ----------------------------------------------------------------------------------------
def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _schema_at(schema_class: type, path: list[str]) -> type | None:
    """The dataclass at ``path`` (section names) under ``schema_class``, or None if it is not one."""
    current: Any = schema_class
    for name in path:
        hints = typing.get_type_hints(current) if dataclasses.is_dataclass(current) else {}
        if name not in hints:
            return None
        current = hints[name]
    return current if dataclasses.is_dataclass(current) else None


def _unknown_key_message(error: ConfigKeyError, schema_class: type) -> str:
    full_key = str(error.full_key or error.key or "?")
    *section, key = full_key.split(".")
    section_class = _schema_at(schema_class, section)
    if section_class is None:
        return f"config key {full_key!r} is not known: {_first_line(error)}"
    known = [f.name for f in dataclasses.fields(section_class)]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    where = f"under {'.'.join(section)!r}" if section else "at the top level"
    return f"config key {full_key!r} is not known{hint} Known keys {where}: {', '.join(known)}."


def _wrong_type_message(error: ValidationError, schema_class: type) -> str:
    full_key = error.full_key
    if not full_key:
        return f"config is not valid: {_first_line(error)}. A section such as 'trainer' must be a mapping of keys."
    # "optim.betas[1]" -> the field "optim.betas"; its element type is what was expected.
    field_key = str(full_key).split("[")[0]
    *section, name = field_key.split(".")
    section_class = _schema_at(schema_class, section)
    expected = None
    if section_class is not None:
        hint = typing.get_type_hints(section_class).get(name)
        if hint is not None:
            if "[" in str(full_key) and typing.get_origin(hint) in (list, List):
                hint = typing.get_args(hint)[0]
            expected = _type_name(hint)
    if expected is None:
        return f"config key {full_key!r} has a value of the wrong type: {_first_line(error)}."
    return f"config key {full_key!r} must be {expected}; got {error.value!r}."


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, List):
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin in (dict, Dict):
        return "a mapping"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of keys ({', '.join(f.name for f in dataclasses.fields(hint))})"
    return getattr(hint, "__name__", str(hint))


def _get(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def _at_least(config: RecipeConfig, key: str, *, minimum: float) -> None:
    value = _get(config, key)
    if value < minimum:
        raise ConfigError(f"config key {key!r} must be at least {minimum}; got {value!r}.")


def _one_of(key: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"config key {key!r} must be one of {', '.join(map(repr, choices))}; got {value!r}.")


def _at_most_block_size(key: str, value: int, block_size: int) -> None:
    if value > block_size:
        raise ConfigError(
            f"config key {key!r} ({value}) must be at most 'model.block_size' ({block_size}): the model has "
            f"no position embedding beyond it. Raise model.block_size or lower {key}."
        )
