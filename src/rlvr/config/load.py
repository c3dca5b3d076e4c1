"""Run configuration: the schema (rlvr.config.schema) and its loading.

A config is built in one order, each layer holding only changes to the one before:
dataclass defaults -> preset (`rlvr.config.presets.PRESETS`) -> the built-in model's sizes (only
for rlvr-tiny) -> YAML file -> `--section.key=value`; `rlvr config show` prints the result.
Values are coerced to the field types; unknown keys and bad values fail before any work,
naming the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from rlvr.config.formats import resolve_code_format
from rlvr.config.names import SAME, alias, did_you_mean, nest, refuse_removed, renamed
from rlvr.config.objective import (
    OWN,
    declared,
    declared_names,
    import_objective,
    with_declared_defaults,
)
from rlvr.config.presets import (
    PRESETS,
    TINY_DEFAULTS,
    TINY_PRESET_DEFAULTS,
    TINY_TASK_DEFAULTS,
)
from rlvr.config.safe_yaml import load_yaml, read_text, show
from rlvr.config.schema import (
    REMOVED,
    RENAMED,
    SECTIONS,
    Config,
    ConfigError,
    field_docs,
)
from rlvr.config.validate import validate


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
    """Apply a nested dict {section: {key: value}} (or {"preset": name}) to `cfg`. A key of
    an engine's own section is `rollout.vllm.dtype`: {"rollout": {"vllm": {"dtype": v}}} or
    the dotted {"rollout": {"vllm.dtype": v}}."""
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
        cfg = replace(cfg, **{section: _apply(getattr(cfg, section), values, section, source)})
    return cfg


def _apply(sub: Any, values: dict[str, Any], where: str, source: str) -> Any:
    """`sub` (a section, or an engine's section `where` names) with `values` applied."""
    hints = _resolved_types(type(sub))
    updates: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        key = renamed(where, key)
        head, dot, rest = key.partition(".")
        if (where, head) in REMOVED:
            refuse_removed(where, head, {rest: value} if dot else value, source)
            continue
        if where == "algo" and not dot and (head not in hints or head == OWN):
            own = updates.setdefault(OWN, dict(getattr(sub, OWN)))
            own[head] = _own_setting(head, value, hints, source)
            continue
        if head not in hints or (dot and not is_dataclass(hints[head])):
            raise ConfigError(
                f"{source}: unknown key {where}.{key}{_near(where, key, hints)}; "
                f"valid keys of {where}: {', '.join(hints)}"
            )
        if not is_dataclass(hints[head]):
            updates[key] = _coerce(f"{where}.{key}", hints[key], value)
        elif dot:
            nested.setdefault(head, {})[rest] = value
        elif isinstance(value, dict):
            nested.setdefault(head, {}).update(value)
        else:
            raise ConfigError(
                f"{source}: {where}.{head}: got {show(value)}, expected a mapping of its keys "
                f"({', '.join(_resolved_types(hints[head]))})"
            )
    for head, inner in nested.items():
        updates[head] = _apply(getattr(sub, head), inner, f"{where}.{head}", source)
    return replace(sub, **updates)


def _own_setting(key: str, value: Any, hints: dict[str, Any], source: str) -> Any:
    """`algo.<key>` as an objective's own setting (`rlvr.config.objective`), coerced to its
    declared type; a key no registered objective declares is unknown."""
    found = declared(key) if key != OWN else None
    if found is None:
        every = {k: v for k, v in hints.items() if k != OWN} | dict.fromkeys(declared_names())
        raise ConfigError(
            f"{source}: unknown key algo.{key}{_near('algo', key, every)}; "
            f"valid keys of algo: {', '.join(every)}"
        )
    return _coerce(f"algo.{key}", found[2], value)


def flat_keys(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """A `to_dict` section with its engine sections spelled out as dotted keys ({"vllm":
    {"dtype": "auto"}} -> {"vllm.dtype": "auto"}) and old key names (`RENAMED`) as the new,
    for key-by-key comparisons of configs and of stored records."""
    hints = _resolved_types(type(getattr(Config(), section))) if section in SECTIONS else {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        key = RENAMED.get((section, key), key)
        if isinstance(value, dict) and key in hints and is_dataclass(hints[key]):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def parse_overrides(args: list[str]) -> dict[str, dict[str, str]]:
    """`--algo.clip_high=0.28` (or `algo.clip_high=0.28`, or TRL's `--epsilon_high=0.28`) ->
    {"algo": {"clip_high": "0.28"}}."""
    pairs, written = [], {}
    for arg in args:
        body = arg[2:] if arg.startswith("--") else arg
        key, eq, value = body.partition("=")
        if not eq:
            raise ConfigError(_not_an_override(arg, key))
        pairs.append((key, value))
        written[key] = arg
    return nest(pairs, lambda key: _not_an_override(written[key], key))


def _not_an_override(arg: str, key: str) -> str:
    return f"override {arg!r}: expected --section.key=value{did_you_mean(key, SAME)}"


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | dict[str, dict[str, Any]] | None = None,
    *,
    preset: str | None = None,
    source: str = "command line",
    check: bool = True,
) -> Config:
    """Defaults -> preset -> YAML file -> overrides, then `validate` (unless `check` is false:
    help text shows the values without judging them). Raises ConfigError; an error in
    `overrides` names `source` (the Python API passes its own). Every unknown key and bad value
    of the file, and of the overrides, is named at once."""
    file_changes: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        file_changes = load_yaml(read_text(path), str(path)) or {}
        if not isinstance(file_changes, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        file_changes = nest(file_changes.items(), lambda key: None)
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    overrides = overrides or {}
    name = preset or overrides.get("preset") or file_changes.get("preset") or "dapo"
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    cfg = apply_changes(Config(preset=name), PRESETS[name], f"preset {name}")
    user = _merge(file_changes, overrides)
    loss = user.get("algo", {}).get("loss") or PRESETS[name].get("algo", {}).get("loss")
    if isinstance(loss, str):  # a user's objective registers its own settings' keys
        import_objective(loss, tuple(user.get("reward", {}).get("python_path", ())))
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
        cfg = _apply_every(cfg, file_changes, str(path))
    cfg = _apply_every(cfg, overrides, source)
    cfg = resolve_code_format(cfg)  # humaneval's packaged file, the code reward
    if check:
        validate(cfg)
        cfg = with_declared_defaults(cfg)
    return cfg


def _apply_every(cfg: Config, changes: dict[str, Any], source: str) -> Config:
    """`apply_changes` key by key, so that a file with three mistakes names all three: one
    ConfigError, its message one line a mistake."""
    if not isinstance(changes, dict):
        return apply_changes(cfg, changes, source)
    errors: list[str] = []
    for section, values in changes.items():
        parts = values.items() if section in SECTIONS and isinstance(values, dict) else [None]
        for part in parts:
            one = {section: values} if part is None else {section: dict([part])}
            try:
                cfg = apply_changes(cfg, one, source)
            except ConfigError as e:
                errors.append(str(e))
    if len(errors) > 1:
        raise ConfigError(f"{len(errors)} errors:\n" + "\n".join(f"  {e}" for e in errors))
    if errors:
        raise ConfigError(errors[0])
    return cfg


def _merge(a: dict, b: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in a.items()}
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as nested plain values; an objective's own settings are keys of `algo`."""
    out = dataclasses.asdict(cfg)
    out["algo"].update(out["algo"].pop(OWN))
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
    names that default too. An engine's section lists its keys (`--rollout.vllm.dtype`)."""
    cfg = cfg or Config()
    lines = []
    for name in SECTIONS:
        cls = typing.get_type_hints(Config)[name]
        assert is_dataclass(cls)
        lines.append(f"{name}:")
        lines += _key_lines(name, cls, getattr(cfg, name))
    return "\n".join(lines)


def _key_lines(where: str, cls: type, values: Any) -> list[str]:
    docs, hints, default = field_docs(cls), typing.get_type_hints(cls), cls()
    lines = []
    for f in fields(cls):
        value, base = getattr(values, f.name), getattr(default, f.name)
        if where == "algo" and f.name == OWN:  # the objective's own keys, as set
            lines += [f"  --algo.{k}={v!r}  (loss {values.loss})" for k, v in value.items()]
            continue
        if is_dataclass(hints[f.name]):
            lines += _key_lines(f"{where}.{f.name}", hints[f.name], value)
            continue
        note = "" if value == base else f" [schema default {base!r}]"
        lines.append(
            f"  --{where}.{f.name}={value!r}  ({_type_name(hints[f.name])}) "
            f"{docs.get(f.name, '')}{note}"
        )
    return lines
