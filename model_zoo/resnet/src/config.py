"""Configuration of the ResNet zoo: one typed schema, YAML files, command-line overrides.

Every key has a type, a default and a help line (``SCHEMA``). A YAML file may set any subset of the
keys; an unknown key or a value of the wrong type is a ``ConfigError`` naming the file, the key, the
expected type and the value. On the command line every key is also an option: ``--epoch_size=2`` or
``--epoch_size 2`` (lists as ``--split_indices=26,53``; booleans as ``true``/``false``).

This module imports no MindSpore, so bad input is refused in a fraction of a second, before anything
is built or written.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from model_zoo.common.cli import InputError

__all__ = ["ConfigError", "SCHEMA", "Key", "load_config", "parse_value", "format_config"]


class ConfigError(InputError):
    """A problem with the config or the command line: reported as one line, exit status 2, no traceback."""


@dataclass(frozen=True)
class Key:
    type: str            # "int", "float", "str", "bool", "int_list"
    default: Any
    help: str
    choices: Optional[tuple] = None
    minimum: Optional[float] = None  # inclusive lower bound for numbers


SCHEMA: Dict[str, Key] = {
    # network
    "net": Key("str", "resnet50", "architecture", ("resnet18", "resnet34", "resnet50", "resnet101")),
    "class_num": Key("int", 1001, "number of classes (1001 in MindSpore's ImageNet zoo, 1000 in torchvision)",
                     minimum=2),
    "width": Key("int", 64, "channels of the first stage (64 = the published network; small values for smoke tests)",
                 minimum=1),
    "stem": Key("str", "imagenet", "'imagenet' (7x7/2 conv + max pool) or 'cifar' (3x3/1 conv)",
                ("imagenet", "cifar")),
    # data
    "dataset": Key("str", "imagenet2012",
                   "data format: 'imagenet2012' (ImageFolder tree) or 'cifar10' (binary batches)",
                   ("imagenet2012", "cifar10")),
    "image_size": Key("int", 224, "side of the training/eval crop fed to the network", minimum=8),
    "batch_size": Key("int", 32, "images per device per step", minimum=1),
    "eval_batch_size": Key("int", 32, "images per step in eval", minimum=1),
    "num_parallel_workers": Key("int", 4, "data-pipeline worker threads", minimum=1),
    "steps_per_epoch": Key("int", 0, "0 = one pass over this rank's shard; N > 0 caps every epoch at N steps",
                           minimum=0),
    "dataset_sink_mode": Key("bool", True, "sink data to the device, callbacks once per epoch "
                             "(Ascend/GPU; CPU always trains step by step)"),
    # training
    "optimizer": Key("str", "thor", "'thor' or 'momentum'", ("thor", "momentum")),
    "epoch_size": Key("int", 45, "epochs to train", minimum=1),
    "momentum": Key("float", 0.9, "momentum", minimum=0.0),
    "weight_decay": Key("float", 5e-4, "weight decay", minimum=0.0),
    "loss_scale": Key("float", 128.0, "static loss scale (FixedLossScaleManager, drop_overflow_update=False)",
                      minimum=1.0),
    "label_smoothing": Key("float", 0.1, "label smoothing factor of the cross-entropy loss", minimum=0.0),
    "amp_level": Key("str", "auto", "'auto' (O2 on Ascend/GPU, O0 on CPU) or O0/O1/O2/O3",
                     ("auto", "O0", "O1", "O2", "O3")),
    "mode": Key("str", "graph", "MindSpore execution mode", ("graph", "pynative")),
    "seed": Key("int", 1, "seed of weights, data order and augmentation", minimum=0),
    # THOR schedule and settings
    "lr_init": Key("float", 0.05803, "THOR: lr = lr_init*(1-epoch/lr_end_epoch)^lr_decay", minimum=0.0),
    "lr_decay": Key("float", 4.0839, "THOR: exponent of the lr polynomial", minimum=0.0),
    "lr_end_epoch": Key("int", 53, "THOR: epoch where the lr polynomial reaches 0 (must be > epoch_size)", minimum=1),
    "decay_epochs": Key("int", 39, "THOR: lr halved from this epoch on, and again one epoch later", minimum=0),
    "damping_init": Key("float", 0.03, "THOR: damping = damping_init*damping_decay^(epoch/10)", minimum=0.0),
    "damping_decay": Key("float", 0.50036, "THOR: damping decay base", minimum=0.0),
    "frequency": Key("int", 834, "THOR: factors and inverses refreshed every `frequency` steps", minimum=2),
    "split_indices": Key("int_list", [26, 53], "THOR: all-reduce fusion split points (layer indices)"),
    "factor_convention": Key("str", "auto", "THOR: normalisation of the factors and damping: 'gpu'/'ascend' "
                             "(MindSpore's on that device), 'kfc', or 'auto' (by device; kfc on CPU)",
                             ("auto", "gpu", "ascend", "kfc")),
    "inverse": Key("str", "blocked", "THOR: 'blocked' (128-wide diagonal blocks of each factor, MindSpore's) or "
                   "'full' (whole-matrix inverses)", ("blocked", "full")),
    "trace_omega_1": Key("float", 0.0, "THOR's trace rule: re-invert a layer whose factors' trace changed by at "
                         "least this fraction; 0 with trace_omega_2 0 = the fixed schedule (trace_thresholds=None)",
                         minimum=0.0),
    "trace_omega_2": Key("float", 0.0, "THOR's trace rule: ... or by at least this fraction once its interval "
                         "(doubling) has passed; <= trace_omega_1", minimum=0.0),
    "distribute_inverses": Key("bool", False, "THOR, data parallel: each layer inverted by one rank, the inverses "
                               "shared (pays where inversion dominates, e.g. inverse 'full')"),
    # Momentum schedule
    "lr_schedule": Key("str", "cosine", "Momentum: 'cosine', 'linear' or 'poly' decay after warmup",
                       ("cosine", "linear", "poly")),
    "lr_max": Key("float", 0.1, "Momentum: peak learning rate", minimum=0.0),
    "lr_end": Key("float", 0.0, "Momentum: final learning rate", minimum=0.0),
    "warmup_epochs": Key("int", 0, "Momentum: linear warmup epochs from lr_end", minimum=0),
    # bookkeeping
    "log_interval": Key("int", 100, "print a progress line every N steps", minimum=1),
    "save_checkpoint_steps": Key("int", 5000, "write a checkpoint every N global steps (and always at the end)",
                                 minimum=1),
    "keep_checkpoint_max": Key("int", 10, "keep at most this many checkpoints per rank", minimum=1),
}

_TYPE_WORDS = {"int": "an int", "float": "a number", "str": "a string", "bool": "true or false",
               "int_list": "a list of ints"}


def _type_error(source: str, key: str, spec: Key, value: Any) -> ConfigError:
    return ConfigError(f"{source}: '{key}' must be {_TYPE_WORDS[spec.type]}, got {type(value).__name__} {value!r}")


def check_value(source: str, key: str, value: Any) -> Any:
    """Type- and range-check one already-parsed value; returns it normalised (float for floats)."""
    spec = SCHEMA[key]
    if spec.type == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(source, key, spec, value)
    elif spec.type == "float":
        # PyYAML reads 5e-4 (no dot) as a string; accept numeric strings for float keys only.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise _type_error(source, key, spec, value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(source, key, spec, value)
        value = float(value)
    elif spec.type == "str":
        if not isinstance(value, str):
            raise _type_error(source, key, spec, value)
    elif spec.type == "bool":
        if not isinstance(value, bool):
            raise _type_error(source, key, spec, value)
    elif spec.type == "int_list":
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise _type_error(source, key, spec, value)
        value = list(value)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{source}: '{key}' must be one of {', '.join(spec.choices)}, got {value!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"{source}: '{key}' must be >= {spec.minimum:g}, got {value!r}")
    return value


def parse_value(key: str, text: str) -> Any:
    """Parse a command-line string for ``key`` into its schema type (then range-checked)."""
    spec = SCHEMA[key]
    source = "command line"
    value: Any = text
    try:
        if spec.type == "int":
            value = int(text)
        elif spec.type == "float":
            value = float(text)
        elif spec.type == "bool":
            low = text.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            value = low in ("true", "1", "yes")
        elif spec.type == "int_list":
            value = [int(v) for v in text.replace("[", "").replace("]", "").split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{source}: --{key} must be {_TYPE_WORDS[spec.type]}, got {text!r}") from None
    return check_value(source, key, value)


def _parse_yaml(path: str, text: str) -> Any:
    """``yaml.safe_load`` that refuses a mapping with a repeated key (YAML itself lets the last win)."""
    import yaml  # the `examples` extra

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise ConfigError(f"config {path}: duplicated key '{key}' on line {line} "
                                          f"(first on line {seen[key]})")
                    seen[key] = line
                except TypeError:  # an unhashable key: PyYAML reports it below
                    continue
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"config {path}: not valid YAML ({first})") from None


def load_config(path: str, overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Defaults, then the YAML file at ``path``, then ``overrides`` (already parsed); checked."""
    if os.path.isdir(path):
        raise ConfigError(f"config path is a directory, not a config file: {path}")
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                          f"{exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot be read ({exc.strerror})") from None
    data = _parse_yaml(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: expected a mapping of key: value, got {type(data).__name__}")
    config = {key: (list(spec.default) if isinstance(spec.default, list) else spec.default)
              for key, spec in SCHEMA.items()}
    source = f"config {path}"
    for key, value in data.items():
        if key not in SCHEMA:
            raise ConfigError(f"{source}: unknown key '{key}' (known keys: see --help)")
        config[key] = check_value(source, key, value)
    for key, value in (overrides or {}).items():
        config[key] = value
    _check_consistency(config, source)
    return config


def _check_consistency(config: Dict[str, Any], source: str) -> None:
    if config["optimizer"] == "thor" and config["lr_end_epoch"] < config["epoch_size"]:
        raise ConfigError(f"{source}: 'lr_end_epoch' ({config['lr_end_epoch']}) must be >= 'epoch_size' "
                          f"({config['epoch_size']}): the THOR lr polynomial is undefined past it")
    indices: List[int] = config["split_indices"]
    if any(b <= a for a, b in zip(indices, indices[1:])) or any(i < 0 for i in indices):
        raise ConfigError(f"{source}: 'split_indices' must be increasing non-negative ints, got {indices}")


def format_config(config: Mapping[str, Any]) -> str:
    """One ``key: value`` per line, schema order (printed at the start of every run)."""
    return "\n".join(f"  {key}: {config[key]}" for key in SCHEMA)
