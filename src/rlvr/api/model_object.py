"""A model object handed to the Python API: where it came from, its tokenizer, the copy of it
a run keeps when it came from nowhere, and the trained model the API returns.

A model built in memory (`AutoModelForCausalLM.from_config(...)`) has no name or directory to
load again, yet `rlvr eval`, `rlvr export --merge`, `rlvr train --resume` and a LoRA adapter's
`base_model_name_or_path` all need one. Such a run saves the model as it starts, with its
tokenizer, to `RUN_DIR/base_model/` and records that directory as `model.name_or_path`; a
model loaded with `from_pretrained` is recorded by its name or directory instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr.config.schema import Config, ConfigError

BASE_DIR = "base_model"


def model_source(model: Any) -> str:
    """Where a model object was loaded from (`from_pretrained`'s name or directory, as its
    config keeps it); "" for one built in memory."""
    name = getattr(model, "name_or_path", "") or ""
    config = getattr(model, "config", None)
    return str(name or getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", ""))


def tokenizer_of(model: Any):
    """The tokenizer saved with a model object's source, or ConfigError naming what to pass."""
    from rlvr.models import load_tokenizer

    source = model_source(model)
    if not source:
        raise ConfigError(
            f"tokenizer: the {type(model).__name__} object was built in memory (its config has "
            "no name_or_path to load a tokenizer from); pass tokenizer="
        )
    try:
        return load_tokenizer(source)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"tokenizer: none found for the model object at its source {source!r} ({e}); "
            "pass tokenizer="
        ) from None


def save_base(model: Any, tokenizer: Any, run_dir: Path) -> Path:
    """Save an in-memory model as it starts, and its tokenizer, to RUN_DIR/base_model (kept
    when a resumed run finds it there), and point the object's config at it, so that a LoRA
    adapter made from it names its base (peft reads `name_or_path` when it wraps the model)."""
    from rlvr.run.private import private_dir

    base = run_dir / BASE_DIR
    if not (base / "config.json").is_file():
        private_dir(base)
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
    model.config._name_or_path = model.name_or_path = str(base)  # as from_pretrained sets both
    return base


def final_model(cfg: Config, run_dir: Path, given_model: Any):
    """The trained policy `TrainResult.model` holds: the object passed in, trained in place,
    or the newest good checkpoint loaded (a LoRA adapter on its recorded base)."""
    from rlvr.models import load_model
    from rlvr.run.checkpoint import latest_good_checkpoint

    if given_model is not None and cfg.model.lora_rank == 0:
        return given_model  # trained in place
    checkpoint = latest_good_checkpoint(run_dir)
    if checkpoint is None:
        return None
    if (checkpoint / "adapter_config.json").is_file():
        import peft

        base = json.loads((checkpoint / "adapter_config.json").read_text())
        return peft.PeftModel.from_pretrained(
            load_model(base["base_model_name_or_path"]), str(checkpoint)
        ).eval()
    return load_model(str(checkpoint), dtype=cfg.model.dtype).eval()
