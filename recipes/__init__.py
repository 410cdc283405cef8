"""Training recipes for the CompileCallback: a byte-level GPT and a torchvision classifier, run from YAML.

    python -m recipes configs/gpt_tiny.yaml trainer.max_steps=300 callback.backend=aot_eager

Modules: ``config`` (the schema and loading), ``gpt`` and ``cv`` (model and data of each task),
``optim`` (AdamW), ``train`` (Trainer, callback, fit), ``__main__`` (the command line).
"""

from recipes.config import ConfigError, load_config
from recipes.train import run, train

__all__ = ["ConfigError", "load_config", "run", "train"]
