"""Command-line parsing shared by train.py and eval.py: fixed options plus one option per config key.

All user-input problems become ``InputError``/``ConfigError`` (one line, exit status 2, no traceback, via
``model_zoo.common.cli.run_main``), raised before MindSpore is imported and before anything is written.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict

from model_zoo.common.cli import OneLineArgumentParser, run_main

from .config import SCHEMA, parse_value

__all__ = ["ZooArgumentParser", "add_config_options", "config_overrides", "run_main"]

ZooArgumentParser = OneLineArgumentParser  # a bad command line is one line, exit status 2


def add_config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "config overrides",
        "every key of the YAML config can be set on the command line, e.g. --epoch_size=2 "
        "(lists: --split_indices=26,53; booleans: true/false). Defaults below are the built-in ones; "
        "the YAML file given by --config_path overrides them, and these options override the file.")
    for key, spec in SCHEMA.items():
        if key == "optimizer":
            continue  # a first-class option of train.py
        choices = f" {{{','.join(spec.choices)}}}" if spec.choices else ""
        default = ",".join(map(str, spec.default)) if isinstance(spec.default, list) else spec.default
        group.add_argument(f"--{key}", dest=f"cfg_{key}", metavar=spec.type.upper(), default=None,
                           help=f"{spec.help}{choices} [{spec.type}, default {default}]")


def config_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    out = {}
    for key in SCHEMA:
        text = getattr(args, f"cfg_{key}", None)
        if text is not None:
            out[key] = parse_value(key, text)
    return out
