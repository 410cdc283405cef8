"""Command line: ``python -m recipes CONFIG [key=value ...]``.

Examples:
    python -m recipes configs/gpt_tiny.yaml
    python -m recipes configs/cv_tiny.yaml trainer.max_steps=20 callback.regions=[net.layer1,net.layer2]
    python -m recipes configs/gpt_tiny.yaml callback_enabled=false      # the same run, eager
    python -m recipes configs/gpt_tiny.yaml --print-config               # the merged config, no run
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from omegaconf import OmegaConf

from recipes.config import ConfigError, load_config, to_dict
from recipes.train import train


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the command line, loads and validates the config, and trains (or prints the config).

    Returns:
        The exit status: 0 after a run, 2 for a config that cannot run (the message says why).
    """
    parser = argparse.ArgumentParser(
        prog="python -m recipes",
        description="Train a recipe from a YAML config, with CompileCallback configured from its 'callback' section.",
        epilog="Overrides are omegaconf dotlist entries, e.g. trainer.max_steps=20 callback.backend=aot_eager.",
    )
    parser.add_argument("config", help="a YAML file, e.g. configs/gpt_tiny.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="values that replace the YAML's")
    parser.add_argument("--print-config", action="store_true", help="print the merged, validated config and exit")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        if args.print_config:
            print(OmegaConf.to_yaml(to_dict(config)), end="")
            return 0
        train(config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
