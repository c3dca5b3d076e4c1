"""Run configuration: the schema (rlvr.schema) and its loading.

A config is built in one order, each layer holding only changes to the one before:
dataclass defaults -> preset (`rlvr.presets.PRESETS`) -> the built-in model's sizes (only
for rlvr-tiny) -> YAML file -> `--section.key=value`; `rlvr config show` prints the result.
Values are coerced to the field types; unknown keys and bad values fail before any work,
naming the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from rlvr.code_data import resolve_code_preset
from rlvr.presets import (
    PRESETS,
    TINY_DEFAULTS,
    TINY_PRESET_DEFAULTS,
    TINY_TASK_DEFAULTS,
)
from rlvr.safe_yaml import load_yaml, read_text, show
from rlvr.schema import (  # noqa: F401 (re-exported: rlvr.config is the public module)
    SECTIONS,
    AlgoConfig,
    Config,
    ConfigError,
    CriticConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    field_docs,
)
from rlvr.trl_compat import SAME, alias, did_you_mean
from rlvr.validate import validate


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "none")


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Convert `value` (from YAML or a command-line string) to field type `tp`, or raise."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (
            isinstance(value, str) and value.lower() in ("none", "null", "")
        )
        if is_none and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value)
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"{key}: got {show(value)}, expected one of {', '.join(map(repr, args))}"
            )
        return value
    if origin is dict:
        if isinstance(value, str):
            try:
                value = load_yaml(value, key) if value.strip() else {}
            except ConfigError:
                raise ConfigError(f"{key}: got {show(value)}, expected a mapping") from None
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in value.items()
        ):
            raise ConfigError(f"{key}: got {show(value)}, expected a mapping of name -> settings")
        return {k: dict(v) for k, v in value.items()}
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: got {show(value)}, expected a list")
        return tuple(_coerce(key, args[0], v) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key}: got {show(value)}, expected true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key}: got {show(value)}, expected an integer")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key}: got {show(value)}, expected an integer") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key}: got {show(value)}, expected a number")
        try:
            number = float(value)
        except (ValueError, OverflowError):
            raise ConfigError(f"{key}: got {show(value)}, expected a number") from None
        if not math.isfinite(number):  # nan/inf (or 1e999) poison every step downstream
            raise ConfigError(f"{key}: got {show(value)}, expected a finite number")
        return number
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: got {show(value)}, expected a string")
        return str(value)
    raise ConfigError(f"{key}: unsupported field type {tp}")  # pragma: no cover


def _resolved_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _near(section: str, key: str, hints: dict[str, Any]) -> str:
    """ "; did you mean section.x?" for a near miss (in this section, else in another), or
    TRL's name for an rlvr key."""
    trl = alias(key)
    if trl is not None:
        return f"; {key} is TRL's name for {trl[0]}.{trl[1]}"
    close = difflib.get_close_matches(key, list(hints), n=1, cutoff=0.75)
    if close:
        return f"; did you mean {section}.{close[0]}?"
    every: dict[str, str] = {}
    for name in SECTIONS:
        for k in _resolved_types(type(getattr(Config(), name))):
            every.setdefault(k, f"{name}.{k}")  # optim.lr before critic.lr
    close = difflib.get_close_matches(key, list(every), n=1, cutoff=0.75)
    return f"; did you mean {every[close[0]]}?" if close else ""


def apply_changes(cfg: Config, changes: dict[str, Any], source: str) -> Config:
    """Apply a nested dict {section: {key: value}} (or {"preset": name}) to `cfg`."""
    if not isinstance(changes, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(changes).__name__}")
    for section, values in changes.items():
        if section == "preset":
            continue
        if section not in SECTIONS:
            raise ConfigError(
                f"{source}: unknown section {section!r}{did_you_mean(section, SECTIONS)}; "
                f"valid: {', '.join(SECTIONS)}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping of keys to values")
        sub = getattr(cfg, section)
        hints = _resolved_types(type(sub))
        updates = {}
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    f"{source}: unknown key {section}.{key}{_near(section, key, hints)}; "
                    f"valid keys of {section}: {', '.join(hints)}"
                )
            updates[key] = _coerce(f"{section}.{key}", hints[key], value)
        cfg = replace(cfg, **{section: replace(sub, **updates)})
    return cfg


def parse_overrides(args: list[str]) -> dict[str, dict[str, str]]:
    """`--algo.clip_high=0.28` (or `algo.clip_high=0.28`) -> {"algo": {"clip_high": "0.28"}}."""
    out: dict[str, dict[str, str]] = {}
    for arg in args:
        body = arg[2:] if arg.startswith("--") else arg
        key = body.split("=", 1)[0]
        if "=" in body and "." not in key and alias(key) is not None:  # TRL's name
            section, name, note = alias(key)
            print(note, file=sys.stderr)
            out.setdefault(section, {})[name] = body.split("=", 1)[1]
            continue
        if "=" not in body or "." not in key:
            raise ConfigError(
                f"override {arg!r}: expected --section.key=value{did_you_mean(key, SAME)}"
            )
        key, value = body.split("=", 1)
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | dict[str, dict[str, Any]] | None = None,
    *,
    preset: str | None = None,
    source: str = "command line",
) -> Config:
    """Defaults -> preset -> YAML file -> overrides, then `validate`. Raises ConfigError;
    an error in `overrides` names `source` (the Python API passes its own)."""
    file_changes: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        file_changes = load_yaml(read_text(path), str(path)) or {}
        if not isinstance(file_changes, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        file_changes = _trl_names(file_changes)
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    overrides = overrides or {}
    name = preset or overrides.get("preset") or file_changes.get("preset") or "dapo"
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    cfg = apply_changes(Config(preset=name), PRESETS[name], f"preset {name}")
    user = _merge(file_changes, overrides)
    if user.get("model", {}).get("name_or_path", "rlvr-tiny") == "rlvr-tiny":
        cfg = apply_changes(cfg, TINY_DEFAULTS, "built-in tiny model defaults")
        if name in TINY_PRESET_DEFAULTS:
            changes = TINY_PRESET_DEFAULTS[name]
            cfg = apply_changes(cfg, changes, f"built-in tiny model defaults for preset {name}")
        task = user.get("data", {}).get("task", cfg.data.task)
        if not user.get("data", {}).get("path") and task in TINY_TASK_DEFAULTS:
            changes = TINY_TASK_DEFAULTS[task]
            cfg = apply_changes(cfg, changes, f"built-in tiny model defaults for task {task}")
    if file_changes:
        cfg = apply_changes(cfg, file_changes, str(path))
    cfg = apply_changes(cfg, overrides, source)
    cfg = resolve_code_preset(cfg)  # humaneval's packaged file, the code reward
    validate(cfg)
    return cfg


def _trl_names(changes: dict[str, Any]) -> dict[str, Any]:
    """Top-level TRL names of a YAML file (`learning_rate: 1e-5`) moved to their rlvr keys,
    each with a one-line note."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        trl = alias(key) if not isinstance(value, dict) else None
        if trl is None:
            out[key] = value if not isinstance(value, dict) else dict(value)
            continue
        section, name, note = trl
        print(note, file=sys.stderr)
        out.setdefault(section, {})[name] = value
    return out


def _merge(a: dict, b: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in a.items()}
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def to_dict(cfg: Config) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    for sec in out.values():
        if isinstance(sec, dict):
            for k, v in sec.items():
                if isinstance(v, tuple):
                    sec[k] = list(v)
    return out


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def help_text(cfg: Config | None = None) -> str:
    """Every key with its value in `cfg` (the dataclass defaults when None), its type and
    documentation, for `rlvr train --help`; a value that differs from the dataclass default
    names that default too."""
    cfg = cfg or Config()
    lines = []
    for name in SECTIONS:
        cls = typing.get_type_hints(Config)[name]
        assert is_dataclass(cls)
        docs, hints, default = field_docs(cls), typing.get_type_hints(cls), cls()
        values = getattr(cfg, name)
        lines.append(f"{name}:")
        for f in fields(cls):
            value, base = getattr(values, f.name), getattr(default, f.name)
            note = "" if value == base else f" [schema default {base!r}]"
            lines.append(
                f"  --{name}.{f.name}={value!r}  ({_type_name(hints[f.name])}) "
                f"{docs.get(f.name, '')}{note}"
            )
    return "\n".join(lines)
