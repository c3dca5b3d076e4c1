"""Run configuration: the schema (frozen dataclasses, `schema`, `schema_rollout`), the presets
(`presets`), loading in one layer order (`load`: defaults -> preset -> the built-in model's
sizes -> YAML -> `--section.key=value`), every check that needs no model or data (`validate`),
the algorithm a run is (`algorithm`), safe YAML (`safe_yaml`), the names a key may go by
(`names`), the `module:function` loader (`callables`) and the reference page (`reference`).

The package re-exports what users import: `from rlvr.config import Config, load_config`.
"""

from rlvr.config.load import (
    apply_changes,
    dump_yaml,
    flat_keys,
    help_text,
    load_config,
    parse_overrides,
    to_dict,
)
from rlvr.config.presets import PRESETS, TINY_DEFAULTS, TINY_PRESET_DEFAULTS, TINY_TASK_DEFAULTS
from rlvr.config.schema import (
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
    VLLMSettings,
    field_docs,
)

__all__ = [
    "PRESETS",
    "SECTIONS",
    "TINY_DEFAULTS",
    "TINY_PRESET_DEFAULTS",
    "TINY_TASK_DEFAULTS",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
    "VLLMSettings",
    "apply_changes",
    "dump_yaml",
    "field_docs",
    "flat_keys",
    "help_text",
    "load_config",
    "parse_overrides",
    "to_dict",
]
