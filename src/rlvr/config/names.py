"""The names a config key may go by besides its own: TRL's `GRPOConfig` field names of the same
meaning and units (`learning_rate` is `optim.lr`), which `config=`, YAML files and the command
line take with a one-line note, the "did you mean" hint of an unknown name, and rlvr's own
renamed keys (`RENAMED`, noted once) and removed ones (`REMOVED`, refused unless at their old
default). The rest of TRL's names (those that map with a conversion, or not at all) are
`rlvr.api.trl`'s."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlvr.config.schema import REMOVED, RENAMED, ConfigError

# TRL field -> rlvr key, same meaning and units (also the aliases `config=` and the CLI take).
SAME: dict[str, str] = {
    "learning_rate": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "adam_beta1": "optim.beta1",
    "adam_beta2": "optim.beta2",
    "warmup_steps": "optim.warmup_steps",
    "max_grad_norm": "optim.max_grad_norm",
    "gradient_checkpointing": "optim.gradient_checkpointing",
    "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "beta": "algo.kl_coef",
    "epsilon": "algo.clip_low",
    "epsilon_high": "algo.clip_high",
    "delta": "algo.dual_clip",
    "num_iterations": "algo.mu",
    "mask_truncated_completions": "algo.overlong_filter",
    "importance_sampling_level": "algo.ratio",
    "off_policy_mask_threshold": "algo.off_policy_mask_threshold",
    "seed": "train.seed",
    "save_total_limit": "train.keep_checkpoints",
    "project": "train.project",
    "output_dir": "train.output_dir",
}


def did_you_mean(name: str, choices) -> str:
    """ "; did you mean X?" for a near miss among `choices`, else ""."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def alias(name: str) -> tuple[str, str, str] | None:
    """(section, key, note) when `name` is TRL's name for an rlvr key of the same meaning."""
    key = SAME.get(name)
    if key is None:
        return None
    section, rlvr_name = key.split(".")
    return section, rlvr_name, f"note: {name} is TRL's name for {key}"


def nest(pairs: Iterable[tuple[str, Any]], refuse: Callable[[str], str | None]) -> dict[str, Any]:
    """Config keys as a user writes them -> {section: {key: value}}: "section.key" (the
    section's part split at the first dot: "rollout.vllm.dtype" is rollout's "vllm.dtype"), a
    section's mapping, "preset", or TRL's name of an rlvr key (noted once on stderr). Any
    other key: `refuse(key)` is the ConfigError's message, or None to keep the pair as it is
    (a YAML file's unknown section is named by `apply_changes`)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        trl = alias(key) if "." not in key and not isinstance(value, Mapping) else None
        if key == "preset":
            out["preset"] = value
        elif "." in key:
            section, name = key.split(".", 1)
            out.setdefault(section, {})[name] = value
        elif isinstance(value, Mapping):
            out.setdefault(key, {}).update(value)
        elif trl is not None:
            section, name, note = trl
            print(note, file=sys.stderr)
            out.setdefault(section, {})[name] = value
        elif (message := refuse(key)) is None:
            out[key] = value
        else:
            raise ConfigError(message)
    return out


_noted: set[tuple[str, str]] = set()


def renamed(section: str, key: str) -> str:
    """The key's name now (`RENAMED`); an old name is noted once a process, on stderr (by
    rank 0 alone under torchrun)."""
    new = RENAMED.get((section, key))
    if new is None:
        return key
    if (section, key) not in _noted:
        _noted.add((section, key))
        if os.environ.get("RANK", "0") == "0":
            print(f"note: {section}.{key} is now {section}.{new}", file=sys.stderr)
    return new


def refuse_removed(section: str, key: str, value: Any, source: str) -> None:
    """A removed setting (`REMOVED`): its old defaults pass, anything else is refused."""
    defaults, instead = REMOVED[(section, key)]
    given = value if isinstance(value, dict) else {None: value}
    for k, v in given.items():
        if k not in defaults or str(v).lower() != str(defaults[k]).lower():
            name = f"{section}.{key}" + (f".{k}" if k else "")
            raise ConfigError(f"{source}: {name}: {instead}")
